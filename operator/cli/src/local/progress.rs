//! The progress of a local run: a thread reads ps 0's metrics page every [`READ_EVERY`] (as
//! the operator does in a cluster, with the same reader, [`tfjob_operator::progress`]) into a
//! [`ProgressTracker`] the driver looks at on each pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tfjob_api::progress::ProgressTracker;

/// Between two reads of the page.
pub const READ_EVERY: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Shared {
    url: Option<String>,
    tracker: ProgressTracker,
    /// Readings recorded so far (the driver acts on new ones only).
    readings: u64,
}

/// The reading thread; stopped when dropped.
pub struct ProgressReader {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProgressReader {
    /// Starts the thread; it reads nothing until [`ProgressReader::set_url`].
    pub fn start() -> ProgressReader {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new().name("tfjob-progress".into()).spawn(move || read_loop(&shared, &stop)).ok()
        };
        ProgressReader { shared, stop, thread }
    }

    /// The page to read (ps 0's, once it is known).
    pub fn set_url(&self, url: String) {
        let mut shared = lock(&self.shared);
        if shared.url.as_deref() != Some(url.as_str()) {
            shared.url = Some(url);
        }
    }

    /// The tracker, when it has a reading newer than `seen` (the count of readings the caller
    /// has seen, updated).
    pub fn newer(&self, seen: &mut u64) -> Option<ProgressTracker> {
        let s = lock(&self.shared);
        (s.readings > *seen).then(|| {
            *seen = s.readings;
            s.tracker.clone()
        })
    }
}

impl Drop for ProgressReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

fn read_loop(shared: &Mutex<Shared>, stop: &AtomicBool) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return;
    };
    let client = rt.block_on(async { tfjob_operator::progress::page_client() });
    let tick = Duration::from_millis(100);
    let mut waited = READ_EVERY;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        waited += tick;
        let url = lock(shared).url.clone();
        let Some(url) = url.filter(|_| waited >= READ_EVERY) else {
            continue;
        };
        waited = Duration::ZERO;
        // A page not up yet (ps 0 starting) or gone (restarting): the last progress stays.
        if let Ok(sample) = rt.block_on(tfjob_operator::progress::read_sample(&client, &url, Duration::from_secs(1))) {
            let mut s = lock(shared);
            s.tracker.record(now_secs(), sample);
            s.readings += 1;
        }
    }
}

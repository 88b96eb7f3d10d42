//! What `tfjob run` shows: each replica's log prefixed with its name (and
//! saved under the run directory), one live status line, events, and the
//! final conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tfjob_api::api::{ReplicaType, TFJobStatus};
use tfjob_api::progress::{TrainingProgress, short_number};
use tfjob_api::status::{ObservedReplica, Phase};

use super::outcome::RunResult;
use super::training::{TrainingRecord, global_step_in};

/// Replicas by phase, and restarts, as the status line shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    pending: usize,
    running: usize,
    succeeded: usize,
    failed: usize,
    restarts: i32,
    /// Running workers, shown next to the planned number of workers.
    running_workers: usize,
}

struct State {
    files: BTreeMap<String, File>,
    counts: Counts,
    /// The planned number of workers (`None` for a job without `Worker`).
    desired_workers: Option<i32>,
    global_step: Option<i64>,
    /// The job's progress as ps 0 last told it.
    progress: Option<TrainingProgress>,
    line_shown: bool,
    last_line: String,
    last_print: Instant,
    /// What the replicas reported about training, for the picture.
    record: TrainingRecord,
    /// The replicas' `--log_dir`s as this machine reaches them.
    log_dirs: BTreeSet<String>,
    /// The last error line of each replica's output ([`error_line`]).
    last_errors: BTreeMap<String, String>,
}

/// What a line of a replica's output says went wrong, if it says so: a
/// runtime's `ERROR` log line or its exit message (`tfjob-runtime: ...`), a
/// panic, or a program's `Error: ...`. `after` is the error line kept so
/// far: a panic's message comes on the line after `panicked at FILE:`.
pub fn error_line(line: &str, after: Option<&str>) -> Option<String> {
    let line = line.trim_end();
    if let Some(panic) = after.filter(|l| l.contains("panicked at") && l.ends_with(':'))
        && !line.is_empty()
    {
        return Some(format!("{panic} {line}"));
    }
    let is_error = line.contains(" ERROR ")
        || line.starts_with("tfjob-runtime: ")
        || line.contains("panicked at")
        || line.starts_with("Error: ")
        || line.starts_with("error: ");
    is_error.then(|| line.to_string())
}

/// The terminal side of a local run. Shared by the driver and the threads
/// that read replica output.
pub struct Console {
    job: String,
    run_dir: PathBuf,
    quiet: bool,
    follow: Option<String>,
    tty: bool,
    started: Instant,
    state: Mutex<State>,
}

impl Console {
    pub fn new(job: &str, run_dir: &Path, quiet: bool, follow: Option<String>) -> Self {
        Console {
            job: job.to_string(),
            run_dir: run_dir.to_path_buf(),
            quiet,
            follow,
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            state: Mutex::new(State {
                files: BTreeMap::new(),
                counts: Counts::default(),
                desired_workers: None,
                global_step: None,
                progress: None,
                line_shown: false,
                last_line: String::new(),
                last_print: Instant::now(),
                record: TrainingRecord::default(),
                log_dirs: BTreeSet::new(),
                last_errors: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Path of a replica's log file.
    pub fn log_path(&self, replica: &str) -> PathBuf {
        self.run_dir.join(format!("{replica}.log"))
    }

    fn clear_line(&self, st: &mut State) {
        if self.tty && st.line_shown {
            eprint!("\r\x1b[K");
            st.line_shown = false;
        }
    }

    fn draw_line(&self, st: &mut State, force: bool) {
        let line =
            format!("{} | {}s", status_line(&self.job, &st.counts, st.desired_workers, st.global_step, st.progress.as_ref()), self.started.elapsed().as_secs());
        if self.tty {
            eprint!("\r\x1b[K{line}");
            let _ = std::io::stderr().flush();
            st.line_shown = true;
        } else {
            // Without a terminal: a line when the replica counts change, and
            // at most every 10 s otherwise.
            let counts_changed = st.last_line.split(" | ").next() != line.split(" | ").next();
            if force || counts_changed || st.last_print.elapsed() >= Duration::from_secs(10) {
                eprintln!("{line}");
                st.last_print = Instant::now();
            }
        }
        st.last_line = line;
    }

    /// A line of a replica's output: saved, and shown with its prefix.
    pub fn log_line(&self, replica: &str, line: &str) {
        let mut st = self.lock();
        if !st.files.contains_key(replica)
            && let Ok(f) = File::options().create(true).append(true).open(self.log_path(replica))
        {
            st.files.insert(replica.to_string(), f);
        }
        if let Some(f) = st.files.get_mut(replica) {
            let _ = writeln!(f, "{line}");
        }
        if let Some(step) = global_step_in(line) {
            st.global_step = Some(st.global_step.map_or(step, |s| s.max(step)));
        }
        st.record.line(replica, line, self.started.elapsed().as_secs_f64());
        if let Some(error) = error_line(line, st.last_errors.get(replica).map(String::as_str)) {
            st.last_errors.insert(replica.to_string(), error);
        }
        let shown = !self.quiet && self.follow.as_deref().is_none_or(|f| f == replica);
        if shown {
            self.clear_line(&mut st);
            println!("[{replica}] {line}");
            let _ = std::io::stdout().flush();
            if self.tty {
                self.draw_line(&mut st, false);
            }
        }
    }

    /// The last error line a replica printed ([`error_line`]), if any.
    pub fn last_error(&self, replica: &str) -> Option<String> {
        self.lock().last_errors.get(replica).cloned()
    }

    /// A message of `tfjob run` itself.
    pub fn info(&self, message: &str) {
        let mut st = self.lock();
        self.clear_line(&mut st);
        eprintln!("tfjob: {message}");
    }

    /// An event of the job (what the cluster would record as an Event).
    pub fn event(&self, warning: bool, reason: &str, message: &str) {
        let mut st = self.lock();
        self.clear_line(&mut st);
        eprintln!("tfjob: event {}{reason}: {message}", if warning { "(warning) " } else { "" });
    }

    /// A replica writes TensorBoard events to `dir` (as this machine reaches it).
    pub fn add_log_dir(&self, dir: String) {
        self.lock().log_dirs.insert(dir);
    }

    /// The planned number of workers, shown on the status line next to the
    /// running ones (it changes with `tfjob scale`).
    pub fn set_desired_workers(&self, workers: Option<i32>) {
        let mut st = self.lock();
        let scaled = st.desired_workers.is_some() && st.desired_workers != workers;
        st.desired_workers = workers;
        if scaled {
            self.draw_line(&mut st, true);
        }
    }

    /// The job's progress (from ps 0's page), shown on the status line.
    pub fn set_progress(&self, progress: Option<TrainingProgress>) {
        let mut st = self.lock();
        st.progress = progress;
        if self.tty || st.last_print.elapsed() >= Duration::from_secs(10) {
            self.draw_line(&mut st, false);
        }
    }

    /// Updates the live status line from the replicas; true when the phases
    /// or restart counts changed (worth a reconcile).
    pub fn update_replicas(&self, observed: &[ObservedReplica]) -> bool {
        let mut counts = Counts::default();
        for r in observed.iter().filter(|r| !r.terminating) {
            match r.phase {
                Phase::Pending | Phase::Unknown => counts.pending += 1,
                Phase::Running => counts.running += 1,
                Phase::Succeeded => counts.succeeded += 1,
                Phase::Failed => counts.failed += 1,
            }
            if r.phase == Phase::Running && r.replica_type == ReplicaType::Worker {
                counts.running_workers += 1;
            }
            counts.restarts += r.restart_count;
        }
        let mut st = self.lock();
        let changed = counts != st.counts;
        st.counts = counts;
        if changed || self.tty || st.last_print.elapsed() >= Duration::from_secs(10) {
            self.draw_line(&mut st, changed);
        }
        changed
    }

    /// The final conditions and where everything is.
    pub fn finish(&self, status: &TFJobStatus, result: &RunResult, elapsed: Duration) {
        let mut st = self.lock();
        self.clear_line(&mut st);
        eprintln!("tfjob: conditions of TFJob {}:", self.job);
        for c in &status.conditions {
            eprintln!("tfjob:   {:<10} {:<5} {:<22} {}", c.type_, c.status, c.reason.as_deref().unwrap_or(""), c.message.as_deref().unwrap_or(""));
        }
        let verdict = if result.succeeded { "succeeded" } else { "did not succeed" };
        eprintln!("tfjob: TFJob {} {verdict} ({}) after {:.1}s: {}", self.job, result.reason, elapsed.as_secs_f64(), result.message);
        eprintln!("tfjob: logs and status.yaml in {}", result.run_dir.display());
        if !st.record.is_empty() {
            let picture = result.run_dir.join(TRAINING_PICTURE);
            match st.record.write_png(&self.job, &picture) {
                Ok(()) => eprintln!("tfjob: picture of training (loss, accuracy, steps/s by global step): {}", picture.display()),
                Err(e) => eprintln!("tfjob: no picture of training: {e}"),
            }
        }
        for dir in &st.log_dirs {
            eprintln!("tfjob: TensorBoard: tensorboard --logdir {dir}");
        }
    }
}

/// The picture of training in the run directory.
pub const TRAINING_PICTURE: &str = "training.png";

/// The status line without its clock: replicas by phase, restarts, the
/// running and planned workers, the global step.
fn status_line(job: &str, counts: &Counts, desired_workers: Option<i32>, global_step: Option<i64>, progress: Option<&TrainingProgress>) -> String {
    let Counts { pending, running, succeeded, failed, restarts, running_workers } = *counts;
    let restarts = if restarts > 0 { format!(", {restarts} restart(s)") } else { String::new() };
    let workers = desired_workers.map(|d| format!(" | workers {running_workers}/{d} running")).unwrap_or_default();
    let step = match progress {
        Some(p) => progress_summary(p, global_step),
        None => global_step.map(|s| format!(" | global_step {s}")).unwrap_or_default(),
    };
    format!("{job}: {running} running, {pending} pending, {succeeded} succeeded, {failed} failed{restarts}{workers}{step}")
}

/// ` | global_step 1200 | epoch 2/5 | 10.2k examples/s | ETA 3m20s`: what ps 0's page says (the
/// step from the logs when the page has none).
fn progress_summary(p: &TrainingProgress, global_step: Option<i64>) -> String {
    let mut out = String::new();
    if let Some(step) = p.global_step.or(global_step) {
        out += &format!(" | global_step {step}");
    }
    if let Some(done) = p.epochs_completed {
        out += &match p.num_epochs {
            Some(n) => format!(" | epoch {done}/{n}"),
            None => format!(" | epoch {done}"),
        };
    }
    match (p.examples_per_second, &p.steps_per_second) {
        (Some(r), _) => out += &format!(" | {} examples/s", short_number(r as f64)),
        (None, Some(r)) => out += &format!(" | {r} steps/s"),
        _ => {}
    }
    if let Some(eta) = &p.estimated_remaining_time_summary {
        out += &format!(" | ETA {eta}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        let counts = Counts { pending: 2, running: 3, succeeded: 0, failed: 1, restarts: 2, running_workers: 2 };
        assert_eq!(
            status_line("lin", &counts, Some(4), Some(1200), None),
            "lin: 3 running, 2 pending, 0 succeeded, 1 failed, 2 restart(s) | workers 2/4 running | global_step 1200"
        );
        let counts = Counts { running: 1, ..Counts::default() };
        assert_eq!(status_line("chief-only", &counts, None, None, None), "chief-only: 1 running, 0 pending, 0 succeeded, 0 failed");
        let progress = TrainingProgress {
            global_step: Some(1300),
            epochs_completed: Some(2),
            num_epochs: Some(5),
            examples_per_second: Some(10_240),
            estimated_remaining_time_summary: Some("3m20s".into()),
            ..Default::default()
        };
        assert_eq!(
            status_line("mlp", &counts, Some(2), Some(1200), Some(&progress)),
            "mlp: 1 running, 0 pending, 0 succeeded, 0 failed | workers 0/2 running | global_step 1300 | epoch 2/5 | 10.2k examples/s | ETA 3m20s"
        );
        let steps_only = TrainingProgress { steps_per_second: Some("12.50".into()), ..Default::default() };
        assert_eq!(
            status_line("lin", &counts, None, Some(7), Some(&steps_only)),
            "lin: 1 running, 0 pending, 0 succeeded, 0 failed | global_step 7 | 12.50 steps/s"
        );
    }

    /// (case, line, the error line kept before it, what is kept after it)
    #[test]
    fn error_lines_of_replica_output() {
        let panic_at = "thread 'main' (7) panicked at runtime/src/model/dense.rs:40:9:";
        let cases: [(&str, &str, Option<&str>, Option<&str>); 7] = [
            ("an ERROR log line", "2026-11-26T10:00:00Z ERROR worker:0: cannot read data", None, Some("2026-11-26T10:00:00Z ERROR worker:0: cannot read data")),
            ("the runtime's exit message", "tfjob-runtime: --batch_size: must be at least 1", None, Some("tfjob-runtime: --batch_size: must be at least 1")),
            ("an INFO line", "2026-11-26T10:00:00Z  INFO worker:0: step=100", None, None),
            ("the word error inside a message", "2026-11-26T10:00:00Z  INFO worker:0: no error so far", None, None),
            ("a panic", panic_at, None, Some(panic_at)),
            (
                "a panic's message, on the next line",
                "assertion failed: 5 == 4",
                Some(panic_at),
                Some("thread 'main' (7) panicked at runtime/src/model/dense.rs:40:9: assertion failed: 5 == 4"),
            ),
            ("a line after a complete error", "note: run with RUST_BACKTRACE=1", Some("tfjob-runtime: bad"), None),
        ];
        for (case, line, before, after) in cases {
            assert_eq!(error_line(line, before).as_deref(), after, "{case}");
        }
    }
}

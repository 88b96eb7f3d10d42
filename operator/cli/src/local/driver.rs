//! The driver of `tfjob run`: the controller's loop without Kubernetes. It plans the job with
//! [`tfjob_api::plan`], observes the replicas through a [`Backend`], feeds the observations to the
//! pure state machine ([`tfjob_api::status::reconcile_status`]) and executes the actions it returns
//! on the backend; `tfjob scale` requests arrive through [`super::control`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use tfjob_api::api::{self, ReplicaType, TFJob, TFJobStatus};
use tfjob_api::autoscale::{self, Autoscale, Bounds, Decision, Look};
use tfjob_api::plan::{self, AddressBook};
use tfjob_api::progress::{ProgressTracker, Reading};
use tfjob_api::status::{self, Action, EventKind, Observation};

use super::backend::{Backend, Observed, RunError, short_name};
use super::console::Console;
use super::outcome::RunResult;
use super::progress::{self, ProgressReader};
use super::{container, control, process, volumes};

/// Options of `tfjob run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub run_dir: Option<PathBuf>,
    pub quiet: bool,
    /// Only this replica's log is shown (e.g. `worker-1`).
    pub follow: Option<String>,
    /// How often the job is looked at even when nothing happens.
    pub resync: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { run_dir: None, quiet: false, follow: None, resync: Duration::from_secs(1) }
    }
}

/// Reads a manifest holding exactly one TFJob, validated as the cluster
/// validates it.
pub fn load_job(path: &Path) -> Result<TFJob, RunError> {
    let shown = if path.as_os_str() == "-" { "standard input".to_string() } else { path.display().to_string() };
    let text = read_manifest(path).map_err(|source| RunError::Read { path: shown.clone(), source })?;
    let docs = api::load_manifest(&text).map_err(|source| RunError::Manifest { path: shown.clone(), source })?;
    match docs.len() {
        0 => Err(RunError::Empty(shown)),
        1 => docs.into_iter().next().expect("one").map_err(|source| RunError::Manifest { path: shown, source }),
        count => Err(RunError::Several { path: shown, count }),
    }
}

/// A manifest's text: the file, or standard input for `-` (as `kubectl apply -f -`).
pub fn read_manifest(path: &Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(path) }
}

/// Set by SIGINT/SIGTERM: the signal number, 0 while none came.
fn install_signal_flag() -> Arc<AtomicI32> {
    let flag = Arc::new(AtomicI32::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let f = flag.clone();
        // SAFETY: the handler only stores into an atomic.
        let _ = unsafe { signal_hook::low_level::register(sig, move || f.store(sig, Ordering::SeqCst)) };
    }
    flag
}

fn default_run_dir(job: &str) -> PathBuf {
    let stamp = Timestamp::now().as_second();
    control::runs_root().join(format!("{job}-{stamp}-{}", std::process::id()))
}

/// Where `tfjob run` runs replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Child processes on 127.0.0.1 (the default).
    Process,
    /// Containers of each replica's image on a per-job network.
    Container,
}

/// `tfjob run FILE`: loads, validates and runs the job; everything it
/// started is stopped when it returns.
pub fn run_file(path: &Path, kind: BackendKind, opts: &RunOptions) -> Result<RunResult, RunError> {
    let mut job = load_job(path)?;
    let name = job.name().to_string();
    if job.metadata.namespace.is_none() {
        job.metadata.namespace = Some("default".into());
    }
    let run_dir = opts.run_dir.clone().unwrap_or_else(|| default_run_dir(&name));
    std::fs::create_dir_all(&run_dir).map_err(|source| RunError::RunDir { path: run_dir.display().to_string(), source })?;
    let console = Arc::new(Console::new(&name, &run_dir, opts.quiet, opts.follow.clone()));
    let tls = super::tls::LocalTls::for_job(&job, &run_dir, kind == BackendKind::Container).map_err(RunError::Backend)?;
    console.info(&match &tls {
        Some(_) => format!("TLS between replicas: a CA for this run, each replica's certificate under {}", run_dir.join("tls").display()),
        None => format!("plaintext between replicas: not every replica runs tfjob-runtime, or {} says \"false\"", tfjob_api::tls::TLS_ANNOTATION),
    });
    let mut backend: Box<dyn Backend> = match kind {
        BackendKind::Process => Box::new(process::ProcessBackend::new(&name, console.clone(), &run_dir).with_tls(tls)),
        BackendKind::Container => Box::new(container::ContainerBackend::new(&job, console.clone(), &run_dir)?.with_tls(tls)),
    };
    let result = run_job(job, backend.as_mut(), console, &run_dir, opts);
    backend.shutdown();
    result
}

/// Runs a job to its end with the given backend. While it runs, `tfjob
/// scale` reaches it through `control.sock` in the run directory
/// ([`control`]), and `<temp>/tfjob-runs/<job>.latest` points at the run
/// directory.
pub fn run_job(job: TFJob, backend: &mut dyn Backend, console: Arc<Console>, run_dir: &Path, opts: &RunOptions) -> Result<RunResult, RunError> {
    let signal = install_signal_flag();
    let started = Instant::now();
    let mut driver = Driver::new(job, console.clone(), run_dir, opts.resync);
    console.info(&format!("running TFJob {} locally; logs and status in {}", driver.name, run_dir.display()));
    let control = driver.open_control();
    let result = loop {
        let sig = signal.load(Ordering::SeqCst);
        if sig != 0 {
            break driver.interrupt(backend, sig);
        }
        if let Some(control) = &control {
            while let Some(request) = control.next_request() {
                driver.answer(request);
            }
        }
        let observed = backend.observe();
        let changed = console.update_replicas(&observed);
        driver.follow_progress(&*backend);
        if (changed || Instant::now() >= driver.next_reconcile)
            && let Some(result) = driver.reconcile(backend, &observed)?
        {
            break result;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(control);
    console.finish(&driver.status, &result, started.elapsed());
    Ok(result)
}

/// The controller's loop for one local job: its spec (which `tfjob scale`
/// changes), its status, and what it executes on the backend.
struct Driver {
    name: String,
    namespace: String,
    job: TFJob,
    run_dir: PathBuf,
    token: String,
    status: TFJobStatus,
    console: Arc<Console>,
    resync: Duration,
    next_reconcile: Instant,
    /// Reads ps 0's metrics page: the job's progress, the autoscaler's rate.
    progress: ProgressReader,
    /// Readings of `progress` acted on.
    progress_seen: u64,
}

impl Driver {
    fn new(job: TFJob, console: Arc<Console>, run_dir: &Path, resync: Duration) -> Driver {
        let driver = Driver {
            name: job.name().to_string(),
            namespace: job.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            job,
            run_dir: run_dir.to_path_buf(),
            token: plan::random_token(),
            status: TFJobStatus::default(),
            console,
            resync,
            next_reconcile: Instant::now(),
            progress: ProgressReader::start(),
            progress_seen: 0,
        };
        driver.show_desired_workers();
        driver
    }

    fn show_desired_workers(&self) {
        let workers = api::replica_specs(&self.job.spec).get(&ReplicaType::Worker).map(|rs| api::planned_replicas(&self.job.spec, ReplicaType::Worker, rs));
        self.console.set_desired_workers(workers);
    }

    /// Listens for `tfjob scale` and points `<job>.latest` here. Neither is
    /// needed to run the job: a failure is reported and the run goes on.
    fn open_control(&self) -> Option<control::ControlServer> {
        if let Err(e) = control::record_latest(&control::runs_root(), &self.name, &self.run_dir) {
            self.console.info(&format!(
                "cannot point {} at this run ({e}); `tfjob scale` needs the run directory",
                control::latest_link(&control::runs_root(), &self.name).display()
            ));
        }
        match control::ControlServer::start(&self.run_dir) {
            Ok(server) => Some(server),
            Err(e) => {
                self.console.info(&format!("cannot listen on {}: {e}; `tfjob scale` cannot reach this run", self.run_dir.join(control::SOCKET_NAME).display()));
                None
            }
        }
    }

    /// Carries out a request of `tfjob scale`; a scale takes effect at the
    /// reconcile that follows at once.
    fn answer(&mut self, pending: control::Pending) {
        let reply = match &pending.request {
            control::Request::Scale(scale) => match control::apply_scale(&mut self.job, scale) {
                Ok(message) => {
                    self.console.info(&format!("tfjob scale: {message}"));
                    self.show_desired_workers();
                    self.next_reconcile = Instant::now();
                    control::Reply::ok(message)
                }
                Err(e) => {
                    self.console.info(&format!("tfjob scale refused: {e}"));
                    control::Reply::error(e.to_string())
                }
            },
        };
        pending.answer(reply);
    }

    /// A new reading of ps 0's page: the progress into the status line and `status.yaml`, and
    /// the throughput autoscaler's turn.
    fn follow_progress(&mut self, backend: &dyn Backend) {
        // Asked every pass: a container restarted in place may come back at another address.
        if let Some(url) = backend.metrics_url(&plan::pod_name(&self.name, ReplicaType::PS, 0)) {
            self.progress.set_url(url);
        }
        let Some(tracker) = self.progress.newer(&mut self.progress_seen) else {
            return;
        };
        if terminal(&self.status).is_some() {
            return;
        }
        self.status.training_progress = tracker.progress();
        self.console.set_progress(self.status.training_progress.clone());
        self.autoscale(&tracker);
        write_status(&self.run_dir, &self.status);
    }

    /// The throughput autoscaler (`elasticPolicy.autoscale: Throughput`), the operator's
    /// policy: a scale it asks for is carried out as a `tfjob scale` is.
    fn autoscale(&mut self, tracker: &ProgressTracker) {
        let Some(policy) = self.job.spec.elastic_policy.as_ref().filter(|p| p.autoscale == Some(Autoscale::Throughput)) else {
            return;
        };
        let Some(replicas) = api::replica_specs(&self.job.spec).get(&ReplicaType::Worker).map(|rs| rs.replicas) else {
            return;
        };
        let readings: Vec<Reading> = tracker.readings().cloned().collect();
        let remaining = tracker.latest().and_then(|r| tracker.remaining(&r.sample)).and_then(|r| r.seconds);
        let look = Look { bounds: Bounds::of(policy, replicas), replicas, readings: &readings, now: progress::now_secs(), remaining };
        let (next, decision) = autoscale::decide(self.status.autoscaler.as_ref(), look);
        self.status.autoscaler = Some(next);
        match decision {
            Decision::Hold => {}
            Decision::Settle { message } => self.console.event(false, "AutoscalerSettled", &message),
            Decision::Scale { to, message, .. } => {
                let request = control::ScaleRequest { replica_type: "Worker".into(), replicas: to };
                match control::apply_scale(&mut self.job, &request) {
                    Ok(_) => {
                        self.console.event(false, "Autoscaled", &message);
                        self.show_desired_workers();
                        self.next_reconcile = Instant::now();
                    }
                    Err(e) => self.console.event(true, "AutoscaleFailed", &format!("{message}: {e}")),
                }
            }
        }
    }

    /// Ctrl-C or SIGTERM: stop every replica, and leave a status that says
    /// so (`Failed`, reason `Interrupted`) rather than the last `Running`.
    fn interrupt(&mut self, backend: &mut dyn Backend, sig: i32) -> RunResult {
        let what = if sig == signal_hook::consts::SIGINT { "Ctrl-C" } else { "SIGTERM" };
        self.console.info(&format!("{what} received: stopping every replica"));
        backend.shutdown();
        let message = format!("tfjob run was stopped by {what}: every replica was stopped before the job finished");
        for action in status::interrupt(&mut self.status, Timestamp::now(), &message) {
            if let Action::Event { kind, reason, message, .. } = action {
                self.console.event(kind == EventKind::Warning, &reason, &message);
            }
        }
        write_status(&self.run_dir, &self.status);
        RunResult { succeeded: false, reason: status::INTERRUPTED.into(), message, run_dir: self.run_dir.clone(), exit_code: 128 + sig }
    }

    /// One pass of the status machine and its actions; the result once the
    /// job has finished.
    fn reconcile(&mut self, backend: &mut dyn Backend, observed: &[Observed]) -> Result<Option<RunResult>, RunError> {
        let obs = Observation {
            namespace: &self.namespace,
            name: &self.name,
            spec: &self.job.spec,
            status: &self.status,
            replicas: observed,
            invalid: &[],
            now: Timestamp::now(),
        };
        let outcome = status::reconcile_status(&obs);
        let mut requeue = self.resync;
        let mut delete_job = false;
        // Planned at the first replica to start, once per pass (the cluster spec is written once).
        let mut planner: Option<plan::ReplicaPlanner> = None;
        for action in &outcome.actions {
            match action {
                Action::CreateReplica { replica_type, index } | Action::RecreateReplica { replica_type, index, .. } => {
                    if let Action::RecreateReplica { name: pod, .. } = action {
                        backend.delete(pod);
                    }
                    let planner = planner.get_or_insert_with(|| replica_planner(&self.name, &self.job, &*backend));
                    if let Err(e) = start_replica(backend, planner, *replica_type, *index, &self.token, &self.console) {
                        backend.shutdown();
                        return Err(e);
                    }
                }
                Action::DeleteReplica { name: pod } => backend.delete(pod),
                Action::Event { kind, reason, message, .. } => self.console.event(*kind == EventKind::Warning, reason, message),
                Action::RequeueAfter(d) => requeue = requeue.min(*d),
                Action::DeleteJob => delete_job = true,
            }
        }
        if outcome.status != self.status {
            self.status = outcome.status;
            write_status(&self.run_dir, &self.status);
        }
        self.next_reconcile = Instant::now() + requeue;
        let Some((succeeded, reason, message)) = terminal(&self.status) else {
            return Ok(None);
        };
        if delete_job {
            self.console.info("ttlSecondsAfterFinished: the job is deleted");
        }
        // Locally nothing may outlive the run, whatever cleanPodPolicy kept.
        backend.shutdown();
        Ok(Some(RunResult { succeeded, reason, message, run_dir: self.run_dir.clone(), exit_code: i32::from(!succeeded) }))
    }
}

/// Plans `job` with the backend's addresses.
fn replica_planner<'a>(job_name: &'a str, job: &'a TFJob, backend: &dyn Backend) -> plan::ReplicaPlanner<'a> {
    struct ByBackend<'a>(&'a dyn Backend);
    impl AddressBook for ByBackend<'_> {
        fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
            self.0.address(rtype, index, port)
        }
    }
    plan::ReplicaPlanner::new(job_name, &job.spec, &ByBackend(backend))
}

fn start_replica(
    backend: &mut dyn Backend,
    planner: &plan::ReplicaPlanner,
    rtype: ReplicaType,
    index: i32,
    token: &str,
    console: &Console,
) -> Result<(), RunError> {
    let replica = planner.replica(rtype, index).ok_or_else(|| RunError::Backend(format!("no replica {}-{index} in the plan", rtype.lower())))?;
    console.info(&format!("starting {}", short_name(planner.job_name(), &replica.pod_name)));
    if let Some(dir) = log_dir_of(&replica.args) {
        // Where the events are on this machine: a path in a volume is its directory's.
        let mounts = volumes::local_volumes(console.run_dir(), &replica).map(|v| v.mounts).unwrap_or_default();
        console.add_log_dir(volumes::map_path(&dir, &mounts));
    }
    backend.start(&replica, token)
}

/// The `--log_dir` (or `--log-dir`) of a replica's args, if any.
pub fn log_dir_of(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for flag in ["--log_dir", "--log-dir"] {
            if let Some(v) = a.strip_prefix(flag) {
                if let Some(v) = v.strip_prefix('=') {
                    return Some(v.to_string()).filter(|v| !v.is_empty());
                }
                if v.is_empty() {
                    return it.next().cloned();
                }
            }
        }
    }
    None
}

/// `(succeeded, reason, message)` once the job has finished.
fn terminal(status: &TFJobStatus) -> Option<(bool, String, String)> {
    let c = status::final_condition(status)?;
    Some((c.type_ == status::SUCCEEDED, c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// Writes the status as YAML (the TFJob's `status` as the cluster would show it).
fn write_status(run_dir: &Path, status: &TFJobStatus) {
    let yaml = tfjob_api::api::to_yaml(&serde_json::json!({ "status": status })).unwrap_or_default();
    let tmp = run_dir.join(".status.yaml.tmp");
    if std::fs::write(&tmp, yaml).is_ok() {
        let _ = std::fs::rename(&tmp, run_dir.join("status.yaml"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_dirs_of_args() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(log_dir_of(&args(&["--sync_replicas", "--log_dir=/mnt/tb"])), Some("/mnt/tb".into()));
        assert_eq!(log_dir_of(&args(&["--log-dir", "s3://b/tb"])), Some("s3://b/tb".into()));
        assert_eq!(log_dir_of(&args(&["--log_dir="])), None);
        assert_eq!(log_dir_of(&args(&["--log_directory=x", "--checkpoint_dir=/c"])), None);
    }
}

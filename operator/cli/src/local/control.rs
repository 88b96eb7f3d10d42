//! `tfjob scale`: how a running `tfjob run` is told to scale.
//!
//! The run listens on a unix socket, `control.sock` in its run directory
//! (removed when the run ends). A request is one JSON line, e.g.
//! `{"scale":{"replicaType":"Worker","replicas":4}}`; the reply is one JSON
//! line, `{"ok":true,"message":"Worker 2 → 4"}` or `{"ok":false,"error":"..."}`.
//! A listener thread reads requests and hands them to the driver's loop
//! through a channel, so the loop never blocks on a client.
//!
//! Every run also points `<temp>/tfjob-runs/<job>.latest` at its run
//! directory, so that `tfjob scale JOB Worker=N` finds the latest run of a
//! job by its name.
//!
//! The pure parts ([`parse_scale`], [`apply_scale`], [`resolve_run_dir`]) are
//! plain functions; the socket code only carries their inputs and outputs.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tfjob_api::api::{self, ReplicaType, TFJob};
use tfjob_api::field::{ValidationErrors, is_dns1035_label};

/// The socket's file name in a run directory.
pub const SOCKET_NAME: &str = "control.sock";

/// How long a request may take to arrive, and its reply to come back.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest request line read.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// A request to a running `tfjob run` (one JSON line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Request {
    /// Set the replica count of a replica type.
    Scale(ScaleRequest),
}

/// `TYPE=COUNT` of `tfjob scale`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleRequest {
    /// The replica type as given (any spelling `tfReplicaSpecs` accepts).
    pub replica_type: String,
    /// The new count.
    pub replicas: i32,
}

/// The reply to a [`Request`] (one JSON line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// What happened (when `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why not (when not `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reply {
    /// A request carried out.
    pub fn ok(message: impl Into<String>) -> Reply {
        Reply { ok: true, message: Some(message.into()), error: None }
    }

    /// A request refused.
    pub fn error(error: impl Into<String>) -> Reply {
        Reply { ok: false, message: None, error: Some(error.into()) }
    }
}

/// A `TYPE=COUNT` argument that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleArgError {
    #[error("expected TYPE=COUNT (e.g. Worker=4), got {0:?}")]
    Shape(String),
    #[error("{arg:?}: unknown replica type {rtype:?}; expected Worker or PS (the types that can be scaled)")]
    UnknownType { arg: String, rtype: String },
    #[error("{arg:?}: the count {count:?} is not a whole number")]
    NotANumber { arg: String, count: String },
    #[error("{arg:?}: the count must be 0 or more, got {count}")]
    Negative { arg: String, count: i64 },
    #[error("{arg:?}: the count {count} is too large")]
    TooLarge { arg: String, count: i64 },
}

/// Reads `TYPE=COUNT` (`Worker=4`; the type in any case).
pub fn parse_scale(arg: &str) -> Result<ScaleRequest, ScaleArgError> {
    let (rtype, count) = arg.split_once('=').ok_or_else(|| ScaleArgError::Shape(arg.to_string()))?;
    let (rtype, count) = (rtype.trim(), count.trim());
    if rtype.is_empty() || count.is_empty() {
        return Err(ScaleArgError::Shape(arg.to_string()));
    }
    let rtype = ReplicaType::parse(rtype).ok_or_else(|| ScaleArgError::UnknownType { arg: arg.to_string(), rtype: rtype.to_string() })?;
    let count: i64 = count.parse().map_err(|_| ScaleArgError::NotANumber { arg: arg.to_string(), count: count.to_string() })?;
    if count < 0 {
        return Err(ScaleArgError::Negative { arg: arg.to_string(), count });
    }
    let replicas = i32::try_from(count).map_err(|_| ScaleArgError::TooLarge { arg: arg.to_string(), count })?;
    Ok(ScaleRequest { replica_type: rtype.as_str().to_string(), replicas })
}

/// Why a running job refused a scale.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    #[error("unknown replica type {0:?}; only Worker and PS can be scaled")]
    UnknownType(String),
    #[error("{0} cannot be scaled: {reason}; only Worker and PS can be scaled", reason = fixed_reason(.0))]
    Fixed(ReplicaType),
    #[error("TFJob {job} has no {rtype} replica set to scale")]
    NoReplicaSet { job: String, rtype: ReplicaType },
    #[error("PS=0: ps 0 keeps the job's layout and is never removed (PS=1 leaves it alone); PS stays at {from}")]
    PsZero { from: i32 },
    #[error("{rtype}={replicas} would make TFJob {job} invalid: {errors}")]
    Invalid { job: String, rtype: ReplicaType, replicas: i32, errors: ValidationErrors },
}

fn fixed_reason(rtype: &ReplicaType) -> &'static str {
    match rtype {
        ReplicaType::PS | ReplicaType::Worker => "",
        ReplicaType::Chief | ReplicaType::Master => "a job has at most one, for its whole life",
        ReplicaType::Evaluator => "the evaluator is not part of the training cluster and is fixed for the job's life",
    }
}

/// Applies a scale to the spec of a running job, validated as a manifest
/// is: on success the job has the new count (the next reconcile creates or
/// deletes the difference) and the message says what changed
/// (`Worker 2 → 4`); on error the job is unchanged. Workers come and go;
/// so do ps tasks other than ps 0: a new one proposes the larger set to
/// ps 0, a removed one (the highest first) asks to leave, and the chief
/// moves the state to the ps tasks of the new set at a step boundary.
pub fn apply_scale(job: &mut TFJob, request: &ScaleRequest) -> Result<String, ScaleError> {
    let rtype = ReplicaType::parse(&request.replica_type).ok_or_else(|| ScaleError::UnknownType(request.replica_type.clone()))?;
    if !matches!(rtype, ReplicaType::Worker | ReplicaType::PS) {
        return Err(ScaleError::Fixed(rtype));
    }
    let missing = || ScaleError::NoReplicaSet { job: job.name().to_string(), rtype };
    let key = job.spec.tf_replica_specs.keys().find(|k| ReplicaType::parse(k) == Some(rtype)).cloned().ok_or_else(missing)?;
    let mut scaled = job.clone();
    let rs = scaled.spec.tf_replica_specs.get_mut(&key).ok_or_else(missing)?;
    let before = rs.replicas;
    if rtype == ReplicaType::PS && request.replicas == 0 && before > 0 {
        return Err(ScaleError::PsZero { from: before });
    }
    rs.replicas = request.replicas;
    let errors = api::validate(&scaled);
    if !errors.is_empty() {
        return Err(ScaleError::Invalid { job: job.name().to_string(), rtype, replicas: request.replicas, errors: ValidationErrors(errors) });
    }
    *job = scaled;
    Ok(if before == request.replicas { format!("{rtype} stays at {before}") } else { format!("{rtype} {before} \u{2192} {}", request.replicas) })
}

/// Where `tfjob run` keeps its runs by default, and the `<job>.latest` pointers.
pub fn runs_root() -> PathBuf {
    std::env::temp_dir().join("tfjob-runs")
}

/// The pointer to the latest run directory of `job`.
pub fn latest_link(root: &Path, job: &str) -> PathBuf {
    root.join(format!("{job}.latest"))
}

/// Why `tfjob scale` found no run to talk to.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no run directory {0}")]
    NoRunDir(String),
    #[error("no run of TFJob {job} found ({link} does not exist); give the run directory instead")]
    NoRunOfJob { job: String, link: String },
    #[error("the latest run of TFJob {job} ({dir}) has ended: its directory is gone")]
    LatestGone { job: String, dir: String },
    #[error("the run in {dir} has ended (no control.sock there: it is removed when the run ends)")]
    Ended { dir: String },
    #[error("the run in {dir} is not running (control.sock: {source})")]
    NotRunning { dir: String, source: std::io::Error },
    #[error("talking to the run in {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error("the run in {dir} answered something unreadable: {answer:?}")]
    BadReply { dir: String, answer: String },
}

/// The run directory `tfjob scale` means: an existing directory is used as
/// is, a job name (a DNS label, as job names are) leads to its latest run
/// through `<root>/<job>.latest`, anything else is a run directory that does
/// not exist.
pub fn resolve_run_dir(arg: &str, root: &Path) -> Result<PathBuf, ClientError> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if !is_dns1035_label(arg) {
        return Err(ClientError::NoRunDir(arg.to_string()));
    }
    let link = latest_link(root, arg);
    let target = std::fs::read_link(&link).map_err(|_| ClientError::NoRunOfJob { job: arg.to_string(), link: link.display().to_string() })?;
    if !target.is_dir() {
        return Err(ClientError::LatestGone { job: arg.to_string(), dir: target.display().to_string() });
    }
    Ok(target)
}

/// Points `<root>/<job>.latest` at `run_dir` (made absolute), replacing the
/// previous pointer at once.
pub fn record_latest(root: &Path, job: &str, run_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(root)?;
    let target = std::fs::canonicalize(run_dir)?;
    let tmp = root.join(format!(".{job}.latest.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp)?;
    std::fs::rename(&tmp, latest_link(root, job))
}

/// Sends one request to the run in `run_dir` and returns its reply.
pub fn send(run_dir: &Path, request: &Request) -> Result<Reply, ClientError> {
    let dir = run_dir.display().to_string();
    let socket = run_dir.join(SOCKET_NAME);
    if !socket.exists() {
        return Err(ClientError::Ended { dir });
    }
    let mut stream = UnixStream::connect(&socket).map_err(|source| ClientError::NotRunning { dir: dir.clone(), source })?;
    let io = |source| ClientError::Io { dir: dir.clone(), source };
    stream.set_read_timeout(Some(IO_TIMEOUT * 2)).map_err(io)?;
    let mut line = serde_json::to_string(request).map_err(|e| ClientError::Io { dir: dir.clone(), source: e.into() })?;
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|source| ClientError::Io { dir: dir.clone(), source })?;
    let mut answer = String::new();
    BufReader::new(stream).take(MAX_REQUEST_BYTES).read_line(&mut answer).map_err(|source| ClientError::Io { dir: dir.clone(), source })?;
    serde_json::from_str(answer.trim()).map_err(|_| ClientError::BadReply { dir, answer })
}

/// How long `tfjob scale JOB` waits for a run of JOB that is starting
/// (`tfjob run job.yaml & tfjob scale job Worker=4`, pasted at once).
pub const START_WAIT: Duration = Duration::from_secs(10);

impl ClientError {
    /// Whether a run that is starting would end the error: no run of the
    /// job yet, or the latest one ended (a new one not yet recorded), or its
    /// socket not yet listening.
    fn may_be_starting(&self) -> bool {
        matches!(self, ClientError::NoRunOfJob { .. } | ClientError::LatestGone { .. } | ClientError::Ended { .. } | ClientError::NotRunning { .. })
    }
}

/// Sends `request` to the run `arg` names (see [`resolve_run_dir`]). Given a
/// job name, waits up to `wait` for a run of it that is starting, saying so
/// once through `waiting`; given a run directory, asks it once.
pub fn send_to_run(arg: &str, root: &Path, request: &Request, wait: Duration, waiting: impl FnOnce(&ClientError)) -> Result<Reply, ClientError> {
    let deadline = std::time::Instant::now() + wait;
    let by_name = !Path::new(arg).is_dir();
    let mut waiting = Some(waiting);
    loop {
        match resolve_run_dir(arg, root).and_then(|dir| send(&dir, request)) {
            Err(e) if by_name && e.may_be_starting() && std::time::Instant::now() < deadline => {
                if let Some(say) = waiting.take() {
                    say(&e);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            result => return result,
        }
    }
}

/// A request read from the socket, waiting for the driver's reply.
pub struct Pending {
    pub request: Request,
    reply: mpsc::Sender<Reply>,
}

impl Pending {
    /// Answers the client (ignored when it has gone).
    pub fn answer(self, reply: Reply) {
        let _ = self.reply.send(reply);
    }
}

/// The listening side, owned by the driver: requests come out of
/// [`ControlServer::next_request`]; dropping it stops the listener and
/// removes the socket.
pub struct ControlServer {
    path: PathBuf,
    requests: mpsc::Receiver<Pending>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `control.sock` in `run_dir` (a stale socket of an earlier
    /// run in the same directory is replaced).
    pub fn start(run_dir: &Path) -> std::io::Result<ControlServer> {
        let path = run_dir.join(SOCKET_NAME);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let (tx, requests) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("tfjob-control".into()).spawn(move || listen(&listener, &tx, &stopped))?;
        Ok(ControlServer { path, requests, stop, thread: Some(thread) })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next request waiting, without blocking.
    pub fn next_request(&self) -> Option<Pending> {
        self.requests.try_recv().ok()
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener thread: one client at a time, until `stop`.
fn listen(listener: &UnixListener, requests: &mpsc::Sender<Pending>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => serve(stream, requests),
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Reads one request line, has the driver answer it, writes the reply.
fn serve(stream: UnixStream, requests: &mpsc::Sender<Pending>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut line = String::new();
    let reply = match BufReader::new(&stream).take(MAX_REQUEST_BYTES).read_line(&mut line) {
        Err(e) => Reply::error(format!("cannot read the request: {e}")),
        Ok(_) => match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => Reply::error(format!("not a request ({e}): {:?}", line.trim())),
            Ok(request) => {
                let (tx, rx) = mpsc::channel();
                if requests.send(Pending { request, reply: tx }).is_err() {
                    Reply::error("the run is ending")
                } else {
                    rx.recv_timeout(IO_TIMEOUT).unwrap_or_else(|_| Reply::error("the run did not answer in time"))
                }
            }
        },
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_default();
    text.push('\n');
    let _ = (&stream).write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_arguments() {
        let ok = |t: &str, n: i32| Ok(ScaleRequest { replica_type: t.into(), replicas: n });
        let cases: Vec<(&str, Result<ScaleRequest, ScaleArgError>)> = vec![
            ("Worker=4", ok("Worker", 4)),
            ("worker=0", ok("Worker", 0)),
            (" Worker = 2 ", ok("Worker", 2)),
            ("ps=2", ok("PS", 2)),
            ("Worker", Err(ScaleArgError::Shape("Worker".into()))),
            ("=3", Err(ScaleArgError::Shape("=3".into()))),
            ("Worker=", Err(ScaleArgError::Shape("Worker=".into()))),
            ("Workers=3", Err(ScaleArgError::UnknownType { arg: "Workers=3".into(), rtype: "Workers".into() })),
            ("Worker=abc", Err(ScaleArgError::NotANumber { arg: "Worker=abc".into(), count: "abc".into() })),
            ("Worker=1.5", Err(ScaleArgError::NotANumber { arg: "Worker=1.5".into(), count: "1.5".into() })),
            ("Worker=99999999999", Err(ScaleArgError::TooLarge { arg: "Worker=99999999999".into(), count: 99_999_999_999 })),
            ("Worker=-1", Err(ScaleArgError::Negative { arg: "Worker=-1".into(), count: -1 })),
        ];
        for (arg, want) in cases {
            assert_eq!(parse_scale(arg), want, "{arg}");
        }
        assert_eq!(parse_scale("Worker=abc").unwrap_err().to_string(), "\"Worker=abc\": the count \"abc\" is not a whole number");
    }

    fn job(types: &str) -> TFJob {
        let mut y = String::from("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: lin}\nspec:\n  tfReplicaSpecs:\n");
        for t in types.split(',') {
            let (t, n) = t.split_once('=').unwrap();
            y.push_str(&format!("    {t}: {{replicas: {n}, template: {{spec: {{containers: [{{name: tensorflow, image: x}}]}}}}}}\n"));
        }
        api::parse_and_validate(serde_saphyr::from_str(&y).unwrap()).unwrap()
    }

    fn workers(j: &TFJob) -> i32 {
        j.spec.tf_replica_specs["Worker"].replicas
    }

    #[test]
    fn scaling_a_job() {
        let scale = |t: &str, n: i32| ScaleRequest { replica_type: t.into(), replicas: n };
        // (job, request, expected message or error, workers after)
        let cases: Vec<(&str, ScaleRequest, Result<&str, &str>, i32)> = vec![
            ("PS=1,Worker=2", scale("Worker", 4), Ok("Worker 2 \u{2192} 4"), 4),
            ("PS=1,Worker=4", scale("worker", 1), Ok("Worker 4 \u{2192} 1"), 1),
            ("PS=1,Worker=2", scale("Worker", 2), Ok("Worker stays at 2"), 2),
            ("Chief=1,Worker=2", scale("Worker", 0), Ok("Worker 2 \u{2192} 0"), 0),
            (
                "PS=1,Worker=2",
                scale("Worker", 0),
                Err(
                    "Worker=0 would make TFJob lin invalid: spec.tfReplicaSpecs.Worker.replicas: must be at least 1 when the job has no Chief or Master: worker 0 is the chief, got 0",
                ),
                2,
            ),
            ("PS=1,Worker=2", scale("PS", 3), Ok("PS 1 \u{2192} 3"), 2),
            ("PS=3,Worker=2", scale("ps", 1), Ok("PS 3 \u{2192} 1"), 2),
            ("PS=3,Worker=2", scale("PS", 0), Err("PS=0: ps 0 keeps the job's layout and is never removed (PS=1 leaves it alone); PS stays at 3"), 2),
            (
                "Chief=1,Worker=2",
                scale("Chief", 0),
                Err("Chief cannot be scaled: a job has at most one, for its whole life; only Worker and PS can be scaled"),
                2,
            ),
            ("PS=1,Worker=2", scale("Launcher", 2), Err("unknown replica type \"Launcher\"; only Worker and PS can be scaled"), 2),
            ("PS=1,Worker=2", scale("Worker", -3), Err("Worker=-3 would make TFJob lin invalid: spec.tfReplicaSpecs.Worker.replicas: must be >= 0, got -3"), 2),
        ];
        for (types, request, want, after) in cases {
            let mut j = job(types);
            let got = apply_scale(&mut j, &request).map_err(|e| e.to_string());
            assert_eq!(got, want.map(String::from).map_err(String::from), "{types} {request:?}");
            assert_eq!(workers(&j), after, "{types} {request:?}");
        }
        let mut chief_only = job("Chief=1");
        assert_eq!(apply_scale(&mut chief_only, &scale("Worker", 2)).unwrap_err(), ScaleError::NoReplicaSet { job: "lin".into(), rtype: ReplicaType::Worker });
    }

    #[test]
    fn a_run_is_found_by_its_directory_or_by_its_job_name() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tfjob-runs");
        let run1 = tmp.path().join("run-1");
        let run2 = tmp.path().join("run-2");
        std::fs::create_dir_all(&run1).unwrap();
        std::fs::create_dir_all(&run2).unwrap();
        let arg = |p: &Path| p.display().to_string();

        // A directory is used as is.
        assert_eq!(resolve_run_dir(&arg(&run1), &root).unwrap(), run1);
        // A name before any run of that job: no pointer yet.
        let e = resolve_run_dir("lin", &root).unwrap_err();
        assert!(matches!(e, ClientError::NoRunOfJob { .. }), "{e}");
        assert!(e.to_string().contains("lin.latest does not exist"), "{e}");
        // The latest run wins.
        record_latest(&root, "lin", &run1).unwrap();
        assert_eq!(resolve_run_dir("lin", &root).unwrap(), run1.canonicalize().unwrap());
        record_latest(&root, "lin", &run2).unwrap();
        assert_eq!(resolve_run_dir("lin", &root).unwrap(), run2.canonicalize().unwrap());
        // Its directory removed since.
        std::fs::remove_dir_all(&run2).unwrap();
        let e = resolve_run_dir("lin", &root).unwrap_err();
        assert!(matches!(e, ClientError::LatestGone { .. }), "{e}");
        // A path that is not there, and no job name either.
        let e = resolve_run_dir("/no/such/run", &root).unwrap_err();
        assert_eq!(e.to_string(), "no run directory /no/such/run");
        assert!(matches!(resolve_run_dir("Not_A_Job", &root), Err(ClientError::NoRunDir(_))));
    }

    /// `tfjob run job.yaml & tfjob scale job Worker=3` pasted at once: the scale waits for
    /// the run that is starting; a run directory given (or no run within the wait) is asked once.
    #[test]
    fn scaling_a_job_by_name_waits_for_its_run_to_start() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("lin-1");
        let request = Request::Scale(ScaleRequest { replica_type: "Worker".into(), replicas: 3 });
        let starting = {
            let (root, run_dir) = (root.path().to_path_buf(), run_dir.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::create_dir(&run_dir).unwrap();
                let server = ControlServer::start(&run_dir).unwrap();
                record_latest(&root, "lin", &run_dir).unwrap();
                loop {
                    if let Some(p) = server.next_request() {
                        p.answer(Reply::ok("Worker 2 \u{2192} 3"));
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let mut said = None;
        let reply = send_to_run("lin", root.path(), &request, Duration::from_secs(10), |e| said = Some(e.to_string()));
        starting.join().unwrap();
        assert_eq!(reply.unwrap(), Reply::ok("Worker 2 \u{2192} 3"));
        assert!(said.is_some_and(|s| s.contains("no run of TFJob lin")), "it said why it waits");
        // Nothing starts: the error, after the wait.
        let started = std::time::Instant::now();
        let e = send_to_run("other", root.path(), &request, Duration::from_millis(300), |_| {}).unwrap_err();
        assert!(matches!(e, ClientError::NoRunOfJob { .. }) && started.elapsed() >= Duration::from_millis(300), "{e}");
        // A run directory is asked once: it has ended.
        let started = std::time::Instant::now();
        let e = send_to_run(&run_dir.display().to_string(), root.path(), &request, Duration::from_secs(10), |_| {}).unwrap_err();
        assert!(matches!(e, ClientError::Ended { .. }) && started.elapsed() < Duration::from_secs(1), "{e}");
    }

    #[test]
    fn requests_and_replies_over_the_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let request = Request::Scale(ScaleRequest { replica_type: "Worker".into(), replicas: 3 });
        // No run there yet.
        assert!(matches!(send(dir, &request), Err(ClientError::Ended { .. })));
        let server = ControlServer::start(dir).unwrap();
        let client = {
            let (dir, request) = (dir.to_path_buf(), request.clone());
            std::thread::spawn(move || send(&dir, &request))
        };
        let pending = loop {
            if let Some(p) = server.next_request() {
                break p;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(pending.request, request);
        pending.answer(Reply::ok("Worker 2 \u{2192} 3"));
        assert_eq!(client.join().unwrap().unwrap(), Reply::ok("Worker 2 \u{2192} 3"));
        // The wire format: one JSON line each way.
        let mut raw = UnixStream::connect(server.path()).unwrap();
        raw.write_all(b"{\"scale\":{\"replicaType\":\"PS\",\"replicas\":2}}\n").unwrap();
        let pending = server.requests.recv_timeout(IO_TIMEOUT).unwrap();
        assert_eq!(pending.request, Request::Scale(ScaleRequest { replica_type: "PS".into(), replicas: 2 }));
        pending.answer(Reply::error("PS cannot be scaled"));
        let mut line = String::new();
        BufReader::new(&raw).read_line(&mut line).unwrap();
        assert_eq!(line, "{\"ok\":false,\"error\":\"PS cannot be scaled\"}\n");
        // Garbage is answered without bothering the driver.
        let mut raw = UnixStream::connect(server.path()).unwrap();
        raw.write_all(b"scale please\n").unwrap();
        let mut line = String::new();
        BufReader::new(&raw).read_line(&mut line).unwrap();
        let reply: Reply = serde_json::from_str(&line).unwrap();
        assert!(!reply.ok && reply.error.unwrap().starts_with("not a request"), "{line}");
        assert!(server.next_request().is_none());
        // The end of the run removes the socket: the run has ended.
        let socket = server.path().to_path_buf();
        drop(server);
        assert!(!socket.exists());
        assert!(matches!(send(dir, &request), Err(ClientError::Ended { .. })));
        // A socket left by a run that was killed: nobody listens.
        let stale = UnixListener::bind(&socket).unwrap();
        drop(stale);
        let e = send(dir, &request).unwrap_err();
        assert!(matches!(e, ClientError::NotRunning { .. }), "{e}");
    }
}

//! The container backend of `tfjob run`: every replica a container of its
//! `tensorflow` container's image on a private per-job network, reachable by
//! the same DNS names as in Kubernetes minus the namespace
//! (`<job>-<type>-<index>.<job>`, and `<job>-<type>-<index>`, as network
//! aliases). It talks to Docker or to podman's API service through the
//! Docker-compatible API (bollard).
//!
//! Two layers: [`ContainerKubelet`] plays the kubelet for containers (runs a
//! pod's container, restarts it in place under `Always` and `OnFailure` with
//! a growing back-off, captures every line of its output, reports phases,
//! exit codes, restart counts and times, removes everything at the end); the
//! test suite's node agent runs the pods of a real API server with it.
//! [`ContainerBackend`] is the `tfjob run` backend on top of it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use tfjob_api::api::{self, ReplicaType, TFJob};
use tfjob_api::plan::{self, PlannedReplica};
use tfjob_api::status::{ObservedReplica, Phase};

use super::backend::{self, Backend, RunError, short_name};
use super::console::Console;
use super::expand::Environment;

/// Label with the job's name on every container and network of a run.
pub const LABEL_JOB: &str = "io.tfjob.job";
/// Label with the replica's short name (`worker-1`) on every container.
pub const LABEL_REPLICA: &str = "io.tfjob.replica";

/// How to start an engine, for the error when none answers.
const HOW_TO_START: &str =
    "start Docker, or `podman system service --time=0 unix:///run/podman/podman.sock` and set DOCKER_HOST=unix:///run/podman/podman.sock";

/// How often container states are inspected.
const POLL: Duration = Duration::from_millis(250);

/// The first restart back-off; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Errors of the container engine.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("no container engine reachable at {tried}: {HOW_TO_START}")]
    NoEngine { tried: String },
    #[error("cannot start the container client: {0}")]
    Client(String),
    #[error("cannot create network {network}: {reason}")]
    Network { network: String, reason: String },
    #[error("{pod}: {reason}")]
    Pod { pod: String, reason: String },
}

/// Where an engine may listen: `DOCKER_HOST` when set, else Docker's and
/// podman's usual sockets.
pub fn engine_candidates() -> Vec<String> {
    if let Some(host) = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()) {
        return vec![host];
    }
    let mut out = vec!["unix:///var/run/docker.sock".to_string()];
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        out.push(format!("unix://{}/podman/podman.sock", std::path::Path::new(&dir).display()));
    }
    out.push("unix:///run/podman/podman.sock".to_string());
    out
}

async fn connect_one(host: &str) -> Result<Docker, String> {
    let docker = if host.starts_with("unix://") || host.starts_with('/') {
        Docker::connect_with_unix(host, 120, bollard::API_DEFAULT_VERSION)
    } else if host.starts_with("tcp://") || host.starts_with("http://") {
        Docker::connect_with_http(host, 120, bollard::API_DEFAULT_VERSION)
    } else {
        return Err(format!("unsupported address {host:?} (unix:// or tcp://)"));
    }
    .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(10), docker.ping()).await {
        Ok(Ok(_)) => Ok(docker),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer to /_ping within 10s".into()),
    }
}

/// The first engine that answers `/_ping`, or the error naming where it
/// looked and how to start one.
async fn connect(candidates: &[String]) -> Result<Docker, ContainerError> {
    let mut tried = Vec::new();
    for host in candidates {
        match connect_one(host).await {
            Ok(d) => return Ok(d),
            Err(e) => tried.push(format!("{host} ({e})")),
        }
    }
    Err(ContainerError::NoEngine { tried: tried.join(", ") })
}

fn random_suffix() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}

fn is_not_found(e: &EngineError) -> bool {
    matches!(e, EngineError::DockerResponseServerError { status_code: 404, .. })
}

/// What the engine is asked to create for a pod's container on `network`:
/// `command` and `args` with their `$(VAR)` references to the container's env
/// expanded, as the kubelet does.
pub fn container_body(spec: &PodContainer, network: String) -> ContainerCreateBody {
    let env = Environment::of_expanded(&spec.env);
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        hostname: Some(spec.hostname.clone()).filter(|h| !h.is_empty()),
        // Kubernetes: `command` replaces the entrypoint, `args` the image's command.
        entrypoint: (!spec.command.is_empty()).then(|| env.expand_all(&spec.command)),
        cmd: (!spec.args.is_empty() || !spec.command.is_empty()).then(|| env.expand_all(&spec.args)),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(spec.labels.iter().cloned().collect()),
        host_config: Some(HostConfig {
            network_mode: Some(network.clone()),
            binds: (!spec.mounts.is_empty())
                .then(|| spec.mounts.iter().map(|m| format!("{}:{}:{}", m.host_path, m.container_path, if m.read_only { "ro" } else { "rw" })).collect()),
            extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
            ..Default::default()
        }),
        networking_config: Some(NetworkingConfig {
            endpoints_config: Some(HashMap::from([(network, EndpointSettings { aliases: Some(spec.aliases.clone()), ..Default::default() })])),
        }),
        ..Default::default()
    }
}

/// A file or directory of the host seen inside a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub host_path: String,
    pub container_path: String,
    pub read_only: bool,
}

/// The one container of a pod, as the kubelet runs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodContainer {
    /// Name in log lines and messages (`worker-1`).
    pub log_name: String,
    pub image: String,
    /// Kubernetes `command` (replaces the image's entrypoint) and `args`
    /// (replace the image's command), as in the pod spec: their `$(VAR)`
    /// references to `env` are expanded when the container is created, as
    /// the kubelet does ([`super::expand`]).
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// The container's environment, values already expanded (see
    /// [`super::expand::Environment`]).
    pub env: Vec<(String, String)>,
    pub hostname: String,
    /// DNS names of the container on the network.
    pub aliases: Vec<String>,
    pub labels: Vec<(String, String)>,
    /// The pod's restart policy: `Always`, `OnFailure` or `Never`.
    pub restart_policy: String,
    pub mounts: Vec<BindMount>,
    /// Extra `/etc/hosts` entries, `name:address`.
    pub extra_hosts: Vec<String>,
}

/// What the kubelet reports about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    pub phase: Phase,
    /// The container runs now.
    pub running: bool,
    /// Exit code of the last run that ended.
    pub exit_code: Option<i32>,
    pub restart_count: i32,
    /// The engine's container name.
    pub container: String,
    /// RFC 3339 times of the current or last run.
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// The container's address on the network (of the current or last run).
    pub ip: Option<String>,
}

/// Where a pod's output and the kubelet's messages go.
pub trait PodOutput: Send + Sync {
    /// One line of a pod's output (stdout and stderr), in order, none lost.
    fn line(&self, log_name: &str, line: &str);
    /// A message of the kubelet (restarts, failures).
    fn info(&self, message: &str);
    /// The last error line a pod printed, for the message of its exit.
    fn last_error(&self, _log_name: &str) -> Option<String> {
        None
    }
}

/// How far a container's log has been shown: the timestamp of the last line
/// and how many lines carried exactly that timestamp.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LogCursor {
    last: Option<Timestamp>,
    at_last: usize,
}

impl LogCursor {
    /// Whether a line with this timestamp is new; advances past it if so.
    /// A log read again from an earlier second repeats lines: those are not
    /// new.
    fn advance(&mut self, stamp: Timestamp, seen_at_stamp: &mut usize) -> bool {
        match self.last {
            Some(last) if stamp < last => false,
            Some(last) if stamp == last => {
                *seen_at_stamp += 1;
                if *seen_at_stamp > self.at_last {
                    self.at_last = *seen_at_stamp;
                    true
                } else {
                    false
                }
            }
            _ => {
                self.last = Some(stamp);
                self.at_last = 1;
                *seen_at_stamp = 1;
                true
            }
        }
    }
}

/// Splits a log line read with timestamps into its time and text.
fn split_stamp(text: &str) -> (Option<Timestamp>, &str) {
    let text = text.strip_suffix('\r').unwrap_or(text);
    match text.split_once(' ') {
        Some((s, rest)) => match Timestamp::from_str(s) {
            Ok(t) => (Some(t), rest),
            Err(_) => (None, text),
        },
        None => match Timestamp::from_str(text) {
            Ok(t) => (Some(t), ""),
            Err(_) => (None, text),
        },
    }
}

/// Reads a container's log (following it or not) from the cursor on and
/// hands every new line to `output`.
async fn read_log(docker: Docker, container: String, follow: bool, cursor: Arc<Mutex<LogCursor>>, output: Arc<dyn PodOutput>, log_name: String) {
    let since = cursor.lock().unwrap_or_else(|p| p.into_inner()).last.map(|t| t.as_second() as i32).unwrap_or(0);
    let options = LogsOptionsBuilder::new().follow(follow).stdout(true).stderr(true).timestamps(true).since(since).build();
    let mut stream = docker.logs(&container, Some(options));
    // Lines repeated from the cursor's second are skipped by counting.
    let mut seen_at_stamp = 0usize;
    let mut emit = |raw: &[u8]| {
        let text = String::from_utf8_lossy(raw);
        let (stamp, line) = split_stamp(&text);
        if let Some(t) = stamp {
            let mut c = cursor.lock().unwrap_or_else(|p| p.into_inner());
            if !c.advance(t, &mut seen_at_stamp) {
                return;
            }
        }
        output.line(&log_name, line);
    };
    // Partial lines of stdout and stderr.
    let mut pending: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { break };
        let (slot, bytes) = match chunk {
            bollard::container::LogOutput::StdErr { message } => (1, message),
            bollard::container::LogOutput::StdOut { message } | bollard::container::LogOutput::Console { message } => (0, message),
            bollard::container::LogOutput::StdIn { .. } => continue,
        };
        let buf = &mut pending[slot];
        buf.extend_from_slice(&bytes);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            emit(&line[..line.len() - 1]);
        }
    }
    for buf in &pending {
        if !buf.is_empty() {
            emit(buf);
        }
    }
}

struct Pod {
    spec: PodContainer,
    /// Its engine container's name is `state.container`.
    state: PodState,
    restart_at: Option<Instant>,
    backoff: Duration,
    /// The task following the log while the container runs.
    follow: Option<JoinHandle<()>>,
    cursor: Arc<Mutex<LogCursor>>,
}

/// Plays the kubelet for pods of one container each, on one network of a
/// Docker-compatible engine (see the module documentation).
pub struct ContainerKubelet {
    rt: Runtime,
    docker: Docker,
    /// The network; `None` once removed.
    network: Option<String>,
    /// Whether the network is this kubelet's, removed at [`shutdown`](Self::shutdown), or
    /// another's it joined.
    owns_network: bool,
    output: Arc<dyn PodOutput>,
    pods: BTreeMap<String, Pod>,
    next_poll: Instant,
}

impl ContainerKubelet {
    /// Connects to the engine (see [`engine_candidates`]) and creates a
    /// network `<network_prefix>-<random>` labelled with `labels`.
    pub fn connect(network_prefix: &str, labels: &[(String, String)], output: Arc<dyn PodOutput>) -> Result<Self, ContainerError> {
        Self::connect_to(&engine_candidates(), network_prefix, labels, output)
    }

    /// [`connect`](Self::connect) to the first engine of `hosts` that answers
    /// (`unix://...`, `tcp://...`).
    pub fn connect_to(hosts: &[String], network_prefix: &str, labels: &[(String, String)], output: Arc<dyn PodOutput>) -> Result<Self, ContainerError> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map_err(|e| ContainerError::Client(e.to_string()))?;
        let docker = rt.block_on(connect(hosts))?;
        let network = format!("{network_prefix}-{}", random_suffix());
        let request =
            NetworkCreateRequest { name: network.clone(), driver: Some("bridge".into()), labels: Some(labels.iter().cloned().collect()), ..Default::default() };
        rt.block_on(docker.create_network(request)).map_err(|e| ContainerError::Network { network: network.clone(), reason: e.to_string() })?;
        Ok(ContainerKubelet { rt, docker, network: Some(network), owns_network: true, output, pods: BTreeMap::new(), next_poll: Instant::now() })
    }

    /// Connects to the first engine of `hosts` that answers and runs pods on the existing
    /// `network` (another kubelet's: a second node of one cluster network), which it leaves in
    /// place at [`shutdown`](Self::shutdown).
    pub fn join(hosts: &[String], network: &str, output: Arc<dyn PodOutput>) -> Result<Self, ContainerError> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map_err(|e| ContainerError::Client(e.to_string()))?;
        let docker = rt.block_on(connect(hosts))?;
        rt.block_on(docker.inspect_network(network, None)).map_err(|e| ContainerError::Network { network: network.into(), reason: e.to_string() })?;
        Ok(ContainerKubelet { rt, docker, network: Some(network.into()), owns_network: false, output, pods: BTreeMap::new(), next_poll: Instant::now() })
    }

    /// The network's name (while it exists).
    pub fn network(&self) -> Option<&str> {
        self.network.as_deref()
    }

    /// The network's gateway address: how containers reach the host.
    pub fn gateway(&self) -> Option<String> {
        let network = self.network.as_deref()?;
        let info = self.rt.block_on(self.docker.inspect_network(network, None)).ok()?;
        info.ipam?.config?.into_iter().find_map(|c| c.gateway).filter(|g| !g.is_empty())
    }

    /// The engine's container of a pod.
    pub fn container_of(&self, pod: &str) -> Option<&str> {
        self.pods.get(pod).map(|p| p.state.container.as_str())
    }

    /// The pods the kubelet runs (or ran and still reports).
    pub fn pods(&self) -> impl Iterator<Item = &str> {
        self.pods.keys().map(String::as_str)
    }

    fn pull(&self, image: &str) -> Result<(), String> {
        self.rt.block_on(async {
            let mut pull = self.docker.create_image(Some(CreateImageOptionsBuilder::new().from_image(image).build()), None, None);
            while let Some(step) = pull.next().await {
                step.map_err(|e| format!("cannot pull image {image}: {e}"))?;
            }
            Ok(())
        })
    }

    fn create(&self, spec: &PodContainer, container: &str) -> Result<(), String> {
        let network = self.network.clone().ok_or("the network is gone")?;
        let body = container_body(spec, network);
        let options = || Some(CreateContainerOptionsBuilder::new().name(container).build());
        match self.rt.block_on(self.docker.create_container(options(), body.clone())) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => {
                self.output.info(&format!("{}: image {} is not present; pulling it", spec.log_name, spec.image));
                self.pull(&spec.image)?;
                self.rt
                    .block_on(self.docker.create_container(options(), body))
                    .map(|_| ())
                    .map_err(|e| format!("cannot create container from {}: {e}", spec.image))
            }
            Err(e) => Err(format!("cannot create container from {}: {e}", spec.image)),
        }
    }

    /// Starts a pod's (existing) container and follows its log.
    fn start_container(&self, pod: &mut Pod) -> Result<(), String> {
        self.rt
            .block_on(self.docker.start_container(&pod.state.container, None))
            .map_err(|e| format!("cannot start container {}: {e}", pod.state.container))?;
        pod.state.running = true;
        pod.state.phase = Phase::Running;
        pod.follow = Some(self.rt.spawn(read_log(
            self.docker.clone(),
            pod.state.container.clone(),
            true,
            pod.cursor.clone(),
            self.output.clone(),
            pod.spec.log_name.clone(),
        )));
        Ok(())
    }

    /// Delivers the last lines of a container that exited: the follow
    /// stream may end (or be cut) before the engine has handed them over, so
    /// the log is read once more, without following, from the cursor on.
    fn drain_log(&self, pod: &mut Pod) {
        if let Some(follow) = pod.follow.take() {
            let abort = follow.abort_handle();
            if self.rt.block_on(async { tokio::time::timeout(Duration::from_millis(500), follow).await }).is_err() {
                abort.abort();
            }
        }
        let read = read_log(self.docker.clone(), pod.state.container.clone(), false, pod.cursor.clone(), self.output.clone(), pod.spec.log_name.clone());
        if self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), read).await }).is_err() {
            self.output.info(&format!("{}: the end of the log of container {} could not be read within 10s", pod.spec.log_name, pod.state.container));
        }
    }

    /// Creates and starts the container of a pod.
    pub fn run_pod(&mut self, pod: &str, spec: PodContainer) -> Result<(), ContainerError> {
        let fail = |reason: String| ContainerError::Pod { pod: spec.log_name.clone(), reason };
        if self.pods.contains_key(pod) {
            return Err(fail("runs already".into()));
        }
        // Engine names allow [a-zA-Z0-9][a-zA-Z0-9_.-]*; pod keys may hold `/`.
        let base: String = pod.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') { c } else { '_' }).collect();
        let container = format!("{base}-{}", random_suffix());
        self.create(&spec, &container).map_err(fail)?;
        let mut p = Pod {
            state: PodState {
                phase: Phase::Pending,
                running: false,
                exit_code: None,
                restart_count: 0,
                container,
                started_at: None,
                finished_at: None,
                ip: None,
            },
            spec,
            restart_at: None,
            backoff: FIRST_BACKOFF,
            follow: None,
            cursor: Arc::new(Mutex::new(LogCursor::default())),
        };
        if let Err(reason) = self.start_container(&mut p) {
            self.remove_containers(vec![p], 0);
            return Err(ContainerError::Pod { pod: pod.to_string(), reason });
        }
        self.pods.insert(pod.to_string(), p);
        Ok(())
    }

    /// Sends a signal to a pod's container (as an outside failure would).
    pub fn kill_pod(&self, pod: &str, signal: &str) -> Result<(), ContainerError> {
        let p = self.pods.get(pod).ok_or_else(|| ContainerError::Pod { pod: pod.into(), reason: "no such pod".into() })?;
        self.rt
            .block_on(self.docker.kill_container(&p.state.container, Some(KillContainerOptionsBuilder::new().signal(signal).build())))
            .map_err(|e| ContainerError::Pod { pod: pod.into(), reason: format!("cannot kill container {}: {e}", p.state.container) })
    }

    /// Stops (grace `grace_secs`, then killed) and removes a pod's
    /// container, and forgets the pod.
    pub fn delete_pod(&mut self, pod: &str, grace_secs: i32) {
        self.delete_pods(&[pod], grace_secs);
    }

    /// Stops (all at once: grace `grace_secs`, then killed) and removes the
    /// containers of `pods`, and forgets them. Stopping them one after the
    /// other would let the last one run for the others' grace periods too.
    pub fn delete_pods(&mut self, pods: &[&str], grace_secs: i32) {
        let gone: Vec<Pod> = pods.iter().filter_map(|p| self.pods.remove(*p)).collect();
        if !gone.is_empty() {
            self.remove_containers(gone, grace_secs);
        }
    }

    /// Stops (grace `grace_secs`, then killed) and removes containers, with
    /// every line of their logs delivered.
    fn remove_containers(&self, mut pods: Vec<Pod>, grace_secs: i32) {
        let docker = &self.docker;
        let names: Vec<String> = pods.iter().map(|p| p.state.container.clone()).collect();
        self.rt.block_on(futures::future::join_all(names.iter().map(|c| async move {
            let _ = docker.stop_container(c, Some(StopContainerOptionsBuilder::new().t(grace_secs).build())).await;
        })));
        for p in &mut pods {
            if p.state.running || p.follow.is_some() {
                self.drain_log(p);
            }
        }
        self.rt.block_on(futures::future::join_all(names.iter().map(|c| async move {
            let opts = RemoveContainerOptionsBuilder::new().force(true).build();
            if let Err(e) = docker.remove_container(c, Some(opts)).await
                && !is_not_found(&e)
            {
                self.output.info(&format!("cannot remove container {c}: {e}"));
            }
        })));
    }

    /// Looks at the containers that run; records exits (with the whole log
    /// read) and schedules restarts.
    fn poll(&mut self, now: Instant) {
        let running: Vec<(String, String)> = self.pods.iter().filter(|(_, p)| p.state.running).map(|(n, p)| (n.clone(), p.state.container.clone())).collect();
        let docker = &self.docker;
        let states = self.rt.block_on(futures::future::join_all(running.iter().map(|(_, c)| docker.inspect_container(c, None))));
        for ((name, container), state) in running.into_iter().zip(states) {
            let mut p = self.pods.remove(&name).expect("present");
            let log_name = p.spec.log_name.clone();
            match state {
                Ok(info) => {
                    let on_network = info.network_settings.and_then(|n| n.networks).and_then(|mut n| self.network.as_ref().and_then(|net| n.remove(net)));
                    p.state.ip = on_network.and_then(|e| e.ip_address).filter(|ip| !ip.is_empty()).or(p.state.ip.take());
                    let st = info.state.unwrap_or_default();
                    p.state.started_at = st.started_at.clone().filter(|s| !s.is_empty() && !s.starts_with("0001"));
                    if matches!(st.status, Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD)) {
                        let code = st.exit_code.unwrap_or(255) as i32;
                        p.state.finished_at = st.finished_at.clone().filter(|s| !s.is_empty() && !s.starts_with("0001"));
                        p.state.running = false;
                        p.state.exit_code = Some(code);
                        self.drain_log(&mut p);
                        let last_error = backend::last_error_suffix(self.output.last_error(&log_name));
                        if backend::restarts_in_place(&p.spec.restart_policy, code) {
                            p.restart_at = Some(now + p.backoff);
                            self.output.info(&format!(
                                "{log_name} exited with code {code}; restarting in place in {:.1}s (restart {}, restartPolicy {}){last_error}",
                                p.backoff.as_secs_f64(),
                                p.state.restart_count + 1,
                                p.spec.restart_policy
                            ));
                            p.backoff = (p.backoff * 2).min(MAX_BACKOFF);
                        } else {
                            p.state.phase = backend::final_phase(code);
                            if code != 0 {
                                self.output.info(&format!("{log_name} failed with exit code {code}{last_error}"));
                            }
                        }
                    }
                }
                Err(e) if is_not_found(&e) => {
                    self.output.info(&format!("{log_name}: container {container} disappeared"));
                    p.state.running = false;
                    p.state.phase = Phase::Failed;
                    p.state.exit_code = Some(p.state.exit_code.unwrap_or(137));
                    if let Some(f) = p.follow.take() {
                        f.abort();
                    }
                }
                Err(_) => {}
            }
            self.pods.insert(name, p);
        }
    }

    /// The pods as they are now; restarts containers in place when due.
    pub fn observe(&mut self) -> Vec<(String, PodState)> {
        let now = Instant::now();
        if now >= self.next_poll {
            self.poll(now);
            self.next_poll = Instant::now() + POLL;
        }
        let due: Vec<String> = self.pods.iter().filter(|(_, p)| p.restart_at.is_some_and(|t| t <= now)).map(|(n, _)| n.clone()).collect();
        for name in due {
            let mut p = self.pods.remove(&name).expect("present");
            p.restart_at = None;
            match self.start_container(&mut p) {
                Ok(()) => p.state.restart_count += 1,
                Err(e) => {
                    self.output.info(&format!("{}: {e}", p.spec.log_name));
                    p.state.phase = Phase::Failed;
                }
            }
            self.pods.insert(name, p);
        }
        self.pods.iter().map(|(n, p)| (n.clone(), p.state.clone())).collect()
    }

    /// Removes every container (SIGTERM, killed after 3 s) and the network if it is this
    /// kubelet's.
    pub fn shutdown(&mut self) {
        self.shutdown_with_grace(3);
    }

    /// [`shutdown`](Self::shutdown) with `grace_secs` before the containers are killed (0: at
    /// once, as a machine that is lost).
    pub fn shutdown_with_grace(&mut self, grace_secs: i32) {
        let pods: Vec<Pod> = std::mem::take(&mut self.pods).into_values().collect();
        if !pods.is_empty() {
            self.remove_containers(pods, grace_secs);
        }
        if !self.owns_network {
            self.network = None;
        }
        if let Some(network) = self.network.take()
            && let Err(e) = self.rt.block_on(self.docker.remove_network(&network))
            && !is_not_found(&e)
        {
            self.output.info(&format!("cannot remove network {network}: {e}"));
        }
    }
}

impl Drop for ContainerKubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---------------------------------------------------------------------------
// The `tfjob run` backend.

/// The image of each replica type's `tensorflow` container.
fn images_of(job: &TFJob) -> BTreeMap<ReplicaType, String> {
    api::replica_specs(&job.spec)
        .into_iter()
        .filter_map(|(rtype, rs)| {
            let spec = rs.template.spec.as_ref()?;
            let c = spec.containers.iter().find(|c| c.name == "tensorflow")?;
            Some((rtype, c.image.clone().filter(|i| !i.is_empty())?))
        })
        .collect()
}

/// Console output for the kubelet.
struct ToConsole(Arc<Console>);

impl PodOutput for ToConsole {
    fn line(&self, log_name: &str, line: &str) {
        self.0.log_line(log_name, line);
    }
    fn info(&self, message: &str) {
        self.0.info(message);
    }
    fn last_error(&self, log_name: &str) -> Option<String> {
        self.0.last_error(log_name)
    }
}

pub struct ContainerBackend {
    job: String,
    /// The run directory: the replicas' volumes live under it.
    run_dir: std::path::PathBuf,
    kubelet: ContainerKubelet,
    images: BTreeMap<ReplicaType, String>,
    /// The planned replica of each pod.
    planned: BTreeMap<String, PlannedReplica>,
    /// The address of each pod's container on the job's network, as last seen.
    ips: BTreeMap<String, String>,
    /// The run's certificates, when the job speaks TLS.
    tls: Option<super::tls::LocalTls>,
}

impl ContainerBackend {
    /// Connects to the engine (see [`engine_candidates`]) and creates the
    /// job's network.
    pub fn new(job: &TFJob, console: Arc<Console>, run_dir: &std::path::Path) -> Result<Self, RunError> {
        let name = job.name().to_string();
        let labels = [(LABEL_JOB.to_string(), name.clone())];
        let kubelet =
            ContainerKubelet::connect(&format!("tfjob-{name}"), &labels, Arc::new(ToConsole(console.clone()))).map_err(|e| RunError::Backend(e.to_string()))?;
        console.info(&format!("container network {}", kubelet.network().unwrap_or_default()));
        Ok(ContainerBackend {
            job: name,
            run_dir: run_dir.to_path_buf(),
            kubelet,
            images: images_of(job),
            planned: BTreeMap::new(),
            ips: BTreeMap::new(),
            tls: None,
        })
    }

    /// Gives each replica its certificate (`tls`: the run's CA), mounted where the operator
    /// mounts it on a cluster.
    pub fn with_tls(mut self, tls: Option<super::tls::LocalTls>) -> Self {
        self.tls = tls;
        self
    }

    /// The container name of a running pod (for tests and messages).
    pub fn container_of(&self, pod: &str) -> Option<&str> {
        self.kubelet.container_of(pod)
    }
}

/// The pod's container of a planned replica of job `job`, run from the image
/// of its replica type in `images`, its volumes under `run_dir`.
fn pod_container(
    job: &str,
    run_dir: &Path,
    images: &BTreeMap<ReplicaType, String>,
    planned: &PlannedReplica,
    token: &str,
    tls: Option<&super::tls::LocalTls>,
) -> Result<PodContainer, String> {
    let short = short_name(job, &planned.pod_name);
    let image =
        images.get(&planned.replica_type).ok_or("the `tensorflow` container has no `image`; the container backend runs each replica from its image")?.clone();
    let volumes = super::volumes::local_volumes(run_dir, planned)?;
    super::volumes::create_dirs(&volumes.mounts).map_err(|e| format!("cannot create its volumes: {e}"))?;
    let mut mounts: Vec<BindMount> = volumes
        .mounts
        .iter()
        .map(|m| BindMount { host_path: m.host_path.display().to_string(), container_path: m.mount_path.clone(), read_only: m.read_only })
        .collect();
    let mut env = backend::replica_environment(planned, token).into_vars();
    if let Some(tls) = tls {
        let names = [format!("{}.{job}", planned.pod_name), planned.pod_name.clone()];
        let dir = tls.replica_dir(&short, &names)?;
        mounts.push(BindMount { host_path: dir.display().to_string(), container_path: tfjob_api::tls::TLS_MOUNT_PATH.to_string(), read_only: true });
        env.extend(tfjob_api::tls::tls_env(tfjob_api::tls::TLS_MOUNT_PATH).map(|(k, v)| (k.to_string(), v)));
    }
    Ok(PodContainer {
        log_name: short.clone(),
        image,
        command: planned.command.clone(),
        args: planned.args.clone(),
        env,
        hostname: planned.pod_name.clone(),
        aliases: vec![format!("{}.{}", planned.pod_name, job), planned.pod_name.clone()],
        labels: vec![(LABEL_JOB.to_string(), job.to_string()), (LABEL_REPLICA.to_string(), short)],
        restart_policy: planned.restart_policy.pod_restart_policy().to_string(),
        mounts,
        extra_hosts: Vec::new(),
    })
}

impl Backend for ContainerBackend {
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
        format!("{}.{}:{port}", plan::pod_name(&self.job, rtype, index), self.job)
    }

    fn start(&mut self, replica: &PlannedReplica, token: &str) -> Result<(), RunError> {
        let short = short_name(&self.job, &replica.pod_name);
        let spec = pod_container(&self.job, &self.run_dir, &self.images, replica, token, self.tls.as_ref())
            .map_err(|reason| RunError::Start { replica: short.clone(), reason })?;
        self.kubelet.run_pod(&replica.pod_name, spec).map_err(|e| RunError::Start { replica: short, reason: e.to_string() })?;
        self.planned.insert(replica.pod_name.clone(), replica.clone());
        Ok(())
    }

    fn delete(&mut self, name: &str) {
        let grace = self.planned.get(name).map_or(3, |r| super::backend::stop_grace(r.replica_type).as_secs() as i32);
        self.kubelet.delete_pod(name, grace);
        self.planned.remove(name);
    }

    fn observe(&mut self) -> Vec<ObservedReplica> {
        self.kubelet
            .observe()
            .into_iter()
            .filter_map(|(name, st)| {
                let planned = self.planned.get(&name)?;
                if let Some(ip) = &st.ip {
                    self.ips.insert(name.clone(), ip.clone());
                }
                Some(backend::observed(&name, planned, st.phase, st.exit_code, st.restart_count))
            })
            .collect()
    }

    /// The container's page at its address on the job's network: reachable from this machine
    /// when the engine runs here with bridge networking (podman as root, Docker on Linux); not
    /// from a Docker Desktop VM, where the run then shows no progress.
    fn metrics_url(&self, pod_name: &str) -> Option<String> {
        let port = plan::metrics_port_of(&self.planned.get(pod_name)?.args)?;
        Some(format!("http://{}:{port}/metrics", self.ips.get(pod_name)?))
    }

    fn shutdown(&mut self) {
        self.kubelet.shutdown();
        self.planned.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What reaches the engine for a replica whose args and env refer to
    /// the classic values: expanded as the kubelet expands them.
    #[test]
    fn expanded_args_and_env_reach_the_container() {
        let yaml = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: j}
spec:
  tfReplicaSpecs:
    PS:
      replicas: 1
      template:
        spec:
          containers: [{name: tensorflow, image: "rt:1"}]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - name: tensorflow
              image: "rt:1"
              command: ["$(TFJOB_JOB_NAME)-runtime"]
              args: ["--ps_hosts=$(TFJOB_PS_HOSTS)", "--worker_hosts=$(TFJOB_WORKER_HOSTS)", "--job_name=$(TFJOB_JOB_NAME)", "--task_index=$(TFJOB_TASK_INDEX)", "$(HOSTS_FLAG)", "$$(TFJOB_TASK_INDEX)", "$(NOT_SET)"]
              env: [{name: HOSTS_FLAG, value: "--ps=$(TFJOB_PS_HOSTS)"}]
"#;
        let job = api::load_manifest(yaml).unwrap().remove(0).unwrap();
        let book = |t: ReplicaType, i: i32, port: i32| format!("{}.j:{port}", plan::pod_name("j", t, i));
        let planned = plan::plan_replicas("j", &job.spec, &book).into_iter().find(|r| r.pod_name == "j-worker-1").unwrap();
        let spec = pod_container("j", &std::env::temp_dir(), &images_of(&job), &planned, "secret", None).unwrap();
        let body = container_body(&spec, "net".into());
        assert_eq!(body.entrypoint, Some(vec!["worker-runtime".to_string()]));
        assert_eq!(
            body.cmd.unwrap(),
            [
                "--ps_hosts=j-ps-0.j:2222",
                "--worker_hosts=j-worker-0.j:2222,j-worker-1.j:2222",
                "--job_name=worker",
                "--task_index=1",
                "--ps=j-ps-0.j:2222",
                "$(TFJOB_TASK_INDEX)",
                "$(NOT_SET)",
            ]
        );
        let env = body.env.unwrap();
        assert!(env.contains(&"HOSTS_FLAG=--ps=j-ps-0.j:2222".to_string()), "{env:?}");
        assert_eq!(env.last().map(String::as_str), Some("TFJOB_TOKEN=secret"));
    }

    #[test]
    fn images_come_from_the_tensorflow_container() {
        let yaml = r#"
apiVersion: kubeflow.org/v1
kind: TFJob
metadata: {name: j}
spec:
  tfReplicaSpecs:
    PS:
      replicas: 1
      template:
        spec:
          containers:
            - {name: sidecar, image: other:1}
            - {name: tensorflow, image: "ps-image:2"}
    Worker:
      replicas: 1
      template:
        spec:
          containers:
            - {name: tensorflow, image: "w-image:3"}
"#;
        let job = api::load_manifest(yaml).unwrap().remove(0).unwrap();
        let images = images_of(&job);
        assert_eq!(images.get(&ReplicaType::PS).map(String::as_str), Some("ps-image:2"));
        assert_eq!(images.get(&ReplicaType::Worker).map(String::as_str), Some("w-image:3"));
    }

    #[test]
    fn docker_host_wins_over_the_usual_sockets() {
        // Only this test touches DOCKER_HOST in this binary.
        // SAFETY: no other thread of this test binary reads or writes DOCKER_HOST.
        unsafe { std::env::set_var("DOCKER_HOST", "tcp://10.0.0.1:2375") };
        assert_eq!(engine_candidates(), vec!["tcp://10.0.0.1:2375".to_string()]);
        unsafe { std::env::remove_var("DOCKER_HOST") };
        let c = engine_candidates();
        assert_eq!(c.first().map(String::as_str), Some("unix:///var/run/docker.sock"));
        assert_eq!(c.last().map(String::as_str), Some("unix:///run/podman/podman.sock"));
    }

    #[test]
    fn log_cursor_skips_what_was_shown_and_nothing_else() {
        let t = |s: &str| Timestamp::from_str(s).unwrap();
        let mut c = LogCursor::default();
        // First read: three lines, two with the same timestamp.
        let mut seen = 0;
        assert!(c.advance(t("2026-11-21T10:00:00.1Z"), &mut seen));
        assert!(c.advance(t("2026-11-21T10:00:00.2Z"), &mut seen));
        assert!(c.advance(t("2026-11-21T10:00:00.2Z"), &mut seen));
        // A second read from the start of that second repeats them, then
        // brings one more line at the same time and a later one.
        let mut seen = 0;
        assert!(!c.advance(t("2026-11-21T10:00:00.1Z"), &mut seen));
        assert!(!c.advance(t("2026-11-21T10:00:00.2Z"), &mut seen));
        assert!(!c.advance(t("2026-11-21T10:00:00.2Z"), &mut seen));
        assert!(c.advance(t("2026-11-21T10:00:00.2Z"), &mut seen));
        assert!(c.advance(t("2026-11-21T10:00:01Z"), &mut seen));
        assert_eq!(c.at_last, 1);
    }

    #[test]
    fn log_lines_split_into_time_and_text() {
        let (t, text) = split_stamp("2026-11-21T10:00:00.123456789Z {\"W\": 2.0}\r");
        assert_eq!(t, Some(Timestamp::from_str("2026-11-21T10:00:00.123456789Z").unwrap()));
        assert_eq!(text, "{\"W\": 2.0}");
        assert_eq!(split_stamp("no stamp here"), (None, "no stamp here"));
        assert_eq!(split_stamp("2026-11-21T10:00:00Z").1, "");
    }
}

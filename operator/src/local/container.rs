//! The container backend of `tfjob run`: every replica a container of its
//! `tensorflow` container's image on a private per-job network, reachable by
//! the same DNS names as in Kubernetes minus the namespace
//! (`<job>-<type>-<index>.<job>`, and `<job>-<type>-<index>`, as network
//! aliases). It talks to Docker or to podman's API service through the
//! Docker-compatible API (bollard), and plays the kubelet like the process
//! backend: restarts the same container in place under `Always` and
//! `OnFailure` (with a growing back-off), reports phases and exit codes, and
//! removes every container and the network at the end.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as EngineError;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::api::{self, ReplicaType, TFJob};
use crate::plan::{self, ENV_TOKEN, PlannedReplica};
use crate::status::{ObservedReplica, Phase};

use super::console::Console;
use super::{Backend, RunError, short_name};

/// Label with the job's name on every container and network of a run.
pub const LABEL_JOB: &str = "io.tfjob.job";
/// Label with the replica's short name (`worker-1`) on every container.
pub const LABEL_REPLICA: &str = "io.tfjob.replica";

/// How to start an engine, for the error when none answers.
const HOW_TO_START: &str = "start Docker, or `podman system service --time=0 unix:///run/podman/podman.sock` and set DOCKER_HOST=unix:///run/podman/podman.sock";

/// How often container states are inspected.
const POLL: Duration = Duration::from_millis(250);

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
async fn connect(candidates: &[String]) -> Result<Docker, RunError> {
    let mut tried = Vec::new();
    for host in candidates {
        match connect_one(host).await {
            Ok(d) => return Ok(d),
            Err(e) => tried.push(format!("{host} ({e})")),
        }
    }
    Err(RunError::Backend(format!("no container engine reachable at {}: {HOW_TO_START}", tried.join(", "))))
}

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

fn random_suffix() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}

fn is_not_found(e: &EngineError) -> bool {
    matches!(e, EngineError::DockerResponseServerError { status_code: 404, .. })
}

struct Replica {
    planned: PlannedReplica,
    container: String,
    phase: Phase,
    exit_code: Option<i32>,
    restart_count: i32,
    /// The container runs (as last seen or started).
    running: bool,
    restart_at: Option<Instant>,
    backoff: Duration,
    logs: Option<JoinHandle<()>>,
    /// Timestamp of the last log line shown: a restarted container's log
    /// starts again from the beginning, and older lines are skipped.
    last_log: Arc<Mutex<Option<Timestamp>>>,
}

pub struct ContainerBackend {
    job: String,
    console: Arc<Console>,
    rt: Runtime,
    docker: Docker,
    /// The per-job network; `None` once removed.
    network: Option<String>,
    images: BTreeMap<ReplicaType, String>,
    replicas: BTreeMap<String, Replica>,
    next_poll: Instant,
}

impl ContainerBackend {
    /// Connects to the engine (see [`engine_candidates`]) and creates the
    /// job's network.
    pub fn new(job: &TFJob, console: Arc<Console>) -> Result<Self, RunError> {
        let name = job.name().to_string();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| RunError::Backend(format!("cannot start the container client: {e}")))?;
        let docker = rt.block_on(connect(&engine_candidates()))?;
        let network = format!("tfjob-{name}-{}", random_suffix());
        let request = NetworkCreateRequest {
            name: network.clone(),
            driver: Some("bridge".into()),
            labels: Some(HashMap::from([(LABEL_JOB.to_string(), name.clone())])),
            ..Default::default()
        };
        rt.block_on(docker.create_network(request))
            .map_err(|e| RunError::Backend(format!("cannot create network {network}: {e}")))?;
        console.info(&format!("container network {network}"));
        Ok(ContainerBackend {
            job: name,
            console,
            rt,
            docker,
            network: Some(network),
            images: images_of(job),
            replicas: BTreeMap::new(),
            next_poll: Instant::now(),
        })
    }

    /// The container name of a running pod (for tests and messages).
    pub fn container_of(&self, pod: &str) -> Option<&str> {
        self.replicas.get(pod).map(|r| r.container.as_str())
    }

    fn create(&self, planned: &PlannedReplica, token: &str, container: &str) -> Result<(), RunError> {
        let short = short_name(&self.job, &planned.pod_name);
        let fail = |reason: String| RunError::Start { replica: short.clone(), reason };
        let image = self
            .images
            .get(&planned.replica_type)
            .ok_or_else(|| fail("the `tensorflow` container has no `image`; the container backend runs each replica from its image".into()))?
            .clone();
        let network = self.network.clone().ok_or_else(|| fail("the job's network is gone".into()))?;
        let mut env: Vec<String> = planned.env.iter().filter(|(k, _)| k != ENV_TOKEN).map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("{ENV_TOKEN}={token}"));
        let labels = HashMap::from([(LABEL_JOB.to_string(), self.job.clone()), (LABEL_REPLICA.to_string(), short.clone())]);
        let aliases = vec![format!("{}.{}", planned.pod_name, self.job), planned.pod_name.clone()];
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            hostname: Some(planned.pod_name.clone()),
            // Kubernetes: `command` replaces the entrypoint, `args` the image's command.
            entrypoint: (!planned.command.is_empty()).then(|| planned.command.clone()),
            cmd: (!planned.args.is_empty() || !planned.command.is_empty()).then(|| planned.args.clone()),
            env: Some(env),
            labels: Some(labels),
            host_config: Some(HostConfig { network_mode: Some(network.clone()), ..Default::default() }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(network, EndpointSettings { aliases: Some(aliases), ..Default::default() })])),
            }),
            ..Default::default()
        };
        let options = || Some(CreateContainerOptionsBuilder::new().name(container).build());
        match self.rt.block_on(self.docker.create_container(options(), body.clone())) {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => {
                self.console.info(&format!("{short}: image {image} is not present; pulling it"));
                self.rt.block_on(async {
                    let mut pull = self.docker.create_image(Some(CreateImageOptionsBuilder::new().from_image(&image).build()), None, None);
                    while let Some(step) = pull.next().await {
                        step.map_err(|e| fail(format!("cannot pull image {image}: {e}")))?;
                    }
                    self.docker
                        .create_container(options(), body)
                        .await
                        .map(|_| ())
                        .map_err(|e| fail(format!("cannot create container from {image}: {e}")))
                })
            }
            Err(e) => Err(fail(format!("cannot create container from {image}: {e}"))),
        }
    }

    /// Starts an existing container and streams its log into the console.
    fn run(&self, replica: &mut Replica) -> Result<(), RunError> {
        let short = short_name(&self.job, &replica.planned.pod_name);
        self.rt
            .block_on(self.docker.start_container(&replica.container, None))
            .map_err(|e| RunError::Start { replica: short.clone(), reason: format!("cannot start container {}: {e}", replica.container) })?;
        replica.running = true;
        replica.logs = Some(self.follow_logs(&replica.container, short, replica.last_log.clone()));
        Ok(())
    }

    fn follow_logs(&self, container: &str, short: String, last: Arc<Mutex<Option<Timestamp>>>) -> JoinHandle<()> {
        let docker = self.docker.clone();
        let console = self.console.clone();
        let container = container.to_string();
        self.rt.spawn(async move {
            let emit = |raw: &[u8]| {
                let text = String::from_utf8_lossy(raw);
                let text = text.strip_suffix('\r').unwrap_or(&text);
                let (stamp, line) = match text.split_once(' ') {
                    Some((s, rest)) => match Timestamp::from_str(s) {
                        Ok(t) => (Some(t), rest),
                        Err(_) => (None, text),
                    },
                    None => match Timestamp::from_str(text) {
                        Ok(t) => (Some(t), ""),
                        Err(_) => (None, text),
                    },
                };
                if let Some(t) = stamp {
                    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                    if last.is_some_and(|l| t <= l) {
                        return;
                    }
                    *last = Some(t);
                }
                console.log_line(&short, line);
            };
            // Following ends when the container exits, possibly before its
            // last lines were read: one more read (without following)
            // delivers them; the timestamps skip what was shown already.
            for follow in [true, false] {
            let since = last.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.as_second() as i32).unwrap_or(0);
            let options = LogsOptionsBuilder::new().follow(follow).stdout(true).stderr(true).timestamps(true).since(since).build();
            let mut stream = docker.logs(&container, Some(options));
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
        })
    }

    /// Lets a log stream of an exited container deliver its last lines.
    fn finish_logs(&self, handle: Option<JoinHandle<()>>, wait: Duration) {
        if let Some(h) = handle {
            let abort = h.abort_handle();
            if self.rt.block_on(async { tokio::time::timeout(wait, h).await }).is_err() {
                abort.abort();
            }
        }
    }

    /// Stops (grace `grace_secs`, then killed) and removes containers.
    fn remove_containers(&self, containers: Vec<(String, Option<JoinHandle<()>>)>, grace_secs: i32) {
        let docker = &self.docker;
        let names: Vec<String> = containers.iter().map(|(c, _)| c.clone()).collect();
        self.rt.block_on(futures::future::join_all(names.iter().map(|c| async move {
            let _ = docker.stop_container(c, Some(StopContainerOptionsBuilder::new().t(grace_secs).build())).await;
        })));
        for (_, logs) in containers {
            self.finish_logs(logs, Duration::from_secs(1));
        }
        self.rt.block_on(futures::future::join_all(names.iter().map(|c| async move {
            let opts = RemoveContainerOptionsBuilder::new().force(true).build();
            if let Err(e) = docker.remove_container(c, Some(opts)).await
                && !is_not_found(&e)
            {
                self.console.info(&format!("cannot remove container {c}: {e}"));
            }
        })));
    }

    /// Looks at the containers that run; records exits and schedules restarts.
    fn poll(&mut self, now: Instant) {
        let running: Vec<(String, String)> = self.replicas.iter().filter(|(_, r)| r.running).map(|(n, r)| (n.clone(), r.container.clone())).collect();
        let docker = &self.docker;
        let states = self.rt.block_on(futures::future::join_all(running.iter().map(|(_, c)| docker.inspect_container(c, None))));
        for ((name, container), state) in running.into_iter().zip(states) {
            let short = short_name(&self.job, &name);
            let code = match state {
                Ok(info) => {
                    let st = info.state.unwrap_or_default();
                    match st.status {
                        Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD) => st.exit_code.unwrap_or(255) as i32,
                        _ => continue,
                    }
                }
                Err(e) if is_not_found(&e) => {
                    self.console.info(&format!("{short}: container {container} disappeared"));
                    let r = self.replicas.get_mut(&name).expect("present");
                    r.running = false;
                    r.phase = Phase::Failed;
                    r.exit_code = Some(r.exit_code.unwrap_or(137));
                    continue;
                }
                Err(_) => continue,
            };
            let logs = {
                let r = self.replicas.get_mut(&name).expect("present");
                r.running = false;
                r.exit_code = Some(code);
                r.logs.take()
            };
            self.finish_logs(logs, Duration::from_secs(2));
            let r = self.replicas.get_mut(&name).expect("present");
            let policy = r.planned.restart_policy.pod_restart_policy();
            if super::restarts_in_place(&r.planned.restart_policy, code) {
                r.restart_at = Some(now + r.backoff);
                self.console.info(&format!(
                    "{short} exited with code {code}; restarting in place in {:.1}s (restartPolicy {policy})",
                    r.backoff.as_secs_f64()
                ));
                r.backoff = (r.backoff * 2).min(Duration::from_secs(10));
            } else {
                r.phase = super::final_phase(code);
                if code != 0 {
                    self.console.info(&format!("{short} failed with exit code {code}"));
                }
            }
        }
    }
}

impl Backend for ContainerBackend {
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String {
        format!("{}.{}:{port}", plan::pod_name(&self.job, rtype, index), self.job)
    }

    fn start(&mut self, replica: &PlannedReplica, token: &str) -> Result<(), RunError> {
        let container = format!("{}-{}", replica.pod_name, random_suffix());
        self.create(replica, token, &container)?;
        let mut r = Replica {
            planned: replica.clone(),
            container: container.clone(),
            phase: Phase::Running,
            exit_code: None,
            restart_count: 0,
            running: false,
            restart_at: None,
            backoff: Duration::from_millis(500),
            logs: None,
            last_log: Arc::new(Mutex::new(None)),
        };
        if let Err(e) = self.run(&mut r) {
            self.remove_containers(vec![(container, None)], 0);
            return Err(e);
        }
        self.replicas.insert(replica.pod_name.clone(), r);
        Ok(())
    }

    fn delete(&mut self, name: &str) {
        if let Some(mut r) = self.replicas.remove(name) {
            self.remove_containers(vec![(r.container.clone(), r.logs.take())], 3);
        }
    }

    fn observe(&mut self) -> Vec<ObservedReplica> {
        let now = Instant::now();
        if now >= self.next_poll {
            self.poll(now);
            self.next_poll = Instant::now() + POLL;
        }
        let due: Vec<String> = self.replicas.iter().filter(|(_, r)| r.restart_at.is_some_and(|t| t <= now)).map(|(n, _)| n.clone()).collect();
        for name in due {
            let mut r = self.replicas.remove(&name).expect("present");
            r.restart_at = None;
            match self.run(&mut r) {
                Ok(()) => r.restart_count += 1,
                Err(e) => {
                    self.console.info(&e.to_string());
                    r.phase = Phase::Failed;
                }
            }
            self.replicas.insert(name, r);
        }
        self.replicas
            .iter()
            .map(|(name, r)| super::observed(name, &r.planned, r.phase, r.exit_code, r.restart_count))
            .collect()
    }

    fn shutdown(&mut self) {
        let replicas = std::mem::take(&mut self.replicas);
        let containers: Vec<(String, Option<JoinHandle<()>>)> = replicas.into_values().map(|mut r| (r.container.clone(), r.logs.take())).collect();
        if !containers.is_empty() {
            self.remove_containers(containers, 3);
        }
        if let Some(network) = self.network.take() {
            if let Err(e) = self.rt.block_on(self.docker.remove_network(&network))
                && !is_not_found(&e)
            {
                self.console.info(&format!("cannot remove network {network}: {e}"));
            }
        }
    }
}

impl Drop for ContainerBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

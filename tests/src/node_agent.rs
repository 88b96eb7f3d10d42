//! A node agent for the test control plane: the kubelet these machines cannot run.
//!
//! It takes the pods of the namespaces it serves, binds them to its node (no scheduler runs
//! either), and runs each as a podman container through the product's own
//! [`ContainerKubelet`](tfjob::local::container::ContainerKubelet), on one network:
//! - the pod's first container's image, command, args and env (literal values with their
//!   `$(VAR)` references expanded as the kubelet does, Secret and ConfigMap keys, the downward
//!   API fields `metadata.name`, `metadata.namespace`,
//!   `metadata.uid`, `spec.nodeName`, `spec.serviceAccountName`, `status.podIP` is left empty);
//! - `hostname` and `subdomain` as DNS names: `<hostname>.<subdomain>.<namespace>.svc`, the same
//!   with `.cluster.local`, `<hostname>.<subdomain>` and `<hostname>`;
//! - a service-account token (TokenRequest API, bound to the pod), `ca.crt` and `namespace`
//!   mounted at `/var/run/secrets/kubernetes.io/serviceaccount`, with `KUBERNETES_SERVICE_HOST`
//!   = `kubernetes.default.svc` resolving to the network's gateway, where a forwarder passes TCP
//!   on to the API server on 127.0.0.1 (the serving certificate names `kubernetes.default.svc`);
//! - the pod's restart policy as a kubelet honours it (in place, with back-off: the kubelet
//!   layer of the container backend);
//! - the pod status written back through the `status` subresource: phase, conditions, start
//!   time, container state (running / waiting in back-off / terminated with exit code, reason and
//!   times), last state and restart count, and `podIP`/`podIPs`: the container's address on the
//!   network, which the host reaches directly (rootful podman's bridge);
//! - pods being deleted: the container stopped and removed, then the pod object removed (grace
//!   period 0, as a kubelet confirms a deletion); containers of pods gone from the API removed.
//!
//! - `hostPath` volumes: the host's directory bind-mounted (the node's disk: checkpoints that
//!   outlive a pod); Secret volumes (the job's TLS CA): the Secret's keys (or the listed ones) as files;
//!
//! Not done (not needed by the tests): probes, resources, security contexts (the images run as
//! their own non-root user), volumes other than hostPath, Secret and the service-account token, init and sidecar
//! containers (a pod with more than one container gets the first one run and a warning).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, SecretVolumeSource, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};
use tfjob::local::container::{BindMount, ContainerKubelet, PodContainer, PodOutput, PodState};
use tfjob::local::expand::Environment;
use tfjob_api::status::Phase;

use crate::controlplane::ControlPlane;
use crate::podman::{LABEL, Podman};

/// The node the agent binds pods to.
pub const NODE_NAME: &str = "tfjob-test-node";
/// Label with `<namespace>/<pod>` on every container the agent runs.
pub const LABEL_POD: &str = "io.tfjob.test.pod";
/// Where a pod finds its service-account credentials.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The API server's name inside the containers (a SAN of its serving certificate).
const API_HOST: &str = "kubernetes.default.svc";
/// How often the agent looks at the pods.
const RESYNC: Duration = Duration::from_millis(300);

/// What a test asks of the agent while it runs.
enum Request {
    /// Send a signal to the container of `<namespace>/<pod>`.
    Kill { pod: String, signal: String, reply: mpsc::Sender<Result<()>> },
    /// Bind unbound pods only once they have waited this long (see [`NodeOptions::bind_delay`]).
    BindDelay(Duration),
    /// Stop as a lost machine does: every container killed at once, nothing more written.
    Lose { reply: mpsc::Sender<()> },
}

/// Which node an agent is, and which pods it takes.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The node's name: pods are bound to it, and the agent runs only pods bound to it.
    pub name: String,
    /// Run the pods on this existing network (another agent's: one cluster network over two
    /// nodes) instead of a network of its own.
    pub join_network: Option<String>,
    /// Bind only unbound pods whose name starts with one of these (`None`: every unbound pod),
    /// as a scheduler with a preference would.
    pub bind_prefixes: Option<Vec<String>>,
    /// Bind an unbound pod only once it is this old, so that another agent that binds at once
    /// gets the pods it wants first (a node the scheduler prefers less).
    pub bind_delay: Duration,
}

impl Default for NodeOptions {
    fn default() -> NodeOptions {
        NodeOptions { name: NODE_NAME.into(), join_network: None, bind_prefixes: None, bind_delay: Duration::ZERO }
    }
}

/// What the agent times in the pods' logs: the first line of a pod that contains each of these.
const WATCHED: [&str; 2] = ["global_step", "first gradient accepted"];

/// Every line of every pod, in files `<dir>/<namespace>_<pod>.log` (appended across restarts,
/// as `kubectl logs` and `--previous` together would show them), and the time each pod's
/// first line containing each of [`WATCHED`] was seen. The kubelet's messages go to stderr.
struct Logs {
    dir: PathBuf,
    files: Mutex<HashMap<String, File>>,
    /// (watched text, `<namespace>/<pod>`) → when first seen.
    first_seen: Mutex<BTreeMap<(&'static str, String), Instant>>,
}

impl Logs {
    fn path(&self, pod_key: &str) -> PathBuf {
        self.dir.join(format!("{}.log", pod_key.replace('/', "_")))
    }
}

impl PodOutput for Logs {
    fn line(&self, pod_key: &str, line: &str) {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if !files.contains_key(pod_key)
            && let Ok(f) = File::options().create(true).append(true).open(self.path(pod_key))
        {
            files.insert(pod_key.to_string(), f);
        }
        if let Some(f) = files.get_mut(pod_key) {
            let _ = writeln!(f, "{line}");
        }
        for watched in WATCHED.iter().filter(|w| line.contains(*w)) {
            self.first_seen.lock().unwrap_or_else(|p| p.into_inner()).entry((watched, pod_key.to_string())).or_insert_with(Instant::now);
        }
    }

    fn info(&self, message: &str) {
        eprintln!("node-agent: {message}");
    }
}

/// The running agent (see the module documentation). Stopped on drop: every container and the
/// network removed.
pub struct NodeAgent {
    stop: Arc<AtomicBool>,
    requests: mpsc::Sender<Request>,
    thread: Option<thread::JoinHandle<Result<()>>>,
    logs: Arc<Logs>,
    network: String,
    _dir: tempfile::TempDir,
}

impl NodeAgent {
    /// Starts serving the pods of `namespaces` on `cp`, with the podman API service at
    /// `docker_host` (`unix://...`).
    pub fn start(cp: &ControlPlane, namespaces: &[&str], docker_host: &str) -> Result<NodeAgent> {
        Self::start_node(cp, namespaces, docker_host, NodeOptions::default())
    }

    /// [`start`](Self::start) as the node `node` describes.
    pub fn start_node(cp: &ControlPlane, namespaces: &[&str], docker_host: &str, node: NodeOptions) -> Result<NodeAgent> {
        Podman::setup()?;
        let dir = tempfile::Builder::new().prefix("tfjob-node-agent.").tempdir().context("agent directory")?;
        let logs = Arc::new(Logs { dir: dir.path().join("logs"), files: Mutex::new(HashMap::new()), first_seen: Mutex::new(BTreeMap::new()) });
        fs::create_dir_all(&logs.dir)?;
        let labels = [(LABEL.to_string(), std::process::id().to_string())];
        let hosts = [docker_host.to_string()];
        let kubelet = match &node.join_network {
            Some(network) => ContainerKubelet::join(&hosts, network, logs.clone()),
            None => ContainerKubelet::connect_to(&hosts, "tfjob-node", &labels, logs.clone()),
        }
        .map_err(|e| anyhow!("{e}"))?;
        let network = kubelet.network().unwrap_or_default().to_string();
        let gateway: Ipv4Addr = kubelet.gateway().ok_or_else(|| anyhow!("network {network} has no gateway"))?.parse().context("gateway address")?;
        let api_port: u16 = cp.server_url().rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(|| anyhow!("no port in {}", cp.server_url()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let forward_port = start_forwarder(gateway, api_port, stop.clone())?;
        let kubeconfig = cp.kubeconfig_path().to_path_buf();
        let ca = cp.ca_pem().to_string();
        let ctx = AgentContext {
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            sa_root: dir.path().join("serviceaccounts"),
            ca,
            extra_host: format!("{API_HOST}:{gateway}"),
            forward_port,
            node,
        };
        fs::create_dir_all(&ctx.sa_root)?;
        let (tx, rx) = mpsc::channel();
        let stop2 = stop.clone();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new().name("node-agent".into()).spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let client = match rt.block_on(admin_client(&kubeconfig)) {
                Ok(c) => {
                    let _ = ready_tx.send(Ok(()));
                    c
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            let mut agent = Agent { ctx, client, rt, kubelet, written: HashMap::new(), failed_starts: HashMap::new() };
            while !stop2.load(Ordering::SeqCst) {
                while let Ok(req) = rx.try_recv() {
                    match req {
                        Request::Kill { pod, signal, reply } => {
                            let _ = reply.send(agent.kubelet.kill_pod(&pod, &signal).map_err(|e| anyhow!("{e}")));
                        }
                        Request::BindDelay(delay) => agent.ctx.node.bind_delay = delay,
                        Request::Lose { reply } => {
                            agent.kubelet.shutdown_with_grace(0);
                            let _ = reply.send(());
                            return Ok(());
                        }
                    }
                }
                if let Err(e) = agent.sync() {
                    eprintln!("node-agent: {e:#}");
                }
                thread::sleep(RESYNC);
            }
            agent.kubelet.shutdown();
            Ok(())
        })?;
        ready_rx.recv_timeout(Duration::from_secs(30)).map_err(|_| anyhow!("node agent did not start"))?.map_err(|e| anyhow!("node agent: {e}"))?;
        Ok(NodeAgent { stop, requests: tx, thread: Some(thread), logs, network, _dir: dir })
    }

    /// The network every pod's container is on.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// Serves the pods' logs through the API server (`kubectl logs`; [`crate::kubelet_logs`]),
    /// with a Node object for the agent: for one agent per control plane only.
    pub fn serve_logs(&self, cp: &ControlPlane) -> Result<crate::kubelet_logs::KubeletLogs> {
        let logs = self.logs.clone();
        crate::kubelet_logs::serve(cp, NODE_NAME, Arc::new(move |ns: &str, pod: &str| logs.path(&format!("{ns}/{pod}"))))
    }

    /// Everything a pod wrote so far (every run of its container).
    pub fn pod_log(&self, namespace: &str, pod: &str) -> String {
        fs::read_to_string(self.logs.path(&format!("{namespace}/{pod}"))).unwrap_or_default()
    }

    /// When the first line with `global_step` of any pod of `namespace` whose name starts with
    /// `prefix` was seen.
    pub fn first_step(&self, namespace: &str, prefix: &str) -> Option<Instant> {
        self.first_seen("global_step", namespace, prefix)
    }

    /// When the first line with a new gradient accepted ("first gradient accepted") of any pod of
    /// `namespace` whose name starts with `prefix` was seen.
    pub fn first_gradient(&self, namespace: &str, prefix: &str) -> Option<Instant> {
        self.first_seen("first gradient accepted", namespace, prefix)
    }

    fn first_seen(&self, watched: &str, namespace: &str, prefix: &str) -> Option<Instant> {
        let key = format!("{namespace}/{prefix}");
        let seen = self.logs.first_seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().filter(|((w, pod), _)| *w == watched && pod.starts_with(&key)).map(|(_, t)| *t).min()
    }

    /// Kills the container of a pod with a signal (`KILL`, `TERM`), as a crash would.
    pub fn kill(&self, namespace: &str, pod: &str, signal: &str) -> Result<()> {
        let (reply, answer) = mpsc::channel();
        self.requests.send(Request::Kill { pod: format!("{namespace}/{pod}"), signal: signal.into(), reply }).map_err(|_| anyhow!("node agent has stopped"))?;
        answer.recv_timeout(Duration::from_secs(30)).map_err(|_| anyhow!("node agent did not answer"))?
    }

    /// From now on, binds unbound pods only once they are `delay` old.
    pub fn set_bind_delay(&self, delay: Duration) -> Result<()> {
        self.requests.send(Request::BindDelay(delay)).map_err(|_| anyhow!("node agent has stopped"))
    }

    /// The node is lost: every container is killed at once and the agent stops without writing
    /// anything more (its pods stay as they were in the API, as when a machine goes away).
    pub fn lose(&mut self) -> Result<()> {
        let (reply, done) = mpsc::channel();
        self.requests.send(Request::Lose { reply }).map_err(|_| anyhow!("node agent has stopped"))?;
        done.recv_timeout(Duration::from_secs(60)).map_err(|_| anyhow!("node agent did not stop"))?;
        self.stop()
    }

    /// Stops the agent: every container and the network are removed.
    pub fn stop(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow!("node agent panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A client of the control plane with its admin kubeconfig.
pub async fn admin_client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig).context("reading the admin kubeconfig")?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.context("admin kubeconfig")?;
    Client::try_from(config).context("admin client")
}

/// Listens on `gateway:<free port>` (before the bridge has that address: `IP_FREEBIND`) and
/// passes every connection on to `127.0.0.1:api_port`.
fn start_forwarder(gateway: Ipv4Addr, api_port: u16, stop: Arc<AtomicBool>) -> Result<u16> {
    let listener = freebind_listener(gateway).with_context(|| format!("listening on {gateway} for the API server forwarder"))?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    thread::Builder::new().name("api-forwarder".into()).spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((inbound, _)) => {
                    let _ = inbound.set_nonblocking(false);
                    if let Ok(outbound) = TcpStream::connect((Ipv4Addr::LOCALHOST, api_port)) {
                        pipe(inbound, outbound);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(20)),
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    })?;
    Ok(port)
}

/// Copies bytes both ways between two connections until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let one_way = |mut from: TcpStream, mut to: TcpStream| {
        move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        }
    };
    thread::spawn(one_way(a, b2));
    thread::spawn(one_way(b, a2));
}

fn freebind_listener(ip: Ipv4Addr) -> io::Result<TcpListener> {
    // SAFETY: plain socket syscalls on a descriptor this function owns; it is handed to
    // TcpListener (which closes it) or closed on every error path.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let listener = TcpListener::from_raw_fd(fd);
        let one: libc::c_int = 1;
        if libc::setsockopt(fd, libc::IPPROTO_IP, libc::IP_FREEBIND, (&one as *const libc::c_int).cast(), size_of::<libc::c_int>() as libc::socklen_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        let addr = SocketAddrV4::new(ip, 0);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: addr.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
            sin_zero: [0; 8],
        };
        if libc::bind(fd, (&sin as *const libc::sockaddr_in).cast(), size_of::<libc::sockaddr_in>() as libc::socklen_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::listen(fd, 128) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(listener)
    }
}

struct AgentContext {
    namespaces: Vec<String>,
    sa_root: PathBuf,
    ca: String,
    /// `kubernetes.default.svc:<gateway>`.
    extra_host: String,
    forward_port: u16,
    node: NodeOptions,
}

impl AgentContext {
    /// Whether the pod is this node's to run: bound to it, or unbound and taken by it now.
    fn takes(&self, pod: &Pod, now: jiff::Timestamp) -> bool {
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(node) => node == self.node.name,
            None => {
                let name = pod.name_any();
                let wanted = self.node.bind_prefixes.as_ref().is_none_or(|p| p.iter().any(|p| name.starts_with(p.as_str())));
                let age =
                    pod.metadata.creation_timestamp.as_ref().map_or(Duration::MAX, |t| Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0)));
                wanted && age >= self.node.bind_delay
            }
        }
    }
}

struct Agent {
    ctx: AgentContext,
    client: Client,
    /// Runs the API calls; the kubelet has a runtime of its own and is called outside this one.
    rt: tokio::runtime::Runtime,
    kubelet: ContainerKubelet,
    /// The last status written per pod key, to write only changes.
    written: HashMap<String, Value>,
    /// Pods whose container could not be made, and when to try again.
    failed_starts: HashMap<String, Instant>,
}

impl Agent {
    /// Stops the containers of every pod being deleted, all at once as
    /// kubelets do (each gets its grace period, capped at 3 s here), then
    /// removes the pod objects.
    fn finish_terminating(&mut self, listed: &BTreeMap<String, Pod>) {
        let now = jiff::Timestamp::now();
        let mine = |key: &String, p: &Pod| self.kubelet.pods().any(|k| k == key) || self.ctx.takes(p, now);
        let terminating: Vec<(&String, &Pod)> = listed.iter().filter(|(k, p)| p.metadata.deletion_timestamp.is_some() && mine(k, p)).collect();
        let mut by_grace: BTreeMap<i32, Vec<&str>> = BTreeMap::new();
        for (key, pod) in &terminating {
            let grace = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30).clamp(0, 3) as i32;
            by_grace.entry(grace).or_default().push(key.as_str());
        }
        for (grace, keys) in by_grace {
            self.kubelet.delete_pods(&keys, grace);
        }
        for (key, pod) in terminating {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            // As a kubelet does, the pod's phase ends before the object goes: a finalizer (Kueue's)
            // may keep it, and who holds it waits for that phase.
            if let Some(last) = self.written.remove(key.as_str())
                && let Some(stopped) = stopped_status(&last)
            {
                let patch = json!({ "status": stopped });
                if let Err(e) = self.rt.block_on(api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))) {
                    eprintln!("node-agent: {key}: writing the stopped status: {e}");
                }
            }
            let mut dp = DeleteParams::default().grace_period(0);
            dp.preconditions = Some(kube::api::Preconditions { uid: pod.uid(), resource_version: None });
            let _ = self.rt.block_on(api.delete(&pod.name_any(), &dp));
        }
    }

    /// One pass: start new pods, finish deleted ones, write statuses.
    fn sync(&mut self) -> Result<()> {
        let mut listed: BTreeMap<String, Pod> = BTreeMap::new();
        for ns in &self.ctx.namespaces {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            for pod in self.rt.block_on(api.list(&ListParams::default())).with_context(|| format!("listing pods in {ns}"))? {
                listed.insert(format!("{ns}/{}", pod.name_any()), pod);
            }
        }
        // Containers of pods that are gone from the API.
        let running: Vec<String> = self.kubelet.pods().map(str::to_string).collect();
        for key in running {
            if !listed.contains_key(&key) {
                self.kubelet.delete_pod(&key, 0);
                self.written.remove(&key);
            }
        }
        self.finish_terminating(&listed);
        let now = jiff::Timestamp::now();
        for (key, pod) in &listed {
            if !self.ctx.takes(pod, now) {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            // Gated pods wait for whoever holds the gate (Kueue's admission), as the scheduler
            // leaves them unbound.
            if pod.metadata.deletion_timestamp.is_some() || pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty()) {
                continue;
            }
            let known = self.kubelet.pods().any(|p| p == key);
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
            if !known && phase != "Succeeded" && phase != "Failed" {
                if self.failed_starts.get(key).is_some_and(|t| Instant::now() < *t) {
                    continue;
                }
                match self.start_pod(key, pod) {
                    // A kubelet reports each pod once its container runs, not after it has
                    // started the others: with several pods to start on a loaded machine, a
                    // short pod would otherwise go from Pending to Succeeded unseen.
                    Ok(()) => self.write_observed(&listed),
                    Err(e) => {
                        let message = format!("{e:#}");
                        eprintln!("node-agent: {message}");
                        self.failed_starts.insert(key.clone(), Instant::now() + Duration::from_secs(5));
                        let status = waiting_status(pod, "CreateContainerError", &message);
                        self.write_status(key, &api, pod, status);
                    }
                }
            }
        }
        self.write_observed(&listed);
        Ok(())
    }

    /// Writes the status of every pod whose container state changed.
    fn write_observed(&mut self, listed: &BTreeMap<String, Pod>) {
        for (key, state) in self.kubelet.observe() {
            let Some(pod) = listed.get(&key) else { continue };
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let status = pod_status(pod, &state);
            self.write_status(&key, &api, pod, status);
        }
    }

    fn write_status(&mut self, key: &str, api: &Api<Pod>, pod: &Pod, status: Value) {
        if self.written.get(key) == Some(&status) {
            return;
        }
        let patch = json!({ "status": status });
        match self.rt.block_on(api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))) {
            Ok(_) => {
                self.written.insert(key.to_string(), status);
            }
            Err(e) => eprintln!("node-agent: {key}: writing status: {e}"),
        }
    }

    fn start_pod(&mut self, key: &str, pod: &Pod) -> Result<()> {
        let spec = self.rt.block_on(self.pod_container(key, pod))?;
        self.kubelet.run_pod(key, spec).map_err(|e| anyhow!("{e}"))
    }

    /// Binds the pod to the node and makes its container's spec (env resolved, credentials).
    async fn pod_container(&self, key: &str, pod: &Pod) -> Result<PodContainer> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let spec = pod.spec.as_ref().ok_or_else(|| anyhow!("no spec"))?;
        if spec.node_name.is_none() {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": { "name": name, "namespace": ns },
                "target": { "apiVersion": "v1", "kind": "Node", "name": self.ctx.node.name },
            });
            api.create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding).await.context("binding the pod to the node")?;
        }
        if spec.containers.len() > 1 {
            eprintln!("node-agent: {key}: only the first of {} containers runs", spec.containers.len());
        }
        let container = spec.containers.first().ok_or_else(|| anyhow!("no container"))?;
        let mut env = self.resolve_env(pod, container).await?;
        let mut mounts = Vec::new();
        let mut extra_hosts = Vec::new();
        let automount = spec.automount_service_account_token.unwrap_or(true);
        if automount {
            let sa = spec.service_account_name.clone().unwrap_or_else(|| "default".into());
            let dir = self.service_account_files(pod, &sa).await?;
            mounts.push(BindMount { host_path: dir.display().to_string(), container_path: SA_DIR.into(), read_only: true });
            env.push(("KUBERNETES_SERVICE_HOST".into(), API_HOST.into()));
            env.push(("KUBERNETES_SERVICE_PORT".into(), self.ctx.forward_port.to_string()));
            extra_hosts.push(self.ctx.extra_host.clone());
        }
        // hostPath volumes: the node's directory; Secret volumes: a directory of its keys' files
        // (mode 0644, the kubelet's default). Mounted as the kubelet does.
        for m in container.volume_mounts.iter().flatten() {
            let volume = spec.volumes.iter().flatten().find(|v| v.name == m.name);
            let host_path = match (volume.and_then(|v| v.host_path.as_ref()), volume.and_then(|v| v.secret.as_ref())) {
                (Some(host), _) => host.path.clone(),
                (None, Some(secret)) => self.secret_volume_files(pod, &m.name, secret).await?.display().to_string(),
                (None, None) => continue,
            };
            mounts.push(BindMount { host_path, container_path: m.mount_path.clone(), read_only: m.read_only.unwrap_or(false) });
        }
        let hostname = spec.hostname.clone().unwrap_or_else(|| name.clone());
        let mut aliases = Vec::new();
        if let Some(sub) = spec.subdomain.as_deref() {
            aliases.push(format!("{hostname}.{sub}.{ns}.svc"));
            aliases.push(format!("{hostname}.{sub}.{ns}.svc.cluster.local"));
            aliases.push(format!("{hostname}.{sub}"));
        }
        // What a per-replica Service named like the pod (Kubeflow's operator makes one for each
        // replica, and its TF_CONFIG names them) resolves to.
        aliases.push(format!("{name}.{ns}.svc"));
        aliases.push(format!("{name}.{ns}.svc.cluster.local"));
        aliases.push(hostname.clone());
        Ok(PodContainer {
            log_name: key.to_string(),
            image: container.image.clone().ok_or_else(|| anyhow!("container {} has no image", container.name))?,
            command: container.command.clone().unwrap_or_default(),
            args: container.args.clone().unwrap_or_default(),
            env,
            hostname,
            aliases,
            labels: vec![(LABEL.into(), std::process::id().to_string()), (LABEL_POD.into(), key.to_string())],
            restart_policy: spec.restart_policy.clone().unwrap_or_else(|| "Always".into()),
            mounts,
            extra_hosts,
        })
    }

    /// The container's env as the kubelet builds it: in order, literal values with their
    /// `$(VAR)` references to earlier variables expanded, values from elsewhere as they are.
    async fn resolve_env(&self, pod: &Pod, container: &Container) -> Result<Vec<(String, String)>> {
        let ns = pod.namespace().unwrap_or_default();
        let mut out = Environment::new();
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(v), _) => {
                    out.define_value(&var.name, v);
                    continue;
                }
                (None, Some(from)) => {
                    if let Some(r) = &from.secret_key_ref {
                        let secret: Secret = Api::namespaced(self.client.clone(), &ns).get(&r.name).await.with_context(|| format!("secret {}", r.name))?;
                        let bytes = secret.data.as_ref().and_then(|d| d.get(&r.key)).ok_or_else(|| anyhow!("secret {} has no key {}", r.name, r.key))?;
                        String::from_utf8_lossy(&bytes.0).into_owned()
                    } else if let Some(r) = &from.config_map_key_ref {
                        let cm: ConfigMap = Api::namespaced(self.client.clone(), &ns).get(&r.name).await.with_context(|| format!("configmap {}", r.name))?;
                        cm.data.as_ref().and_then(|d| d.get(&r.key)).cloned().ok_or_else(|| anyhow!("configmap {} has no key {}", r.name, r.key))?
                    } else if let Some(f) = &from.field_ref {
                        match f.field_path.as_str() {
                            "metadata.name" => pod.name_any(),
                            "metadata.namespace" => ns.clone(),
                            "metadata.uid" => pod.uid().unwrap_or_default(),
                            "spec.nodeName" => self.ctx.node.name.clone(),
                            "spec.serviceAccountName" => pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
                            _ => String::new(),
                        }
                    } else {
                        bail!("env {}: only value, secretKeyRef, configMapKeyRef and fieldRef are supported", var.name);
                    }
                }
                (None, None) => String::new(),
            };
            out.define(&var.name, value);
        }
        Ok(out.into_vars())
    }

    /// A Secret volume's files: one per key of its Secret (which must exist: until it does the
    /// pod is not started, as the kubelet holds it in ContainerCreating), or, when the volume
    /// lists `items`, those keys only, at their paths (a key missing from the Secret holds the
    /// pod too, as the kubelet's "couldn't find key").
    async fn secret_volume_files(&self, pod: &Pod, volume: &str, source: &SecretVolumeSource) -> Result<PathBuf> {
        let ns = pod.namespace().unwrap_or_default();
        let secret = source.secret_name.as_deref().unwrap_or_default();
        let found: Secret =
            Api::namespaced(self.client.clone(), &ns).get(secret).await.with_context(|| format!("secret volume {volume}: secret {ns}/{secret}"))?;
        let dir = self.ctx.sa_root.join(format!("{ns}_{}_{volume}", pod.name_any()));
        fs::create_dir_all(&dir)?;
        let data = found.data.unwrap_or_default();
        let files: Vec<(String, &[u8])> = match &source.items {
            None => data.iter().map(|(key, value)| (key.clone(), value.0.as_slice())).collect(),
            Some(items) => items
                .iter()
                .map(|i| {
                    Ok((
                        i.path.clone(),
                        data.get(&i.key).ok_or_else(|| anyhow!("secret volume {volume}: couldn't find key {} in Secret {ns}/{secret}", i.key))?.0.as_slice(),
                    ))
                })
                .collect::<Result<_>>()?,
        };
        for (path, value) in files {
            fs::write(dir.join(&path), value)?;
            set_mode(&dir.join(&path), 0o644)?;
        }
        set_mode(&dir, 0o755)?;
        Ok(dir)
    }

    /// `token` (a TokenRequest bound to the pod), `ca.crt`, `namespace`: readable by the image's
    /// non-root user.
    async fn service_account_files(&self, pod: &Pod, sa: &str) -> Result<PathBuf> {
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &ns);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = api
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .with_context(|| format!("token for ServiceAccount {ns}/{sa}"))?
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| anyhow!("token request for {ns}/{sa} returned no token"))?;
        let dir = self.ctx.sa_root.join(format!("{ns}_{}", pod.name_any()));
        fs::create_dir_all(&dir)?;
        for (file, content) in [("token", token.as_str()), ("ca.crt", self.ctx.ca.as_str()), ("namespace", ns.as_str())] {
            fs::write(dir.join(file), content)?;
            set_mode(&dir.join(file), 0o644)?;
        }
        set_mode(&dir, 0o755)?;
        Ok(dir)
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", path.display()))
}

fn container_name(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).unwrap_or_default()
}

fn image_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

fn now() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).unwrap_or_else(|_| jiff::Timestamp::now()).to_string()
}

fn start_time(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0.to_string()).unwrap_or_else(now)
}

fn conditions(ready: bool, since: &str) -> Value {
    let t = since;
    let ready = if ready { "True" } else { "False" };
    json!([
        { "type": "PodScheduled", "status": "True", "lastTransitionTime": t },
        { "type": "Initialized", "status": "True", "lastTransitionTime": t },
        { "type": "ContainersReady", "status": ready, "lastTransitionTime": t },
        { "type": "Ready", "status": ready, "lastTransitionTime": t },
    ])
}

/// A pod whose container could not be made.
fn waiting_status(pod: &Pod, reason: &str, message: &str) -> Value {
    json!({
        "phase": "Pending",
        "hostIP": "127.0.0.1",
        "containerStatuses": [{
            "name": container_name(pod), "image": image_of(pod), "imageID": "", "ready": false, "restartCount": 0,
            "state": { "waiting": { "reason": reason, "message": message } },
        }],
    })
}

/// The pod status a kubelet would write for this container state. Times are what the engine
/// reports, so the status changes only when the container's state does.
/// The status of a pod whose container was stopped because the pod is being deleted: phase
/// `Failed` and the container terminated by the signal (137), from the last status written;
/// `None` when that status had ended already.
fn stopped_status(last: &Value) -> Option<Value> {
    if matches!(last["phase"].as_str(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut status = last.clone();
    status["phase"] = json!("Failed");
    if let Some(c) = status["containerStatuses"].get_mut(0) {
        let started = c["state"]["running"]["startedAt"].clone();
        c["state"] = json!({ "terminated": { "exitCode": 137, "reason": "Error", "startedAt": started, "finishedAt": now() } });
        c["ready"] = json!(false);
        c["started"] = json!(false);
    }
    Some(status)
}

fn pod_status(pod: &Pod, st: &PodState) -> Value {
    let started = st.started_at.clone().unwrap_or_else(now);
    let finished = st.finished_at.clone().unwrap_or_else(now);
    let terminated = |code: i32| {
        json!({ "terminated": {
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": started, "finishedAt": finished,
            "containerID": format!("podman://{}", st.container),
        }})
    };
    let (phase, state, last_state) = match st.phase {
        Phase::Succeeded | Phase::Failed => {
            let code = st.exit_code.unwrap_or(if st.phase == Phase::Succeeded { 0 } else { 1 });
            (if st.phase == Phase::Succeeded { "Succeeded" } else { "Failed" }, terminated(code), json!({}))
        }
        _ if st.running => ("Running", json!({ "running": { "startedAt": started } }), st.exit_code.map(terminated).unwrap_or(json!({}))),
        _ => match st.exit_code {
            // Exited, to be restarted in place after the back-off.
            Some(code) => (
                "Running",
                json!({ "waiting": { "reason": "CrashLoopBackOff", "message": format!("back-off restarting container (exit code {code})") } }),
                terminated(code),
            ),
            None => ("Pending", json!({ "waiting": { "reason": "ContainerCreating" } }), json!({})),
        },
    };
    let mut status = json!({
        "phase": phase,
        "hostIP": "127.0.0.1",
        "startTime": start_time(pod),
        "conditions": conditions(st.running, &started),
        "containerStatuses": [{
            "name": container_name(pod), "image": image_of(pod), "imageID": "",
            "containerID": format!("podman://{}", st.container),
            "ready": st.running, "started": st.running, "restartCount": st.restart_count,
            "state": state, "lastState": last_state,
        }],
    });
    if let Some(ip) = &st.ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{ "ip": ip }]);
    }
    status
}

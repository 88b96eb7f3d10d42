//! Running the operator (`tfjob-operator`, the image's binary) against the test control plane
//! ([`crate::controlplane`]).
//!
//! - [`tfjob_binary`], [`operator_binary`]: the `tfjob` and `tfjob-operator` binaries built for
//!   the same target directory as the tests (`tests/run.sh` builds every binary in release
//!   first).
//! - [`install_crd`]: `crds/tfjob.yaml`, applied once and waited for until Established.
//! - [`operator_rbac`] / [`operator_account`]: THE RBAC the operator runs with in these tests
//!   (the Helm chart's, rendered with the real helm), a token kubeconfig for its ServiceAccount
//!   and the environment of the chart's Deployment.
//! - [`Operator`]: one operator process (killed when dropped), with its log, `/readyz` and
//!   `/metrics`.
//! - [`Cluster`]: kubectl-based reads and writes in one namespace, among them setting pod phases
//!   and exit codes through the pods' `status` subresource (no kubelet runs).

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::controlplane::{ControlPlane, free_port, spawn_supervised, tail};

/// The repository root (parent of `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The `tfjob` binary the tests run (`tfjob run`, `tfjob validate`, ...), found or built as
/// [`operator_binary`] says.
pub fn tfjob_binary() -> Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| find_or_build("tfjob", "tfjob").map_err(|e| format!("{e:#}"))).clone().map_err(|e| anyhow!(e))
}

/// The `tfjob-operator` binary (the operator image's) that [`Operator`] runs.
///
/// Both binaries are found the same way: `$TFJOB_BIN_DIR/<bin>` when that variable is set;
/// otherwise `<target>/release/<bin>` (what `tests/run.sh` builds with `cargo test --release
/// --workspace --no-run` before the tests run), else `<target>/<profile of this test>/<bin>`.
/// When none exists it is built with `cargo build --release -p <package> --bin <bin>` into
/// `<target>/operator-tests-cargo` (a separate target directory: the running `cargo test` holds
/// the lock of its own). A binary older than the operator's sources is used with a warning on
/// stderr.
pub fn operator_binary() -> Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| find_or_build("tfjob-operator", "tfjob-operator").map_err(|e| format!("{e:#}"))).clone().map_err(|e| anyhow!(e))
}

fn find_or_build(bin: &str, package: &str) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("TFJOB_BIN_DIR") {
        let path = PathBuf::from(dir).join(bin);
        if !path.is_file() {
            bail!("TFJOB_BIN_DIR is set but {} does not exist", path.display());
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating the test binary")?;
    // <target>/<profile>/deps/<test binary>, or <target>/<profile>/<program> (tfjob-soak).
    let dir = exe.parent().ok_or_else(|| anyhow!("{} has no parent", exe.display()))?;
    let profile_dir = if dir.ends_with("deps") { dir.parent().ok_or_else(|| anyhow!("{} has no parent", dir.display()))? } else { dir };
    let target = profile_dir.parent().ok_or_else(|| anyhow!("{} has no parent", profile_dir.display()))?;
    for dir in [target.join("release"), profile_dir.to_path_buf()] {
        let path = dir.join(bin);
        if path.is_file() {
            warn_if_stale(&path, package);
            return Ok(path);
        }
    }
    let own = target.join("operator-tests-cargo");
    eprintln!(
        "operator tests: no `{bin}` binary in {} (run `cargo build --release -p {package}` first, \
         as tests/run.sh does); building it into {} ...",
        target.join("release").display(),
        own.display()
    );
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--locked", "-p", package, "--bin", bin])
        .env("CARGO_TARGET_DIR", &own)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running cargo build --release -p {package}"))?;
    let path = own.join("release").join(bin);
    if !status.success() || !path.is_file() {
        bail!("no `{bin}` binary next to the tests and building one failed ({status}); run `cargo build --release -p {package}` first");
    }
    Ok(path)
}

fn warn_if_stale(bin: &Path, package: &str) {
    let Ok(built) = fs::metadata(bin).and_then(|m| m.modified()) else { return };
    let src = repo_root().join("operator");
    let sources = files_under(&src).into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs") && p.components().any(|c| c.as_os_str() == "src"));
    let newer = sources.into_iter().find(|p| fs::metadata(p).and_then(|m| m.modified()).map(|t| t > built).unwrap_or(false));
    if let Some(p) = newer {
        eprintln!(
            "WARNING: {} is older than {}; rebuild it (`cargo build --release -p {package}`) to test \
             the current operator",
            bin.display(),
            p.display()
        );
    }
}

/// Every file under `dir`, in its subdirectories too (none when it cannot be read).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Applies `crds/tfjob.yaml` (once per control plane and test process) and waits until the CRD
/// is Established.
pub fn install_crd(cp: &ControlPlane) -> Result<()> {
    static DONE: Mutex<Vec<(String, Result<(), String>)>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = done.iter().find(|(server, _)| server == cp.server_url()) {
        return r.clone().map_err(|e| anyhow!("installing crds/tfjob.yaml: {e}"));
    }
    let r = (|| -> Result<()> {
        let crd = fs::read_to_string(repo_root().join("crds").join("tfjob.yaml")).context("reading crds/tfjob.yaml")?;
        cp.apply(&crd)?;
        cp.wait_established(&["tfjobs.kubeflow.org"])?;
        Ok(())
    })()
    .map_err(|e| format!("{e:#}"));
    done.push((cp.server_url().to_string(), r.clone()));
    r.map_err(|e| anyhow!("installing crds/tfjob.yaml: {e}"))
}

pub use crate::chart::RELEASE;

/// Helm values of every test install: namespaced mode, watching the release namespace (the
/// tests share one API server; a cluster-wide operator would reconcile other tests' jobs), plus
/// `extra`.
fn values<'a>(namespace: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![("watchNamespace", namespace)];
    v.extend_from_slice(extra);
    v
}

/// THE RBAC of the operator in these tests: exactly what the Helm chart ships
/// (`templates/serviceaccount.yaml` and `templates/rbac.yaml` rendered by the real helm through
/// [`crate::chart::render_rbac`]), for release [`RELEASE`] in `namespace`, watching `namespace`.
pub fn operator_rbac(cp: &ControlPlane, namespace: &str) -> Result<String> {
    crate::chart::render_rbac(cp, namespace, &values(namespace, &[]))
}

/// The YAML documents of a multi-document manifest, as JSON values (empty documents skipped).
pub fn yaml_documents(manifest: &str) -> Result<Vec<Value>> {
    crate::chart::documents(manifest)
}

/// How the chart configures one environment variable of the operator container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    /// A literal value.
    Value(String),
    /// The pod's name (downward API).
    PodName,
    /// The pod's namespace (downward API).
    PodNamespace,
}

/// The operator as the chart installs it in one namespace: its RBAC applied, a token kubeconfig
/// for its ServiceAccount, and the environment of the chart's Deployment.
#[derive(Debug, Clone)]
pub struct OperatorSetup {
    /// The RBAC manifest that was applied ([`operator_rbac`]).
    pub rbac: String,
    /// The ServiceAccount the chart creates.
    pub service_account: String,
    /// Kubeconfig with a token of that ServiceAccount (TokenRequest API).
    pub kubeconfig: PathBuf,
    /// Release (and watched) namespace.
    pub namespace: String,
    /// Environment of the chart's operator container.
    pub env: Vec<(String, EnvSource)>,
}

impl OperatorSetup {
    /// A literal environment value of the chart's Deployment.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env.iter().find_map(|(n, v)| match v {
            EnvSource::Value(v) if n == name => Some(v.as_str()),
            _ => None,
        })
    }
}

/// Installs the CRD, applies [`operator_rbac`] in `namespace` and returns a kubeconfig for the
/// chart's ServiceAccount plus the Deployment's environment. Waits until the RBAC is in force.
pub fn operator_account(cp: &ControlPlane, namespace: &str) -> Result<OperatorSetup> {
    operator_account_with(cp, namespace, &[])
}

/// [`operator_account`] with more chart values (`helm --set` syntax), e.g.
/// `("networkPolicy.enabled", "true")`.
pub fn operator_account_with(cp: &ControlPlane, namespace: &str, extra: &[(&str, &str)]) -> Result<OperatorSetup> {
    install_crd(cp)?;
    let rbac = crate::chart::render_rbac(cp, namespace, &values(namespace, extra))?;
    let sas: Vec<String> =
        yaml_documents(&rbac)?.iter().filter(|d| d["kind"] == "ServiceAccount").filter_map(|d| d["metadata"]["name"].as_str().map(String::from)).collect();
    let [service_account] = sas.as_slice() else {
        bail!("the rendered chart has {} ServiceAccounts ({sas:?}), expected one:\n{rbac}", sas.len());
    };
    let service_account = service_account.clone();
    cp.kubectl_stdin(["apply", "-n", namespace, "-f", "-"], &rbac).context("applying the chart's RBAC")?;

    let deployment = crate::chart::template(cp, RELEASE, namespace, &values(namespace, extra), &["templates/deployment.yaml"])?;
    let docs = yaml_documents(&deployment)?;
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").ok_or_else(|| anyhow!("the chart renders no Deployment:\n{deployment}"))?;
    let sa_in_pod = dep["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap_or_default();
    if sa_in_pod != service_account {
        bail!("the chart's Deployment runs as {sa_in_pod:?}, its ServiceAccount is {service_account:?}");
    }
    let container =
        dep["spec"]["template"]["spec"]["containers"].as_array().and_then(|cs| cs.first()).ok_or_else(|| anyhow!("the chart's Deployment has no container"))?;
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default().to_string();
        let source = if let Some(v) = e["value"].as_str() {
            EnvSource::Value(v.to_string())
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => EnvSource::PodName,
                Some("metadata.namespace") => EnvSource::PodNamespace,
                _ => bail!("the test cannot provide env {name} of the chart's Deployment: {e}"),
            }
        };
        env.push((name, source));
    }

    let kubeconfig = cp.service_account_kubeconfig(namespace, &service_account)?;
    let account = OperatorSetup { rbac, service_account, kubeconfig, namespace: namespace.to_string(), env };
    eventually("the operator's RBAC takes effect", Duration::from_secs(30), || {
        let out =
            cp.command_with_kubeconfig("kubectl", &account.kubeconfig).args(["auth", "can-i", "list", "tfjobs.kubeflow.org", "-n", namespace]).output()?;
        Ok(out.status.success().then_some(()))
    })?;
    Ok(account)
}

/// How many pods a `SuccessfulCreatePod` (or `SuccessfulDeletePod`) note of the operator names:
/// `Created pod: a` is one, `Created 5 pods: a, b, ...` (the names cut to fit) five.
pub fn pods_in_note(note: &str) -> usize {
    let count = note.split_once(' ').and_then(|(_, rest)| rest.split_once(" pods")).and_then(|(n, _)| n.parse().ok());
    count.unwrap_or(1)
}

/// The requests `user` made, by `verb resource[/subresource]`, from the API server's audit log,
/// without the Lease (leader election renews it every few seconds whatever the jobs do).
pub fn requests_by_kind(cp: &ControlPlane, user: &str) -> Result<std::collections::BTreeMap<String, usize>> {
    let mut by_kind = std::collections::BTreeMap::new();
    for e in cp.audit_events(user)? {
        let r = &e["objectRef"];
        let resource = r["resource"].as_str().unwrap_or_default();
        if resource == "leases" {
            continue;
        }
        let mut what = format!("{} {resource}", e["verb"].as_str().unwrap_or_default());
        if let Some(sub) = r["subresource"].as_str() {
            what = format!("{what}/{sub}");
        }
        *by_kind.entry(what).or_insert(0) += 1;
    }
    Ok(by_kind)
}

/// One `tfjob-operator`, watching one namespace: a process restarted, as the chart's Deployment's
/// kubelet would restart its container, when it stops after losing its lease (the API server
/// stalled past the renew deadline; the operator stops by design then). Any other exit is final,
/// so a crash still fails the test. Killed (SIGKILL) when dropped.
pub struct Operator {
    /// Value of `POD_NAME` (the events' `reportingInstance` and the lease identity's prefix).
    pub name: String,
    process: Arc<Mutex<Process>>,
    log: PathBuf,
    metrics_port: u16,
}

/// What starts the operator's process again: its binary, environment and log.
struct Launch {
    name: String,
    bin: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
    log: PathBuf,
}

impl Launch {
    /// Starts the process, its output into the log (appended to after the first start).
    fn spawn(&self, append: bool) -> Result<Child> {
        let out = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args).env_clear().envs(self.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        spawn_supervised(cmd).with_context(|| format!("starting {}", self.bin.display()))
    }
}

/// The operator's current process.
struct Process {
    child: Child,
    launch: Launch,
    /// Restarts after a lost lease.
    restarts: u32,
    /// Set by [`Operator::kill`] and [`Operator::terminate`]: no restart after that.
    stopping: bool,
}

impl Process {
    /// Whether the operator has stopped for good; restarts it first when it stopped after
    /// losing its lease.
    fn poll(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => false,
            Ok(Some(_)) if !self.stopping && stopped_after_losing_lease(&self.launch.log) => !self.restart(),
            _ => true,
        }
    }

    /// Starts the process again; whether it started.
    fn restart(&mut self) -> bool {
        self.restarts += 1;
        eprintln!(
            "  operator {} lost its lease and stopped; restarted as its Deployment's kubelet would (restart {}). Machine: {}",
            self.launch.name,
            self.restarts,
            machine_pressure()
        );
        let note = format!("---- tests: restart {} after the lost lease ----\n", self.restarts);
        let _ = fs::OpenOptions::new().append(true).open(&self.launch.log).and_then(|mut f| f.write_all(note.as_bytes()));
        match self.launch.spawn(true) {
            Ok(child) => {
                self.child = child;
                true
            }
            Err(e) => {
                eprintln!("  operator {}: cannot restart it: {e:#}", self.launch.name);
                false
            }
        }
    }
}

/// Whether the operator's log ends with its stop after a lost lease (`startup::lost_leadership`).
fn stopped_after_losing_lease(log: &Path) -> bool {
    tail(log, 6).contains("lost leadership; stopping")
}

/// The machine's load and pressure stall information (`/proc/loadavg`, `/proc/pressure/*`), for
/// a message about a stall.
pub fn machine_pressure() -> String {
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default();
    let mut out = format!("load {}", read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    for kind in ["cpu", "io", "memory"] {
        // First line: "some avg10=0.00 avg60=0.00 avg300=0.00 total=N".
        let text = read(&format!("/proc/pressure/{kind}"));
        if let Some(line) = text.lines().next() {
            let avgs: Vec<&str> = line.split_whitespace().filter(|w| w.starts_with("avg")).collect();
            out.push_str(&format!("; {kind} pressure {}", avgs.join(" ")));
        }
    }
    out
}

fn lock_process(p: &Mutex<Process>) -> std::sync::MutexGuard<'_, Process> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl Operator {
    /// Starts `tfjob-operator` as the chart's Deployment would (its environment, its
    /// ServiceAccount), as pod `name` in the account's namespace.
    pub fn start(cp: &ControlPlane, account: &OperatorSetup, name: &str) -> Result<Operator> {
        let bin = operator_binary()?;
        let ns = &account.namespace;
        let metrics_port = free_port()?;
        let logs = cp.dir().join("operator-logs");
        fs::create_dir_all(&logs)?;
        let log = logs.join(format!("{ns}.{name}.log"));
        // The image's entrypoint is `tfjob-operator`; the chart configures it through the
        // environment only. The process gets exactly that environment, with the downward API
        // values filled in and the metrics address moved to a free loopback port.
        let mut env: Vec<(String, OsString)> = vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("KUBECONFIG".into(), account.kubeconfig.clone().into()),
            ("RUST_BACKTRACE".into(), "1".into()),
        ];
        for (k, v) in &account.env {
            let value = match v {
                EnvSource::Value(v) => v.as_str(),
                EnvSource::PodName => name,
                EnvSource::PodNamespace => ns,
            };
            env.push((k.clone(), value.into()));
        }
        // For debugging a failure: e.g. TFJOB_TEST_OPERATOR_LOG_LEVEL=debug.
        if let Some(level) = std::env::var_os("TFJOB_TEST_OPERATOR_LOG_LEVEL") {
            env.push(("TFJOB_LOG_LEVEL".into(), level));
        }
        env.push(("TFJOB_METRICS_ADDR".into(), format!("127.0.0.1:{metrics_port}").into()));
        Operator::launch(Launch { name: name.to_string(), bin, args: Vec::new(), env, log }, metrics_port)
    }

    fn launch(launch: Launch, metrics_port: u16) -> Result<Operator> {
        let (name, log) = (launch.name.clone(), launch.log.clone());
        let child = launch.spawn(false)?;
        let process = Arc::new(Mutex::new(Process { child, launch, restarts: 0, stopping: false }));
        watch(Arc::downgrade(&process));
        Ok(Operator { name, process, log, metrics_port })
    }

    /// Starts the operator and waits until `/readyz` answers 200 (it leads and serves).
    pub fn start_ready(cp: &ControlPlane, account: &OperatorSetup, name: &str) -> Result<Operator> {
        let mut op = Operator::start(cp, account, name)?;
        op.wait_ready(Duration::from_secs(30))?;
        Ok(op)
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.exited() {
                bail!("operator {} exited:\n{}", self.name, self.log_tail(40));
            }
            if self.readyz() == Some(200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("operator {} not ready after {timeout:?}:\n{}", self.name, self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Status code of `GET /readyz` (`None` when the server does not answer).
    pub fn readyz(&self) -> Option<u16> {
        let resp = http_get(self.metrics_port, "/readyz").ok()?;
        resp.split_whitespace().nth(1)?.parse().ok()
    }

    /// Body of `GET /metrics`.
    pub fn metrics(&self) -> Result<String> {
        let resp = http_get(self.metrics_port, "/metrics")?;
        Ok(resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    /// Body of `GET <path>` of the operator's HTTP server (`/debug/caches`, ...).
    pub fn page(&self, path: &str) -> Result<String> {
        let resp = http_get(self.metrics_port, path)?;
        Ok(resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        lock_process(&self.process).child.id()
    }

    /// The process's resident memory (`VmRSS`), in MiB.
    pub fn rss_mib(&self) -> Result<f64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).context("the operator's /proc status")?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS in /proc/{}/status", self.pid()))?;
        Ok(kib / 1024.0)
    }

    /// The value of an unlabelled metric sample (e.g. `tfjob_reconcile_duration_seconds_count`).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let text = self.metrics()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .ok_or_else(|| anyhow!("no sample {name} in /metrics of {}:\n{text}", self.name))
    }

    /// Whether the process still runs.
    pub fn is_running(&self) -> bool {
        !self.exited()
    }

    /// Whether the operator has stopped for good (an exit after a lost lease is followed by a
    /// restart, not counted).
    pub fn exited(&self) -> bool {
        lock_process(&self.process).poll()
    }

    /// How often the operator was restarted after losing its lease.
    pub fn restarts(&self) -> u32 {
        lock_process(&self.process).restarts
    }

    /// SIGKILL: no graceful shutdown, the lease is not released.
    pub fn kill(&mut self) {
        let mut p = lock_process(&self.process);
        p.stopping = true;
        let _ = p.child.kill();
        let _ = p.child.wait();
    }

    /// SIGTERM, then waits (at most 10 s, then SIGKILL): a graceful stop that releases the lease.
    pub fn terminate(&mut self) -> Result<()> {
        {
            let mut p = lock_process(&self.process);
            p.stopping = true;
            // Gone already (and reaped by the watcher): its pid may belong to another process now.
            if p.child.try_wait()?.is_some() {
                return Ok(());
            }
            // SAFETY: plain syscall on our own child's pid, not reaped: the lock keeps the
            // watcher from reaping it in between.
            unsafe {
                libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock_process(&self.process).child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.kill();
                bail!("operator {} did not stop within 10 s of SIGTERM:\n{}", self.name, self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        // Some lines (kube-rs logs whole API responses) are huge: keep their start.
        let text: Vec<String> = tail(&self.log, lines)
            .lines()
            .map(|l| if l.len() > 400 { format!("{}...", l.chars().take(400).collect::<String>()) } else { l.to_string() })
            .collect();
        format!("--- {} ({}) ---\n{}", self.name, self.log.display(), text.join("\n"))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Restarts the operator when it stops after losing its lease, also while no test waits on it
/// (the waits that do not know of the operator would otherwise see a job left unreconciled).
fn watch(process: Weak<Mutex<Process>>) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let Some(process) = process.upgrade() else { return };
            let mut p = lock_process(&process);
            if p.stopping || p.poll() {
                return;
            }
        }
    });
}

fn http_get(port: u16, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    // One write: the operator's small HTTP server answers after its first read.
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Polls `check` every 100 ms until it returns `Some`, for at most `timeout`; errors from
/// `check` are retried and the last one is reported on timeout.
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            bail!("{what}: not true after {timeout:?}{}", last_err.map(|e| format!(" (last error: {e:#})")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the `tensorflow` container of a pod looks like, as a kubelet would report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodState {
    /// Pod phase: `Pending`, `Running`, `Succeeded`, `Failed`.
    pub phase: &'static str,
    /// `state.terminated.exitCode` (the container terminated).
    pub exit_code: Option<i32>,
    /// `lastState.terminated.exitCode` (an earlier run of a restarted container).
    pub last_exit_code: Option<i32>,
    /// `restartCount`.
    pub restart_count: i32,
}

impl PodState {
    /// Running, never restarted.
    pub const RUNNING: PodState = PodState { phase: "Running", exit_code: None, last_exit_code: None, restart_count: 0 };

    /// Succeeded with exit code 0.
    pub const SUCCEEDED: PodState = PodState { phase: "Succeeded", exit_code: Some(0), last_exit_code: None, restart_count: 0 };

    /// Failed with `code`.
    pub fn failed(code: i32) -> PodState {
        PodState { phase: "Failed", exit_code: Some(code), last_exit_code: None, restart_count: 0 }
    }

    /// Running again after `restarts` in-place restarts, the last one after exiting with `code`.
    pub fn restarted(restarts: i32, code: i32) -> PodState {
        PodState { phase: "Running", exit_code: None, last_exit_code: Some(code), restart_count: restarts }
    }

    /// The body of a merge patch of the pod's `status` subresource.
    pub fn status_patch(&self) -> Value {
        let now = "2020-01-01T00:00:00Z";
        let terminated = |code: i32| {
            json!({"terminated": {
                "exitCode": code,
                "reason": if code == 0 { "Completed" } else { "Error" },
                "startedAt": now,
                "finishedAt": now,
            }})
        };
        let state = match self.exit_code {
            Some(code) => terminated(code),
            None if self.phase == "Running" => json!({"running": {"startedAt": now}}),
            None => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        let mut container = json!({
            "name": "tensorflow",
            "image": "tfjob-runtime:latest",
            "imageID": "",
            "ready": self.phase == "Running",
            "started": self.phase == "Running",
            "restartCount": self.restart_count,
            "state": state,
        });
        if let Some(code) = self.last_exit_code {
            container["lastState"] = terminated(code);
        }
        json!({"status": {
            "phase": self.phase,
            "containerStatuses": [container],
        }})
    }
}

/// kubectl (as admin) in one namespace.
pub struct Cluster<'a> {
    /// The control plane.
    pub cp: &'a ControlPlane,
    /// The namespace.
    pub ns: String,
}

impl<'a> Cluster<'a> {
    /// Works in `ns`.
    pub fn new(cp: &'a ControlPlane, ns: &str) -> Cluster<'a> {
        Cluster { cp, ns: ns.to_string() }
    }

    /// `kubectl apply -f -` (client-side apply, as a user would) of a JSON or YAML manifest.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.cp.kubectl_stdin(["apply", "-n", &self.ns, "-f", "-"], manifest)
    }

    /// The object as JSON, `None` when it does not exist.
    pub fn get(&self, kind: &str, name: &str) -> Result<Option<Value>> {
        let out = self.cp.kubectl_ok(["get", kind, name, "-n", &self.ns, "--ignore-not-found", "-o", "json"])?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out).with_context(|| format!("parsing {kind}/{name}"))?))
    }

    /// Like [`get`](Self::get) but the object must exist.
    pub fn must_get(&self, kind: &str, name: &str) -> Result<Value> {
        self.get(kind, name)?.ok_or_else(|| anyhow!("{kind}/{name} does not exist in {}", self.ns))
    }

    /// Names of the objects of `kind` matching a label selector (all when empty), sorted.
    pub fn names(&self, kind: &str, selector: &str) -> Result<Vec<String>> {
        let mut args = vec!["get", kind, "-n", &self.ns, "-o", "json"];
        if !selector.is_empty() {
            args.extend(["-l", selector]);
        }
        let list: Value = serde_json::from_str(&self.cp.kubectl_ok(args)?)?;
        let mut names: Vec<String> =
            list["items"].as_array().map(|items| items.iter().filter_map(|i| i["metadata"]["name"].as_str().map(String::from)).collect()).unwrap_or_default();
        names.sort();
        Ok(names)
    }

    /// Names of the pods of a job (by the `training.kubeflow.org/job-name` label), sorted.
    pub fn job_pods(&self, job: &str) -> Result<Vec<String>> {
        self.names("pods", &format!("training.kubeflow.org/job-name={job}"))
    }

    /// Sets the phase and `tensorflow` container state of a pod through its status subresource.
    pub fn set_pod(&self, pod: &str, state: PodState) -> Result<()> {
        self.cp.kubectl_ok(["patch", "pod", pod, "-n", &self.ns, "--subresource=status", "--type=merge", "-p", &state.status_patch().to_string()])?;
        Ok(())
    }

    /// Merge-patches a TFJob's spec (e.g. `{"spec":{"runPolicy":{"suspend":true}}}`).
    pub fn patch_job(&self, job: &str, patch: Value) -> Result<()> {
        self.patch_merge("tfjob", job, patch)
    }

    /// Merge-patches any object (e.g. the phase of a PodGroup, as its scheduler writes it).
    pub fn patch_merge(&self, kind: &str, name: &str, patch: Value) -> Result<()> {
        self.cp.kubectl_ok(["patch", kind, name, "-n", &self.ns, "--type=merge", "-p", &patch.to_string()])?;
        Ok(())
    }

    /// The messages of the events about object `name` with `reason`.
    pub fn events_of(&self, name: &str, reason: &str) -> Result<Vec<String>> {
        let selector = format!("involvedObject.name={name},reason={reason}");
        let list: Value = serde_json::from_str(&self.cp.kubectl_ok(["get", "events", "-n", &self.ns, "--field-selector", &selector, "-o", "json"])?)?;
        Ok(list["items"].as_array().into_iter().flatten().filter_map(|e| e["message"].as_str().map(String::from)).collect())
    }

    /// `kubectl get tfjob NAME` as a user sees it: the columns' names and the job's row, cut
    /// where each name starts (kubectl aligns them; a column without a value is blank: "").
    pub fn columns(&self, job: &str) -> Result<Vec<(String, String)>> {
        let out = self.cp.kubectl_ok(["get", "tfjob", job, "-n", &self.ns])?;
        let mut lines = out.lines();
        let (head, row) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
        let starts: Vec<(usize, &str)> = head.split_whitespace().map(|name| (name.as_ptr() as usize - head.as_ptr() as usize, name)).collect();
        Ok(starts
            .iter()
            .enumerate()
            .map(|(i, (start, name))| {
                let end = starts.get(i + 1).map_or(row.len(), |(next, _)| *next).min(row.len());
                (name.to_string(), row.get((*start).min(end)..end).unwrap_or_default().trim().to_string())
            })
            .collect())
    }

    /// The uid of an object.
    pub fn uid(&self, kind: &str, name: &str) -> Result<String> {
        let v = self.must_get(kind, name)?;
        Ok(v["metadata"]["uid"].as_str().unwrap_or_default().to_string())
    }

    /// The job's status (`{}` when it has none), `None` when the job does not exist.
    pub fn job_status(&self, job: &str) -> Result<Option<Value>> {
        Ok(self.get("tfjob", job)?.map(|j| j.get("status").cloned().unwrap_or_else(|| json!({}))))
    }

    /// Waits until `pred` holds for the job's status; returns that status.
    pub fn wait_status(&self, job: &str, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let mut last = Value::Null;
        let r = eventually(&format!("TFJob {}/{job}: {what}", self.ns), timeout, || {
            let st = self.job_status(job)?.ok_or_else(|| anyhow!("the job does not exist"))?;
            let ok = pred(&st);
            last = st.clone();
            Ok(ok.then_some(st))
        });
        r.map_err(|e| anyhow!("{e:#}\nlast status: {last:#}"))
    }

    /// Waits until the job's pods (by label) are exactly `want` (sorted names).
    pub fn wait_pods(&self, job: &str, want: &[&str], timeout: Duration) -> Result<()> {
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        let mut last = Vec::new();
        eventually(&format!("pods of {}/{job} are {want:?}", self.ns), timeout, || {
            last = self.job_pods(job)?;
            Ok((last == want).then_some(()))
        })
        .map_err(|e| anyhow!("{e:#} (last seen: {last:?})"))
    }
}

/// The condition of `type_` in a job status, if present.
pub fn condition<'v>(status: &'v Value, type_: &str) -> Option<&'v Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Whether the condition `type_` is present with status `True`.
pub fn condition_true(status: &Value, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c["status"] == "True")
}

/// A replica count from `status.replicaStatuses.<rtype>.<field>` (0 when absent).
pub fn replica_count(status: &Value, rtype: &str, field: &str) -> i64 {
    status["replicaStatuses"][rtype][field].as_i64().unwrap_or(0)
}

/// Parses an RFC 3339 timestamp field.
pub fn timestamp(v: &Value) -> Result<jiff::Timestamp> {
    v.as_str().ok_or_else(|| anyhow!("not a timestamp: {v}"))?.parse().with_context(|| format!("parsing timestamp {v}"))
}

/// One replica set of a TFJob manifest (YAML, under `tfReplicaSpecs`) whose `tensorflow`
/// container runs the runtime's image with `args` (a JSON array), `restartPolicy: OnFailure`;
/// `container` and `pod` are extra lines of the container and of the pod spec (YAML at their
/// indentation, each line ending in a newline), empty for none.
pub fn runtime_replica_yaml(rtype: &str, replicas: u32, args: &str, container: &str, pod: &str) -> String {
    format!(
        "    {rtype}:
      replicas: {replicas}
      restartPolicy: OnFailure
      template:
        spec:
          containers:
            - name: tensorflow
              image: ghcr.io/tfjob-rs/tfjob-runtime:0.1.0
              imagePullPolicy: IfNotPresent
              command: [\"tfjob-runtime\"]
              args: {args}
{container}{pod}"
    )
}

/// A TFJob manifest (JSON) with the given replica sets (`(type, replicas, restartPolicy)`) and
/// `runPolicy`, every replica a `tensorflow` container of `tfjob-runtime:latest`.
pub fn tfjob(name: &str, replicas: &[(&str, i32, &str)], run_policy: Value) -> Value {
    let mut specs = serde_json::Map::new();
    for (rtype, n, restart) in replicas {
        specs.insert(
            rtype.to_string(),
            json!({
                "replicas": n,
                "restartPolicy": restart,
                "template": {"spec": {"containers": [{
                    "name": "tensorflow",
                    "image": "tfjob-runtime:latest",
                    "command": ["tfjob-runtime"],
                    "args": ["--model=linear", "--train_steps=100"],
                }]}},
            }),
        );
    }
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": specs},
    })
}

#[cfg(test)]
mod note_tests {
    #[test]
    fn a_note_names_as_many_pods_as_it_says() {
        for (note, want) in
            [("Created pod: j-ps-0", 1), ("Created 5 pods: j-ps-0, j-worker-0", 5), ("Deleted 1001 pods: a, and 999 more", 1001), ("Deleted 2 pods", 2)]
        {
            assert_eq!(super::pods_in_note(note), want, "{note}");
        }
    }
}

#[cfg(test)]
mod restart_tests {
    use std::time::{Duration, Instant};

    use super::{Launch, Operator};

    /// A stand-in operator: a shell script that runs `first` on its first start and `later`
    /// after that (a marker file tells them apart).
    fn stand_in(dir: &std::path::Path, first: &str, later: &str) -> Operator {
        let marker = dir.join("started-before");
        let script = format!("if [ -e '{m}' ]; then {later}; else touch '{m}'; {first}; fi", m = marker.display());
        let launch = Launch {
            name: "op-0".into(),
            bin: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("PATH".into(), std::env::var_os("PATH").unwrap_or_default())],
            log: dir.join("op-0.log"),
        };
        Operator::launch(launch, 1).unwrap()
    }

    fn settle(op: &Operator, until: impl Fn(&Operator) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !until(op) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn an_operator_that_stops_after_losing_its_lease_is_restarted_by_the_watcher() {
        let dir = tempfile::tempdir().unwrap();
        let lost = "echo 'ERROR tfjob_operator::startup: lost leadership; stopping'; echo 'INFO stopped'; exit 1";
        let op = stand_in(dir.path(), lost, "echo second; sleep 30");
        // Nobody asks in between: the watcher thread restarts it.
        let log = || std::fs::read_to_string(dir.path().join("op-0.log")).unwrap();
        settle(&op, |_| log().ends_with("second\n"));
        assert_eq!(op.restarts(), 1);
        assert!(!op.exited(), "{}", op.log_tail(10));
        let log = log();
        assert!(log.contains("lost leadership") && log.contains("restart 1 after the lost lease") && log.ends_with("second\n"), "{log}");
    }

    #[test]
    fn an_operator_that_exits_otherwise_stays_exited() {
        for exit in ["exit 0", "exit 101", "echo 'panicked at src/x.rs'; exit 101", "kill -9 $$"] {
            let dir = tempfile::tempdir().unwrap();
            let op = stand_in(dir.path(), exit, "sleep 30");
            settle(&op, Operator::exited);
            assert!(op.exited(), "{exit}");
            assert_eq!(op.restarts(), 0, "{exit}");
        }
    }

    #[test]
    fn a_killed_or_terminated_operator_is_not_restarted_even_after_a_lost_lease_line() {
        let dir = tempfile::tempdir().unwrap();
        // Stops on SIGTERM with the lost-lease line: `terminate` must not have it restarted.
        let traps = "trap \"echo 'lost leadership; stopping'; exit 1\" TERM; echo trapping; while :; do sleep 0.1; done";
        let mut op = stand_in(dir.path(), traps, "sleep 30");
        settle(&op, |op| op.log_tail(5).contains("trapping"));
        op.terminate().unwrap();
        assert!(op.log_tail(5).contains("lost leadership"), "{}", op.log_tail(5));
        std::thread::sleep(Duration::from_millis(600));
        assert!(op.exited());
        assert_eq!(op.restarts(), 0, "{}", op.log_tail(10));
        let mut op = stand_in(tempfile::tempdir().unwrap().path(), "sleep 30", "sleep 30");
        op.kill();
        assert!(op.exited());
    }
}

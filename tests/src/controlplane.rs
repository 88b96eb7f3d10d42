//! A real Kubernetes control plane for tests, in the spirit of controller-runtime's envtest.
//!
//! [`ControlPlane::start`] builds (once per machine, see `tests/controlplane/build.sh`) and starts
//! etcd, kube-apiserver (RBAC, service accounts, generated certificates) and
//! kube-controller-manager (garbage collector, namespace, service-account and workload
//! controllers) on free loopback ports, writes an admin kubeconfig and waits until the API server
//! reports `/readyz` ok and the controller manager `/healthz` ok.
//!
//! Everything runs in a temporary directory that also holds each component's log
//! (`<dir>/logs/<component>.log`). The processes are killed when the [`ControlPlane`] is dropped
//! or [`ControlPlane::stop`]ped, and — through `PR_SET_PDEATHSIG` — also when the test process
//! dies without running destructors (panic=abort, SIGKILL, a timeout in CI).
//!
//! Most tests should share one instance per test binary and isolate themselves by namespace:
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use tfjob_tests::controlplane::ControlPlane;
//! let cp = ControlPlane::shared()?;           // started on first use, stopped at exit
//! let ns = cp.create_namespace("my-test")?;   // unique name, default ServiceAccount ready
//! cp.kubectl_ok(["create", "configmap", "x", "-n", &ns, "--from-literal=a=b"])?;
//! # Ok(()) }
//! ```
//!
//! If the control plane cannot be built or started, these functions return an error that says so
//! loudly; tests must propagate it and fail, never skip.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

/// Directory of the Go module that pins and builds the control plane binaries.
pub fn controlplane_module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane")
}

/// Environment variable naming a directory that already holds the five binaries
/// (`etcd`, `kube-apiserver`, `kube-controller-manager`, `kubectl`, `helm`); skips the build.
pub const BIN_DIR_ENV: &str = "TFJOB_CONTROLPLANE_BIN_DIR";

/// Environment variable that turns kube-apiserver's profiling on (`1` or `true`; off otherwise,
/// as in every test run): its `/debug/pprof/` endpoints then answer the admin, e.g.
/// `kubectl get --raw '/debug/pprof/profile?seconds=15' > cpu.pprof` and `go tool pprof -top
/// cpu.pprof` (BENCHMARKS.md, "What each request costs the API server").
pub const PROFILING_ENV: &str = "TFJOB_CONTROLPLANE_PROFILING";

/// kube-apiserver's `--profiling` flag for the value of [`PROFILING_ENV`].
fn profiling_flag(value: Option<&str>) -> String {
    format!("--profiling={}", matches!(value, Some("1" | "true")))
}

const BINARIES: [&str; 5] = ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "helm"];
const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Versions pinned in `tests/controlplane/go.mod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// e.g. `v1.37.1`
    pub kubernetes: String,
    /// e.g. `v4.3.1`
    pub helm: String,
    /// e.g. `v3.7.3`
    pub etcd: String,
}

impl Versions {
    /// Reads the pinned versions from the control plane's `go.mod`.
    pub fn pinned() -> Result<Versions> {
        let path = controlplane_module_dir().join("go.mod");
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let find = |module: &str| -> Result<String> {
            text.lines()
                .map(|l| l.trim().trim_start_matches("require").trim())
                .filter_map(|l| {
                    let mut words = l.split_whitespace();
                    (words.next() == Some(module)).then(|| words.next()).flatten()
                })
                .find(|v| v.starts_with('v'))
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{} does not require {module}", path.display()))
        };
        Ok(Versions { kubernetes: find("k8s.io/kubernetes")?, helm: find("helm.sh/helm/v4")?, etcd: find("go.etcd.io/etcd/server/v3")? })
    }
}

fn loud(what: &str, err: impl std::fmt::Display) -> anyhow::Error {
    let bar = "=".repeat(78);
    anyhow!(
        "\n{bar}\nTEST CONTROL PLANE UNAVAILABLE: {what}\n{bar}\n{err}\n{bar}\n\
         These tests need a real kube-apiserver, etcd and kube-controller-manager built from\n\
         tests/controlplane (Go >= 1.26 and the Go module proxy are needed for the first build).\n\
         They FAIL instead of being skipped. Set {BIN_DIR_ENV} to a directory holding\n\
         {} to use binaries built elsewhere.\n{bar}",
        BINARIES.join(", ")
    )
}

/// Builds the binaries if they are not cached yet (this can take many minutes the first time on a
/// machine; progress goes to stderr) and returns the directory that holds them.
pub fn ensure_binaries() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return check_bin_dir(PathBuf::from(dir));
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| run_build_script().map_err(|e| format!("{e:#}"))).clone().map_err(|e| loud("the build failed", e))
}

fn check_bin_dir(dir: PathBuf) -> Result<PathBuf> {
    for b in BINARIES {
        if !dir.join(b).is_file() {
            return Err(loud("missing binary", format!("{BIN_DIR_ENV}={} has no `{b}`", dir.display())));
        }
    }
    Ok(dir)
}

fn run_build_script() -> Result<PathBuf> {
    let script = controlplane_module_dir().join("build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} exited with {} (its output is above)", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| anyhow!("{} printed no bin directory", script.display()))?;
    for b in BINARIES {
        if !dir.join(b).is_file() {
            bail!("{} reported {} but it has no `{b}`", script.display(), dir.display());
        }
    }
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// Supervised processes.
//
// Every component is started with PR_SET_PDEATHSIG=SIGKILL so that the kernel kills it when its
// parent goes away, even if no destructor runs. The signal fires when the *thread* that forked
// the child exits, not the process, so all children are forked by one spawner thread that lives
// as long as the process (test threads come and go).

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for mut req in rx {
                    let _ = req.reply.send(req.command.spawn());
                }
            })
            .expect("spawning the control plane spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `command` in its own process group, to be killed with SIGKILL when this process dies.
pub fn spawn_supervised(mut command: Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited during spawn"));
            }
            // Do not pass on a signal mask (the `controlplane` binary blocks SIGINT/SIGTERM).
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
    let (reply, rx) = mpsc::channel();
    lock(spawner()).send(SpawnRequest { command, reply }).map_err(|_| io::Error::other("the spawner thread is gone"))?;
    rx.recv().map_err(|_| io::Error::other("the spawner thread is gone"))?
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
    /// The flags it was started with, to start it again ([`ControlPlane::restart`]).
    args: Vec<std::ffi::OsString>,
}

fn kill_group(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    if let Ok(None) = child.try_wait() {
        // SAFETY: plain syscall; the child leads its own process group (setpgid in pre_exec).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// The last `lines` lines of a log file (for error messages).
pub fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    // kube-* components dump every flag at startup; that is noise in an error message.
    let all: Vec<&str> = text.lines().filter(|l| !l.contains("] FLAG: --")).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Certificates and kubeconfigs.

struct Pki {
    ca_cert: String,
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
}

impl Pki {
    fn new() -> Result<Pki> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = dn("tfjob-test-ca", None);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign, rcgen::KeyUsagePurpose::DigitalSignature];
        validity(&mut params);
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Pki { ca_cert: cert.pem(), ca_key: key, ca_params: params })
    }

    /// A leaf certificate signed by the CA; returns (cert PEM, key PEM).
    fn issue(&self, common_name: &str, organization: Option<&str>, sans: &[&str], usage: rcgen::ExtendedKeyUsagePurpose) -> Result<(String, String)> {
        let mut params = rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = dn(common_name, organization);
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let key = rcgen::KeyPair::generate()?;
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn dn(common_name: &str, organization: Option<&str>) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    if let Some(o) = organization {
        dn.push(rcgen::DnType::OrganizationName, o);
    }
    dn.push(rcgen::DnType::CommonName, common_name);
    dn
}

fn validity(params: &mut rcgen::CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2200, 1, 1);
}

/// Standard base64 (RFC 4648, with padding), as kubeconfig `*-data` fields need.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How a kubeconfig user authenticates.
enum Credentials<'a> {
    ClientCert { cert: &'a str, key: &'a str },
    Token(&'a str),
}

fn kubeconfig_yaml(server: &str, ca_pem: Option<&str>, user: &str, creds: Credentials<'_>) -> String {
    let mut y = String::new();
    let _ = writeln!(y, "apiVersion: v1\nkind: Config\nclusters:\n- name: tfjob-test\n  cluster:");
    let _ = writeln!(y, "    server: {server}");
    match ca_pem {
        Some(ca) => {
            let _ = writeln!(y, "    certificate-authority-data: {}", base64(ca.as_bytes()));
        }
        None => {
            let _ = writeln!(y, "    insecure-skip-tls-verify: true");
        }
    }
    let _ = writeln!(y, "users:\n- name: {user}\n  user:");
    match creds {
        Credentials::ClientCert { cert, key } => {
            let _ = writeln!(y, "    client-certificate-data: {}", base64(cert.as_bytes()));
            let _ = writeln!(y, "    client-key-data: {}", base64(key.as_bytes()));
        }
        Credentials::Token(token) => {
            let _ = writeln!(y, "    token: {token}");
        }
    }
    let _ = writeln!(
        y,
        "contexts:\n- name: {user}@tfjob-test\n  context:\n    cluster: tfjob-test\n    user: {user}\n\
         current-context: {user}@tfjob-test"
    );
    y
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}

/// A free TCP port on 127.0.0.1 (free when this returns; the OS may hand it out again later).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn free_ports<const N: usize>() -> Result<[u16; N]> {
    // Hold all listeners at once so the ports differ.
    let listeners = (0..N).map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).collect::<io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

// ---------------------------------------------------------------------------------------------

/// Where and how to start a control plane.
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// Run in this directory (created if missing; must be empty) and keep it afterwards.
    /// Default: a fresh temporary directory, removed on stop.
    pub dir: Option<PathBuf>,
    /// Feature gates of kube-apiserver and kube-controller-manager (`Name=true`).
    pub feature_gates: Vec<String>,
    /// API versions kube-apiserver serves beyond its defaults (`group/version=true`).
    pub runtime_config: Vec<String>,
    /// Controllers kube-controller-manager runs beyond [`KCM_CONTROLLERS`] (e.g.
    /// `pod-garbage-collector-controller`, which deletes the pods of a Node deleted: only where
    /// every node agent has its Node object).
    pub extra_controllers: Vec<String>,
}

/// A running etcd + kube-apiserver + kube-controller-manager.
pub struct ControlPlane {
    dir: PathBuf,
    temp: Mutex<Option<tempfile::TempDir>>,
    bin_dir: PathBuf,
    server_url: String,
    kubeconfig: PathBuf,
    ca_pem: String,
    etcd_url: String,
    versions: Versions,
    components: Mutex<Vec<Component>>,
    pids: Vec<u32>,
    counter: AtomicU32,
    options: Options,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("server_url", &self.server_url)
            .field("kubeconfig", &self.kubeconfig)
            .field("pids", &self.pids)
            .finish()
    }
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

extern "C" fn stop_shared_at_exit() {
    if let Some(Ok(cp)) = SHARED.get() {
        cp.stop();
    }
}

impl ControlPlane {
    /// Builds the binaries if needed and starts a control plane in a temporary directory.
    pub fn start() -> Result<ControlPlane> {
        Self::start_with(Options::default())
    }

    /// One control plane per test process, started on first use, stopped when the process exits
    /// (and killed by the kernel if it dies). Tests isolate themselves with
    /// [`create_namespace`](Self::create_namespace). If starting failed, every caller gets the
    /// same error.
    pub fn shared() -> Result<&'static ControlPlane> {
        SHARED
            .get_or_init(|| {
                let cp = Self::start().map_err(|e| format!("{e:#}"))?;
                // SAFETY: registers a plain extern "C" function.
                unsafe {
                    libc::atexit(stop_shared_at_exit);
                }
                Ok(cp)
            })
            .as_ref()
            .map_err(|e| anyhow!("{e}"))
    }

    /// Starts a control plane as described by `options`.
    pub fn start_with(options: Options) -> Result<ControlPlane> {
        let bin_dir = ensure_binaries()?;
        let versions = Versions::pinned()?;
        // A free port can be taken by someone else between our probe and the component's bind;
        // in a temporary directory that is retried with new ports.
        let attempts = if options.dir.is_some() { 1 } else { 3 };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (temp, dir) = match &options.dir {
                Some(dir) => {
                    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                    if fs::read_dir(dir)?.next().is_some() {
                        bail!("{} is not empty; the control plane needs a fresh directory", dir.display());
                    }
                    (None, fs::canonicalize(dir)?)
                }
                None => {
                    let t = tempfile::Builder::new().prefix("tfjob-controlplane-").tempdir()?;
                    let d = t.path().to_path_buf();
                    (Some(t), d)
                }
            };
            let mut cp = ControlPlane {
                kubeconfig: dir.join("kubeconfig"),
                dir,
                temp: Mutex::new(temp),
                bin_dir: bin_dir.clone(),
                server_url: String::new(),
                ca_pem: String::new(),
                etcd_url: String::new(),
                versions: versions.clone(),
                components: Mutex::new(Vec::new()),
                pids: Vec::new(),
                counter: AtomicU32::new(0),
                options: options.clone(),
            };
            match cp.boot() {
                Ok(()) => return Ok(cp),
                Err(e) => {
                    let msg = format!("{e:#}");
                    // Dropping `cp` kills whatever was started and removes its temporary dir.
                    drop(cp);
                    if attempt < attempts && msg.contains("address already in use") {
                        eprintln!("control plane: a port was taken meanwhile; retrying with new ports");
                        continue;
                    }
                    return Err(loud("startup failed", msg));
                }
            }
        }
    }

    fn boot(&mut self) -> Result<()> {
        let dir = self.dir.clone();
        for sub in ["pki", "logs", "home", "kcm"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let pki_dir = dir.join("pki");
        let pki = Pki::new()?;
        let [etcd_client, etcd_peer, apiserver_port, kcm_port] = free_ports::<4>()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        self.server_url = server.clone();
        self.ca_pem = pki.ca_cert.clone();
        self.etcd_url = format!("http://127.0.0.1:{etcd_client}");

        let ca_file = pki_dir.join("ca.crt");
        fs::write(&ca_file, &pki.ca_cert)?;
        write_private(&pki_dir.join("ca.key"), &pki.ca_key.serialize_pem())?;
        let (serving_cert, serving_key) = pki.issue(
            "kube-apiserver",
            None,
            &["127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        fs::write(pki_dir.join("apiserver.crt"), &serving_cert)?;
        write_private(&pki_dir.join("apiserver.key"), &serving_key)?;
        let (admin_cert, admin_key) = pki.issue("tfjob-test-admin", Some("system:masters"), &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth)?;
        let (kcm_cert, kcm_key) = pki.issue("system:kube-controller-manager", None, &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth)?;
        // Service-account token signing key pair (ECDSA P-256): the API server signs with the
        // private key and verifies with the public one.
        let sa_key = pki_dir.join("sa.key");
        let sa_pub = pki_dir.join("sa.pub");
        let sa_pair = rcgen::KeyPair::generate()?;
        write_private(&sa_key, &sa_pair.serialize_pem())?;
        fs::write(&sa_pub, sa_pair.public_key_pem())?;

        let ca_pem = Some(pki.ca_cert.as_str());
        fs::write(&self.kubeconfig, kubeconfig_yaml(&server, ca_pem, "admin", Credentials::ClientCert { cert: &admin_cert, key: &admin_key }))?;
        let kcm_kubeconfig = dir.join("kcm").join("kubeconfig");
        write_private(
            &kcm_kubeconfig,
            &kubeconfig_yaml(&server, ca_pem, "kube-controller-manager", Credentials::ClientCert { cert: &kcm_cert, key: &kcm_key }),
        )?;
        let kcm_health_kubeconfig = dir.join("kcm").join("health.kubeconfig");
        write_private(
            &kcm_health_kubeconfig,
            // The controller manager serves with a self-signed certificate; it authenticates
            // the admin client certificate through the API server's client CA. (An empty user
            // would make kubectl prompt for a password.)
            &kubeconfig_yaml(&format!("https://127.0.0.1:{kcm_port}"), None, "admin", Credentials::ClientCert { cert: &admin_cert, key: &admin_key }),
        )?;

        // etcd
        let peer = format!("http://127.0.0.1:{etcd_peer}");
        self.spawn(
            "etcd",
            [
                "--name=tfjob-test".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={}", self.etcd_url),
                format!("--advertise-client-urls={}", self.etcd_url),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=tfjob-test={peer}"),
                "--initial-cluster-state=new".into(),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        self.wait_until("etcd /health", deadline, |_| Ok(http_get_plain(etcd_client, "/health")?.contains("\"health\":\"true\"")))?;

        // kube-apiserver
        let pki_path = |f: &str| pki_dir.join(f).display().to_string();
        let audit_policy = dir.join("audit-policy.yaml");
        fs::write(&audit_policy, AUDIT_POLICY)?;
        self.spawn(
            "kube-apiserver",
            [
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".into(),
                // The endpoint reconciler refuses a loopback advertise address; the `kubernetes`
                // Service then has no endpoints, which nothing here needs.
                "--endpoint-reconciler-type=none".into(),
                format!("--secure-port={apiserver_port}"),
                format!("--cert-dir={}", dir.join("pki").display()),
                format!("--tls-cert-file={}", pki_path("apiserver.crt")),
                format!("--tls-private-key-file={}", pki_path("apiserver.key")),
                format!("--client-ca-file={}", pki_path("ca.crt")),
                format!("--etcd-servers={}", self.etcd_url),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
                format!("--service-account-key-file={}", sa_pub.display()),
                format!("--service-account-signing-key-file={}", sa_key.display()),
                "--authorization-mode=RBAC".into(),
                format!("--audit-policy-file={}", audit_policy.display()),
                format!("--audit-log-path={}", self.audit_log_path().display()),
                "--audit-log-format=json".into(),
                "--audit-log-mode=blocking".into(),
                "--allow-privileged=true".into(),
                profiling_flag(std::env::var(PROFILING_ENV).ok().as_deref()),
                "--v=1".into(),
            ]
            .into_iter()
            .chain(self.extra_args(true)),
        )?;
        let kubeconfig = self.kubeconfig.clone();
        self.wait_until("kube-apiserver /readyz", deadline, |cp| {
            let out = cp.command("kubectl").args(["get", "--raw=/readyz", "--request-timeout=5s", "--kubeconfig"]).arg(&kubeconfig).output()?;
            Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
        })?;

        // kube-controller-manager
        let kcm_kc = kcm_kubeconfig.display().to_string();
        self.spawn(
            "kube-controller-manager",
            [
                format!("--kubeconfig={kcm_kc}"),
                format!("--authentication-kubeconfig={kcm_kc}"),
                format!("--authorization-kubeconfig={kcm_kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                format!("--cert-dir={}", dir.join("kcm").display()),
                "--leader-elect=false".into(),
                format!(
                    "--controllers={}",
                    KCM_CONTROLLERS.iter().map(|c| c.to_string()).chain(self.options.extra_controllers.iter().cloned()).collect::<Vec<_>>().join(",")
                ),
                format!("--service-account-private-key-file={}", sa_key.display()),
                format!("--root-ca-file={}", ca_file.display()),
                format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
                // Each controller runs as its own ServiceAccount with the bootstrap RBAC roles (as kubeadm
                // does), so RBAC here is what a real cluster enforces.
                "--use-service-account-credentials=true".into(),
                "--v=1".into(),
            ]
            .into_iter()
            .chain(self.extra_args(false)),
        )?;
        self.wait_until("kube-controller-manager /healthz", deadline, |cp| {
            let out = cp.command("kubectl").args(["get", "--raw=/healthz", "--request-timeout=5s", "--kubeconfig"]).arg(&kcm_health_kubeconfig).output()?;
            Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
        })?;
        // The controllers are running once the service account controller has done its work.
        self.wait_until("ServiceAccount default/default (service account controller)", deadline, |cp| {
            Ok(cp.kubectl(["get", "serviceaccount", "default", "-n", "default"])?.status.success())
        })?;
        Ok(())
    }

    /// The feature gates (and, for the API server, the extra API versions) of [`Options`].
    fn extra_args(&self, apiserver: bool) -> Vec<String> {
        let mut out = Vec::new();
        if !self.options.feature_gates.is_empty() {
            out.push(format!("--feature-gates={}", self.options.feature_gates.join(",")));
        }
        if apiserver && !self.options.runtime_config.is_empty() {
            out.push(format!("--runtime-config={}", self.options.runtime_config.join(",")));
        }
        out
    }

    /// Starts kube-scheduler (`binary`, built by `tests/gang/scheduler.sh`) against this control
    /// plane with the admin's credentials and `feature_gates`; it stops with the control plane.
    pub fn start_scheduler(&mut self, binary: &Path, feature_gates: &[String]) -> Result<()> {
        let port = free_port()?;
        let log = self.dir.join("logs").join("kube-scheduler.log");
        let out = File::create(&log)?;
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--authentication-kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--authorization-kubeconfig={}", self.kubeconfig.display()))
            .args(["--bind-address=127.0.0.1", "--leader-elect=false", "--v=2"])
            .arg(format!("--secure-port={port}"))
            .args((!feature_gates.is_empty()).then(|| format!("--feature-gates={}", feature_gates.join(","))))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_supervised(cmd).with_context(|| format!("starting {}", binary.display()))?;
        self.pids.push(child.id());
        lock(&self.components).push(Component { name: "kube-scheduler", child, log, args: Vec::new() });
        Ok(())
    }

    fn spawn<I, S>(&mut self, name: &'static str, args: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = self.spawn_component(name, &args, out)?;
        self.pids.push(child.id());
        lock(&self.components).push(Component { name, child, log, args });
        Ok(())
    }

    fn spawn_component(&self, name: &str, args: &[std::ffi::OsString], log: File) -> Result<Child> {
        let err = log.try_clone()?;
        let mut cmd = Command::new(self.bin_dir.join(name));
        cmd.args(args).current_dir(&self.dir).env("HOME", self.dir.join("home")).stdin(Stdio::null()).stdout(log).stderr(err);
        spawn_supervised(cmd).with_context(|| format!("starting {}", self.bin_dir.join(name).display()))
    }

    /// Kills the components named in `names` at once with SIGKILL (a crash, or the reboot of a
    /// control-plane node), leaves them down for `down`, then starts them again in their start
    /// order with the same flags, ports and data (etcd keeps its data directory), appending to
    /// their logs. Returns once etcd is healthy and the API server ready again.
    pub fn restart(&self, names: &[&str], down: Duration) -> Result<()> {
        let mut components = lock(&self.components);
        let chosen: Vec<usize> = (0..components.len()).filter(|&i| names.contains(&components[i].name)).collect();
        ensure!(chosen.len() == names.len(), "restart {names:?}: not all are components of this control plane");
        for &i in &chosen {
            ensure!(!components[i].args.is_empty(), "{} cannot be restarted", components[i].name);
            kill_group(&mut components[i].child);
        }
        drop(components);
        thread::sleep(down);
        // All started before any is waited for: a component still down would count as exited.
        for &i in &chosen {
            let (name, log, args) = {
                let c = &lock(&self.components)[i];
                (c.name, c.log.clone(), c.args.clone())
            };
            let out = File::options().append(true).open(&log).with_context(|| format!("opening {}", log.display()))?;
            let child = self.spawn_component(name, &args, out)?;
            lock(&self.components)[i].child = child;
        }
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        if names.contains(&"etcd") {
            let port: u16 = self.etcd_url.rsplit(':').next().and_then(|p| p.parse().ok()).context("etcd port")?;
            self.wait_until("etcd /health after a restart", deadline, |_| Ok(http_get_plain(port, "/health")?.contains("\"health\":\"true\"")))?;
        }
        if names.contains(&"kube-apiserver") {
            self.wait_until("kube-apiserver /readyz after a restart", deadline, |cp| {
                let out = cp.command("kubectl").args(["get", "--raw=/readyz", "--request-timeout=5s"]).output()?;
                Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
            })?;
        }
        Ok(())
    }

    /// Polls `ready` until it returns true; fails early (with the logs) if a component exits.
    fn wait_until(&self, what: &str, deadline: Instant, mut ready: impl FnMut(&Self) -> Result<bool>) -> Result<()> {
        let mut last_err = None;
        loop {
            if let Some((name, status)) = self.exited_component() {
                bail!("{name} exited ({status}) while waiting for {what}\n{}", self.logs_tail(60));
            }
            match ready(self) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last_err = Some(e),
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {:?} waiting for {what}{}\n{}",
                    STARTUP_TIMEOUT,
                    last_err.map(|e| format!(" (last error: {e:#})")).unwrap_or_default(),
                    self.logs_tail(60)
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn exited_component(&self) -> Option<(&'static str, ExitStatus)> {
        lock(&self.components).iter_mut().find_map(|c| match c.child.try_wait() {
            Ok(Some(status)) => Some((c.name, status)),
            _ => None,
        })
    }

    /// The last `lines` lines of every component's log, for error messages.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut s = String::new();
        for c in lock(&self.components).iter() {
            let _ = writeln!(s, "----- last {lines} lines of {} -----", c.log.display());
            let _ = writeln!(s, "{}", tail(&c.log, lines));
        }
        s
    }

    /// Kills every component and waits for it; removes the temporary directory (unless it was
    /// given in [`Options::dir`]). Idempotent. Also called on drop.
    pub fn stop(&self) {
        let mut components = lock(&self.components);
        // Controller manager first, etcd last.
        while let Some(mut c) = components.pop() {
            kill_group(&mut c.child);
        }
        drop(components);
        if let Some(t) = lock(&self.temp).take() {
            let _ = t.close();
        }
    }

    /// Admin kubeconfig (client certificate in group `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>` of the API server.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// PEM of the CA that signed the API server's serving certificate and the client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// `http://127.0.0.1:<port>` of etcd.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The directory holding pki/, logs/, etcd/ and the kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory holding etcd, kube-apiserver, kube-controller-manager, kubectl and helm.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The log file of a component (`etcd`, `kube-apiserver`, `kube-controller-manager`).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{component}.log"))
    }

    /// The API server's audit log ([`AUDIT_POLICY`]: one JSON line per completed request of a
    /// service account outside kube-system).
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir.join("logs").join("audit.log")
    }

    /// The completed requests of `user` (e.g. `system:serviceaccount:ns:tfjob-operator`) in the
    /// audit log, oldest first: each an audit event (`verb`, `objectRef`, `responseStatus`, ...).
    pub fn audit_events(&self, user: &str) -> Result<Vec<serde_json::Value>> {
        let text = fs::read_to_string(self.audit_log_path()).with_context(|| format!("reading {}", self.audit_log_path().display()))?;
        let mut events = Vec::new();
        for line in text.lines().filter(|l| l.contains(user)) {
            let e: serde_json::Value = serde_json::from_str(line).context("parsing an audit event")?;
            if e["user"]["username"] == user && e["stage"] == "ResponseComplete" {
                events.push(e);
            }
        }
        Ok(events)
    }

    /// Versions pinned in go.mod (what the binaries report).
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    /// Process ids of the components (etcd, kube-apiserver, kube-controller-manager).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// A command for one of the binaries (`kubectl`, `helm`, ...) with `KUBECONFIG` set to the
    /// admin kubeconfig and `HOME` (so kubectl's and helm's caches) inside the control plane dir.
    pub fn command(&self, binary: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(binary));
        let home = self.dir.join("home");
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &home)
            .env("KUBECACHEDIR", home.join(".kube").join("cache"))
            .env("HELM_CACHE_HOME", home.join("helm").join("cache"))
            .env("HELM_CONFIG_HOME", home.join("helm").join("config"))
            .env("HELM_DATA_HOME", home.join("helm").join("data"))
            .stdin(Stdio::null());
        cmd
    }

    /// Like [`command`](Self::command) but with `KUBECONFIG` set to `kubeconfig` (e.g. one from
    /// [`service_account_kubeconfig`](Self::service_account_kubeconfig)).
    pub fn command_with_kubeconfig(&self, binary: &str, kubeconfig: &Path) -> Command {
        let mut cmd = self.command(binary);
        cmd.env("KUBECONFIG", kubeconfig);
        cmd
    }

    /// Runs kubectl as admin and returns its output, whatever the exit status.
    pub fn kubectl<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command("kubectl").args(args).output().context("running kubectl")
    }

    /// Runs kubectl as admin; returns stdout, or an error with stderr if it failed. A read
    /// (`get`) that cannot reach the API server (a stalled or restarting server: a connection
    /// refused, a TLS handshake timed out) is tried again for up to a minute, as a client's
    /// informer would: the tests' polls wait through a stall instead of failing on it.
    pub fn kubectl_ok<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
        let read = args.first().is_some_and(|a| a == "get");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut cmd = self.command("kubectl");
            cmd.args(&args);
            match run_ok(cmd, None) {
                Err(e) if read && unreachable_server(&format!("{e:#}")) && Instant::now() < deadline => {
                    eprintln!("  (kubectl could not reach the API server; trying again: {})", e.to_string().lines().last().unwrap_or_default());
                    thread::sleep(Duration::from_secs(1));
                }
                out => return out,
            }
        }
    }

    /// Waits (up to 60 s) until every CustomResourceDefinition named (`kind.group`) is
    /// Established. `kubectl wait --for=condition=...` fails at once, not waits, on a CRD whose
    /// status has no conditions yet (just applied): that answer is waited through.
    pub fn wait_established(&self, crds: &[&str]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for crd in crds {
            let condition = "jsonpath={.status.conditions[?(@.type==\"Established\")].status}";
            while self.kubectl_ok(["get", "crd", crd, "-o", condition]).unwrap_or_default() != "True" {
                anyhow::ensure!(Instant::now() < deadline, "CRD {crd} not Established within 60 s");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Runs kubectl as admin with `stdin` as its standard input (e.g. `apply -f -`).
    pub fn kubectl_stdin<I, S>(&self, args: I, stdin: &str) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command("kubectl");
        cmd.args(args);
        run_ok(cmd, Some(stdin))
    }

    /// `kubectl apply --server-side -f -` of a YAML/JSON document (stream).
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.kubectl_stdin(["apply", "--server-side", "--field-manager=tfjob-tests", "-f", "-"], manifest)
    }

    /// Runs helm (KUBECONFIG = admin) and returns its output, whatever the exit status.
    pub fn helm<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command("helm").args(args).output().context("running helm")
    }

    /// Runs helm; returns stdout, or an error with stderr if it failed.
    pub fn helm_ok<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command("helm");
        cmd.args(args);
        run_ok(cmd, None)
    }

    /// Creates a namespace with a unique name starting with `prefix` and waits until its
    /// `default` ServiceAccount exists (so pods can be created in it right away).
    pub fn create_namespace(&self, prefix: &str) -> Result<String> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut prefix: String = prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        prefix.truncate(40);
        let name = format!("{}-{}-{n}", prefix.trim_matches('-'), std::process::id());
        self.kubectl_ok(["create", "namespace", &name])?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.kubectl(["get", "serviceaccount", "default", "-n", &name])?.status.success() {
            if Instant::now() > deadline {
                bail!("ServiceAccount {name}/default did not appear within 60s");
            }
            thread::sleep(Duration::from_millis(100));
        }
        Ok(name)
    }

    /// Creates (if missing) ServiceAccount `namespace/name`, requests a token for it through the
    /// TokenRequest API (`kubectl create token`, valid 24h) and writes a kubeconfig that uses that
    /// bearer token. The account has no permissions until RBAC grants some.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let sa = format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  namespace: {namespace}\n");
        self.apply(&sa)?;
        let token = self.kubectl_ok(["create", "token", name, "-n", namespace, "--duration=24h"])?;
        let token = token.trim();
        if token.is_empty() {
            bail!("kubectl create token {namespace}/{name} returned no token");
        }
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let dir = self.dir.join("serviceaccounts");
        fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{namespace}.{name}.kubeconfig"));
        write_private(&path, &kubeconfig_yaml(&self.server_url, Some(&self.ca_pem), &user, Credentials::Token(token)))?;
        Ok(path)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the API server audits: every request of a service account (at `Metadata` level: who,
/// verb, object, response code), but none of kube-controller-manager's controllers (service
/// accounts of kube-system), each once it has completed. Tests count an operator's requests with
/// it ([`ControlPlane::audit_events`]).
pub const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: None
  userGroups: [\"system:serviceaccounts:kube-system\"]
- level: Metadata
  userGroups: [\"system:serviceaccounts\"]
- level: None
";

/// Controllers run by kube-controller-manager. No kubelet or scheduler runs, so pods stay Pending;
/// the workload controllers still create their pods, and the garbage collector deletes dependents
/// whose owners are gone.
pub const KCM_CONTROLLERS: &[&str] = &[
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "ttl-after-finished-controller",
    "endpointslice-controller",
    "resourcequota-controller",
    "endpoints-controller",
    "clusterrole-aggregation-controller",
];

fn run_ok(mut cmd: Command, stdin: Option<&str>) -> Result<String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let describe = format!("{} {}", Path::new(&program).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or(program), args.join(" "));
    let out = match stdin {
        None => cmd.output(),
        Some(input) => {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = cmd.spawn().with_context(|| format!("running {describe}"))?;
            let mut pipe = child.stdin.take().expect("stdin is piped");
            let input = input.to_string();
            let writer = thread::spawn(move || pipe.write_all(input.as_bytes()));
            let out = child.wait_with_output();
            let _ = writer.join();
            out
        }
    }
    .with_context(|| format!("running {describe}"))?;
    if !out.status.success() {
        bail!("`{describe}` failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether kubectl's error says the API server could not be reached at all (so the request was
/// never served), not that it answered with an error.
fn unreachable_server(stderr: &str) -> bool {
    stderr.contains("Unable to connect to the server") || stderr.contains("The connection to the server") && stderr.contains("was refused")
}

/// HTTP/1.0 GET on 127.0.0.1:port (plain HTTP: etcd's /health, Kueue's /readyz).
pub fn http_get_plain(port: u16, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// CPU seconds (user and system) process `pid` has used so far, from `/proc/PID/stat`; `None`
/// once it is gone.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2, the command, is in parentheses and may hold spaces: the fields after its last ')'
    // start at field 3, so utime (14) and stime (15) are the 12th and 13th of them.
    let after = stat.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
    let ticks = after.get(11)?.parse::<u64>().ok()? + after.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / per_sec.max(1) as f64)
}

/// The command name of process `pid` (`/proc/PID/comm`, at most 15 bytes), or its pid.
pub fn process_name(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim().to_string()).unwrap_or_else(|_| pid.to_string())
}

/// Process ids (other than ours) whose command line mentions `needle`, from /proc.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            // Zombies have an empty cmdline; they are gone for our purposes once reaped, and a
            // zombie holds no ports or files.
            fs::read(format!("/proc/{pid}/cmdline")).map(|c| String::from_utf8_lossy(&c).contains(needle)).unwrap_or(false)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiling_is_off_unless_asked_for() {
        for (value, want) in
            [(None, "false"), (Some("1"), "true"), (Some("true"), "true"), (Some("0"), "false"), (Some(""), "false"), (Some("yes please"), "false")]
        {
            assert_eq!(profiling_flag(value), format!("--profiling={want}"), "{value:?}");
        }
    }

    #[test]
    fn only_a_server_never_reached_counts_as_unreachable() {
        for (stderr, want) in [
            ("Unable to connect to the server: net/http: TLS handshake timeout", true),
            ("Unable to connect to the server: dial tcp 127.0.0.1:6443: i/o timeout", true),
            ("The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?", true),
            ("Error from server (NotFound): tfjobs.kubeflow.org \"x\" not found", false),
            ("Error from server (Timeout): the server was unable to return a response in the time allotted", false),
            ("error: the server doesn't have a resource type \"tfjob\"", false),
        ] {
            assert_eq!(unreachable_server(stderr), want, "{stderr}");
        }
    }

    #[test]
    fn a_busy_process_shows_cpu_seconds_and_a_gone_one_none() {
        let me = std::process::id();
        let before = cpu_secs(me).expect("our own stat");
        let (t, mut x) = (Instant::now(), 0u64);
        // Spins until the counter has moved by 0.2 s; a counter that does not move fails.
        while cpu_secs(me).unwrap() - before < 0.2 {
            assert!(t.elapsed() < Duration::from_secs(20), "20 s of spinning counted as {} CPU seconds", cpu_secs(me).unwrap() - before);
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(cpu_secs(u32::MAX).is_none());
        assert!(!process_name(me).is_empty());
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn pinned_versions_are_read_from_go_mod() {
        let v = Versions::pinned().unwrap();
        assert!(v.kubernetes.starts_with("v1."), "{v:?}");
        assert!(v.helm.starts_with("v4."), "{v:?}");
        assert!(v.etcd.starts_with("v3."), "{v:?}");
    }

    #[test]
    fn a_bin_dir_without_the_binaries_is_a_loud_error() {
        let empty = tempfile::tempdir().unwrap();
        let err = format!("{:#}", check_bin_dir(empty.path().to_path_buf()).unwrap_err());
        assert!(err.contains("TEST CONTROL PLANE UNAVAILABLE"), "{err}");
        assert!(err.contains("has no `etcd`"), "{err}");
        assert!(err.contains("FAIL instead of being skipped"), "{err}");
    }

    #[test]
    fn certificates_are_generated() {
        let pki = Pki::new().unwrap();
        let (cert, key) = pki.issue("x", Some("system:masters"), &["127.0.0.1"], rcgen::ExtendedKeyUsagePurpose::ClientAuth).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.contains("PRIVATE KEY"));
    }
}

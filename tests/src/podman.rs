//! Containers for tests (and for the container backend) with Debian's podman, without a Docker
//! daemon and without pulling any image.
//!
//! The setup lives in one place, `tests/images/podman-env.sh`: it installs podman, runc, netavark,
//! aardvark-dns and iptables with apt-get when one is missing, and writes a `containers.conf`
//! (runc, cgroupfs, no default ulimits, file events, k8s-file logs, netavark) and a
//! `storage.conf` (overlay image store under `TFJOB_PODMAN_DIR`, default `/var/tmp/tfjob-podman`).
//! [`Podman::setup`] runs it once per process and hands out `podman` commands with that
//! environment; [`PodmanService`] serves podman's Docker-compatible API on a unix socket for
//! clients such as `bollard`; [`build_images`] builds `localhost/tfjob-runtime:latest` and
//! `localhost/tfjob-operator:latest` from release binaries with `tests/images/build-offline.sh`.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use tfjob_tests::podman::{Podman, PodmanService, Resources, build_images, release_bin_dir};
//! let podman = Podman::setup()?;
//! let images = build_images(&release_bin_dir()?)?;      // skipped when nothing changed
//! let mut made = Resources::new(podman);                 // removes what it names on drop
//! let net = made.network("my-test")?;                    // unique name, DNS enabled
//! let service = PodmanService::start()?;                 // `podman system service` on a socket
//! let _docker_host = service.docker_host();              // "unix:///.../podman.sock"
//! # let _ = (images, net); Ok(()) }
//! ```
//!
//! Nothing here skips: if podman cannot work, the functions return an error that says why.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::controlplane::spawn_supervised;

/// The image with `tfjob-runtime` (entrypoint `tfjob-runtime`, user 65532, port 2222).
pub const RUNTIME_IMAGE: &str = "localhost/tfjob-runtime:latest";
/// The image with `tfjob-operator` (its entrypoint, user 65532).
pub const OPERATOR_IMAGE: &str = "localhost/tfjob-operator:latest";
/// Label every container, network and pod made through [`Resources`] carries (value: the test's
/// process id), so leftovers of a killed test can be found with `--filter label=...`.
pub const LABEL: &str = "io.tfjob.test";

/// Directory of the image scripts (`podman-env.sh`, `build-offline.sh`).
pub fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("images")
}

/// The podman environment of tfjob-rs (see the module documentation).
#[derive(Debug, Clone)]
pub struct Podman {
    env: Vec<(String, String)>,
    dir: PathBuf,
}

impl Podman {
    /// Installs and configures podman (once per process; `podman-env.sh env`) and checks that it
    /// answers.
    pub fn setup() -> Result<&'static Podman> {
        static PODMAN: OnceLock<std::result::Result<Podman, String>> = OnceLock::new();
        PODMAN.get_or_init(|| Podman::load().map_err(|e| format!("{e:#}"))).as_ref().map_err(|e| anyhow!("{e}"))
    }

    fn load() -> Result<Podman> {
        let script = images_dir().join("podman-env.sh");
        let out = Command::new("bash").arg(&script).arg("env").stdin(Stdio::null()).output().with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!("podman cannot be set up here ({} env: {}):\n{}", script.display(), out.status, String::from_utf8_lossy(&out.stderr));
        }
        let env: Vec<(String, String)> =
            String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
        let dir = env
            .iter()
            .find(|(k, _)| k == "TFJOB_PODMAN_DIR")
            .map(|(_, v)| PathBuf::from(v))
            .ok_or_else(|| anyhow!("{} env printed no TFJOB_PODMAN_DIR", script.display()))?;
        for key in ["CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"] {
            if !env.iter().any(|(k, _)| k == key) {
                bail!("{} env printed no {key}", script.display());
            }
        }
        Ok(Podman { env, dir })
    }

    /// `CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF` and `TFJOB_PODMAN_DIR`, for any process that
    /// runs podman (or a program such as the container backend that starts it).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The state directory: configuration, image store (`storage/`), run state (`run/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `podman` command with this environment.
    pub fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.envs(self.env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
        c
    }

    /// Runs `podman <args>` and returns its output, whatever the exit status.
    pub fn run<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self.command().args(&args).output().with_context(|| format!("running podman {}", show(&args)))
    }

    /// Runs `podman <args>`, fails unless it exits 0, and returns its stdout.
    pub fn run_ok<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.run(&args)?;
        if !out.status.success() {
            bail!("podman {} failed ({}):\n{}{}", show(&args), out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Size in bytes of a local image.
    pub fn image_size(&self, image: &str) -> Result<u64> {
        let s = self.run_ok(["image", "inspect", "--format", "{{.Size}}", image])?;
        s.trim().parse().with_context(|| format!("size of {image}: {s:?}"))
    }

    /// Waits until container `name` has exited and returns its exit code; `Err` after `timeout`.
    pub fn wait_exit(&self, name: &str, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = self.run_ok(["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name])?;
            let mut words = state.split_whitespace();
            if let (Some("exited" | "stopped"), Some(code)) = (words.next(), words.next()) {
                return code.parse().with_context(|| format!("exit code of {name}: {state:?}"));
            }
            if Instant::now() > deadline {
                bail!("container {name} still {} after {timeout:?}", state.trim());
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// stdout and stderr of a container, separately.
    pub fn logs(&self, name: &str) -> Result<(String, String)> {
        let out = self.run(["logs", name])?;
        if !out.status.success() {
            bail!("podman logs {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok((String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}

fn show(args: &[std::ffi::OsString]) -> String {
    args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// A name no other test (of this or another process) uses: `<prefix>-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Containers and networks a test made; all are removed (containers first) when this is dropped,
/// also when the test fails or panics.
pub struct Resources {
    podman: &'static Podman,
    containers: Vec<String>,
    networks: Vec<String>,
}

impl Resources {
    pub fn new(podman: &'static Podman) -> Resources {
        Resources { podman, containers: Vec::new(), networks: Vec::new() }
    }

    /// Creates a bridge network with DNS (aardvark-dns) under a unique name and returns the name.
    pub fn network(&mut self, prefix: &str) -> Result<String> {
        let name = unique_name(prefix);
        self.networks.push(name.clone());
        self.podman.run_ok(["network", "create", "--label", &format!("{LABEL}={}", std::process::id()), &name])?;
        Ok(name)
    }

    /// Runs `podman run --detach --name <unique> --label ... <args>` and returns the container's
    /// name. `args` are everything after the name: options, the image, the command.
    pub fn run_detached<I, S>(&mut self, prefix: &str, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let name = unique_name(prefix);
        self.containers.push(name.clone());
        let mut all: Vec<std::ffi::OsString> = ["run", "--detach", "--pull=never", "--name", &name, "--label"].iter().map(Into::into).collect();
        all.push(format!("{LABEL}={}", std::process::id()).into());
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.podman.run_ok(&all)?;
        Ok(name)
    }

    /// Remembers a container made otherwise (for instance through the API) for removal.
    pub fn adopt_container(&mut self, name: &str) {
        self.containers.push(name.to_string());
    }

    /// Removes everything now; errors are returned (on drop they are only printed).
    pub fn remove_all(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        for c in self.containers.drain(..).rev() {
            match self.podman.run(["rm", "--force", "--ignore", "--time", "0", &c]) {
                Ok(o) if o.status.success() => {}
                Ok(o) => errors.push(format!("podman rm {c}: {}", String::from_utf8_lossy(&o.stderr).trim())),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        for n in self.networks.drain(..).rev() {
            match self.podman.run(["network", "rm", "--force", &n]) {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    let err = String::from_utf8_lossy(&o.stderr);
                    if !err.contains("unable to find network") && !err.contains("network not found") {
                        errors.push(format!("podman network rm {n}: {}", err.trim()));
                    }
                }
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if errors.is_empty() { Ok(()) } else { bail!("{}", errors.join("\n")) }
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        if let Err(e) = self.remove_all() {
            eprintln!("cleaning up podman resources: {e:#}");
        }
    }
}

/// The directory with the `tfjob-runtime` and `tfjob-operator` release binaries (the images'):
/// `$TFJOB_BIN_DIR` if set, else the `release` directory of the target directory this test
/// binary was built in. When the binaries are missing there, they are built with `cargo build
/// --release` into `<target>/images-cargo` (a separate target directory: the running `cargo
/// test` holds the lock of its own).
pub fn release_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("TFJOB_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating the test binary")?;
    // <target>/<profile>/deps/<test binary>
    let target = exe.parent().and_then(Path::parent).and_then(Path::parent).ok_or_else(|| anyhow!("{} is not in <target>/<profile>/deps", exe.display()))?;
    let release = target.join("release");
    if has_binaries(&release) {
        return Ok(release);
    }
    let own = target.join("images-cargo");
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--locked", "-p", "tfjob-runtime", "-p", "tfjob-operator"])
        .env("CARGO_TARGET_DIR", &own)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .context("running cargo build --release")?;
    if !out.status.success() {
        bail!("{} has no tfjob-runtime and tfjob-operator, and building them failed:\n{}", release.display(), String::from_utf8_lossy(&out.stderr));
    }
    let built = own.join("release");
    if !has_binaries(&built) {
        bail!("cargo build --release made no tfjob-runtime and tfjob-operator in {}", built.display());
    }
    Ok(built)
}

fn has_binaries(dir: &Path) -> bool {
    dir.join("tfjob-runtime").is_file() && dir.join("tfjob-operator").is_file()
}

/// The images [`build_images`] made, with their sizes in bytes.
#[derive(Debug, Clone)]
pub struct Images {
    pub runtime: String,
    pub runtime_size: u64,
    pub operator: String,
    pub operator_size: u64,
    /// What the script printed on stderr (built or up to date, timings).
    pub log: String,
}

/// Builds (or finds up to date) [`RUNTIME_IMAGE`] and [`OPERATOR_IMAGE`] from the binaries in
/// `bin_dir` with `tests/images/build-offline.sh`.
pub fn build_images(bin_dir: &Path) -> Result<Images> {
    let podman = Podman::setup()?;
    let script = images_dir().join("build-offline.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--bin-dir")
        .arg(bin_dir)
        .envs(podman.env().iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!("{} --bin-dir {} failed ({}):\n{log}", script.display(), bin_dir.display(), out.status);
    }
    Ok(Images {
        runtime: RUNTIME_IMAGE.into(),
        runtime_size: podman.image_size(RUNTIME_IMAGE)?,
        operator: OPERATOR_IMAGE.into(),
        operator_size: podman.image_size(OPERATOR_IMAGE)?,
        log,
    })
}

/// The niceness of the containers the API service runs.
const CONTAINER_NICENESS: libc::c_int = 10;

/// `podman system service --time=0 unix://<socket>`: podman's Docker-compatible (and libpod) API,
/// with the environment of [`Podman::setup`]. Stopped (SIGTERM, then SIGKILL) on drop; killed by
/// the kernel if the test process dies first. Containers it started are not its children and
/// outlive it: remove them through the API or with [`Resources`].
pub struct PodmanService {
    child: Option<Child>,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl PodmanService {
    /// Starts the service on a socket in a fresh temporary directory and waits until it answers
    /// `GET /_ping`.
    pub fn start() -> Result<PodmanService> {
        let podman = Podman::setup()?;
        let dir = tempfile::Builder::new().prefix("tfjob-podman-api.").tempdir().context("socket directory")?;
        let socket = dir.path().join("podman.sock");
        let log = fs::File::create(dir.path().join("service.log")).context("service log")?;
        let mut cmd = podman.command();
        cmd.args(["system", "service", "--time=0"]).arg(format!("unix://{}", socket.display())).stdout(log.try_clone()?).stderr(log);
        // The containers (conmon and the pod's processes inherit the service's niceness) run
        // below the control plane and the tests, as a node's pods run beside its kubelet. The
        // niceness ranks tasks only within one cgroup: with the cgroupfs manager each container
        // has its own under `libpod_parent`, whose weight (podman's default) is what the
        // containers get against the rest of the machine; lowering it was measured and dropped
        // (README, "Tests, and what runs where": the API-server stalls, and the operator restart that
        // rides them out).
        // SAFETY: setpriority(2) on the child itself, between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, CONTAINER_NICENESS);
                Ok(())
            });
        }
        let child = spawn_supervised(cmd).context("starting podman system service")?;
        let mut service = PodmanService { child: Some(child), dir, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = http_get(&service.socket, "/_ping")
                && body.trim() == "OK"
            {
                return Ok(service);
            }
            if let Some(child) = service.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("podman system service exited ({status}):\n{}", service.log());
            }
            if Instant::now() > deadline {
                bail!("podman system service does not answer on {} after 30s:\n{}", service.socket.display(), service.log());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Path of the unix socket.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// `unix://<socket>`, the form of `DOCKER_HOST` / `CONTAINER_HOST`.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Process id of the service.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What the service wrote (its log file).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("service.log")).unwrap_or_default()
    }

    /// Stops the service and waits for it: SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            // SAFETY: plain syscall on our own child (it leads its own process group).
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = child.try_wait() {
                // SAFETY: as above; the whole group, in case it forked helpers.
                unsafe {
                    libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
                }
            }
        }
        let _ = child.wait();
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A plain HTTP/1.1 GET over a unix socket: (status, body). Enough to probe the API without a
/// client library.
pub fn http_get(socket: &Path, path: &str) -> io::Result<(u16, String)> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| io::Error::other("no HTTP header end"))?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let body = &raw[end + 4..];
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| io::Error::other(format!("bad status line: {head:?}")))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n").ok_or_else(|| io::Error::other("truncated chunk size"))?;
        let size = std::str::from_utf8(&body[..eol]).unwrap_or("");
        let size = size.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| io::Error::other(format!("bad chunk size {size:?}")))?;
        body = &body[eol + 2..];
        if n == 0 {
            return Ok(out);
        }
        if body.len() < n {
            return Err(io::Error::other("truncated chunk"));
        }
        out.extend_from_slice(&body[..n]);
        body = body[n..].strip_prefix(b"\r\n").unwrap_or(&body[n..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunk_joins_chunks_and_rejects_truncation() {
        let body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\n\r\n";
        assert_eq!(dechunk(body).unwrap(), b"Wikipedia");
        assert!(dechunk(b"4\r\nWi").is_err());
        assert!(dechunk(b"zz\r\nWiki\r\n").is_err());
        assert!(dechunk(b"4\r\nWiki\r\n").is_err(), "no final chunk");
    }

    #[test]
    fn unique_names_differ() {
        let a = unique_name("x");
        let b = unique_name("x");
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("x-{}-", std::process::id())));
    }
}

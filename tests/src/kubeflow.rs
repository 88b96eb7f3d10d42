//! Kubeflow's training-operator (v1.9.3, the TFJob controller this project takes over from),
//! built from its published Go module by `tests/kubeflow/build.sh` (cached machine-wide) and run
//! as a process against the test control plane, its TFJob controller only, in one namespace.
//!
//! Out of a cluster it needs what its deployment would give it: its webhook certificate Secret
//! (an empty one: its rotator fills it in) and a serving pair at the path its rotator hard-codes
//! (`/tmp/k8s-webhook-server/serving-certs`, any pair: no webhook configuration points at it,
//! so the API server never calls it).

use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::controlplane::{ControlPlane, free_port, http_get_plain, spawn_supervised, tail};
use crate::operator::repo_root;

/// The version `tests/kubeflow/build.sh` builds.
pub const VERSION: &str = "v1.9.3";
/// Where its certificate rotator looks for the serving pair (`pkg/cert/cert.go`).
const CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

/// Builds training-operator, or finds it in the cache: the directory with `bin/`, `crds/`,
/// `certs/`.
pub fn ensure_built() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = repo_root().join("tests/kubeflow/build.sh");
        let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout.lines().last().map(PathBuf::from).ok_or_else(|| "no directory printed".to_string())
    })
    .clone()
    .map_err(|e| anyhow!("building Kubeflow's training-operator {VERSION}: {e}"))
}

/// Applies Kubeflow's own TFJob CRD (as a cluster running Kubeflow has it).
pub fn install_crd(cp: &ControlPlane) -> Result<()> {
    let crd = ensure_built()?.join("crds/kubeflow.org_tfjobs.yaml");
    cp.kubectl_ok(["apply", "--server-side", "--force-conflicts", "-f", &crd.display().to_string()])?;
    cp.wait_established(&["tfjobs.kubeflow.org"])?;
    Ok(())
}

/// A running training-operator; killed when dropped.
pub struct KubeflowOperator {
    child: Child,
    log: PathBuf,
}

impl KubeflowOperator {
    /// Starts it on `cp` for the TFJobs of `namespace`, with the admin kubeconfig; returns once
    /// it answers `/readyz`.
    pub fn start(cp: &ControlPlane, namespace: &str) -> Result<KubeflowOperator> {
        let dir = ensure_built()?;
        fs::create_dir_all(CERT_DIR)?;
        for f in ["tls.crt", "tls.key"] {
            fs::copy(dir.join("certs").join(f), PathBuf::from(CERT_DIR).join(f)).with_context(|| format!("copying {f} to {CERT_DIR}"))?;
        }
        let _ = cp.kubectl(["-n", namespace, "create", "secret", "generic", "training-operator-webhook-cert"]);
        let (health, webhook) = (free_port()?, free_port()?);
        let log = cp.dir().join(format!("kubeflow-{namespace}.log"));
        let out = File::create(&log)?;
        let mut cmd = Command::new(dir.join("bin/training-operator"));
        cmd.arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
            .args(["--enable-scheme=tfjob", "--metrics-bind-address=0"])
            .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
            .arg(format!("--webhook-server-port={webhook}"))
            .arg(format!("--namespace={namespace}"))
            .env("MY_POD_NAMESPACE", namespace)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_supervised(cmd).context("starting training-operator")?;
        let mut op = KubeflowOperator { child, log };
        op.wait_ready(health, Duration::from_secs(60))?;
        Ok(op)
    }

    fn wait_ready(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("training-operator exited ({status}):\n{}", self.log_tail(40));
            }
            if http_get_plain(port, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("training-operator not ready within {timeout:?}:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops it as its Deployment would be stopped (SIGTERM), and waits for it to exit. (v1.9.3
    /// panics on its way out, `close of closed channel`, exit status 2: a clean stop all the same,
    /// its controllers and caches are down by then.)
    pub fn stop(&mut self) -> Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                let clean = status.success() || (status.code() == Some(2) && self.log_tail(20).contains("close of closed channel"));
                return if clean { Ok(()) } else { Err(anyhow!("training-operator exited with {status}:\n{}", self.log_tail(40))) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("training-operator did not stop within 20 s of SIGTERM")
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for KubeflowOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Kueue, the batch queue most clusters put in front of their jobs, run against the test
//! control plane: built from its published Go module by `tests/kueue/build.sh` (cached
//! machine-wide like the control plane), its CRDs applied, and its manager started as a process
//! with the control plane's admin kubeconfig, its `kubeflow.org/tfjob` integration on.
//!
//! Out of a cluster no webhook configuration points at it, so nothing defaults a TFJob for it:
//! the tests create queued jobs suspended, with the queue label, as Kueue's webhook would have
//! them.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::controlplane::{ControlPlane, free_port, http_get_plain, spawn_supervised, tail};
use crate::operator::repo_root;

/// The version `tests/kueue/build.sh` builds.
pub const VERSION: &str = "v0.19.2";

/// Builds Kueue, or finds it in the cache: the directory with `bin/kueue`, `crds/`, `certs/`.
pub fn ensure_built() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = repo_root().join("tests/kueue/build.sh");
        let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = stdout.lines().last().map(PathBuf::from).ok_or_else(|| "no directory printed".to_string())?;
        Ok(dir)
    })
    .clone()
    .map_err(|e| anyhow!("building Kueue {VERSION}: {e}"))
}

/// A running Kueue manager; killed when dropped.
pub struct Kueue {
    child: Child,
    log: PathBuf,
}

impl Kueue {
    /// Applies Kueue's CRDs and starts its manager against `cp`, with the TFJob integration (and
    /// no other); returns once it answers `/readyz`.
    pub fn start(cp: &ControlPlane) -> Result<Kueue> {
        let dir = ensure_built()?;
        for crd in crate::operator::files_under(&dir.join("crds")) {
            cp.kubectl_ok(["apply", "--server-side", "--force-conflicts", "-f", &crd.display().to_string()])
                .with_context(|| format!("applying {}", crd.display()))?;
        }
        cp.kubectl_ok(["wait", "--for=condition=Established", "--timeout=60s", "crd/workloads.kueue.x-k8s.io", "crd/clusterqueues.kueue.x-k8s.io"])?;
        let _ = cp.kubectl(["create", "namespace", "kueue-system"]);
        let work = cp.dir().join("kueue");
        fs::create_dir_all(&work)?;
        let (health, webhook) = (free_port()?, free_port()?);
        let config = work.join("config.yaml");
        fs::write(&config, configuration(&dir.join("certs"), health, webhook))?;
        let log = work.join("kueue.log");
        let out = File::create(&log)?;
        let mut cmd = Command::new(dir.join("bin/kueue"));
        cmd.arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
            .arg("--zap-log-level=2")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_supervised(cmd).context("starting kueue")?;
        let mut kueue = Kueue { child, log };
        kueue.wait_ready(health, Duration::from_secs(90))?;
        Ok(kueue)
    }

    fn wait_ready(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("kueue exited ({status}):\n{}", self.log_tail(40));
            }
            if http_get_plain(port, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200")) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("kueue not ready after {timeout:?}:\n{}", self.log_tail(40));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last `lines` of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kueue's Configuration out of a cluster: no certificate management (its serving pair is
/// `certs`), no metrics server, no leader election, the TFJob integration only, and the
/// visibility API (which would need certificates at a fixed path) off.
fn configuration(certs: &Path, health: u16, webhook: u16) -> String {
    format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: {webhook}
  certDir: {}
metrics:
  bindAddress: \"0\"
health:
  healthProbeBindAddress: 127.0.0.1:{health}
leaderElection:
  leaderElect: false
integrations:
  frameworks: [\"kubeflow.org/tfjob\"]
featureGates:
  VisibilityOnDemand: false
",
        certs.display()
    )
}

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

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;

use crate::controlplane::{ControlPlane, free_port, http_get_plain, spawn_supervised, tail};
use crate::node_agent::NodeAgent;
use crate::operator::{Cluster, Operator, condition_true, machine_pressure, repo_root, runtime_replica_yaml};
use crate::report::final_report;

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
        Kueue::start_with(cp, Integration::TFJob)
    }

    /// [`Kueue::start`] with the one integration `integration`.
    pub fn start_with(cp: &ControlPlane, integration: Integration) -> Result<Kueue> {
        let dir = ensure_built()?;
        for crd in crate::operator::files_under(&dir.join("crds")) {
            cp.kubectl_ok(["apply", "--server-side", "--force-conflicts", "-f", &crd.display().to_string()])
                .with_context(|| format!("applying {}", crd.display()))?;
        }
        cp.wait_established(&["workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io"])?;
        let _ = cp.kubectl(["create", "namespace", "kueue-system"]);
        let work = cp.dir().join("kueue");
        fs::create_dir_all(&work)?;
        let (health, webhook) = (free_port()?, free_port()?);
        let config = work.join("config.yaml");
        fs::write(&config, configuration(&dir.join("certs"), health, webhook, integration))?;
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

/// The one job integration a Kueue of the tests runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integration {
    /// `kubeflow.org/tfjob`: Kueue suspends, admits and resumes the TFJob itself.
    TFJob,
    /// `pod`: Kueue admits plain pods and pod groups (the operator's `--kueue-pod-groups`).
    Pod,
}

impl Integration {
    fn framework(self) -> &'static str {
        match self {
            Integration::TFJob => "kubeflow.org/tfjob",
            Integration::Pod => "pod",
        }
    }
}

/// Kueue's Configuration out of a cluster: no certificate management (its serving pair is
/// `certs`), no metrics server, no leader election, one integration, and the visibility API
/// (which would need certificates at a fixed path) off.
fn configuration(certs: &Path, health: u16, webhook: u16, integration: Integration) -> String {
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
  frameworks: [\"{}\"]
featureGates:
  VisibilityOnDemand: false
",
        certs.display(),
        integration.framework()
    )
}

/// The running job preempted and scaled: long enough to still train after a preemption and a
/// higher-priority job's whole run.
pub const LONG_EPOCHS: u64 = 12_000;
/// The other jobs.
pub const SHORT_EPOCHS: u64 = 600;
/// Examples per epoch of the linear model's data.
pub const EXAMPLES: u64 = 101;
/// Where the pods' checkpoints go (a hostPath volume).
pub const CKPT: &str = "/ckpt";

/// A TFJob queued in `team`: PS 1 + `workers` workers, 500m of cpu each, async linear
/// regression for `epochs` epochs, a checkpoint every second on the node's disk `host_dir`.
/// `suspended`: created suspended, as Kueue's webhook would have it under the TFJob integration
/// (a pod group's job is not: its pods wait in their gate).
pub fn queued_job(name: &str, priority: &str, workers: u32, epochs: u64, host_dir: &str, suspended: bool) -> String {
    let args = format!(
        r#"["--model=linear", "--learning_rate=0.01", "--num_epochs={epochs}", "--log_every_steps=20000", "--checkpoint_dir={CKPT}/{name}", "--save_checkpoint_secs=1"]"#
    );
    let container = format!("              resources: {{requests: {{cpu: 500m}}}}\n              volumeMounts: [{{name: ckpt, mountPath: {CKPT}}}]\n");
    let pod = format!("          volumes: [{{name: ckpt, hostPath: {{path: {host_dir}, type: Directory}}}}]\n");
    let replicas = |rtype: &str, n: u32| runtime_replica_yaml(rtype, n, &args, &container, &pod);
    format!(
        "apiVersion: kubeflow.org/v1
kind: TFJob
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: team, kueue.x-k8s.io/priority-class: tfjob-test-{priority}}}
spec:
  runPolicy: {{suspend: {suspended}}}
  tfReplicaSpecs:
{}{}",
        replicas("PS", 1),
        replicas("Worker", workers)
    )
}

/// The flavour (its node label and toleration go onto admitted pods), a ClusterQueue of 2 cpus
/// for this test's namespace only, preempting lower priorities, its LocalQueue `team`, and two
/// priorities.
pub fn queues(ns: &str) -> String {
    format!(
        "apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: tfjob-test-pool}}
spec:
  nodeLabels: {{tfjob-test/pool: a}}
  tolerations: [{{key: tfjob-test/dedicated, operator: Equal, value: training, effect: NoSchedule}}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: tfjob-test-{ns}}}
spec:
  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}
  preemption: {{withinClusterQueue: LowerPriority}}
  resourceGroups:
    - coveredResources: [cpu]
      flavors: [{{name: tfjob-test-pool, resources: [{{name: cpu, nominalQuota: \"2\"}}]}}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{name: team, namespace: {ns}}}
spec: {{clusterQueue: tfjob-test-{ns}}}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {{name: tfjob-test-low}}
value: 10
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {{name: tfjob-test-high}}
value: 1000
"
    )
}

/// A queue test's world: the namespace's jobs, the control plane, the node agent, the operator.
pub struct Scene<'a> {
    /// The test namespace's objects.
    pub k: Cluster<'a>,
    /// The control plane.
    pub cp: &'a ControlPlane,
    /// The test namespace.
    pub ns: String,
    /// The node.
    pub agent: NodeAgent,
    /// The operator: a wait fails at once when it has exited (nothing would go on).
    pub operator: &'a Operator,
}

impl Scene<'_> {
    /// The job's status.
    pub fn status(&self, job: &str) -> Result<Value> {
        Ok(self.k.must_get("tfjob", job)?["status"].clone())
    }

    /// Whether the job is suspended.
    pub fn suspended(&self, job: &str) -> Result<bool> {
        Ok(self.k.must_get("tfjob", job)?["spec"]["runPolicy"]["suspend"].as_bool().unwrap_or(false))
    }

    /// The job's pods.
    pub fn pods(&self, job: &str) -> Result<Vec<String>> {
        self.k.job_pods(job)
    }

    /// Polls every 200 ms until `done` says so, failing after `timeout` with what it last said.
    /// A poll (a few kubectl calls) that takes over 5 s is reported: the API server or the
    /// machine stalled, which a failure after it may owe to.
    pub fn until(&self, what: &str, timeout: Duration, mut done: impl FnMut(&Self) -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let poll = Instant::now();
            let answer = done(self)?;
            if poll.elapsed() > Duration::from_secs(5) {
                eprintln!("  (waiting until {what}: one poll took {:.1}s; {})", poll.elapsed().as_secs_f64(), machine_pressure());
            }
            if answer {
                return Ok(());
            }
            if self.operator.exited() {
                bail!("{what}: the operator has exited (its log follows)");
            }
            if Instant::now() > deadline {
                bail!("{what}: not within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the job succeeded (an error when it failed).
    pub fn succeeded(&self, job: &str) -> Result<bool> {
        let st = self.status(job)?;
        ensure!(!condition_true(&st, "Failed"), "{job} failed: {st:#}");
        Ok(condition_true(&st, "Succeeded"))
    }

    /// Whether the job is Running.
    pub fn running(&self, job: &str) -> Result<bool> {
        Ok(condition_true(&self.status(job)?, "Running"))
    }

    /// The job trained every example once per epoch (worker 0's final report).
    pub fn trained_exactly(&self, job: &str, epochs: u64) -> Result<()> {
        let pod = format!("{job}-worker-0");
        let r = final_report(&self.agent.pod_log(&self.ns, &pod), &pod)?;
        ensure!(r["epochs_completed"].as_u64() == Some(epochs) && r["examples_trained"].as_u64() == Some(epochs * EXAMPLES), "{job}: {r}");
        Ok(())
    }
}

/// The node's disk for checkpoints, a directory for hostPath volumes (the runtime's image runs
/// as a user of its own).
pub fn node_disk(cp: &ControlPlane, ns: &str) -> Result<String> {
    let host_dir = cp.dir().join(format!("{ns}-node-disk"));
    fs::create_dir_all(&host_dir)?;
    fs::set_permissions(&host_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    Ok(host_dir.display().to_string())
}

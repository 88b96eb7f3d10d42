//! A training job on the test control plane, followed from `kubectl apply` to its end: the
//! [`Scene`] (control plane, namespace, node agent running the pods) the end-to-end and chaos
//! tests share, the [`Timeline`] of each job they print, and the chart's operator installed into
//! the namespace ([`install_operator`]).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::controlplane::ControlPlane;
use crate::node_agent::NodeAgent;
use crate::operator::{eventually, repo_root};
use crate::podman::OPERATOR_IMAGE;
use crate::report::{ensure_linear, final_report};

/// The chart's release name in the tests.
pub const RELEASE: &str = "tfjob-operator";

/// Milestones of one job, printed at the end.
pub struct Timeline {
    job: String,
    start: Instant,
    marks: Vec<(String, Duration)>,
}

impl Timeline {
    pub fn new(job: &str) -> Timeline {
        Timeline { job: job.into(), start: Instant::now(), marks: Vec::new() }
    }
    pub fn mark(&mut self, what: &str) {
        self.marks.push((what.into(), self.start.elapsed()));
    }
    pub fn mark_at(&mut self, what: &str, at: Instant) {
        self.marks.push((what.into(), at.saturating_duration_since(self.start)));
    }
    pub fn print(&mut self) {
        self.marks.sort_by_key(|(_, d)| *d);
        let marks: Vec<String> = self.marks.iter().map(|(w, d)| format!("{w} {:.1}s", d.as_secs_f64())).collect();
        eprintln!("timeline {}: {}", self.job, marks.join(" | "));
    }
}

pub struct Scene<'a> {
    pub cp: &'a ControlPlane,
    pub ns: String,
    pub agent: NodeAgent,
}

impl Scene<'_> {
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-n", &self.ns]);
        self.cp.kubectl_ok(all)
    }

    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)?).context("kubectl JSON")
    }

    /// Pods of a job: (name, phase, restart count of the `tensorflow` container).
    pub fn job_pods(&self, job: &str) -> Result<Vec<(String, String, i64)>> {
        let list = self.json(&["get", "pods", "-l", &format!("training.kubeflow.org/job-name={job}")])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let restarts = p["status"]["containerStatuses"].as_array().and_then(|cs| cs.first()).and_then(|c| c["restartCount"].as_i64()).unwrap_or(0);
                (p["metadata"]["name"].as_str().unwrap_or("").to_string(), p["status"]["phase"].as_str().unwrap_or("").to_string(), restarts)
            })
            .collect())
    }

    /// The condition of type `kind` with status True, if the job has it: (reason, message).
    pub fn condition(&self, job: &str, kind: &str) -> Result<Option<(String, String)>> {
        let j = self.json(&["get", "tfjob", job])?;
        Ok(j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind && c["status"] == "True")
            .map(|c| (c["reason"].as_str().unwrap_or("").to_string(), c["message"].as_str().unwrap_or("").to_string())))
    }

    /// Applies a manifest and follows the job to an end (`Succeeded` or `Failed`), marking the
    /// timeline; `during` runs on every look while the job runs (it returns true once done).
    pub fn run_job(&self, job: &str, manifest: &str, mut during: impl FnMut(&Scene, &[(String, String, i64)]) -> Result<bool>) -> Result<(Timeline, String)> {
        let mut tl = Timeline::new(job);
        self.cp.kubectl_stdin(["apply", "-n", &self.ns, "-f", "-"], manifest)?;
        tl.mark("applied");
        let (mut created, mut running, mut done) = (false, false, false);
        let deadline = Instant::now() + Duration::from_secs(240);
        let end = loop {
            let pods = self.job_pods(job)?;
            if !created && !pods.is_empty() {
                tl.mark("pods created");
                created = true;
            }
            if !running && !pods.is_empty() && pods.iter().all(|(_, phase, _)| phase == "Running") {
                tl.mark("all running");
                running = true;
            }
            if !done {
                done = during(self, &pods)?;
            }
            if self.condition(job, "Succeeded")?.is_some() {
                tl.mark("succeeded");
                break "Succeeded".to_string();
            }
            if self.condition(job, "Failed")?.is_some() {
                tl.mark("failed");
                break "Failed".to_string();
            }
            if Instant::now() > deadline {
                bail!("{job} did not finish in 240s; pods {pods:?}; status {}", self.json(&["get", "tfjob", job])?["status"]);
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        if let Some(at) = self.agent.first_step(&self.ns, &format!("{job}-")) {
            tl.mark_at("first step", at);
        }
        Ok((tl, end))
    }

    /// Deletes the job and waits until nothing of it is left.
    pub fn delete_job(&self, job: &str, tl: &mut Timeline) -> Result<()> {
        self.kubectl(&["delete", "tfjob", job, "--wait=false"])?;
        let selector = format!("training.kubeflow.org/job-name={job}");
        eventually(&format!("pods, Services and Secrets of {job} are gone"), Duration::from_secs(90), || {
            let left = self.kubectl(&["get", "pods,services,secrets", "-l", &selector, "-o", "name"])?;
            Ok(left.trim().is_empty().then_some(()))
        })?;
        tl.mark("cleaned");
        Ok(())
    }

    /// (name, uid) of the pods of a job.
    pub fn pod_uids(&self, job: &str) -> Result<Vec<(String, String)>> {
        let list = self.json(&["get", "pods", "-l", &format!("training.kubeflow.org/job-name={job}")])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| (p["metadata"]["name"].as_str().unwrap_or("").to_string(), p["metadata"]["uid"].as_str().unwrap_or("").to_string()))
            .collect())
    }

    /// The final JSON report of a pod, from its log.
    pub fn report(&self, pod: &str) -> Result<Value> {
        final_report(&self.agent.pod_log(&self.ns, pod), pod)
    }

    pub fn assert_linear(&self, pod: &str) -> Result<()> {
        ensure_linear(&self.report(pod)?, pod)
    }
}

/// `helm install`s the chart into `scene`'s namespace, watching only it, with the operator image
/// the tests built (`--set` values: `extra`), and waits until the operator's pod runs and holds
/// its Lease. Returns the pod's name.
pub fn install_operator(scene: &Scene, extra: &[&str]) -> Result<String> {
    let (cp, ns) = (scene.cp, &scene.ns);
    let (repo, tag) = OPERATOR_IMAGE.rsplit_once(':').context("image:tag")?;
    let chart = repo_root().join("charts/tfjob-operator").display().to_string();
    let mut set = vec![format!("watchNamespace={ns}"), format!("image.repository={repo}"), format!("image.tag={tag}"), "image.pullPolicy=Never".to_string()];
    set.extend(extra.iter().map(|s| s.to_string()));
    let mut args = vec!["install", RELEASE, &chart, "-n", ns];
    for s in &set {
        args.extend(["--set", s]);
    }
    let out = cp.helm_ok(args)?;
    ensure!(out.contains("STATUS: deployed"), "{out}");
    cp.wait_established(&["tfjobs.kubeflow.org"])?;
    let pod = eventually("the operator's pod runs", Duration::from_secs(90), || operator_pod(scene))?;
    wait_leader(scene, &pod)?;
    Ok(pod)
}

/// The name of the operator's running pod, if it runs.
pub fn operator_pod(scene: &Scene) -> Result<Option<String>> {
    let pods = scene.json(&["get", "pods", "-l", "app.kubernetes.io/name=tfjob-operator"])?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["status"]["phase"] == "Running")
        .and_then(|p| p["metadata"]["name"].as_str().map(String::from)))
}

/// Waits until a process of the operator's pod `pod` holds the Lease (it leads once it talks to
/// the API server from its container). Returns the holder's identity.
pub fn wait_leader(scene: &Scene, pod: &str) -> Result<String> {
    eventually("the operator holds its Lease", Duration::from_secs(90), || {
        let lease = scene.json(&["get", "lease", RELEASE]).ok();
        Ok(lease.and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from)).filter(|h| h.contains(pod)))
    })
    .with_context(|| format!("operator log:\n{}", scene.agent.pod_log(&scene.ns, pod)))
}

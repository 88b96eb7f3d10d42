//! `status.trainingProgress` of a job that trains, on the test control plane: the operator (a
//! `tfjob-operator` process with the chart's RBAC and environment, reading every 2 s) reads ps
//! 0's metrics page at the pod's IP while the node agent runs the pods as podman containers
//! (it writes each pod's `podIP`: the container's address on its network, which the host
//! reaches), and `kubectl get tfjob` shows the progress in its columns.
//!
//! The HorizontalPodAutoscaler of `elasticPolicy.metrics` and the refusal of a policy over
//! sync workers with a fixed aggregation count need no training: `operator_controlplane.rs`.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail, ensure};
use serde_json::Value;
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::node_agent::NodeAgent;
use tfjob_tests::operator::{Cluster, EnvSource, Operator, condition_true, operator_account, runtime_replica_yaml, timestamp};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};

const JOB: &str = "progress";
/// Epochs of 101 examples: long enough for several reads of the page while it trains.
const EPOCHS: i64 = 2500;

/// Async linear regression, PS 1 + Worker 2, bounded by epochs; ps 0 serves its metrics page.
fn manifest() -> String {
    let args = format!(r#"["--model=linear", "--learning_rate=0.01", "--num_epochs={EPOCHS}", "--log_every_steps=20000", "--metrics_port=9090"]"#);
    let replicas = |rtype: &str, n: u32| runtime_replica_yaml(rtype, n, &args, "", "");
    format!("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: {JOB}\nspec:\n  tfReplicaSpecs:\n{}{}", replicas("PS", 1), replicas("Worker", 2))
}

/// Whether the progress has every figure a trained step gives, and says so.
fn filled_in(p: &Value) -> Result<bool> {
    let positive = |f: &str| p[f].as_f64().is_some_and(|v| v > 0.0);
    if !(positive("globalStep") && positive("examplesTrained") && positive("examplesPerSecond")) {
        return Ok(false);
    }
    if p["estimatedRemainingTimeSummary"].as_str().is_none_or(str::is_empty) {
        return Ok(false);
    }
    ensure!(p["numEpochs"].as_i64() == Some(EPOCHS), "numEpochs: {p:#}");
    timestamp(&p["lastUpdatedTime"])?;
    Ok(true)
}

#[test]
fn training_progress_fills_the_status_and_the_columns_while_a_job_trains() -> Result<()> {
    let started = Instant::now();
    build_images(&release_bin_dir()?)?;
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("progress")?;
    let mut agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    let mut account = operator_account(cp, &ns)?;
    account.env.push(("TFJOB_PROGRESS_INTERVAL".into(), EnvSource::Value("2".into())));
    let op = Operator::start_ready(cp, &account, "op-0")?;
    let k = Cluster::new(cp, &ns);
    eprintln!("control plane, images, node agent, operator ready in {:.1}s", started.elapsed().as_secs_f64());
    let r = (|| -> Result<()> {
        k.apply(&manifest())?;
        let applied = Instant::now();
        let (mut progress, mut columns, mut ip) = (None, None, None);
        let deadline = applied + Duration::from_secs(360);
        let status = loop {
            let job = k.must_get("tfjob", JOB)?;
            let st = &job["status"];
            if condition_true(st, "Succeeded") || condition_true(st, "Failed") {
                break st.clone();
            }
            if ip.is_none()
                && let Some(pod) = k.get("pod", &format!("{JOB}-ps-0"))?
                && let Some(addr) = pod["status"]["podIP"].as_str()
            {
                ensure!(pod["status"]["podIPs"] == serde_json::json!([{ "ip": addr }]), "podIPs: {:#}", pod["status"]);
                ip = Some(addr.to_string());
            }
            if progress.is_none() && filled_in(&st["trainingProgress"])? {
                progress = Some((st["trainingProgress"].clone(), applied.elapsed()));
            }
            // The columns once the status has every figure (the job may end in between).
            if progress.is_some() && columns.is_none() {
                let cols = k.columns(JOB)?;
                let shown = ["STEP", "EPOCH", "EX/S", "ETA"].map(|c| cols.iter().find(|(h, _)| h == c).map(|(_, v)| v.clone()).unwrap_or_default());
                if shown.iter().all(|v| !v.is_empty() && v != "<none>") {
                    columns = Some(cols);
                }
            }
            if Instant::now() > deadline {
                bail!("{JOB} did not finish in 360s; status {st:#}");
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let ended = applied.elapsed();
        ensure!(condition_true(&status, "Succeeded"), "{JOB} did not succeed: {status:#}");
        ensure!(ip.is_some(), "ps-0 never had a podIP");
        let (progress, at) = progress.ok_or_else(|| anyhow!("status.trainingProgress never filled in while {JOB} trained; last: {status:#}"))?;
        let columns = columns.ok_or_else(|| anyhow!("kubectl get tfjob never showed STEP, EPOCH, EX/S and ETA while {JOB} trained"))?;
        eprintln!(
            "{JOB}: progress at {:.1}s, succeeded at {:.1}s (ps-0 at {}):\n{progress:#}\n{columns:?}",
            at.as_secs_f64(),
            ended.as_secs_f64(),
            ip.unwrap_or_default()
        );
        // Once it is over, the last progress read stays.
        ensure!(status["trainingProgress"]["globalStep"].as_i64() >= progress["globalStep"].as_i64(), "{status:#}");
        Ok(())
    })();
    let r = r.map_err(|e| anyhow!("{e:#}\n{}\n--- ps-0 ---\n{}", op.log_tail(60), tail_lines(&agent.pod_log(&ns, &format!("{JOB}-ps-0")), 30)));
    agent.stop()?;
    r
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

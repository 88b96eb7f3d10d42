//! Kubeflow's Python SDK (`kubeflow-training` 1.9.4 from PyPI, in a venv `tests/sdk/setup.sh`
//! makes and caches) drives a TFJob through our operator on the test control plane, the node
//! agent running its pods: `create_job`, `wait_for_job_conditions({"Succeeded"})`, `get_job`,
//! the condition checks, `get_job_pod_names` by role, type and index, `get_job_logs` (the master
//! pod's, and one worker's), `delete_job` (`tests/sdk/sdk_calls.py`). Each call must do what it
//! does against Kubeflow's operator, and the logs it returns must be the training's.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::node_agent::NodeAgent;
use tfjob_tests::operator::{Operator, operator_account, repo_root, runtime_replica_yaml};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};
use tfjob_tests::report::final_report;

const JOB: &str = "sdk-linreg";
/// Long enough (~6 s alone) for the operator to see the job running: at 40 epochs it trained in
/// 0.3 s once, went from Created to Succeeded, and never had the Running condition that
/// Kubeflow's operator (and so this test) turns to False on success; at 400 (1.5 s, worker 1
/// started only after worker 0 had finished) it did that once on a loaded machine too. At 2000
/// it did once more (CI, 2026-12-06): the node agent wrote the pods' statuses only after it had
/// started all of them, so worker 0 ran unreported while worker 1's container started; it now
/// reports each pod as soon as its container runs.
const EPOCHS: u64 = 2000;
/// Examples per epoch of the linear model's data.
const EXAMPLES: u64 = 101;

/// The venv with the SDK (built or found by `tests/sdk/setup.sh`).
fn sdk_python() -> Result<std::path::PathBuf> {
    let script = repo_root().join("tests/sdk/setup.sh");
    let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().with_context(|| format!("running {}", script.display()))?;
    ensure!(out.status.success(), "{} failed ({})", script.display(), out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let venv = stdout.lines().last().ok_or_else(|| anyhow!("{} printed no venv", script.display()))?;
    Ok(std::path::Path::new(venv).join("bin/python"))
}

/// The job as a user hands it to the SDK: a dict, with `spec.runPolicy` (the SDK's model needs
/// it); `cleanPodPolicy: None` keeps the pods so that their names and logs can be read after
/// the job succeeded.
fn job_dict(ns: &str) -> Result<Value> {
    let args = format!(r#"["--model=linear", "--learning_rate=0.01", "--num_epochs={EPOCHS}", "--log_every_steps=2000"]"#);
    let yaml = format!(
        "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: {JOB}, namespace: {ns}}}\nspec:\n  runPolicy: {{cleanPodPolicy: None}}\n  tfReplicaSpecs:\n{}{}",
        runtime_replica_yaml("PS", 1, &args, "", ""),
        runtime_replica_yaml("Worker", 2, &args, "", "")
    );
    Ok(serde_saphyr::from_str(&yaml)?)
}

/// Each call's result by step, from the script's JSON lines; an error names every call that
/// failed.
fn results(stdout: &str) -> Result<std::collections::BTreeMap<String, Value>> {
    let mut out = std::collections::BTreeMap::new();
    let mut failed = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("parsing {line}"))?;
        let step = v["step"].as_str().unwrap_or_default().to_string();
        if v["ok"] != true {
            failed.push(format!("{step}: {}", v["error"]));
        }
        out.insert(step, v["result"].clone());
    }
    if !failed.is_empty() {
        bail!("SDK calls failed:\n{}", failed.join("\n"));
    }
    Ok(out)
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect();
    n.sort();
    n
}

#[test]
fn kubeflows_python_sdk_creates_waits_for_lists_reads_and_deletes_our_tfjobs() -> Result<()> {
    let started = Instant::now();
    let python = sdk_python()?;
    build_images(&release_bin_dir()?)?;
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("sdk")?;
    let mut agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    // The SDK reads logs through the API server, which asks the node's kubelet.
    let _logs = agent.serve_logs(cp)?;
    let account = operator_account(cp, &ns)?;
    let op = Operator::start_ready(cp, &account, "op-0")?;
    let job_file = cp.dir().join(format!("{ns}-job.json"));
    std::fs::write(&job_file, serde_json::to_string(&job_dict(&ns)?)?)?;
    eprintln!("venv, control plane, images, node agent, operator ready in {:.1}s", started.elapsed().as_secs_f64());
    let run = Command::new(&python)
        .arg(repo_root().join("tests/sdk/sdk_calls.py"))
        .args([cp.kubeconfig_path().as_os_str(), ns.as_ref(), job_file.as_os_str()])
        .stdin(Stdio::null())
        .output()
        .context("running tests/sdk/sdk_calls.py")?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    let r = (|| -> Result<()> {
        let calls = results(&stdout)?;
        ensure!(run.status.success(), "sdk_calls.py exited with {}", run.status);
        check(&calls)
    })();
    agent.stop()?;
    // The operator's log first: CI keeps the start of a failure's output, and the SDK's
    // answers (whole TFJob objects) are long.
    r.map_err(|e| {
        anyhow!("{e:#}\n--- operator ---\n{}\n--- sdk_calls.py stderr ---\n{}\n--- stdout ---\n{stdout}", op.log_tail(30), String::from_utf8_lossy(&run.stderr))
    })
}

/// What each call returned is what it returns against Kubeflow's operator.
fn check(calls: &std::collections::BTreeMap<String, Value>) -> Result<()> {
    let get = |step: &str| calls.get(step).cloned().ok_or_else(|| anyhow!("no result for {step}"));
    let conditions: Vec<(String, String)> = get("get_job_conditions")?
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["type"].as_str().unwrap_or_default().to_string(), c["status"].as_str().unwrap_or_default().to_string()))
        .collect();
    for (kind, status) in [("Created", "True"), ("Running", "False"), ("Succeeded", "True")] {
        ensure!(conditions.contains(&(kind.to_string(), status.to_string())), "conditions {conditions:?} lack {kind}={status}");
    }
    let checks: Vec<Value> = ["is_job_created", "is_job_running", "is_job_succeeded", "is_job_failed"].iter().map(|s| get(s)).collect::<Result<_>>()?;
    ensure!(checks == [true, false, true, false], "is_job_created/running/succeeded/failed: {checks:?}");
    ensure!(get("get_job")?["metadata"]["name"] == JOB, "get_job: {}", get("get_job")?);
    let pod = |s: &str| format!("{JOB}-{s}");
    ensure!(names(&get("get_job_pod_names")?) == [pod("ps-0"), pod("worker-0"), pod("worker-1")], "pods: {}", get("get_job_pod_names")?);
    ensure!(names(&get("get_job_pod_names_master")?) == [pod("worker-0")], "master (job-role): {}", get("get_job_pod_names_master")?);
    ensure!(names(&get("get_job_pod_names_ps")?) == [pod("ps-0")], "ps: {}", get("get_job_pod_names_ps")?);
    ensure!(names(&get("get_job_pod_names_worker_1")?) == [pod("worker-1")], "worker 1: {}", get("get_job_pod_names_worker_1")?);
    // The master's log is worker 0's training, ending with its final report.
    let logs = get("get_job_logs")?;
    let master_log = logs[pod("worker-0")].as_str().ok_or_else(|| anyhow!("get_job_logs has no {}: {logs}", pod("worker-0")))?;
    let report = final_report(master_log, &pod("worker-0"))?;
    ensure!(report["epochs_completed"].as_u64() == Some(EPOCHS) && report["examples_trained"].as_u64() == Some(EPOCHS * EXAMPLES), "{report}");
    let worker_1 = get("get_job_logs_worker_1")?;
    ensure!(worker_1[pod("worker-1")].as_str().is_some_and(|l| l.contains("worker:1: finished")), "worker 1's log: {worker_1}");
    ensure!(get("job_gone")? == true, "job_gone: {}", get("job_gone")?);
    Ok(())
}

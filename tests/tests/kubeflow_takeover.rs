//! Taking a running Kubeflow installation over, live: Kubeflow's training-operator v1.9.3 (built
//! from its Go module, `tests/kubeflow/build.sh`) runs TFJobs on a control plane of this test's
//! own, with its own CRD and one Service per replica, the node agent running the pods. Mid-run it
//! is stopped, this project's CRD replaces Kubeflow's (`kubectl replace`, every stored TFJob
//! kept) and our operator starts, with exactly the chart's RBAC (README, "Moving from Kubeflow's
//! training-operator"):
//!
//! - the sync job that was training goes on with its pods (same UIDs; the API server's audit log
//!   shows no pod created by our operator for it) and finishes `Succeeded` with every example
//!   trained once per epoch; its status goes on from Kubeflow's (start time, `Created`);
//!   Kubeflow's per-replica Services stay, the same objects;
//! - a job whose worker pod is lost after the takeover gets it back in Kubeflow's layout (the
//!   addresses its other pods' `TF_CONFIG` names, no token) and finishes exactly;
//! - a job that had failed under Kubeflow stays failed, with no pod created for it;
//! - a job that had succeeded under Kubeflow is deleted by our operator when its
//!   `ttlSecondsAfterFinished`, counted from the completion Kubeflow recorded, runs out;
//! - a job suspended under Kubeflow is resumed under ours and succeeds;
//! - a job created after the takeover gets this operator's layout (one Service, a token).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::kubeflow::{self, KubeflowOperator};
use tfjob_tests::node_agent::NodeAgent;
use tfjob_tests::operator::{Cluster, Operator, condition_true, operator_account, repo_root, runtime_replica_yaml};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};
use tfjob_tests::report::final_report;

/// The jobs that train across the takeover: an MLP on the runtime's generated examples, its
/// steps heavy on arithmetic (which the node's lower priority governs) rather than on RPCs: a
/// linear model's thousands of steps a second kept the kernel so busy with the pod network that
/// the API server and kubectl stalled for tens of seconds at a time.
const LONG_MODEL: &str = r#", "--model=mlp", "--hidden_units=512", "--batch_size=256", "--sync_replicas""#;
/// Long enough to still train after the takeover: at 40, one of the two jobs had finished
/// before it on a CI host (2026-12-06) where the first job took 42 s to log its first step and
/// the runtime had just built its batches faster.
const LONG_EPOCHS: u64 = 64;
/// Examples per epoch of the runtime's generated examples.
const LONG_EXAMPLES: u64 = 20_000;
const SHORT_EPOCHS: u64 = 50;
/// How long after the takeover the TTL of the job that succeeded under Kubeflow runs out.
const TTL_AFTER_TAKEOVER_SECS: i64 = 15;

fn job(name: &str, epochs: u64, extra_args: &str, run_policy: &str, workers: u32, restart: &str) -> String {
    let args = format!(r#"["--learning_rate=0.01", "--num_epochs={epochs}", "--log_every_steps=20"{extra_args}]"#);
    let replicas = |t: &str, n: u32| runtime_replica_yaml(t, n, &args, "", "").replace("restartPolicy: OnFailure", &format!("restartPolicy: {restart}"));
    format!(
        "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: {name}}}\nspec:\n  runPolicy: {run_policy}\n  tfReplicaSpecs:\n{}{}",
        replicas("PS", 1),
        replicas("Worker", workers)
    )
}

/// The name and uid of every object of `kind` of `job`, in one call (each kubectl costs a
/// second or more while jobs train on the machine's two cores).
fn uids(cp: &ControlPlane, ns: &str, kind: &str, job: &str) -> Result<BTreeMap<String, String>> {
    let selector = format!("training.kubeflow.org/job-name={job}");
    let out = cp.kubectl_ok(["-n", ns, "get", kind, "-l", &selector, "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{\"\\n\"}{end}"])?;
    Ok(out.lines().filter_map(|l| l.split_once(' ')).map(|(n, u)| (n.to_string(), u.to_string())).collect())
}

fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !done()? {
        ensure!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("        {what}: {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn condition_time(status: &Value, kind: &str) -> Value {
    status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind).map(|c| c["lastTransitionTime"].clone()).unwrap_or(Value::Null)
}

fn status_has(k: &Cluster<'_>, job: &str, condition: &str) -> Result<bool> {
    Ok(condition_true(&k.must_get("tfjob", job)?["status"], condition))
}

/// What Kubeflow left, seen just before it is stopped.
struct UnderKubeflow {
    sync_pods: BTreeMap<String, String>,
    sync_services: BTreeMap<String, String>,
    sync_status: Value,
    done_completed: Timestamp,
}

/// Under Kubeflow: two sync jobs training, one that failed, one that succeeded (with a TTL), a
/// suspended one.
fn under_kubeflow(k: &Cluster<'_>, agent: &NodeAgent, ns: &str) -> Result<UnderKubeflow> {
    // The short ones first, so that the training ones are taken over early in their run.
    k.apply(&job("broken", SHORT_EPOCHS, r#", "--model=linear", "--no_such_flag""#, "{backoffLimit: 0}", 1, "Never"))?;
    k.apply(&job("done", SHORT_EPOCHS, r#", "--model=linear""#, "{ttlSecondsAfterFinished: 3600}", 1, "OnFailure"))?;
    k.apply(&job("held", SHORT_EPOCHS, r#", "--model=linear""#, "{suspend: true}", 1, "OnFailure"))?;
    until("broken fails under Kubeflow", Duration::from_secs(60), || status_has(k, "broken", "Failed"))?;
    until("done succeeds under Kubeflow", Duration::from_secs(60), || status_has(k, "done", "Succeeded"))?;
    until("held is suspended under Kubeflow", Duration::from_secs(30), || status_has(k, "held", "Suspended"))?;
    k.apply(&job("sync", LONG_EPOCHS, LONG_MODEL, "{}", 2, "OnFailure"))?;
    k.apply(&job("lost", LONG_EPOCHS, LONG_MODEL, "{}", 2, "OnFailure"))?;
    for trains in ["sync", "lost"] {
        let chief = format!("{trains}-worker-0");
        until(&format!("{trains} trains under Kubeflow"), Duration::from_secs(120), || Ok(agent.pod_log(ns, &chief).contains("global_step")))?;
    }
    let (sync_pods, sync_services) = (uids(k.cp, ns, "pods", "sync")?, uids(k.cp, ns, "services", "sync")?);
    ensure!(sync_services.keys().eq(["sync-ps-0", "sync-worker-0", "sync-worker-1"].iter()), "Kubeflow's Services: {sync_services:?}");
    let done = k.must_get("tfjob", "done")?;
    let done_completed = done["status"]["completionTime"].as_str().ok_or_else(|| anyhow!("done has no completionTime: {done}"))?.parse()?;
    Ok(UnderKubeflow { sync_pods, sync_services, sync_status: k.must_get("tfjob", "sync")?["status"].clone(), done_completed })
}

/// The takeover as README has it: Kubeflow's controller stopped, this project's CRD over
/// Kubeflow's, our operator started.
fn take_over(cp: &ControlPlane, k: &Cluster<'_>, kubeflow: &mut KubeflowOperator, ns: &str) -> Result<(Operator, String)> {
    kubeflow.stop()?;
    cp.kubectl_ok(["replace", "-f", &repo_root().join("crds/tfjob.yaml").display().to_string()])?;
    cp.wait_established(&["tfjobs.kubeflow.org"])?;
    let account = operator_account(cp, ns)?;
    let op = Operator::start_ready(cp, &account, "op-0")?;
    for job in ["sync", "lost"] {
        ensure!(!status_has(k, job, "Succeeded")?, "{job} finished before the takeover: raise LONG_EPOCHS");
    }

    Ok((op, format!("system:serviceaccount:{ns}:{}", account.service_account)))
}

fn trained_exactly(agent: &NodeAgent, ns: &str, job: &str) -> Result<()> {
    let chief = format!("{job}-worker-0");
    let report = final_report(&agent.pod_log(ns, &chief), &chief)?;
    let exact = report["epochs_completed"].as_u64() == Some(LONG_EPOCHS) && report["examples_trained"].as_u64() == Some(LONG_EPOCHS * LONG_EXAMPLES);
    ensure!(exact, "{job}: {report}");
    Ok(())
}

/// The sync job went on under ours: same pods, same Services, its status continued, every example.
fn sync_went_on(cp: &ControlPlane, k: &Cluster<'_>, agent: &NodeAgent, ns: &str, user: &str, before: &UnderKubeflow) -> Result<()> {
    until("sync succeeds under ours", Duration::from_secs(300), || status_has(k, "sync", "Succeeded"))?;
    trained_exactly(agent, ns, "sync")?;
    let created: Vec<String> = cp
        .audit_events(user)?
        .iter()
        .filter(|e| e["verb"] == "create" && e["objectRef"]["resource"] == "pods")
        .filter_map(|e| e["objectRef"]["name"].as_str().map(str::to_string))
        .collect();
    ensure!(!created.iter().any(|p| p.starts_with("sync-") || p.starts_with("broken-") || p.starts_with("done-")), "our operator created {created:?}");
    for (pod, uid) in &before.sync_pods {
        if let Some(now) = k.get("pod", pod)? {
            ensure!(now["metadata"]["uid"] == uid.as_str(), "{pod} was replaced");
        }
    }
    let services = uids(cp, ns, "services", "sync")?;
    ensure!(services == before.sync_services, "Kubeflow's Services of sync: {:?} became {services:?}", before.sync_services);
    let (was, now) = (&before.sync_status, k.must_get("tfjob", "sync")?["status"].clone());
    ensure!(now["startTime"] == was["startTime"], "startTime {} became {}", was["startTime"], now["startTime"]);
    ensure!(condition_time(&now, "Created") == condition_time(was, "Created"), "Created: {was:#} -> {now:#}");
    Ok(())
}

/// A worker of `lost` is lost under ours: its new pod joins the others in Kubeflow's layout.
fn lost_worker_comes_back(cp: &ControlPlane, k: &Cluster<'_>, agent: &NodeAgent, ns: &str) -> Result<()> {
    let old = k.uid("pod", "lost-worker-1")?;
    cp.kubectl_ok(["-n", ns, "delete", "pod", "lost-worker-1", "--wait=false"])?;
    let mut pod = Value::Null;
    until("lost-worker-1 is created again", Duration::from_secs(240), || {
        pod = k.get("pod", "lost-worker-1")?.unwrap_or(Value::Null);
        Ok(pod["metadata"]["uid"].as_str().is_some_and(|u| u != old))
    })?;
    let spec = &pod["spec"];
    ensure!(spec["subdomain"].is_null() && spec["hostname"].is_null(), "lost-worker-1 came back in our layout: {spec:#}");
    let env = spec["containers"][0]["env"].as_array().cloned().unwrap_or_default();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned();
    ensure!(var("TFJOB_TOKEN").is_none(), "lost-worker-1 came back with a token its peers do not hold");
    let tf_config: Value = serde_json::from_str(var("TF_CONFIG").and_then(|v| v["value"].as_str().map(str::to_string)).unwrap_or_default().as_str())?;
    let ps = format!("lost-ps-0.{ns}.svc:2222");
    ensure!(tf_config["cluster"]["ps"][0] == ps.as_str(), "TF_CONFIG of the new lost-worker-1: {tf_config}");
    until("lost succeeds under ours", Duration::from_secs(300), || status_has(k, "lost", "Succeeded"))?;
    trained_exactly(agent, ns, "lost")
}

/// `done` goes when its TTL, counted from the completion Kubeflow wrote, runs out under ours, not
/// before. (Its TTL, an hour under Kubeflow so that Kubeflow cannot be the one to delete it
/// whatever the machine's speed, is cut to run out shortly after the takeover.)
fn ttl_kept(k: &Cluster<'_>, before: &UnderKubeflow) -> Result<()> {
    let ttl = Timestamp::now().as_second() - before.done_completed.as_second() + TTL_AFTER_TAKEOVER_SECS;
    k.patch_job("done", serde_json::json!({"spec": {"runPolicy": {"ttlSecondsAfterFinished": ttl}}}))?;
    until("done is deleted by its TTL", Duration::from_secs(TTL_AFTER_TAKEOVER_SECS as u64 + 120), || Ok(k.get("tfjob", "done")?.is_none()))?;
    let lived = Timestamp::now().as_second() - before.done_completed.as_second();
    ensure!(lived >= ttl, "done was deleted {lived} s after it completed, before its TTL of {ttl} s");
    Ok(())
}

/// broken stays failed; held resumes; a new job gets this operator's layout.
fn the_others(k: &Cluster<'_>) -> Result<()> {
    let broken = k.must_get("tfjob", "broken")?["status"].clone();
    ensure!(condition_true(&broken, "Failed") && !condition_true(&broken, "Succeeded"), "broken: {broken:#}");
    k.patch_job("held", serde_json::json!({"spec": {"runPolicy": {"suspend": false}}}))?;
    k.apply(&job("fresh", SHORT_EPOCHS, r#", "--model=linear""#, "{}", 1, "OnFailure"))?;
    for job in ["held", "fresh"] {
        until(&format!("{job} succeeds under ours"), Duration::from_secs(120), || status_has(k, job, "Succeeded"))?;
    }
    let services = k.names("services", "training.kubeflow.org/job-name=fresh")?;
    ensure!(services == ["fresh"], "a job made after the takeover has the Services {services:?}");
    Ok(())
}

#[test]
fn running_kubeflow_tfjobs_are_taken_over_without_restarting_a_pod() -> Result<()> {
    let started = Instant::now();
    build_images(&release_bin_dir()?)?;
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("takeover")?;
    let mut agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    kubeflow::install_crd(cp)?;
    let mut kubeflow = KubeflowOperator::start(cp, &ns)?;
    let k = Cluster::new(cp, &ns);
    eprintln!("control plane, images, node agent, Kubeflow's training-operator ready in {:.1}s", started.elapsed().as_secs_f64());
    let t0 = Instant::now();
    let at = |what: &str| eprintln!("{:>6.1}s {what}", t0.elapsed().as_secs_f64());

    let pod_logs = |agent: &NodeAgent| -> String {
        let pods = ["sync-ps-0", "sync-worker-0", "sync-worker-1", "lost-ps-0", "lost-worker-0", "lost-worker-1"];
        pods.iter().map(|p| format!("--- {p} ---\n{}\n", last_lines(&agent.pod_log(&ns, p), 15))).collect()
    };
    let before = under_kubeflow(&k, &agent, &ns).map_err(|e| anyhow!("{e:#}\n--- Kubeflow ---\n{}{}", kubeflow.log_tail(30), pod_logs(&agent)))?;
    at("under Kubeflow: sync and lost train, broken failed, done succeeded, held suspended");
    let (op, user) = take_over(cp, &k, &mut kubeflow, &ns)?;
    at("Kubeflow stopped, our CRD and operator in");
    let r = (|| -> Result<()> {
        lost_worker_comes_back(cp, &k, &agent, &ns)?;
        at("lost: its worker 1 lost, back in Kubeflow's layout; lost succeeded");
        sync_went_on(cp, &k, &agent, &ns, &user, &before)?;
        at("sync succeeded with its pods and Services");
        the_others(&k)?;
        at("broken still failed; held resumed and succeeded; fresh in our layout");
        ttl_kept(&k, &before)?;
        at("done deleted by its TTL");
        Ok(())
    })();
    agent.stop()?;
    r.map_err(|e| anyhow!("{e:#}\n--- operator ---\n{}{}", op.log_tail(40), pod_logs(&agent)))
}

//! Chaos under training jobs on a test control plane of its own (its API server and etcd are
//! restarted): the chart's operator runs in its pod, node agents run the jobs' pods, and each job
//! is a sync job trained for a number of epochs, checked by the chief's `epochs_completed` and
//! `examples_trained` (exact: every example once per epoch), the job `Succeeded`, and no pod,
//! Service or Secret of it left after `kubectl delete tfjob`.
//!
//! - The operator killed (SIGKILL) with a 20-replica job half created: a ResourceQuota lets 5 of
//!   its pods through and refuses the rest, so the operator is, for certain, between two pod
//!   creations when it dies. The quota is lifted; the operator's container, restarted by the node
//!   agent as a kubelet restarts it, waits for the dead process's lease to run out, leads, and
//!   creates the 15 pods left: none of the first 5 replaced, no pod created twice, none deleted.
//!   Training starts only once every replica of the cluster answers, so it cannot finish without
//!   all 20.
//! - The operator killed during a `kubectl scale` of a training job (2 → 5 workers, the quota
//!   letting one new pod through): its replacement creates the others, the new workers train.
//! - kube-apiserver and etcd killed while a job trains and started again 12 s later (longer than
//!   the operator's lease renewal deadline: it gives up leading and stops, and its restarted
//!   container leads again): the job trains on meanwhile, the status catches up, and a job
//!   created afterwards is served.
//! - A whole node lost under a training job: a second node agent runs one worker, then loses it
//!   all at once (containers killed, nothing written) and its Node object is deleted; the pod
//!   garbage collector marks the pod Failed and deletes it (or the operator deletes the Failed pod
//!   first), the operator creates it again, the first node runs it.
//!
//! Long (~4 minutes together): not in the default run, but in `bash tests/run.sh --long`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tfjob_tests::controlplane::{ControlPlane, Options};
use tfjob_tests::node_agent::{NODE_NAME, NodeAgent, NodeOptions};
use tfjob_tests::operator::{eventually, repo_root};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};
use tfjob_tests::report::ensure_linear;
use tfjob_tests::scene::{RELEASE, Scene, install_operator, wait_leader};

/// The elastic sync job of the end-to-end scaling scenario (2 workers, `replicas_to_aggregate=auto`).
const SCALE_JOB: &str = "tests/e2e/kind/elastic-scale.yaml";

fn manifest(path: &str) -> Result<String> {
    std::fs::read_to_string(repo_root().join(path)).with_context(|| format!("reading {path}"))
}

/// `SCALE_JOB` renamed `name`, trained for `epochs`, with `workers` workers and `aggregate`
/// (`--replicas_to_aggregate`, `None`: every worker's gradient at every step).
fn sync_job(name: &str, epochs: u64, workers: u32, aggregate: Option<&str>) -> Result<String> {
    let job = manifest(SCALE_JOB)?;
    ensure!(job.matches("--num_epochs=600").count() == 2 && job.matches("\"--replicas_to_aggregate=auto\", ").count() == 2, "{SCALE_JOB} changed shape");
    let aggregate = aggregate.map(|a| format!("\"--replicas_to_aggregate={a}\", ")).unwrap_or_default();
    Ok(job
        .replace("name: elastic-scale", &format!("name: {name}"))
        .replace("--num_epochs=600", &format!("--num_epochs={epochs}"))
        .replace("\"--replicas_to_aggregate=auto\", ", &aggregate)
        .replace("    Worker:\n      replicas: 2", &format!("    Worker:\n      replicas: {workers}")))
}

/// The user the chart's operator calls the API server as.
fn operator_user(scene: &Scene) -> String {
    format!("system:serviceaccount:{}:{RELEASE}", scene.ns)
}

/// The operator's successful requests of `verb` on pods so far, by pod name where the audit log
/// has it.
fn pod_requests(scene: &Scene, verb: &str) -> Result<Vec<String>> {
    Ok(scene
        .cp
        .audit_events(&operator_user(scene))?
        .into_iter()
        .filter(|e| e["verb"] == verb && e["objectRef"]["resource"] == "pods" && e["objectRef"]["subresource"].is_null())
        .filter(|e| e["responseStatus"]["code"].as_i64().is_some_and(|c| (200..300).contains(&c)))
        .map(|e| e["objectRef"]["name"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// A quota on the namespace's pods: the operator's own pod, the pods of other jobs still there,
/// and `more`. Waits until the quota controller has counted what is there (the API server
/// refuses every pod until then).
fn limit_pods(scene: &Scene, more: usize) -> Result<()> {
    let running = scene.json(&["get", "pods", "--field-selector=status.phase!=Succeeded,status.phase!=Failed"])?["items"].as_array().map_or(0, Vec::len);
    let hard = running + more;
    scene.kubectl(&["create", "quota", "chaos-pods", &format!("--hard=pods={hard}")])?;
    eventually("the quota controller counts the pods", Duration::from_secs(30), || {
        let used = scene.json(&["get", "quota", "chaos-pods"])?["status"]["used"]["pods"].as_str().map(String::from);
        Ok(used.filter(|u| *u == running.to_string()))
    })?;
    Ok(())
}

/// The job's ReplicaFailure condition (pods refused for now, retrying), once it is there.
fn wait_refused(scene: &Scene, job: &str) -> Result<String> {
    eventually(&format!("{job} shows its refused pods"), Duration::from_secs(30), || {
        Ok(scene.condition(job, "ReplicaFailure")?.map(|(_, message)| message).filter(|m| m.contains("exceeded quota")))
    })
}

/// SIGKILLs the operator's process (its container restarts in place, as a kubelet restarts it,
/// and the new process waits for the lease the dead one still holds) and lifts the quota.
/// Returns when a new process leads.
fn kill_operator_and_lift_quota(scene: &Scene, pod: &str) -> Result<Instant> {
    let holder = || -> Result<String> { Ok(scene.json(&["get", "lease", RELEASE])?["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string()) };
    let before = holder()?;
    scene.agent.kill(&scene.ns, pod, "KILL")?;
    scene.kubectl(&["delete", "quota", "chaos-pods"])?;
    eventually("a new operator process leads", Duration::from_secs(90), || {
        let now = holder()?;
        Ok((now != before && now.contains(pod)).then_some(()))
    })?;
    Ok(Instant::now())
}

/// (name, uid) of the pods in `before` must still be there as the same pods.
fn unchanged(scene: &Scene, job: &str, before: &[(String, String)]) -> Result<()> {
    let now = scene.pod_uids(job)?;
    for (name, uid) in before {
        ensure!(now.iter().any(|(n, u)| n == name && u == uid), "{name} was replaced: {before:?} → {now:?}");
    }
    Ok(())
}

/// No operator deleted a pod since it had deleted `before` (a job that ends deletes its running
/// pods).
fn no_pod_deleted(scene: &Scene, before: usize) -> Result<()> {
    only_these_pods_deleted(scene, before, &[])
}

/// No operator deleted a pod but those of `allowed` since it had deleted `before`.
fn only_these_pods_deleted(scene: &Scene, before: usize, allowed: &[&str]) -> Result<()> {
    let deleted = pod_requests(scene, "delete")?;
    let since = &deleted[before.min(deleted.len())..];
    ensure!(since.iter().all(|name| allowed.contains(&name.as_str())), "an operator deleted pods: {since:?} (allowed: {allowed:?})");
    Ok(())
}

fn exact(scene: &Scene, job: &str, epochs: u64) -> Result<Value> {
    let chief = scene.report(&format!("{job}-worker-0"))?;
    ensure!(chief["epochs_completed"].as_u64() == Some(epochs) && chief["examples_trained"].as_u64() == Some(epochs * 101), "{job}: {chief}");
    ensure_linear(&chief, job)?;
    Ok(chief)
}

/// The images, built once for both tests (they run at the same time).
fn images() -> Result<()> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let images = build_images(&release_bin_dir().map_err(|e| format!("{e:#}"))?).map_err(|e| format!("{e:#}"))?;
            eprint!("{}", images.log);
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

#[test]
#[ignore = "long (~3 min): bash tests/run.sh --long"]
fn the_operator_and_the_api_server_die_under_training_jobs_and_the_jobs_finish() -> Result<()> {
    let started = Instant::now();
    images()?;
    let service = PodmanService::start()?;
    // Its own control plane: this test restarts the API server and etcd.
    let cp = ControlPlane::start()?;
    let ns = cp.create_namespace("chaos")?;
    let agent = NodeAgent::start(&cp, &[&ns], &service.docker_host())?;
    let scene = Scene { cp: &cp, ns: ns.clone(), agent };
    let pod = install_operator(&scene, &[])?;
    eprintln!("control plane, images, node agent, operator ready in {:.1}s", started.elapsed().as_secs_f64());
    let r = (|| -> Result<()> {
        operator_killed_with_a_job_half_created(&scene, &pod)?;
        operator_killed_during_a_scale(&scene, &pod)?;
        api_server_and_etcd_restarted_while_a_job_trains(&scene, &pod)
    })();
    r.with_context(|| format!("operator log:\n{}", tail(&scene.agent.pod_log(&ns, &pod), 60)))?;
    eprintln!("operator and API server chaos in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

#[test]
#[ignore = "long (~3 min): bash tests/run.sh --long"]
fn a_node_lost_under_a_training_job_is_recovered() -> Result<()> {
    let started = Instant::now();
    images()?;
    let service = PodmanService::start()?;
    // Its own control plane, with the pod garbage collector, which deletes the pods of a deleted
    // Node (every node here has its Node object).
    let cp = ControlPlane::start_with(Options { extra_controllers: vec!["pod-garbage-collector-controller".into()], ..Default::default() })?;
    node_object(&cp, NODE_NAME)?;
    let ns = cp.create_namespace("node-lost")?;
    let agent = NodeAgent::start(&cp, &[&ns], &service.docker_host())?;
    let scene = Scene { cp: &cp, ns: ns.clone(), agent };
    let pod = install_operator(&scene, &[])?;
    a_node_lost_under_a_training_job(&scene, &service.docker_host())
        .with_context(|| format!("operator log:\n{}", tail(&scene.agent.pod_log(&ns, &pod), 60)))?;
    eprintln!("node lost and recovered in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// 1 ps + 19 workers (training starts once all 20 answer); the operator dies with 5
/// of its 20 pods created (see the module documentation).
fn operator_killed_with_a_job_half_created(scene: &Scene, pod: &str) -> Result<()> {
    const JOB: &str = "twenty";
    const EPOCHS: u64 = 300;
    limit_pods(scene, 5)?;
    let creates_before = pod_requests(scene, "create")?.len();
    let deletes_before = pod_requests(scene, "delete")?.len();
    let (mut first, mut killed, mut all) = (Vec::new(), None, None);
    let (mut tl, end) = scene.run_job(JOB, &sync_job(JOB, EPOCHS, 19, None)?, |s, pods| {
        if killed.is_none() {
            let refused = wait_refused(s, JOB)?;
            first = s.pod_uids(JOB)?;
            ensure!(first.len() == 5, "the quota let {} pods through, not 5: {first:?}", first.len());
            eprintln!("{JOB}: {refused}");
            killed = Some((Instant::now(), kill_operator_and_lift_quota(s, pod)?));
        }
        if all.is_none() && pods.len() == 20 {
            // Checked now: once the job succeeds, cleanPodPolicy deletes its running pods.
            unchanged(s, JOB, &first)?;
            no_pod_deleted(s, deletes_before)?;
            all = Some(Instant::now());
        }
        Ok(all.is_some())
    })?;
    let (killed, leads) = killed.context("the operator was never killed")?;
    tl.mark_at("5 pods created, operator killed", killed);
    tl.mark_at("new operator leads", leads);
    tl.mark_at("20 pods", all.with_context(|| format!("{JOB}: never 20 pods ({end})"))?);
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let creates = pod_requests(scene, "create")?.len() - creates_before;
    ensure!(creates == 20, "the operators created {creates} pods for a job of 20");
    let chief = exact(scene, JOB, EPOCHS)?;
    eprintln!("{JOB}: 20 pods created once each, chief: {chief}");
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

/// The elastic sync job scaled 2 → 5 workers while it trains; the operator dies with 1 of the 3
/// new pods created.
fn operator_killed_during_a_scale(scene: &Scene, pod: &str) -> Result<()> {
    const JOB: &str = "rescaled";
    // Enough to outlast what follows its first step: the quota counted, the scale, the kill, the
    // dead process's lease running out (~15 s), three pods created and started (~10 s). At 3000
    // epochs (~30 s of training here) a faster runtime finished first once; at 9000 the margin
    // is three times that, and the job ends when its epochs do, whatever the margin.
    const EPOCHS: u64 = 9000;
    let new = |i: u32| format!("{JOB}-worker-{i}");
    let deletes_before = pod_requests(scene, "delete")?.len();
    let (mut before, mut killed, mut pushed) = (Vec::new(), None, None);
    let (mut tl, end) = scene.run_job(JOB, &sync_job(JOB, EPOCHS, 2, Some("auto"))?, |s, _| {
        if killed.is_none() && s.agent.pod_log(&s.ns, &new(0)).contains("first gradient accepted") {
            before = s.pod_uids(JOB)?;
            limit_pods(s, 1)?;
            s.kubectl(&["scale", &format!("tfjob/{JOB}"), "--replicas=5"])?;
            wait_refused(s, JOB)?;
            let names: Vec<String> = s.pod_uids(JOB)?.into_iter().map(|(n, _)| n).collect();
            ensure!(names.contains(&new(2)) && names.len() == 4, "the quota let through other pods than worker-2: {names:?}");
            killed = Some(kill_operator_and_lift_quota(s, pod)?);
        }
        if killed.is_some() && pushed.is_none() && s.agent.first_gradient(&s.ns, &new(4)).is_some() && s.agent.first_gradient(&s.ns, &new(3)).is_some() {
            unchanged(s, JOB, &before)?;
            no_pod_deleted(s, deletes_before)?;
            pushed = Some(Instant::now());
        }
        Ok(pushed.is_some())
    })?;
    tl.mark_at("operator killed mid-scale, replacement leads", killed.context("the operator was never killed")?);
    tl.mark_at("workers 3 and 4 pushed", pushed.with_context(|| format!("{JOB}: the replacement's workers never trained ({end}); give it more epochs"))?);
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    exact(scene, JOB, EPOCHS)?;
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

/// etcd and kube-apiserver SIGKILLed while a sync job trains, down 12 s, started again.
fn api_server_and_etcd_restarted_while_a_job_trains(scene: &Scene, pod: &str) -> Result<()> {
    const JOB: &str = "outage";
    const EPOCHS: u64 = 3000;
    let mut restarted = None;
    let (mut tl, end) = scene.run_job(JOB, &sync_job(JOB, EPOCHS, 2, None)?, |s, _| {
        if restarted.is_none() && s.agent.pod_log(&s.ns, &format!("{JOB}-worker-0")).contains("first gradient accepted") {
            let t = Instant::now();
            s.cp.restart(&["etcd", "kube-apiserver"], Duration::from_secs(12))?;
            restarted = Some((t, Instant::now()));
        }
        Ok(restarted.is_some())
    })?;
    let (killed, back) = restarted.context("never restarted")?;
    tl.mark_at("etcd and kube-apiserver killed", killed);
    tl.mark_at("API server ready again", back);
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let chief = exact(scene, JOB, EPOCHS)?;
    eprintln!("{JOB}: chief {chief}");
    // The operator serves a job created after the outage.
    wait_leader(scene, pod)?;
    let (mut tl2, end) = scene.run_job("after", &sync_job("after", 50, 1, None)?, |_, _| Ok(true))?;
    ensure!(end == "Succeeded", "after: {end}");
    scene.delete_job(JOB, &mut tl)?;
    scene.delete_job("after", &mut tl2)?;
    tl.print();
    Ok(())
}

/// The second node of [`a_node_lost_under_a_training_job`].
const NODE_B: &str = "tfjob-test-node-b";

fn node_object(cp: &ControlPlane, name: &str) -> Result<()> {
    cp.apply(&format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}}}}}\n"))?;
    Ok(())
}

/// A second node (another node agent, on the same container network) runs worker 1 of a sync job
/// (both workers' gradients at each step); once it trained, the node is lost: its
/// containers killed at once, nothing written (the pod still `Running` in the API), and its Node
/// object deleted, as a cloud's node controller deletes the Node of a machine that is gone. The
/// pod garbage collector deletes the pod, the operator creates it again (`OnFailure`), the first
/// node runs it, it trains, and the job ends exact.
fn a_node_lost_under_a_training_job(scene: &Scene, docker_host: &str) -> Result<()> {
    const JOB: &str = "lost";
    const EPOCHS: u64 = 2000;
    let lost = format!("{JOB}-worker-1");
    node_object(scene.cp, NODE_B)?;
    // The first node takes the pods the second leaves (after 2 s unbound).
    scene.agent.set_bind_delay(Duration::from_secs(2))?;
    let options = NodeOptions {
        name: NODE_B.into(),
        join_network: Some(scene.agent.network().to_string()),
        bind_prefixes: Some(vec![lost.clone()]),
        bind_delay: Duration::ZERO,
    };
    let mut node_b = NodeAgent::start_node(scene.cp, &[&scene.ns], docker_host, options)?;
    let deletes_before = pod_requests(scene, "delete")?.len();
    let node_of = |s: &Scene| -> Result<(String, String)> {
        let p = s.json(&["get", "pod", &lost])?;
        Ok((p["spec"]["nodeName"].as_str().unwrap_or_default().to_string(), p["metadata"]["uid"].as_str().unwrap_or_default().to_string()))
    };
    let (mut gone, mut back) = (None, None);
    let (mut tl, end) = scene.run_job(JOB, &sync_job(JOB, EPOCHS, 2, None)?, |s, _| {
        if gone.is_none() && node_b.first_gradient(&s.ns, &lost).is_some() {
            let (node, uid) = node_of(s)?;
            ensure!(node == NODE_B, "{lost} ran on the second node but is bound to {node:?}");
            node_b.lose()?;
            s.cp.kubectl_ok(["delete", "node", NODE_B, "--wait=false"])?;
            gone = Some((Instant::now(), uid));
        }
        if let Some((_, old)) = &gone
            && back.is_none()
            && s.agent.first_gradient(&s.ns, &lost).is_some()
        {
            let (node, uid) = node_of(s)?;
            ensure!(node == NODE_NAME && uid != *old, "{lost} is back as {uid} on {node:?}");
            // The pod garbage collector marks the pod of a deleted Node Failed (a DisruptionTarget
            // condition) before it deletes it; an operator that sees it Failed first deletes it
            // itself to restart it (OnFailure). That pod, and no other.
            only_these_pods_deleted(s, deletes_before, &[&lost])?;
            back = Some(Instant::now());
        }
        Ok(back.is_some())
    })?;
    let (lost_at, _) = gone.context("the node was never lost")?;
    tl.mark_at("node lost", lost_at);
    tl.mark_at("worker-1 trains on the first node", back.with_context(|| format!("{JOB}: worker-1 never came back ({end})"))?);
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let chief = exact(scene, JOB, EPOCHS)?;
    eprintln!("{JOB}: chief {chief}");
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

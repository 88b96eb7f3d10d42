//! TFJobs queued in Kueue as plain pod groups (the operator's `--kueue-pod-groups`, chart value
//! `kueue.podGroups`): Kueue v0.19.2 with its `pod` integration only (its TFJob integration,
//! deprecated, off), on a control plane of this test binary's own, the node agent running the
//! pods, the operator with exactly the chart's RBAC for that value:
//!
//! - a job's pods are created gated, as one group; Kueue admits the group of the first job and
//!   ungates its pods (with the flavour's nodeSelector), the second job's pods stay gated and
//!   unbound until the first has finished and Kueue has ended its group;
//! - a higher-priority job preempts the running one: Kueue deletes its pods, the operator takes
//!   Kueue's finalizer off them once they have stopped and creates them again, gated, in the same
//!   group; readmitted, the job resumes from its checkpoint;
//! - a `kubectl scale` forms a new group of the new size (the old size's pods stop first);
//! - every job trains each example once per epoch, every group's Workload ends Finished, and
//!   deleting the jobs leaves no pod behind (no finalizer left holding one);
//! - `examples/queues/linreg-pod-group.yaml` is what the API server takes.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use serde_json::Value;
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::kueue::{CKPT, Integration, Kueue, LONG_EPOCHS, SHORT_EPOCHS, Scene, node_disk, queued_job, queues};
use tfjob_tests::node_agent::NodeAgent;
use tfjob_tests::operator::{Cluster, Operator, operator_account_with};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};

const GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";

fn job(name: &str, priority: &str, workers: u32, epochs: u64, host_dir: &str) -> String {
    queued_job(name, priority, workers, epochs, host_dir, false)
}

/// The job's pods as the API server has them.
fn pods(s: &Scene<'_>, job: &str) -> Result<Vec<Value>> {
    let out = s.cp.kubectl_ok(["get", "pods", "-n", &s.ns, "-l", &format!("training.kubeflow.org/job-name={job}"), "-o", "json"])?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn gated(pod: &Value) -> bool {
    pod["spec"]["schedulingGates"].as_array().is_some_and(|g| !g.is_empty())
}

fn group(pod: &Value) -> String {
    pod["metadata"]["labels"][GROUP_LABEL].as_str().unwrap_or_default().to_string()
}

/// The job has `n` pods, none being deleted, all ungated, in one group; that group's name.
fn admitted_group(s: &Scene<'_>, job: &str, n: usize) -> Result<Option<String>> {
    let pods = pods(s, job)?;
    let live: Vec<&Value> = pods.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
    if live.len() != n || live.iter().any(|p| gated(p)) {
        return Ok(None);
    }
    let groups: Vec<String> = live.iter().map(|p| group(p)).collect();
    Ok(groups.iter().all(|g| *g == groups[0] && !g.is_empty()).then(|| groups[0].clone()))
}

/// How the group's Workload ended: `Some("finished: <message>")`, `Some("gone")` (its pods gone
/// with it), `None` while it has not.
fn workload_end(s: &Scene<'_>, name: &str) -> Result<Option<String>> {
    let Some(wl) = s.k.get("workloads.kueue.x-k8s.io", name)? else {
        return Ok(Some("gone".into()));
    };
    let conditions = wl["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let finished = conditions.iter().find(|c| c["type"] == "Finished" && c["status"] == "True");
    Ok(finished.map(|c| format!("finished: {}", c["message"].as_str().unwrap_or_default())))
}

#[test]
fn tfjobs_queue_in_kueue_as_pod_groups_wait_gated_are_preempted_resume_and_regroup_when_scaled() -> Result<()> {
    let started = Instant::now();
    build_images(&release_bin_dir()?)?;
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("kueue-pods")?;
    let agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    let account = operator_account_with(cp, &ns, &[("kueue.podGroups", "true")])?;
    let op = Operator::start_ready(cp, &account, "op-0")?;
    let kueue = Kueue::start_with(cp, Integration::Pod)?;
    cp.apply(&queues(&ns))?;
    let examples_ns = cp.create_namespace("kueue-pods-examples")?;
    for example in ["examples/queues/kueue.yaml", "examples/queues/linreg-pod-group.yaml"] {
        let path = tfjob_tests::operator::repo_root().join(example);
        cp.kubectl_ok(["apply", "--dry-run=server", "-n", &examples_ns, "-f", &path.display().to_string()])
            .map_err(|e| anyhow!("the API server refused {example}: {e:#}"))?;
    }
    let host_dir = node_disk(cp, &ns)?;
    eprintln!("control plane, images, node agent, operator, kueue (pod integration) ready in {:.1}s", started.elapsed().as_secs_f64());
    let s = Scene { k: Cluster::new(cp, &ns), cp, ns: ns.clone(), agent, operator: &op };
    let r = scenario(&s, &host_dir);
    eprintln!("--- operator (last lines) ---\n{}", op.log_tail(12));
    let r = r.map_err(|e| anyhow!("{e:#}\n--- operator ---\n{}\n--- kueue ---\n{}", op.log_tail(40), kueue.log_tail(40)));
    let mut agent = s.agent;
    agent.stop()?;
    r
}

fn scenario(s: &Scene<'_>, host_dir: &str) -> Result<()> {
    let t0 = Instant::now();
    let at = |what: &str| eprintln!("{:>6.1}s {what}", t0.elapsed().as_secs_f64());
    // 1. Two jobs of 1.5 cpu for a queue of 2: the first's group is admitted, the second's waits
    // gated.
    s.k.apply(&job("long", "low", 2, LONG_EPOCHS, host_dir))?;
    let mut first_group = String::new();
    s.until("long's group is admitted and the job runs", Duration::from_secs(120), |s| {
        first_group = admitted_group(s, "long", 3)?.unwrap_or_default();
        Ok(!first_group.is_empty() && s.running("long")?)
    })?;
    s.k.apply(&job("waits", "low", 2, SHORT_EPOCHS, host_dir))?;
    s.until("waits has its 3 pods", Duration::from_secs(30), |s| Ok(pods(s, "waits")?.len() == 3))?;
    at(&format!("long runs (group {first_group}); waits' pods created"));
    let watch_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < watch_until {
        let waiting = pods(s, "waits")?;
        ensure!(waiting.iter().all(|p| gated(p) && p["spec"]["nodeName"].is_null()), "a pod of the group beyond the quota runs: {waiting:#?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let pod = s.k.must_get("pod", "long-worker-0")?;
    ensure!(pod["spec"]["nodeSelector"]["tfjob-test/pool"] == "a", "no flavour nodeSelector: {:#}", pod["spec"]);
    ensure!(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3", "{:#}", pod["metadata"]);
    at("waits' pods stay gated and unbound for 8 s; long's pods carry the flavour's nodeSelector");

    // 2. A higher priority preempts long: Kueue deletes its pods; they come back gated, in the
    // same group.
    let ps_uid = s.k.uid("pod", "long-ps-0")?;
    s.k.apply(&job("urgent", "high", 2, SHORT_EPOCHS, host_dir))?;
    let preempted = Instant::now();
    s.until("long's pods are created again, gated, in the same group", Duration::from_secs(60), |s| {
        let p = pods(s, "long")?;
        let live: Vec<&Value> = p.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
        Ok(live.len() == 3 && live.iter().all(|p| gated(p) && group(p) == first_group && p["metadata"]["uid"] != ps_uid.as_str()))
    })?;
    at(&format!("long preempted: its pods back, gated, {:.1}s after urgent was created", preempted.elapsed().as_secs_f64()));
    s.until("urgent succeeds", Duration::from_secs(240), |s| s.succeeded("urgent"))?;
    s.trained_exactly("urgent", SHORT_EPOCHS)?;
    let urgent_group = group(&s.k.must_get("pod", "urgent-worker-0")?);
    at("urgent succeeded");

    // 3. long is admitted again (before or after waits: Kueue's order of two low priorities) and
    // resumes from its checkpoint.
    s.until("long's group is admitted again", Duration::from_secs(300), |s| Ok(admitted_group(s, "long", 3)?.is_some() && s.running("long")?))?;
    s.until("long's ps restores its checkpoint", Duration::from_secs(60), |s| {
        Ok(s.agent.pod_log(&s.ns, "long-ps-0").lines().any(|l| l.contains("restored") && l.contains(&format!("{CKPT}/long"))))
    })?;
    ensure!(!s.succeeded("long")?, "long finished before it could be scaled: raise LONG_EPOCHS");
    at("long admitted again, resumed from its checkpoint");

    // 4. Scaled: a new group of 4 pods, formed once the old size's pods are gone.
    s.cp.kubectl_ok(["-n", &s.ns, "scale", "tfjob/long", "--replicas=3"])?;
    let scaled = Instant::now();
    let mut second_group = String::new();
    s.until("long runs again as a group of 4", Duration::from_secs(300), |s| {
        second_group = admitted_group(s, "long", 4)?.unwrap_or_default();
        Ok(!second_group.is_empty() && s.running("long")?)
    })?;
    ensure!(second_group != first_group, "the scaled job kept its group {first_group}");
    // The event may land a moment after the new group runs (once, in the CI of 8a7af6f, a
    // single look found none).
    s.until("a KueueRegroup event on long", Duration::from_secs(30), |s| Ok(!s.k.events_of("long", "KueueRegroup")?.is_empty()))?;
    at(&format!("long runs as group {second_group} of 4 pods, {:.1}s after the scale", scaled.elapsed().as_secs_f64()));

    // 5. Both low jobs finish; every group ends, and no pod stays behind its job.
    for job in ["long", "waits"] {
        s.until(&format!("{job} succeeds"), Duration::from_secs(600), |s| s.succeeded(job))?;
        at(&format!("{job} succeeded"));
    }
    s.trained_exactly("long", LONG_EPOCHS)?;
    s.trained_exactly("waits", SHORT_EPOCHS)?;
    let waits_group = group(&s.k.must_get("pod", "waits-worker-0")?);
    for g in [&first_group, &second_group, &urgent_group, &waits_group] {
        let mut end = None;
        s.until(&format!("Workload {g} ends"), Duration::from_secs(60), |s| {
            end = workload_end(s, g)?;
            Ok(end.is_some())
        })?;
        at(&format!("Workload {g}: {}", end.unwrap_or_default()));
    }
    // The groups of jobs that finished with pods left (the workers that succeeded) end because
    // the operator marked them; the quota is free again.
    for g in [&second_group, &urgent_group, &waits_group] {
        ensure!(workload_end(s, g)?.is_some_and(|e| e.starts_with("finished")), "Workload {g} did not finish");
    }
    for job in ["long", "waits", "urgent"] {
        s.cp.kubectl_ok(["-n", &s.ns, "delete", "tfjob", job, "--wait=false"])?;
    }
    s.until("the deleted jobs' pods are gone", Duration::from_secs(90), |s| {
        Ok(["long", "waits", "urgent"].iter().map(|j| pods(s, j).map(|p| p.is_empty())).collect::<Result<Vec<bool>>>()?.iter().all(|e| *e))
    })?;
    at("deleted jobs left no pod");
    Ok(())
}

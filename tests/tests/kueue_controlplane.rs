//! TFJobs queued in Kueue (v0.19.2, built from its Go module, `tests/kueue/build.sh`) on the test
//! control plane, with the node agent running the pods so that the jobs really train, and the
//! operator with exactly the chart's RBAC:
//!
//! - a ClusterQueue whose cpu quota fits one job: the first job runs, the second waits with no
//!   pod at all, then runs;
//! - the flavour's nodeSelector and toleration end up on the pods;
//! - a higher-priority job preempts the running one: its pods are deleted and its `active`
//!   counts reach 0 within seconds (so Kueue frees the quota), and when it is admitted again it
//!   resumes from its checkpoint (a hostPath directory: the node's disk) with every example
//!   trained once per epoch;
//! - a `kubectl scale` of an admitted job never runs a pod Kueue did not admit: the new worker
//!   is created only after Kueue has suspended the job, queued it again and admitted the new
//!   size (the API server's audit log shows the one create).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use jiff::Timestamp;
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::kueue::{CKPT, Kueue, LONG_EPOCHS, SHORT_EPOCHS, Scene, node_disk, queued_job, queues};
use tfjob_tests::node_agent::NodeAgent;
use tfjob_tests::operator::{Cluster, Operator, operator_account, replica_count};
use tfjob_tests::podman::{PodmanService, build_images, release_bin_dir};

fn job(name: &str, priority: &str, workers: u32, epochs: u64, host_dir: &str) -> String {
    queued_job(name, priority, workers, epochs, host_dir, true)
}

#[test]
fn tfjobs_queue_in_kueue_wait_with_no_pod_are_preempted_resume_and_never_outgrow_their_admission() -> Result<()> {
    let started = Instant::now();
    build_images(&release_bin_dir()?)?;
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("kueue")?;
    let agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    let account = operator_account(cp, &ns)?;
    let op = Operator::start_ready(cp, &account, "op-0")?;
    let kueue = Kueue::start(cp)?;
    cp.apply(&queues(&ns))?;
    // The README's manifests are what the API server takes with Kueue's CRDs (in a namespace of
    // their own: this one has a LocalQueue `team` of the test's ClusterQueue).
    let examples_ns = cp.create_namespace("kueue-examples")?;
    for example in ["examples/queues/kueue.yaml", "examples/queues/linreg-queued.yaml"] {
        let path = tfjob_tests::operator::repo_root().join(example);
        cp.kubectl_ok(["apply", "--dry-run=server", "-n", &examples_ns, "-f", &path.display().to_string()])
            .with_context(|| format!("the API server refused {example}"))?;
    }
    let host_dir = node_disk(cp, &ns)?;
    eprintln!("control plane, images, node agent, operator, kueue ready in {:.1}s", started.elapsed().as_secs_f64());
    let s = Scene { k: Cluster::new(cp, &ns), cp, ns: ns.clone(), agent, operator: &op };
    let r = scenario(&s, &host_dir, &account.service_account);
    let r = r.map_err(|e| anyhow!("{e:#}\n--- operator ---\n{}\n--- kueue ---\n{}", op.log_tail(40), kueue.log_tail(40)));
    let mut agent = s.agent;
    agent.stop()?;
    r
}

fn scenario(s: &Scene<'_>, host_dir: &str, service_account: &str) -> Result<()> {
    let t0 = Instant::now();
    let at = |what: &str| eprintln!("{:>6.1}s {what}", t0.elapsed().as_secs_f64());
    // 1. Two jobs of 1.5 cpu for a queue of 2: the first runs, the second waits with no pod.
    s.k.apply(&job("long", "low", 2, LONG_EPOCHS, host_dir))?;
    s.until("long is admitted and runs", Duration::from_secs(120), |s| Ok(!s.suspended("long")? && s.running("long")?))?;
    s.k.apply(&job("waits", "low", 2, SHORT_EPOCHS, host_dir))?;
    at("long runs; waits queued");
    let watch_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < watch_until {
        ensure!(s.pods("waits")?.is_empty() && s.suspended("waits")?, "the job beyond the quota got pods: {:?}", s.pods("waits")?);
        std::thread::sleep(Duration::from_millis(200));
    }
    // The flavour's node label and toleration are on the pods.
    let pod = s.k.must_get("pod", "long-worker-0")?;
    ensure!(pod["spec"]["nodeSelector"]["tfjob-test/pool"] == "a", "no flavour nodeSelector: {:#}", pod["spec"]);
    let tolerations = pod["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
    ensure!(tolerations.iter().any(|t| t["key"] == "tfjob-test/dedicated" && t["value"] == "training"), "no flavour toleration: {tolerations:?}");
    at("waits has no pod for 8 s; long's pods carry the flavour's nodeSelector and toleration");

    // 2. A higher priority preempts long: its pods go, `active` reaches 0 within seconds.
    s.k.apply(&job("urgent", "high", 2, SHORT_EPOCHS, host_dir))?;
    s.until("long is suspended by Kueue", Duration::from_secs(60), |s| s.suspended("long"))?;
    let evicted = Instant::now();
    at("long preempted (suspended)");
    s.until("long's pods are gone and its active counts 0", Duration::from_secs(30), |s| {
        let st = s.status("long")?;
        Ok(s.pods("long")?.is_empty() && ["PS", "Worker"].iter().all(|t| replica_count(&st, t, "active") == 0))
    })?;
    let released = evicted.elapsed();
    at(&format!("long's pods deleted, active 0 after {:.1}s", released.as_secs_f64()));
    ensure!(released < Duration::from_secs(15), "the preempted job held its quota for {released:?}");
    s.until("urgent succeeds", Duration::from_secs(240), |s| s.succeeded("urgent"))?;
    s.trained_exactly("urgent", SHORT_EPOCHS)?;
    at("urgent succeeded");

    // 3. long is admitted again (before or after waits has run: Kueue's order of two low
    // priorities) and resumes from its checkpoint.
    s.until("long is admitted again and runs", Duration::from_secs(300), |s| Ok(!s.suspended("long")? && s.running("long")?))?;
    at("long admitted again");
    s.until("long's ps restores its checkpoint", Duration::from_secs(60), |s| {
        Ok(s.agent.pod_log(&s.ns, "long-ps-0").lines().any(|l| l.contains("restored") && l.contains(&format!("{CKPT}/long"))))
    })?;
    ensure!(!s.succeeded("long")?, "long finished before it could be scaled: raise LONG_EPOCHS");

    // 4. Scaled while admitted: worker 2 is created only once Kueue admitted the new size.
    let scale_at = Timestamp::now();
    s.cp.kubectl_ok(["-n", &s.ns, "scale", "tfjob/long", "--replicas=3"])?;
    let scaled = Instant::now();
    at("long scaled to 3 workers");
    s.until("long runs again with 3 workers", Duration::from_secs(240), |s| {
        Ok(!s.suspended("long")? && s.pods("long")?.contains(&"long-worker-2".to_string()) && s.running("long")?)
    })?;
    at(&format!("long runs with 3 workers, {:.1}s after the scale", scaled.elapsed().as_secs_f64()));
    for job in ["long", "waits"] {
        s.until(&format!("{job} succeeds"), Duration::from_secs(600), |s| s.succeeded(job))?;
        at(&format!("{job} succeeded"));
    }
    s.trained_exactly("long", LONG_EPOCHS)?;
    s.trained_exactly("waits", SHORT_EPOCHS)?;
    // Whether the operator saw the new size before Kueue suspended the job (a race between the
    // two controllers; either way no pod beyond the admission may exist, checked next).
    let held = s.k.events_of("long", "ExceedsAdmission")?;
    at(&format!("the operator's ExceedsAdmission events: {held:?}"));
    ensure_worker_created_after_readmission(s, service_account, scale_at)
}

/// The API server's audit log: the operator created `long-worker-2` once, after it had deleted
/// the ps that ran when the job was scaled (the job suspended for its new admission).
fn ensure_worker_created_after_readmission(s: &Scene<'_>, service_account: &str, scale_at: Timestamp) -> Result<()> {
    let user = format!("system:serviceaccount:{}:{service_account}", s.ns);
    let events = s.cp.audit_events(&user)?;
    let pod_calls = |verb: &str, name: &str| -> Vec<Timestamp> {
        events
            .iter()
            .filter(|e| {
                e["verb"] == verb
                    && e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["name"] == name
                    && e["responseStatus"]["code"].as_i64().is_some_and(|c| c < 300)
            })
            .filter_map(|e| e["stageTimestamp"].as_str()?.parse().ok())
            .collect()
    };
    let creates = pod_calls("create", "long-worker-2");
    ensure!(creates.len() == 1, "long-worker-2 was created {} times: {creates:?}", creates.len());
    let suspended = pod_calls("delete", "long-ps-0").into_iter().find(|t| *t > scale_at);
    let suspended =
        suspended.with_context(|| format!("long-ps-0 was not deleted after the scale at {scale_at} (Kueue suspends a job whose pod sets changed)"))?;
    ensure!(creates[0] > suspended, "long-worker-2 created at {} before the job was suspended for its new size ({suspended})", creates[0]);
    Ok(())
}

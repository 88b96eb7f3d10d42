//! The whole story on the test control plane: `helm install` the chart (the operator runs from
//! the chart's Deployment, its pod run by the node agent with a service-account token and the
//! API server reachable from the container network), `kubectl apply` every example (the
//! runtime containers find each other by DNS and train; each TFJob reaches `Succeeded`; the
//! linear ones converge), a worker container killed mid-run (restarted in place, the job still
//! succeeds), `kubectl scale` of a training job 2 → 4 → 1 workers (only the difference created or
//! deleted, the new workers train at once, every example once per epoch), an `ExitCode` failure with code 1 (the job fails with the message), a
//! worker evicted through the API (recreated under `ExitCode` with `backoffLimit: 0`), `kubectl
//! delete tfjob` (every pod, Service and Secret of the job gone), `helm uninstall` (nothing of
//! the operator left). Prints a timeline of each job.
//!
//! No kubelet can run here; [`NodeAgent`] plays it with podman containers (see its module). The
//! same scenario for a real kind cluster is `tests/e2e/kind/run.sh`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::node_agent::{LABEL_POD, NodeAgent};
use tfjob_tests::operator::{eventually, repo_root};
use tfjob_tests::podman::{LABEL, Podman, PodmanService, build_images, release_bin_dir};
use tfjob_tests::report::ensure_linear;
use tfjob_tests::scene::{RELEASE, Scene, install_operator};

/// The operator (in its pod) read the job's progress from ps 0 into its status, and its
/// throughput autoscaler grew the job from 1 worker, with an `Autoscaled` event that has the
/// numbers; every example was still trained once per epoch.
fn assert_autoscaled(scene: &Scene, job: &str) -> Result<()> {
    let status = scene.json(&["get", "tfjob", job])?["status"].clone();
    let progress = &status["trainingProgress"];
    ensure!(progress["numEpochs"] == 250 && progress["examplesTrained"].as_i64().unwrap_or(0) > 0, "no progress read: {status}");
    ensure!(progress["lastUpdatedTime"].is_string() && status["autoscaler"]["replicas"].as_i64().unwrap_or(0) >= 1, "{status}");
    let events = scene.json(&["get", "events", "--field-selector", &format!("involvedObject.name={job},reason=Autoscaled")])?;
    let notes: Vec<String> =
        events["items"].as_array().into_iter().flatten().filter_map(|e| e["note"].as_str().or(e["message"].as_str()).map(String::from)).collect();
    ensure!(notes.iter().any(|n| n.starts_with("Worker 1 → 2: ")), "no Autoscaled event from 1 worker: {notes:?}\nstatus: {status}");
    let chief = scene.report(&format!("{job}-worker-0"))?;
    ensure!(chief["epochs_completed"].as_u64() == Some(250) && chief["examples_trained"].as_u64() == Some(250 * 20_000), "{chief}");
    Ok(())
}

fn examples() -> Result<Vec<(String, String)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("examples"))?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let name = f.file_stem().unwrap_or_default().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&f)?;
            // The example people scale by hand trains long enough for that (local_scale.rs runs
            // it as it is); here 80 epochs show it runs to its end on Kubernetes.
            let text = if name == "elastic-workers" { text.replace("--num_epochs=4000", "--num_epochs=80") } else { text };
            Ok((name, text))
        })
        .collect()
}

/// The jobs of the kind scenario (`tests/e2e/kind/`): sync linear regression long enough to
/// lose a worker mid-run, and a worker that exits 1 under the `ExitCode` policy.
const KILL_JOB: &str = "tests/e2e/kind/worker-restart.yaml";
const EXIT_ONE_JOB: &str = "tests/e2e/kind/exitcode-failure.yaml";
/// Elastic sync training long enough to be scaled 2 → 4 → 1 while it trains.
const SCALE_JOB: &str = "tests/e2e/kind/elastic-scale.yaml";

fn manifest(path: &str) -> Result<String> {
    std::fs::read_to_string(repo_root().join(path)).with_context(|| format!("reading {path}"))
}

#[test]
fn helm_install_kubectl_apply_train_and_clean_up() -> Result<()> {
    let started = Instant::now();
    let images = build_images(&release_bin_dir()?)?;
    eprint!("{}", images.log);
    let service = PodmanService::start()?;
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("e2e")?;
    let agent = NodeAgent::start(cp, &[&ns], &service.docker_host())?;
    let scene = Scene { cp, ns: ns.clone(), agent };
    eprintln!("control plane, images, node agent ready in {:.1}s", started.elapsed().as_secs_f64());

    // helm install: the operator runs from the chart's Deployment.
    let t = Instant::now();
    let operator_pod = install_operator(&scene, &[])?;
    eprintln!("helm install: operator pod {operator_pod} leads after {:.1}s", t.elapsed().as_secs_f64());

    // Every example, one after the other, but those that need what this control plane lacks:
    // shared-volume a ReadWriteMany volume (no storage provisioner, the node agent mounts no
    // claim), s3-checkpoints an S3 endpoint. `tfjob run` runs both (local_run.rs, object_storage.rs).
    // elastic-ps runs below, its PS count patched while it trains.
    for (name, manifest) in examples()?.into_iter().filter(|(name, _)| !matches!(name.as_str(), "shared-volume" | "s3-checkpoints" | "elastic-ps")) {
        let (mut tl, end) = scene.run_job(&name, &manifest, |_, _| Ok(true))?;
        ensure!(
            end == "Succeeded",
            "{name}: {end}: {:?}\nworker-0 log:\n{}",
            scene.condition(&name, "Failed")?,
            scene.agent.pod_log(&ns, &format!("{name}-worker-0"))
        );
        match name.as_str() {
            "linreg-async" | "linreg-sync" | "backup-workers" | "elastic-workers" | "classic-flags" => scene.assert_linear(&format!("{name}-worker-0"))?,
            "mnist-mlp" => ensure!(scene.report(&format!("{name}-worker-0"))?["accuracy"].as_f64().unwrap_or(0.0) > 0.5),
            "chief-evaluator" => ensure!(scene.report(&format!("{name}-chief-0"))?["accuracy"].as_f64().unwrap_or(0.0) > 0.5),
            "ctr-wide-deep" => ensure!(scene.report(&format!("{name}-worker-0"))?["auc"].as_f64().unwrap_or(0.0) > 0.85),
            "autoscale-throughput" => assert_autoscaled(&scene, &name)?,
            _ => {}
        }
        scene.delete_job(&name, &mut tl)?;
        tl.print();
    }

    // A worker container killed mid-run: restarted in place (OnFailure), the job succeeds. The
    // restart is observed while the job runs: once the job succeeds, cleanPodPolicy Running
    // deletes a worker-1 that is still running its last steps, so its pod may be gone by then.
    let (mut killed_at, mut restarted_at) = (None, None);
    let (mut tl, end) = scene.run_job("worker-restart", &manifest(KILL_JOB)?, |s, pods| {
        let worker_1 = pods.iter().find(|(n, _, _)| n == "worker-restart-worker-1");
        if killed_at.is_none() && worker_1.is_some_and(|(_, p, _)| p == "Running") && s.agent.pod_log(&s.ns, "worker-restart-worker-1").contains("local_step=")
        {
            s.agent.kill(&s.ns, "worker-restart-worker-1", "KILL")?;
            killed_at = Some(Instant::now());
        }
        if killed_at.is_some() && restarted_at.is_none() && worker_1.is_some_and(|(_, _, restarts)| *restarts >= 1) {
            restarted_at = Some(Instant::now());
        }
        Ok(restarted_at.is_some())
    })?;
    if let Some(at) = killed_at {
        tl.mark_at("worker-1 killed", at);
    }
    if let Some(at) = restarted_at {
        tl.mark_at("worker-1 restarted", at);
    }
    ensure!(killed_at.is_some(), "worker-1 was never killed");
    ensure!(end == "Succeeded", "worker-restart: {end}: {:?}", scene.condition("worker-restart", "Failed")?);
    ensure!(
        restarted_at.is_some(),
        "worker-1 was not seen restarted in place (restartCount >= 1) before the job ended: {:?}",
        scene.job_pods("worker-restart")?
    );
    scene.assert_linear("worker-restart-worker-0")?;
    scene.delete_job("worker-restart", &mut tl)?;
    tl.print();

    scale_a_training_job(&scene)?;
    scale_the_ps_of_a_training_job(&scene)?;
    evict_a_worker(&scene)?;

    // ExitCode policy, exit code 1: permanent, the job fails with the message.
    let (mut tl, end) = scene.run_job("exitcode-failure", &manifest(EXIT_ONE_JOB)?, |_, _| Ok(true))?;
    ensure!(end == "Failed", "exitcode-failure: {end}");
    let (reason, message) = scene.condition("exitcode-failure", "Failed")?.unwrap_or_default();
    ensure!(message.contains("1 Worker replica(s) failed"), "{reason}: {message}");
    let pods = scene.job_pods("exitcode-failure")?;
    ensure!(pods.iter().any(|(_, phase, _)| phase == "Failed"), "{pods:?}");
    ensure!(scene.agent.pod_log(&ns, "exitcode-failure-worker-0").contains("127.0.0.1:1"), "the worker said why");
    scene.delete_job("exitcode-failure", &mut tl)?;
    tl.print();

    // helm uninstall: nothing of the operator is left, its Lease included (the CRD stays: the
    // chart marks it helm.sh/resource-policy: keep).
    cp.helm_ok(["uninstall", RELEASE, "-n", &ns, "--wait", "--timeout", "90s"])?;
    eventually("nothing of the release is left", Duration::from_secs(90), || {
        let left = scene.kubectl(&[
            "get",
            "deployments,replicasets,pods,serviceaccounts,services,roles,rolebindings",
            "-l",
            "app.kubernetes.io/instance=tfjob-operator",
            "-o",
            "name",
        ])?;
        let cluster = cp.kubectl_ok(["get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=tfjob-operator", "-o", "name"])?;
        // The operator's Lease is part of the release.
        let lease = cp.kubectl(["get", "lease", RELEASE, "-n", &ns])?;
        let lease_gone = !lease.status.success() && String::from_utf8_lossy(&lease.stderr).contains("NotFound");
        Ok((left.trim().is_empty() && cluster.trim().is_empty() && lease_gone).then_some(()))
    })?;
    cp.kubectl_ok(["get", "crd", "tfjobs.kubeflow.org", "-o", "name"]).context("helm uninstall deleted the CRD")?;
    let Scene { mut agent, .. } = scene;
    agent.stop()?;
    let podman = Podman::setup()?;
    // Every container the agent ran carries its pod label and this process's test label.
    let filters = [format!("label={LABEL}={}", std::process::id()), format!("label={LABEL_POD}")];
    let left = podman.run_ok(["ps", "-a", "--filter", &filters[0], "--filter", &filters[1], "--format", "{{.Names}}"])?;
    ensure!(left.trim().is_empty(), "containers left: {left}");
    eprintln!("end to end in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Where the scaling scenario is.
#[derive(Debug, Default)]
struct Scaling {
    scaled_up: Option<Instant>,
    /// UIDs of the pods there before the scale: they must be the same pods after it.
    before: Vec<(String, String)>,
    created: Option<Instant>,
    first_gradient: Option<Instant>,
    scaled_down: Option<Instant>,
    deleted: Option<Instant>,
}

/// `kubectl scale` of a job that trains: 2 → 4 workers (only worker-2 and worker-3 are created,
/// and train at once), then 4 → 1 once worker-3 pushed its first gradient (worker-1..3 deleted,
/// the chief stays); nothing else is touched, each scale is a `Scaled` event, and the job still
/// trains every example once per epoch to `Succeeded`.
fn scale_a_training_job(scene: &Scene) -> Result<()> {
    const JOB: &str = "elastic-scale";
    let pod = |i: u32| format!("{JOB}-worker-{i}");
    let mut at = Scaling::default();
    // Longer than the kind run's 600 epochs: the scale-up is asked for at the
    // first gradient, and the new workers must push theirs (pods created,
    // containers started, the cluster joined: ~5 s here, 10 s and more on a
    // loaded machine) before the job ends. 1500 epochs lasted ~6 s once sync
    // steps got twice as fast, and a loaded CI run saw the job end first.
    const EPOCHS: u64 = 4000;
    let job = manifest(SCALE_JOB)?;
    ensure!(job.matches("--num_epochs=600").count() == 2, "{SCALE_JOB}: expected --num_epochs=600 on every replica");
    let job = job.replace("--num_epochs=600", &format!("--num_epochs={EPOCHS}"));
    let (mut tl, end) = scene.run_job(JOB, &job, |s, pods| {
        let names: Vec<&str> = pods.iter().map(|(n, _, _)| n.as_str()).collect();
        if at.scaled_up.is_none() && s.agent.pod_log(&s.ns, &pod(0)).contains("first gradient accepted") {
            at.before = s.pod_uids(JOB)?;
            s.kubectl(&["scale", &format!("tfjob/{JOB}"), "--replicas=4"])?;
            at.scaled_up = Some(Instant::now());
        }
        if at.scaled_up.is_some() && at.created.is_none() && names.contains(&pod(2).as_str()) && names.contains(&pod(3).as_str()) {
            at.created = Some(Instant::now());
        }
        if at.created.is_some()
            && at.scaled_down.is_none()
            && let Some(t) = s.agent.first_gradient(&s.ns, &pod(3))
        {
            at.first_gradient = Some(t);
            let now = s.pod_uids(JOB)?;
            for (name, uid) in &at.before {
                ensure!(now.iter().any(|(n, u)| n == name && u == uid), "{name} was replaced by the scale-up: {:?} → {now:?}", at.before);
            }
            s.kubectl(&["scale", &format!("tfjob/{JOB}"), "--replicas=1"])?;
            at.scaled_down = Some(Instant::now());
        }
        if at.scaled_down.is_some() && at.deleted.is_none() && !(1..4).any(|i| names.contains(&pod(i).as_str())) {
            ensure!(
                names.contains(&pod(0).as_str()) && names.contains(&format!("{JOB}-ps-0").as_str()),
                "the scale-down took more than workers 1-3: {names:?}"
            );
            at.deleted = Some(Instant::now());
        }
        Ok(at.deleted.is_some())
    })?;
    for (what, when) in [
        ("scaled 2→4", at.scaled_up),
        ("pods created", at.created),
        ("worker-3 first gradient", at.first_gradient),
        ("scaled 4→1", at.scaled_down),
        ("pods deleted", at.deleted),
    ] {
        let when = when.with_context(|| format!("{JOB}: never {what} ({end}): {at:?}; pods {:?}", scene.job_pods(JOB)))?;
        tl.mark_at(what, when);
    }
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let events =
        scene.kubectl(&["get", "events", "--field-selector", &format!("involvedObject.name={JOB},reason=Scaled"), "-o", "jsonpath={.items[*].message}"])?;
    for shown in ["Worker 2 → 4", "Worker 4 → 1"] {
        ensure!(events.contains(shown), "no Scaled event {shown:?}: {events}");
    }
    // Stopped on purpose (SIGTERM from the pod's deletion), the removed
    // workers deregistered: ps 0 heard it from each of them.
    let ps_log = scene.agent.pod_log(&scene.ns, &format!("{JOB}-ps-0"));
    for i in 1..4 {
        let log = scene.agent.pod_log(&scene.ns, &pod(i));
        ensure!(
            ps_log.contains(&format!("worker:{i} left (stopping on a signal)")),
            "{} did not deregister when its pod was deleted:\n{log}\nps-0 (leaves only):\n{}",
            pod(i),
            ps_log.lines().filter(|l| l.contains(" left ") || l.contains("training is over")).collect::<Vec<_>>().join("\n")
        );
    }
    let chief = scene.report(&pod(0))?;
    ensure!(chief["epochs_completed"].as_u64() == Some(EPOCHS) && chief["examples_trained"].as_u64() == Some(EPOCHS * 101), "{chief}");
    ensure_linear(&chief, JOB)?;
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

/// When each step of [`scale_the_ps_of_a_training_job`] was seen.
#[derive(Debug, Default)]
struct PsScaling {
    grown: Option<Instant>,
    /// UIDs of the pods there before the first patch: they must stay the same pods.
    before: Vec<(String, String)>,
    moved_up: Option<Instant>,
    shrunk: Option<Instant>,
    moved_down: Option<Instant>,
    deleted: Option<Instant>,
}

/// `kubectl patch` of the PS count of examples/elastic-ps.yaml while it trains: 1 → 2 once the
/// chief pushed its first gradient (only ps-1 is created, and the chief moves its part of the
/// state to it), then 2 → 1 once it did (ps-1 hands its part back to ps-0 before its pod goes);
/// no other pod is replaced, each patch is a `Scaled` event, and the job trains every example
/// once per epoch to `Succeeded`.
fn scale_the_ps_of_a_training_job(scene: &Scene) -> Result<()> {
    const JOB: &str = "elastic-ps";
    let (chief, ps1) = (format!("{JOB}-worker-0"), format!("{JOB}-ps-1"));
    let patch = |s: &Scene, n: u32| {
        let body = format!(r#"{{"spec":{{"tfReplicaSpecs":{{"PS":{{"replicas":{n}}}}}}}}}"#);
        s.kubectl(&["patch", "tfjob", JOB, "--type=merge", "-p", &body]).map(drop)
    };
    let unchanged = |s: &Scene, before: &[(String, String)]| -> Result<()> {
        let now = s.pod_uids(JOB)?;
        for (name, uid) in before {
            ensure!(now.iter().any(|(n, u)| n == name && u == uid), "{name} was replaced by a PS patch: {before:?} → {now:?}");
        }
        Ok(())
    };
    let mut at = PsScaling::default();
    let (mut tl, end) = scene.run_job(JOB, &manifest("examples/elastic-ps.yaml")?, |s, pods| {
        let log = s.agent.pod_log(&s.ns, &chief);
        if at.grown.is_none() && log.contains("first gradient accepted") {
            at.before = s.pod_uids(JOB)?;
            patch(s, 2)?;
            at.grown = Some(Instant::now());
        }
        if at.grown.is_some() && at.moved_up.is_none() && log.contains("moved the job's state from 1 to 2 ps task(s)") {
            at.moved_up = Some(Instant::now());
            unchanged(s, &at.before)?;
            patch(s, 1)?;
            at.shrunk = Some(Instant::now());
        }
        if at.shrunk.is_some() && at.moved_down.is_none() && log.contains("moved the job's state from 2 to 1 ps task(s)") {
            at.moved_down = Some(Instant::now());
        }
        if at.moved_down.is_some() && at.deleted.is_none() && !pods.iter().any(|(n, _, _)| *n == ps1) {
            unchanged(s, &at.before)?;
            at.deleted = Some(Instant::now());
        }
        Ok(at.deleted.is_some())
    })?;
    for (what, when) in
        [("PS 1→2", at.grown), ("moved to 2 ps", at.moved_up), ("PS 2→1", at.shrunk), ("moved to 1 ps", at.moved_down), ("ps-1 deleted", at.deleted)]
    {
        let when = when.with_context(|| format!("{JOB}: never {what} ({end}): {at:?}; pods {:?}", scene.job_pods(JOB)))?;
        tl.mark_at(what, when);
    }
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let events =
        scene.kubectl(&["get", "events", "--field-selector", &format!("involvedObject.name={JOB},reason=Scaled"), "-o", "jsonpath={.items[*].message}"])?;
    for shown in ["PS 1 → 2", "PS 2 → 1"] {
        ensure!(events.contains(shown), "no Scaled event {shown:?}: {events}");
    }
    let ps0 = scene.agent.pod_log(&scene.ns, &format!("{JOB}-ps-0"));
    ensure!(ps0.contains("ps:1 leaves"), "ps-1 did not ask to leave when its pod was deleted; ps-0:\n{ps0}");
    // TLS all along, each task with the certificate it made at start with the job's CA: also
    // ps-1, added while the job ran, which the others reached and moved state to.
    for ps in ["ps-0", "ps-1"] {
        let log = scene.agent.pod_log(&scene.ns, &format!("{JOB}-{ps}"));
        ensure!(
            log.contains("(TLS, peers need a certificate of the CA in --tls_ca /var/run/tfjob-rs/tls/ca.crt, job token checked)"),
            "{ps} not on TLS:\n{log}"
        );
    }
    let report = scene.report(&chief)?;
    ensure!(report["epochs_completed"].as_u64() == Some(10) && report["examples_trained"].as_u64() == Some(2_500_000), "{report}");
    ensure!(report["auc"].as_f64().unwrap_or(0.0) > 0.85, "{report}");
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

/// A worker of a sync job evicted through the Eviction API (as `kubectl drain` or a preemption
/// would stop it): the API server marks the pod `DisruptionTarget`, the node stops it, and the
/// operator recreates it, under `restartPolicy: ExitCode` with `backoffLimit: 0`: a pod the
/// cluster stopped is not a failure of the program, and does not count towards the limit. The
/// job trains every example once per epoch to `Succeeded`.
fn evict_a_worker(scene: &Scene) -> Result<()> {
    const JOB: &str = "evicted";
    // Enough for the recreated worker to be running before the job ends (as in
    // scale_a_training_job).
    const EPOCHS: u64 = 4000;
    let worker1 = format!("{JOB}-worker-1");
    let job = manifest(SCALE_JOB)?
        .replace("name: elastic-scale", &format!("name: {JOB}"))
        .replace("--num_epochs=600", &format!("--num_epochs={EPOCHS}"))
        .replace("restartPolicy: OnFailure", "restartPolicy: ExitCode")
        .replace("spec:\n  tfReplicaSpecs:", "spec:\n  runPolicy: {backoffLimit: 0}\n  tfReplicaSpecs:");
    ensure!(job.contains("backoffLimit: 0") && job.matches("restartPolicy: ExitCode").count() == 2, "{SCALE_JOB} changed shape:\n{job}");
    let (mut old_uid, mut evicted, mut recreated) = (None::<String>, None, None);
    let (mut tl, end) = scene.run_job(JOB, &job, |s, pods| {
        if evicted.is_none() && s.agent.pod_log(&s.ns, &format!("{JOB}-worker-0")).contains("first gradient accepted") {
            old_uid = s.pod_uids(JOB)?.into_iter().find(|(n, _)| *n == worker1).map(|(_, u)| u);
            let eviction = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": worker1, "namespace": s.ns}});
            let path = format!("/api/v1/namespaces/{}/pods/{worker1}/eviction", s.ns);
            s.cp.kubectl_stdin(["create", "--raw", &path, "-f", "-"], &eviction.to_string())?;
            evicted = Some(Instant::now());
        }
        if evicted.is_some() && recreated.is_none() {
            let now = s.pod_uids(JOB)?.into_iter().find(|(n, _)| *n == worker1).map(|(_, u)| u);
            if now.is_some() && now != old_uid && pods.iter().any(|(n, phase, _)| *n == worker1 && phase == "Running") {
                recreated = Some(Instant::now());
            }
        }
        Ok(recreated.is_some())
    })?;
    for (what, when) in [("evicted worker-1", evicted), ("worker-1 running again", recreated)] {
        tl.mark_at(what, when.with_context(|| format!("{JOB}: never {what} ({end}); pods {:?}", scene.job_pods(JOB)))?);
    }
    ensure!(end == "Succeeded", "{JOB}: {end}: {:?}", scene.condition(JOB, "Failed")?);
    let status = scene.json(&["get", "tfjob", JOB])?["status"].clone();
    ensure!(status["replicaStatuses"]["Worker"]["recreated"].is_null(), "an eviction counted towards backoffLimit: {status}");
    let chief = scene.report(&format!("{JOB}-worker-0"))?;
    ensure!(chief["epochs_completed"].as_u64() == Some(EPOCHS) && chief["examples_trained"].as_u64() == Some(EPOCHS * 101), "{chief}");
    scene.delete_job(JOB, &mut tl)?;
    tl.print();
    Ok(())
}

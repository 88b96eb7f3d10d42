//! `tests/e2e/kind/` (the end-to-end script for a real kind cluster) runs on these machines only
//! through `run-here.sh`, which builds a kind node image first (most of an hour the first time;
//! not part of the default test run). These cheap checks keep it from rotting: the scripts are
//! valid bash, the node image pins the control plane's Kubernetes release, the workflow and the kind config parse, every manifest the script applies exists and is a
//! valid TFJob, every example is applied, the images it builds are the ones the chart and the
//! manifests run, the labels it selects by are the operator's, and the operator's state machine
//! does what the script waits for. Nothing here needs Docker, kind, kubectl or helm.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tfjob_api::api::{self, ReplicaType, TFJob, TFJobStatus};
use tfjob_api::plan;
use tfjob_api::status::{self, Action, Observation, ObservedReplica, Phase};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn kind_dir() -> PathBuf {
    repo().join("tests/e2e/kind")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn script() -> Result<String> {
    read(&kind_dir().join("run.sh"))
}

fn yaml(path: &Path) -> Result<Value> {
    serde_saphyr::from_str(&read(path)?).with_context(|| format!("parsing {}", path.display()))
}

/// The value of the one `NAME=value` line of the script (quotes removed).
fn assignment(script: &str, name: &str) -> Result<String> {
    let prefix = format!("{name}=");
    let values: Vec<&str> = script.lines().filter_map(|l| l.strip_prefix(&prefix)).collect();
    ensure!(values.len() == 1, "run.sh: expected one line `{name}=...`, found {}", values.len());
    Ok(values[0].trim().trim_matches(['\'', '"']).to_string())
}

/// A manifest of the kind directory named by the script as `$here/<file>`.
fn kind_manifest(script: &str, name: &str) -> Result<PathBuf> {
    let value = assignment(script, name)?;
    let file = value.strip_prefix("$here/").with_context(|| format!("{name}={value}: expected $here/<file>"))?;
    Ok(kind_dir().join(file))
}

fn example_files() -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))?.map(|e| e.map(|e| e.path())).collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    Ok(files)
}

/// The one valid TFJob of a manifest file.
fn load_job(path: &Path) -> Result<TFJob> {
    let mut jobs = api::load_manifest(&read(path)?).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    ensure!(jobs.len() == 1, "{}: expected one TFJob", path.display());
    jobs.remove(0).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Every TFJob manifest the script applies: the examples and the three of tests/e2e/kind/.
fn applied_manifests(script: &str) -> Result<Vec<PathBuf>> {
    let mut files = example_files()?;
    files.push(kind_manifest(script, "RESTART_MANIFEST")?);
    files.push(kind_manifest(script, "FAILURE_MANIFEST")?);
    files.push(kind_manifest(script, "SCALE_MANIFEST")?);
    Ok(files)
}

/// `bash -n` (parse only) of a script of the kind directory.
fn check_bash_syntax(file: &str) -> Result<()> {
    let path = kind_dir().join(file);
    let out = Command::new("bash").arg("-n").arg(&path).output()?;
    ensure!(
        out.status.success() && out.stderr.is_empty(),
        "bash -n {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_script_is_valid_bash() -> Result<()> {
    check_bash_syntax("run.sh")?;
    let text = script()?;
    ensure!(text.contains("set -Eeuo pipefail"), "run.sh must stop at the first error");
    Ok(())
}

#[test]
fn the_scripts_that_run_it_here_are_valid_bash() -> Result<()> {
    for file in ["run-here.sh", "node-image/build.sh", "node-image/cni/tfjob-kind-cni.sh"] {
        check_bash_syntax(file)?;
    }
    Ok(())
}

/// The `k8s.io/kubernetes vX.Y.Z` require line of a go.mod.
fn kubernetes_pin(go_mod: &Path) -> Result<String> {
    let text = read(go_mod)?;
    let pins: Vec<&str> =
        text.lines().filter_map(|l| l.trim().strip_prefix("k8s.io/kubernetes ")).map(|rest| rest.split_whitespace().next().unwrap_or("")).collect();
    ensure!(pins.len() == 1, "{}: expected one k8s.io/kubernetes require line, found {pins:?}", go_mod.display());
    Ok(pins[0].to_string())
}

#[test]
fn the_node_image_runs_the_control_planes_kubernetes_release() -> Result<()> {
    let node = kubernetes_pin(&kind_dir().join("node-image/kubernetes/go.mod"))?;
    let control_plane = kubernetes_pin(&repo().join("tests/controlplane/go.mod"))?;
    ensure!(
        node == control_plane,
        "tests/e2e/kind/node-image/kubernetes/go.mod pins k8s.io/kubernetes {node}, tests/controlplane/go.mod {control_plane}: the node image reuses the control plane's kube-apiserver, so they must agree"
    );
    let build = read(&kind_dir().join("node-image/build.sh"))?;
    let pin_line = format!("KUBE_VERSION={node}");
    ensure!(build.lines().any(|l| l == pin_line), "node-image/build.sh must say {pin_line}");
    Ok(())
}

#[test]
fn the_workflow_runs_the_script_with_pinned_tools_and_keeps_its_dump() -> Result<()> {
    let path = repo().join(".github/workflows/e2e-kind.yml");
    let wf = yaml(&path)?;
    ensure!(wf.get("on").is_some(), "{}: no `on`", path.display());
    let job = wf["jobs"]["kind"].clone();
    ensure!(job["runs-on"] == "ubuntu-latest", "runs-on: {:?}", job["runs-on"]);
    let env = &job["env"];
    let kind = env["KIND_VERSION"].as_str().context("no KIND_VERSION")?;
    ensure!(kind.starts_with("v0.") && kind.split('.').count() == 3, "KIND_VERSION {kind}: pin a kind release");
    // The same helm as the test control plane.
    let build = read(&repo().join("tests/controlplane/build.sh"))?;
    let pinned = assignment(&build, "HELM_VERSION")?;
    ensure!(
        env["HELM_VERSION"].as_str() == Some(pinned.as_str()),
        "HELM_VERSION {:?} in the workflow, {pinned} in tests/controlplane/build.sh",
        env["HELM_VERSION"]
    );
    ensure!(env["KUBECTL_VERSION"].as_str().is_some_and(|v| v.starts_with("v1.")), "KUBECTL_VERSION: {:?}", env["KUBECTL_VERSION"]);

    let steps = job["steps"].as_array().context("no steps")?;
    let run = steps
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.trim() == "bash tests/e2e/kind/run.sh"))
        .context("no step runs `bash tests/e2e/kind/run.sh`")?;
    let artifacts = run["env"]["ARTIFACTS_DIR"].as_str().context("the run step sets no ARTIFACTS_DIR")?;
    let upload = steps.iter().find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact@"))).context("no upload-artifact step")?;
    ensure!(upload["if"] == "failure()", "upload only on failure: {:?}", upload["if"]);
    ensure!(upload["with"]["path"].as_str() == Some(artifacts), "the upload path {:?} is not the script's ARTIFACTS_DIR {artifacts}", upload["with"]["path"]);
    ensure!(script()?.contains("ARTIFACTS_DIR=${ARTIFACTS_DIR:-"), "run.sh must honour ARTIFACTS_DIR");
    Ok(())
}

#[test]
fn the_kind_config_parses() -> Result<()> {
    let text = script()?;
    ensure!(text.contains("--config \"$here/kind-config.yaml\""));
    let config = yaml(&kind_dir().join("kind-config.yaml"))?;
    ensure!(config["kind"] == "Cluster", "kind: {:?}", config["kind"]);
    ensure!(config["apiVersion"] == "kind.x-k8s.io/v1alpha4");
    let roles: Vec<&str> = config["nodes"].as_array().context("no nodes")?.iter().filter_map(|n| n["role"].as_str()).collect();
    ensure!(roles.contains(&"control-plane") && roles.contains(&"worker"), "nodes: {roles:?}");
    Ok(())
}

#[test]
fn the_script_applies_every_example_and_only_files_that_exist() -> Result<()> {
    let text = script()?;
    let list = assignment(&text, "EXAMPLES")?;
    let listed: Vec<&str> = list.strip_prefix('(').and_then(|l| l.strip_suffix(')')).context("EXAMPLES=(...) on one line")?.split_whitespace().collect();
    let listed_set: BTreeSet<&str> = listed.iter().copied().collect();
    ensure!(listed_set.len() == listed.len(), "EXAMPLES lists one twice: {listed:?}");
    let present: BTreeSet<String> = example_files()?.iter().filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned())).collect();
    let skipped: BTreeSet<String> = assignment(&text, "SKIPPED_EXAMPLES")?
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .context("SKIPPED_EXAMPLES=(...) on one line")?
        .split_whitespace()
        .map(String::from)
        .collect();
    let listed_set: BTreeSet<String> = listed_set.into_iter().map(String::from).collect();
    ensure!(listed_set.is_disjoint(&skipped), "run.sh both runs and skips {:?}", listed_set.intersection(&skipped).collect::<Vec<_>>());
    let all: BTreeSet<String> = listed_set.union(&skipped).cloned().collect();
    ensure!(all == present, "EXAMPLES and SKIPPED_EXAMPLES in run.sh {all:?} must be exactly examples/*.yaml {present:?}");
    // The script names each job by its manifest; the job names must be usable as given.
    for path in applied_manifests(&text)? {
        let job = load_job(&path)?;
        ensure!(!job.name().is_empty(), "{}: no name", path.display());
    }
    for dockerfile in ["operator/Dockerfile", "runtime/Dockerfile"] {
        ensure!(repo().join(dockerfile).is_file(), "no {dockerfile}");
        ensure!(text.contains(&format!("\"$repo/{dockerfile}\"")), "run.sh does not build {dockerfile}");
    }
    ensure!(repo().join("charts/tfjob-operator/Chart.yaml").is_file());
    ensure!(assignment(&text, "CHART")? == "$repo/charts/tfjob-operator");
    Ok(())
}

#[test]
fn the_images_it_builds_are_the_ones_the_chart_and_the_manifests_run() -> Result<()> {
    let text = script()?;
    let runtime_image = assignment(&text, "RUNTIME_IMAGE")?;
    for path in applied_manifests(&text)? {
        let doc = yaml(&path)?;
        let specs = doc["spec"]["tfReplicaSpecs"].as_object().with_context(|| format!("{}: no tfReplicaSpecs", path.display()))?;
        for (rtype, spec) in specs {
            let rtype = rtype.as_str();
            let containers = spec["template"]["spec"]["containers"].as_array().with_context(|| format!("{}: {rtype} has no containers", path.display()))?;
            for c in containers {
                ensure!(
                    c["image"].as_str() == Some(runtime_image.as_str()),
                    "{} {rtype}: image {:?}, but run.sh builds and loads {runtime_image}",
                    path.display(),
                    c["image"]
                );
                // `:latest` without a pull policy means Always: the kubelet would pull from a
                // registry instead of using the image `kind load` put on the node.
                let policy = c["imagePullPolicy"].as_str();
                ensure!(
                    matches!(policy, Some("IfNotPresent" | "Never")),
                    "{} {rtype}: imagePullPolicy {policy:?}: kind-loaded images need IfNotPresent",
                    path.display()
                );
            }
        }
    }

    let values = yaml(&repo().join("charts/tfjob-operator/values.yaml"))?;
    let repository = assignment(&text, "OPERATOR_REPOSITORY")?;
    ensure!(
        values["image"]["repository"].as_str() == Some(repository.as_str()),
        "the chart's image.repository {:?} is not run.sh's {repository}",
        values["image"]["repository"]
    );
    // The script builds the tag the chart renders by default (appVersion when tag is empty).
    ensure!(
        values["image"]["tag"] == "" && values["image"]["digest"] == "",
        "image.tag/digest are set in values.yaml: run.sh builds <repository>:<appVersion>"
    );
    ensure!(
        matches!(values["image"]["pullPolicy"].as_str(), Some("IfNotPresent" | "Never")),
        "the chart's image.pullPolicy must let a kind-loaded image be used"
    );
    Ok(())
}

#[test]
fn the_labels_it_selects_by_are_the_operators() -> Result<()> {
    let text = script()?;
    for (name, want) in [
        ("LABEL_JOB_NAME", plan::LABEL_JOB_NAME),
        ("LABEL_OPERATOR_NAME", plan::LABEL_OPERATOR_NAME),
        ("OPERATOR_NAME", plan::OPERATOR_NAME),
        ("LABEL_JOB_ROLE", plan::LABEL_JOB_ROLE),
    ] {
        ensure!(assignment(&text, name)? == want, "{name} in run.sh is not {want}");
    }
    ensure!(api::secret_name("$JOB") == "$JOB-token");
    ensure!(text.contains("\"secret/$JOB-token\""), "run.sh checks the job's Secret by name");
    ensure!(assignment(&text, "CRD")? == "tfjobs.kubeflow.org", "the CRD the script waits for");
    Ok(())
}

/// What the operator's state machine makes of `replicas` seen for a job with no status yet.
fn reconcile(job: &TFJob, replicas: &[ObservedReplica]) -> status::Outcome {
    let status = TFJobStatus::default();
    status::reconcile_status(&Observation {
        namespace: "default",
        name: job.name(),
        spec: &job.spec,
        status: &status,
        replicas,
        invalid: &[],
        now: Timestamp::now(),
    })
}

/// Replica `index` of type `rtype` of `job`, seen in `phase`.
fn seen(job: &TFJob, rtype: ReplicaType, index: i32, phase: Phase, exit_code: Option<i32>) -> ObservedReplica {
    ObservedReplica {
        replica_type: rtype,
        index,
        name: format!("{}-{}-{index}", job.name(), rtype.lower()),
        phase,
        exit_code,
        exit_reason: None,
        restart_count: 0,
        terminating: false,
        unschedulable: None,
        disrupted: false,
    }
}

/// The operator's state machine does what the script waits for: a missing worker pod is
/// created again, and exit code 1 under ExitCode fails the job with FAILURE_MESSAGE.
#[test]
fn the_operator_does_what_the_script_waits_for() -> Result<()> {
    let text = script()?;

    // worker-restart: sync training over 2 or more workers (so the steps wait for the deleted
    // worker 1), and the operator creates worker 1 again when its pod is gone.
    let path = kind_manifest(&text, "RESTART_MANIFEST")?;
    let job = load_job(&path)?;
    let specs = api::replica_specs(&job.spec);
    let workers = specs.get(&ReplicaType::Worker).context("no Worker")?;
    ensure!(workers.replicas >= 2, "{}: worker 1 must exist", path.display());
    let raw = read(&path)?;
    ensure!(raw.contains("--sync_replicas") && raw.contains("--model=linear"), "{}: sync linear training", path.display());
    let mut observed: Vec<ObservedReplica> =
        specs.iter().flat_map(|(t, rs)| (0..rs.replicas).map(move |i| (*t, i))).map(|(t, i)| seen(&job, t, i, Phase::Running, None)).collect();
    observed.retain(|r| !(r.replica_type == ReplicaType::Worker && r.index == 1));
    let out = reconcile(&job, &observed);
    ensure!(
        out.actions.contains(&Action::CreateReplica { replica_type: ReplicaType::Worker, index: 1 }),
        "a deleted worker 1 is not created again: {:?}",
        out.actions
    );

    // exitcode-failure: one worker, ExitCode; exit 1 is permanent.
    let path = kind_manifest(&text, "FAILURE_MANIFEST")?;
    let job = load_job(&path)?;
    let specs = api::replica_specs(&job.spec);
    ensure!(specs.len() == 1 && specs.get(&ReplicaType::Worker).is_some_and(|w| w.replicas == 1), "{}: one Worker and nothing else", path.display());
    ensure!(specs[&ReplicaType::Worker].restart_policy == api::RestartPolicy::ExitCode, "{}: restartPolicy ExitCode", path.display());
    let out = reconcile(&job, &[seen(&job, ReplicaType::Worker, 0, Phase::Failed, Some(1))]);
    let failed =
        out.status.conditions.iter().find(|c| c.type_ == status::FAILED && c.status == "True").context("exit code 1 under ExitCode did not fail the job")?;
    let message = failed.message.clone().unwrap_or_default();
    let expected = assignment(&text, "FAILURE_MESSAGE")?;
    ensure!(message.contains(&expected), "the Failed message {message:?} does not contain run.sh's FAILURE_MESSAGE {expected:?}");
    ensure!(
        !out.actions.iter().any(|a| matches!(a, Action::RecreateReplica { .. } | Action::CreateReplica { .. })),
        "a permanent failure must not be recreated: {:?}",
        out.actions
    );
    Ok(())
}

/// The scaling step: run.sh scales an elastic job with `kubectl scale` 2 → 4 → 1 and checks what
/// its chief reports; the manifest is such a job, and the operator creates and deletes exactly
/// the workers the script waits for.
#[test]
fn the_scaling_step_scales_an_elastic_job() -> Result<()> {
    let text = script()?;
    ensure!(!text.contains("SCALING STEP"), "run.sh still holds the placeholder of the scaling step");
    let calls: Vec<&str> = text.lines().map(str::trim).filter(|l| *l == "run_elastic_scale").collect();
    ensure!(calls.len() == 1, "run.sh must call run_elastic_scale once");
    for scale in ["--replicas=4", "--replicas=1"] {
        ensure!(
            text.lines().any(|l| l.contains("k scale ") && l.contains("\"tfjob/$JOB\"") && l.contains(scale)),
            "run.sh does not `kubectl scale tfjob/$JOB {scale}`"
        );
    }
    let path = kind_manifest(&text, "SCALE_MANIFEST")?;
    let raw = read(&path)?;
    let epochs: u64 = assignment(&text, "SCALE_EPOCHS")?.parse().context("SCALE_EPOCHS")?;
    for arg in ["--sync_replicas", "--replicas_to_aggregate=auto", "--model=linear", &format!("--num_epochs={epochs}")] {
        let lines_with = raw.lines().filter(|l| l.contains("args:") && l.contains(arg)).count();
        ensure!(lines_with == 2, "{}: ps and workers need {arg} (found in {lines_with} args)", path.display());
    }
    // The linear example's data: 101 points per epoch (runtime/src/data/synthetic.rs).
    ensure!(assignment(&text, "SCALE_EXAMPLES")? == "$((SCALE_EPOCHS * 101))");
    let job = load_job(&path)?;
    let specs = api::replica_specs(&job.spec);
    ensure!(specs.get(&ReplicaType::Worker).map(|w| w.replicas) == Some(2), "{}: 2 workers to start with", path.display());
    ensure!(!specs.contains_key(&ReplicaType::Chief), "{}: worker 0 is the chief", path.display());

    // What the operator does at each scale, from the state the script sees.
    let running = |job: &TFJob, workers: i32| -> Vec<ObservedReplica> {
        let mut r: Vec<ObservedReplica> = (0..workers).map(|i| seen(job, ReplicaType::Worker, i, Phase::Running, None)).collect();
        r.push(seen(job, ReplicaType::PS, 0, Phase::Running, None));
        r
    };
    let scaled_to = |n: i32| {
        let mut j = job.clone();
        if let Some(w) = j.spec.tf_replica_specs.get_mut("Worker") {
            w.replicas = n;
        }
        j
    };
    let up = scaled_to(4);
    let actions = reconcile(&up, &running(&up, 2)).actions;
    let created: Vec<i32> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateReplica { replica_type: ReplicaType::Worker, index } => Some(*index),
            _ => None,
        })
        .collect();
    ensure!(created == vec![2, 3], "2 → 4 creates workers 2 and 3 only: {actions:?}");
    let down = scaled_to(1);
    let actions = reconcile(&down, &running(&down, 4)).actions;
    let mut deleted: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteReplica { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    deleted.sort();
    let want: Vec<String> = (1..4).map(|i| format!("{}-worker-{i}", job.name())).collect();
    ensure!(deleted == want, "4 → 1 deletes workers 1-3 only: {actions:?}");
    Ok(())
}

/// run-here.sh is a CI job of its own (too slow for the default test run): the workflow parses,
/// runs the script as root with the build caches kept, and is started weekly and on demand.
#[test]
fn the_run_here_workflow_runs_run_here_sh() -> Result<()> {
    let path = repo().join(".github/workflows/e2e-kind-here.yml");
    let wf = yaml(&path)?;
    let on = &wf["on"];
    ensure!(!on["workflow_dispatch"].is_null() || on.as_object().is_some_and(|m| m.contains_key("workflow_dispatch")), "no workflow_dispatch");
    ensure!(on["schedule"].as_array().is_some_and(|s| !s.is_empty()), "no schedule");
    let steps = wf["jobs"]["kind-here"]["steps"].as_array().context("jobs.kind-here.steps")?;
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    ensure!(runs.iter().any(|r| r.contains("sudo") && r.trim_end().ends_with("bash tests/e2e/kind/run-here.sh")), "no step runs run-here.sh as root: {runs:?}");
    let cached = steps.iter().filter_map(|s| s["with"]["path"].as_str()).collect::<String>();
    for dir in ["~/.cache/tfjob-rs/controlplane", "~/.cache/tfjob-rs/kind-node"] {
        ensure!(cached.contains(dir), "the workflow does not keep {dir} between runs");
    }
    ensure!(wf["jobs"]["kind-here"]["timeout-minutes"].as_u64().is_some_and(|t| t >= 90), "a first node-image build takes most of an hour");
    Ok(())
}

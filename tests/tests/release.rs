//! Ready to install: what can be checked here of a release that runs on GitHub only.
//!
//! - `.github/workflows/release.yml` parses, runs on version tags, builds both images for
//!   linux/amd64 and linux/arm64 under exactly the names the chart's default values and the
//!   examples run, and its version check accepts this tree's tag and refuses another.
//! - `deploy/tfjob-operator.yaml` (the plain install manifest) is the chart rendered with the
//!   test control plane's helm, and `kubectl apply --server-side` installs it.
//! - The chart's NOTES render without placeholders.
//! - Beside Kubeflow: `helm install` refuses a TFJob CRD that the chart did not install, and
//!   says what to do; with `besideKubeflow=true` it installs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tfjob_tests::chart::chart_dir;
use tfjob_tests::controlplane::ControlPlane;

/// The registry path of the published images (the workflow's `REGISTRY`).
const REGISTRY: &str = "ghcr.io/tfjob-rs";
/// Release name and namespace of the install manifest.
const RELEASE: &str = "tfjob-operator";
const RELEASE_NS: &str = "tfjob-system";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn yaml(path: &Path) -> Result<Value> {
    serde_saphyr::from_str(&read(path)?).with_context(|| format!("parsing {}", path.display()))
}

fn chart_versions() -> Result<(String, String)> {
    let chart = yaml(&chart_dir().join("Chart.yaml"))?;
    let s = |k: &str| chart[k].as_str().map(str::to_string).context(format!("Chart.yaml {k}"));
    Ok((s("version")?, s("appVersion")?))
}

fn workspace_version() -> Result<String> {
    let text = read(&repo().join("Cargo.toml"))?;
    let section = text.split("[workspace.package]").nth(1).context("no [workspace.package]")?;
    section.lines().find_map(|l| l.strip_prefix("version = ")).map(|v| v.trim_matches('"').to_string()).context("no workspace version")
}

/// Every container image of every manifest under examples/.
fn example_images() -> Result<BTreeSet<String>> {
    let mut images = BTreeSet::new();
    let mut dirs = vec![repo().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                for doc in tfjob_tests::chart::documents(&read(&path)?)? {
                    for spec in doc["spec"]["tfReplicaSpecs"].as_object().into_iter().flatten() {
                        for c in spec.1["template"]["spec"]["containers"].as_array().into_iter().flatten() {
                            images.insert(c["image"].as_str().unwrap_or_default().to_string());
                        }
                    }
                }
            }
        }
    }
    Ok(images)
}

fn workflow() -> Result<Value> {
    yaml(&repo().join(".github/workflows/release.yml"))
}

#[test]
fn versions_agree() -> Result<()> {
    let (chart, app) = chart_versions()?;
    let cargo = workspace_version()?;
    ensure!(chart == app && app == cargo, "Chart.yaml {chart}/{app}, Cargo.toml {cargo}");
    Ok(())
}

#[test]
fn the_release_builds_the_images_the_chart_and_the_examples_run() -> Result<()> {
    let wf = workflow()?;
    ensure!(wf["on"]["push"]["tags"] == serde_json::json!(["v*"]), "triggers: {}", wf["on"]);
    ensure!(wf["env"]["REGISTRY"] == REGISTRY, "REGISTRY {}", wf["env"]["REGISTRY"]);
    let (_, version) = chart_versions()?;
    let images = &wf["jobs"]["images"];
    let build = images["steps"]
        .as_array()
        .context("no steps")?
        .iter()
        .find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("docker/build-push-action")))
        .context("no docker/build-push-action step")?;
    let platforms: BTreeSet<&str> = build["with"]["platforms"].as_str().unwrap_or("").split(',').collect();
    ensure!(platforms == BTreeSet::from(["linux/amd64", "linux/arm64"]), "platforms {platforms:?}");
    ensure!(images["steps"].as_array().unwrap().iter().any(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("docker/setup-buildx-action"))), "no buildx");
    let mut built = BTreeSet::new();
    for entry in images["strategy"]["matrix"]["include"].as_array().context("no matrix")? {
        let (image, dockerfile) = (entry["image"].as_str().unwrap(), entry["dockerfile"].as_str().unwrap());
        ensure!(repo().join(dockerfile).is_file(), "{dockerfile} does not exist");
        let tag = build["with"]["tags"]
            .as_str()
            .unwrap()
            .replace("${{ env.REGISTRY }}", REGISTRY)
            .replace("${{ matrix.image }}", image)
            .replace("${{ needs.version.outputs.version }}", &version);
        built.insert(tag);
    }
    let values = yaml(&chart_dir().join("values.yaml"))?;
    ensure!(values["image"]["tag"] == "", "the chart's image tag is pinned: {}", values["image"]["tag"]);
    let operator = format!("{}:{version}", values["image"]["repository"].as_str().unwrap());
    let mut used = example_images()?;
    ensure!(used.len() == 1, "the examples run several images: {used:?}");
    used.insert(operator);
    ensure!(built == used, "the release builds {built:?}, the chart and the examples run {used:?}");
    // The chart job packages this chart and attaches the files it names.
    let chart_job = serde_json::to_string(&wf["jobs"]["chart"])?;
    ensure!(chart_job.contains("helm package charts/tfjob-operator"));
    for file in ["deploy/tfjob-operator.yaml", "crds/tfjob.yaml"] {
        ensure!(chart_job.contains(file) && repo().join(file).is_file(), "{file}");
    }
    Ok(())
}

/// The `tfjob` command is built and attached to the release for Linux and macOS (it builds off
/// Linux: `cargo check --target x86_64-apple-darwin -p tfjob`, see README), from the
/// release profile.
#[test]
fn the_release_attaches_tfjob_for_linux_and_macos() -> Result<()> {
    let wf = workflow()?;
    let cli = &wf["jobs"]["cli"];
    let targets: BTreeSet<&str> =
        cli["strategy"]["matrix"]["include"].as_array().context("no cli matrix")?.iter().filter_map(|e| e["target"].as_str()).collect();
    for os in ["unknown-linux-gnu", "apple-darwin"] {
        for arch in ["x86_64", "aarch64"] {
            let target = format!("{arch}-{os}");
            ensure!(targets.contains(target.as_str()), "the release does not build tfjob for {target}: {targets:?}");
        }
    }
    let build = serde_json::to_string(&cli["steps"])?;
    for needle in ["cargo build --release --locked -p tfjob --bin tfjob --target ${{ matrix.target }}", "upload-artifact"] {
        ensure!(build.contains(needle), "the cli job has no {needle:?}: {build}");
    }
    let chart_job = serde_json::to_string(&wf["jobs"]["chart"])?;
    ensure!(chart_job.contains("download-artifact") && chart_job.contains("dist/cli/*.tar.gz"), "{chart_job}");
    ensure!(wf["jobs"]["chart"]["needs"].as_array().is_some_and(|n| n.iter().any(|j| j == "cli")), "the release does not wait for the cli job");
    Ok(())
}

/// Release binaries carry no symbol table: the workspace's release profile strips them, and
/// what ships (the images' Dockerfiles, the workflow's `tfjob` archives) is built with that
/// profile as it is. A `--config profile.release.package.<crate>...` override (tests/run.sh's
/// test profile) makes cargo fall back to stripping debuginfo only for that crate, so the binaries
/// of a test run are no witness; README says how the stripped build was checked.
#[test]
fn release_binaries_are_stripped() -> Result<()> {
    let cargo = read(&repo().join("Cargo.toml"))?;
    let release = cargo.split("[profile.release]").nth(1).context("no [profile.release]")?;
    let release = release.split("\n[").next().unwrap_or_default();
    ensure!(release.lines().any(|l| matches!(l.trim(), "strip = true" | r#"strip = "symbols""#)), "[profile.release] does not strip symbols:{release}");
    let wf = serde_json::to_string(&workflow()?["jobs"]["cli"]["steps"])?;
    for (what, text) in [
        ("operator/Dockerfile", read(&repo().join("operator/Dockerfile"))?),
        ("runtime/Dockerfile", read(&repo().join("runtime/Dockerfile"))?),
        (".github/workflows/release.yml (cli)", wf),
    ] {
        let builds: Vec<&str> = text.split("cargo build").skip(1).map(|b| b.lines().next().unwrap_or_default()).collect();
        ensure!(!builds.is_empty(), "{what} has no cargo build");
        for b in builds {
            ensure!(
                b.contains("--release") && !b.contains("--config") && !b.contains("--profile"),
                "{what}: `cargo build{b}` does not build with the release profile as it is"
            );
        }
    }
    Ok(())
}

/// The workflow's version check, run as the runner would: this tree's tag passes, another fails.
#[test]
fn the_release_version_check_accepts_only_this_trees_tag() -> Result<()> {
    let wf = workflow()?;
    let script = wf["jobs"]["version"]["steps"]
        .as_array()
        .context("no steps")?
        .iter()
        .find_map(|s| (s["id"] == "version").then(|| s["run"].as_str()).flatten())
        .context("no version step")?
        .to_string();
    let (_, version) = chart_versions()?;
    let out_dir = tempfile::tempdir()?;
    let run = |tag: &str| -> Result<(bool, String)> {
        let output = out_dir.path().join("output");
        let o = Command::new("bash")
            .args(["-c", &script])
            .current_dir(repo())
            .env("GITHUB_REF_NAME", tag)
            .env("GITHUB_OUTPUT", &output)
            .env("REGISTRY", REGISTRY)
            .output()?;
        Ok((o.status.success(), std::fs::read_to_string(&output).unwrap_or_default()))
    };
    let (ok, out) = run(&format!("v{version}"))?;
    ensure!(ok && out.trim() == format!("version={version}"), "{out}");
    let (ok, _) = run("v99.0.0")?;
    ensure!(!ok, "the check accepted a tag that is not the version");
    Ok(())
}

/// `deploy/tfjob-operator.yaml`: the namespace, then `helm template` of the chart with its
/// default values (the CRD included: it is one of the chart's templates).
fn rendered_install_manifest(cp: &ControlPlane) -> Result<String> {
    let chart = cp.helm_ok(["template", RELEASE, &chart_dir().display().to_string(), "--namespace", RELEASE_NS])?;
    Ok(format!(
        "# The tfjob-operator chart with its default values, for `kubectl apply --server-side -f`\n\
         # (no Helm needed). Generated from charts/tfjob-operator; tests/tests/release.rs fails when\n\
         # it drifts and says how to regenerate it.\n\
         ---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {RELEASE_NS}\n{chart}"
    ))
}

#[test]
fn the_install_manifest_is_the_chart_rendered_and_installs() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let want = rendered_install_manifest(cp)?;
    let path = repo().join("deploy/tfjob-operator.yaml");
    if read(&path).ok().as_deref() != Some(want.as_str()) {
        let fresh = std::env::temp_dir().join("tfjob-operator.yaml");
        std::fs::write(&fresh, &want)?;
        anyhow::bail!("{} is not the chart rendered; regenerate it: cp {} {}", path.display(), fresh.display(), path.display());
    }
    cp.kubectl_ok(["apply", "--server-side", "-f", &path.display().to_string()])?;
    let deployment = cp.kubectl_ok(["get", "deployment", "-n", RELEASE_NS, RELEASE, "-o", "json"])?;
    let d: Value = serde_json::from_str(&deployment)?;
    let (_, version) = chart_versions()?;
    ensure!(d["spec"]["template"]["spec"]["containers"][0]["image"] == format!("{REGISTRY}/tfjob-operator:{version}"), "{d}");
    Ok(())
}

#[test]
fn the_notes_have_no_placeholders() -> Result<()> {
    let cp = ControlPlane::shared()?;
    for set in ["besideKubeflow=false", "besideKubeflow=true"] {
        let out = cp.helm_ok(["install", "notes", &chart_dir().display().to_string(), "--dry-run=client", "--namespace", "n", "--set", set])?;
        let notes = out.split("NOTES:").nth(1).context("no NOTES")?;
        ensure!(!notes.contains('<') && !notes.contains("TODO"), "placeholder in NOTES:\n{notes}");
        ensure!(notes.contains("kubectl apply") && notes.contains("raw.githubusercontent.com/tfjob-rs/tfjob-rs/v"), "{notes}");
    }
    Ok(())
}

/// Removes every CEL rule (`x-kubernetes-validations`) of a schema that names `field`.
fn drop_rules_naming(schema: &mut Value, field: &str) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Array(rules)) = map.get_mut("x-kubernetes-validations") {
                rules.retain(|r| !r["rule"].as_str().is_some_and(|r| r.contains(field)));
                if rules.is_empty() {
                    map.remove("x-kubernetes-validations");
                }
            }
            map.values_mut().for_each(|v| drop_rules_naming(v, field));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| drop_rules_naming(v, field)),
        _ => {}
    }
}

/// What helm would change of the CRD: its spec (the generation) and its
/// labels and annotations (an adopted release's). Not the resourceVersion:
/// the API server's own status writes (Established, storedVersions) bump it
/// after the apply, at any time.
fn foreign_crd_state(cp: &ControlPlane) -> Result<String> {
    cp.kubectl_ok([
        "get",
        "crd",
        "tfjobs.kubeflow.org",
        "-o",
        "jsonpath=generation {.metadata.generation}, labels {.metadata.labels}, annotations {.metadata.annotations}",
    ])
}

/// A TFJob CRD that the chart did not install (Kubeflow's, here: this project's schema without
/// its label, applied by another field manager) stops `helm install` before Helm applies
/// anything, and says what to do; beside Kubeflow the chart needs `spec.runPolicy.managedBy` in
/// that CRD (with this operator's value where it lists values), then installs and leaves the CRD
/// as it was. A control plane of its own: the CRD is cluster-wide.
#[test]
fn helm_install_refuses_a_foreign_tfjob_crd_unless_beside_kubeflow() -> Result<()> {
    let cp = ControlPlane::start()?;
    let theirs = |edit: &dyn Fn(&mut Value)| -> Result<String> {
        let mut crd: Value = serde_saphyr::from_str(&read(&repo().join("crds/tfjob.yaml"))?)?;
        crd["metadata"] = serde_json::json!({"name": "tfjobs.kubeflow.org", "labels": {"app.kubernetes.io/name": "training-operator"}});
        edit(&mut crd);
        cp.kubectl_stdin(["apply", "--server-side", "--force-conflicts", "--field-manager=training-operator", "-f", "-"], &crd.to_string())?;
        foreign_crd_state(&cp)
    };
    let run_policy = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/runPolicy/properties";
    let unchanged = |version: &str| -> Result<()> {
        let now = foreign_crd_state(&cp)?;
        ensure!(now == version, "helm changed the foreign CRD ({version} -> {now})");
        Ok(())
    };
    cp.kubectl_ok(["create", "namespace", RELEASE_NS])?;
    let chart = chart_dir().display().to_string();
    let install = |beside: bool| cp.helm(["install", RELEASE, &chart, "--namespace", RELEASE_NS, "--set", &format!("besideKubeflow={beside}")]);
    let refused = |beside: bool, needles: &[&str]| -> Result<()> {
        let out = install(beside)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success(), "helm install (besideKubeflow={beside}) accepted the foreign CRD");
        for needle in needles {
            ensure!(stderr.contains(needle), "no {needle:?} in: {stderr}");
        }
        Ok(())
    };

    let version = theirs(&|_| {})?;
    refused(
        false,
        &[
            "tfjobs.kubeflow.org",
            "did not install",
            "training-operator",
            "besideKubeflow=true",
            "managedBy: tfjob-rs.io/operator",
            "kubectl apply --server-side --force-conflicts",
        ],
    )?;
    unchanged(&version)?;

    // Kubeflow's CRD before training-operator v1.9: no managedBy at all.
    let version = theirs(&|crd| {
        crd.pointer_mut(run_policy).and_then(Value::as_object_mut).map(|p| p.remove("managedBy"));
        drop_rules_naming(crd, "managedBy");
    })?;
    refused(true, &["besideKubeflow=true", "has no spec.runPolicy.managedBy", "v1.9"])?;
    unchanged(&version)?;
    // managedBy limited to values that are not this operator's.
    let version = theirs(&|crd| {
        if let Some(m) = crd.pointer_mut(&format!("{run_policy}/managedBy")) {
            m["enum"] = serde_json::json!(["kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"]);
        }
    })?;
    refused(true, &["allows spec.runPolicy.managedBy only in", "not tfjob-rs.io/operator"])?;
    unchanged(&version)?;

    // With managedBy that allows this operator's value: installed beside it, the CRD untouched.
    let version = theirs(&|_| {})?;
    let out = install(true)?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let notes = String::from_utf8_lossy(&out.stdout);
    ensure!(notes.contains("is the other operator's") && notes.contains("kubectl patch --local"), "{notes}");
    let env = cp.kubectl_ok(["get", "deployment", "-n", RELEASE_NS, RELEASE, "-o", "jsonpath={.spec.template.spec.containers[0].env}"])?;
    ensure!(env.contains(r#"{"name":"TFJOB_BESIDE_KUBEFLOW","value":"true"}"#), "{env}");
    unchanged(&version)?;
    Ok(())
}

/// The CRD in the chart's templates: created by the first release on a cluster without one (kept
/// by `helm uninstall`), left alone by a release when it came otherwise (`kubectl apply`).
#[test]
fn helm_installs_the_crd_once_and_keeps_it() -> Result<()> {
    let cp = ControlPlane::start()?;
    let chart = chart_dir().display().to_string();
    cp.kubectl_ok(["create", "namespace", RELEASE_NS])?;
    let crd = |path: &str| cp.kubectl_ok(["get", "crd", "tfjobs.kubeflow.org", "-o", &format!("jsonpath={path}")]);
    let notes = cp.helm_ok(["install", RELEASE, &chart, "--namespace", RELEASE_NS])?;
    ensure!(notes.contains("belongs to this release"), "{notes}");
    ensure!(crd("{.metadata.annotations.meta\\.helm\\.sh/release-name}")? == RELEASE);
    let notes = cp.helm_ok(["upgrade", RELEASE, &chart, "--namespace", RELEASE_NS])?;
    ensure!(notes.contains("belongs to this release"), "{notes}");
    let uninstalled = cp.helm_ok(["uninstall", RELEASE, "--namespace", RELEASE_NS])?;
    ensure!(crd("{.metadata.name}")? == "tfjobs.kubeflow.org", "helm uninstall deleted the CRD: {uninstalled}");

    // Installed with kubectl: another release leaves it as it is. On a cluster of its own, not by
    // deleting this one's CRD: once in CI, deleted 3 s after helm had written it, the CRD stayed
    // terminating for 5 minutes (kube-apiserver's CRD finalizer logged one failure, "storage is
    // (re)initializing", and nothing more until it finished).
    drop(cp);
    let cp = ControlPlane::start()?;
    let crd = |path: &str| cp.kubectl_ok(["get", "crd", "tfjobs.kubeflow.org", "-o", &format!("jsonpath={path}")]);
    cp.kubectl_ok(["create", "namespace", RELEASE_NS])?;
    cp.kubectl_ok(["apply", "--server-side", "-f", &repo().join("crds/tfjob.yaml").display().to_string()])?;
    // Its spec (the generation), labels and annotations: not the resourceVersion, which the API
    // server's own CRD controllers move when they write its status (once in CI, a loaded
    // machine's controllers wrote it after this read).
    let what_helm_would_change = "{.metadata.generation} {.metadata.labels} {.metadata.annotations}";
    let before = crd(what_helm_would_change)?;
    let notes = cp.helm_ok(["install", "other", &chart, "--namespace", RELEASE_NS])?;
    ensure!(notes.contains("installed without this release") && notes.contains("kubectl apply --server-side -f https://"), "{notes}");
    let after = crd(what_helm_would_change)?;
    ensure!(after == before, "helm changed a CRD it did not install: {before} → {after}");
    Ok(())
}

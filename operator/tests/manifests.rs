//! `tfjob validate`, `tfjob render` and `tfjob crd` on hand-written Kubeflow-style manifests,
//! on every manifest in the repository's `examples/`, and the CRD drift check.

use std::path::{Path, PathBuf};
use std::process::Command;

use tfjob_operator::api::{self, ManifestError};
use tfjob_operator::cli::{self, RenderArgs};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> =
        rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))).collect();
    files.sort();
    files
}

fn tfjob() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tfjob"))
}

fn render_args() -> RenderArgs {
    RenderArgs { file: PathBuf::from("-"), namespace: "default".into(), cluster_domain: None, gang_scheduler: None }
}

/// Renders and checks the invariants every rendered job must satisfy.
fn check_render(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let out = cli::render_text(&text, &path.display().to_string(), &render_args()).unwrap_or_else(|e| panic!("{}: render failed: {e}", path.display()));
    let jobs: Vec<_> = api::load_manifest(&text).unwrap().into_iter().map(|j| j.unwrap()).collect();
    let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&out).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect();
    let pods: Vec<_> = docs.iter().filter(|d| d["kind"] == "Pod").collect();
    let expected_pods: i32 = jobs.iter().map(|j| tfjob_operator::plan::total_replicas(&j.spec)).sum();
    assert_eq!(pods.len() as i32, expected_pods, "{}", path.display());
    assert_eq!(docs.iter().filter(|d| d["kind"] == "Service").count(), jobs.len());
    assert_eq!(docs.iter().filter(|d| d["kind"] == "Secret").count(), jobs.len());
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        assert!(name.len() <= 63, "{name}");
        assert_eq!(pod["spec"]["hostname"], name);
        let containers = pod["spec"]["containers"].as_array().unwrap();
        let tf = containers.iter().find(|c| c["name"] == "tensorflow").unwrap();
        let env = tf["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "TFJOB_TOKEN"), "{name}");
        if let Some(cfg) = env.iter().find(|e| e["name"] == "TF_CONFIG") {
            let cfg: serde_json::Value = serde_json::from_str(cfg["value"].as_str().unwrap()).unwrap();
            assert_eq!(cfg["environment"], "cloud");
            let task_type = cfg["task"]["type"].as_str().unwrap();
            assert!(name.contains(&format!("-{task_type}-")), "{name}: {cfg}");
        }
    }
}

#[test]
fn valid_fixtures_validate_and_render() {
    let files = yaml_files(&manifest_dir().join("tests/fixtures/valid"));
    assert!(files.len() >= 5);
    for f in &files {
        let problems = cli::validate_files(std::slice::from_ref(f));
        assert!(problems.is_empty(), "{}: {problems:#?}", f.display());
        check_render(f);
    }
}

#[test]
fn invalid_fixtures_report_every_expected_field() {
    let files = yaml_files(&manifest_dir().join("tests/fixtures/invalid"));
    assert!(files.len() >= 6);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let expected: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# expect: ")).collect();
        assert!(!expected.is_empty(), "{}: no expectations", f.display());
        let docs = api::load_manifest(&text).unwrap();
        let mut fields = Vec::new();
        for d in docs {
            match d {
                Err(ManifestError::Invalid { errors, .. }) => fields.extend(errors.0.into_iter().map(|e| e.field)),
                other => panic!("{}: expected invalid, got {other:?}", f.display()),
            }
        }
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        want.dedup();
        let mut got = fields.clone();
        got.sort();
        got.dedup();
        assert_eq!(got, want, "{}", f.display());
        assert!(cli::render_text(&text, "x", &render_args()).is_err());
    }
}

/// Every manifest in `examples/` must validate and render (passes when there are none).
#[test]
fn examples_validate_and_render() {
    let examples = manifest_dir().join("../examples");
    for f in yaml_files(&examples) {
        let problems = cli::validate_files(std::slice::from_ref(&f));
        assert!(problems.is_empty(), "{}: {problems:#?}", f.display());
        check_render(&f);
    }
}

#[test]
fn crd_file_matches_the_rust_types() {
    let path = manifest_dir().join("../crds/tfjob.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(on_disk == cli::crd_yaml(), "crds/tfjob.yaml is out of date; regenerate it with `cargo run -p tfjob-operator -- crd > crds/tfjob.yaml`");
}

#[test]
fn cli_validate_exit_codes_and_messages() {
    let valid = manifest_dir().join("tests/fixtures/valid/dist-mnist.yaml");
    let out = tfjob().arg("validate").arg(&valid).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let invalid = manifest_dir().join("tests/fixtures/invalid/bad-enums-and-name.yaml");
    let out = tfjob().arg("validate").arg(&valid).arg(&invalid).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for field in
        ["metadata.name", "spec.successPolicy", "spec.runPolicy.cleanPodPolicy", "spec.tfReplicaSpecs.Worker.restartPolicy", "spec.tfReplicaSpecs.Driver"]
    {
        assert!(stderr.contains(field), "missing {field} in {stderr}");
    }
    assert!(stderr.contains("8 problem(s) found"), "{stderr}");

    let out = tfjob().arg("validate").arg("/nonexistent/job.yaml").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/job.yaml"));

    let not_yaml = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_yaml.path(), "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap();
    let out = tfjob().arg("validate").arg(not_yaml.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected apiVersion kubeflow.org/v1 and kind TFJob"));
}

#[test]
fn cli_render_and_crd() {
    let f = manifest_dir().join("tests/fixtures/valid/lowercase-keys.yaml");
    let out = tfjob().args(["render", "--namespace", "team", "--cluster-domain", "cluster.local"]).arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(
        r#"{"cluster":{"ps":["linear-ps-0.linear.team.svc.cluster.local:2222"],"worker":["linear-worker-0.linear.team.svc.cluster.local:2222","linear-worker-1.linear.team.svc.cluster.local:2222"]},"environment":"cloud","task":{"index":1,"type":"worker"}}"#
    ), "{text}");
    assert!(text.contains("publishNotReadyAddresses: true"));

    let out = tfjob().arg("crd").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), cli::crd_yaml());

    let bad = manifest_dir().join("tests/fixtures/invalid/only-ps.yaml");
    let out = tfjob().arg("render").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must contain a Chief, a Master or a Worker"));
}

#[test]
fn operator_flags_have_env_fallbacks_and_fail_clearly_without_a_cluster() {
    let out = tfjob().args(["operator", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for env in
        ["TFJOB_NAMESPACE", "TFJOB_CONCURRENCY", "TFJOB_CLUSTER_DOMAIN", "TFJOB_METRICS_ADDR", "TFJOB_LOG_LEVEL", "TFJOB_LOG_FORMAT", "TFJOB_GANG_SCHEDULER"]
    {
        assert!(help.contains(env), "{env} missing from:\n{help}");
    }
    let home = tempfile::tempdir().unwrap();
    let out = tfjob()
        .args(["operator", "--metrics-addr", "127.0.0.1:0"])
        .env("HOME", home.path())
        .env("KUBECONFIG", home.path().join("missing-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot connect to Kubernetes"), "{stderr}");
}

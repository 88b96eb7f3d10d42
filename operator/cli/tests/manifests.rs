//! `tfjob validate`, `tfjob render` and `tfjob crd` on hand-written Kubeflow-style manifests,
//! and on every manifest in the repository's `examples/` (the CRD drift check is tfjob-api's,
//! `operator/api/tests/crd.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;

use tfjob::cli::{self, RenderArgs};
use tfjob_api::api::{self, ManifestError};

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
    RenderArgs {
        file: PathBuf::from("-"),
        namespace: "default".into(),
        cluster_domain: None,
        gang_scheduler: None,
        output: cli::Output::Yaml,
        network_policy: false,
    }
}

/// Renders and checks the invariants every rendered job must satisfy.
fn check_render(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let out = cli::render_text(&text, &path.display().to_string(), &render_args()).unwrap_or_else(|e| panic!("{}: render failed: {e}", path.display()));
    let jobs: Vec<_> = api::load_manifest(&text).unwrap().into_iter().map(|j| j.unwrap()).collect();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out).unwrap();
    let pods: Vec<_> = docs.iter().filter(|d| d["kind"] == "Pod").collect();
    let expected_pods: i32 = jobs.iter().map(|j| tfjob_api::plan::total_replicas(&j.spec)).sum();
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
    let examples = manifest_dir().join("../../examples");
    for f in yaml_files(&examples) {
        let problems = cli::validate_files(std::slice::from_ref(&f));
        assert!(problems.is_empty(), "{}: {problems:#?}", f.display());
        check_render(&f);
    }
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
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let pod =
        docs.iter().find(|d| d["kind"] == "Pod" && d["metadata"]["name"] == "linear-worker-1").unwrap_or_else(|| panic!("no pod linear-worker-1 in\n{text}"));
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    let tf_config = env.iter().find(|e| e["name"] == "TF_CONFIG").unwrap();
    assert_eq!(
        tf_config["value"],
        r#"{"cluster":{"ps":["linear-ps-0.linear.team.svc.cluster.local:2222"],"worker":["linear-worker-0.linear.team.svc.cluster.local:2222","linear-worker-1.linear.team.svc.cluster.local:2222"]},"environment":"cloud","task":{"index":1,"type":"worker"}}"#,
        "{text}"
    );
    let service = docs.iter().find(|d| d["kind"] == "Service").unwrap();
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true, "{text}");
    assert!(!docs.iter().any(|d| d["kind"] == "NetworkPolicy"), "{text}");
    // With --network-policy (before the file: it takes no value but `=false`) the job's
    // NetworkPolicy too.
    let out = tfjob().args(["render", "--network-policy"]).arg(&f).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("kind: NetworkPolicy"), "{text}");

    let out = tfjob().arg("crd").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), tfjob_api::crd::crd_yaml());

    let bad = manifest_dir().join("tests/fixtures/invalid/only-ps.yaml");
    let out = tfjob().arg("render").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must contain a Chief, a Master or a Worker"));
}

#[test]
fn operator_flags_have_env_fallbacks_and_fail_clearly_without_a_cluster() {
    let out = tfjob().args(["operator", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for env in [
        "TFJOB_NAMESPACE",
        "TFJOB_CONCURRENCY",
        "TFJOB_RECONCILE_TIMEOUT",
        "TFJOB_CLUSTER_DOMAIN",
        "TFJOB_METRICS_ADDR",
        "TFJOB_LOG_LEVEL",
        "TFJOB_LOG_FORMAT",
        "TFJOB_GANG_SCHEDULER",
        "TFJOB_NETWORK_POLICY",
    ] {
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

/// `tfjob operator` logs without terminal colour codes when stderr is not a terminal (as under
/// `kubectl logs`): here stderr is a pipe, and the operator stops at once (no cluster).
#[test]
fn operator_logs_carry_no_colour_codes_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = tfjob()
        .args(["operator", "--metrics-addr", "127.0.0.1:0", "--log-level", "debug"])
        .env("HOME", dir.path())
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("tfjob operator starting"), "{stderr}");
    assert!(stderr.contains("cannot connect to Kubernetes"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes in {stderr:?}");
    assert!(out.stdout.is_empty(), "logs belong on stderr: {:?}", out.stdout);
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    for (shell, needle) in [("bash", "complete -F _tfjob"), ("zsh", "#compdef tfjob"), ("fish", "complete -c tfjob")] {
        let out = tfjob().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(needle), "{shell}: no {needle:?} in\n{script}");
        for sub in ["validate", "render", "logs", "status", "scale"] {
            assert!(script.contains(sub), "{shell}: no subcommand {sub}");
        }
    }
    let out = tfjob().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));

    // `tfjob run --backend <TAB>` offers the backends, not file names.
    let out = tfjob().args(["completions", "bash"]).output().unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    let backend = script.split("--backend)").nth(1).and_then(|rest| rest.split(";;").next()).expect("a case for --backend");
    assert!(backend.contains("compgen -W \"process container\""), "--backend completes with {backend}");
    let out = tfjob().args(["run", "--backend", "vm", "job.yaml"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && stderr.contains("[possible values: process, container]"), "{stderr}");
}

/// `-o json|yaml`: the same data in either format, parsed back here.
#[test]
fn data_commands_print_json_or_yaml() {
    let valid = manifest_dir().join("tests/fixtures/valid/lowercase-keys.yaml");
    let invalid = manifest_dir().join("tests/fixtures/invalid/only-ps.yaml");
    let parse = |format: &str, bytes: &[u8]| -> serde_json::Value {
        let text = String::from_utf8_lossy(bytes);
        match format {
            "json" => serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
            _ => serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        }
    };
    for format in ["json", "yaml"] {
        let out = tfjob().args(["validate", "-o", format]).arg(&valid).arg(&invalid).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{format}");
        let results = parse(format, &out.stdout);
        assert_eq!(results[0]["valid"], true, "{results}");
        assert_eq!(results[0]["problems"], serde_json::json!([]));
        assert_eq!(results[1]["valid"], false, "{results}");
        assert!(results[1]["problems"][0].as_str().unwrap().contains("must contain a Chief, a Master or a Worker"), "{results}");

        let out = tfjob().args(["render", "-o", format]).arg(&valid).output().unwrap();
        assert!(out.status.success(), "{format}");
        let kinds: Vec<String> = if format == "json" {
            let list = parse(format, &out.stdout);
            assert_eq!(list["kind"], "List");
            list["items"].as_array().unwrap().iter().map(|i| i["kind"].as_str().unwrap().to_string()).collect()
        } else {
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
            docs.iter().map(|i| i["kind"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(kinds, ["Secret", "Service", "Pod", "Pod", "Pod"], "{format}");

        let out = tfjob().args(["crd", "-o", format]).output().unwrap();
        let crd = parse(format, &out.stdout);
        assert_eq!(crd["metadata"]["name"], "tfjobs.kubeflow.org");
    }
}

/// A run directory as `tfjob run` leaves it: replica logs, status.yaml, and the job's
/// `.latest` pointer under `<TMPDIR>/tfjob-runs`.
fn fake_run(tmp: &Path, job: &str) -> PathBuf {
    let runs = tmp.join("tfjob-runs");
    let dir = runs.join(format!("{job}-1"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ps-0.log"), "ps up\nps done\n").unwrap();
    std::fs::write(dir.join("worker-0.log"), "step 1\nstep 2\n").unwrap();
    std::fs::write(dir.join("status.yaml"), "status:\n  conditions:\n  - type: Succeeded\n    status: \"True\"\n").unwrap();
    std::os::unix::fs::symlink(&dir, runs.join(format!("{job}.latest"))).unwrap();
    dir
}

#[test]
fn status_and_logs_of_a_run_by_directory_or_job_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fake_run(tmp.path(), "linear");
    let run = |args: &[&str]| tfjob().args(args).env("TMPDIR", tmp.path()).output().unwrap();
    let dir_arg = dir.to_str().unwrap();
    for target in [dir_arg, "linear"] {
        let out = run(&["status", target, "-o", "json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(status["status"]["conditions"][0]["type"], "Succeeded");

        let out = run(&["logs", target]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "[ps-0] ps up\n[ps-0] ps done\n[worker-0] step 1\n[worker-0] step 2\n");
        let out = run(&["logs", target, "worker-0"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "step 1\nstep 2\n");
    }
    let out = run(&["logs", "linear", "worker-9"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no log of replica worker-9") && stderr.contains("ps-0, worker-0"), "{stderr}");
    let out = run(&["logs", "other-job"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run of TFJob other-job"));
}

/// `tfjob logs -f` prints lines as replicas write them, a replica that starts later included,
/// and ends when the run ends (its control socket goes).
#[test]
fn logs_follow_a_running_job_until_it_ends() {
    use std::io::{BufRead, BufReader, Write};
    let tmp = tempfile::tempdir().unwrap();
    let dir = fake_run(tmp.path(), "linear");
    std::fs::write(dir.join("control.sock"), "").unwrap();
    let mut child = tfjob().args(["logs", "linear", "-f"]).env("TMPDIR", tmp.path()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    let first: Vec<String> = (0..4).map(|_| next()).collect();
    assert_eq!(first[3], "[worker-0] step 2");
    let mut log = std::fs::OpenOptions::new().append(true).open(dir.join("worker-0.log")).unwrap();
    write!(log, "step 3\nstep").unwrap();
    log.flush().unwrap();
    assert_eq!(next(), "[worker-0] step 3");
    std::fs::write(dir.join("worker-1.log"), "joined\n").unwrap();
    assert_eq!(next(), "[worker-1] joined");
    // The partial line completes, the run ends: the rest is printed and `logs -f` exits.
    writeln!(log, " 4").unwrap();
    std::fs::remove_file(dir.join("control.sock")).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    assert_eq!(next(), "[worker-0] step 4");
}

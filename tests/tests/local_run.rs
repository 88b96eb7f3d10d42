//! `tfjob run`: every example trains to `Succeeded` on one machine, with
//! the restart, exit-code, deadline and interruption behaviour of the
//! cluster, and bad input starts nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use tfjob_tests::local::{eventually_none_left, job, kill_9, marked_replicas, marker_env, replica, tfjob, write};
use tfjob_tests::operator::repo_root;
use tfjob_tests::report::{ensure_linear, final_report, final_step_of_ps};

/// Runs `tfjob run FILE` with a run directory of its own.
fn run(manifest: &Path, extra: &[&str]) -> Result<(Output, PathBuf)> {
    let run_dir = tempfile::tempdir()?.keep();
    let out = Command::new(tfjob()?)
        .arg("run")
        .arg(manifest)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .context("running tfjob run")?;
    Ok((out, run_dir))
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The final JSON report a replica printed, from its saved log.
fn report(run_dir: &Path, replica: &str) -> Value {
    final_report(&std::fs::read_to_string(run_dir.join(format!("{replica}.log"))).unwrap_or_default(), replica).unwrap()
}

/// A copy of `manifest` in `dir` with every `--num_epochs=` set to `epochs`.
fn with_epochs(manifest: &Path, epochs: u64, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(manifest)?;
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("--num_epochs=") {
        let value_at = at + "--num_epochs=".len();
        let digits = rest[value_at..].chars().take_while(char::is_ascii_digit).count();
        out.push_str(&rest[..value_at]);
        out.push_str(&epochs.to_string());
        rest = &rest[value_at + digits..];
    }
    out.push_str(rest);
    anyhow::ensure!(out != text || text.contains(&format!("--num_epochs={epochs}")), "{}: no --num_epochs to set", manifest.display());
    Ok(write(dir, &manifest.file_name().unwrap_or_default().to_string_lossy(), &out))
}

fn status_yaml(run_dir: &Path) -> String {
    std::fs::read_to_string(run_dir.join("status.yaml")).unwrap_or_default()
}

fn assert_linear(run_dir: &Path, replica: &str) {
    ensure_linear(&report(run_dir, replica), replica).unwrap();
}

#[test]
fn every_example_succeeds() -> Result<()> {
    let examples = repo_root().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&examples)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    assert!(files.len() >= 6, "examples: {files:?}");
    for file in files {
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        if name == "s3-checkpoints" {
            // It needs an S3 endpoint: tests/tests/object_storage.rs runs it under `tfjob run`
            // with the S3 server it starts (and kills its ps mid-run).
            eprintln!("{name}: run by object_storage.rs with its S3 server");
            continue;
        }
        let started = Instant::now();
        // The examples people scale by hand run long enough for that; local_scale.rs runs them as
        // they are. Here they train fewer epochs (80 of elastic-workers, 1 of elastic-ps).
        let short = tempfile::tempdir()?;
        let file = match name.as_str() {
            "elastic-workers" => with_epochs(&file, 80, short.path())?,
            "elastic-ps" => with_epochs(&file, 1, short.path())?,
            // local_run.rs's own test runs it long enough for the autoscaler to grow the job.
            "autoscale-throughput" => with_epochs(&file, 40, short.path())?,
            _ => file,
        };
        let (out, run_dir) = run(&file, &["--quiet"])?;
        assert!(out.status.success(), "{name}: {}", text(&out));
        // Off a terminal neither `tfjob run` nor a replica writes terminal escape codes.
        assert!(!text(&out).contains('\u{1b}'), "{name}: escape codes in {}", text(&out));
        for log in std::fs::read_dir(&run_dir)?.map(|e| e.map(|e| e.path())) {
            let log = log?;
            if log.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&log)?;
                assert!(!text.contains('\u{1b}'), "escape codes in {}", log.display());
                // Every replica ends with its JSON line, those stopped at the job's end too.
                let replica = log.file_stem().unwrap_or_default().to_string_lossy().to_string();
                if let Err(e) = final_report(&text, &replica) {
                    panic!("{name}: {e:#}");
                }
            }
        }
        let status = status_yaml(&run_dir);
        assert!(status.contains("type: Succeeded"), "{name}: {status}");
        // A replica that fails for good must not restart forever: every example bounds it.
        assert!(std::fs::read_to_string(&file)?.contains("backoffLimit:"), "{name}: no runPolicy.backoffLimit");
        match name.as_str() {
            "linreg-async" | "linreg-sync" | "backup-workers" => {
                assert_linear(&run_dir, "worker-0");
                assert!(report(&run_dir, "worker-0")["global_step"].as_i64().unwrap() >= 4000);
            }
            "classic-flags" => {
                // The runtime as a TF 1.x script: the cluster from the flags the manifest builds
                // from TFJOB_* with $(VAR), not from TF_CONFIG.
                assert_linear(&run_dir, "worker-0");
                assert!(report(&run_dir, "worker-0")["global_step"].as_i64().unwrap() >= 4000);
                let log = std::fs::read_to_string(run_dir.join("worker-1.log"))?;
                assert!(log.contains("worker:1: cluster from the classic flags") && log.contains("TF_CONFIG is set and ignored"), "{log}");
            }
            "elastic-workers" => {
                // 80 epochs of the 101 points, every one trained once per epoch.
                assert_linear(&run_dir, "worker-0");
                let r = report(&run_dir, "worker-0");
                assert_eq!((r["epochs_completed"].as_u64(), r["examples_trained"].as_u64()), (Some(80), Some(8080)), "{r}");
            }
            "mnist-mlp" => {
                let r = report(&run_dir, "worker-0");
                assert!(r["accuracy"].as_f64().unwrap() > 0.5, "{r}");
                let log = std::fs::read_to_string(run_dir.join("worker-0.log"))?;
                assert!(log.contains("no --data_dir given"), "says that it falls back to synthetic data");
            }
            "ctr-wide-deep" => {
                // Generated data: the AUC the true model reaches is about 0.91.
                let r = report(&run_dir, "worker-0");
                assert!(r["auc"].as_f64().unwrap() > 0.85 && r["log_loss"].as_f64().is_some(), "{r}");
                let log = std::fs::read_to_string(run_dir.join("worker-0.log"))?;
                assert!(log.contains("no --train_files given"), "says that it generates its data");
            }
            "autoscale-throughput" => {
                let r = report(&run_dir, "worker-0");
                assert_eq!((r["epochs_completed"].as_u64(), r["examples_trained"].as_u64()), (Some(40), Some(40 * 20_000)), "{r}");
                // The progress read from ps 0 is in the status, as the operator writes it.
                assert!(status.contains("trainingProgress:") && status.contains("numEpochs: 40"), "{status}");
            }
            "elastic-ps" => {
                let r = report(&run_dir, "worker-0");
                assert_eq!((r["epochs_completed"].as_u64(), r["examples_trained"].as_u64()), (Some(1), Some(250_000)), "{r}");
                assert!(r["auc"].as_f64().unwrap() > 0.85, "{r}");
            }
            "chief-evaluator" => {
                assert!(report(&run_dir, "chief-0")["accuracy"].as_f64().unwrap() > 0.5);
                let log = std::fs::read_to_string(run_dir.join("evaluator-0.log"))?;
                assert!(log.contains("eval_accuracy="), "{log}");
                assert_final_evaluation(&run_dir);
            }
            "shared-volume" => {
                // The claim is one directory of the run, shared by chief, ps and evaluator.
                let claim = run_dir.join("volumes/claims/tfjob-shared/shared-volume");
                assert!(claim.join("checkpoints/ckpt-0000001200/index.json").is_file(), "the last checkpoint, index included");
                assert!(claim.join("checkpoints/ckpt-0000001200/shard-00000-of-00001.safetensors").is_file());
                for events in [claim.join("logs"), claim.join("logs/eval")] {
                    let found = std::fs::read_dir(&events)?.flatten().any(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents."));
                    assert!(found, "no event file in {}", events.display());
                }
                assert_final_evaluation(&run_dir);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(stderr.contains(&format!("tensorboard --logdir {}", claim.join("logs").display())), "{stderr}");
                assert!(stderr.contains("metrics on http://127.0.0.1:"), "each replica its own metrics port: {stderr}");
            }
            _ => {}
        }
        assert!(run_dir.join("training.png").is_file(), "{name}: no picture of training");
        eprintln!("{name}: succeeded in {:.1}s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `elasticPolicy.autoscale: Throughput` under `tfjob run`: a job that starts with 1 worker
/// tries a second one, keeps climbing while a step up pays, and stays within its bounds without
/// going back and forth; its
/// decisions are events with their numbers, its state and progress are in `status.yaml`, and
/// the shard dispatcher still hands every example out once per epoch while workers come.
#[test]
fn the_throughput_autoscaler_grows_a_job_and_settles() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // The autoscaler makes no change the job would not live to measure (settle + measure
    // seconds), so the job must outlast a step's measurement on any machine: on a quiet fast one,
    // 150 epochs at the example's 6 + 8 s ended (24 s, 126k examples/s) before it dared 1 → 2.
    // Shorter windows here, and a job long enough for two of them where the machine is fast.
    let epochs = 200;
    let file = with_epochs(&repo_root().join("examples/autoscale-throughput.yaml"), epochs, dir.path())?;
    let manifest = std::fs::read_to_string(&file)?;
    ensure!(manifest.contains("settleSeconds: 6") && manifest.contains("measureSeconds: 8"), "the example's autoscaler windows changed");
    std::fs::write(&file, manifest.replace("settleSeconds: 6", "settleSeconds: 3").replace("measureSeconds: 8", "measureSeconds: 4"))?;
    let (out, run_dir) = run(&file, &["--quiet"])?;
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    // 1 → 2 pays on any machine with two cores: the job grows.
    assert!(shown.contains("tfjob: event Autoscaled: Worker 1 → 2: "), "{shown}");
    assert!(shown.contains("tfjob: event Scaled: Worker 1 → 2"), "{shown}");
    // Each change is measured: a step up names the rates before and after.
    let steps: Vec<&str> = shown.lines().filter(|l| l.starts_with("tfjob: event Autoscaled: ")).collect();
    for step in steps.iter().skip(1) {
        assert!(step.contains(" examples/s at ") && step.contains("perfect scaling +"), "{step}");
    }
    // No back and forth within the cooldown (120 s): at most up, up, ..., one step back.
    let backs = steps.iter().filter(|l| l.contains("did not pay")).count();
    assert!(backs <= 1, "{steps:#?}");
    // Where it settles depends on the machine's load (tests run side by side: a second worker
    // on two busy cores may add too little and be given back), not on luck: it ends where its
    // last decision put it, within the bounds, above 1 unless a step up did not pay.
    let status = status_yaml(&run_dir);
    let state: Value = serde_saphyr::from_str::<Value>(&status)?["status"]["autoscaler"].clone();
    let workers = state["replicas"].as_i64().context("status.autoscaler.replicas")?;
    assert!((1..=6).contains(&workers) && (workers >= 2 || backs == 1), "{steps:#?}\n{status}");
    let last = steps.last().context("no decision")?;
    assert!(last.contains(&format!(" → {workers}: ")), "the last decision {last:?} is not where it ended ({workers})");
    assert!(status.contains("trainingProgress:") && status.contains(&format!("numEpochs: {epochs}")), "{status}");
    // Every example trained once per epoch, whatever the workers did.
    let r = report(&run_dir, "worker-0");
    assert_eq!((r["epochs_completed"].as_u64(), r["examples_trained"].as_u64()), (Some(epochs), Some(epochs * 20_000)), "{r}");
    Ok(())
}

/// The evaluator evaluated the final variables before the job ended, and exited 0 by itself.
fn assert_final_evaluation(run_dir: &Path) {
    let evaluator = report(run_dir, "evaluator-0");
    let last = final_step_of_ps(&std::fs::read_to_string(run_dir.join("ps-0.log")).unwrap_or_default(), "ps-0").unwrap();
    assert_eq!(evaluator["global_step"].as_i64(), Some(last), "the evaluator saw the last step: {evaluator}");
    let log = std::fs::read_to_string(run_dir.join("evaluator-0.log")).unwrap_or_default();
    assert!(log.contains("final evaluation at global_step="), "{log}");
}

/// The process backend expands `$(VAR)` in env values, command and args as the kubelet does:
/// the classic values of every replica reach its argv.
#[test]
fn kubelet_expansion_reaches_the_process() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cmd = r#"["sh", "-c", "echo \"args: $*\"; echo \"flags: $FLAGS\"; echo \"tf_config: $TF_CONFIG\"", "sh"]"#;
    let args = r#"["--ps_hosts=$(TFJOB_PS_HOSTS)", "--worker_hosts=$(TFJOB_WORKER_HOSTS)", "--job_name=$(TFJOB_JOB_NAME)", "--task_index=$(TFJOB_TASK_INDEX)", "$$(TFJOB_JOB_NAME)", "$(NOT_SET)"]"#;
    // TF_CONFIG is defined after the manifest's env: FLAGS cannot refer to it.
    let env = r#"[{name: FLAGS, value: "--ps=$(TFJOB_PS_HOSTS) $(TF_CONFIG)"}]"#;
    let manifest =
        write(dir.path(), "expand.yaml", &job("expand", "", &[replica("PS", 1, "Never", cmd, args, env), replica("Worker", 1, "Never", cmd, args, env)]));
    let (out, run_dir) = run(&manifest, &["--quiet"])?;
    assert!(out.status.success(), "{}", text(&out));
    for (replica, job_name) in [("worker-0", "worker"), ("ps-0", "ps")] {
        let log = std::fs::read_to_string(run_dir.join(format!("{replica}.log")))?;
        let line = |prefix: &str| {
            log.lines().find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.to_string())).unwrap_or_else(|| panic!("{replica}: no {prefix:?} in {log}"))
        };
        let cfg: Value = serde_json::from_str(&line("tf_config: "))?;
        let (ps, worker) = (cfg["cluster"]["ps"][0].as_str().unwrap(), cfg["cluster"]["worker"][0].as_str().unwrap());
        assert_eq!(
            line("args: "),
            format!("--ps_hosts={ps} --worker_hosts={worker} --job_name={job_name} --task_index=0 $(TFJOB_JOB_NAME) $(NOT_SET)"),
            "{replica}"
        );
        assert_eq!(line("flags: "), format!("--ps={ps} $(TF_CONFIG)"), "{replica}");
    }
    Ok(())
}

/// A worker killed mid-run under OnFailure is restarted and the job still
/// succeeds.
#[test]
fn killed_worker_is_restarted_under_on_failure() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (marker, env) = marker_env();
    let args = r#"["--model=linear", "--sync_replicas", "--train_steps=20000", "--log_every_steps=1000"]"#;
    let cmd = r#"["tfjob-runtime"]"#;
    let manifest = write(
        dir.path(),
        "onfailure.yaml",
        &job("onfailure", "", &[replica("PS", 1, "OnFailure", cmd, args, &env), replica("Worker", 2, "OnFailure", cmd, args, &env)]),
    );
    let run_dir = dir.path().join("run");
    let mut child = Command::new(tfjob()?)
        .args(["run", "--quiet", "--run-dir"])
        .arg(&run_dir)
        .arg(&manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // Wait for worker 1 to be training, then SIGKILL it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        let log = std::fs::read_to_string(run_dir.join("worker-1.log")).unwrap_or_default();
        if log.contains("local_step=1000 ")
            && let Some((pid, _)) = marked_replicas(&marker).get(&("worker".to_string(), 1))
        {
            break *pid;
        }
        assert!(Instant::now() < deadline, "worker-1 never trained");
        std::thread::sleep(Duration::from_millis(50));
    };
    kill_9(victim);
    let status = child.wait()?;
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)?;
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("worker-1 exited with code 137; restarting in place"), "{stderr}");
    assert!(status_yaml(&run_dir).contains("type: Succeeded"));
    assert_linear(&run_dir, "worker-0");
    assert!(marked_replicas(&marker).is_empty(), "processes left behind");
    Ok(())
}

/// Under ExitCode, exit code 1 fails the job with the message; 137
/// recreates the replica and the job goes on.
#[test]
fn exit_code_policy() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sh = r#"["sh", "-c"]"#;
    // Exit 1: a permanent error. The replica leaves a background process holding its output
    // open: it ends with the replica (as a container's processes end with its main one), and
    // the error line is shown all the same.
    let (marker, env) = marker_env();
    let permanent = write(
        dir.path(),
        "permanent.yaml",
        &job("permanent", "", &[replica("Worker", 1, "ExitCode", sh, r#"["sleep 300 & echo error: bad configuration >&2; exit 1"]"#, &env)]),
    );
    let started = Instant::now();
    let (out, run_dir) = run(&permanent, &[])?;
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(marked_replicas(&marker).is_empty(), "the replica's background process was left behind");
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed with exit code 1; its last error: error: bad configuration"), "{}", text(&out));
    let status = status_yaml(&run_dir);
    assert!(status.contains("type: Failed"), "{status}");
    assert!(status.contains("has failed because 1 Worker replica(s) failed"), "{status}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("[worker-0] error: bad configuration"), "{}", text(&out));
    // 137 the first time (killed), 0 the second: recreated, then succeeded.
    let mark = dir.path().join("killed-once");
    // `$$$$`: args are expanded as the kubelet does, where `$$` is an escaped `$`.
    let script = format!(r#"["if [ ! -e {0} ]; then touch {0}; kill -9 $$$$; fi; echo second run; exit 0"]"#, mark.display());
    let transient = write(dir.path(), "transient.yaml", &job("transient", "", &[replica("Worker", 1, "ExitCode", sh, &script, "[]")]));
    let (out, run_dir) = run(&transient, &[])?;
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed with exit code 137"), "{stderr}");
    assert!(stderr.contains("TFJobRestarting"), "{stderr}");
    let status = status_yaml(&run_dir);
    assert!(status.contains("type: Succeeded") && status.contains("recreated: 1"), "{status}");
    Ok(())
}

/// activeDeadlineSeconds fails a job that runs too long, on time.
#[test]
fn deadline_fails_a_long_job() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let manifest = write(
        dir.path(),
        "deadline.yaml",
        &job("deadline", "  runPolicy:\n    activeDeadlineSeconds: 2\n", &[replica("Worker", 1, "Never", r#"["sleep"]"#, r#"["60"]"#, "[]")]),
    );
    let started = Instant::now();
    let (out, run_dir) = run(&manifest, &[])?;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(took < Duration::from_secs(10), "the deadline fired after {took:?}");
    assert!(took >= Duration::from_secs(2), "too early: {took:?}");
    assert!(status_yaml(&run_dir).contains("active longer than specified deadline"));
    Ok(())
}

/// Ctrl-C (SIGINT) stops every replica; no process remains, and the status
/// left behind says the run was interrupted (not Running).
#[test]
fn ctrl_c_leaves_no_process_and_an_interrupted_status() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (marker, env) = marker_env();
    let args = r#"["--model=linear", "--train_steps=100000000", "--log_every_steps=1000"]"#;
    let cmd = r#"["tfjob-runtime"]"#;
    let manifest =
        write(dir.path(), "long.yaml", &job("long", "", &[replica("PS", 1, "OnFailure", cmd, args, &env), replica("Worker", 2, "OnFailure", cmd, args, &env)]));
    let run_dir = dir.path().join("run");
    let child = Command::new(tfjob()?)
        .args(["run", "--quiet", "--run-dir"])
        .arg(&run_dir)
        .arg(&manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while marked_replicas(&marker).len() < 3 || !status_yaml(&run_dir).contains("type: Running") {
        assert!(Instant::now() < deadline, "the replicas never started: {}", status_yaml(&run_dir));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) of the tfjob process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    eventually_none_left(&marker);
    let status: serde_json::Value = serde_saphyr::from_str(&status_yaml(&run_dir))?;
    let conditions = status["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let last = conditions.last().cloned().unwrap_or_default();
    assert_eq!((last["type"].as_str(), last["status"].as_str(), last["reason"].as_str()), (Some("Failed"), Some("True"), Some("Interrupted")), "{status}");
    assert!(last["message"].as_str().is_some_and(|m| m.contains("Ctrl-C")), "{status}");
    assert!(!conditions.iter().any(|c| c["type"] == "Running" && c["status"] == "True"), "still Running: {status}");
    assert!(status["status"]["completionTime"].is_string(), "{status}");
    assert!(stderr.contains("Interrupted"), "the console says so: {stderr}");
    let shown = Command::new(tfjob()?).args(["status"]).arg(&run_dir).output()?;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("Interrupted") && shown.contains("Failed"), "tfjob status: {shown}");
    Ok(())
}

/// A replica that fails for good (a bad flag: exit 2) under `OnFailure` says why at each
/// restart, even with `--quiet`, and the job's `backoffLimit` ends the restarts.
#[test]
fn a_failing_replica_says_why_and_backoff_limit_ends_the_restarts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (marker, env) = marker_env();
    let cmd = r#"["tfjob-runtime"]"#;
    let ok = r#"["--model=linear", "--train_steps=100000000"]"#;
    let bad = r#"["--model=linear", "--batch_size=0"]"#;
    let manifest = write(
        dir.path(),
        "bad-flag.yaml",
        &job(
            "bad-flag",
            "  runPolicy:\n    backoffLimit: 2\n",
            &[replica("PS", 1, "OnFailure", cmd, ok, &env), replica("Worker", 1, "OnFailure", cmd, bad, &env)],
        ),
    );
    let started = Instant::now();
    let (out, run_dir) = run(&manifest, &["--quiet"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    for said in [
        "worker-0 exited with code 2; restarting in place",
        "(restart 2, restartPolicy OnFailure)",
        "its last error: tfjob-runtime: ",
        "--batch_size",
        "reached the specified backoff limit",
    ] {
        assert!(stderr.contains(said), "{said:?} not on the console:\n{stderr}");
    }
    let status = status_yaml(&run_dir);
    assert!(status.contains("type: Failed") && status.contains("backoff limit"), "{status}");
    eventually_none_left(&marker);
    Ok(())
}

/// `tfjob run -` reads the manifest from standard input, as `kubectl apply -f -` does.
#[test]
fn the_manifest_can_come_on_standard_input() -> Result<()> {
    use std::io::Write as _;
    let args = r#"["--model=linear", "--train_steps=200"]"#;
    let manifest = job("from-stdin", "", &[replica("Worker", 1, "Never", r#"["tfjob-runtime"]"#, args, "[]")]);
    let run_dir = tempfile::tempdir()?;
    let mut child = Command::new(tfjob()?)
        .args(["run", "-", "--quiet", "--run-dir"])
        .arg(run_dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().context("stdin")?.write_all(manifest.as_bytes())?;
    let out = child.wait_with_output()?;
    assert!(out.status.success(), "{}", text(&out));
    assert!(status_yaml(run_dir.path()).contains("type: Succeeded"), "{}", text(&out));
    let out = Command::new(tfjob()?).args(["run", "-"]).stdin(Stdio::null()).output()?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("standard input"), "{}", text(&out));
    Ok(())
}

/// A bad manifest gives its message and starts nothing.
#[test]
fn bad_input_starts_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (marker, env) = marker_env();
    let ok_args = r#"["--model=linear"]"#;
    let cases: Vec<(PathBuf, &str)> = vec![
        (dir.path().join("missing.yaml"), "cannot read"),
        (write(dir.path(), "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), "ConfigMap"),
        (write(dir.path(), "broken.yaml", "apiVersion: kubeflow.org/v1\nkind: TFJob\n  bad: [indent\n"), "broken.yaml"),
        (write(dir.path(), "invalid.yaml", &job("invalid", "", &[replica("Worker", 1, "Sometimes", r#"["tfjob-runtime"]"#, ok_args, &env)])), "restartPolicy"),
        (
            // A typo in the pod template (`resource` for `resources`) is an error, not ignored.
            write(
                dir.path(),
                "typo.yaml",
                &job(
                    "typo",
                    "",
                    &[replica("Worker", 1, "Never", r#"["tfjob-runtime"]"#, ok_args, &env)
                        .replace("image: tfjob-runtime:latest", "image: tfjob-runtime:latest\n              resource: {}")],
                ),
            ),
            "spec.tfReplicaSpecs.Worker.template.spec.containers[0].resource: unknown field; did you mean \"resources\"?",
        ),
        (
            write(
                dir.path(),
                "nocommand.yaml",
                &job(
                    "nocommand",
                    "",
                    &[
                        replica("PS", 1, "Never", r#"["tfjob-runtime"]"#, ok_args, &env),
                        replica("Worker", 1, "Never", r#"["/nonexistent/trainer"]"#, ok_args, &env),
                    ],
                ),
            ),
            "/nonexistent/trainer",
        ),
    ];
    for (file, want) in cases {
        let (out, _) = run(&file, &[])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {}", file.display(), text(&out));
        assert!(stderr.contains(want), "{}: want {want:?} in {stderr}", file.display());
        assert!(marked_replicas(&marker).is_empty(), "{}: processes left behind", file.display());
    }
    Ok(())
}

/// The evaluator finishes its final evaluation before the job's pods are cleaned up, under every
/// `cleanPodPolicy` (Kubeflow's users saw it stopped mid-evaluation when the chief ended the job):
/// the chief waits for it, so the job succeeds only after it, and the evaluator ends with its
/// final figures and its report whatever is stopped afterwards.
#[test]
fn the_evaluator_finishes_its_final_evaluation_under_every_clean_pod_policy() -> Result<()> {
    let manifest = std::fs::read_to_string(repo_root().join("examples/chief-evaluator.yaml"))?;
    assert!(manifest.contains("  runPolicy:\n") && manifest.contains("--train_steps=1500"), "examples/chief-evaluator.yaml changed shape");
    for policy in ["None", "Running", "All"] {
        let dir = tempfile::tempdir()?;
        let changed =
            manifest.replace("  runPolicy:\n", &format!("  runPolicy:\n    cleanPodPolicy: {policy}\n")).replace("--train_steps=1500", "--train_steps=600");
        let file = write(dir.path(), "chief-evaluator.yaml", &changed);
        let (out, run_dir) = run(&file, &["--quiet"])?;
        assert!(out.status.success(), "cleanPodPolicy {policy}: {}", text(&out));
        let log = std::fs::read_to_string(run_dir.join("evaluator-0.log"))?;
        let last = log.lines().rev().find(|l| l.contains("final evaluation at global_step="));
        let step: u64 = last
            .and_then(|l| l.split("global_step=").nth(1))
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("cleanPodPolicy {policy}: no final evaluation in the evaluator's log:\n{log}"));
        assert!(step >= 600, "cleanPodPolicy {policy}: final evaluation at step {step}, before training ended");
        let eval = report(&run_dir, "evaluator-0");
        assert!(eval["accuracy"].as_f64().is_some() || eval["eval_accuracy"].as_f64().is_some(), "cleanPodPolicy {policy}: {eval}");
    }
    Ok(())
}

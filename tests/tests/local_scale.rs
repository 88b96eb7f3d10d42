//! `tfjob scale` against a running `tfjob run` (process backend): workers
//! appear and disappear while the job runs, only the difference is touched,
//! refusals say why, and a run that has ended says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use serde_json::Value;
use tfjob_tests::local::{marked_replicas, tfjob};
use tfjob_tests::operator::{eventually, repo_root};

/// examples/linreg-async.yaml, training for as long as the test needs, every
/// replica marked with `marker` in its environment.
fn long_linreg_async(marker: &str) -> Result<String> {
    let text = std::fs::read_to_string(repo_root().join("examples/linreg-async.yaml"))?;
    let mut job: Value = serde_saphyr::from_str(&text)?;
    for rtype in ["PS", "Worker"] {
        let container = &mut job["spec"]["tfReplicaSpecs"][rtype]["template"]["spec"]["containers"][0];
        let args = container["args"].as_array_mut().context("the example's args")?;
        for arg in args.iter_mut() {
            if arg.as_str().is_some_and(|a| a.starts_with("--train_steps=")) {
                *arg = "--train_steps=1000000000".into();
            }
        }
        container["env"] = serde_saphyr::from_str(&format!("[{{name: TFJOB_TEST_MARK, value: {marker}}}]"))?;
    }
    Ok(serde_saphyr::to_string(&job)?)
}

fn ids(tasks: &[(&str, i64)]) -> Vec<(String, i64)> {
    tasks.iter().map(|(t, i)| (t.to_string(), *i)).collect()
}

/// Waits until exactly these replicas run; returns them.
fn wait_replicas(marker: &str, want: &[(&str, i64)]) -> Result<BTreeMap<(String, i64), (u32, Value)>> {
    let want = ids(want);
    eventually(&format!("replicas {want:?}"), Duration::from_secs(60), || {
        let now = marked_replicas(marker);
        Ok((now.keys().cloned().collect::<Vec<_>>() == want).then_some(now))
    })
    .map_err(|e| anyhow!("{e:#}; running: {:?}", marked_replicas(marker).keys().collect::<Vec<_>>()))
}

/// `tfjob scale TARGET ARG` with the test's temp directory (where the
/// `<job>.latest` pointers are).
fn scale(tmp: &Path, target: &str, arg: &str) -> Result<Output> {
    Command::new(tfjob()?).args(["scale", target, arg]).env("TMPDIR", tmp).stdin(Stdio::null()).output().context("running tfjob scale")
}

/// `tfjob run EXAMPLE` from the repository's root, in the background, its output in `tmp`.
fn run_example(tmp: &Path, example: &str) -> Result<std::process::Child> {
    Ok(Command::new(tfjob()?)
        .args(["run", example])
        .current_dir(repo_root())
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(tmp.join("run.stdout"))?)
        .stderr(std::fs::File::create(tmp.join("run.stderr"))?)
        .spawn()?)
}

fn says(out: &Output) -> String {
    format!("exit {:?}, stdout {:?}, stderr {:?}", out.status.code(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn pid(r: &BTreeMap<(String, i64), (u32, Value)>, rtype: &str, index: i64) -> u32 {
    r[&(rtype.to_string(), index)].0
}

#[test]
fn tfjob_scale_adds_and_removes_workers_of_a_running_job() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tmp = tmp.path();
    let marker = format!("scale-{}-{}", std::process::id(), tmp.file_name().unwrap_or_default().to_string_lossy());
    let manifest = tmp.join("linreg-async.yaml");
    std::fs::write(&manifest, long_linreg_async(&marker)?)?;
    let run_dir = tmp.join("run");
    let stderr = std::fs::File::create(tmp.join("run.stderr"))?;
    let mut run = Command::new(tfjob()?)
        .args(["run", "--quiet", "--run-dir"])
        .arg(&run_dir)
        .arg(&manifest)
        .env("TMPDIR", tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?;
    let result = (|| -> Result<()> {
        let before = wait_replicas(&marker, &[("ps", 0), ("worker", 0), ("worker", 1)])?;
        ensure!(run_dir.join("control.sock").exists(), "no control.sock in the run directory");
        let latest = std::fs::read_link(tmp.join("tfjob-runs/linreg-async.latest"))?;
        assert_eq!(latest, run_dir.canonicalize()?);

        // Up, by run directory: only workers 2 and 3 start, with the cluster of 4 workers.
        let out = scale(tmp, &run_dir.to_string_lossy(), "Worker=4")?;
        ensure!(out.status.success(), "{}", says(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "Worker 2 \u{2192} 4\n");
        let up = wait_replicas(&marker, &[("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("worker", 3)])?;
        for (rtype, index) in [("ps", 0), ("worker", 0), ("worker", 1)] {
            assert_eq!(pid(&up, rtype, index), pid(&before, rtype, index), "{rtype} {index} was touched");
        }
        for index in [2, 3] {
            let cfg = &up[&("worker".to_string(), index)].1;
            assert_eq!(cfg["cluster"]["worker"].as_array().map(Vec::len), Some(4), "{cfg}");
            // The process backend keeps the addresses it gave: the old workers are where they were.
            assert_eq!(cfg["cluster"]["worker"][0], before[&("worker".to_string(), 0)].1["cluster"]["worker"][0]);
        }

        // Down, by job name: workers 1 to 3 stop, worker 0 (the chief) and the ps go on.
        let out = scale(tmp, "linreg-async", "Worker=1")?;
        ensure!(out.status.success(), "{}", says(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "Worker 4 \u{2192} 1\n");
        let down = wait_replicas(&marker, &[("ps", 0), ("worker", 0)])?;
        assert_eq!((pid(&down, "ps", 0), pid(&down, "worker", 0)), (pid(&before, "ps", 0), pid(&before, "worker", 0)));

        // Refusals: a type that cannot be scaled and a count below the chief (exit 1), a count
        // that is no count (exit 2, usage); nothing changes.
        for (arg, code, why) in [
            ("PS=0", 1, "ps 0 keeps the job's layout and is never removed"),
            ("Chief=1", 1, "only Worker and PS can be scaled"),
            ("Worker=0", 1, "worker 0 is the chief"),
            ("Worker=abc", 2, "is not a whole number"),
            ("Worker=-1", 2, "must be 0 or more"),
        ] {
            let out = scale(tmp, "linreg-async", arg)?;
            assert_eq!(out.status.code(), Some(code), "{arg}: {}", says(&out));
            ensure!(String::from_utf8_lossy(&out.stderr).contains(why), "{arg}: {}", says(&out));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(marked_replicas(&marker).keys().cloned().collect::<Vec<_>>(), ids(&[("ps", 0), ("worker", 0)]));
        let status: Value = serde_saphyr::from_str(&std::fs::read_to_string(run_dir.join("status.yaml"))?)?;
        assert_eq!(status["status"]["replicaStatuses"]["Worker"]["replicas"].as_i64(), Some(1), "{status:?}");
        Ok(())
    })();
    // The end of the run (Ctrl-C): its socket goes, and so does every replica.
    // SAFETY: kill(2) of the `tfjob run` this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let code = run.wait()?.code();
    let log = std::fs::read_to_string(tmp.join("run.stderr")).unwrap_or_default();
    result.map_err(|e| anyhow!("{e:#}\ntfjob run said:\n{log}"))?;
    assert_eq!(code, Some(130), "{log}");
    for line in [
        "tfjob scale: Worker 2 \u{2192} 4",
        "event Scaled: Worker 2 \u{2192} 4",
        "event Scaled: Worker 4 \u{2192} 1",
        "tfjob scale refused: PS=0: ps 0 keeps the job's layout and is never removed",
    ] {
        ensure!(log.contains(line), "{line:?} not in the run's output:\n{log}");
    }
    ensure!(!run_dir.join("control.sock").exists(), "control.sock left behind");
    for target in [run_dir.to_string_lossy().to_string(), "linreg-async".to_string()] {
        // By name it waits for a run that may be starting: a second here.
        let out = Command::new(tfjob()?).args(["scale", &target, "Worker=2", "--wait=1"]).env("TMPDIR", tmp).stdin(Stdio::null()).output()?;
        assert_eq!(out.status.code(), Some(1), "{}", says(&out));
        ensure!(String::from_utf8_lossy(&out.stderr).contains("has ended"), "{target}: {}", says(&out));
    }
    let out = Command::new(tfjob()?).args(["scale", "no-such-job", "Worker=2", "--wait=1"]).env("TMPDIR", tmp).stdin(Stdio::null()).output()?;
    assert_eq!(out.status.code(), Some(1), "{}", says(&out));
    ensure!(String::from_utf8_lossy(&out.stderr).contains("no run of TFJob no-such-job"), "{}", says(&out));
    ensure!(String::from_utf8_lossy(&out.stderr).contains("waiting up to 1s for a run that is starting"), "{}", says(&out));
    let out = scale(tmp, &tmp.join("nowhere").to_string_lossy(), "Worker=2")?;
    ensure!(String::from_utf8_lossy(&out.stderr).contains("no run directory"), "{}", says(&out));
    eventually("no replica left", Duration::from_secs(5), || Ok(marked_replicas(&marker).is_empty().then_some(())))?;
    Ok(())
}

/// `--num_epochs=N` of every replica of a manifest (they must agree).
fn num_epochs(manifest: &str) -> Result<u64> {
    let found: BTreeSet<u64> = manifest.split(['"', ' ', ',', '[', ']']).filter_map(|a| a.strip_prefix("--num_epochs=")?.parse().ok()).collect();
    ensure!(found.len() == 1, "expected one --num_epochs in the manifest, found {found:?}");
    Ok(found.into_iter().next().unwrap_or_default())
}

/// The `Worker` replicas `tfjob run` counts as active in its status.yaml.
fn active_workers(run_dir: &Path) -> Option<i64> {
    let status: Value = serde_saphyr::from_str(&std::fs::read_to_string(run_dir.join("status.yaml")).ok()?).ok()?;
    status["status"]["replicaStatuses"]["Worker"]["active"].as_i64()
}

/// README's "Scaling a running job", as a person pastes it: examples/elastic-workers.yaml as it
/// is, run in the background, scaled 2 -> 4 -> 1 by job name while it trains, and still ending by
/// itself with every example of every epoch trained once.
#[test]
fn the_readmes_scaling_demo_scales_the_example_as_it_is() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tmp = tmp.path();
    let example = std::fs::read_to_string(repo_root().join("examples/elastic-workers.yaml"))?;
    let epochs = num_epochs(&example)?;
    let started = std::time::Instant::now();
    let mut run = run_example(tmp, "examples/elastic-workers.yaml")?;
    let result = (|| -> Result<std::time::Duration> {
        // A person pastes the next line once the run has started.
        let out = eventually("tfjob scale Worker=4 accepted", Duration::from_secs(60), || {
            let out = scale(tmp, "elastic-workers", "Worker=4")?;
            Ok(out.status.success().then_some(out))
        })?;
        assert_eq!(String::from_utf8_lossy(&out.stdout), "Worker 2 \u{2192} 4\n");
        let run_dir = std::fs::read_link(tmp.join("tfjob-runs/elastic-workers.latest"))?;
        eventually("4 workers active", Duration::from_secs(60), || Ok((active_workers(&run_dir) == Some(4)).then_some(())))?;
        let out = scale(tmp, "elastic-workers", "Worker=1")?;
        ensure!(out.status.success(), "{}", says(&out));
        eventually("1 worker active", Duration::from_secs(60), || Ok((active_workers(&run_dir) == Some(1)).then_some(())))?;
        let scaled_after = started.elapsed();
        let status = run.wait()?;
        ensure!(status.success(), "tfjob run: {status}");
        let report = tfjob_tests::report::final_report(&std::fs::read_to_string(run_dir.join("worker-0.log"))?, "worker-0")?;
        assert_eq!((report["epochs_completed"].as_u64(), report["examples_trained"].as_u64()), (Some(epochs), Some(epochs * 101)), "{report}");
        Ok(scaled_after)
    })();
    let _ = run.kill();
    let _ = run.wait();
    let log = std::fs::read_to_string(tmp.join("run.stderr")).unwrap_or_default();
    let scaled_after = result.map_err(|e| anyhow!("{e:#}\ntfjob run said:\n{log}"))?;
    for line in ["event Scaled: Worker 2 \u{2192} 4", "event Scaled: Worker 4 \u{2192} 1", "TFJob elastic-workers succeeded"] {
        ensure!(log.contains(line), "{line:?} not in the run's output:\n{log}");
    }
    // Long enough to scale by hand: the scaling took `scaled_after`; the job trained on well after.
    let total = started.elapsed();
    eprintln!("scaled 2 -> 4 -> 1 within {scaled_after:?}; the job ended by itself after {total:?}");
    ensure!(total >= scaled_after + Duration::from_secs(10), "the example ended {:?} after the last scale: too short to scale by hand", total - scaled_after);
    Ok(())
}

/// README's parameter-server demo as a person pastes it: examples/elastic-ps.yaml (1 ps, 2 sync
/// workers) run in the background and scaled to PS=3 by job name while it trains: ps-1 and ps-2
/// start, the chief moves the state to 3 ps tasks at a step boundary; then PS=2: ps-2 hands its
/// part back before it exits; PS=0 is refused, saying why; the job ends by itself with every
/// example of every epoch trained once and the AUC of the example, long enough after the last
/// scale for a person to have typed it.
#[test]
fn tfjob_scale_adds_and_removes_a_ps_of_a_training_job() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tmp = tmp.path();
    let mut run = run_example(tmp, "examples/elastic-ps.yaml")?;
    let result = (|| -> Result<()> {
        // A person scales a job they see training: scaled before any replica started, the job
        // would simply start with 3 ps and no state would move (a CI run of 1571a99 did that).
        let run_dir = eventually("the run's directory", Duration::from_secs(60), || Ok(std::fs::read_link(tmp.join("tfjob-runs/elastic-ps.latest")).ok()))?;
        let chief_log = || std::fs::read_to_string(run_dir.join("worker-0.log")).unwrap_or_default();
        eventually("the chief trains", Duration::from_secs(60), || Ok(chief_log().contains("first gradient accepted").then_some(())))?;
        let out = scale(tmp, "elastic-ps", "PS=3")?;
        ensure!(out.status.success(), "{}", says(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "PS 1 \u{2192} 3\n");
        eventually("the chief moved the state", Duration::from_secs(60), || {
            Ok(chief_log().contains("moved the job's state from 1 to 3 ps task(s)").then_some(()))
        })?;
        let out = scale(tmp, "elastic-ps", "PS=2")?;
        ensure!(out.status.success(), "{}", says(&out));
        let scaled_at = Instant::now();
        eventually("ps-2 handed its part over", Duration::from_secs(60), || {
            Ok(chief_log().contains("moved the job's state from 3 to 2 ps task(s)").then_some(()))
        })?;
        let out = scale(tmp, "elastic-ps", "PS=0")?;
        ensure!(!out.status.success() && says(&out).contains("ps 0 keeps the job's layout and is never removed"), "{}", says(&out));
        let status = run.wait()?;
        ensure!(status.success(), "tfjob run: {status}");
        let after = scaled_at.elapsed();
        ensure!(after >= Duration::from_secs(8), "the example ended {after:?} after the last scale: too short to scale by hand");
        let report = tfjob_tests::report::final_report(&chief_log(), "worker-0")?;
        assert_eq!(report["epochs_completed"].as_u64(), Some(10), "{report}");
        ensure!(report["auc"].as_f64().unwrap_or(0.0) > 0.85, "{report}");
        let ps2 = std::fs::read_to_string(run_dir.join("ps-2.log"))?;
        ensure!(ps2.contains("staged layout version 2") && ps2.contains("handed its state over"), "ps-2:\n{ps2}");
        Ok(())
    })();
    let _ = run.kill();
    let _ = run.wait();
    let log = std::fs::read_to_string(tmp.join("run.stderr")).unwrap_or_default();
    result.map_err(|e| anyhow!("{e:#}\ntfjob run said:\n{log}"))?;
    for scaled in ["PS 1 \u{2192} 3", "PS 3 \u{2192} 2"] {
        ensure!(log.contains(&format!("event Scaled: {scaled}")), "no Scaled event {scaled} in the run's output:\n{log}");
    }
    Ok(())
}

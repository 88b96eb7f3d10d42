//! Elastic jobs under `tfjob run`, with OS processes: a sync job of `--num_epochs` scaled
//! 2 → 4 → 1 with `tfjob scale` while it trains, with a worker and ps 0 killed on the way, trains
//! every example exactly once per epoch and as well as an undisturbed run; Kubeflow's
//! `enableDynamicWorker` trains in every shape (several ps, with a Chief, sync and async) and
//! fails instead of hanging when every worker failed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use tfjob_tests::data::write_blobs;
use tfjob_tests::local::{job, kill_9, marked_replicas, replica, tfjob, unique, write};
use tfjob_tests::report::{ensure_linear, final_report};

const LIMIT: Duration = Duration::from_secs(300);

/// The final JSON line of a replica, from the run directory.
fn report(run_dir: &Path, replica: &str) -> Result<Value> {
    final_report(&std::fs::read_to_string(run_dir.join(format!("{replica}.log"))).unwrap_or_default(), replica)
}

fn log(run_dir: &Path, replica: &str) -> String {
    std::fs::read_to_string(run_dir.join(format!("{replica}.log"))).unwrap_or_default()
}

/// The largest `global_step=N` in a replica's log.
fn global_step(run_dir: &Path, replica: &str) -> i64 {
    log(run_dir, replica)
        .lines()
        .filter_map(|l| l.split("global_step=").nth(1))
        .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<i64>().ok())
        .max()
        .unwrap_or(-1)
}

/// A `tfjob run` in the background; its console output goes to `console.txt` beside the run
/// directory.
struct Run {
    child: Child,
    dir: PathBuf,
    console: PathBuf,
}

impl Run {
    fn start(manifest: &Path, dir: &Path) -> Result<Run> {
        let console = dir.with_extension("console.txt");
        let child = Command::new(tfjob()?)
            .args(["run", "--quiet", "--run-dir"])
            .arg(dir)
            .arg(manifest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&console)?)
            .spawn()
            .context("starting tfjob run")?;
        Ok(Run { child, dir: dir.to_path_buf(), console })
    }

    /// Waits until `ready(run_dir)`, or fails with the console output so far.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Path) -> bool) -> Result<()> {
        let deadline = Instant::now() + LIMIT;
        while !ready(&self.dir) {
            if let Some(status) = self.child.try_wait()? {
                bail!("tfjob run ended ({status}) before {what}:\n{}", self.stderr());
            }
            ensure!(Instant::now() < deadline, "timeout waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// `tfjob scale RUN_DIR Worker=n`: its output.
    fn scale(&self, workers: u32) -> Result<String> {
        let out = Command::new(tfjob()?).arg("scale").arg(&self.dir).arg(format!("Worker={workers}")).output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.success(), "tfjob scale Worker={workers}: {text}");
        Ok(text)
    }

    fn finish(mut self) -> Result<String> {
        let status = wait_with_deadline(&mut self.child, LIMIT)?;
        let stderr = self.stderr();
        ensure!(status.success(), "tfjob run failed ({status}):\n{stderr}");
        Ok(stderr)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child` to end; kills it and fails after `limit` (a hang is a failure, not a stuck
/// suite).
fn wait_with_deadline(child: &mut Child, limit: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("still running after {}s: killed", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// In every line of `text` that contains `line_has` and `suffix`, the number just before the
/// first `suffix`: e.g. N of "N shard(s) of worker:1 go back to todo".
fn numbers_before(text: &str, line_has: &str, suffix: &str) -> Vec<u64> {
    text.lines()
        .filter(|l| l.contains(line_has))
        .filter_map(|l| {
            let head = &l[..l.find(suffix)?];
            head.rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
        .collect()
}

/// Every `(epoch, shard)` a worker said it trained (`trained shard I of epoch E`, at debug level
/// of the target `tfjob_runtime::shards`), with how many times.
fn trained_shards(run_dir: &Path) -> std::collections::BTreeMap<(u64, u64), u32> {
    let mut seen = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(run_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !(name.starts_with("worker-") && name.ends_with(".log")) {
            continue;
        }
        for line in std::fs::read_to_string(entry.path()).unwrap_or_default().lines() {
            let Some(rest) = line.split("trained shard ").nth(1) else {
                continue;
            };
            let mut words = rest.split(' ');
            let (Some(index), Some("of"), Some("epoch"), Some(epoch)) = (words.next(), words.next(), words.next(), words.next()) else {
                continue;
            };
            if let (Ok(index), Ok(epoch)) = (index.parse::<u64>(), epoch.parse::<u64>()) {
                *seen.entry((epoch, index)).or_insert(0) += 1;
            }
        }
    }
    seen
}

/// The first gradient of a replica: "(X s after the process started)".
fn first_gradient_secs(text: &str) -> Option<f64> {
    let rest = text.split("first gradient accepted at global_step=").nth(1)?;
    rest.split('(').nth(1)?.split('s').next()?.parse().ok()
}

#[test]
fn log_parsers() {
    let restored = "ps:0: shard dispatcher restored: 12 epoch(s) and 480 shard(s) done, 4 in flight at the checkpoint go back to todo";
    let ps = "x ps:0: 3 shard(s) of worker:1 go back to todo\ny ps:0: 1 shard(s) of worker:2 go back to todo (it asked again without finishing them)\nz other 7 shard(s)";
    assert_eq!(numbers_before(ps, "go back to todo", " shard(s) of "), vec![3, 1]);
    assert_eq!(numbers_before(restored, "go back to todo", " shard(s) of "), Vec::<u64>::new());
    assert_eq!(numbers_before(restored, "in flight at the checkpoint", " in flight"), vec![4]);
    assert_eq!(first_gradient_secs("w: first gradient accepted at global_step=12 (0.084s after the process started)"), Some(0.084));
    assert_eq!(first_gradient_secs("nothing"), None);
}

/// SIGKILL to the replica `rtype`-`index` of the job marked `marker`.
fn kill_replica(marker: &str, rtype: &str, index: i64) -> Result<()> {
    let replicas = marked_replicas(marker);
    let (pid, _) = replicas.get(&(rtype.to_string(), index)).with_context(|| format!("no process of {rtype}-{index}: {:?}", replicas.keys()))?;
    kill_9(*pid);
    Ok(())
}

/// An elastic sync job of softmax regression over blobs the test writes: 1 ps, 2 workers,
/// `--num_epochs` epochs, checkpoints every 100 steps.
fn elastic_manifest(dir: &Path, name: &str, epochs: u32, marker: &str) -> Result<PathBuf> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    write_blobs(&data, 4000, 1000, 8, 4, 3.0, 5)?;
    let ckpt = dir.join("checkpoints");
    let args = format!(
        r#"["--model=softmax", "--data_dir={}", "--eval_examples=1000", "--batch_size=10", "--learning_rate=0.1", "--sync_replicas", "--replicas_to_aggregate=auto", "--num_epochs={epochs}", "--lease_secs=1", "--heartbeat_secs=0.2", "--log_every_steps=100", "--checkpoint_dir={}", "--save_checkpoint_steps=100"]"#,
        data.display(),
        ckpt.display()
    );
    // Every shard a worker trains is logged (debug level of one target), so that the test can
    // check coverage on its own rather than trust the dispatcher's figures.
    let env = format!("[{{name: TFJOB_TEST_MARK, value: \"{marker}\"}}, {{name: RUST_LOG, value: \"info,h2=warn,tower=warn,tfjob_runtime::shards=debug\"}}]");
    let cmd = r#"["tfjob-runtime"]"#;
    Ok(write(
        dir,
        &format!("{name}.yaml"),
        &job(name, "", &[replica("PS", 1, "OnFailure", cmd, &args, &env), replica("Worker", 2, "OnFailure", cmd, &args, &env)]),
    ))
}

const EPOCHS: u32 = 60;

#[test]
fn a_scaled_and_disturbed_sync_job_trains_every_epoch_once() -> Result<()> {
    // The undisturbed run: the accuracy to match.
    let calm_dir = tempfile::tempdir()?;
    let calm = Run::start(&elastic_manifest(calm_dir.path(), "calm", EPOCHS, &unique("TFJOB_TEST_MARK"))?, &calm_dir.path().join("run"))?;
    calm.finish()?;
    let calm_report = report(&calm_dir.path().join("run"), "worker-0")?;
    let calm_accuracy = calm_report["accuracy"].as_f64().context("accuracy")?;

    let dir = tempfile::tempdir()?;
    let marker = unique("TFJOB_TEST_MARK");
    let mut run = Run::start(&elastic_manifest(dir.path(), "elastic", EPOCHS, &marker)?, &dir.path().join("run"))?;
    run.wait_for("global step 500", |d| global_step(d, "worker-0") >= 500)?;
    let scaled = Instant::now();
    let said = run.scale(4)?;
    ensure!(said.contains("Worker 2 → 4"), "{said}");
    run.wait_for("worker-3's first gradient", |d| log(d, "worker-3").contains("first gradient accepted"))?;
    let scale_to_gradient = scaled.elapsed().as_secs_f64();
    // A new worker contributes within a second of its process starting (the rest of the time
    // from `tfjob scale` is the run noticing the request and starting the process).
    let from_start = first_gradient_secs(&log(&run.dir, "worker-3")).context("worker-3's first gradient line")?;
    eprintln!("scale 2 → 4: worker-3's first gradient {scale_to_gradient:.2}s after `tfjob scale`, {from_start:.3}s after its process started");
    ensure!(from_start < 1.0, "worker-3 contributed {from_start}s after its process started");
    let at = global_step(&run.dir, "worker-0");
    run.wait_for("steps with 4 workers", |d| global_step(d, "worker-0") >= at + 200)?;
    kill_replica(&marker, "worker", 2)?;
    run.wait_for("worker-2 restarted", |d| log(d, "worker-2").matches("first gradient accepted").count() >= 2)?;
    let at = global_step(&run.dir, "worker-0");
    run.wait_for("a checkpoint after the restart", |d| {
        log(d, "worker-0")
            .lines()
            .filter_map(|l| l.split("checkpoint of global_step=").nth(1))
            .any(|r| r.split(' ').next().and_then(|s| s.parse::<i64>().ok()).is_some_and(|s| s > at))
    })?;
    kill_replica(&marker, "ps", 0)?;
    run.wait_for("ps-0 restored", |d| log(d, "ps-0").contains("shard dispatcher restored"))?;
    let said = run.scale(1)?;
    ensure!(said.contains("Worker 4 → 1"), "{said}");
    // Workers stopped on purpose leave at once: they deregister (no step waits for a lease).
    for w in 1..4 {
        run.wait_for(&format!("worker-{w} left the job"), |d| log(d, &format!("worker-{w}")).contains("left the job"))?;
    }
    let console = run.finish()?;
    let run_dir = dir.path().join("run");
    let status = std::fs::read_to_string(run_dir.join("status.yaml"))?;
    ensure!(status.contains("type: Succeeded"), "{status}");
    for shown in ["event Scaled: Worker 2 → 4", "event Scaled: Worker 4 → 1", "worker-2 exited with code 137; restarting in place", "ps-0 exited with code 137"]
    {
        ensure!(console.contains(shown), "the console does not show {shown:?}:\n{console}");
    }
    let chief = report(&run_dir, "worker-0")?;
    eprintln!("disturbed: {chief}\ncalm: {calm_report}");
    ensure!(chief["epochs_completed"].as_u64() == Some(EPOCHS as u64), "{chief}");
    ensure!(chief["examples_trained"].as_u64() == Some(EPOCHS as u64 * 4000), "{chief}");
    // Counted by the workers, not the dispatcher: every shard of every epoch was trained.
    let ps_log = log(&run_dir, "ps-0");
    let per_epoch = numbers_before(&ps_log, "dispatching 4000 examples in", " shard(s)");
    let per_epoch = *per_epoch.first().context("ps-0 never said how it cuts the training set")?;
    let trained = trained_shards(&run_dir);
    let missing: Vec<(u64, u64)> = (0..EPOCHS as u64).flat_map(|e| (0..per_epoch).map(move |i| (e, i))).filter(|s| !trained.contains_key(s)).collect();
    ensure!(missing.is_empty(), "{} shard(s) no worker trained, e.g. {:?}", missing.len(), &missing[..missing.len().min(5)]);
    let twice: u32 = trained.values().map(|n| n - 1).sum();
    // Shards redone: no more than the shards in flight at each loss, as ps 0 logged them
    // (a lost worker's, one given up by a restarted worker, those in flight at the checkpoint).
    let in_flight: u64 = numbers_before(&ps_log, "go back to todo", " shard(s) of ").iter().sum::<u64>()
        + numbers_before(&ps_log, "in flight at the checkpoint", " in flight").iter().sum::<u64>();
    let redone = chief["shards_redone"].as_u64().context("shards_redone")?;
    eprintln!(
        "{per_epoch} shards per epoch; {in_flight} in flight at losses, {redone} redone; {twice} trained more than once (redone, or lost with the ps's steps after its checkpoint)"
    );
    ensure!(redone >= 1 && redone <= in_flight, "{redone} shards redone, {in_flight} in flight at the losses: {chief}");
    let accuracy = chief["accuracy"].as_f64().context("accuracy")?;
    ensure!((accuracy - calm_accuracy).abs() <= 0.02, "accuracy {accuracy} vs {calm_accuracy} undisturbed");
    Ok(())
}

/// `enableDynamicWorker`, the shapes Kubeflow allows: each trains to Succeeded, the chief is the
/// chief and no worker takes itself for it, every example once per epoch.
#[test]
fn dynamic_workers_train_in_every_shape() -> Result<()> {
    let cases = [
        ("two-ps", vec![("PS", 2), ("Worker", 3)], "[]", "worker-0"),
        ("two-ps-sync", vec![("PS", 2), ("Worker", 3)], "[\"--sync_replicas\", \"--replicas_to_aggregate=auto\"]", "worker-0"),
        ("chief-sync", vec![("Chief", 1), ("PS", 1), ("Worker", 2)], "[\"--sync_replicas\"]", "chief-0"),
        ("chief-async", vec![("Chief", 1), ("PS", 1), ("Worker", 2)], "[]", "chief-0"),
    ];
    for (name, replicas, extra, chief) in cases {
        let dir = tempfile::tempdir()?;
        let mut args: Vec<String> = serde_yaml::from_str(extra)?;
        args.extend(["--model=linear", "--learning_rate=0.01", "--num_epochs=60", "--log_every_steps=500"].map(String::from));
        let args = serde_json::to_string(&args)?;
        let cmd = r#"["tfjob-runtime"]"#;
        let specs: Vec<String> = replicas.iter().map(|(t, n)| replica(t, *n, "Never", cmd, &args, "[]")).collect();
        let manifest = write(dir.path(), "dyn.yaml", &job(name, "  enableDynamicWorker: true\n", &specs));
        let run_dir = dir.path().join("run");
        let run = Run::start(&manifest, &run_dir)?;
        run.finish().with_context(|| name.to_string())?;
        let r = report(&run_dir, chief)?;
        ensure!(r["chief"] == true, "{name}: {r}");
        ensure_linear(&r, name)?;
        ensure!(r["examples_trained"].as_u64() == Some(60 * 101), "{name}: {r}");
        // Every worker trained, and only the chief took itself for the chief (a worker's final
        // line may be missing: the job succeeds when the chief ends, and the run then stops
        // every replica).
        let workers = replicas.iter().find(|(t, _)| *t == "Worker").map_or(0, |(_, n)| *n);
        for i in 0..workers {
            let worker = format!("worker-{i}");
            let text = log(&run_dir, &worker);
            ensure!(text.contains("first gradient accepted"), "{name}: {worker} trained nothing:\n{text}");
            ensure!(text.contains(") (chief);") == (chief == worker), "{name}: {worker} is the chief: {}:\n{text}", chief == worker);
        }
    }
    Ok(())
}

/// A dynamic job whose every worker fails for good fails, instead of hanging.
#[test]
fn a_dynamic_job_fails_when_every_worker_failed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = r#"["--model=linear", "--num_epochs=1000"]"#;
    let bad = r#"["--model=no-such-model"]"#;
    let cmd = r#"["tfjob-runtime"]"#;
    let manifest = write(
        dir.path(),
        "dyn-fail.yaml",
        &job("dynfail", "  enableDynamicWorker: true\n", &[replica("PS", 1, "Never", cmd, good, "[]"), replica("Worker", 2, "Never", cmd, bad, "[]")]),
    );
    let mut child = Command::new(tfjob()?)
        .args(["run", "--quiet", "--run-dir"])
        .arg(dir.path().join("run"))
        .arg(&manifest)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let status = wait_with_deadline(&mut child, Duration::from_secs(120))?;
    ensure!(status.code() == Some(1), "{status:?}");
    let status = std::fs::read_to_string(dir.path().join("run/status.yaml"))?;
    ensure!(status.contains("type: Failed"), "{status}");
    Ok(())
}

//! Checkpoints, TensorBoard events and data in an S3 bucket, against a real S3-compatible
//! server that the tests start on 127.0.0.1 (`tfjob_tests::s3`: s3s over s3s-fs), through
//! the runtime's storage layer (the `object_store` crate): the same guarantees as on a local
//! disk, and a ps killed mid-run restores from the bucket.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use tfjob_runtime::checkpoint::{self, CheckpointStatus, ShardData};
use tfjob_runtime::events::{self, EventWriter, FlushPolicy};
use tfjob_runtime::storage::Location;
use tfjob_tests::local::{kill_9, marked_replicas, tfjob, unique};
use tfjob_tests::operator::repo_root;
use tfjob_tests::report::{final_report, final_step_of_ps};
use tfjob_tests::s3::S3Server;

/// The bucket of `examples/s3-checkpoints.yaml`.
const BUCKET: &str = "tfjob-examples";

/// Points this process's S3 client at `server` (the library reads the environment, as the
/// runtime does). Every test of this file uses one server for that reason.
fn server() -> &'static S3Server {
    static SERVER: std::sync::OnceLock<S3Server> = std::sync::OnceLock::new();
    static ENV: Once = Once::new();
    let server = SERVER.get_or_init(|| S3Server::start(&[BUCKET, "unit"]).expect("the S3 server starts"));
    ENV.call_once(|| {
        for (k, v) in server.env() {
            // SAFETY: set once, before any thread of this test binary reads these variables
            // (they are only read by the storage layer, called after this).
            unsafe { std::env::set_var(k, v) };
        }
    });
    server
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn runtime_binary() -> Result<PathBuf> {
    Ok(tfjob()?.with_file_name("tfjob-runtime"))
}

fn shard(step: i64) -> ShardData {
    ShardData { variables: vec![("w".into(), vec![2, 2], vec![step as f32; 4])], updates: vec![("w".into(), step as u64)], ..Default::default() }
}

fn save(dir: &Location, step: i64) {
    let info = checkpoint::write_shard(dir, step, 0, 1, &shard(step)).unwrap();
    checkpoint::write_index(dir, step, 1, &[info]).unwrap();
}

/// Shards first, index last; a damaged or partial checkpoint in the bucket is skipped;
/// prune deletes whole checkpoints; inspect lists them.
#[test]
fn checkpoints_in_a_bucket_keep_their_guarantees() -> Result<()> {
    let s3 = server();
    let dir = Location::parse("s3://unit/guarantees/ckpt")?;
    assert!(checkpoint::latest_complete(&dir)?.is_none(), "an empty prefix has no checkpoint");
    for step in [100, 200, 300] {
        save(&dir, step);
    }
    // 400: the ps wrote its shard, the chief never wrote the index.
    checkpoint::write_shard(&dir, 400, 0, 1, &shard(400))?;
    // 300: one flipped byte in the stored shard.
    let stored = s3.object_path("unit", "guarantees/ckpt/ckpt-0000000300/shard-00000-of-00001.safetensors");
    let mut bytes = std::fs::read(&stored)?;
    let last = bytes.len() - 2;
    bytes[last] ^= 0x40;
    std::fs::write(&stored, &bytes)?;

    let latest = checkpoint::latest_complete(&dir)?.context("a complete checkpoint")?;
    assert_eq!(latest.global_step, 200);
    assert_eq!(latest.path.to_string(), "s3://unit/guarantees/ckpt/ckpt-0000000200");
    assert_eq!(checkpoint::read_shard(&latest, 0)?, shard(200));
    let states: Vec<(i64, &str)> = checkpoint::list(&dir)?
        .iter()
        .map(|l| {
            (
                l.step,
                match &l.status {
                    CheckpointStatus::Complete(_) => "complete",
                    CheckpointStatus::Incomplete(_) => "incomplete",
                    CheckpointStatus::Damaged(r) if r.contains("checksum mismatch") => "damaged",
                    CheckpointStatus::Damaged(_) => "damaged otherwise",
                },
            )
        })
        .collect();
    assert_eq!(states, [(100, "complete"), (200, "complete"), (300, "damaged"), (400, "incomplete")]);
    let listing = checkpoint::inspect(&dir)?;
    assert!(listing.contains("4 checkpoint(s) in s3://unit/guarantees/ckpt; latest complete: step 200"), "{listing}");

    // Keep 1 complete (200): the older 100 goes; 300 and 400, newer than the newest complete
    // one, stay (they may still be being written).
    let deleted: Vec<String> = checkpoint::prune(&dir, 1)?.iter().map(|l| l.to_string()).collect();
    assert_eq!(deleted, ["s3://unit/guarantees/ckpt/ckpt-0000000100"]);
    assert!(!s3.object_path("unit", "guarantees/ckpt/ckpt-0000000100/index.json").exists());
    // A shard of a complete checkpoint is never overwritten.
    let err = checkpoint::write_shard(&dir, 200, 0, 1, &shard(200)).unwrap_err();
    assert!(err.to_string().contains("already complete"), "{err}");
    Ok(())
}

/// An event file on an object store is uploaded whole and rolls over to new objects; read in
/// name order, the objects hold every record once, in order, each starting with file_version.
#[test]
fn event_files_in_a_bucket_roll_over_and_read_back_in_order() -> Result<()> {
    let s3 = server();
    let dir = Location::parse("s3://unit/events/run1")?;
    let policy = FlushPolicy { interval: Duration::from_millis(20), max_pending: 1000 };
    let mut w = EventWriter::create_in_with(&dir, ".chief", policy, 300)?;
    for step in 0..40 {
        w.add_scalars(step, &[("loss", step as f32)])?;
        if step % 10 == 9 {
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    w.close()?;
    let objects = dir.list()?.files;
    ensure!(objects.len() >= 3, "rolled over: {objects:?}");
    let mut steps = Vec::new();
    for (name, _) in &objects {
        assert!(name.starts_with("events.out.tfevents.") && name.contains(".chief"), "{name}");
        let bytes = std::fs::read(s3.object_path("unit", &format!("events/run1/{name}")))?;
        let evs = events::decode_events(Path::new(name), &bytes)?;
        assert!(matches!(evs[0].what, Some(events::What::FileVersion(_))), "{name} starts with file_version");
        steps.extend(events::scalars_of(evs).into_iter().map(|(tag, step, v)| {
            assert_eq!((tag.as_str(), v), ("loss", step as f32));
            step
        }));
    }
    assert_eq!(steps, (0..40).collect::<Vec<_>>(), "every record once, in name order");
    Ok(())
}

/// `--data_dir s3://...`: the IDX files are read from the bucket; a URL of an unknown
/// scheme is a clear error.
#[test]
fn data_dir_in_a_bucket() -> Result<()> {
    let s3 = server();
    let data = s3.object_path(BUCKET, "blobs");
    std::fs::create_dir_all(&data)?;
    tfjob_tests::data::write_blobs(&data, 600, 200, 8, 3, 0.5, 7)?;
    let mut cmd = Command::new(runtime_binary()?);
    cmd.args(["--model=softmax", "--data_dir=s3://tfjob-examples/blobs", "--train_steps=200", "--batch_size=50", "--learning_rate=0.5"]);
    let out = cmd.stdin(Stdio::null()).output()?;
    ensure!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!stderr.contains("synthetic"), "read the bucket's files: {stderr}");
    let report = final_report(&String::from_utf8_lossy(&out.stdout), "local")?;
    ensure!(report["accuracy"].as_f64().unwrap_or(0.0) > 0.9, "{report}");
    let out = Command::new(runtime_binary()?).args(["--model=softmax", "--data_dir=hdfs://namenode/mnist"]).output()?;
    ensure!(out.status.code() == Some(2), "{}", text(&out));
    ensure!(String::from_utf8_lossy(&out.stderr).contains("unsupported scheme \"hdfs\""), "{}", text(&out));
    Ok(())
}

/// `--train_files`/`--eval_files` of a sparse model at `s3://` URLs, a glob over the bucket's
/// prefix among them, one object gzipped: the examples are read from the bucket (every one of
/// them: the log counts them) and the model reaches the generator's achievable AUC.
#[test]
fn sparse_files_in_a_bucket() -> Result<()> {
    let s3 = server();
    let dir = s3.object_path(BUCKET, "clicks");
    std::fs::create_dir_all(&dir)?;
    let generated = Command::new(runtime_binary()?)
        .args(["generate", "--data_format=libsvm", "--train_examples=6000", "--eval_examples=2000", "--seed=5"])
        .arg(format!("--out={}", dir.display()))
        .output()?;
    ensure!(generated.status.success(), "{}", text(&generated));
    let line = String::from_utf8_lossy(&generated.stdout).lines().last().unwrap_or_default().to_string();
    let achievable = serde_json::from_str::<Value>(&line)?["achievable_auc"].as_f64().context("achievable_auc")?;
    // The training set as two objects, the second gzipped.
    let train = std::fs::read_to_string(dir.join("train.txt"))?;
    let lines: Vec<&str> = train.lines().collect();
    let (a, b) = lines.split_at(lines.len() / 2);
    std::fs::write(dir.join("part-1.txt"), a.join("\n") + "\n")?;
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(dir.join("part-2.txt.gz"))?, flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, (b.join("\n") + "\n").as_bytes())?;
    gz.finish()?;
    std::fs::remove_file(dir.join("train.txt"))?;
    let out = Command::new(runtime_binary()?)
        .args([
            "--model=sparse_lr",
            "--data_format=libsvm",
            "--train_files=s3://tfjob-examples/clicks/part-*",
            "--eval_files=s3://tfjob-examples/clicks/eval.txt",
            "--hash_buckets=65536",
            "--optimizer=adagrad",
            "--learning_rate=0.2",
            "--num_epochs=3",
        ])
        .stdin(Stdio::null())
        .output()?;
    ensure!(out.status.success(), "{}", text(&out));
    let report = final_report(&String::from_utf8_lossy(&out.stdout), "local")?;
    ensure!(report["examples_trained"].as_u64() == Some(3 * lines.len() as u64), "every example of both objects, 3 times: {report}");
    let auc = report["auc"].as_f64().context("auc")?;
    ensure!(auc > achievable - 0.03, "AUC {auc} against the achievable {achievable}: {report}");
    let missing = Command::new(runtime_binary()?)
        .args(["--model=sparse_lr", "--data_format=libsvm", "--train_files=s3://tfjob-examples/clicks/nothing-*"])
        .stdin(Stdio::null())
        .output()?;
    ensure!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("nothing-*"), "{}", text(&missing));
    Ok(())
}

/// `examples/s3-checkpoints.yaml` under `tfjob run` with the server's endpoint and keys in
/// the environment (the replicas inherit it; on a cluster they come from a Secret): the ps
/// is killed (SIGKILL) after the first checkpoint, restarted in place (OnFailure), restores
/// the latest complete checkpoint from the bucket, and the job succeeds; the evaluator saw
/// the last step; `checkpoint inspect s3://...` lists the checkpoints; the chief's and the
/// evaluator's events are in the bucket; the run prints the TensorBoard command.
#[test]
fn s3_example_under_tfjob_run_restores_a_killed_ps_from_the_bucket() -> Result<()> {
    let s3 = server();
    let run_dir = tempfile::tempdir()?;
    let marker = unique("s3-example");
    let mut child = Command::new(tfjob()?)
        .args(["run", "--quiet", "--run-dir"])
        .arg(run_dir.path())
        .arg(repo_root().join("examples/s3-checkpoints.yaml"))
        .envs(s3.env())
        .env("TFJOB_TEST_MARK", &marker)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let chief_log = run_dir.path().join("chief-0.log");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = std::fs::read_to_string(&chief_log).unwrap_or_default();
        if log.contains("checkpoint of global_step=300 written to s3://tfjob-examples/s3-checkpoints/checkpoints/ckpt-0000000300") {
            break;
        }
        ensure!(Instant::now() < deadline && child.try_wait()?.is_none(), "no checkpoint in the bucket; chief log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ps_pid, _) = marked_replicas(&marker).remove(&("ps".to_string(), 0)).context("the ps process")?;
    kill_9(ps_pid);
    let out = child.wait_with_output()?;
    ensure!(out.status.success(), "{}", text(&out));
    let log = |replica: &str| std::fs::read_to_string(run_dir.path().join(format!("{replica}.log"))).unwrap_or_default();
    let ps_log = log("ps-0");
    let restored = ps_log.lines().find(|l| l.contains("variable(s) from")).with_context(|| format!("the ps did not restore:\n{ps_log}"))?;
    ensure!(restored.contains("from s3://tfjob-examples/s3-checkpoints/checkpoints/ckpt-"), "{restored}");
    let report = |replica: &str| final_report(&log(replica), replica);
    let (chief, evaluator): (Value, Value) = (report("chief-0")?, report("evaluator-0")?);
    ensure!(chief["global_step"].as_i64() >= Some(1200), "{chief}");
    let last = final_step_of_ps(&ps_log, "ps-0")?;
    ensure!(evaluator["global_step"].as_i64() == Some(last), "the evaluator saw the last step {last}: {evaluator}");

    let inspect = Command::new(runtime_binary()?).args(["checkpoint", "inspect", "s3://tfjob-examples/s3-checkpoints/checkpoints"]).envs(s3.env()).output()?;
    ensure!(inspect.status.success(), "{}", text(&inspect));
    ensure!(String::from_utf8_lossy(&inspect.stdout).contains(&format!("latest complete: step {}", chief["global_step"])), "{}", text(&inspect));

    let tags = |prefix: &str| -> Result<Vec<String>> {
        let dir = s3.object_path(BUCKET, prefix);
        let mut tags = Vec::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.is_file() && path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents.")) {
                tags.extend(events::scalars_of(events::read_events(&path)?).into_iter().map(|(t, _, _)| t));
            }
        }
        tags.sort();
        tags.dedup();
        Ok(tags)
    };
    let train = tags("s3-checkpoints/logs")?;
    ensure!(train.contains(&"loss".to_string()) && train.contains(&"global_step/sec".to_string()), "{train:?}");
    let eval = tags("s3-checkpoints/logs/eval")?;
    ensure!(eval.contains(&"eval/accuracy".to_string()), "{eval:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("tensorboard --logdir s3://tfjob-examples/s3-checkpoints/logs"), "{stderr}");
    ensure!(run_dir.path().join("training.png").is_file(), "{stderr}");
    Ok(())
}

//! Sparse models as separate OS processes on 127.0.0.1: sparse_lr and
//! wide_deep over 2 ps + 2 workers, sync and async, over the tensor channel
//! and gRPC, reach the AUC the data generator promises (within 0.02); a ps
//! killed mid-run restores its embedding rows from the checkpoint.

use std::time::Duration;

mod common;

use common::*;

const LIMIT: Duration = Duration::from_secs(240);

/// The generator's data written to files (`generate`): (train, eval, achievable AUC).
fn generate(dir: &std::path::Path, format: &str, gzip: bool) -> (String, String, f64) {
    let mut args = vec!["generate".to_string(), format!("--data_format={format}"), format!("--out={}", dir.display()), "--seed=3".into()];
    if gzip {
        args.push("--gzip".into());
    }
    let out = std::process::Command::new(BIN).args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap().to_string();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    (v["train"].as_str().unwrap().into(), v["eval"].as_str().unwrap().into(), v["achievable_auc"].as_f64().unwrap())
}

/// The AUC a worker logged as achievable on generated data.
fn logged_achievable(log: &str) -> f64 {
    let line = log.lines().find(|l| l.contains("the true model's AUC")).unwrap_or_else(|| panic!("no achievable AUC logged:\n{}", tail(log, 2000)));
    line.rsplit(' ').next().unwrap().trim().parse().unwrap()
}

/// Runs 2 ps + 2 workers with `extra` until they finish; returns the results.
fn run(extra: &[String], job: &mut Job) -> Vec<Finished> {
    let ports = free_ports(4);
    let (ps_hosts, worker_hosts) = (hosts(&ports[..2]), hosts(&ports[2..]));
    for (name, role, i) in [("ps0", "ps", 0), ("ps1", "ps", 1), ("worker0", "worker", 0), ("worker1", "worker", 1)] {
        let mut args = vec![
            format!("--ps_hosts={ps_hosts}"),
            format!("--worker_hosts={worker_hosts}"),
            format!("--job_name={role}"),
            format!("--task_index={i}"),
            "--bind=127.0.0.1".into(),
            "--optimizer=adagrad".into(),
            "--learning_rate=0.2".into(),
            "--hash_buckets=65536".into(),
            "--eval_examples=5000".into(),
            "--log_every_steps=50".into(),
            "--connect_timeout_secs=60".into(),
        ];
        args.extend(extra.iter().cloned());
        job.spawn(name, &args, &[]);
    }
    std::mem::take(job).wait_all(LIMIT)
}

fn assert_auc(results: &[Finished], achievable: f64, what: &str) {
    assert_all_ok(results);
    for r in results.iter().filter(|r| r.name.starts_with("worker")) {
        let rep = r.report();
        let auc = rep["auc"].as_f64().unwrap_or_else(|| panic!("{what}: {}: no auc in {rep}", r.name));
        assert!(auc >= achievable - 0.02, "{what}: {}: AUC {auc:.4}, the data allow {achievable:.4}", r.name);
        assert!(rep["log_loss"].as_f64().is_some_and(|l| l < 0.6), "{what}: {rep}");
    }
}

/// sparse_lr on libsvm files (one of them gzipped), sync over the tensor
/// channel and async over gRPC.
#[test]
fn sparse_lr_reaches_the_achievable_auc() {
    let data = tempfile::tempdir().unwrap();
    let (train, eval, achievable) = generate(data.path(), "libsvm", false);
    let gz = tempfile::tempdir().unwrap();
    let (train_gz, _, _) = generate(gz.path(), "libsvm", true);
    for (mode, extra) in [("sync", vec!["--sync_replicas", "--num_epochs=3"]), ("async", vec!["--tensor_channel=false", "--num_epochs=3"])] {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["--model=sparse_lr".into(), "--data_format=libsvm".into(), format!("--eval_files={eval}")]);
        // The same examples twice, the second copy gzipped: six epochs' worth.
        args.push(format!("--train_files={train},{train_gz}"));
        let mut job = Job::new();
        let results = run(&args, &mut job);
        assert_auc(&results, achievable, &format!("sparse_lr {mode}"));
        let chief = results.iter().find(|r| r.name == "worker0").unwrap().report();
        assert_eq!(chief["examples_trained"].as_u64(), Some(3 * 40_000), "{chief}");
        // The ps holds only the rows that were updated: the 400 features, not 65,536 rows.
        let ps = results.iter().find(|r| r.name == "ps1").unwrap().report();
        assert!(ps["variables"].to_string().contains("linear/weights/part_1"), "{ps}");
    }
}

/// wide_deep on generated criteo-like data, sync and async.
#[test]
fn wide_deep_reaches_the_achievable_auc() {
    for (mode, extra) in [("sync", vec!["--sync_replicas"]), ("async", vec![])] {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["--model=wide_deep", "--num_epochs=4", "--hidden_units=16", "--embedding_dim=4", "--partition_strategy=div"].map(String::from));
        let mut job = Job::new();
        let results = run(&args, &mut job);
        let achievable = logged_achievable(&results[2].stderr);
        assert_auc(&results, achievable, &format!("wide_deep {mode}"));
    }
}

/// kill -9 of a ps holding embedding rows, in sync training: it restores
/// its rows (and their Adagrad state) from the latest checkpoint, the
/// workers rejoin, and the job still reaches the AUC.
#[test]
fn a_killed_ps_restores_its_rows() {
    let ckpt = tempfile::tempdir().unwrap();
    let ports = free_ports(4);
    let (ps_hosts, worker_hosts) = (hosts(&ports[..2]), hosts(&ports[2..]));
    let args = |role: &str, i: u32| {
        strings(&[
            &format!("--ps_hosts={ps_hosts}"),
            &format!("--worker_hosts={worker_hosts}"),
            &format!("--job_name={role}"),
            &format!("--task_index={i}"),
            "--bind=127.0.0.1",
            "--model=sparse_lr",
            "--optimizer=adagrad",
            "--learning_rate=0.2",
            "--hash_buckets=65536",
            "--eval_examples=5000",
            "--log_every_steps=20",
            "--sync_replicas",
            "--num_epochs=4",
            "--save_checkpoint_steps=100",
            &format!("--checkpoint_dir={}", ckpt.path().display()),
            "--connect_timeout_secs=60",
        ])
    };
    let mut job = Job::new();
    job.spawn("ps0", &args("ps", 0), &[]);
    job.spawn("ps1", &args("ps", 1), &[]);
    job.spawn("worker0", &args("worker", 0), &[]);
    job.spawn("worker1", &args("worker", 1), &[]);
    job.wait_until(LIMIT, "a checkpoint after step 200", |j| j.stderr("worker0").contains("checkpoint of global_step=200"));
    job.kill("ps1");
    std::thread::sleep(Duration::from_millis(300));
    job.restart("ps1");
    let results = job.wait_all(LIMIT);
    let achievable = logged_achievable(&results[2].stderr);
    assert_auc(&results, achievable, "sparse_lr with a ps killed");
    let ps_log = &results.iter().find(|r| r.name == "ps1").unwrap().stderr;
    let restored = ps_log.lines().find(|l| l.contains("restored")).unwrap_or_else(|| panic!("ps1 did not restore:\n{}", tail(ps_log, 3000)));
    assert!(restored.contains("global_step="), "{restored}");
    assert!(results.iter().any(|r| r.stderr.contains("rejoining the parameter servers")));
}

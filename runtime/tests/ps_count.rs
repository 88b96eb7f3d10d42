//! A job restarted with another number of ps tasks goes on from its
//! checkpoint: every ps cuts its part (dense pieces, embedding rows, their
//! optimizer slots) out of a checkpoint written by more or fewer ps tasks.
//! Checked bit for bit: wide_deep trained in sync by one worker, stopped and
//! restarted twice (1 -> 3 -> 2 ps tasks), ends with exactly the variables
//! and slots of the same job restarted with 1 ps task each time.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ndarray::ArrayD;
use tfjob_runtime::checkpoint::{self, ShardData};
use tfjob_runtime::embedding::EmbeddingPart;
use tfjob_runtime::storage::Location;
use tfjob_runtime::trained::join_parts;

mod common;

use common::*;

const LIMIT: Duration = Duration::from_secs(240);

/// One run of `num_ps` ps tasks and one worker to `steps` global steps,
/// restoring from and checkpointing to `dir`. Returns the results.
fn run(dir: &Path, num_ps: usize, steps: u64) -> Vec<Finished> {
    let ports = free_ports(num_ps + 1);
    let mut job = Job::new();
    let tasks = (0..num_ps).map(|i| ("ps", i)).chain([("worker", 0)]);
    for (role, i) in tasks {
        job.spawn(&format!("{role}{i}"), &exact_args(&ports[..num_ps], &ports[num_ps..], role, i as u32, dir, steps), &[]);
    }
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    results
}

/// The flags of a task of a deterministic job: wide_deep trained in sync
/// by one worker to `steps`, checkpointed to `dir`.
fn exact_args(ps: &[u16], workers: &[u16], role: &str, i: u32, dir: &Path, steps: u64) -> Vec<String> {
    let mut args = classic_flags(ps, workers, role, i);
    args.extend(strings(&[
        "--model=wide_deep",
        "--hidden_units=16",
        "--embedding_dim=4",
        "--hash_buckets=4096",
        "--optimizer=adagrad",
        "--learning_rate=0.1",
        "--sync_replicas",
        "--eval_examples=2000",
        "--connect_timeout_secs=60",
        // Dense variables over 256 bytes are cut over the ps tasks too.
        "--partition_threshold_bytes=256",
        "--save_checkpoint_steps=50",
        "--log_every_steps=10",
    ]));
    args.push(format!("--train_steps={steps}"));
    args.push(format!("--checkpoint_dir={}", dir.display()));
    args
}

/// [`run`] on 1 ps, with ps 1 and 2 started while it trains (the chief
/// moves the state to 3 ps tasks at a step boundary) and ps 2 stopped once
/// the job trained on 3 for a while (it hands its part over: 2 ps tasks to
/// the end).
fn moved_run(dir: &Path, steps: u64) -> Vec<Finished> {
    let ports = free_ports(4);
    let (ps3, workers) = (&ports[..3], &ports[3..]);
    let mut job = Job::new();
    for role in ["ps", "worker"] {
        job.spawn(&format!("{role}0"), &exact_args(&ps3[..1], workers, role, 0, dir, steps), &[]);
    }
    job.wait_until(LIMIT, "global step 100", |j| j.logged_global_step("worker0") >= 100);
    for i in 1..3 {
        job.spawn(&format!("ps{i}"), &exact_args(ps3, workers, "ps", i, dir, steps), &[]);
    }
    job.wait_until(LIMIT, "the move to 3 ps tasks", |j| j.stderr("worker0").contains("from 1 to 3 ps task(s)"));
    let at = job.logged_global_step("worker0");
    job.wait_until(LIMIT, "100 steps on 3 ps tasks", |j| j.logged_global_step("worker0") >= at + 100);
    job.terminate("ps2");
    job.wait_until(LIMIT, "the move to 2 ps tasks", |j| j.stderr("worker0").contains("from 3 to 2 ps task(s)"));
    let at = job.logged_global_step("worker0");
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    assert!(at + 100 <= steps as i64, "the job must train on after the last move (moved at step {at} of {steps}): make it longer");
    results
}

/// What a checkpoint holds, whatever its layout: every dense variable and
/// slot whole, every embedding row (values and slots) by variable and id.
#[derive(Debug, PartialEq)]
struct Content {
    step: i64,
    dense: BTreeMap<String, ArrayD<f32>>,
    rows: BTreeMap<(String, i64), Vec<f32>>,
}

fn content(dir: &Path) -> Content {
    let ckpt = checkpoint::latest_complete(&Location::parse(&dir.display().to_string()).unwrap()).unwrap().expect("a complete checkpoint");
    let all: ShardData = checkpoint::read_all(&ckpt).unwrap();
    let is_rows = |n: &str| all.row_ids.iter().any(|(r, _)| n.split(':').next() == Some(r.as_str()));
    // `x/part_1:slot0` joins as `x:slot0` (part 1).
    let renamed = |(n, s, v): &(String, Vec<usize>, Vec<f32>)| {
        let name = match n.split_once(':') {
            Some((base, slot)) => match base.rsplit_once("/part_") {
                Some((var, k)) => format!("{var}:{slot}/part_{k}"),
                None => n.clone(),
            },
            None => n.clone(),
        };
        (name, s.clone(), v.clone())
    };
    let dense = all.variables.iter().chain(&all.slots).filter(|t| !is_rows(&t.0)).map(renamed).collect();
    let dense = join_parts("checkpoint", dense).unwrap();
    let mut rows = BTreeMap::new();
    for (name, ids) in &all.row_ids {
        let part: EmbeddingPart = serde_json::from_str(&all.embeddings.iter().find(|(n, _)| n == name).unwrap().1).unwrap();
        let tensor = |suffix: &str| all.variables.iter().chain(&all.slots).find(|t| t.0 == format!("{name}{suffix}")).map(|t| t.2.clone()).unwrap_or_default();
        let (values, s0, s1) = (tensor(""), tensor(":slot0"), tensor(":slot1"));
        let d = part.dim;
        for (i, &id) in ids.iter().enumerate() {
            let row: Vec<f32> = [&values, &s0, &s1].iter().flat_map(|v| v.get(i * d..(i + 1) * d).unwrap_or_default().iter().copied()).collect();
            assert!(rows.insert((part.variable.clone(), id), row).is_none(), "{name}: row {id} twice");
        }
    }
    Content { step: ckpt.global_step, dense, rows }
}

#[test]
fn a_job_restarted_with_another_ps_count_goes_on_exactly() {
    let first = tempfile::tempdir().unwrap();
    run(first.path(), 1, 100);
    // The same first checkpoint for both: what follows differs only in
    // the ps count.
    let (moved, fixed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for to in [moved.path(), fixed.path()] {
        let status = std::process::Command::new("cp").arg("-r").arg(format!("{}/.", first.path().display())).arg(to).status().unwrap();
        assert!(status.success());
    }
    for (steps, ps) in [(200, 3), (300, 2)] {
        let results = run(moved.path(), ps, steps);
        for r in results.iter().filter(|r| r.name.starts_with("ps")) {
            let line =
                r.stderr.lines().find(|l| l.contains("cut out of")).unwrap_or_else(|| panic!("{} did not cut its part:\n{}", r.name, tail(&r.stderr, 3000)));
            assert!(line.contains(&format!("for {ps} now (global_step={})", steps - 100)), "{line}");
        }
        let chief = results.iter().find(|r| r.name == "worker0").unwrap().report();
        assert_eq!(chief["global_step"].as_i64(), Some(steps as i64), "{chief}");
        run(fixed.path(), 1, steps);
    }
    let (moved, fixed) = (content(moved.path()), content(fixed.path()));
    assert_eq!(moved.step, 300);
    assert!(moved.rows.len() > 100, "wide_deep materialised {} rows", moved.rows.len());
    assert_eq!(moved.dense.keys().collect::<Vec<_>>(), fixed.dense.keys().collect::<Vec<_>>());
    for (name, value) in &fixed.dense {
        assert_eq!(&moved.dense[name], value, "{name}: restarted 1 -> 3 -> 2 ps vs 1 -> 1 -> 1");
    }
    assert_eq!(moved.rows.len(), fixed.rows.len());
    assert!(moved.rows == fixed.rows, "embedding rows differ");
}

/// The same deterministic job with ps tasks added and removed while it
/// trains (1 -> 3 -> 2) and on 1 ps throughout ends with the same values,
/// slots and rows, bit for bit: a move loses no update and applies none
/// twice, and re-placing the state changes no arithmetic.
#[test]
fn a_job_whose_ps_tasks_change_while_it_trains_ends_exactly_as_one_that_kept_them() {
    const STEPS: u64 = 3000;
    let (moved, fixed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let results = moved_run(moved.path(), STEPS);
    let chief = results.iter().find(|r| r.name == "worker0").unwrap();
    for (from, to) in [(1, 3), (3, 2)] {
        let line = chief.stderr.lines().find(|l| l.contains(&format!("from {from} to {to} ps task(s)"))).unwrap();
        eprintln!("{line}");
    }
    run(fixed.path(), 1, STEPS);
    let (moved, fixed) = (content(moved.path()), content(fixed.path()));
    assert_eq!((moved.step, fixed.step), (STEPS as i64, STEPS as i64));
    assert_eq!(moved.dense.keys().collect::<Vec<_>>(), fixed.dense.keys().collect::<Vec<_>>());
    for (name, value) in &fixed.dense {
        assert_eq!(&moved.dense[name], value, "{name}: moved 1 -> 3 -> 2 ps while training vs 1 ps");
    }
    assert_eq!(moved.rows.len(), fixed.rows.len());
    assert!(moved.rows == fixed.rows, "embedding rows differ");
}

/// wide_deep on generated sparse data: about 3,600 async steps, long
/// enough for both moves, the checkpoint after them and a ps restarted to
/// happen while it trains (3 epochs left ~1 s after the second move once
/// the generator got faster).
const WIDE_DEEP: &[&str] = &[
    "--model=wide_deep",
    "--hidden_units=16",
    "--embedding_dim=4",
    "--hash_buckets=65536",
    "--optimizer=adagrad",
    "--learning_rate=0.2",
    "--eval_examples=5000",
    "--num_epochs=6",
    "--generated_examples=60000",
];

/// A dense MLP (784-64-10 on synthetic MNIST-shaped data) whose layers are
/// cut over the ps tasks: about 6,000 steps.
const MLP: &[&str] = &["--model=mlp", "--hidden_units=64", "--learning_rate=0.1", "--batch_size=32", "--eval_examples=2000", "--num_epochs=10"];

/// The flags of one task of a job (`model`'s flags) trained while ps tasks are added.
fn elastic_args(model: &[&str], ps: &[u16], workers: &[u16], role: &str, i: u32, mode: &str, dir: &Path) -> Vec<String> {
    let mut args = classic_flags(ps, workers, role, i);
    args.extend(strings(model));
    args.extend([format!("--checkpoint_dir={}", dir.display()), "--save_checkpoint_steps=200".into()]);
    args.extend(strings(&["--log_every_steps=20", "--connect_timeout_secs=60", "--partition_threshold_bytes=256", "--replicas_to_aggregate=auto"]));
    if mode == "sync" {
        args.push("--sync_replicas".into());
    }
    args
}

/// Runs a job of `model` with 2 workers from 1 ps; with `scale`, ps 1 and 2 are
/// started (their TF_CONFIG lists 3) once it trains, and once the state has
/// moved to them ps 2 is stopped (SIGTERM, as a scale-down deletes its pod)
/// and hands its part over to ps 0 and 1; worker 1 is killed (-9) when the
/// first move is proposed and started again after it; ps 1 is killed (-9)
/// once the chief checkpointed the 2-ps layout, and started again with its
/// TF_CONFIG of 3 ps (as a container restarted in place): it must take the
/// job's 2-ps layout from the checkpoint. Returns the chief's report and
/// log, and every task's end.
fn elastic_run(model: &[&str], mode: &str, scale: bool) -> (serde_json::Value, String, Vec<Finished>) {
    let ports = free_ports(5);
    let (ps3, workers) = (&ports[..3], &ports[3..]);
    let checkpoints = tempfile::tempdir().unwrap();
    let elastic_args = |model, ps, workers, role, i, mode| elastic_args(model, ps, workers, role, i, mode, checkpoints.path());
    let mut job = Job::new();
    job.spawn("ps0", &elastic_args(model, &ps3[..1], workers, "ps", 0, mode), &[]);
    for i in 0..2 {
        job.spawn(&format!("worker{i}"), &elastic_args(model, &ps3[..1], workers, "worker", i, mode), &[]);
    }
    if scale {
        job.wait_until(LIMIT, "global step 60", |j| j.logged_global_step("worker0") >= 60);
        for i in 1..3 {
            job.spawn(&format!("ps{i}"), &elastic_args(model, ps3, workers, "ps", i, mode), &[]);
        }
        // Worker 1 is lost as the move begins (the new ps tasks propose
        // within a second), and comes back after it.
        job.wait_until(LIMIT, "the proposal", |j| j.stderr("ps0").contains("proposes 3 ps task(s)"));
        job.kill("worker1");
        job.wait_until(LIMIT, "the move to 3 ps tasks", |j| j.stderr("worker0").contains("from 1 to 3 ps task(s)"));
        job.restart("worker1");
        let at = job.logged_global_step("worker0");
        job.wait_until(LIMIT, "30 steps on 3 ps tasks", |j| j.logged_global_step("worker0") >= at + 30);
        job.terminate("ps2");
        job.wait_until(LIMIT, "the move to 2 ps tasks", |j| j.stderr("worker0").contains("from 3 to 2 ps task(s)"));
        job.wait_until(LIMIT, "a checkpoint of the 2-ps layout", |j| {
            let log = j.stderr("worker0");
            log.split("from 3 to 2 ps task(s)").nth(1).is_some_and(|after| after.contains("checkpoint of global_step="))
        });
        job.kill("ps1");
        job.restart("ps1");
    }
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    let chief = results.iter().find(|r| r.name == "worker0").unwrap();
    (chief.report(), chief.stderr.clone(), results)
}

/// ps tasks added to a training job and one removed (1 -> 3 -> 2):
/// wide_deep sync and async, a dense MLP async. The chief moves the state
/// at a step boundary each time and the job goes on; the removed ps hands
/// its part over before it exits; every epoch is trained once and the AUC
/// (accuracy) is that of the same job on 1 ps.
#[test]
fn ps_tasks_added_and_removed_while_a_job_trains() {
    // (model, its flags, mode, the metric, how close)
    let cases = [("wide_deep", WIDE_DEEP, "sync", "auc", 0.01), ("wide_deep", WIDE_DEEP, "async", "auc", 0.01), ("mlp", MLP, "async", "accuracy", 0.03)];
    for (name, model, mode, metric, within) in cases {
        let what = format!("{name} {mode}");
        let (fixed, _, _) = elastic_run(model, mode, false);
        let (scaled, log, results) = elastic_run(model, mode, true);
        for (from, to) in [(1, 3), (3, 2)] {
            let moved = log
                .lines()
                .find(|l| l.contains(&format!("moved the job's state from {from} to {to} ps task(s)")))
                .unwrap_or_else(|| panic!("{what}: no move from {from} to {to}:\n{}", tail(&log, 4000)));
            eprintln!("{what}: {moved}");
        }
        for key in ["epochs_completed", "examples_trained"] {
            assert_eq!(scaled[key], fixed[key], "{what}: {key}: {scaled} vs {fixed}");
        }
        let (a, b) = (scaled[metric].as_f64().unwrap(), fixed[metric].as_f64().unwrap());
        assert!((a - b).abs() < within, "{what}: {metric} {a:.4} with ps added and removed, {b:.4} on 1 ps");
        let of = |name: &str| results.iter().find(|r| r.name == name).unwrap();
        assert!(of("ps1").stderr.contains("staged layout version 3"), "{what}: ps1 staged nothing:\n{}", tail(&of("ps1").stderr, 3000));
        assert!(of("ps1").report()["variables"].as_array().is_some_and(|v| !v.is_empty()), "{what}: ps1 holds nothing: {}", of("ps1").report());
        // How many pushes a move cut in two (async: their rest goes to the new layout).
        let cut: usize = results.iter().filter(|r| r.name.starts_with("worker")).map(|r| r.stderr.matches("a move cut a push in two").count()).sum();
        eprintln!("{what}: {cut} push(es) cut in two by the moves");
        let ps1 = &of("ps1").stderr;
        assert!(ps1.contains("the job's layout is version 3 (2 ps task(s))"), "{what}: ps1 did not take the 2-ps layout when restarted:\n{}", tail(ps1, 3000));
        let ps2 = &of("ps2").stderr;
        assert!(ps2.contains("staged layout version 2") && ps2.contains("handed its state over"), "{what}: ps2:\n{}", tail(ps2, 3000));
    }
}

//! `tfjob-runtime` without a cluster (one process, no ps): it writes
//! checkpoints and TensorBoard events like a cluster's chief, so `export`
//! finds what it trained; it refuses a checkpoint directory it would
//! overwrite. Every run is an OS process.

use std::process::{Command, Output};

mod common;

use common::BIN;

fn runtime(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("TF_CONFIG").output().expect("tfjob-runtime runs")
}

fn said(out: &Output) -> String {
    format!("exit {:?}\nstdout:\n{}\nstderr:\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn one_process_writes_checkpoints_and_events_that_export_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ckpt = dir.path().join("ckpt");
    let logs = dir.path().join("logs");
    let (ckpt_flag, logs_flag) = (format!("--checkpoint_dir={}", ckpt.display()), format!("--log_dir={}", logs.display()));
    let out = runtime(&["--model=linear", "--train_steps=1500", "--log_every_steps=100", &ckpt_flag, &logs_flag]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(ckpt.join("ckpt-0000001500/index.json").is_file(), "no final checkpoint: {}", said(&out));
    let events: Vec<_> =
        std::fs::read_dir(&logs).expect("the log dir").flatten().filter(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents.")).collect();
    assert_eq!(events.len(), 1, "{}", said(&out));
    assert!(events[0].metadata().expect("metadata").len() > 200, "events of 15 logged steps");

    let npz = dir.path().join("w.npz");
    let out = runtime(&["export", &ckpt_flag, &format!("--out={}", npz.display())]);
    assert!(out.status.success(), "{}", said(&out));
    let report: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default()).expect("export's JSON line");
    assert_eq!(report["global_step"], 1500, "{report}");
    assert_eq!(report["arrays"]["dense/kernel"], serde_json::json!([1, 1]), "{report}");

    // Training again into the same directory would overwrite or mix checkpoints: refused.
    let out = runtime(&["--model=linear", "--train_steps=100", &ckpt_flag]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds checkpoints already"), "{}", said(&out));
}

/// A matrix product split over threads sums every output element over k in
/// the same order as on one thread: the MLP trains to the same bits.
#[test]
fn the_mlp_trains_to_the_same_numbers_on_one_thread_or_two() {
    let report = |threads: &str| {
        let out =
            runtime(&["--model=mlp", "--train_steps=150", "--log_every_steps=0", "--eval_examples=1000", &format!("--intra_op_parallelism_threads={threads}")]);
        assert!(out.status.success(), "{}", said(&out));
        let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
        let r: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {}", said(&out)));
        (r["loss"].clone(), r["accuracy"].clone())
    };
    let one = report("1");
    assert!(one.0.as_f64().is_some_and(f64::is_finite), "{one:?}");
    assert_eq!(report("2"), one);
    assert_eq!(report("4"), one);
}

/// `rows` of a learnable two-class CSV (label 1 when a > b) with the columns in `order`.
fn csv(order: [&str; 3], rows: usize) -> String {
    let mut out = format!("{}\n", order.join(","));
    for i in 0..rows {
        let (a, b) = ((i * 37 % 101) as f32 / 10.0, (i * 53 % 97) as f32 / 10.0);
        let label = u8::from(a > b);
        let cell = |c: &str| match c {
            "a" => a.to_string(),
            "b" => b.to_string(),
            _ => label.to_string(),
        };
        out.push_str(&format!("{}\n", order.map(cell).join(",")));
    }
    out
}

/// test.csv matches train.csv by column name: reordered columns give what the same order gives;
/// an extra column is refused before training, naming it (not a panic after training).
#[test]
fn test_csv_is_matched_to_train_csv_by_column_name() {
    let accuracy = |test_csv: &str| -> Result<f64, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("train.csv"), csv(["a", "b", "label"], 400)).expect("train.csv");
        std::fs::write(dir.path().join("test.csv"), test_csv).expect("test.csv");
        let data_dir = format!("--data_dir={}", dir.path().display());
        let out =
            runtime(&["--model=softmax", "--data_format=csv", &data_dir, "--train_steps=300", "--learning_rate=0.1", "--batch_size=20", "--eval_examples=100"]);
        if !out.status.success() {
            return Err(said(&out));
        }
        let report: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default()).map_err(|e| format!("{e}: {}", said(&out)))?;
        report["accuracy"].as_f64().ok_or_else(|| said(&out))
    };
    let same = accuracy(&csv(["a", "b", "label"], 100)).expect("same columns");
    let reordered = accuracy(&csv(["label", "b", "a"], 100)).expect("reordered columns");
    assert!(same > 0.8, "the set is learnable: {same}");
    assert_eq!(reordered, same, "columns are matched by name, not position");
    let err = accuracy(&csv(["a", "b", "label"], 100).replacen("a,b,label", "a,b,label,c", 1).replace('\n', ",0\n").replacen("label,c,0", "label,c", 1))
        .expect_err("an extra column is refused");
    assert!(err.contains("exit Some(2)") && err.contains("not in") && err.contains(": c"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

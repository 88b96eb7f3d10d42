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

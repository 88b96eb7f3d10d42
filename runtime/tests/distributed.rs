//! Integration tests that start separate `tfjob-runtime` processes on
//! 127.0.0.1, as a user of distributed TensorFlow would start them by hand.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::*;

/// 1 ps + 2 workers on the classic linear regression, with the classic flags.
fn linear(sync: bool) {
    let ports = free_ports(3);
    let mut job = Job::new();
    let common = |job: &str, i: u32| {
        let mut a = classic_flags(&ports[..1], &ports[1..], job, i);
        a.extend(["--model=linear", "--learning_rate=0.01", "--train_steps=4000", "--log_every_steps=1000"].map(String::from));
        if sync {
            a.push("--sync_replicas".into());
        }
        a
    };
    job.spawn("ps0", &common("ps", 0), &[]);
    job.spawn("worker0", &common("worker", 0), &[]);
    job.spawn("worker1", &common("worker", 1), &[]);
    let results = job.wait_all(Duration::from_secs(120));
    assert_all_ok(&results);
    for r in results.iter().filter(|r| r.name.starts_with("worker")) {
        let rep = r.report();
        let (w, b) = (rep["W"].as_f64().unwrap(), rep["b"].as_f64().unwrap());
        assert!((w - 2.0).abs() < 0.1, "{}: W = {w}", r.name);
        assert!((b - 10.0).abs() < 0.1, "{}: b = {b}", r.name);
        assert!(rep["global_step"].as_i64().unwrap() >= 4000, "{}: {rep}", r.name);
    }
    let ps = results.iter().find(|r| r.name == "ps0").unwrap().report();
    assert!(ps["global_step"].as_i64().unwrap() >= 4000, "{ps}");
}

#[test]
fn linear_async_one_ps_two_workers() {
    linear(false);
}

#[test]
fn linear_sync_one_ps_two_workers() {
    linear(true);
}

/// The MLP over 2 ps and 3 workers, sync with one backup worker (aggregate
/// 2 of 3), configured through TF_CONFIG as the operator does.
#[test]
fn mlp_sync_with_backup_worker_over_two_ps() {
    let ports = free_ports(5);
    let addr = |p: u16| format!("127.0.0.1:{p}");
    let cluster = serde_json::json!({
        "ps": [addr(ports[0]), addr(ports[1])],
        "worker": [addr(ports[2]), addr(ports[3]), addr(ports[4])],
    });
    let args = strings(&[
        "--bind=127.0.0.1",
        "--model=mlp",
        "--hidden_units=32",
        "--learning_rate=0.5",
        "--batch_size=50",
        "--train_steps=300",
        "--sync_replicas=true",
        "--replicas_to_aggregate=2",
        "--eval_examples=1000",
        "--log_every_steps=100",
    ]);
    let mut job = Job::new();
    for (name, task_type, index) in [("ps0", "ps", 0), ("ps1", "ps", 1), ("worker0", "worker", 0), ("worker1", "worker", 1), ("worker2", "worker", 2)] {
        let tf_config = serde_json::json!({"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"});
        job.spawn(name, &args, &[("TF_CONFIG", tf_config.to_string())]);
    }
    let results = job.wait_all(Duration::from_secs(180));
    assert_all_ok(&results);
    let chief = results.iter().find(|r| r.name == "worker0").unwrap().report();
    let accuracy = chief["accuracy"].as_f64().unwrap();
    // 10 classes: chance is about 0.1-0.15 on the synthetic set.
    assert!(accuracy > 0.5, "held-out accuracy {accuracy}: {chief}");
    assert_eq!(chief["global_step"].as_i64().unwrap(), 300);
    // Variables really spread over both ps tasks.
    let mut all = Vec::new();
    for ps in ["ps0", "ps1"] {
        let rep = results.iter().find(|r| r.name == ps).unwrap().report();
        let vars: Vec<String> = rep["variables"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        assert!(!vars.is_empty(), "{ps} holds no variable: {rep}");
        assert!(rep["pushes_applied"].as_u64().unwrap() >= 300, "{rep}");
        all.extend(vars);
    }
    all.sort();
    assert_eq!(all, vec!["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"]);
    // With 3 workers and 2 to aggregate, some pushes were from backup workers.
    let stale: u64 = results.iter().filter(|r| r.name.starts_with("ps")).map(|r| r.report()["stale_gradients_dropped"].as_u64().unwrap()).sum();
    assert!(stale > 0, "a backup worker's late gradients are dropped as stale");
}

/// The local-server demo: a session evaluates a constant on a remote task.
#[test]
fn client_hello() {
    let port = free_ports(1)[0];
    let mut job = Job::new();
    job.spawn("server", &strings(&["server", &format!("--port={port}"), "--bind=127.0.0.1"]), &[]);
    let target = format!("grpc://localhost:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(BIN).args(["client", "--target", &target, "hello"]).output().unwrap();
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
            break;
        }
        assert!(Instant::now() < deadline, "client never reached the server: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(100));
    }
    // A training run submitted to the task streams progress and a result.
    let out =
        Command::new(BIN).args(["client", "--target", &target, "--train", "--model=linear", "--train_steps=2000", "--log_every_steps=500"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("step=")).count(), 4, "{stdout}");
    assert!(stdout.lines().last().unwrap().starts_with("finished: steps=2000"), "{stdout}");
}

/// Wrong input exits non-zero with a message naming the field.
#[test]
fn bad_cluster_input_names_the_field() {
    let cases: Vec<(Vec<String>, Option<&str>, &str)> = vec![
        (strings(&["--ps_hosts=a:1", "--worker_hosts=b:1", "--job_name=worker", "--task_index=3"]), None, "--task_index"),
        (strings(&["--ps_hosts=a:1", "--worker_hosts=b", "--job_name=ps"]), None, "--worker_hosts[0]: malformed address"),
        (strings(&["--ps_hosts=a:1", "--worker_hosts=a:1", "--job_name=ps"]), None, "already used by --ps_hosts[0]"),
        (strings(&["--ps_hosts=a:1", "--worker_hosts=b:1", "--job_name=boss"]), None, "unknown job \"boss\""),
        (vec![], Some("{not json"), "TF_CONFIG"),
        (vec![], Some(r#"{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":1}}"#), "task.index"),
        (strings(&["--model=resnet"]), None, "model"),
        (strings(&["--optimizer=rmsprop"]), None, "optimizer"),
    ];
    for (args, tf_config, want) in cases {
        let mut cmd = Command::new(BIN);
        cmd.args(&args).env_remove("TF_CONFIG");
        if let Some(c) = tf_config {
            cmd.env("TF_CONFIG", c);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?} {tf_config:?}: {stderr}");
    }
}

/// Chief + ps + worker + evaluator from TF_CONFIG (the shape the operator
/// writes), with a job token: everything converges and exits 0, the
/// evaluator logs its figures, and a call without the token is refused.
#[test]
fn chief_worker_evaluator_with_token() {
    let ports = free_ports(4);
    let addr = |p: u16| format!("127.0.0.1:{p}");
    let cluster = serde_json::json!({
        "chief": [addr(ports[0])],
        "ps": [addr(ports[1])],
        "worker": [addr(ports[2])],
        "evaluator": [addr(ports[3])],
    });
    let args = strings(&["--bind=127.0.0.1", "--train_steps=3000", "--log_every_steps=1000", "--eval_interval_secs=0.2", "--eval_examples=101"]);
    let token = "t0ken-for-this-job".to_string();
    let mut job = Job::new();
    for (name, task_type) in [("chief0", "chief"), ("ps0", "ps"), ("worker0", "worker"), ("evaluator0", "evaluator")] {
        let tf_config = serde_json::json!({"cluster": cluster, "task": {"type": task_type, "index": 0}, "environment": "cloud"});
        job.spawn(name, &args, &[("TF_CONFIG", tf_config.to_string()), ("TFJOB_TOKEN", token.clone())]);
    }
    // While the job runs: the ps refuses a caller without the token.
    let deadline = Instant::now() + Duration::from_secs(20);
    let target = format!("grpc://{}", addr(ports[1]));
    loop {
        let out = Command::new(BIN).args(["client", "--target", &target, "--status"]).env_remove("TFJOB_TOKEN").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("job token") {
            assert!(!out.status.success());
            break;
        }
        assert!(Instant::now() < deadline, "never saw UNAUTHENTICATED: {stderr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let results = job.wait_all(Duration::from_secs(120));
    assert_all_ok(&results);
    let chief = results.iter().find(|r| r.name == "chief0").unwrap().report();
    assert_eq!(chief["chief"], true);
    assert!((chief["W"].as_f64().unwrap() - 2.0).abs() < 0.1, "{chief}");
    assert!((chief["b"].as_f64().unwrap() - 10.0).abs() < 0.1, "{chief}");
    let worker = results.iter().find(|r| r.name == "worker0").unwrap().report();
    assert_eq!(worker["chief"], false, "with a chief task, worker 0 is not the chief");
    let evaluator = results.iter().find(|r| r.name == "evaluator0").unwrap();
    let eval_lines = evaluator.stderr.lines().filter(|l| l.contains("eval_loss=")).count();
    assert!(eval_lines >= 2, "the evaluator evaluated periodically:\n{}", evaluator.stderr);
    let report = evaluator.report();
    assert_eq!(report["role"], "evaluator");
    assert!(report["global_step"].as_i64().unwrap() >= 3000, "final evaluation after the last step: {report}");
    let ps = results.iter().find(|r| r.name == "ps0").unwrap().report();
    assert_eq!(report["global_step"], ps["global_step"], "the evaluator saw the last step of the ps");
    assert!(evaluator.stderr.contains("final evaluation at global_step="), "{}", evaluator.stderr);
    let chief_log = &results.iter().find(|r| r.name == "chief0").unwrap().stderr;
    assert!(chief_log.contains("waiting for the evaluator's final evaluation"), "the chief waited for it:\n{chief_log}");
    assert!(report["loss"].as_f64().unwrap() < 0.5, "{report}");
}

/// A dynamic worker whose sparse TF_CONFIG does not list the chief takes itself for the chief
/// (it is worker 0 and sees no chief job); the ps tasks, which know the chief, tell it otherwise
/// at the handshake, and it trains as an ordinary worker: one chief, and the job converges.
#[test]
fn a_sparse_worker_learns_the_chief_from_the_ps() {
    let ports = free_ports(3);
    let addr = |p: u16| format!("127.0.0.1:{p}");
    let full = serde_json::json!({ "chief": [addr(ports[0])], "ps": [addr(ports[1])], "worker": {"0": addr(ports[2])} });
    let without_chief = serde_json::json!({ "ps": [addr(ports[1])], "worker": {"0": addr(ports[2])} });
    let args = strings(&["--bind=127.0.0.1", "--train_steps=3000", "--log_every_steps=1000", "--sync_replicas"]);
    let mut job = Job::new();
    for (name, task_type, cluster) in [("chief0", "chief", &full), ("ps0", "ps", &full), ("worker0", "worker", &without_chief)] {
        let tf_config = serde_json::json!({"cluster": cluster, "task": {"type": task_type, "index": 0}, "environment": "cloud"});
        job.spawn(name, &args, &[("TF_CONFIG", tf_config.to_string())]);
    }
    let results = job.wait_all(Duration::from_secs(120));
    assert_all_ok(&results);
    let worker = results.iter().find(|r| r.name == "worker0").unwrap();
    assert!(worker.stderr.contains("the ps tasks name chief:0 as the chief: this task is not the chief"), "{}", tail(&worker.stderr, 3000));
    assert_eq!(worker.report()["chief"], false);
    let chief = results.iter().find(|r| r.name == "chief0").unwrap().report();
    assert_eq!(chief["chief"], true);
    assert!((chief["W"].as_f64().unwrap() - 2.0).abs() < 0.1 && (chief["b"].as_f64().unwrap() - 10.0).abs() < 0.1, "{chief}");
}

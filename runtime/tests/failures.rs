//! What happens to real jobs: tasks killed with SIGKILL and restarted,
//! checkpoints that are damaged, workers that come and go, observability.
//! Every task is a separate OS process on 127.0.0.1.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod common;

use common::*;

const LIMIT: Duration = Duration::from_secs(240);

fn linear_args(ports: &[u16], extra: &[&str]) -> impl Fn(&str, u32) -> Vec<String> + use<> {
    let ports = ports.to_vec();
    let extra = strings(extra);
    move |job: &str, i: u32| {
        let mut a = classic_flags(&ports[..1], &ports[1..], job, i);
        a.extend(["--model=linear", "--learning_rate=0.01", "--log_every_steps=50", "--connect_timeout_secs=60"].map(String::from));
        a.extend(extra.iter().cloned());
        a
    }
}

fn assert_converged(results: &[Finished], train_steps: i64) {
    for r in results.iter().filter(|r| r.name.starts_with("worker")) {
        let rep = r.report();
        let (w, b) = (rep["W"].as_f64().unwrap(), rep["b"].as_f64().unwrap());
        assert!((w - 2.0).abs() < 0.1 && (b - 10.0).abs() < 0.1, "{}: W = {w}, b = {b}", r.name);
        assert!(rep["global_step"].as_i64().unwrap() >= train_steps, "{}: {rep}", r.name);
    }
}

/// Starts 1 ps + 2 workers with `extra`, kills `victim` with SIGKILL once it
/// logged global step 1000, restarts it, and checks the job completes and
/// converges.
fn kill_and_restart(extra: &[&str], train_steps: i64, victim: &str) -> Vec<Finished> {
    let ports = free_ports(3);
    let steps = format!("--train_steps={train_steps}");
    let mut all = extra.to_vec();
    all.push(&steps);
    let args = linear_args(&ports, &all);
    let mut job = Job::new();
    job.spawn("ps0", &args("ps", 0), &[]);
    job.spawn("worker0", &args("worker", 0), &[]);
    job.spawn("worker1", &args("worker", 1), &[]);
    job.wait_until(LIMIT, &format!("{victim} at global step 1000"), |j| j.logged_global_step(victim) >= 1000);
    job.kill(victim);
    std::thread::sleep(Duration::from_millis(300));
    job.restart(victim);
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    assert_converged(&results, train_steps);
    let killed = results.iter().find(|r| r.name == victim).unwrap();
    assert_eq!(killed.stdout.lines().filter(|l| l.starts_with('{')).count(), 1, "the killed run printed no report");
    results
}

/// kill -9 of a worker in sync training: the step waits for it, the
/// restarted worker rejoins at the current step, training completes.
#[test]
fn worker_killed_and_restarted_rejoins_sync() {
    kill_and_restart(&["--sync_replicas"], 6000, "worker1");
}

/// kill -9 of a worker in async training.
#[test]
fn worker_killed_and_restarted_rejoins_async() {
    kill_and_restart(&[], 8000, "worker1");
}

/// kill -9 of the ps in sync training: it restores the latest checkpoint,
/// the workers rejoin, training completes, losing at most the steps since
/// that checkpoint.
#[test]
fn ps_killed_restores_from_checkpoint() {
    let ports = free_ports(3);
    let ckpt = tempfile::tempdir().unwrap();
    let dir = format!("--checkpoint_dir={}", ckpt.path().display());
    let args = linear_args(&ports, &["--sync_replicas", "--train_steps=6000", "--save_checkpoint_steps=500", &dir]);
    let mut job = Job::new();
    job.spawn("ps0", &args("ps", 0), &[]);
    job.spawn("worker0", &args("worker", 0), &[]);
    job.spawn("worker1", &args("worker", 1), &[]);
    job.wait_until(LIMIT, "a checkpoint after step 1500", |j| j.stderr("worker0").contains("checkpoint of global_step=1500"));
    let at_kill = job.logged_global_step("worker0");
    job.kill("ps0");
    std::thread::sleep(Duration::from_millis(500));
    job.restart("ps0");
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    assert_converged(&results, 6000);
    let ps_log = &results.iter().find(|r| r.name == "ps0").unwrap().stderr;
    let restored: i64 = ps_log
        .lines()
        .find_map(|l| l.split("restored").nth(1)?.split("global_step=").nth(1)?.trim_end_matches(')').trim().parse().ok())
        .unwrap_or_else(|| panic!("the ps did not restore:\n{}", tail(ps_log, 3000)));
    assert!(restored >= 1500 && restored % 500 == 0, "restored step {restored}");
    assert!(at_kill - restored <= 500 + 200, "lost {} steps (killed near {at_kill}, restored {restored})", at_kill - restored);
    // The workers noticed and rejoined.
    assert!(results.iter().any(|r| r.stderr.contains("rejoining the parameter servers")));
}

/// kill -9 of the chief: the restarted chief finds the variables
/// initialised, resumes, and still ends training for everyone.
#[test]
fn chief_killed_and_restarted_resumes() {
    let results = kill_and_restart(&[], 8000, "worker0");
    let chief = results.iter().find(|r| r.name == "worker0").unwrap();
    assert!(chief.stderr.contains("already initialised"), "{}", tail(&chief.stderr, 2000));
}

/// A truncated and a bit-flipped checkpoint are skipped for the previous
/// good one.
#[test]
fn damaged_checkpoints_are_skipped() {
    let ckpt = tempfile::tempdir().unwrap();
    let dir = format!("--checkpoint_dir={}", ckpt.path().display());
    // A first job leaves checkpoints at 500, 1000, 1500 and 2000.
    let ports = free_ports(2);
    let args = linear_args(&ports, &["--sync_replicas", "--train_steps=2000", "--save_checkpoint_steps=500", &dir]);
    let mut job = Job::new();
    job.spawn("ps0", &args("ps", 0), &[]);
    job.spawn("worker0", &args("worker", 0), &[]);
    assert_all_ok(&job.wait_all(LIMIT));
    let shard = |step: u32| ckpt.path().join(format!("ckpt-{step:010}")).join(tfjob_runtime::checkpoint::shard_file_name(0, 1));
    // Truncate the newest, flip one bit of the tensor data of the next.
    let f = std::fs::OpenOptions::new().write(true).open(shard(2000)).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len / 2).unwrap();
    let mut bytes = std::fs::read(shard(1500)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(shard(1500), bytes).unwrap();
    let out = std::process::Command::new(BIN).args(["checkpoint", "inspect"]).arg(ckpt.path()).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listing}");
    assert!(listing.matches("damaged").count() + listing.matches("DAMAGED").count() >= 2, "{listing}");
    // A new job restores from 1000 and trains on to 3000.
    let ports = free_ports(2);
    let args = linear_args(&ports, &["--sync_replicas", "--train_steps=3000", "--save_checkpoint_steps=500", &dir]);
    let mut job = Job::new();
    job.spawn("ps0", &args("ps", 0), &[]);
    job.spawn("worker0", &args("worker", 0), &[]);
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    let ps_log = &results.iter().find(|r| r.name == "ps0").unwrap().stderr;
    assert!(ps_log.contains("global_step=1000"), "restored from 1000:\n{}", tail(ps_log, 3000));
    let chief = results.iter().find(|r| r.name == "worker0").unwrap().report();
    assert_eq!(chief["local_steps"].as_i64().unwrap(), 2000, "trained from 1000 to 3000: {chief}");
}

fn http_get(port: u16, path: &str) -> String {
    try_http_get(port, path).unwrap()
}

/// `GET path` on 127.0.0.1:`port`: the whole answer, headers included.
fn try_http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(name) && !l.starts_with('#'))?.rsplit(' ').next()?.parse().ok()
}

/// Starts ps 0 and two workers of an elastic job (`args(workers, job,
/// index)`, the workers' ports being `ports[1..]`), waits for global step
/// 300, then scales up: a third worker, with the new cluster in its flags.
fn start_then_scale_up(ports: &[u16], args: impl Fn(&[u16], &str, u32) -> Vec<String>) -> Job {
    let two = [ports[1], ports[2]];
    let three = [ports[1], ports[2], ports[3]];
    let mut job = Job::new();
    job.spawn("ps0", &args(&two, "ps", 0), &[]);
    job.spawn("worker0", &args(&two, "worker", 0), &[]);
    job.spawn("worker1", &args(&two, "worker", 1), &[]);
    job.wait_until(LIMIT, "global step 300 with 2 workers", |j| j.logged_global_step("worker0") >= 300);
    job.spawn("worker2", &args(&three, "worker", 2), &[]);
    job
}

/// Elastic sync training (`--replicas_to_aggregate=auto`): a third worker
/// joins without restarting anyone, then two workers die, and the step
/// goes on with the one left.
#[test]
fn elastic_scale_up_and_down_without_stall() {
    let ports = free_ports(5);
    let metrics_port = ports[4];
    let ps_hosts = hosts(&ports[..1]);
    let common = |workers: &[u16], job: &str, i: u32| {
        let mut a = vec![
            format!("--ps_hosts={ps_hosts}"),
            format!("--worker_hosts={}", hosts(workers)),
            format!("--job_name={job}"),
            format!("--task_index={i}"),
            "--bind=127.0.0.1".into(),
            "--model=linear".into(),
            "--sync_replicas".into(),
            "--replicas_to_aggregate=auto".into(),
            "--lease_secs=1".into(),
            "--heartbeat_secs=0.2".into(),
            "--train_steps=100000000".into(),
            "--log_every_steps=50".into(),
        ];
        if job == "ps" {
            a.push(format!("--metrics_port={metrics_port}"));
        }
        a
    };
    let mut job = start_then_scale_up(&ports, common);
    job.wait_until(LIMIT, "worker2 training", |j| j.stderr("worker2").contains("local_step=100 "));
    let m = http_get(metrics_port, "/metrics");
    assert_eq!(metric(&m, "tfjob_ps_workers_live"), Some(3.0), "{m}");
    assert_eq!(metric(&m, "tfjob_ps_replicas_to_aggregate"), Some(3.0), "{m}");
    // Scale down to 1: two workers die.
    let before = job.logged_global_step("worker0");
    job.kill("worker2");
    job.kill("worker1");
    job.wait_until(Duration::from_secs(20), "steps with one worker left", |j| j.logged_global_step("worker0") >= before + 500);
    let m = http_get(metrics_port, "/metrics");
    assert_eq!(metric(&m, "tfjob_ps_workers_live"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "tfjob_ps_replicas_to_aggregate"), Some(1.0), "{m}");
}

/// Dynamic sharding under fire: sync elastic training of `--num_epochs`
/// while a worker joins, one leaves on SIGTERM, one is killed with SIGKILL
/// and the ps (holding the shard dispatcher) is killed and restored from its
/// checkpoint. Every example is still trained exactly once per epoch as the
/// dispatcher counts it, only the shards in flight at each loss are redone,
/// and the model converges as without the disturbance.
#[test]
fn every_epoch_is_trained_once_while_workers_come_and_go() {
    const EPOCHS: u64 = 50;
    let ports = free_ports(4);
    let ckpt = tempfile::tempdir().unwrap();
    let ps_hosts = hosts(&ports[..1]);
    let args = |workers: &[u16], job: &str, i: u32| {
        let mut a = vec![
            format!("--ps_hosts={ps_hosts}"),
            format!("--worker_hosts={}", hosts(workers)),
            format!("--job_name={job}"),
            format!("--task_index={i}"),
            "--bind=127.0.0.1".into(),
            "--model=linear".into(),
            "--learning_rate=0.01".into(),
            "--sync_replicas".into(),
            "--replicas_to_aggregate=auto".into(),
            format!("--num_epochs={EPOCHS}"),
            "--lease_secs=1".into(),
            "--heartbeat_secs=0.2".into(),
            "--log_every_steps=50".into(),
            "--save_checkpoint_steps=200".into(),
            format!("--checkpoint_dir={}", ckpt.path().display()),
        ];
        a.push("--connect_timeout_secs=60".into());
        a
    };
    // A third worker joins; its first gradient counts within a second.
    let mut job = start_then_scale_up(&ports, args);
    job.wait_until(LIMIT, "worker2's first gradient", |j| j.stderr("worker2").contains("first gradient accepted"));
    let first = job.stderr("worker2");
    let secs: f64 = first.split("first gradient accepted at global_step=").nth(1).and_then(|r| r.split('(').nth(1)?.split('s').next()?.parse().ok()).unwrap();
    assert!(secs < 1.0, "worker2 contributed {secs} s after it started");
    // worker1 is stopped on purpose: it leaves at once.
    job.terminate("worker1");
    assert!(job.stderr("worker1").contains("left the job"), "{}", tail(&job.stderr("worker1"), 2000));
    // Its log ends with its figures of the moment it stopped, as every task's does.
    let stopped = job.finished("worker1");
    let report = stopped.report();
    assert_eq!(stopped.code, Some(143), "SIGTERM: a retryable code");
    assert!(report["stopped"].is_string() && report["local_steps"].as_u64() > Some(0), "{report}");
    let ps_log = job.stderr("ps0");
    assert!(ps_log.contains("worker:1 left"), "{}", tail(&ps_log, 2000));
    // worker2 dies: its lease runs out and its shard is handed out again.
    let before = job.logged_global_step("worker0");
    job.kill("worker2");
    job.wait_until(LIMIT, "steps without worker2", |j| j.logged_global_step("worker0") >= before + 300);
    // The ps dies after a checkpoint: it restores the dispatcher with it.
    job.wait_until(LIMIT, "a checkpoint", |j| j.stderr("worker0").contains("checkpoint of global_step="));
    job.kill("ps0");
    std::thread::sleep(Duration::from_millis(300));
    job.restart("ps0");
    let results = job.wait_all(LIMIT);
    for r in &results {
        match r.name.as_str() {
            "worker1" => assert_eq!(r.code, Some(143), "SIGTERM"),
            "worker2" => assert_eq!(r.code, None, "SIGKILL"),
            _ => assert_eq!(r.code, Some(0), "{} exited with {:?}\n{}", r.name, r.code, tail(&r.stderr, 4000)),
        }
    }
    let chief = results.iter().find(|r| r.name == "worker0").unwrap().report();
    println!("the chief's final line: {chief}");
    assert_eq!(chief["epochs_completed"].as_u64(), Some(EPOCHS), "{chief}");
    assert_eq!(chief["examples_trained"].as_u64(), Some(EPOCHS * 101), "{chief}");
    // At each loss, at most the shards a worker holds: the one it trains
    // and, while it trains that one's last batch, the next one it asked for
    // ahead. Losses: worker1 (left), worker2 (killed), and worker0's and
    // worker2's at the checkpoint.
    let redone = chief["shards_redone"].as_u64().unwrap();
    assert!((1..=8).contains(&redone), "{redone} shards redone: {chief}");
    let (w, b) = (chief["W"].as_f64().unwrap(), chief["b"].as_f64().unwrap());
    assert!((w - 2.0).abs() < 0.1 && (b - 10.0).abs() < 0.1, "W = {w}, b = {b}");
    let ps_log = &results.iter().find(|r| r.name == "ps0").unwrap().stderr;
    assert!(ps_log.contains("shard dispatcher restored"), "{}", tail(ps_log, 3000));
    assert!(ps_log.contains("every shard of every epoch is done"), "{}", tail(ps_log, 3000));
}

/// TensorBoard event files of the chief and the evaluator parse back with
/// the expected tags; the worker's metrics endpoint and the gRPC health
/// service answer; ps 0's metrics show the job's progress (the loss and the
/// evaluation the tasks report by heartbeat, the dispatcher's plan).
#[test]
fn event_files_metrics_and_health() {
    let ports = free_ports(6);
    let logs = tempfile::tempdir().unwrap();
    let addr = |p: u16| format!("127.0.0.1:{p}");
    let cluster = serde_json::json!({
        "ps": [addr(ports[0])],
        "worker": [addr(ports[1]), addr(ports[2])],
        "evaluator": [addr(ports[3])],
    });
    let args = vec![
        "--bind=127.0.0.1".to_string(),
        "--train_steps=10000".into(),
        "--log_every_steps=100".into(),
        "--eval_interval_secs=0.2".into(),
        "--heartbeat_secs=0.05".into(),
        // More epochs than the steps train (about 100 of the linear model's
        // 101 points): --train_steps ends the job.
        "--num_epochs=1000".into(),
        format!("--log_dir={}", logs.path().display()),
    ];
    let mut job = Job::new();
    for (name, t, i) in [("ps0", "ps", 0), ("worker0", "worker", 0), ("worker1", "worker", 1), ("evaluator0", "evaluator", 0)] {
        let tf_config = serde_json::json!({"cluster": cluster, "task": {"type": t, "index": i}});
        let mut a = args.clone();
        match name {
            "worker1" => a.push(format!("--metrics_port={}", ports[4])),
            "ps0" => a.push(format!("--metrics_port={}", ports[5])),
            _ => {}
        }
        job.spawn(name, &a, &[("TF_CONFIG", tf_config.to_string())]);
    }
    job.wait_until(LIMIT, "training under way", |j| j.logged_global_step("worker1") >= 200);
    let m = http_get(ports[4], "/metrics");
    for name in ["tfjob_local_steps_total", "tfjob_step_seconds_total{task=\"worker:1\",part=\"compute\"}", "tfjob_bytes_sent_total"] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
    // Heartbeats come every 0.05 s and evaluations every 0.2 s: within a few,
    // well before the job ends (10000 steps of the linear model last a second or so).
    let reported = |_: &Job| try_http_get(ports[5], "/metrics").is_ok_and(|m| m.contains("tfjob_ps_loss") && m.contains("tfjob_ps_eval_loss"));
    job.wait_until(Duration::from_secs(10), "ps 0's metrics with the loss and an evaluation", reported);
    let m = http_get(ports[5], "/metrics");
    assert!(metric(&m, "tfjob_ps_loss").is_some_and(f64::is_finite), "{m}");
    assert!(metric(&m, "tfjob_ps_eval_step").is_some_and(|s| s >= 0.0), "{m}");
    assert_eq!(metric(&m, "tfjob_ps_train_steps"), Some(10000.0), "{m}");
    assert_eq!(metric(&m, "tfjob_ps_num_epochs"), Some(1000.0), "{m}");
    let line_points = tfjob_runtime::data::LINE_POINTS as f64;
    assert_eq!(metric(&m, "tfjob_ps_examples_per_epoch"), Some(line_points), "the linear model's points: {m}");
    // The standard gRPC health service answers without the job token.
    let health = std::process::Command::new(BIN).args(["client", "--target", &format!("grpc://{}", addr(ports[1])), "--health"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout).trim(), "SERVING", "{}", String::from_utf8_lossy(&health.stderr));
    let results = job.wait_all(LIMIT);
    assert_all_ok(&results);
    // The chief's events in the log dir, the evaluator's in <log_dir>/eval (as TensorFlow's).
    let files: Vec<_> = [logs.path().to_path_buf(), logs.path().join("eval")]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.is_file())
        .collect();
    assert!(files.iter().any(|p| p.parent() == Some(&logs.path().join("eval")) && p.to_string_lossy().ends_with(".eval")), "{files:?}");
    let tags_of = |suffix: &str| -> Vec<String> {
        let f = files.iter().find(|p| p.to_string_lossy().ends_with(suffix)).unwrap_or_else(|| panic!("no *{suffix} in {files:?}"));
        let mut tags: Vec<String> = tfjob_runtime::events::scalars(f).unwrap().into_iter().map(|(t, _, _)| t).collect();
        tags.sort();
        tags.dedup();
        tags
    };
    let chief = tags_of("chief");
    for t in ["loss", "W", "b", "global_step/sec", "eval/loss"] {
        assert!(chief.contains(&t.to_string()), "chief tags {chief:?}");
    }
    let eval = tags_of("eval");
    assert!(eval.contains(&"eval/loss".to_string()), "evaluator tags {eval:?}");
}

/// A static sync job (no `auto`) that a worker joins: the job keeps aggregating the number of
/// gradients its chief fixed at the start, and the new worker says so in its log (its late
/// gradients are a backup worker's); the job goes on.
#[test]
fn a_worker_joining_a_static_sync_job_is_told_what_it_is() {
    let ports = free_ports(4);
    let ps_hosts = hosts(&ports[..1]);
    let args = |workers: &[u16], job: &str, i: u32| {
        vec![
            format!("--ps_hosts={ps_hosts}"),
            format!("--worker_hosts={}", hosts(workers)),
            format!("--job_name={job}"),
            format!("--task_index={i}"),
            "--bind=127.0.0.1".into(),
            "--model=linear".into(),
            "--sync_replicas".into(),
            "--train_steps=100000000".into(),
            "--log_every_steps=50".into(),
        ]
    };
    let mut job = start_then_scale_up(&ports, args);
    job.wait_until(LIMIT, "worker2's view of the aggregation", |j| j.stderr("worker2").contains("backup workers"));
    let said = job.stderr("worker2");
    assert!(said.contains("aggregate 2 gradient(s), fixed by its chief at the start; this task sees 3 training task(s)"), "{}", tail(&said, 2000));
    let before = job.logged_global_step("worker0");
    job.wait_until(LIMIT, "steps after the join", |j| j.logged_global_step("worker0") >= before + 200);
}

//! How `tfjob-runtime` ends when it fails, under the `ExitCode` restart
//! policy's contract: 1-127 for a failure a restart would meet again (a bad
//! flag, bad data, missing credentials), 128 and above for one a restart
//! may cure (a peer out of reach); and a task stopped once the job has
//! ended still says how it ended. Every run is an OS process.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::{BIN, Job, classic_flags, free_ports, tail};

/// `tfjob-runtime args` with no cloud credentials in its environment, and
/// `metadata` as the instance metadata service (where the object stores
/// look for credentials last).
fn runtime_without_credentials(args: &[&str], metadata: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("TF_CONFIG");
    for (key, _) in std::env::vars() {
        if ["AWS_", "GOOGLE_", "AZURE_"].iter().any(|p| key.starts_with(p)) {
            cmd.env_remove(key);
        }
    }
    cmd.env("AWS_METADATA_ENDPOINT", metadata).env("AWS_REGION", "us-east-1");
    cmd.output().expect("tfjob-runtime runs")
}

/// An instance metadata service of a machine with no role: 404 to every request.
fn metadata_service_without_role() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = conn.read(&mut [0u8; 4096]);
            let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    format!("http://{addr}")
}

fn said(out: &Output) -> String {
    format!("exit {:?}\nstderr:\n{}", out.status.code(), String::from_utf8_lossy(&out.stderr))
}

fn assert_permanent(out: &Output, code: i32, says: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", said(out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(says), "wants {says:?}: {}", said(out));
}

#[test]
fn missing_object_store_credentials_are_a_permanent_failure_that_says_what_to_set() {
    let metadata = metadata_service_without_role();
    // One process: its checkpoint directory is looked at before training.
    let out = runtime_without_credentials(&["--model=linear", "--train_steps=10", "--checkpoint_dir=s3://no-such-bucket/ckpt"], &metadata);
    assert_permanent(&out, 4, "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");

    // A ps restores from its checkpoint directory before it serves.
    let ports = free_ports(2);
    let (ps, worker) = (format!("--ps_hosts=127.0.0.1:{}", ports[0]), format!("--worker_hosts=127.0.0.1:{}", ports[1]));
    let args = [&ps, &worker, "--job_name=ps", "--task_index=0", "--bind=127.0.0.1", "--checkpoint_dir=s3://no-such-bucket/ckpt"];
    let out = runtime_without_credentials(&args, &metadata);
    assert_permanent(&out, 2, "no credentials");

    // Data in a bucket: the same.
    let out = runtime_without_credentials(&["--model=softmax", "--train_steps=10", "--data_dir=s3://no-such-bucket/mnist"], &metadata);
    assert_permanent(&out, 2, "set AWS_ACCESS_KEY_ID");
}

#[test]
fn bad_flags_and_bad_data_are_permanent() {
    let metadata = "http://127.0.0.1:9";
    let out = runtime_without_credentials(&["--model=linear", "--no_such_flag=1"], metadata);
    assert_permanent(&out, 2, "--no_such_flag");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = format!("--data_dir={}", dir.path().display());
    let out = runtime_without_credentials(&["--model=softmax", "--train_steps=10", &data], metadata);
    assert_permanent(&out, 2, "no train-images-idx3-ubyte");
}

#[test]
fn a_parameter_server_out_of_reach_is_transient() {
    // Nothing listens at the ps's address: the worker gives up after the
    // connect timeout, and a restart (when the ps is back) may cure it.
    let ports = free_ports(2);
    let (ps, worker) = (format!("--ps_hosts=127.0.0.1:{}", ports[0]), format!("--worker_hosts=127.0.0.1:{}", ports[1]));
    let args = [&ps, &worker, "--job_name=worker", "--task_index=0", "--bind=127.0.0.1", "--model=linear", "--connect_timeout_secs=2"];
    let out = runtime_without_credentials(&args, "http://127.0.0.1:9");
    let code = out.status.code().unwrap_or_default();
    assert!((128..=255).contains(&code), "a lost peer wants a retryable code (>= 128): {}", said(&out));
}

/// `tfjob run` and the operator stop what still runs when a job has
/// succeeded: a ps stopped while it waits for a worker's goodbye still
/// prints its final line, and exits 0 (training is over).
#[test]
fn a_ps_stopped_after_training_prints_its_final_line_and_exits_0() {
    let ports = free_ports(3);
    let args = |job: &str, i: u32| -> Vec<String> {
        let mut a = classic_flags(&ports[..1], &ports[1..], job, i);
        a.extend(["--model=linear", "--train_steps=20000", "--log_every_steps=10"].map(String::from));
        a
    };
    let mut job = Job::new();
    for (name, job_name, i) in [("ps-0", "ps", 0), ("worker-0", "worker", 0), ("worker-1", "worker", 1)] {
        job.spawn(name, &args(job_name, i), &[]);
    }
    job.wait_until(Duration::from_secs(60), "worker-1 training", |j| j.logged_global_step("worker-1") > 0);
    // worker-1 freezes (a node under pressure): once the chief has ended
    // training, the ps waits for its goodbye (until its lease expires).
    job.signal("worker-1", libc::SIGSTOP);
    assert!(!job.stderr("worker-0").contains("told every ps to finish"), "the chief was done before worker-1 froze: train longer");
    job.wait_until(Duration::from_secs(60), "the chief's end", |j| j.stderr("worker-0").contains("told every ps to finish"));
    job.terminate("ps-0");
    let ps = job.finished("ps-0");
    assert_eq!(ps.code, Some(0), "{}", tail(&ps.stderr, 3000));
    assert!(ps.report()["global_step"].as_i64() >= Some(20000), "{}", ps.stdout);
    job.signal("worker-1", libc::SIGCONT);
}

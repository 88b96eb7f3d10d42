//! Helpers of the OS-process tests: free ports, jobs of processes (output
//! in files, so a test can read a task's log while it runs) that are all
//! killed when the test ends, final JSON reports.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_tfjob-runtime");

pub fn free_ports(n: usize) -> Vec<u16> {
    // Hold every listener until all ports are chosen so none repeats.
    let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

pub fn hosts(ports: &[u16]) -> String {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
}

/// The classic TF 1.x flags of task `job:i` of a cluster on 127.0.0.1
/// (`ps` and `workers` its ports), bound to 127.0.0.1.
pub fn classic_flags(ps: &[u16], workers: &[u16], job: &str, i: u32) -> Vec<String> {
    vec![
        format!("--ps_hosts={}", hosts(ps)),
        format!("--worker_hosts={}", hosts(workers)),
        format!("--job_name={job}"),
        format!("--task_index={i}"),
        "--bind=127.0.0.1".into(),
    ]
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

struct Spec {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// Processes of one job; every one is killed when the job is dropped.
pub struct Job {
    dir: tempfile::TempDir,
    specs: BTreeMap<String, Spec>,
    running: BTreeMap<String, Child>,
    /// Exit codes of processes that ended (the last run of each name).
    ended: BTreeMap<String, Option<i32>>,
    runs: BTreeMap<String, usize>,
}

pub struct Finished {
    pub name: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The final JSON line the task printed.
    pub fn report(&self) -> Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("{}: no JSON report; stdout:\n{}\nstderr:\n{}", self.name, self.stdout, tail(&self.stderr, 4000)));
        serde_json::from_str(line).unwrap()
    }
}

pub fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    &s[start..]
}

impl Default for Job {
    fn default() -> Self {
        Self::new()
    }
}

impl Job {
    pub fn new() -> Self {
        Job { dir: tempfile::tempdir().unwrap(), specs: BTreeMap::new(), running: BTreeMap::new(), ended: BTreeMap::new(), runs: BTreeMap::new() }
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn log_path(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.{ext}"))
    }

    pub fn spawn(&mut self, name: &str, args: &[String], env: &[(&str, String)]) {
        let spec = Spec { args: args.to_vec(), env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() };
        self.specs.insert(name.to_string(), spec);
        self.start(name);
    }

    /// (Re)starts a process with its spec; output is appended to its files.
    fn start(&mut self, name: &str) {
        let spec = &self.specs[name];
        let open = |ext: &str| std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(name, ext)).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(&spec.args).stdin(Stdio::null()).stdout(open("out")).stderr(open("err")).env_remove("TF_CONFIG").env_remove("TFJOB_TOKEN");
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        *self.runs.entry(name.to_string()).or_default() += 1;
        self.ended.remove(name);
        self.running.insert(name.to_string(), child);
    }

    /// SIGKILL, as a node or OOM killer would.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut c) = self.running.remove(name) {
            let _ = c.kill();
            let status = c.wait().unwrap();
            self.ended.insert(name.to_string(), status.code());
        }
    }

    /// SIGTERM, as a scale-down or a deleted pod would, and waits for the
    /// process to exit (up to 10 s; then SIGKILL and a failed test).
    pub fn terminate(&mut self, name: &str) {
        let Some(mut c) = self.running.remove(name) else { return };
        // SAFETY: plain kill(2) of our own child.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                self.ended.insert(name.to_string(), status.code());
                return;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("{name} did not exit within 10 s of SIGTERM\n{}", tail(&self.stderr(name), 3000));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to a running task (SIGSTOP freezes it, SIGCONT thaws it).
    pub fn signal(&mut self, name: &str, signal: i32) {
        if let Some(c) = self.running.get(name) {
            // SAFETY: plain kill(2) of our own child.
            unsafe {
                libc::kill(c.id() as i32, signal);
            }
        }
    }

    /// How a task that has exited ended, with its output so far.
    pub fn finished(&self, name: &str) -> Finished {
        assert!(!self.running.contains_key(name), "{name} is still running");
        Finished { name: name.to_string(), code: self.ended.get(name).copied().flatten(), stdout: self.stdout(name), stderr: self.stderr(name) }
    }

    /// Starts a killed task again, with the same arguments.
    pub fn restart(&mut self, name: &str) {
        assert!(!self.running.contains_key(name), "{name} is still running");
        self.start(name);
    }

    pub fn stderr(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name, "err")).unwrap_or_default()
    }

    pub fn stdout(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name, "out")).unwrap_or_default()
    }

    /// The largest `global_step=N` a task logged so far.
    pub fn logged_global_step(&self, name: &str) -> i64 {
        self.stderr(name)
            .lines()
            .filter_map(|l| l.split("global_step=").nth(1))
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<i64>().ok())
            .max()
            .unwrap_or(-1)
    }

    /// Waits until `ready(self)` or panics after `limit` with every log.
    pub fn wait_until(&mut self, limit: Duration, what: &str, ready: impl Fn(&Job) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            if Instant::now() > deadline {
                let logs = self.all_logs();
                panic!("timeout after {limit:?} waiting for {what}\n{logs}");
            }
            self.reap();
            if self.running.is_empty() && !ready(self) {
                let logs = self.all_logs();
                panic!("every task exited before {what}\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn reap(&mut self) {
        let done: Vec<String> = self
            .running
            .iter_mut()
            .filter_map(|(n, c)| c.try_wait().unwrap().map(|s| (n.clone(), s)))
            .map(|(n, s)| {
                self.ended.insert(n.clone(), s.code());
                n
            })
            .collect();
        for n in done {
            self.running.remove(&n);
        }
    }

    fn all_logs(&self) -> String {
        let mut logs = String::new();
        for name in self.specs.keys() {
            logs += &format!("--- {name} (runs: {}) ---\n{}\n", self.runs[name], tail(&self.stderr(name), 3000));
        }
        logs
    }

    /// Waits for every process to exit, up to `limit`; kills them all and
    /// fails the test on timeout.
    pub fn wait_all(mut self, limit: Duration) -> Vec<Finished> {
        let deadline = Instant::now() + limit;
        loop {
            self.reap();
            if self.running.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let names: Vec<_> = self.running.keys().cloned().collect();
                let logs = self.all_logs();
                for c in self.running.values_mut() {
                    let _ = c.kill();
                }
                panic!("timeout after {limit:?}: still running {names:?}\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.specs
            .keys()
            .map(|name| Finished { name: name.clone(), code: self.ended.get(name).copied().flatten(), stdout: self.stdout(name), stderr: self.stderr(name) })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in self.running.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn assert_all_ok(results: &[Finished]) {
    for r in results {
        assert_eq!(r.code, Some(0), "{} exited with {:?}\nstderr:\n{}", r.name, r.code, tail(&r.stderr, 4000));
    }
}

//! The process backend of `tfjob run`: every replica a child process on
//! 127.0.0.1, with the `tensorflow` container's command, args and env plus
//! `TF_CONFIG` and `TFJOB_TOKEN`. It plays the kubelet: restarts in place
//! under the pod restart policies `Always` and `OnFailure` (with a growing
//! back-off), and reports phases and exit codes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::ReplicaType;
use crate::plan::{ENV_TF_CONFIG, ENV_TOKEN, PlannedReplica};
use crate::status::{ObservedReplica, Phase};

use super::console::Console;
use super::{Backend, RunError, short_name};

/// The runtime's name in manifests; resolved to the binary next to `tfjob`.
pub const RUNTIME_COMMAND: &str = "tfjob-runtime";

struct Replica {
    planned: PlannedReplica,
    token: String,
    child: Option<Child>,
    phase: Phase,
    exit_code: Option<i32>,
    restart_count: i32,
    restart_at: Option<Instant>,
    backoff: Duration,
}

pub struct ProcessBackend {
    job: String,
    console: Arc<Console>,
    ports: Mutex<BTreeMap<(ReplicaType, i32), u16>>,
    replicas: BTreeMap<String, Replica>,
    /// Where `tfjob-runtime` is (next to the running `tfjob`, else PATH).
    runtime: PathBuf,
}

/// `tfjob-runtime` next to the current executable when it is there, else the
/// bare name (found on PATH).
pub fn runtime_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(RUNTIME_COMMAND)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(RUNTIME_COMMAND))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// Exit code as a kubelet reports it: the code, or 128 + the signal.
fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(255)
}

impl ProcessBackend {
    pub fn new(job: &str, console: Arc<Console>) -> Self {
        ProcessBackend { job: job.to_string(), console, ports: Mutex::new(BTreeMap::new()), replicas: BTreeMap::new(), runtime: runtime_binary() }
    }

    fn spawn(&self, planned: &PlannedReplica, token: &str) -> Result<Child, RunError> {
        let short = short_name(&self.job, &planned.pod_name);
        if planned.command.is_empty() {
            return Err(RunError::Start {
                replica: short,
                reason: "the `tensorflow` container has no `command`; locally the image's entrypoint is unknown, so give the command in the manifest (e.g. [\"tfjob-runtime\"])".into(),
            });
        }
        // As the kubelet: env values, then command and args, with their `$(VAR)` expanded.
        let env = super::replica_environment(planned, token);
        let argv = env.expand_all(&[planned.command.as_slice(), planned.args.as_slice()].concat());
        let program = if argv[0] == RUNTIME_COMMAND { self.runtime.clone() } else { PathBuf::from(&argv[0]) };
        let mut cmd = Command::new(&program);
        cmd.args(&argv[1..])
            .env_remove(ENV_TF_CONFIG)
            .env_remove(ENV_TOKEN)
            // Locally, replicas listen on loopback only (tfjob-runtime's --bind).
            .env("TFJOB_BIND", "127.0.0.1")
            .envs(env.vars().iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Its own process group (signals reach its children too), and
                // killed by the kernel if `tfjob run` dies.
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child =
            cmd.spawn().map_err(|e| RunError::Start { replica: short.clone(), reason: format!("cannot start {:?}: {e}", program.display().to_string()) })?;
        for stream in [child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>), child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>)]
            .into_iter()
            .flatten()
        {
            let console = self.console.clone();
            let name = short.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    match line {
                        Ok(l) => console.log_line(&name, &l),
                        Err(_) => break,
                    }
                }
            });
        }
        Ok(child)
    }

    /// SIGTERM to a replica's process group; SIGKILL after `grace`.
    fn stop_children(children: Vec<Child>, grace: Duration) {
        let mut children = children;
        for c in &children {
            // SAFETY: plain kill(2) on the child's process group.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
            if children.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in &mut children {
            // SAFETY: as above.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Backend for ProcessBackend {
    fn address(&self, rtype: ReplicaType, index: i32, _port: i32) -> String {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let port = *ports.entry((rtype, index)).or_insert_with(free_port);
        format!("127.0.0.1:{port}")
    }

    fn start(&mut self, replica: &PlannedReplica, token: &str) -> Result<(), RunError> {
        let child = self.spawn(replica, token)?;
        self.replicas.insert(
            replica.pod_name.clone(),
            Replica {
                planned: replica.clone(),
                token: token.to_string(),
                child: Some(child),
                phase: Phase::Running,
                exit_code: None,
                restart_count: 0,
                restart_at: None,
                backoff: Duration::from_millis(200),
            },
        );
        Ok(())
    }

    fn delete(&mut self, name: &str) {
        if let Some(mut r) = self.replicas.remove(name) {
            if let Some(c) = r.child.take() {
                Self::stop_children(vec![c], Duration::from_secs(3));
            }
        }
    }

    fn observe(&mut self) -> Vec<ObservedReplica> {
        let now = Instant::now();
        let mut restarts = Vec::new();
        for (name, r) in &mut self.replicas {
            if let Some(c) = &mut r.child {
                if let Ok(Some(status)) = c.try_wait() {
                    let code = exit_code_of(status);
                    r.child = None;
                    r.exit_code = Some(code);
                    if super::restarts_in_place(r.planned.restart_policy.pod_restart_policy(), code) {
                        // The kubelet restarts the container in place; the pod stays Running.
                        r.restart_at = Some(now + r.backoff);
                        r.backoff = (r.backoff * 2).min(Duration::from_secs(10));
                        self.console.info(&format!(
                            "{} exited with code {code}; restarting in place in {:.1}s (restartPolicy {})",
                            short_name(&self.job, name),
                            (r.restart_at.unwrap() - now).as_secs_f64(),
                            r.planned.restart_policy.pod_restart_policy()
                        ));
                    } else {
                        r.phase = super::final_phase(code);
                        if code != 0 {
                            self.console.info(&format!("{} failed with exit code {code}", short_name(&self.job, name)));
                        }
                    }
                }
            }
            if r.restart_at.is_some_and(|t| t <= now) {
                r.restart_at = None;
                restarts.push(name.clone());
            }
        }
        for name in restarts {
            let (planned, token) = {
                let r = &self.replicas[&name];
                (r.planned.clone(), r.token.clone())
            };
            match self.spawn(&planned, &token) {
                Ok(child) => {
                    let r = self.replicas.get_mut(&name).expect("present");
                    r.child = Some(child);
                    r.restart_count += 1;
                }
                Err(e) => {
                    self.console.info(&e.to_string());
                    let r = self.replicas.get_mut(&name).expect("present");
                    r.phase = Phase::Failed;
                }
            }
        }
        self.replicas.iter().map(|(name, r)| super::observed(name, &r.planned, r.phase, r.exit_code, r.restart_count)).collect()
    }

    fn shutdown(&mut self) {
        let children: Vec<Child> = self.replicas.values_mut().filter_map(|r| r.child.take()).collect();
        self.replicas.clear();
        Self::stop_children(children, Duration::from_secs(3));
    }
}

impl Drop for ProcessBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

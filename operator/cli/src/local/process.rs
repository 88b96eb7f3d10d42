//! The process backend of `tfjob run`: every replica a child process on
//! 127.0.0.1, with the `tensorflow` container's command, args and env plus
//! `TF_CONFIG` and `TFJOB_TOKEN`. It plays the kubelet: restarts in place
//! under the pod restart policies `Always` and `OnFailure` (with a growing
//! back-off), and reports phases and exit codes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tfjob_api::api::ReplicaType;
use tfjob_api::plan::{ENV_TF_CONFIG, ENV_TOKEN, PlannedReplica, metrics_port_of};
use tfjob_api::status::{ObservedReplica, Phase};

use super::backend::{self, Backend, RunError, short_name};
use super::console::Console;
use super::tls::LocalTls;
use super::volumes::{self, LocalMount};

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
    /// The run directory: the replicas' volumes live under it.
    run_dir: PathBuf,
    /// The metrics port of each replica that serves metrics (by pod name).
    metrics_ports: Mutex<BTreeMap<String, u16>>,
    /// Every port handed out (task and metrics ports): none is handed out twice, though a
    /// port is free again between its pick and its replica's start.
    taken: Mutex<std::collections::BTreeSet<u16>>,
    /// The threads reading each replica's output (by short name), until its
    /// exit is reported.
    readers: Readers,
    /// The run's certificates, when the job speaks TLS.
    tls: Option<LocalTls>,
}

/// Readers of replica output, by replica.
type Readers = Mutex<BTreeMap<String, Vec<std::thread::JoinHandle<()>>>>;

/// How long the output of a stopped replica may take to be read to its end. Its process
/// group is ended first, so no process holds its pipes open and the readers reach the end
/// at once; the bound only covers a process that left the group (`setsid`) and a stalled
/// host, where half a second lost a failing replica's last line (its error).
const DRAIN_BOUND: Duration = Duration::from_secs(10);

/// Waits for the threads reading a replica's output to reach its end, so its last lines
/// (its error) are in before its exit is reported.
fn drain_output(readers: &Readers, short: &str) {
    let readers = readers.lock().unwrap_or_else(|p| p.into_inner()).remove(short).unwrap_or_default();
    wait_for_readers(&readers);
}

/// Waits for the output of every stopped replica to be read to its end: a replica stopped
/// at the job's end prints its final line as it goes, and `tfjob run` may exit right after.
fn drain_all_output(readers: &Readers) {
    let readers: Vec<_> = std::mem::take(&mut *readers.lock().unwrap_or_else(|p| p.into_inner())).into_values().flatten().collect();
    wait_for_readers(&readers);
}

fn wait_for_readers(readers: &[std::thread::JoinHandle<()>]) {
    let deadline = Instant::now() + DRAIN_BOUND;
    while readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL to what is left of the process group of a replica whose process exited, as the
/// kubelet ends a container with its main process: a background child it left would
/// otherwise go on, holding the replica's output open.
fn end_process_group(pid: u32) {
    // SAFETY: plain kill(2) on the group; ESRCH when nothing is left is fine.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
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

/// Every replica serves on 127.0.0.1 here, so the `--metrics_port` of the
/// manifest (one port for every pod, each with its own address in a
/// cluster) would collide: a replica's is replaced by a port of its own
/// (`port()`), which is returned.
fn own_metrics_port(argv: &mut [String], port: impl FnOnce() -> u16) -> Option<u16> {
    let flags = ["--metrics_port", "--metrics-port"];
    let at = argv.iter().position(|a| flags.iter().any(|f| a == f || a.strip_prefix(f).is_some_and(|v| v.starts_with('='))))?;
    let port = port();
    if argv[at].contains('=') {
        let flag = argv[at].split('=').next().unwrap_or_default().to_string();
        argv[at] = format!("{flag}={port}");
    } else if let Some(value) = argv.get_mut(at + 1) {
        *value = port.to_string();
    }
    Some(port)
}

/// Exit code as a kubelet reports it: the code, or 128 + the signal.
fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(255)
}

impl ProcessBackend {
    pub fn new(job: &str, console: Arc<Console>, run_dir: &Path) -> Self {
        ProcessBackend {
            job: job.to_string(),
            console,
            ports: Mutex::new(BTreeMap::new()),
            replicas: BTreeMap::new(),
            runtime: runtime_binary(),
            run_dir: run_dir.to_path_buf(),
            metrics_ports: Mutex::new(BTreeMap::new()),
            taken: Mutex::new(std::collections::BTreeSet::new()),
            readers: Mutex::new(BTreeMap::new()),
            tls: None,
        }
    }

    /// Gives each replica its certificate (`tls`: the run's CA).
    pub fn with_tls(mut self, tls: Option<LocalTls>) -> Self {
        self.tls = tls;
        self
    }

    /// The replica's volumes as directories (created here), and what is
    /// not mapped said once, at its first start.
    fn mounts(&self, planned: &PlannedReplica, first_start: bool) -> Result<Vec<LocalMount>, RunError> {
        let replica = short_name(&self.job, &planned.pod_name);
        let local = volumes::local_volumes(&self.run_dir, planned).map_err(|reason| RunError::Start { replica: replica.clone(), reason })?;
        volumes::create_dirs(&local.mounts).map_err(|e| RunError::Start { replica: replica.clone(), reason: format!("cannot create its volumes: {e}") })?;
        if first_start {
            for note in &local.notes {
                self.console.info(&format!("{replica}: {note}"));
            }
        }
        Ok(local.mounts)
    }

    fn spawn(&self, planned: &PlannedReplica, token: &str, first_start: bool) -> Result<Child, RunError> {
        let short = short_name(&self.job, &planned.pod_name);
        let mounts = self.mounts(planned, first_start)?;
        if planned.command.is_empty() {
            return Err(RunError::Start {
                replica: short,
                reason: "the `tensorflow` container has no `command`; locally the image's entrypoint is unknown, so give the command in the manifest (e.g. [\"tfjob-runtime\"])".into(),
            });
        }
        // As the kubelet: env values, then command and args, with their `$(VAR)` expanded.
        let mut env = backend::replica_environment(planned, token);
        if let Some(tls) = &self.tls {
            let names = ["localhost".to_string(), "127.0.0.1".to_string(), planned.pod_name.clone()];
            let dir = tls.replica_dir(&short, &names).map_err(|reason| RunError::Start { replica: short.clone(), reason })?;
            for (name, value) in tfjob_api::tls::tls_env(&dir.display().to_string()) {
                env.define(name, value);
            }
        }
        let argv = env.expand_all(&[planned.command.as_slice(), planned.args.as_slice()].concat());
        // A process cannot mount: paths under a mountPath go to the volume's directory.
        let mut argv: Vec<String> = argv.iter().map(|a| volumes::map_path(a, &mounts)).collect();
        let program = if argv[0] == RUNTIME_COMMAND { self.runtime.clone() } else { PathBuf::from(&argv[0]) };
        if argv[0] == RUNTIME_COMMAND {
            if planned.replica_type == ReplicaType::PS && planned.index == 0 && metrics_port_of(&argv).is_none() {
                // ps 0's page is where the job's progress (and the autoscaler's rate) is read.
                argv.push("--metrics_port=0".to_string());
            }
            self.assign_metrics_port(planned, &short, &mut argv, first_start);
        }
        let vars = env.vars().iter().map(|(k, v)| (k.clone(), if k == ENV_TF_CONFIG || k == ENV_TOKEN { v.clone() } else { volumes::map_path(v, &mounts) }));
        let mut child = replica_command(&program, &argv[1..], vars)
            .spawn()
            .map_err(|e| RunError::Start { replica: short.clone(), reason: format!("cannot start {:?}: {e}", program.display().to_string()) })?;
        self.forward_output(&mut child, &short);
        Ok(child)
    }

    /// Gives a `tfjob-runtime` replica that serves metrics a port of its own (the same one at
    /// each restart), said once at its first start.
    fn assign_metrics_port(&self, planned: &PlannedReplica, short: &str, argv: &mut [String], first_start: bool) {
        let mut ports = self.metrics_ports.lock().unwrap_or_else(|p| p.into_inner());
        let known = ports.get(&planned.pod_name).copied();
        if let Some(port) = own_metrics_port(argv, || known.unwrap_or_else(|| self.new_port())) {
            ports.insert(planned.pod_name.clone(), port);
            if first_start {
                self.console.info(&format!("{short}: metrics on http://127.0.0.1:{port}/metrics"));
            }
        }
    }

    /// Every line the replica prints goes to the console (and its log file), from a thread per
    /// stream.
    fn forward_output(&self, child: &mut Child, short: &str) {
        for stream in [child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>), child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>)]
            .into_iter()
            .flatten()
        {
            let console = self.console.clone();
            let name = short.to_string();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    match line {
                        Ok(l) => console.log_line(&name, &l),
                        Err(_) => break,
                    }
                }
            });
            self.readers.lock().unwrap_or_else(|p| p.into_inner()).entry(short.to_string()).or_default().push(reader);
        }
    }

    /// A free port of 127.0.0.1 not handed out before by this run.
    fn new_port(&self) -> u16 {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let port = (0..100).map(|_| free_port()).find(|p| !taken.contains(p)).unwrap_or(0);
        taken.insert(port);
        port
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
        let port = *ports.entry((rtype, index)).or_insert_with(|| self.new_port());
        format!("127.0.0.1:{port}")
    }

    fn start(&mut self, replica: &PlannedReplica, token: &str) -> Result<(), RunError> {
        let child = self.spawn(replica, token, true)?;
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
        if let Some(mut r) = self.replicas.remove(name)
            && let Some(c) = r.child.take()
        {
            Self::stop_children(vec![c], super::backend::stop_grace(r.planned.replica_type));
            drain_output(&self.readers, &short_name(&self.job, name));
        }
    }

    fn observe(&mut self) -> Vec<ObservedReplica> {
        let now = Instant::now();
        let mut restarts = Vec::new();
        for (name, r) in &mut self.replicas {
            if let Some(c) = &mut r.child
                && let Ok(Some(status)) = c.try_wait()
            {
                let code = exit_code_of(status);
                end_process_group(c.id());
                r.child = None;
                r.exit_code = Some(code);
                let short = short_name(&self.job, name);
                drain_output(&self.readers, &short);
                let last_error = backend::last_error_suffix(self.console.last_error(&short));
                if backend::restarts_in_place(r.planned.restart_policy.pod_restart_policy(), code) {
                    // The kubelet restarts the container in place; the pod stays Running.
                    r.restart_at = Some(now + r.backoff);
                    r.backoff = (r.backoff * 2).min(Duration::from_secs(10));
                    self.console.info(&format!(
                        "{short} exited with code {code}; restarting in place in {:.1}s (restart {}, restartPolicy {}){last_error}",
                        (r.restart_at.unwrap() - now).as_secs_f64(),
                        r.restart_count + 1,
                        r.planned.restart_policy.pod_restart_policy()
                    ));
                } else {
                    r.phase = backend::final_phase(code);
                    if code != 0 {
                        self.console.info(&format!("{short} failed with exit code {code}{last_error}"));
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
            match self.spawn(&planned, &token, false) {
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
        self.replicas.iter().map(|(name, r)| backend::observed(name, &r.planned, r.phase, r.exit_code, r.restart_count)).collect()
    }

    fn metrics_url(&self, pod_name: &str) -> Option<String> {
        let port = *self.metrics_ports.lock().unwrap_or_else(|p| p.into_inner()).get(pod_name)?;
        Some(format!("http://127.0.0.1:{port}/metrics"))
    }

    fn shutdown(&mut self) {
        let children: Vec<Child> = self.replicas.values_mut().filter_map(|r| r.child.take()).collect();
        self.replicas.clear();
        Self::stop_children(children, Duration::from_secs(3));
        drain_all_output(&self.readers);
    }
}

impl Drop for ProcessBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The command of a replica's process: `program` with `args` and the environment `vars` (not
/// the `TF_CONFIG` and token of `tfjob run` itself), listening on loopback only, its output
/// piped, in a process group of its own that dies with `tfjob run` (on Linux).
fn replica_command(program: &Path, args: &[String], vars: impl Iterator<Item = (String, String)>) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove(ENV_TF_CONFIG)
        .env_remove(ENV_TOKEN)
        // Locally, replicas listen on loopback only (tfjob-runtime's --bind).
        .env("TFJOB_BIND", "127.0.0.1")
        .envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Its own process group (signals reach its children too).
            libc::setpgid(0, 0);
            // Killed by the kernel if `tfjob run` dies. Linux only: elsewhere
            // (macOS, the BSDs) there is no parent-death signal, and replicas
            // are stopped by `tfjob run` itself on Ctrl-C, SIGTERM and at the
            // end of the job, not when it is killed with SIGKILL.
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_replica_gets_a_metrics_port_of_its_own() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases = [
            (args(&["tfjob-runtime", "--metrics_port=9090", "--x"]), Some(4000), args(&["tfjob-runtime", "--metrics_port=4000", "--x"])),
            (args(&["tfjob-runtime", "--metrics-port", "9090"]), Some(4000), args(&["tfjob-runtime", "--metrics-port", "4000"])),
            (args(&["tfjob-runtime", "--metrics_portx=1"]), None, args(&["tfjob-runtime", "--metrics_portx=1"])),
            (args(&["tfjob-runtime"]), None, args(&["tfjob-runtime"])),
        ];
        for (mut argv, want, after) in cases {
            assert_eq!(own_metrics_port(&mut argv, || 4000), want);
            assert_eq!(argv, after);
        }
    }
}

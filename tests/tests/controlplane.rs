//! The test control plane itself: versions, basic API use, garbage collection, RBAC with a
//! ServiceAccount token, helm, and that no process is left behind.
//!
//! All tests but the lifecycle ones share one control plane (`ControlPlane::shared()`) and work
//! in their own namespace. None of them skips: if the control plane cannot be built or started,
//! they fail with a message that says so.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use tfjob_tests::controlplane::{ControlPlane, processes_mentioning};

fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() > deadline {
            bail!("{what}: not true after {timeout:?}{}", last.map(|e| format!(" (last error: {e:#})")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn kubectl_version_reports_the_pinned_client_and_server() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let want = &cp.versions().kubernetes;
    let out = cp.kubectl_ok(["version", "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("kubectl version -o json")?;
    assert_eq!(v["clientVersion"]["gitVersion"], want.as_str(), "{v:#}");
    assert_eq!(v["serverVersion"]["gitVersion"], want.as_str(), "{v:#}");
    let minor = want.trim_start_matches("v1.").split('.').next().unwrap();
    assert_eq!(v["serverVersion"]["major"], "1", "{v:#}");
    assert_eq!(v["serverVersion"]["minor"], minor, "{v:#}");
    Ok(())
}

#[test]
fn namespace_and_configmap_round_trip() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("configmap")?;
    cp.kubectl_ok(["create", "configmap", "settings", "-n", &ns, "--from-literal=answer=42"])?;
    let got = cp.kubectl_ok(["get", "configmap", "settings", "-n", &ns, "-o", "jsonpath={.data.answer}"])?;
    assert_eq!(got, "42");
    // Server-side apply through the helper, then a conflicting manager is refused.
    cp.apply(&format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: {ns}\ndata:\n  k: one\n"))?;
    let conflict = cp.kubectl_stdin(
        ["apply", "--server-side", "--field-manager=someone-else", "-f", "-"],
        &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: {ns}\ndata:\n  k: two\n"),
    );
    let err = format!("{:#}", conflict.expect_err("a server-side apply conflict must be refused"));
    assert!(err.to_lowercase().contains("conflict"), "{err}");
    Ok(())
}

#[test]
fn garbage_collector_deletes_dependents_of_a_deleted_owner() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("gc")?;
    cp.kubectl_ok(["create", "configmap", "owner", "-n", &ns])?;
    let uid = cp.kubectl_ok(["get", "configmap", "owner", "-n", &ns, "-o", "jsonpath={.metadata.uid}"])?;
    ensure!(!uid.is_empty(), "owner has no uid");
    cp.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dependent\n  namespace: {ns}\n  \
         ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {uid}\n    \
         controller: true\n    blockOwnerDeletion: true\ndata:\n  k: v\n"
    ))?;
    // Background propagation (the default): the API server deletes the owner at once and the
    // garbage collector in kube-controller-manager deletes the dependent afterwards.
    cp.kubectl_ok(["delete", "configmap", "owner", "-n", &ns, "--wait=true"])?;
    eventually("the dependent is garbage-collected", Duration::from_secs(60), || {
        let out = cp.kubectl(["get", "configmap", "dependent", "-n", &ns])?;
        Ok(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
    })?;
    Ok(())
}

#[test]
fn service_account_is_forbidden_until_rbac_allows_it() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let ns = cp.create_namespace("rbac")?;
    cp.kubectl_ok(["create", "configmap", "visible", "-n", &ns])?;
    let kubeconfig = cp.service_account_kubeconfig(&ns, "reader")?;
    let as_reader = |args: &[&str]| cp.command_with_kubeconfig("kubectl", &kubeconfig).args(args).output();

    let who = as_reader(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"])?;
    assert_eq!(String::from_utf8_lossy(&who.stdout), format!("system:serviceaccount:{ns}:reader"));

    let denied = as_reader(&["get", "configmaps", "-n", &ns])?;
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success(), "a ServiceAccount without RBAC must not list configmaps");
    assert!(stderr.contains("Forbidden") || stderr.contains("forbidden"), "{stderr}");

    cp.kubectl_ok(["create", "role", "configmap-reader", "-n", &ns, "--verb=get,list,watch", "--resource=configmaps"])?;
    cp.kubectl_ok(["create", "rolebinding", "reader-reads-configmaps", "-n", &ns, "--role=configmap-reader", &format!("--serviceaccount={ns}:reader")])?;
    eventually("the RoleBinding takes effect", Duration::from_secs(30), || {
        let out = as_reader(&["get", "configmaps", "-n", &ns, "-o", "name"])?;
        Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("configmap/visible"))
    })?;
    // Exactly what the Role grants: no writes, nothing in other namespaces.
    assert!(!as_reader(&["create", "configmap", "nope", "-n", &ns])?.status.success());
    assert!(!as_reader(&["get", "configmaps", "-n", "default"])?.status.success());
    Ok(())
}

#[test]
fn helm_reports_its_version_and_installs_a_chart() -> Result<()> {
    let cp = ControlPlane::shared()?;
    let out = cp.helm_ok(["version", "--short"])?;
    assert!(out.contains(&cp.versions().helm), "helm version: {out}");

    let ns = cp.create_namespace("helm")?;
    let chart = tempfile::tempdir()?;
    write_chart(chart.path())?;
    cp.helm_ok(["install", "demo", &chart.path().display().to_string(), "-n", &ns, "--wait", "--timeout=60s"])?;
    let got = cp.kubectl_ok(["get", "configmap", "demo-settings", "-n", &ns, "-o", "jsonpath={.data.greeting}"])?;
    assert_eq!(got, "hello");
    let list = cp.helm_ok(["list", "-n", &ns, "-o", "json"])?;
    let releases: Value = serde_json::from_str(&list)?;
    assert_eq!(releases[0]["name"], "demo", "{releases:#}");
    assert_eq!(releases[0]["status"], "deployed", "{releases:#}");
    cp.helm_ok(["uninstall", "demo", "-n", &ns, "--wait"])?;
    let gone = cp.kubectl(["get", "configmap", "demo-settings", "-n", &ns])?;
    assert!(!gone.status.success(), "helm uninstall left the ConfigMap behind");
    Ok(())
}

fn write_chart(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("templates"))?;
    std::fs::write(dir.join("Chart.yaml"), "apiVersion: v2\nname: demo\nversion: 0.1.0\ndescription: a chart for the control plane test\n")?;
    std::fs::write(dir.join("values.yaml"), "greeting: hello\n")?;
    std::fs::write(
        dir.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n\
         data:\n  greeting: {{ .Values.greeting | quote }}\n",
    )?;
    Ok(())
}

/// Lists running etcd / kube-apiserver / kube-controller-manager processes of the control plane
/// whose directory is `dir`.
fn leftovers(dir: &Path) -> Vec<(u32, String)> {
    processes_mentioning(&dir.display().to_string())
        .into_iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let argv0 = raw.split(|&b| b == 0).next().unwrap_or_default();
            let name = Path::new(std::str::from_utf8(argv0).ok()?).file_name()?.to_str()?.to_string();
            ["etcd", "kube-apiserver", "kube-controller-manager"].contains(&name.as_str()).then(|| (pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

#[test]
fn dropping_the_control_plane_leaves_no_process_behind() -> Result<()> {
    let cp = ControlPlane::start()?;
    let dir = cp.dir().to_path_buf();
    let pids = cp.pids().to_vec();
    assert_eq!(pids.len(), 3, "etcd, kube-apiserver, kube-controller-manager");
    let running = leftovers(&dir);
    assert_eq!(running.len(), 3, "all three components run with the directory on their command line: {running:?}");
    cp.kubectl_ok(["get", "namespaces"])?;
    drop(cp);
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} is still there after drop");
    }
    assert_eq!(leftovers(&dir), vec![], "processes left after drop");
    assert!(!dir.exists(), "the temporary directory {} was not removed", dir.display());
    Ok(())
}

/// Kills (SIGKILL) and reaps a child when dropped, so that a failing assertion leaves no
/// `controlplane` process (and, through it, no component) running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// If the process that started the control plane is killed outright (no destructor runs), the
/// kernel kills the components (PR_SET_PDEATHSIG).
#[test]
fn killing_the_owning_process_kills_the_components() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("tfjob-cp-kill-").tempdir()?;
    let cp_dir = dir.path().join("cp");
    let mut owner = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_controlplane"))
            .arg("--dir")
            .arg(&cp_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    // Keep reading stdout open for the whole test: closing it would break the binary's output.
    let mut stdout = std::io::BufReader::new(owner.0.stdout.take().unwrap());
    let stderr = owner.0.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut s);
        s
    });
    // The first stdout line (`export KUBECONFIG=...`) means the control plane is ready.
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line)?;
    if !line.starts_with("export KUBECONFIG=") {
        let _ = owner.0.kill(); // so that its stderr ends
        bail!("controlplane did not start: {line}\n{}", err_thread.join().unwrap_or_default());
    }
    let cp_dir = std::fs::canonicalize(&cp_dir)?;
    let running = leftovers(&cp_dir);
    assert_eq!(running.len(), 3, "{running:?}");

    owner.0.kill()?; // SIGKILL: no destructor, no signal handler
    owner.0.wait()?;
    eventually("the components die with their owner", Duration::from_secs(20), || Ok(leftovers(&cp_dir).is_empty()))
        .with_context(|| format!("still running: {:?}", leftovers(&cp_dir)))?;
    Ok(())
}

/// The binary for people stops everything on Ctrl-C (SIGINT) and exits cleanly.
#[test]
fn controlplane_binary_stops_on_sigint() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("tfjob-cp-int-").tempdir()?;
    let cp_dir = dir.path().join("cp");
    let mut owner = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_controlplane"))
            .arg(format!("--dir={}", cp_dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let mut stdout = std::io::BufReader::new(owner.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line)?;
    if !line.starts_with("export KUBECONFIG=") {
        bail!("controlplane did not start: {line}");
    }
    let kubeconfig = line.trim().trim_start_matches("export KUBECONFIG=");
    assert!(Path::new(kubeconfig).is_file(), "{kubeconfig}");
    let cp_dir = std::fs::canonicalize(&cp_dir)?;
    // SAFETY: sends SIGINT to our own child.
    unsafe {
        libc::kill(owner.0.id() as libc::pid_t, libc::SIGINT);
    }
    let status = owner.0.wait()?;
    assert!(status.success(), "controlplane exited with {status}");
    assert_eq!(leftovers(&cp_dir), vec![], "processes left after Ctrl-C");
    Ok(())
}

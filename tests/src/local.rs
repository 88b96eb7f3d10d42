//! Helpers of the `tfjob run` tests: the binary, manifests written by the test, and the replica
//! processes of a run (found by a marker in their environment, so a test can kill one and check
//! that none is left).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use serde_json::Value;

use crate::operator::tfjob_binary;

/// `tfjob`, with `tfjob-runtime` next to it (where `tfjob run` looks for it).
pub fn tfjob() -> Result<PathBuf> {
    let tfjob = tfjob_binary()?;
    let runtime = tfjob.with_file_name("tfjob-runtime");
    ensure!(runtime.is_file(), "no tfjob-runtime next to {}: run `cargo build --release --workspace --bins` first (tests/run.sh does)", tfjob.display());
    Ok(tfjob)
}

/// Writes `yaml` to `dir/name`.
pub fn write(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
    p
}

/// One replica spec of a TFJob manifest: `command`, `args` and `env` are YAML flow sequences.
pub fn replica(rtype: &str, replicas: u32, policy: &str, command: &str, args: &str, env: &str) -> String {
    format!(
        r#"    {rtype}:
      replicas: {replicas}
      restartPolicy: {policy}
      template:
        spec:
          containers:
            - name: tensorflow
              image: tfjob-runtime:latest
              command: {command}
              args: {args}
              env: {env}
"#
    )
}

/// A TFJob manifest: `spec_extra` (indented fields of the spec, e.g. a run policy) and the
/// replica specs made by [`replica`].
pub fn job(name: &str, spec_extra: &str, replicas: &[String]) -> String {
    format!("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: {name}\nspec:\n{spec_extra}  tfReplicaSpecs:\n{}", replicas.concat())
}

/// A marker for the environment of one test's replicas (`TFJOB_TEST_MARK=<marker>`).
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// A new marker and the `env:` list (YAML flow) that puts it in a replica's environment.
pub fn marker_env() -> (String, String) {
    let marker = unique("TFJOB_TEST_MARK");
    let env = format!("[{{name: TFJOB_TEST_MARK, value: \"{marker}\"}}]");
    (marker, env)
}

/// Waits (5 s at most) until no process with `marker` is left; panics naming those left behind.
pub fn eventually_none_left(marker: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !marked_replicas(marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "left behind: {:?}", marked_replicas(marker));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The processes running now with `TFJOB_TEST_MARK=<marker>` in their environment, by (type,
/// index) of their `TF_CONFIG` (("", -1) for a process without one): pid and `TF_CONFIG`.
pub fn marked_replicas(marker: &str) -> BTreeMap<(String, i64), (u32, Value)> {
    let mut out = BTreeMap::new();
    let wanted = format!("TFJOB_TEST_MARK={marker}");
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let environ = String::from_utf8_lossy(&environ);
        let vars: Vec<&str> = environ.split('\0').collect();
        if !vars.contains(&wanted.as_str()) {
            continue;
        }
        let cfg = vars.iter().find_map(|v| v.strip_prefix("TF_CONFIG=")).and_then(|c| serde_json::from_str::<Value>(c).ok()).unwrap_or(Value::Null);
        let task = (cfg["task"]["type"].as_str().unwrap_or_default().to_string(), cfg["task"]["index"].as_i64().unwrap_or(-1));
        out.insert(task, (pid, cfg));
    }
    out
}

/// SIGKILL, as the OOM killer or a lost node would.
pub fn kill_9(pid: u32) {
    // SAFETY: kill(2) of a process a test's job started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}

//! tests/controlplane/build.sh fails loudly and caches nothing when it cannot build. A fake `go`
//! stands in for the real one, so these run in milliseconds and never touch the real cache.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::Result;
use tfjob_tests::controlplane::controlplane_module_dir;

/// Runs build.sh with `fake_go` (a shell script body) first on PATH and an empty cache dir.
fn build_with_fake_go(fake_go: &str, cache: &Path) -> Result<Output> {
    let bin = tempfile::tempdir()?;
    let go = bin.path().join("go");
    std::fs::write(&go, format!("#!/bin/sh\n{fake_go}\n"))?;
    std::fs::set_permissions(&go, std::fs::Permissions::from_mode(0o755))?;
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    Ok(Command::new("bash").arg(controlplane_module_dir().join("build.sh")).env("PATH", path).env("TFJOB_CACHE_DIR", cache).stdin(Stdio::null()).output()?)
}

#[test]
fn an_old_go_is_refused_with_a_clear_message() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let out = build_with_fake_go(r#"[ "$1 $2" = "env GOVERSION" ] && echo go1.21.0; exit 0"#, cache.path())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("ERROR: Go >= 1.26 is required"), "{stderr}");
    assert!(stderr.contains("could NOT be built"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing may look like a bin dir on stdout");
    Ok(())
}

#[test]
fn a_failing_go_build_fails_the_script_and_caches_nothing() -> Result<()> {
    let cache = tempfile::tempdir()?;
    let fake = r#"case "$1" in
  env) case "$2" in GOVERSION) echo go1.26.8;; *) echo /nonexistent;; esac ;;
  mod) exit 0 ;;
  build) echo "compile error (fake)" >&2; exit 1 ;;
esac"#;
    for _ in 0..2 {
        let out = build_with_fake_go(fake, cache.path())?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("building kube-apiserver"), "progress is shown: {stderr}");
        assert!(stderr.contains("ERROR: go build of kube-apiserver"), "{stderr}");
        assert!(!stderr.contains("build.sh: cached"), "a failed build must not be reused: {stderr}");
    }
    let complete: Vec<_> = walk(cache.path()).into_iter().filter(|p| p.ends_with("complete")).collect();
    assert!(complete.is_empty(), "{complete:?}");
    Ok(())
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

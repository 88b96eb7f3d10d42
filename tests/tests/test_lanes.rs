//! `tests/lanes.py`, which runs the test binaries of `tests/run.sh`: fed `cargo test --no-run
//! --message-format=json`'s lines for made-up binaries (shell scripts), it runs every test
//! executable and nothing else, as cargo would (the package's directory, `CARGO_MANIFEST_DIR`,
//! the arguments after `--`), longest first, prints each one's output whole, rewrites the
//! durations and fails when one failed; with no test binary it refuses to pass.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Result, ensure};
use tfjob_tests::operator::repo_root;

/// A test "binary": a script that prints its name, directory, manifest dir and arguments, then
/// exits with `code`.
fn fake_binary(dir: &Path, name: &str, code: i32) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho \"{name} in $(pwd) manifest=$CARGO_MANIFEST_DIR args=$*\"\nexit {code}\n"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// One `compiler-artifact` line as cargo writes it.
fn artifact(package_dir: &Path, package: &str, kind: &str, target: &str, executable: Option<&Path>, test: bool) -> String {
    serde_json::json!({
        "reason": "compiler-artifact",
        "package_id": format!("path+file://{}#{package}@0.1.0", package_dir.display()),
        "manifest_path": package_dir.join("Cargo.toml"),
        "target": {"kind": [kind], "name": target, "src_path": package_dir.join(format!("tests/{target}.rs"))},
        "profile": {"test": test},
        "executable": executable,
    })
    .to_string()
}

fn lanes(messages: &Path, durations: &Path, lanes: &str) -> Result<Output> {
    Ok(Command::new("python3")
        .arg(repo_root().join("tests/lanes.py"))
        .args(["--messages".as_ref(), messages.as_os_str(), "--durations".as_ref(), durations.as_os_str(), "--lanes".as_ref(), lanes.as_ref()])
        .args(["--", "--test-threads=2"])
        .output()?)
}

#[test]
fn every_test_binary_runs_as_cargo_would_longest_first_and_a_failure_fails_the_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let package = dir.path().join("pkg");
    std::fs::create_dir_all(&package)?;
    let (ok, failing, not_a_test) = (fake_binary(dir.path(), "quick", 0)?, fake_binary(dir.path(), "slow", 1)?, fake_binary(dir.path(), "tool", 0)?);
    let lines = [
        artifact(&package, "pkg", "test", "quick", Some(&ok), true),
        "{\"reason\":\"compiler-message\"}".to_string(),
        artifact(&package, "pkg", "bin", "tool", Some(&not_a_test), false),
        artifact(&package, "pkg", "lib", "pkg", None, false),
        artifact(&package, "pkg", "test", "slow", Some(&failing), true),
    ];
    let messages = dir.path().join("messages.json");
    std::fs::write(&messages, lines.join("\n"))?;
    let durations = dir.path().join("durations.tsv");
    std::fs::write(&durations, "1\tpkg test quick\n90\tpkg test slow\n")?;

    let out = lanes(&messages, &durations, "1")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.code() == Some(101), "a failing binary fails the run: {out:?}");
    let want = format!("in {} manifest={} args=--test-threads=2", package.display(), package.display());
    ensure!(stdout.matches(&want).count() == 2, "both test binaries ran in the package's directory with the arguments: {stdout}");
    ensure!(!stdout.contains("tool in"), "a binary that is not a test ran: {stdout}");
    let (slow_at, quick_at) = (stdout.find("slow in").unwrap_or(usize::MAX), stdout.find("quick in").unwrap_or(0));
    ensure!(slow_at < quick_at, "the longest did not run first: {stdout}");
    ensure!(stdout.contains("     Running tests/slow.rs (") && stdout.contains("== pkg test slow: FAILED (exit 1)"), "{stdout}");
    ensure!(stdout.contains("== failed: pkg test slow\n"), "{stdout}");
    let written = std::fs::read_to_string(&durations)?;
    ensure!(written.lines().count() == 2 && written.contains("\tpkg test quick") && written.contains("\tpkg test slow"), "{written}");

    // Two lanes: the same binaries, the same verdict.
    let out = lanes(&messages, &durations, "2")?;
    ensure!(out.status.code() == Some(101) && String::from_utf8_lossy(&out.stdout).matches(&want).count() == 2, "{out:?}");

    // No test binary in the messages: refused, not a green run of nothing.
    std::fs::write(&messages, lines[1..4].join("\n"))?;
    let out = lanes(&messages, &durations, "2")?;
    ensure!(out.status.code() == Some(2), "no test binary must not pass: {out:?}");
    Ok(())
}

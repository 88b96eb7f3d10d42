//! The docs cannot drift from what runs: README.md's and examples/README.md's shell blocks, pasted
//! in order as a newcomer would, block after block, each in a fresh `bash -euo pipefail`, from a
//! directory laid out like a checkout after `cargo build --release` (`examples/`, and
//! `target/release/` holding the binaries these tests run). The binaries are not on `PATH`, as
//! after a fresh build.
//!
//! A block fenced ` ```sh ` runs here; ` ```sh cluster ` needs a Kubernetes cluster (the
//! control-plane and kind tests apply those manifests); ` ```sh long ` takes minutes and has a
//! test of its own (`bench_smoke.rs`). Two commands are not run, and the test says so: `cargo build
//! --release` (the binaries are built: the test's own) and `bash tests/run.sh` (it is the run
//! this test is part of).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tfjob_tests::operator::{repo_root, tfjob_binary};

/// One fenced shell block of a markdown file.
#[derive(Debug, PartialEq)]
struct Block {
    /// `file:line` of its opening fence.
    at: String,
    /// The words after `sh` on the fence (`cluster`, `long`), if any.
    tag: Option<String>,
    script: String,
}

/// The ` ```sh ` blocks of `text` (other languages are not commands).
fn shell_blocks(file: &str, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                if words.next() == Some("sh") {
                    let tag = words.next().map(str::to_string);
                    open = Some(Block { at: format!("{file}:{}", i + 1), tag, script: String::new() });
                } else if !info.trim().is_empty() {
                    // Another language's block: skip to its end.
                    open = Some(Block { at: String::new(), tag: Some("not shell".into()), script: String::new() });
                }
            }
            (Some(_), Some(_)) => {
                let block = open.take().expect("open");
                if !block.at.is_empty() {
                    blocks.push(block);
                }
            }
            (Some(block), None) => {
                block.script.push_str(line);
                block.script.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The script as it runs here: the two commands this test does not run are left out (each
/// returned, for the test's output).
fn as_run(script: &str) -> (String, Vec<String>) {
    let mut left_out = Vec::new();
    let mut out = String::new();
    for line in script.lines() {
        let mut line = line.to_string();
        if let Some(rest) = line.strip_prefix("cargo build --release && ") {
            left_out.push("cargo build --release".to_string());
            line = rest.to_string();
        }
        if line.starts_with("cargo build --release") || line.starts_with("bash tests/run.sh") {
            left_out.push(line.split('#').next().unwrap_or_default().trim().to_string());
            continue;
        }
        out.push_str(&line);
        out.push('\n');
    }
    (out, left_out)
}

#[test]
fn shell_blocks_are_found_with_their_tags() {
    let text = "# t\n```sh\na\nb\n```\n```python\nx = 1\n```\n```sh cluster\nkubectl get\n```\n```\nplain\n```\n";
    let blocks = shell_blocks("R.md", text);
    assert_eq!(
        blocks,
        vec![
            Block { at: "R.md:2".into(), tag: None, script: "a\nb\n".into() },
            Block { at: "R.md:9".into(), tag: Some("cluster".into()), script: "kubectl get\n".into() },
        ]
    );
    let (script, left_out) = as_run("cargo build --release && ./target/release/tfjob run x.yaml   # hi\nbash tests/run.sh   # tests\necho ok\n");
    assert_eq!(script, "./target/release/tfjob run x.yaml   # hi\necho ok\n");
    assert_eq!(left_out, ["cargo build --release", "bash tests/run.sh"]);
}

/// A directory laid out like a checkout after `cargo build --release`.
fn checkout_like(dir: &Path) -> Result<()> {
    let bin_dir = tfjob_binary()?.parent().context("the binaries' directory")?.to_path_buf();
    for bin in ["tfjob", "tfjob-runtime", "tfjob-s3-server"] {
        ensure!(bin_dir.join(bin).is_file(), "{} missing: the tests build every binary first (tests/run.sh)", bin_dir.join(bin).display());
    }
    std::fs::create_dir_all(dir.join("target"))?;
    std::os::unix::fs::symlink(&bin_dir, dir.join("target/release"))?;
    std::os::unix::fs::symlink(repo_root().join("examples"), dir.join("examples"))?;
    std::fs::create_dir_all(dir.join("tmp"))?;
    Ok(())
}

/// Runs one block in `dir` (its own process group, stopped whole at the end: a server it left
/// in the background too); fails with the end of its output.
fn run_block(dir: &Path, block: &Block, script: &str, index: usize) -> Result<Duration> {
    let log = dir.join(format!("block-{index}.log"));
    let started = Instant::now();
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("TMPDIR", dir.join("tmp"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(&log)?.try_clone()?)
        .process_group(0)
        .spawn()?;
    let limit = Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: kill(2) of the block's own process group.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.wait();
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: String = output.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    match status {
        Some(s) if s.success() => Ok(started.elapsed()),
        Some(s) => bail!("{} failed ({s}):\n{script}\n--- its output ends with ---\n{tail}", block.at),
        None => bail!("{} did not end within {limit:?}:\n{script}\n--- its output ends with ---\n{tail}", block.at),
    }
}

#[test]
fn the_readmes_shell_blocks_run_pasted_in_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    checkout_like(dir.path())?;
    let mut ran = 0;
    for file in ["README.md", "examples/README.md"] {
        let text = std::fs::read_to_string(repo_root().join(file))?;
        for block in shell_blocks(file, &text) {
            match block.tag.as_deref() {
                None => {}
                Some("cluster" | "long") => {
                    eprintln!("{}: not run here (sh {})", block.at, block.tag.as_deref().unwrap_or_default());
                    continue;
                }
                Some(other) => bail!("{}: unknown tag `sh {other}` (sh, sh cluster, sh long)", block.at),
            }
            let (script, left_out) = as_run(&block.script);
            for command in left_out {
                eprintln!("{}: `{command}` not run (the binaries are the test's; the tests are this run)", block.at);
            }
            ran += 1;
            let took = run_block(dir.path(), &block, &script, ran)?;
            eprintln!("{}: ran in {:.1}s", block.at, took.as_secs_f64());
        }
    }
    ensure!(ran >= 5, "only {ran} shell blocks ran");
    Ok(())
}

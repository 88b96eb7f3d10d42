//! `tfjob run --backend container`: the replicas of a job as containers of the offline images
//! (`tests/images/build-offline.sh`) on a per-job network, through podman's Docker-compatible
//! API (`podman system service`) as a Docker client sees it. The sync linear example trains to
//! convergence with every line of every log kept; a killed worker container is restarted in
//! place under `OnFailure` and the job succeeds; nothing of a job is left afterwards; without
//! an engine `tfjob run` says so and how to start one.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail, ensure};
use serde_json::Value;
use tfjob_tests::operator::{repo_root, tfjob_binary};
use tfjob_tests::podman::{Podman, PodmanService, build_images, release_bin_dir};
use tfjob_tests::report::{ensure_linear, final_report};

/// Label the container backend puts on every container and network of a job.
const LABEL_JOB: &str = "io.tfjob.job";
const LABEL_REPLICA: &str = "io.tfjob.replica";

/// The offline images, built once, and one API service for every test of this binary.
fn engine() -> Result<&'static PodmanService> {
    static ENGINE: OnceLock<std::result::Result<PodmanService, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            (|| -> Result<PodmanService> {
                let images = build_images(&release_bin_dir()?)?;
                eprint!("{}", images.log);
                PodmanService::start()
            })()
            .map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// `tfjob run --backend container` with the podman environment and `DOCKER_HOST`.
fn tfjob_run(docker_host: &str, manifest: &Path, run_dir: &Path) -> Result<Command> {
    let podman = Podman::setup()?;
    let mut cmd = Command::new(tfjob_binary()?);
    cmd.args(["run", "--backend", "container", "--quiet", "--run-dir"])
        .arg(run_dir)
        .arg(manifest)
        .envs(podman.env().iter().map(|(k, v)| (k, v)))
        .env("DOCKER_HOST", docker_host)
        .stdin(Stdio::null());
    Ok(cmd)
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The final JSON report of a replica, from its saved log.
fn report(run_dir: &Path, replica: &str) -> Result<Value> {
    final_report(&std::fs::read_to_string(run_dir.join(format!("{replica}.log"))).unwrap_or_default(), replica)
}

fn assert_linear(run_dir: &Path, replica: &str) -> Result<()> {
    ensure_linear(&report(run_dir, replica)?, replica)
}

/// Containers and networks of a job still known to the engine.
fn leftovers(job: &str) -> Result<Vec<String>> {
    let podman = Podman::setup()?;
    let filter = format!("label={LABEL_JOB}={job}");
    let mut out = Vec::new();
    for what in [vec!["ps", "-a"], vec!["network", "ls"]] {
        let mut args: Vec<&str> = what.clone();
        // `podman ps` names its field `Names`, `podman network ls` `Name`.
        let format = if what[0] == "ps" { "{{.Names}}" } else { "{{.Name}}" };
        args.extend(["--filter", &filter, "--format", format]);
        let listed = podman.run_ok(args)?;
        out.extend(listed.lines().filter(|l| !l.trim().is_empty()).map(|l| format!("{} {l}", what[0])));
    }
    Ok(out)
}

/// The line-per-step log of the runtime shows every step the worker reports; a log that lost
/// its tail has no final report, one that lost its middle misses `global_step` lines.
fn logged_steps(run_dir: &Path, replica: &str) -> Vec<i64> {
    let log = std::fs::read_to_string(run_dir.join(format!("{replica}.log"))).unwrap_or_default();
    log.lines().filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("local_step=")).and_then(|s| s.parse().ok())).collect()
}

/// The pod template's volumes are bind mounts: the ReadWriteMany claim of
/// `examples/shared-volume.yaml` is one directory of the run, mounted at /mnt/shared in the
/// chief, ps and evaluator containers: the checkpoints and event files land there.
#[test]
fn a_claim_is_a_directory_shared_by_the_containers() -> Result<()> {
    let engine = engine()?;
    let run_dir = tempfile::tempdir()?;
    let out = tfjob_run(&engine.docker_host(), &repo_root().join("examples/shared-volume.yaml"), run_dir.path())?.output()?;
    ensure!(out.status.success(), "tfjob run failed: {}", text(&out));
    let claim = run_dir.path().join("volumes/claims/tfjob-shared/shared-volume");
    let checkpoints: Vec<String> = std::fs::read_dir(claim.join("checkpoints"))?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    ensure!(checkpoints.iter().any(|c| c.starts_with("ckpt-")), "checkpoints: {checkpoints:?}");
    ensure!(claim.join("checkpoints/ckpt-0000001200/index.json").is_file(), "the last checkpoint, written by the ps and chief containers: {checkpoints:?}");
    for dir in ["logs", "logs/eval"] {
        let events = std::fs::read_dir(claim.join(dir))?.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("events.out.tfevents.")).count();
        ensure!(events >= 1, "no event file in {dir}");
    }
    ensure!(leftovers("shared-volume")?.is_empty());
    Ok(())
}

#[test]
fn sync_example_trains_in_containers_and_leaves_nothing() -> Result<()> {
    let engine = engine()?;
    let run_dir = tempfile::tempdir()?;
    let started = Instant::now();
    let out = tfjob_run(&engine.docker_host(), &repo_root().join("examples/linreg-sync.yaml"), run_dir.path())?.output()?;
    ensure!(out.status.success(), "tfjob run failed: {}", text(&out));
    let status = std::fs::read_to_string(run_dir.path().join("status.yaml"))?;
    ensure!(status.contains("type: Succeeded"), "{status}");
    for worker in ["worker-0", "worker-1"] {
        assert_linear(run_dir.path(), worker)?;
        // --log_every_steps=500 over 4,000 global steps: every progress line of the worker is
        // there, in order (no lines lost in the middle of a container's log).
        let steps = logged_steps(run_dir.path(), worker);
        ensure!(steps.len() >= 3 && steps.windows(2).all(|w| w[0] < w[1]), "{worker}: progress lines {steps:?}");
    }
    ensure!(report(run_dir.path(), "worker-0")?["global_step"].as_i64().unwrap_or(0) >= 4000);
    let ps_log = std::fs::read_to_string(run_dir.path().join("ps-0.log"))?;
    ensure!(!ps_log.trim().is_empty(), "the ps container's log is empty");
    let left = leftovers("linreg-sync")?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    eprintln!("linreg-sync in containers: succeeded in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The job of the kind scenario that loses a worker mid-run: sync linear regression, long
/// enough to kill a worker container while it trains.
const KILL_JOB: &str = "tests/e2e/kind/worker-restart.yaml";
const KILL_JOB_NAME: &str = "worker-restart";

#[test]
fn killed_worker_container_is_restarted_and_the_job_succeeds() -> Result<()> {
    let engine = engine()?;
    let podman = Podman::setup()?;
    let dir = tempfile::tempdir()?;
    let manifest = repo_root().join(KILL_JOB);
    let run_dir = dir.path().join("run");
    let mut child = tfjob_run(&engine.docker_host(), &manifest, &run_dir)?.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    // Once worker-1 trains, kill its container as a crash would (SIGKILL: exit code 137).
    let deadline = Instant::now() + Duration::from_secs(120);
    let victim = loop {
        if !logged_steps(&run_dir, "worker-1").is_empty() {
            let filter = format!("label={LABEL_REPLICA}=worker-1");
            let names = podman.run_ok(["ps", "--filter", &format!("label={LABEL_JOB}={KILL_JOB_NAME}"), "--filter", &filter, "--format", "{{.Names}}"])?;
            if let Some(name) = names.lines().find(|l| !l.trim().is_empty()) {
                break name.trim().to_string();
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("tfjob run ended ({status}) before worker-1 was killed");
        }
        ensure!(Instant::now() < deadline, "worker-1 never trained");
        std::thread::sleep(Duration::from_millis(100));
    };
    podman.run_ok(["kill", "--signal", "KILL", &victim])?;
    let status = child.wait()?;
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("piped"), &mut stderr)?;
    ensure!(status.success(), "tfjob run: {status}\n{stderr}");
    ensure!(stderr.contains("worker-1 exited with code 137; restarting in place"), "{stderr}");
    let status_yaml = std::fs::read_to_string(run_dir.join("status.yaml"))?;
    ensure!(status_yaml.contains("type: Succeeded"), "{status_yaml}");
    assert_linear(&run_dir, "worker-0")?;
    let left = leftovers(KILL_JOB_NAME)?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// The running containers of a job: replica name (`worker-1`) to container name.
fn running_replicas(podman: &Podman, job: &str) -> Result<Vec<(String, String)>> {
    let format = format!("{{{{index .Labels \"{LABEL_REPLICA}\"}}}} {{{{.Names}}}}");
    let listed = podman.run_ok(["ps", "--filter", &format!("label={LABEL_JOB}={job}"), "--format", &format])?;
    let mut replicas: Vec<(String, String)> = listed.lines().filter_map(|l| l.split_once(' ')).map(|(r, c)| (r.to_string(), c.trim().to_string())).collect();
    replicas.sort();
    Ok(replicas)
}

/// `tfjob scale` reaches a run of the container backend as it does a run of processes (the
/// driver is the same): containers of new workers start, those of the highest indices go, the
/// others stay the same containers.
#[test]
fn tfjob_scale_adds_and_removes_worker_containers() -> Result<()> {
    let engine = engine()?;
    let podman = Podman::setup()?;
    let dir = tempfile::tempdir()?;
    let example = std::fs::read_to_string(repo_root().join("examples/linreg-async.yaml"))?;
    let manifest = dir.path().join("linreg-async.yaml");
    std::fs::write(&manifest, example.replace("--train_steps=4000", "--train_steps=1000000000"))?;
    let run_dir = dir.path().join("run");
    let mut child = tfjob_run(&engine.docker_host(), &manifest, &run_dir)?.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let wait_for = |want: &[&str]| -> Result<Vec<(String, String)>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = running_replicas(podman, "linreg-async")?;
            if now.iter().map(|(r, _)| r.as_str()).eq(want.iter().copied()) {
                return Ok(now);
            }
            ensure!(Instant::now() < deadline, "replicas {now:?}, want {want:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let scale = |count: &str| -> Result<String> {
        let out = Command::new(tfjob_binary()?).arg("scale").arg(&run_dir).arg(count).stdin(Stdio::null()).output()?;
        ensure!(out.status.success(), "tfjob scale {count}: {}", text(&out));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let result = (|| -> Result<()> {
        let before = wait_for(&["ps-0", "worker-0", "worker-1"])?;
        assert_eq!(scale("Worker=3")?, "Worker 2 \u{2192} 3");
        let up = wait_for(&["ps-0", "worker-0", "worker-1", "worker-2"])?;
        assert_eq!(&up[..3], &before[..], "the running containers were touched");
        assert_eq!(scale("Worker=1")?, "Worker 3 \u{2192} 1");
        let down = wait_for(&["ps-0", "worker-0"])?;
        assert_eq!(&down[..], &before[..2], "ps-0 and worker-0 are the same containers");
        Ok(())
    })();
    // SAFETY: kill(2) of the `tfjob run` this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait()?;
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("piped"), &mut stderr)?;
    result.map_err(|e| anyhow!("{e:#}\ntfjob run said:\n{stderr}"))?;
    ensure!(status.code() == Some(130), "tfjob run: {status}\n{stderr}");
    ensure!(stderr.contains("event Scaled: Worker 3 \u{2192} 1"), "{stderr}");
    let left = leftovers("linreg-async")?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

#[test]
fn without_an_engine_it_says_how_to_start_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("no-engine.sock");
    let out = tfjob_run(&format!("unix://{}", socket.display()), &repo_root().join("examples/linreg-sync.yaml"), &dir.path().join("run"))?.output()?;
    ensure!(out.status.code() == Some(2), "exit status {:?}: {}", out.status.code(), text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("no container engine reachable") && stderr.contains(&socket.display().to_string()), "{stderr}");
    ensure!(stderr.contains("podman system service") && stderr.contains("DOCKER_HOST"), "says how to start one: {stderr}");
    Ok(())
}

//! The container images: the Dockerfiles for users (checked, they cannot be built here), the
//! offline images that `tests/images/build-offline.sh` makes with podman from the release
//! binaries, a real 1 ps + 1 worker job between two containers that find each other by DNS name,
//! and podman's Docker-compatible API through `bollard`.
//!
//! Nothing skips: if podman cannot work here, the tests fail and say why.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;
use tfjob_tests::podman::{Images, OPERATOR_IMAGE, Podman, PodmanService, RUNTIME_IMAGE, Resources, build_images, http_get, release_bin_dir, unique_name};

const MAX_RUNTIME_IMAGE_BYTES: u64 = 40_000_000;
const NON_ROOT: &str = "65532";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Builds the images once per test binary.
fn images() -> Result<&'static Images> {
    static IMAGES: OnceLock<std::result::Result<Images, String>> = OnceLock::new();
    IMAGES
        .get_or_init(|| {
            let start = Instant::now();
            let result = release_bin_dir().and_then(|dir| build_images(&dir));
            if let Ok(images) = &result {
                eprint!("{}", images.log);
                eprintln!(
                    "images ready in {:.1}s: {} {:.1} MB, {} {:.1} MB",
                    start.elapsed().as_secs_f64(),
                    images.runtime,
                    images.runtime_size as f64 / 1e6,
                    images.operator,
                    images.operator_size as f64 / 1e6
                );
            }
            result.map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// Dockerfiles for users (lint level: no base image can be pulled here).

/// The instructions of a Dockerfile, continuation lines joined, comments dropped.
fn instructions(path: &Path) -> Result<Vec<(String, String)>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(t);
        let (op, args) = current.trim().split_once(char::is_whitespace).unwrap_or((current.trim(), ""));
        out.push((op.to_ascii_uppercase(), args.trim().to_string()));
        current.clear();
    }
    ensure!(current.is_empty(), "{}: dangling continuation line", path.display());
    Ok(out)
}

/// `[[bin]] name` values of a crate manifest and its `package.name`.
fn crate_names(manifest: &Path) -> Result<(String, Vec<String>)> {
    let text = fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let mut package = None;
    let mut bins = Vec::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if let Some(v) = line.strip_prefix("name").map(str::trim).and_then(|r| r.strip_prefix('=')) {
            let v = v.trim().trim_matches('"').to_string();
            match section.as_str() {
                "[package]" => package = Some(v),
                "[[bin]]" => bins.push(v),
                _ => {}
            }
        }
    }
    Ok((package.ok_or_else(|| anyhow!("{} has no package name", manifest.display()))?, bins))
}

/// Checks one Dockerfile: multi-stage, builds `package` with --release --locked, copies the
/// binary `bin` onto PATH in a final stage on a public base, runs as a non-root user, and has
/// `entrypoint` as its ENTRYPOINT. Every COPY source of the build stage exists, and together
/// they hold every workspace member (cargo reads all their manifests).
fn check_dockerfile(dockerfile: &Path, crate_dir: &str, bin: &str, entrypoint: &[&str], port: Option<u16>) -> Result<()> {
    let name = dockerfile.display().to_string();
    let (package, bins) = crate_names(&repo().join(crate_dir).join("Cargo.toml"))?;
    ensure!(bins.iter().any(|b| b == bin), "{crate_dir}/Cargo.toml has no [[bin]] {bin} (has {bins:?})");
    let ins = instructions(dockerfile)?;

    let froms: Vec<&String> = ins.iter().filter(|(op, _)| op == "FROM").map(|(_, a)| a).collect();
    ensure!(froms.len() >= 2, "{name}: not a multi-stage build: {froms:?}");
    let build_stage = froms[0]
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[0].eq_ignore_ascii_case("as"))
        .map(|w| w[1].to_string())
        .ok_or_else(|| anyhow!("{name}: the first stage has no name (FROM ... AS build)"))?;
    ensure!(froms[0].contains("rust:"), "{name}: the build stage is not a rust image: {}", froms[0]);
    let last = froms.last().unwrap();
    ensure!(!last.contains("scratch") && last.contains(':'), "{name}: the final base should be a tagged public image: {last}");

    let last_from = ins.iter().rposition(|(op, _)| op == "FROM").unwrap();
    let (build, run) = ins.split_at(last_from);

    let cargo = build
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, a)| a)
        .find(|a| a.contains("cargo build"))
        .ok_or_else(|| anyhow!("{name}: no RUN cargo build in the build stage"))?;
    for flag in ["--release", "--locked", &format!("-p {package}")] {
        ensure!(cargo.contains(flag), "{name}: `cargo build` lacks {flag}: {cargo}");
    }
    ensure!(cargo.contains(&format!("target/release/{bin}")), "{name}: the build does not take target/release/{bin}: {cargo}");

    // COPY sources of the build stage exist, and cover the workspace.
    let mut sources = Vec::new();
    for (_, args) in build.iter().filter(|(op, _)| op == "COPY") {
        let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
        ensure!(words.len() >= 2, "{name}: COPY {args}");
        for src in &words[..words.len() - 1] {
            ensure!(repo().join(src).exists(), "{name}: COPY source {src} does not exist in the repository");
            sources.push(src.trim_end_matches('/').to_string());
        }
    }
    let workspace = fs::read_to_string(repo().join("Cargo.toml"))?;
    let members_line = workspace.lines().find(|l| l.trim_start().starts_with("members")).ok_or_else(|| anyhow!("Cargo.toml has no workspace members"))?;
    for member in members_line.split('"').skip(1).step_by(2) {
        // A member is copied with its own directory or with one that holds it (`operator` holds
        // operator/api, operator/controller and operator/cli).
        ensure!(sources.iter().any(|s| s == member || s == "." || member.starts_with(&format!("{s}/"))), "{name}: workspace member {member} is not copied");
    }
    for file in ["Cargo.toml", "Cargo.lock", "proto"] {
        ensure!(sources.iter().any(|s| s == file || s == "."), "{name}: {file} is not copied");
    }

    // Final stage: the binary on PATH, non-root, entrypoint.
    let copy = run
        .iter()
        .find(|(op, a)| op == "COPY" && a.contains(&format!("--from={build_stage}")))
        .ok_or_else(|| anyhow!("{name}: the final stage copies nothing from {build_stage}"))?;
    ensure!(copy.1.ends_with(&format!("/usr/local/bin/{bin}")), "{name}: {bin} is not copied to /usr/local/bin: {}", copy.1);
    let user = run.iter().rev().find(|(op, _)| op == "USER").map(|(_, a)| a.as_str()).ok_or_else(|| anyhow!("{name}: no USER in the final stage"))?;
    let uid = user.split(':').next().unwrap_or("");
    ensure!(!matches!(uid, "0" | "root" | ""), "{name}: runs as root (USER {user})");
    let ep = run.iter().rev().find(|(op, _)| op == "ENTRYPOINT").map(|(_, a)| a).ok_or_else(|| anyhow!("{name}: no ENTRYPOINT"))?;
    let ep: Vec<String> = serde_json::from_str(ep).with_context(|| format!("{name}: ENTRYPOINT is not exec form: {ep}"))?;
    ensure!(ep == entrypoint, "{name}: ENTRYPOINT {ep:?}, want {entrypoint:?}");
    if let Some(port) = port {
        ensure!(
            run.iter().any(|(op, a)| op == "EXPOSE" && a.split_whitespace().any(|p| p.trim_end_matches("/tcp") == port.to_string())),
            "{name}: does not EXPOSE {port}"
        );
    }
    Ok(())
}

#[test]
fn dockerfiles_build_the_right_binaries_for_a_non_root_user() -> Result<()> {
    check_dockerfile(&repo().join("runtime/Dockerfile"), "runtime", "tfjob-runtime", &["tfjob-runtime"], Some(2222))?;
    check_dockerfile(&repo().join("operator/Dockerfile"), "operator/controller", "tfjob-operator", &["tfjob-operator"], None)?;
    Ok(())
}

#[test]
fn dockerfile_check_catches_mistakes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = fs::read_to_string(repo().join("runtime/Dockerfile"))?;
    let cases = [
        ("root user", good.replace("USER 65532:65532", "USER root")),
        ("wrong binary", good.replace("target/release/tfjob-runtime", "target/release/tfjob")),
        ("no --locked", good.replace("--locked", "")),
        ("shell entrypoint", good.replace(r#"ENTRYPOINT ["tfjob-runtime"]"#, "ENTRYPOINT tfjob-runtime")),
        ("missing member", good.replace("COPY tests tests\n", "")),
        ("single stage", good.lines().filter(|l| !l.starts_with("FROM gcr.io")).collect::<Vec<_>>().join("\n")),
    ];
    for (what, text) in cases {
        ensure!(text != good, "case {what} did not change the Dockerfile");
        let path = dir.path().join("Dockerfile");
        fs::write(&path, text)?;
        ensure!(check_dockerfile(&path, "runtime", "tfjob-runtime", &["tfjob-runtime"], Some(2222)).is_err(), "the check accepted a Dockerfile with {what}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Offline images.

#[test]
fn offline_images_are_small_and_run_as_non_root() -> Result<()> {
    let images = images()?;
    let podman = Podman::setup()?;
    println!(
        "image sizes: {} {} bytes ({:.1} MB), {} {} bytes ({:.1} MB)",
        images.runtime,
        images.runtime_size,
        images.runtime_size as f64 / 1e6,
        images.operator,
        images.operator_size,
        images.operator_size as f64 / 1e6
    );
    ensure!(images.runtime_size < MAX_RUNTIME_IMAGE_BYTES, "{} is {} bytes, more than {MAX_RUNTIME_IMAGE_BYTES}", images.runtime, images.runtime_size);

    // Image configuration.
    for (image, entrypoint) in [(RUNTIME_IMAGE, r#"["tfjob-runtime"]"#), (OPERATOR_IMAGE, r#"["tfjob-operator"]"#)] {
        let config = podman.run_ok(["image", "inspect", "--format", "{{json .Config}}", image])?;
        let config: Value = serde_json::from_str(&config)?;
        ensure!(config["User"] == format!("{NON_ROOT}:{NON_ROOT}"), "{image}: user {}", config["User"]);
        let want: Value = serde_json::from_str(entrypoint)?;
        ensure!(config["Entrypoint"] == want, "{image}: entrypoint {}", config["Entrypoint"]);
    }

    // The entrypoints work: `tfjob-runtime --help` and `tfjob-operator --help`.
    let help = podman.run_ok(["run", "--rm", "--pull=never", RUNTIME_IMAGE, "--help"])?;
    ensure!(help.contains("--ps_hosts") && help.contains("--task_index"), "tfjob-runtime --help printed:\n{help}");
    let help = podman.run_ok(["run", "--rm", "--pull=never", OPERATOR_IMAGE, "--help"])?;
    ensure!(help.to_lowercase().contains("usage"), "tfjob-operator --help printed:\n{help}");
    // The operator image carries the operator alone: its version is this workspace's, and there
    // is no `tfjob` in it (the command, with its Docker client and plots, ships as archives).
    let version = podman.run_ok(["run", "--rm", "--pull=never", OPERATOR_IMAGE, "--version"])?;
    ensure!(version.trim() == format!("tfjob-operator {}", env!("CARGO_PKG_VERSION")), "tfjob-operator --version printed:\n{version}");
    let tfjob = podman.run(["run", "--rm", "--pull=never", "--entrypoint", "tfjob", OPERATOR_IMAGE, "crd"])?;
    ensure!(!tfjob.status.success(), "the operator image has a `tfjob`: {}", String::from_utf8_lossy(&tfjob.stdout));

    // A running replica's process has uid 65532, seen from the host.
    let mut made = Resources::new(podman);
    let server = made.run_detached("tfjob-img-user", [RUNTIME_IMAGE, "server", "--port", "2222"])?;
    let pid = podman.run_ok(["inspect", "--format", "{{.State.Pid}}", &server])?;
    let status = fs::read_to_string(format!("/proc/{}/status", pid.trim())).with_context(|| format!("reading the status of {server} (pid {})", pid.trim()))?;
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default();
    ensure!(uids.split_whitespace().skip(1).all(|u| u == NON_ROOT), "{server} runs with {uids:?}, not as {NON_ROOT}");
    let top = podman.run_ok(["top", &server, "user", "comm"])?;
    let procs: Vec<Vec<&str>> = top.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    ensure!(
        !procs.is_empty() && procs.iter().all(|p| p.first() == Some(&"nonroot")) && procs.iter().any(|p| p.get(1) == Some(&"tfjob-runtime")),
        "podman top {server}:\n{top}"
    );
    made.remove_all()?;
    Ok(())
}

#[test]
fn offline_build_is_skipped_when_nothing_changed() -> Result<()> {
    images()?;
    let podman = Podman::setup()?;
    let id_before = podman.run_ok(["image", "inspect", "--format", "{{.Id}}", RUNTIME_IMAGE])?;
    let start = Instant::now();
    let again = build_images(&release_bin_dir()?)?;
    let took = start.elapsed();
    ensure!(again.log.contains("tfjob-runtime:latest is up to date"), "second build did not skip:\n{}", again.log);
    ensure!(again.log.contains("tfjob-operator:latest is up to date"), "second build did not skip:\n{}", again.log);
    let id_after = podman.run_ok(["image", "inspect", "--format", "{{.Id}}", RUNTIME_IMAGE])?;
    ensure!(id_before == id_after, "the image changed: {id_before} -> {id_after}");
    println!("up-to-date check took {took:?}");
    Ok(())
}

#[test]
fn offline_build_refuses_a_directory_without_binaries() -> Result<()> {
    let empty = tempfile::tempdir()?;
    let err = build_images(empty.path()).expect_err("built images without binaries");
    let msg = format!("{err:#}");
    ensure!(msg.contains("missing") && msg.contains("tfjob-runtime"), "unclear error: {msg}");
    Ok(())
}

/// Two runtime containers on a private network train the linear model together; the worker
/// reaches the ps only through the DNS name `job-ps-0.job` that aardvark-dns serves.
#[test]
fn replicas_find_each_other_by_dns_name_on_a_container_network() -> Result<()> {
    images()?;
    let podman = Podman::setup()?;
    let mut made = Resources::new(podman);
    let net = made.network("tfjob-img-net")?;
    let cluster = ["--ps_hosts=job-ps-0.job:2222", "--worker_hosts=job-worker-0.job:2222", "--train_steps=500"];
    let network = format!("--network={net}");
    let ps = made.run_detached(
        "tfjob-img-ps",
        [&network, "--network-alias=job-ps-0.job", RUNTIME_IMAGE].into_iter().chain(cluster).chain(["--job_name=ps", "--task_index=0"]),
    )?;
    let worker = made.run_detached(
        "tfjob-img-worker",
        [&network, "--network-alias=job-worker-0.job", RUNTIME_IMAGE].into_iter().chain(cluster).chain(["--job_name=worker", "--task_index=0"]),
    )?;

    let start = Instant::now();
    let worker_code = podman.wait_exit(&worker, Duration::from_secs(240));
    let (w_out, w_err) = podman.logs(&worker)?;
    let (p_out, p_err) = podman.logs(&ps)?;
    let context = || format!("worker stdout:\n{w_out}\nworker stderr:\n{w_err}\nps stdout:\n{p_out}\nps stderr:\n{p_err}");
    let worker_code = worker_code.with_context(context)?;
    ensure!(worker_code == 0, "the worker exited {worker_code}\n{}", context());
    let ps_code = podman.wait_exit(&ps, Duration::from_secs(60)).with_context(context)?;
    ensure!(ps_code == 0, "the ps exited {ps_code}\n{}", context());
    println!("1 ps + 1 worker job over DNS names took {:.1}s", start.elapsed().as_secs_f64());

    let last = w_out.lines().rev().find(|l| l.trim_start().starts_with('{')).ok_or_else(|| anyhow!("no JSON line\n{}", context()))?;
    let report: Value = serde_json::from_str(last).with_context(|| format!("worker's last line: {last}"))?;
    println!("worker: {report}");
    let w = report["W"].as_f64().ok_or_else(|| anyhow!("no W in {report}"))?;
    let b = report["b"].as_f64().ok_or_else(|| anyhow!("no b in {report}"))?;
    ensure!(report["global_step"].as_i64() >= Some(500), "stopped early: {report}");
    ensure!((w - 2.0).abs() < 0.5, "W = {w}, not near 2: {report}");
    ensure!((b - 10.0).abs() < 1.0, "b = {b}, not near 10: {report}");
    made.remove_all()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Docker-compatible API.

#[test]
fn docker_compatible_api_answers_bollard() -> Result<()> {
    images()?;
    let podman = Podman::setup()?;
    let mut made = Resources::new(podman);
    // A container made with the CLI must show up in the API's list.
    let listed = made.run_detached("tfjob-img-api", [RUNTIME_IMAGE, "server", "--port", "2222"])?;

    let mut service = PodmanService::start()?;
    let socket = service.socket_path().to_path_buf();
    let pid = service.pid().expect("running");

    // Raw HTTP: what any client sees.
    let (status, body) = http_get(&socket, "/version")?;
    ensure!(status == 200, "GET /version: {status} {body}");
    let version: Value = serde_json::from_str(&body).with_context(|| format!("GET /version: {body}"))?;
    ensure!(version["ApiVersion"].is_string(), "GET /version has no ApiVersion: {version}");
    let (status, body) = http_get(&socket, "/containers/json?all=true")?;
    ensure!(status == 200, "GET /containers/json: {status} {body}");
    ensure!(body.contains(&listed), "GET /containers/json does not list {listed}: {body}");

    // bollard, as the container backend will use it.
    let created = unique_name("tfjob-img-bollard");
    made.adopt_container(&created);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let help = rt.block_on(bollard_round_trip(socket.to_str().unwrap(), &listed, &created))?;
    ensure!(help.contains("--ps_hosts"), "tfjob-runtime --help through the API printed:\n{help}");

    service.stop();
    ensure!(!Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid), "podman system service {pid} still runs");
    ensure!(http_get(&socket, "/_ping").is_err(), "the API still answers after stop");
    made.remove_all()?;
    Ok(())
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true)
}

async fn bollard_round_trip(socket: &str, listed: &str, created: &str) -> Result<String> {
    use bollard::Docker;
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::{CreateContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder};
    use futures::StreamExt as _;

    let docker = Docker::connect_with_unix(socket, 120, bollard::API_DEFAULT_VERSION)?;
    let version = docker.version().await.context("bollard: version")?;
    println!(
        "Docker-compatible API: version {:?}, api {:?} (min {:?}), bollard asked for {}",
        version.version,
        version.api_version,
        version.min_api_version,
        bollard::API_DEFAULT_VERSION
    );
    ensure!(version.api_version.is_some(), "no API version: {version:?}");

    // Only ours: other tests' containers share the machine's store, and podman can answer a
    // container of theirs as `stopped` (between its stop and its exit), a state bollard's
    // types do not know (a CI run failed on it).
    let ours = std::collections::HashMap::from([("name", vec![listed])]);
    let all = docker.list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&ours).build())).await.context("bollard: list containers")?;
    let names: Vec<String> = all.iter().flat_map(|c| c.names.clone().unwrap_or_default()).collect();
    ensure!(names.iter().any(|n| n.trim_start_matches('/') == listed), "{listed} is not among {names:?}");

    let body = ContainerCreateBody {
        // The short name, as manifests write it: podman resolves it to the local
        // localhost/tfjob-runtime:latest (and pulls nothing).
        image: Some("tfjob-runtime:latest".to_string()),
        cmd: Some(vec!["--help".to_string()]),
        ..Default::default()
    };
    docker.create_container(Some(CreateContainerOptionsBuilder::new().name(created).build()), body).await.context("bollard: create container")?;
    docker.start_container(created, None).await.context("bollard: start container")?;
    let mut waits = docker.wait_container(created, None);
    let code = match tokio::time::timeout(Duration::from_secs(60), waits.next()).await {
        Err(_) => bail!("{created} did not exit within 60s"),
        Ok(None) => bail!("wait stream of {created} ended without a status"),
        Ok(Some(Ok(r))) => r.status_code,
        // bollard reports a non-zero exit as an error carrying the code.
        Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, error }))) => {
            bail!("{created} exited {code}: {error}")
        }
        Ok(Some(Err(e))) => return Err(e).context("bollard: wait"),
    };
    ensure!(code == 0, "{created} exited {code}");
    let mut logs = docker.logs(created, Some(LogsOptionsBuilder::new().stdout(true).stderr(true).build()));
    let mut out = String::new();
    while let Some(chunk) = logs.next().await {
        out.push_str(&chunk.context("bollard: logs")?.to_string());
    }
    docker.remove_container(created, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await.context("bollard: remove container")?;
    Ok(out)
}

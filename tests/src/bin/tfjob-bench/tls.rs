//! `tls`: what encryption inside a job costs, measured in one run against the same thing in
//! plaintext: the ps's pull and push bandwidth over the tensor channel, and examples/s of the
//! MLP and of sparse_lr on 1 ps + 2 async workers (runs alternate, medians). Goal from issue
//! 30: TLS costs under 10 % on the MLP.
//!
//! And where that cost goes: each run's CPU (all its processes) per worker step and the cores it
//! kept busy, so a rate's ratio splits into CPU per step (what TLS adds to every step) times
//! cores busy (what it adds to the waits); and, for the MLP, what the cipher alone must take per
//! step, sealing and opening the variables pulled and the gradients pushed at the rate measured
//! here. The CPU ratio is the most TLS could reach with the cores as busy as in plaintext.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;
use tfjob_api::pki::{CA_CERT_KEY, CA_KEY_KEY, JobCa};
use tfjob_runtime::auth::TlsSource;

use super::{ClusterRun, Options, Report, median, ps_bandwidth_one, run_cluster, strs};

/// The MLP 784-100-10's variables (two weight matrices and their biases), in bytes: what a
/// worker pulls and pushes on every step.
const MLP_VARIABLE_BYTES: usize = (784 * 100 + 100 + 100 * 10 + 10) * 4;

/// CPU seconds (user + system) of this process's children that have exited and been waited
/// for: around a cluster run, what all its tasks used from start-up to exit.
fn children_cpu_secs() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid one.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A cluster run's figures: examples/s, CPU microseconds per worker step (all tasks, start-up
/// included) and the cores its tasks kept busy from launch to the last worker's exit.
struct RunCost {
    rate: f64,
    cpu_us_per_step: f64,
    cores_busy: f64,
}

fn run_cost(run: &ClusterRun, cpu_secs: f64) -> RunCost {
    let steps: f64 = run.workers.iter().filter_map(|w| w["local_steps"].as_f64()).sum();
    RunCost { rate: run.examples_per_sec(), cpu_us_per_step: cpu_secs * 1e6 / steps.max(1.0), cores_busy: cpu_secs / run.wall_secs.max(1e-9) }
}

/// Microseconds of one core to seal `bytes` into TLS records (the copy in and AES-128-GCM, the
/// suite the job's TLS picks) and to open them again (AES-GCM and the copy out), as
/// `tls_stream` does, each with the library it picks on this CPU: the median of `reps` passes.
fn cipher_us(bytes: usize, reps: usize) -> Result<(f64, f64)> {
    use tfjob_runtime::tls_records::{self as records, Cipher, RecordKey, Suite};
    let key = || RecordKey::from_raw(Suite::Aes128Gcm, Cipher::fastest(), &[7; 16], [9; 12], 0);
    let plaintext: Vec<u8> = (0..bytes).map(|i| (i * 31) as u8).collect();
    let (mut sealer, mut opener) = (key()?, key()?);
    let (mut wire, mut out) = (Vec::with_capacity(bytes + bytes / 1000 + 64), vec![0u8; bytes]);
    let (mut seal, mut open) = (vec![], vec![]);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        wire.clear();
        records::seal_all(&mut sealer, records::APPLICATION_DATA, &plaintext, &mut wire)?;
        seal.push(t.elapsed().as_secs_f64() * 1e6);
        let (t, mut at, mut written) = (std::time::Instant::now(), 0, 0);
        while at < wire.len() {
            let len = records::whole_record(&wire[at..])?.context("a record cut short")?;
            let (_, range) = records::open(&mut opener, &mut wire[at..at + len])?;
            out[written..written + range.len()].copy_from_slice(&wire[at..][range.clone()]);
            (at, written) = (at + len, written + range.len());
        }
        open.push(t.elapsed().as_secs_f64() * 1e6);
    }
    anyhow::ensure!(out == plaintext, "the opened records differ from what was sealed");
    Ok((median(seal), median(open)))
}

/// A job's CA (certificate and key) written under `dir`, as a pod gets it on a cluster: every
/// task of the benchmark's clusters makes its own certificate with it for 127.0.0.1, where it
/// listens.
fn loopback_ca(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let ca = JobCa::generate("bench")?.pem()?;
    let (cert, key) = (dir.join(CA_CERT_KEY), dir.join(CA_KEY_KEY));
    std::fs::write(&cert, &ca.cert_pem)?;
    std::fs::write(&key, &ca.key_pem)?;
    Ok((cert, key))
}

/// The runtime's flags for the job's CA: each task makes its own certificate.
fn tls_args((ca, ca_key): &(PathBuf, PathBuf)) -> Vec<String> {
    vec![format!("--tls_ca={}", ca.display()), format!("--tls_ca_key={}", ca_key.display())]
}

/// The MLP's cipher figures: what sealing and opening its variables both ways costs per worker
/// step on this machine (each byte pulled is sealed by the ps and opened by the worker, each byte
/// pushed the other way round), against the CPU per step TLS added in the runs; and the most
/// TLS / plaintext can be while the cores are as busy as in plaintext: the CPU ratio.
fn cipher_rows(report: &mut Report, name: &str, (tls_cpu, plain_cpu): (f64, f64), quick: bool) -> Result<()> {
    let (seal, open) = cipher_us(MLP_VARIABLE_BYTES, if quick { 20 } else { 200 })?;
    let cipher = 2.0 * (seal + open);
    let label = format!("{name}: the cipher's CPU per worker step ({} KB sealed and opened each way)", MLP_VARIABLE_BYTES / 1000);
    report.row("tls", &label, cipher, "us", Some(("the CPU per step TLS added", tls_cpu - plain_cpu)), None, "", None);
    let at_most = plain_cpu / (plain_cpu + cipher);
    report.row("tls", &format!("{name}: TLS / plaintext at most, the cipher's CPU added and the cores as busy"), at_most, "x", None, None, "", None);
    Ok(())
}

pub fn tls(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    tfjob_runtime::tune_allocator();
    let job_ca = loopback_ca(&opts.out.join("tls"))?;
    let (n, label, reps) = if opts.quick { (1 << 18, "256K", 3) } else { (25_000_000, "25M", 5) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (plain_pull, plain_push) = rt.block_on(ps_bandwidth_one(n, reps, true, None))?;
    let (tls_pull, tls_push) = rt.block_on(ps_bandwidth_one(
        n,
        reps,
        true,
        Some(TlsSource::JobCa { ca: job_ca.0.clone(), ca_key: job_ca.1.clone() }.load("127.0.0.1").map_err(anyhow::Error::msg)?),
    ))?;
    for (what, ours, plain) in [("pull", tls_pull, plain_pull), ("push", tls_push, plain_push)] {
        report.row(
            "tls",
            &format!("{what} of a {label}-float variable (1 ps, tensor channel, TLS)"),
            ours,
            "MB/s",
            Some(("the same in plaintext", plain)),
            None,
            "",
            None,
        );
    }
    // A few seconds per run: long enough that start-up and connecting do not count. The MLP's
    // synthetic data is 20,000 examples: it runs epochs of them.
    let (epochs, examples) = if opts.quick { (1, 2_000) } else { (15, 300_000) };
    let workloads = [
        (
            "MLP 784-100-10",
            strs(&["--model=mlp", "--hidden_units=100", "--batch_size=100", "--learning_rate=0.5"]),
            format!("--num_epochs={epochs}"),
            ">= 0.9 x plaintext",
        ),
        (
            "sparse_lr 2^18 buckets",
            strs(&["--model=sparse_lr", "--optimizer=adagrad", "--learning_rate=0.2", "--hash_buckets=262144", "--num_epochs=1"]),
            format!("--generated_examples={examples}"),
            "",
        ),
    ];
    let rounds = if opts.quick { 1 } else { 3 };
    let mut details = vec![];
    for (i, (name, model, size, target)) in workloads.into_iter().enumerate() {
        let mut args = model;
        args.extend([size, "--log_every_steps=0".into(), "--eval_examples=500".into()]);
        let (mut plain, mut encrypted) = (vec![], vec![]);
        for round in 0..rounds {
            for with_tls in [false, true] {
                let mut a = args.clone();
                if with_tls {
                    a.extend(tls_args(&job_ca));
                }
                let cpu_before = children_cpu_secs();
                let run = run_cluster(opts, bin, &format!("tls-{i}-{round}-{}", if with_tls { "tls" } else { "plain" }), 1, 2, &a)?;
                let cost = run_cost(&run, children_cpu_secs() - cpu_before);
                if with_tls { encrypted.push(cost) } else { plain.push(cost) }
            }
        }
        let med = |runs: &[RunCost], f: fn(&RunCost) -> f64| median(runs.iter().map(f).collect());
        let (ours, base) = (med(&encrypted, |c| c.rate), med(&plain, |c| c.rate));
        let met = (!target.is_empty() && !opts.quick).then_some(ours >= 0.9 * base);
        report.row("tls", &format!("{name}, 1ps+2w async, TLS: examples/s"), ours, "ex/s", Some(("the same in plaintext", base)), None, target, met);
        let cpu = (med(&encrypted, |c| c.cpu_us_per_step), med(&plain, |c| c.cpu_us_per_step));
        report.row("tls", &format!("{name}, TLS: CPU per worker step, all tasks"), cpu.0, "us", Some(("the same in plaintext", cpu.1)), None, "", None);
        let busy = (med(&encrypted, |c| c.cores_busy), med(&plain, |c| c.cores_busy));
        report.row("tls", &format!("{name}, TLS: cores busy"), busy.0, "cores", Some(("the same in plaintext", busy.1)), None, "", None);
        if i == 0 {
            cipher_rows(report, name, cpu, opts.quick)?;
        }
        let figures = |runs: &[RunCost]| {
            runs.iter().map(|c| json!({ "examples_per_sec": c.rate, "cpu_us_per_step": c.cpu_us_per_step, "cores_busy": c.cores_busy })).collect::<Vec<_>>()
        };
        details.push(json!({ "workload": name, "tls": figures(&encrypted), "plaintext": figures(&plain) }));
    }
    report.details.insert("tls".into(), json!(details));
    Ok(())
}

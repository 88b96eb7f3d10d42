//! `tls`: what encryption inside a job costs, measured in one run against the same thing in
//! plaintext: the ps's pull and push bandwidth over the tensor channel, and examples/s of the
//! MLP and of sparse_lr on 1 ps + 2 async workers (runs alternate, medians). Goal from issue
//! 30: TLS costs under 10 % on the MLP.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;
use tfjob_api::pki::{CA_CERT_KEY, CA_KEY_KEY, JobCa};
use tfjob_runtime::auth::TlsSource;

use super::{Options, Report, median, ps_bandwidth_one, run_cluster, strs};

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
                let run = run_cluster(opts, bin, &format!("tls-{i}-{round}-{}", if with_tls { "tls" } else { "plain" }), 1, 2, &a)?;
                let rate = run.examples_per_sec();
                if with_tls { encrypted.push(rate) } else { plain.push(rate) }
            }
        }
        let (ours, base) = (median(encrypted.clone()), median(plain.clone()));
        let met = (!target.is_empty() && !opts.quick).then_some(ours >= 0.9 * base);
        report.row("tls", &format!("{name}, 1ps+2w async, TLS: examples/s"), ours, "ex/s", Some(("the same in plaintext", base)), None, target, met);
        details.push(json!({ "workload": name, "tls": encrypted, "plaintext": plain }));
    }
    report.details.insert("tls".into(), json!(details));
    Ok(())
}

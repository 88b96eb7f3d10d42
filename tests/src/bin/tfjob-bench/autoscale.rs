//! `--only autoscale`: the throughput autoscaler against every static worker count, side by
//! side in one run. For each workload, `tfjob run` trains the same epochs with 1, 2, 3 and 4
//! workers (no autoscaler), then starting at 1 worker under `elasticPolicy.autoscale:
//! Throughput`, once with the default `minGainPercent` (50: a step up must bring half of what
//! perfect scaling would) and once with 10 (throughput first); the rows are each autoscaled job's
//! settled examples/s against the best static count's, the seconds it took to settle, and its
//! wall time against the best and the worst static choice.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{Options, Report};

/// A workload: its name, the model's flags, epochs (full and `--quick`).
struct Workload {
    name: &'static str,
    args: &'static str,
    epochs: (u32, u32),
}

/// The `minGainPercent`s the autoscaled runs use.
const MIN_GAINS: [u32; 2] = [50, 10];

const WORKLOADS: [Workload; 2] = [
    // Compute-bound: a second worker adds most of a core on two.
    Workload { name: "mlp", args: "\"--model=mlp\", \"--hidden_units=100\", \"--learning_rate=0.1\", \"--batch_size=100\"", epochs: (600, 40) },
    // Sparse and ps-bound: every step pulls and pushes embedding rows.
    Workload {
        name: "wide_deep",
        args: "\"--model=wide_deep\", \"--optimizer=adagrad\", \"--learning_rate=0.2\", \"--generated_examples=100000\", \"--hidden_units=16\", \"--embedding_dim=8\", \"--hash_buckets=65536\", \"--eval_examples=1000\"",
        epochs: (60, 3),
    },
];

/// What one `tfjob run` came to.
struct Outcome {
    wall: f64,
    /// Examples per second over the whole training (the chief's report).
    rate: f64,
    /// Seconds from the start to the autoscaler's last decision.
    settled_at: Option<f64>,
    /// The rate the autoscaler measured at the count it ended with.
    settled_rate: Option<f64>,
    workers: i64,
}

pub fn autoscale(opts: &Options, report: &mut Report, runtime: &Path) -> Result<()> {
    let tfjob = runtime.with_file_name("tfjob");
    anyhow::ensure!(tfjob.is_file(), "no tfjob next to {}: build it with `cargo build --release --bins`", runtime.display());
    let mut details = serde_json::Map::new();
    // `--quick` (the smoke test): the MLP only, 1 and 2 static workers, the default share.
    let (workloads, counts, gains) = if opts.quick { (&WORKLOADS[..1], 2, &MIN_GAINS[..1]) } else { (&WORKLOADS[..], 4, &MIN_GAINS[..]) };
    for w in workloads {
        let epochs = if opts.quick { w.epochs.1 } else { w.epochs.0 };
        let mut statics = Vec::new();
        for workers in 1..=counts {
            let o = run_job(opts, &tfjob, w, epochs, workers, None)?;
            eprintln!("autoscale {}: {workers} static worker(s): {:.0} examples/s, {:.1} s", w.name, o.rate, o.wall);
            statics.push(o);
        }
        let best = statics.iter().max_by(|a, b| a.rate.total_cmp(&b.rate)).context("no static run")?;
        let fastest = statics.iter().map(|o| o.wall).fold(f64::INFINITY, f64::min);
        let slowest = statics.iter().map(|o| o.wall).fold(0.0, f64::max);
        let mut autoscaled = Vec::new();
        for &gain in gains {
            let auto = run_job(opts, &tfjob, w, epochs, 1, Some(gain))?;
            let settled_rate = auto.settled_rate.unwrap_or(auto.rate);
            let section = format!("autoscale {} gain {gain}%", w.name);
            report.row(
                &section,
                "examples/s settled (vs best static)",
                settled_rate,
                "ex/s",
                Some(("best static", best.rate)),
                None,
                ">= 0.9x",
                Some(settled_rate >= 0.9 * best.rate),
            );
            // No decision at all: the job ended first (only `--quick` jobs are that short).
            let settle = auto.settled_at.unwrap_or(auto.wall);
            report.row(&section, "time to settle", settle, "s", None, None, "<= 60 s", Some(settle <= 60.0));
            report.row(&section, "wall time (vs best static)", auto.wall, "s", Some(("best static", fastest)), None, "", None);
            report.row(&section, "wall time (vs worst static)", auto.wall, "s", Some(("worst static", slowest)), None, "", None);
            autoscaled.push(json!({"min_gain_percent": gain, "settled_workers": auto.workers, "settled_examples_per_sec": settled_rate, "settled_after_secs": auto.settled_at, "wall_secs": auto.wall, "examples_per_sec": auto.rate}));
        }
        details.insert(
            w.name.into(),
            json!({
                "epochs": epochs,
                "static": statics.iter().map(|o| json!({"workers": o.workers, "examples_per_sec": o.rate, "wall_secs": o.wall})).collect::<Vec<_>>(),
                "best_static_workers": best.workers,
                "autoscaled": autoscaled,
            }),
        );
    }
    report.details.insert("autoscale".into(), Value::Object(details));
    Ok(())
}

/// The job's manifest: 1 ps, `workers` async workers, `epochs` epochs; with the throughput
/// autoscaler (1 to 6 workers) at `min_gain` percent when given (settling and measuring in 2 and
/// 3 s instead of 6 and 8 with `quick`).
fn manifest(w: &Workload, epochs: u32, workers: u32, min_gain: Option<u32>, quick: bool) -> String {
    let (settle, measure) = if quick { (2, 3) } else { (6, 8) };
    let args = format!("[{}, \"--num_epochs={epochs}\", \"--log_every_steps=100000\"]", w.args);
    let replica = |rtype: &str, n: u32| {
        format!(
            "    {rtype}:\n      replicas: {n}\n      restartPolicy: OnFailure\n      template:\n        spec:\n          containers:\n            - name: tensorflow\n              image: tfjob-runtime:latest\n              command: [\"tfjob-runtime\"]\n              args: {args}\n"
        )
    };
    let policy = min_gain.map(|gain| {
        format!("  elasticPolicy:\n    minReplicas: 1\n    maxReplicas: 6\n    autoscale: Throughput\n    throughput: {{minGainPercent: {gain}, settleSeconds: {settle}, measureSeconds: {measure}, cooldownSeconds: 600}}\n")
    });
    let policy = policy.unwrap_or_default();
    let name = format!("as-{}", w.name.replace('_', "-"));
    format!(
        "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: {name}\nspec:\n  runPolicy: {{backoffLimit: 3}}\n{policy}  tfReplicaSpecs:\n{}{}",
        replica("PS", 1),
        replica("Worker", workers)
    )
}

fn run_job(opts: &Options, tfjob: &Path, w: &Workload, epochs: u32, workers: u32, min_gain: Option<u32>) -> Result<Outcome> {
    let label = match min_gain {
        Some(gain) => format!("{}-auto-{gain}", w.name),
        None => format!("{}-{workers}", w.name),
    };
    let base = opts.out.join("autoscale");
    std::fs::create_dir_all(&base)?;
    let dir = base.join(&label);
    let _ = std::fs::remove_dir_all(&dir);
    let file = base.join(format!("{label}.yaml"));
    std::fs::write(&file, manifest(w, epochs, workers, min_gain, opts.quick))?;
    let started = Instant::now();
    let mut child = Command::new(tfjob)
        .args(["run", "--quiet", "--run-dir"])
        .arg(&dir)
        .arg(&file)
        .env("PATH", format!("{}:{}", tfjob.parent().unwrap_or(Path::new(".")).display(), std::env::var("PATH").unwrap_or_default()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", tfjob.display()))?;
    // The time of each autoscaler decision, as its event line arrives.
    let mut settled_at = None;
    let mut console = String::new();
    for line in BufReader::new(child.stderr.take().context("stderr")?).lines() {
        let line = line?;
        if line.starts_with("tfjob: event Autoscaled: ") || line.starts_with("tfjob: event AutoscalerSettled: ") {
            settled_at = Some(started.elapsed().as_secs_f64());
        }
        console.push_str(&line);
        console.push('\n');
    }
    let status = child.wait()?;
    let wall = started.elapsed().as_secs_f64();
    std::fs::write(base.join(format!("{label}.console.txt")), &console)?;
    anyhow::ensure!(status.success(), "{label}: tfjob run failed:\n{console}");
    let log = std::fs::read_to_string(dir.join("worker-0.log"))?;
    let r = tfjob_tests::report::final_report(&log, "worker-0")?;
    let examples = r["examples_trained"].as_f64().context("examples_trained")?;
    let elapsed = r["elapsed_secs"].as_f64().context("elapsed_secs")?;
    let yaml = std::fs::read_to_string(dir.join("status.yaml"))?;
    let st: Value = serde_saphyr::from_str(&yaml)?;
    let state = &st["status"]["autoscaler"];
    Ok(Outcome {
        wall,
        rate: examples / elapsed.max(1e-9),
        settled_at: settled_at.filter(|_| min_gain.is_some()),
        settled_rate: state["measured"]["rate"].as_f64(),
        workers: state["replicas"].as_i64().unwrap_or(i64::from(workers)),
    })
}

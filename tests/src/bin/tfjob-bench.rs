//! `tfjob-bench`: one-machine, time-bounded benchmark of tfjob-rs.
//!
//! Every figure is printed next to the baseline it is compared against, measured in the same
//! run (loopback TCP, memcpy, our own single-process training, process launch, ...), and next to
//! the TensorFlow reference and the target from the issue. Writes `DIR/bench.json` and
//! `DIR/scaling.png`.
//!
//! ```text
//! tfjob-bench [--quick] [--out DIR] [--data-dir DIR] [--only SECTION...]
//! sections: raw ps linear mlp startup elastic elastic-ps operator sparse autoscale tls limit operator-load
//! ```
//!
//! The distributed figures start real `tfjob-runtime` processes, found next to this executable
//! (build both with `cargo build --release -p tfjob-runtime -p tfjob-tests --bin tfjob-runtime --bin tfjob-bench`).

#[path = "tfjob-bench/autoscale.rs"]
mod autoscale;
#[path = "tfjob-bench/limit.rs"]
mod limit;
#[path = "tfjob-bench/operator_load.rs"]
mod operator_load;
#[path = "tfjob-bench/request_prices.rs"]
mod request_prices;
#[path = "tfjob-bench/tf_plot.rs"]
mod tf_plot;
#[path = "tfjob-bench/tls.rs"]
mod tls;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

const SECTIONS: &[&str] =
    &["raw", "ps", "linear", "mlp", "startup", "elastic", "elastic-ps", "operator", "sparse", "autoscale", "tls", "limit", "operator-load"];

// TensorFlow 2.20 reference figures quoted by the issue (same kind of 2-core machine).
const TF_LINEAR_SINGLE: f64 = 4_432.0;
const TF_LINEAR_ASYNC: f64 = 669.0;
const TF_LINEAR_SYNC: f64 = 303.0;
const TF_MLP_SINGLE: f64 = 108_008.0;
const TF_MLP_1PS1W_ASYNC: f64 = 29_355.0;
const TF_MLP_1PS2W_ASYNC: f64 = 37_626.0;
const TF_MLP_1PS2W_SYNC: f64 = 35_341.0;
const TF_MLP_2PS2W_ASYNC: f64 = 28_887.0;
/// TF's held-out accuracy after 2,000 global steps (lr 0.5), per configuration:
/// single process, 1ps+1w async, 1ps+2w async, 1ps+2w sync, 2ps+2w async.
const TF_MLP_ACCURACY: [f64; 5] = [0.675, 0.675, 0.671, 0.679, 0.666];
/// How far our accuracy may be from TF's in the same configuration.
const ACCURACY_TOLERANCE: f64 = 0.02;

/// One line of the result table.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Row {
    section: String,
    metric: String,
    ours: f64,
    unit: String,
    baseline_name: String,
    baseline: Option<f64>,
    /// ours / baseline.
    ratio: Option<f64>,
    tf_reference: Option<f64>,
    target: String,
    met: Option<bool>,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    details: serde_json::Map<String, Value>,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    fn row(&mut self, section: &str, metric: &str, ours: f64, unit: &str, baseline: Option<(&str, f64)>, tf: Option<f64>, target: &str, met: Option<bool>) {
        let row = Row {
            section: section.into(),
            metric: metric.into(),
            ours,
            unit: unit.into(),
            baseline_name: baseline.map(|b| b.0.to_string()).unwrap_or_default(),
            baseline: baseline.map(|b| b.1),
            ratio: baseline.and_then(|b| (b.1 != 0.0).then(|| ours / b.1)),
            tf_reference: tf,
            target: target.into(),
            met,
        };
        println!("{}", format_row(&row));
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }
}

struct Options {
    quick: bool,
    out: PathBuf,
    only: Vec<String>,
    data_dir: Option<PathBuf>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Hidden subcommands: this executable as the peer of its own measurements.
    let code = match args.first().map(String::as_str) {
        Some("__tcp-send") => tcp_send_child(&args[1..]),
        Some("__plan-mem") => plan_mem_child(&args[1..]),
        Some("--replot") => replot(args.get(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("bench-out"))),
        Some("--plot-tf") => plot_tf(&args[1..]),
        _ => run(&args),
    };
    if let Err(e) = code {
        eprintln!("tfjob-bench: {e:#}");
        std::process::exit(1);
    }
}

fn usage() -> String {
    format!(
        "usage: tfjob-bench [--quick] [--out DIR] [--data-dir DIR] [--only SECTION...]\n       tfjob-bench --replot DIR   (draws DIR/scaling.png again from DIR/bench.json)\n       tfjob-bench --plot-tf FILE [PNG]   (draws benchmarks/tf/compare.py's tf-compare.json: ours, TensorFlow and our single process per workload; default PNG: tf-compare.png beside FILE)\n  sections: {}\n  --quick   tiny sizes (seconds; what the smoke test runs)\n  --out     where bench.json and scaling.png go (default bench-out)\n  --data-dir  MNIST-format data for the accuracy comparison (default ../shared/data/synthetic-mnist when present)",
        SECTIONS.join(" ")
    )
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options { quick: false, out: PathBuf::from("bench-out"), only: vec![], data_dir: None };
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value =
            |name: &str| -> Result<String> { inline.clone().or_else(|| it.next().cloned()).with_context(|| format!("{name} needs a value\n{}", usage())) };
        match flag.as_str() {
            "--quick" => o.quick = true,
            "--out" => o.out = PathBuf::from(value("--out")?),
            "--data-dir" | "--data_dir" => o.data_dir = Some(PathBuf::from(value("--data-dir")?)),
            "--only" => {
                o.only.push(value("--only")?);
                while let Some(next) = it.peek() {
                    if next.starts_with("--") {
                        break;
                    }
                    o.only.push(it.next().unwrap().clone());
                }
            }
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    let only: Vec<String> = o.only.iter().flat_map(|s| s.split(',')).map(str::to_string).collect();
    for s in &only {
        if !SECTIONS.contains(&s.as_str()) {
            bail!("unknown section {s:?}; sections are: {}", SECTIONS.join(" "));
        }
    }
    o.only = only;
    Ok(o)
}

/// `--replot DIR`: the picture of a run again, from its `bench.json` (no measurement).
fn replot(dir: PathBuf) -> Result<()> {
    let path = dir.join("bench.json");
    let json: Value = serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)?;
    let rows: Vec<Row> = serde_json::from_value(json["rows"].clone()).with_context(|| format!("{}: rows", path.display()))?;
    let png = dir.join("scaling.png");
    anyhow::ensure!(plot(&rows, &png)?, "{}: none of the sections drawn (mlp, linear, ps, limit) was measured", path.display());
    println!("{}", png.display());
    Ok(())
}

/// `--plot-tf FILE [PNG]`: the picture of a run of `benchmarks/tf/compare.py`.
fn plot_tf(args: &[String]) -> Result<()> {
    let [json, rest @ ..] = args else { bail!("--plot-tf needs the tf-compare.json of a compare.py run\n{}", usage()) };
    anyhow::ensure!(rest.len() <= 1, "--plot-tf takes a file and at most one PNG path, not {rest:?}");
    let png = tf_plot::plot_tf(Path::new(json), rest.first().map(PathBuf::from))?;
    println!("{}", png.display());
    Ok(())
}

fn run(args: &[String]) -> Result<()> {
    let opts = parse(args)?;
    std::fs::create_dir_all(opts.out.join("logs")).with_context(|| format!("creating {}", opts.out.display()))?;
    let started = Instant::now();
    let want = |s: &str| opts.only.is_empty() || opts.only.iter().any(|o| o == s);
    let mut report = Report::default();
    report.details.insert("machine".into(), machine());
    report.details.insert("command".into(), json!(std::env::args().collect::<Vec<_>>().join(" ")));
    report.details.insert("quick".into(), json!(opts.quick));
    println!("{}", header());

    let mut loopback_mbs = None;
    if want("raw") || want("ps") {
        loopback_mbs = Some(raw(&opts, &mut report, want("raw"))?);
    }
    if want("ps") {
        ps_bandwidth(&opts, &mut report, loopback_mbs.unwrap_or(f64::NAN))?;
    }
    let runtime = if want("linear")
        || want("mlp")
        || want("startup")
        || want("elastic")
        || want("elastic-ps")
        || want("sparse")
        || want("autoscale")
        || want("tls")
        || want("limit")
    {
        Some(runtime_binary()?)
    } else {
        None
    };
    if want("linear") {
        linear(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("mlp") {
        mlp(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("startup") {
        startup(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("elastic") {
        elastic(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("elastic-ps") {
        elastic_ps(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("operator") {
        operator(&opts, &mut report)?;
    }
    if want("sparse") {
        sparse(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("tls") {
        tls::tls(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    if want("limit") {
        limit::limit(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    // Twenty minutes of whole jobs: run when named (and by `--quick`, in seconds).
    if opts.only.iter().any(|o| o == "autoscale") || (opts.only.is_empty() && opts.quick) {
        autoscale::autoscale(&opts, &mut report, runtime.as_ref().unwrap())?;
    }
    // A control plane of its own and 10,000 TFJobs (minutes): run when named.
    if opts.only.iter().any(|o| o == "operator-load") {
        operator_load::operator_load(&opts, &mut report)?;
    }
    report.details.insert("total_secs".into(), json!(started.elapsed().as_secs_f64()));
    let doc = json!({ "rows": report.rows, "details": report.details });
    let json_path = opts.out.join("bench.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)?)?;
    let png = opts.out.join("scaling.png");
    let drawn = if plot(&report.rows, &png)? { format!(" and {}", png.display()) } else { " (no picture: none of mlp, linear, ps, limit ran)".into() };
    println!("\nwrote {}{} ({:.1} s; process logs in {})", json_path.display(), drawn, started.elapsed().as_secs_f64(), opts.out.join("logs").display());
    Ok(())
}

// ---------------------------------------------------------------- table

fn header() -> String {
    format!(
        "{:<9} {:<44} {:>12} {:<7} {:<26} {:>12} {:>7} {:>10} {:<22} {}",
        "section", "metric", "ours", "unit", "baseline", "value", "ratio", "TF ref", "target", "met"
    )
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn format_row(r: &Row) -> String {
    format!(
        "{:<9} {:<44} {:>12} {:<7} {:<26} {:>12} {:>7} {:>10} {:<22} {}",
        r.section,
        r.metric,
        num(r.ours),
        r.unit,
        r.baseline_name,
        r.baseline.map(num).unwrap_or_default(),
        r.ratio.map(|x| format!("{x:.3}")).unwrap_or_default(),
        r.tf_reference.map(num).unwrap_or_default(),
        r.target,
        match r.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        }
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0) / 1024))
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    json!({ "cpu": cpu, "cores": cores, "memory_mib": mem, "kernel": kernel, "loadavg_at_start": load })
}

// ---------------------------------------------------------------- 1. raw limits

/// memcpy and loopback TCP (1 and 2 streams, two processes). Returns the one-stream loopback
/// MB/s (the baseline of the ps bandwidth figures).
fn raw(opts: &Options, report: &mut Report, print: bool) -> Result<f64> {
    let reps = 3;
    // memcpy
    let size = if opts.quick { 8 << 20 } else { 64 << 20 };
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let mut rates = vec![];
    for _ in 0..reps {
        let rounds = if opts.quick { 4 } else { 16 };
        let t = Instant::now();
        for _ in 0..rounds {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        rates.push((size * rounds) as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    let memcpy = median(rates);
    report.details.insert("memcpy_block_bytes".into(), json!(size));

    // loopback TCP: this process receives, a child process (this executable) sends.
    let per_stream: u64 = if opts.quick { 32 << 20 } else { 1 << 30 };
    let mut tcp = vec![];
    for streams in [1usize, 2] {
        let mut rates = vec![];
        for _ in 0..reps {
            rates.push(loopback_once(streams, per_stream)?);
        }
        tcp.push(median(rates));
    }
    report.details.insert("loopback_bytes_per_stream".into(), json!(per_stream));
    if print {
        report.row("raw", "memcpy bandwidth", memcpy, "MB/s", None, None, "(baseline)", None);
        report.row("raw", "loopback TCP, 1 stream (2 processes)", tcp[0], "MB/s", Some(("memcpy", memcpy)), None, "(baseline)", None);
        report.row("raw", "loopback TCP, 2 streams (2 processes)", tcp[1], "MB/s", Some(("loopback 1 stream", tcp[0])), None, "(baseline)", None);
    }
    Ok(tcp[0])
}

fn loopback_once(streams: usize, per_stream: u64) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let me = std::env::current_exe()?;
    let mut child = Command::new(me).args(["__tcp-send", &addr.to_string(), &streams.to_string(), &per_stream.to_string()]).stdin(Stdio::null()).spawn()?;
    let mut conns = vec![];
    for _ in 0..streams {
        conns.push(listener.accept()?.0);
    }
    let t = Instant::now();
    let readers: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> std::io::Result<u64> {
                let mut buf = vec![0u8; 1 << 20];
                let mut total = 0u64;
                loop {
                    let n = c.read(&mut buf)?;
                    if n == 0 {
                        return Ok(total);
                    }
                    total += n as u64;
                }
            })
        })
        .collect();
    let mut total = 0;
    for r in readers {
        total += r.join().expect("reader thread")?;
    }
    let secs = t.elapsed().as_secs_f64();
    let status = child.wait()?;
    if !status.success() || total != per_stream * streams as u64 {
        bail!("loopback sender failed ({status}); received {total} bytes");
    }
    Ok(total as f64 / secs / 1e6)
}

fn tcp_send_child(args: &[String]) -> Result<()> {
    let addr: SocketAddr = args.first().context("address")?.parse()?;
    let streams: usize = args.get(1).context("streams")?.parse()?;
    let bytes: u64 = args.get(2).context("bytes")?.parse()?;
    let conns: Vec<TcpStream> = (0..streams).map(|_| TcpStream::connect(addr)).collect::<std::io::Result<_>>()?;
    let senders: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || -> std::io::Result<()> {
                let buf = vec![7u8; 1 << 20];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(buf.len() as u64) as usize;
                    c.write_all(&buf[..n])?;
                    left -= n as u64;
                }
                c.shutdown(std::net::Shutdown::Write)
            })
        })
        .collect();
    for s in senders {
        s.join().expect("sender thread")?;
    }
    Ok(())
}

// ---------------------------------------------------------------- 2. ps bandwidth

fn ps_bandwidth(opts: &Options, report: &mut Report, loopback: f64) -> Result<()> {
    // The ps and its client run in this process: with the allocator settings of tfjob-runtime.
    tfjob_runtime::tune_allocator();
    let sizes: Vec<(usize, &str, usize)> =
        if opts.quick { vec![(1 << 16, "64K", 3), (1 << 18, "256K", 3)] } else { vec![(1_000_000, "1M", 15), (25_000_000, "25M", 5)] };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // The tensor channel (what training uses), then gRPC for comparison, in
    // the same run (TLS: the `tls` section).
    for (n, label, reps) in sizes {
        for channel in [true, false] {
            let (pull, push) = rt.block_on(ps_bandwidth_one(n, reps, channel, None))?;
            let gate = label == "25M" && channel;
            let target = if gate { ">= 0.6 x loopback" } else { "" };
            let via = if channel { "" } else { ", gRPC" };
            for (what, rate) in
                [(format!("pull of a {label}-float variable (1 ps{via})"), pull), (format!("push of a {label}-float gradient (1 ps{via})"), push)]
            {
                report.row("ps", &what, rate, "MB/s", Some(("loopback TCP 1 stream", loopback)), None, target, gate.then_some(rate >= 0.6 * loopback));
            }
        }
    }
    Ok(())
}

/// A ps task served in this process on a free loopback port, with a token:
/// the peer of the in-process round-trip benchmarks. It stops when the
/// returned sender is dropped.
async fn serve_in_process_ps(
    tls: Option<tfjob_runtime::auth::TaskTls>,
) -> Result<(std::net::SocketAddr, tfjob_runtime::auth::Credentials, tokio::sync::oneshot::Sender<()>)> {
    use tfjob_runtime::cluster::TaskId;
    use tfjob_runtime::ps::{ParameterStore, PsConfig, PsService};
    use tfjob_runtime::server::{self, WorkerService};
    use tfjob_runtime::status::TaskStatus;

    let credentials = tfjob_runtime::auth::Credentials { token: Some("bench-token".into()), tls };
    let addr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let store = Arc::new(ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0)))));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let status = Arc::new(TaskStatus::new(TaskId::new("ps", 0)));
    server::serve(addr, Some(PsService::new(store)), WorkerService::new(status, None), &credentials, async {
        let _ = stopped.await;
    })
    .await?;
    Ok((addr, credentials, stop))
}

/// Pull and push bandwidth (MB/s, medians of `reps`) of one `n`-float
/// variable on an in-process ps, over the tensor channel or over gRPC.
async fn ps_bandwidth_one(n: usize, reps: usize, tensor_channel: bool, tls: Option<tfjob_runtime::auth::TaskTls>) -> Result<(f64, f64)> {
    use tfjob_runtime::client::{ModelVariable, NO_ROWS, PsSet};
    use tfjob_runtime::cluster::TaskId;
    use tfjob_runtime::optimizer::Optimizer;
    use tfjob_runtime::placement::{self, PlacementInput};
    use tfjob_runtime::proto::{self, UpdateMode};

    let (addr, credentials, stop) = serve_in_process_ps(tls).await?;
    let vars = vec![ModelVariable::dense("v", vec![n])];
    let inputs: Vec<PlacementInput> = vars.iter().map(|v| PlacementInput::dense(v.name.clone(), v.shape.clone())).collect();
    let placement = placement::place(&inputs, 1, placement::DEFAULT_PARTITION_THRESHOLD_BYTES)?;
    let config = proto::TrainingConfig {
        mode: UpdateMode::Async as i32,
        optimizer: Some(Optimizer::sgd(1e-6).to_proto()),
        replicas_to_aggregate: 0,
        total_num_replicas: 0,
        elastic: false,
        follow_chief_aggregation: false,
    };
    let mut ps = PsSet::new(TaskId::new("worker", 0), &[addr.to_string()], &credentials, vars, placement, config, Duration::from_secs(10))?;
    ps.set_tensor_channel(tensor_channel);
    ps.handshake(false).await?;
    let init = ndarray::ArrayD::from_elem(vec![n], 1.0f32);
    ps.init(std::slice::from_ref(&init), 0).await?;
    let mut params = vec![ndarray::ArrayD::zeros(vec![n])];
    let grads = vec![ndarray::ArrayD::from_elem(vec![n], 0.5f32)];
    let bytes = (n * 4) as f64;
    // one warm-up round trip
    let pulled = ps.pull(&mut params, NO_ROWS, &[0], false, Duration::from_secs(1)).await?;
    ps.push(&pulled.steps, &grads, NO_ROWS).await?;
    let (mut pulls, mut pushes) = (vec![], vec![]);
    for _ in 0..reps {
        let t = Instant::now();
        let pulled = ps.pull(&mut params, NO_ROWS, &[0], false, Duration::from_secs(1)).await?;
        pulls.push(bytes / t.elapsed().as_secs_f64() / 1e6);
        if pulled.bytes as f64 != bytes {
            bail!("pulled {} bytes, expected {bytes}", pulled.bytes);
        }
        let t = Instant::now();
        ps.push(&pulled.steps, &grads, NO_ROWS).await?;
        pushes.push(bytes / t.elapsed().as_secs_f64() / 1e6);
    }
    drop(stop);
    Ok((median(pulls), median(pushes)))
}

// ---------------------------------------------------------------- sparse embeddings

/// Sparse pull + push of one batch's rows of an embedding on an in-process ps against pulling
/// and pushing the same table whole (the baseline), then sparse_lr and wide_deep as processes
/// (1 ps + 2 workers and 2 ps + 2 workers) against the same models with --dense_embeddings.
fn sparse(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    tfjob_runtime::tune_allocator();
    let (rows, dim, batch_rows) = if opts.quick { (1 << 14, 16, 512) } else { (1 << 20, 16, 4096) };
    let reps = if opts.quick { 3 } else { 10 };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (sparse_secs, sparse_bytes) = rt.block_on(sparse_round_trip(rows, dim, batch_rows, reps, true))?;
    let (dense_secs, dense_bytes) = rt.block_on(sparse_round_trip(rows, dim, batch_rows, reps, false))?;
    let what = format!("pull + push of {batch_rows} rows of a {rows}x{dim} embedding (1 ps)");
    report.row(
        "sparse",
        &format!("{what}: steps/s"),
        1.0 / sparse_secs,
        "steps/s",
        Some(("the table pulled and pushed whole", 1.0 / dense_secs)),
        None,
        "",
        None,
    );
    report.row("sparse", &format!("{what}: bytes on the wire"), sparse_bytes, "B/step", Some(("the table whole", dense_bytes)), None, "", None);

    let examples = if opts.quick { 2_000 } else { 20_000 };
    let buckets = if opts.quick { 1 << 14 } else { 1 << 18 };
    let mut details = vec![];
    // --quick: one configuration, so that the smoke test stays short.
    let models: &[&str] = if opts.quick { &["sparse_lr"] } else { &["sparse_lr", "wide_deep"] };
    let shapes: &[(usize, usize)] = if opts.quick { &[(1, 2)] } else { &[(1, 2), (2, 2)] };
    for &model in models {
        for &(nps, nw) in shapes {
            let mut figures = vec![];
            for dense in [false, true] {
                let mut a = strs(&["--optimizer=adagrad", "--learning_rate=0.2", "--num_epochs=1", "--log_every_steps=0", "--eval_examples=1000"]);
                a.extend([format!("--model={model}"), format!("--generated_examples={examples}"), format!("--hash_buckets={buckets}")]);
                if model == "wide_deep" {
                    a.push("--hidden_units=16".into());
                }
                if dense {
                    a.push("--dense_embeddings".into());
                }
                let label = format!("sparse-{model}-{nps}ps{nw}w-{}", if dense { "dense" } else { "sparse" });
                let run = run_cluster(opts, bin, &label, nps, nw, &a)?;
                let ex = run.global_steps_per_sec() * 100.0;
                let steps: f64 = run.ps.iter().map(|p| p["pushes_applied"].as_f64().unwrap_or(0.0)).fold(0.0, f64::max).max(1.0);
                let wire: f64 =
                    run.ps.iter().map(|p| p["bytes_sent"].as_f64().unwrap_or(0.0) + p["bytes_received"].as_f64().unwrap_or(0.0)).sum::<f64>() / steps;
                let worker_rss = run.workers.iter().filter_map(|w| w["peak_rss_mib"].as_f64()).fold(0.0, f64::max);
                let ps_rss = run.ps.iter().filter_map(|p| p["peak_rss_mib"].as_f64()).fold(0.0, f64::max);
                figures.push((ex, wire, worker_rss, ps_rss));
                details.push(json!({ "config": label, "workers": run.workers, "ps": run.ps, "examples_per_sec": ex, "bytes_per_step": wire }));
            }
            let [(ex, wire, wrss, prss), (dex, dwire, dwrss, dprss)] = [figures[0], figures[1]];
            let cfg = format!("{model} {nps}ps+{nw}w async, {buckets}-row tables");
            report.row("sparse", &format!("{cfg}: examples/s"), ex, "ex/s", Some(("--dense_embeddings", dex)), None, "", None);
            report.row("sparse", &format!("{cfg}: bytes on the wire per step"), wire, "B/step", Some(("--dense_embeddings", dwire)), None, "", None);
            report.row("sparse", &format!("{cfg}: worker peak RSS"), wrss, "MiB", Some(("--dense_embeddings", dwrss)), None, "", None);
            report.row("sparse", &format!("{cfg}: ps peak RSS"), prss, "MiB", Some(("--dense_embeddings", dprss)), None, "", None);
        }
    }
    report.details.insert("sparse".into(), json!(details));
    Ok(())
}

/// Seconds per pull + push (median of `reps`) and bytes per step: `batch_rows` rows of a
/// `rows`x`dim` embedding by id (`sparse`), or the whole table as a dense variable.
async fn sparse_round_trip(rows: usize, dim: usize, batch_rows: usize, reps: usize, sparse: bool) -> Result<(f64, f64)> {
    use tfjob_runtime::client::{ModelVariable, NO_ROWS, PsSet, StepRequest};
    use tfjob_runtime::cluster::TaskId;
    use tfjob_runtime::init::Init;
    use tfjob_runtime::optimizer::Optimizer;
    use tfjob_runtime::placement::PartitionStrategy;
    use tfjob_runtime::placement::{self, PlacementInput};
    use tfjob_runtime::proto::{self, UpdateMode};

    let (addr, credentials, stop) = serve_in_process_ps(None).await?;
    let var = ModelVariable { name: "emb".into(), shape: vec![rows, dim], rows: sparse.then_some((Init::Uniform { limit: 0.05 }, 1)) };
    let input = PlacementInput { name: "emb".into(), shape: vec![rows, dim], embedding: sparse.then_some(PartitionStrategy::Mod) };
    let placement = placement::place(&[input], 1, usize::MAX)?;
    let config = proto::TrainingConfig { mode: UpdateMode::Async as i32, optimizer: Some(Optimizer::sgd(1e-6).to_proto()), ..Default::default() };
    let ps = PsSet::new(TaskId::new("worker", 0), &[addr.to_string()], &credentials, vec![var], placement, config, Duration::from_secs(10))?;
    ps.handshake(false).await?;
    let init = ndarray::ArrayD::from_elem(if sparse { vec![0, dim] } else { vec![rows, dim] }, 0.01f32);
    ps.init(std::slice::from_ref(&init), 0).await?;
    let ids: Vec<i64> = (0..batch_rows as i64).map(|k| k * (rows / batch_rows) as i64).collect();
    let wanted = vec![if sparse { ids.clone() } else { vec![] }];
    let rows_arg: &[Vec<i64>] = if sparse { &wanted } else { NO_ROWS };
    let mut params = vec![init.clone()];
    let grads = vec![ndarray::ArrayD::from_elem(if sparse { vec![batch_rows, dim] } else { vec![rows, dim] }, 0.5f32)];
    let pushed_bytes = if sparse { (batch_rows * (8 + 4 * dim)) as f64 } else { (rows * dim * 4) as f64 };
    let mut steps = ps.pull(&mut params, rows_arg, &[0], false, Duration::from_secs(10)).await?.steps;
    let (mut times, mut bytes) = (vec![], 0.0);
    // One step: the push of a gradient and the pull of the next values, as training does.
    for r in 0..=reps {
        let t = Instant::now();
        let step = StepRequest { steps: &steps, push_to: &[true], gradients: &grads, pushed_rows: rows_arg, pulled_rows: rows_arg, shard_call: None };
        let stepped = ps.push_pull(step, &mut params, &[0], Duration::from_secs(10)).await?;
        if r > 0 {
            times.push(t.elapsed().as_secs_f64());
            bytes = stepped.pulled.bytes as f64 + pushed_bytes;
        }
        steps = stepped.pulled.steps;
    }
    drop(stop);
    Ok((median(times), bytes))
}

// ---------------------------------------------------------------- elastic ps

/// What adding a ps to a job whose embedding table lives on one ps measured.
#[derive(Debug)]
struct PsScale {
    /// ps 1 started → the first step on the 2-ps layout.
    start_to_first_step: f64,
    /// The longest time between two steps of the chief around the move.
    pause: f64,
    moved: tfjob_runtime::client::mover::Moved,
    rss_before: f64,
    /// Right after the move, before the job trains on 2 ps.
    rss_moved: [f64; 2],
    /// After 3 s of training on 2 ps.
    rss_after: [f64; 2],
    /// ps 0's peak resident memory over its life (during the move: the old state, its own
    /// new part and ps 1's fragments at once).
    ps0_peak: f64,
    steps_before: f64,
    steps_after: f64,
}

/// `--only elastic-ps`: a 2^22 x 16 embedding (every row materialised: 256 MiB of values) on one
/// ps process; the bench plays the chief of an async job pushing 4,096-row batches; ps 1 is
/// started with a 2-ps TF_CONFIG, proposes it, and the chief moves the state as a worker does.
/// Compared with a static job of 2 ps processes holding the same table.
fn elastic_ps(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    let (rows, dim) = if opts.quick { (1usize << 16, 16usize) } else { (1 << 22, 16) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let logs = opts.out.join("logs");
    std::fs::create_dir_all(&logs)?;
    let scaled = rt.block_on(ps_scale_run(bin, &logs, rows, dim))?;
    let (static2, static_rss) = rt.block_on(static_ps_run(bin, &logs, rows, dim))?;
    let m = &scaled.moved;
    let table_mib = (rows * dim * 4) as f64 / (1 << 20) as f64;
    println!(
        "elastic-ps: {rows} x {dim} table; {m}; pause {:.2}s; ps 0 RSS {:.0} -> {:.0} MiB, ps 1 {:.0} MiB",
        scaled.pause, scaled.rss_before, scaled.rss_after[0], scaled.rss_after[1]
    );
    let row = |report: &mut Report, metric: &str, v: f64, unit: &str, base: Option<(&str, f64)>, target: &str, met: Option<bool>| {
        report.row("elastic-ps", metric, v, unit, base, None, target, met)
    };
    row(report, "pause seen by the chief (PS 1 -> 2)", scaled.pause, "s", None, "< 2", Some(scaled.pause < 2.0));
    row(report, "ps 1 started -> first step on 2 ps", scaled.start_to_first_step, "s", None, "", None);
    row(report, "move itself (freeze, stage, commit)", m.seconds, "s", None, "", None);
    let ideal = m.bytes as f64 / 2.0;
    row(report, "bytes moved between ps tasks", m.moved_bytes as f64 / 1e6, "MB", Some(("ideal: half the state", ideal / 1e6)), "~1.0x", None);
    row(report, "ps 0 RSS after the move", scaled.rss_after[0], "MiB", Some(("ps 0 before", scaled.rss_before)), "~0.5x", None);
    row(report, "ps 1 RSS after the move", scaled.rss_after[1], "MiB", Some(("ps 0 before", scaled.rss_before)), "~0.5x", None);
    for (k, &rss) in scaled.rss_moved.iter().enumerate() {
        row(report, &format!("ps {k} RSS right after the move"), rss, "MiB", Some(("ps 0 before", scaled.rss_before)), "", None);
    }
    for (k, &rss) in scaled.rss_after.iter().enumerate() {
        row(report, &format!("ps {k} RSS after the move vs static"), rss, "MiB", Some((&format!("static 2-ps job's ps {k}"), static_rss[k])), "~1.0x", None);
    }
    row(report, "ps 0 peak RSS (during the move)", scaled.ps0_peak, "MiB", Some(("ps 0 before", scaled.rss_before)), "", None);
    row(report, "steps/s on 1 ps before the move", scaled.steps_before, "steps/s", None, "", None);
    row(report, "steps/s on 2 ps after the move", scaled.steps_after, "steps/s", Some(("static 2-ps job", static2)), "~1.0x", None);
    report.details.insert(
        "elastic_ps".into(),
        json!({"rows": rows, "dim": dim, "table_mib": table_mib, "moved_rows": m.rows, "bytes": m.bytes, "moved_bytes": m.moved_bytes,
               "move_secs": m.seconds, "pause_secs": scaled.pause, "start_to_first_step_secs": scaled.start_to_first_step,
               "rss_before_mib": scaled.rss_before, "rss_moved_mib": scaled.rss_moved, "rss_after_mib": scaled.rss_after, "static_2ps_rss_mib": static_rss,
               "ps0_peak_rss_mib": scaled.ps0_peak, "steps_before": scaled.steps_before,
               "steps_after": scaled.steps_after, "static_2ps_steps": static2}),
    );
    Ok(())
}

/// The resident memory of a process, MiB.
fn rss_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmRSS:")
}

/// A memory figure of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:` the peak RSS), MiB.
fn proc_status_mib(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()))
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// A ps process of a bench job (`hosts` its TF_CONFIG's ps set) whose chief is `worker`.
fn spawn_bench_ps(bin: &Path, logs: &Path, name: &str, hosts: &[String], worker: &str, index: usize) -> Result<Proc> {
    let args = vec![
        format!("--ps_hosts={}", hosts.join(",")),
        format!("--worker_hosts={worker}"),
        "--job_name=ps".into(),
        format!("--task_index={index}"),
        "--lease_secs=60".into(),
    ];
    spawn_task(bin, name, &args, logs.join(format!("{name}.log")), None)
}

/// The bench's chief: an async job of one embedding variable over `addresses`.
struct BenchChief {
    ps: tfjob_runtime::client::PsSet,
    steps: Vec<i64>,
    rows: usize,
    dim: usize,
    batch: usize,
    /// How far the next batch starts from this one's start.
    stride: usize,
    next_start: usize,
}

impl BenchChief {
    fn ps_set(addresses: &[String], rows: usize, dim: usize, version: u64) -> Result<tfjob_runtime::client::PsSet> {
        use tfjob_runtime::client::{ModelVariable, PsSet};
        use tfjob_runtime::cluster::TaskId;
        use tfjob_runtime::init::Init;
        use tfjob_runtime::optimizer::Optimizer;
        use tfjob_runtime::placement::{self, PartitionStrategy, PlacementInput};
        use tfjob_runtime::proto::{self, UpdateMode};
        let var = ModelVariable { name: "emb".into(), shape: vec![rows, dim], rows: Some((Init::Uniform { limit: 0.05 }, 1)) };
        let input = PlacementInput { name: "emb".into(), shape: vec![rows, dim], embedding: Some(PartitionStrategy::Consistent) };
        let placement = placement::place(&[input], addresses.len(), usize::MAX)?;
        let config = proto::TrainingConfig { mode: UpdateMode::Async as i32, optimizer: Some(Optimizer::sgd(1e-3).to_proto()), ..Default::default() };
        let credentials = tfjob_runtime::auth::Credentials { token: None, tls: None };
        Ok(PsSet::new(TaskId::new("worker", 0), addresses, &credentials, vec![var], placement, config, Duration::from_secs(30))?.with_layout_version(version))
    }

    /// Joins the ps tasks, initialises the table and updates every row once (65,536 at a time),
    /// so that each is materialised as in a job that trained long.
    async fn start(addresses: &[String], rows: usize, dim: usize) -> Result<Self> {
        let ps = Self::ps_set(addresses, rows, dim, 1)?;
        ps.handshake(false).await?;
        ps.init(&[ndarray::ArrayD::zeros(vec![0, dim])], 0).await?;
        let batch = 65_536.min(rows);
        let mut chief = BenchChief { steps: vec![0; addresses.len()], ps, rows, dim, batch, stride: batch, next_start: 0 };
        chief.refresh_steps().await?;
        for _ in 0..rows / chief.batch {
            chief.step().await?;
        }
        // Then batches of 4,096 rows spread over the table.
        chief.batch = 4_096.min(rows);
        chief.stride = chief.batch * 7 + 1;
        Ok(chief)
    }

    async fn refresh_steps(&mut self) -> Result<()> {
        let mut params = vec![ndarray::ArrayD::zeros(vec![0, self.dim])];
        let min = vec![0; self.ps.num_ps()];
        self.steps = self.ps.pull(&mut params, &[vec![]], &min, false, Duration::from_secs(30)).await?.steps;
        Ok(())
    }

    /// One async step: the gradient of `batch` distinct rows pushed, the next batch's rows pulled.
    async fn step(&mut self) -> Result<()> {
        use tfjob_runtime::client::StepRequest;
        let ids: Vec<i64> = (0..self.batch).map(|k| ((self.next_start + k) % self.rows) as i64).collect();
        self.next_start = (self.next_start + self.stride) % self.rows;
        let grads = vec![ndarray::ArrayD::from_elem(vec![self.batch, self.dim], 0.01f32)];
        let mut params = vec![ndarray::ArrayD::zeros(vec![0, self.dim])];
        let (rows, push_to, min) = (vec![ids], vec![true; self.ps.num_ps()], vec![0; self.ps.num_ps()]);
        let step = StepRequest { steps: &self.steps, push_to: &push_to, gradients: &grads, pushed_rows: &rows, pulled_rows: &rows, shard_call: None };
        self.steps = self.ps.push_pull(step, &mut params, &min, Duration::from_secs(30)).await?.pulled.steps;
        Ok(())
    }

    /// Steps for `secs`; steps per second.
    async fn train_for(&mut self, secs: f64) -> Result<f64> {
        let (start, mut n) = (Instant::now(), 0u64);
        while start.elapsed().as_secs_f64() < secs {
            self.step().await?;
            n += 1;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }
}

async fn ps_scale_run(bin: &Path, logs: &Path, rows: usize, dim: usize) -> Result<PsScale> {
    let ports = free_ports(3)?;
    let hosts: Vec<String> = ports[..2].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let worker = format!("127.0.0.1:{}", ports[2]);
    let mut ps0 = spawn_bench_ps(bin, logs, "elastic-ps-ps0", &hosts[..1], &worker, 0)?;
    let mut chief = BenchChief::start(&hosts[..1], rows, dim).await?;
    let steps_before = chief.train_for(3.0).await?;
    let rss_before = rss_mib(ps0.child.id());
    let started = Instant::now();
    let mut ps1 = spawn_bench_ps(bin, logs, "elastic-ps-ps1", &hosts, &worker, 1)?;
    let (mut pause, mut last_step, mut checked) = (0f64, Instant::now(), Instant::now());
    let moved = loop {
        chief.step().await?;
        pause = pause.max(last_step.elapsed().as_secs_f64());
        last_step = Instant::now();
        if checked.elapsed() < Duration::from_millis(100) {
            continue;
        }
        checked = Instant::now();
        ensure_running(&mut ps1)?;
        let layout = chief.ps.layout().await?;
        if layout.proposed.is_empty() {
            continue;
        }
        let next = BenchChief::ps_set(&layout.proposed, rows, dim, layout.version + 1)?;
        let moved = next.take_over(&chief.ps, layout.version + 1, -1).await?;
        next.handshake(false).await?;
        chief.ps = next;
        chief.refresh_steps().await?;
        break moved;
    };
    let rss_moved = [rss_mib(ps0.child.id()), rss_mib(ps1.child.id())];
    chief.step().await?;
    let start_to_first_step = started.elapsed().as_secs_f64();
    pause = pause.max(last_step.elapsed().as_secs_f64());
    let steps_after = chief.train_for(3.0).await?;
    let rss_after = [rss_mib(ps0.child.id()), rss_mib(ps1.child.id())];
    let ps0_peak = proc_status_mib(ps0.child.id(), "VmHWM:");
    for p in [&mut ps0, &mut ps1] {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    Ok(PsScale { start_to_first_step, pause, moved, rss_before, rss_moved, rss_after, ps0_peak, steps_before, steps_after })
}

fn ensure_running(p: &mut Proc) -> Result<()> {
    if let Some(status) = p.child.try_wait()? {
        bail!("{} exited with {status}", p.name);
    }
    Ok(())
}

/// The steps/s of the same job on 2 ps processes from the start and the resident memory of its ps tasks, MiB.
async fn static_ps_run(bin: &Path, logs: &Path, rows: usize, dim: usize) -> Result<(f64, [f64; 2])> {
    let ports = free_ports(3)?;
    let hosts: Vec<String> = ports[..2].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let worker = format!("127.0.0.1:{}", ports[2]);
    let mut procs = vec![];
    for i in 0..2 {
        procs.push(spawn_bench_ps(bin, logs, &format!("elastic-ps-static{i}"), &hosts, &worker, i)?);
    }
    let result = async {
        let mut chief = BenchChief::start(&hosts, rows, dim).await?;
        let steps = chief.train_for(3.0).await?;
        Ok::<_, anyhow::Error>((steps, [rss_mib(procs[0].child.id()), rss_mib(procs[1].child.id())]))
    }
    .await;
    for p in &mut procs {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    result
}

// ---------------------------------------------------------------- runtime processes

fn runtime_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let dir = me.parent().context("executable directory")?;
    let mut candidates = vec![dir.join("tfjob-runtime")];
    if let Some(p) = dir.parent() {
        candidates.push(p.join("tfjob-runtime")); // deps/ -> target/<profile>/
    }
    if let Ok(p) = std::env::var("TFJOB_RUNTIME_BIN") {
        candidates.insert(0, PathBuf::from(p));
    }
    candidates.into_iter().find(|p| p.is_file()).with_context(|| {
        format!(
            "tfjob-runtime not found next to {}; build it with `cargo build --release -p tfjob-runtime -p tfjob-tests --bin tfjob-runtime --bin tfjob-bench` (or set TFJOB_RUNTIME_BIN)",
            me.display()
        )
    })
}

struct Proc {
    name: String,
    child: Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<()>,
}

/// Time of the first log line showing a completed global step (`global_step=N`, N >= 1).
type FirstStep = Arc<OnceLock<Instant>>;

fn spawn_task(bin: &Path, name: &str, args: &[String], log: PathBuf, first_step: Option<FirstStep>) -> Result<Proc> {
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "info,h2=warn,tower=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut file = std::fs::File::create(log).ok();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(fs) = &first_step
                && fs.get().is_none()
                && step_of(&line).is_some_and(|s| s >= 1)
            {
                let _ = fs.set(Instant::now());
            }
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
        }
    });
    Ok(Proc { name: name.into(), child, stdout, stderr })
}

fn step_of(line: &str) -> Option<i64> {
    let i = line.find("global_step=")? + "global_step=".len();
    let digits: String = line[i..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Waits for a task, killing it after `timeout`; returns its last JSON stdout line.
fn finish(mut p: Proc, timeout: Duration) -> Result<(Value, f64)> {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = p.child.try_wait()? {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = p.child.kill();
            let _ = p.child.wait();
            bail!("{} did not finish within {timeout:?} (killed)", p.name);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let waited = start.elapsed().as_secs_f64();
    let out = p.stdout.join().unwrap_or_default();
    let _ = p.stderr.join();
    if !status.success() {
        bail!("{} exited with {status}", p.name);
    }
    let line = out.lines().rev().find(|l| l.trim_start().starts_with('{')).with_context(|| format!("{} printed no JSON report", p.name))?;
    Ok((serde_json::from_str(line).with_context(|| format!("{}: report {line:?}", p.name))?, waited))
}

fn free_ports(n: usize) -> Result<Vec<u16>> {
    let ls: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    Ok(ls.iter().map(|l| l.local_addr().unwrap().port()).collect())
}

struct ClusterRun {
    /// Launch of the first process to exit of the last worker.
    wall_secs: f64,
    first_step_secs: Option<f64>,
    workers: Vec<Value>,
    ps: Vec<Value>,
}

impl ClusterRun {
    fn chief(&self) -> &Value {
        self.workers.iter().find(|w| w["chief"].as_bool() == Some(true)).unwrap_or(&self.workers[0])
    }
    fn global_step(&self) -> f64 {
        self.workers.iter().filter_map(|w| w["global_step"].as_f64()).fold(0.0, f64::max)
    }
    /// Final global step over the longest worker `elapsed_secs` (which includes connecting and
    /// initialisation): global steps per second of the job.
    fn global_steps_per_sec(&self) -> f64 {
        self.global_step() / self.longest_worker_secs()
    }
    /// Examples every worker trained over the longest worker `elapsed_secs`.
    fn examples_per_sec(&self) -> f64 {
        self.workers.iter().filter_map(|w| w["examples_trained"].as_f64()).sum::<f64>() / self.longest_worker_secs()
    }
    fn longest_worker_secs(&self) -> f64 {
        self.workers.iter().filter_map(|w| w["elapsed_secs"].as_f64()).fold(0.0, f64::max)
    }
}

fn run_single(opts: &Options, bin: &Path, label: &str, args: &[String]) -> Result<(Value, f64)> {
    let t = Instant::now();
    let p = spawn_task(bin, label, args, opts.out.join("logs").join(format!("{label}.log")), None)?;
    let (v, _) = finish(p, Duration::from_secs(300))?;
    Ok((v, t.elapsed().as_secs_f64()))
}

fn run_cluster(opts: &Options, bin: &Path, label: &str, num_ps: usize, num_workers: usize, args: &[String]) -> Result<ClusterRun> {
    let ports = free_ports(num_ps + num_workers)?;
    let hosts = |r: std::ops::Range<usize>| ports[r].iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let ps_hosts = hosts(0..num_ps);
    let worker_hosts = hosts(num_ps..num_ps + num_workers);
    let first: FirstStep = Arc::new(OnceLock::new());
    let start = Instant::now();
    let mut ps = vec![];
    let mut workers = vec![];
    for (job, count) in [("ps", num_ps), ("worker", num_workers)] {
        for i in 0..count {
            let mut a = vec![
                format!("--ps_hosts={ps_hosts}"),
                format!("--worker_hosts={worker_hosts}"),
                format!("--job_name={job}"),
                format!("--task_index={i}"),
                "--bind=127.0.0.1".into(),
                "--shutdown_grace_secs=5".into(),
            ];
            a.extend(args.iter().cloned());
            let name = format!("{label}-{job}{i}");
            let log = opts.out.join("logs").join(format!("{name}.log"));
            let p = spawn_task(bin, &name, &a, log, (job == "worker").then(|| first.clone()))?;
            if job == "ps" { ps.push(p) } else { workers.push(p) }
        }
    }
    let mut run = ClusterRun { wall_secs: 0.0, first_step_secs: None, workers: vec![], ps: vec![] };
    let mut failure = None;
    for w in workers {
        match finish(w, Duration::from_secs(300)) {
            Ok((v, _)) => run.workers.push(v),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    run.wall_secs = start.elapsed().as_secs_f64();
    run.first_step_secs = first.get().map(|t| t.duration_since(start).as_secs_f64());
    for p in ps {
        match finish(p, Duration::from_secs(20)) {
            Ok((v, _)) => run.ps.push(v),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        return Err(e.context(format!("{label}: see logs in {}", opts.out.join("logs").display())));
    }
    Ok(run)
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn wb(v: &Value) -> String {
    format!("W={:.3} b={:.3}", v["W"].as_f64().unwrap_or(f64::NAN), v["b"].as_f64().unwrap_or(f64::NAN))
}

// ---------------------------------------------------------------- 3. linear regression

fn linear(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    let steps = if opts.quick { 200 } else { 4000 };
    let reps = if opts.quick { 1 } else { 3 };
    let common = strs(&["--model=linear", "--learning_rate=0.01", "--batch_size=1", "--log_every_steps=0"]);
    let mut args = common.clone();
    args.push(format!("--train_steps={steps}"));

    let mut singles = vec![];
    let mut details = vec![];
    for r in 0..reps {
        let (v, wall) = run_single(opts, bin, &format!("linear-single-{r}"), &args)?;
        singles.push((v["steps_per_sec"].as_f64().unwrap_or(f64::NAN), wall, v));
    }
    let single = median(singles.iter().map(|s| s.0).collect());
    let single_wall = median(singles.iter().map(|s| s.1).collect());
    report.row("linear", &format!("single process: steps/s ({steps} steps)"), single, "steps/s", None, Some(TF_LINEAR_SINGLE), "", None);
    report.row("linear", "single process: wall time incl. launch", single_wall, "s", None, None, "", None);
    details.push(json!({ "config": "single", "runs": singles.iter().map(|s| json!({"report": s.2, "wall_secs": s.1})).collect::<Vec<_>>() }));
    for (sync, tf, target) in [(false, TF_LINEAR_ASYNC, 6_700.0), (true, TF_LINEAR_SYNC, 3_000.0)] {
        let mode = if sync { "sync" } else { "async" };
        let mut a = args.clone();
        a.push(format!("--sync_replicas={sync}"));
        let mut runs = vec![];
        for r in 0..reps {
            runs.push(run_cluster(opts, bin, &format!("linear-{mode}-{r}"), 1, 2, &a)?);
        }
        let gsps = median(runs.iter().map(ClusterRun::global_steps_per_sec).collect());
        let wall = median(runs.iter().map(|r| r.wall_secs).collect());
        let last = runs.last().unwrap();
        report.row(
            "linear",
            &format!("1ps+2w {mode}: global steps/s"),
            gsps,
            "steps/s",
            Some(("ours single process", single)),
            Some(tf),
            &format!(">= {target:.0}"),
            Some(gsps >= target),
        );
        report.row("linear", &format!("1ps+2w {mode}: wall time incl. launch"), wall, "s", Some(("ours single process", single_wall)), None, "", None);
        println!("          1ps+2w {mode} final (chief): global_step={} {}", last.global_step(), wb(last.chief()));
        details.push(json!({ "config": format!("1ps+2w {mode}"), "runs": runs.iter().map(|r| json!({"workers": r.workers, "ps": r.ps, "wall_secs": r.wall_secs})).collect::<Vec<_>>() }));
    }
    println!("          single process final: {}", wb(&singles.last().unwrap().2));
    report.details.insert("linear".into(), json!(details));
    Ok(())
}

// ---------------------------------------------------------------- 4. MLP

fn mlp(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    let batch = 100.0;
    let steps = if opts.quick { 20 } else { 1000 };
    let mut args = strs(&["--model=mlp", "--hidden_units=100", "--batch_size=100", "--learning_rate=0.5", "--log_every_steps=0"]);
    args.push(format!("--train_steps={steps}"));
    args.push(format!("--eval_examples={}", if opts.quick { 200 } else { 2000 }));
    let mut details = vec![];

    let (v, _) = run_single(opts, bin, "mlp-single", &args)?;
    let single = v["steps_per_sec"].as_f64().unwrap_or(f64::NAN) * batch;
    report.row("mlp", "single process: examples/s", single, "ex/s", None, Some(TF_MLP_SINGLE), ">= 0.8 x TF", Some(single >= 0.8 * TF_MLP_SINGLE));
    details.push(json!({ "config": "single", "report": v }));
    let configs = [
        ("1ps+1w async", 1, 1, false, TF_MLP_1PS1W_ASYNC),
        ("1ps+2w async", 1, 2, false, TF_MLP_1PS2W_ASYNC),
        ("1ps+2w sync", 1, 2, true, TF_MLP_1PS2W_SYNC),
        ("2ps+2w async", 2, 2, false, TF_MLP_2PS2W_ASYNC),
    ];
    for (label, nps, nw, sync, tf) in configs {
        let mut a = args.clone();
        a.push(format!("--sync_replicas={sync}"));
        let run = run_cluster(opts, bin, &format!("mlp-{}", label.replace([' ', '+'], "-")), nps, nw, &a)?;
        let ex = run.global_steps_per_sec() * batch;
        report.row("mlp", &format!("{label}: examples/s"), ex, "ex/s", Some(("ours single process", single)), Some(tf), ">= 2 x TF", Some(ex >= 2.0 * tf));
        let acc = run.chief()["accuracy"].as_f64();
        if let Some(acc) = acc {
            println!("          {label}: held-out accuracy on synthetic data after {} global steps: {acc:.4}", run.global_step());
        }
        details.push(json!({ "config": label, "workers": run.workers, "ps": run.ps, "wall_secs": run.wall_secs, "examples_per_sec": ex }));
    }

    // Accuracy against TF's figure: reference data and init, 2,000 global steps, lr 0.5.
    let data = opts.data_dir.clone().or_else(|| {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/synthetic-mnist");
        d.join("t10k-labels-idx1-ubyte.gz").is_file().then_some(d)
    });
    match data {
        Some(dir) => {
            let steps = if opts.quick { 50 } else { 2000 };
            let mut a = strs(&["--model=mlp", "--hidden_units=100", "--batch_size=100", "--learning_rate=0.5", "--weight_init=normal", "--log_every_steps=0"]);
            a.push(format!("--train_steps={steps}"));
            a.push(format!("--data_dir={}", dir.display()));
            // Every configuration of TF's table, each against its own figure.
            let (v, _) = run_single(opts, bin, "mlp-accuracy-single", &a)?;
            let single_acc = v["accuracy"].as_f64().unwrap_or(f64::NAN);
            let mut runs = vec![json!({ "config": "single", "report": v })];
            let mut accuracies = vec![("single process", single_acc, TF_MLP_ACCURACY[0])];
            let configs = [("1ps+1w async", 1, 1, false), ("1ps+2w async", 1, 2, false), ("1ps+2w sync", 1, 2, true), ("2ps+2w async", 2, 2, false)];
            for (i, (label, nps, nw, sync)) in configs.into_iter().enumerate() {
                let mut a = a.clone();
                a.push(format!("--sync_replicas={sync}"));
                let run = run_cluster(opts, bin, &format!("mlp-accuracy-{}", label.replace([' ', '+'], "-")), nps, nw, &a)?;
                accuracies.push((label, run.chief()["accuracy"].as_f64().unwrap_or(f64::NAN), TF_MLP_ACCURACY[i + 1]));
                runs.push(json!({ "config": label, "workers": run.workers }));
            }
            for (label, acc, tf) in accuracies {
                report.row(
                    "mlp",
                    &format!("held-out accuracy, {label}, {steps} steps"),
                    acc,
                    "",
                    (label != "single process").then_some(("ours single process", single_acc)),
                    Some(tf),
                    "within 0.02 of TF",
                    (!opts.quick).then_some((acc - tf).abs() <= ACCURACY_TOLERANCE),
                );
            }
            details.push(json!({ "config": "accuracy", "data_dir": dir, "runs": runs }));
        }
        None => println!("          (accuracy comparison skipped: no reference data; pass --data-dir)"),
    }
    report.details.insert("mlp".into(), json!(details));
    Ok(())
}

// ---------------------------------------------------------------- 5. startup

fn startup(opts: &Options, report: &mut Report, bin: &Path) -> Result<()> {
    let reps = if opts.quick { 1 } else { 5 };
    let mut launch = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        let s = Command::new(bin).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status()?;
        if !s.success() {
            bail!("{} --help failed", bin.display());
        }
        launch.push(t.elapsed().as_secs_f64());
    }
    let launch = median(launch);
    let args = strs(&["--model=linear", "--learning_rate=0.01", "--batch_size=1", "--train_steps=50", "--log_every_steps=1"]);
    let mut firsts = vec![];
    for r in 0..reps {
        let run = run_cluster(opts, bin, &format!("startup-{r}"), 1, 2, &args)?;
        firsts.push(run.first_step_secs.context("no worker logged a completed global step")?);
    }
    let first = median(firsts.clone());
    report.row("startup", "1ps+2w launch to first global step", first, "s", Some(("launch+exit of one process", launch)), None, "< 0.5", Some(first < 0.5));
    report.details.insert("startup_secs".into(), json!(firsts));
    Ok(())
}

// ---------------------------------------------------------------- 6. operator

// ---------------------------------------------------------------- 5b. elastic

/// A `tfjob run` of an elastic sync linear job (ps + `workers`, `--replicas_to_aggregate=auto`,
/// trains until stopped), the user's way: the `tfjob` next to `tfjob-runtime`.
struct LocalRun {
    child: Child,
    dir: PathBuf,
    started: Instant,
}

impl LocalRun {
    fn start(opts: &Options, runtime: &Path, name: &str, workers: usize) -> Result<LocalRun> {
        let tfjob = runtime.with_file_name("tfjob");
        anyhow::ensure!(tfjob.is_file(), "no tfjob next to {}: build it with `cargo build --release --bins`", runtime.display());
        let base = opts.out.join("elastic");
        let dir = base.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&base)?;
        let args = r#"["--model=linear", "--learning_rate=0.01", "--batch_size=1", "--train_steps=1000000000", "--sync_replicas", "--replicas_to_aggregate=auto", "--lease_secs=2", "--log_every_steps=200"]"#;
        let replica = |rtype: &str, n: usize| {
            format!(
                "    {rtype}:\n      replicas: {n}\n      restartPolicy: Never\n      template:\n        spec:\n          containers:\n            - name: tensorflow\n              image: tfjob-runtime:latest\n              command: [\"tfjob-runtime\"]\n              args: {args}\n"
            )
        };
        let manifest = base.join(format!("{name}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: {name}\nspec:\n  tfReplicaSpecs:\n{}{}",
                replica("PS", 1),
                replica("Worker", workers)
            ),
        )?;
        let started = Instant::now();
        let child = Command::new(&tfjob)
            .args(["run", "--quiet", "--run-dir"])
            .arg(&dir)
            .arg(&manifest)
            .env("PATH", format!("{}:{}", runtime.parent().unwrap_or(Path::new(".")).display(), std::env::var("PATH").unwrap_or_default()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(base.join(format!("{name}.console.txt")))?)
            .spawn()
            .with_context(|| format!("starting {}", tfjob.display()))?;
        Ok(LocalRun { child, dir, started })
    }

    fn log(&self, replica: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{replica}.log"))).unwrap_or_default()
    }

    /// Polls until `ready` holds (every 5 ms); fails after `limit` or when the run ends.
    fn wait_for(&mut self, what: &str, limit: Duration, ready: impl Fn(&LocalRun) -> bool) -> Result<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            if ready(self) {
                return Ok(Instant::now());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("tfjob run of {} ended ({status}) before {what}; see {}", self.dir.display(), self.dir.display());
            }
            if Instant::now() > deadline {
                bail!("{what}: not within {limit:?} (run directory {})", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The largest `global_step=N` worker-0 logged so far.
    fn global_step(&self) -> i64 {
        self.log("worker-0").lines().filter_map(step_of).max().unwrap_or(0)
    }

    /// Global steps per second over `window`, from worker-0's log.
    fn steps_per_sec(&mut self, window: Duration) -> Result<f64> {
        let (s0, t0) = (self.global_step(), Instant::now());
        std::thread::sleep(window);
        if let Some(status) = self.child.try_wait()? {
            bail!("tfjob run of {} ended ({status}) while measuring", self.dir.display());
        }
        Ok((self.global_step() - s0) as f64 / t0.elapsed().as_secs_f64())
    }

    fn first_gradient(&self, replica: &str) -> bool {
        self.log(replica).contains("first gradient accepted")
    }

    /// Ctrl-C, as a user stops it (the run stops every replica).
    fn stop(mut self) -> Result<()> {
        // SAFETY: kill(2) of the child this bench started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("tfjob run of {} did not stop on SIGINT", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// "(X s after the process started)" of a replica's first-gradient line.
fn first_gradient_secs(log: &str) -> Option<f64> {
    let rest = log.split("first gradient accepted at global_step=").nth(1)?;
    rest.split('(').nth(1)?.split('s').next()?.parse().ok()
}

/// Scaling a running job with `tfjob scale`: the time from the request to the new worker's first
/// applied gradient (next to the time a static job of the same size takes from `tfjob run` to its
/// last worker's first gradient), and global steps/s before (2 workers) and after (4 workers)
/// the scale, each next to a static job of that size measured in this run.
fn elastic(opts: &Options, report: &mut Report, runtime: &Path) -> Result<()> {
    let window = Duration::from_secs(if opts.quick { 1 } else { 4 });
    let limit = Duration::from_secs(60);
    let mut statics = vec![];
    for workers in [2usize, 4] {
        let mut run = LocalRun::start(opts, runtime, &format!("static-{workers}w"), workers)?;
        let last = format!("worker-{}", workers - 1);
        let ready = run.wait_for(&format!("{last}'s first gradient"), limit, |r| r.first_gradient(&last))?;
        let launch_to_gradient = ready.duration_since(run.started).as_secs_f64();
        std::thread::sleep(window / 4);
        let rate = run.steps_per_sec(window)?;
        run.stop()?;
        statics.push((launch_to_gradient, rate));
    }
    let [(_, static2), (static4_launch, static4)] = [statics[0], statics[1]];

    let mut run = LocalRun::start(opts, runtime, "elastic", 2)?;
    run.wait_for("worker-1's first gradient", limit, |r| r.first_gradient("worker-1"))?;
    std::thread::sleep(window / 4);
    let before = run.steps_per_sec(window)?;
    let tfjob = runtime.with_file_name("tfjob");
    let asked = Instant::now();
    let out = Command::new(&tfjob).arg("scale").arg(&run.dir).arg("Worker=4").output()?;
    anyhow::ensure!(out.status.success(), "tfjob scale: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let got = run.wait_for("worker-3's first gradient", limit, |r| r.first_gradient("worker-3") && r.first_gradient("worker-2"))?;
    let scale_to_gradient = got.duration_since(asked).as_secs_f64();
    let process_to_gradient = first_gradient_secs(&run.log("worker-3")).unwrap_or(f64::NAN);
    std::thread::sleep(window / 4);
    let after = run.steps_per_sec(window)?;
    run.stop()?;

    report.row(
        "elastic",
        "tfjob scale 2→4: to new workers' 1st gradient",
        scale_to_gradient,
        "s",
        Some(("static 4w: run to 1st gradient", static4_launch)),
        None,
        "",
        None,
    );
    report.row("elastic", "new worker: process start to 1st gradient", process_to_gradient, "s", None, None, "< 1", Some(process_to_gradient < 1.0));
    report.row("elastic", "2 workers before the scale: global steps/s", before, "steps/s", Some(("static 2w job", static2)), None, "", None);
    report.row("elastic", "4 workers after the scale: global steps/s", after, "steps/s", Some(("static 4w job", static4)), None, "", None);
    report.details.insert(
        "elastic".into(),
        json!({
            "scale_to_first_gradient_secs": scale_to_gradient,
            "process_start_to_first_gradient_secs": process_to_gradient,
            "steps_per_sec": { "before_2w": before, "after_4w": after, "static_2w": static2, "static_4w": static4 },
            "static_4w_launch_to_first_gradient_secs": static4_launch,
            "window_secs": window.as_secs_f64(),
        }),
    );
    Ok(())
}

fn job_yaml(name: &str, replicas: usize) -> String {
    let ps = (replicas / 10).max(1).min(replicas.saturating_sub(1)).max(usize::from(replicas > 1));
    let workers = replicas - ps;
    let mut y = format!("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {{name: {name}, namespace: default, uid: u-{name}}}\nspec:\n  tfReplicaSpecs:\n");
    for (t, n) in [("PS", ps), ("Worker", workers)] {
        if n == 0 {
            continue;
        }
        y.push_str(&format!(
            "    {t}:\n      replicas: {n}\n      template:\n        spec:\n          containers: [{{name: tensorflow, image: \"tfjob-runtime:latest\", command: [tfjob-runtime], args: [\"--model=mlp\"]}}]\n"
        ));
    }
    y
}

fn parse_job(name: &str, replicas: usize) -> Result<tfjob_api::api::TFJob> {
    let doc: serde_json::Value = serde_saphyr::from_str(&job_yaml(name, replicas))?;
    tfjob_api::api::parse_and_validate(doc).map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// What the controller computes in one reconcile of `job` before its API calls
/// (`kube::reconcile_inner`): validation, defaults, the Service, the Secret (built on the first
/// reconcile), the PodGroup when configured, the status machine over the `observed` pods, and
/// the pod of every `CreateReplica` action, handed to `send` one at a time as the controller
/// sends them. `send` stands for the API call: the controller writes the pod's `TF_CONFIG` out
/// (`PlannedPod::into_pod`) only there, and the client JSON-encodes the body. Returns the
/// number of pods sent.
fn controller_pass(
    job: &tfjob_api::api::TFJob,
    observed: &[tfjob_api::status::ObservedReplica],
    po: &tfjob_api::plan::PlanOptions,
    mut send: impl FnMut(tfjob_api::plan::PlannedPod),
) -> usize {
    use std::hint::black_box;
    use tfjob_api::status::{self, Action, Observation};
    use tfjob_api::{api, plan};
    let invalid = api::validate(job);
    let mut defaulted = job.clone();
    api::apply_defaults(&mut defaulted.spec);
    black_box(plan::build_secret(&defaulted, "token", None));
    black_box(plan::build_service(&defaulted));
    if let Some(gang) = &po.gang_scheduler {
        black_box(plan::build_pod_group(&defaulted, gang));
    }
    let old_status = job.status.clone().unwrap_or_default();
    let outcome = status::reconcile_status(&Observation {
        namespace: "default",
        name: job.metadata.name.as_deref().unwrap_or_default(),
        spec: &defaulted.spec,
        status: &old_status,
        replicas: observed,
        invalid: &invalid,
        now: jiff::Timestamp::now(),
    });
    let mut planner = None;
    let mut sent = 0;
    for action in &outcome.actions {
        if let Action::CreateReplica { replica_type, index } = action {
            let planner = planner.get_or_insert_with(|| plan::PodPlanner::new(&defaulted, po));
            if let Some(pod) = planner.pod(*replica_type, *index) {
                send(pod);
                sent += 1;
            }
        }
    }
    black_box(outcome.status);
    sent
}

/// The request body of a pod the controller sends: its `TF_CONFIG` written out, JSON-encoded.
fn request_body(pod: tfjob_api::plan::PlannedPod) -> Vec<u8> {
    serde_json::to_vec(&pod.into_pod()).unwrap_or_default()
}

fn operator(opts: &Options, report: &mut Report) -> Result<()> {
    use tfjob_api::api::ReplicaType;
    use tfjob_api::plan::{PlanOptions, ReplicaPlanner, pod_name};
    use tfjob_api::status::{ObservedReplica, Phase};
    let sizes: &[usize] = if opts.quick { &[10, 100] } else { &[10, 100, 1_000, 10_000] };
    let po = PlanOptions::default();
    let mut body_mb = serde_json::Map::new();
    for &n in sizes {
        let job = parse_job("bench", n)?;
        // Every pod of the job observed Running (a later reconcile: nothing to create).
        let no_address = |_: ReplicaType, _: i32, _: i32| String::new();
        let running: Vec<ObservedReplica> = ReplicaPlanner::new("bench", &job.spec, &no_address)
            .replica_ids()
            .map(|(replica_type, index)| ObservedReplica {
                replica_type,
                index,
                name: pod_name("bench", replica_type, index),
                phase: Phase::Running,
                exit_code: None,
                exit_reason: None,
                restart_count: 0,
                terminating: false,
                unschedulable: None,
                disrupted: false,
            })
            .collect();
        assert_eq!(running.len(), n);
        // Up to 21 passes, as many as fit in ~3 s (at least one); the request bodies (gigabytes
        // at 10,000 replicas) up to 5 times in another ~3 s.
        let (mut plan_t, mut body_t, mut steady_t) = (vec![], vec![], vec![]);
        let budget = Instant::now();
        while plan_t.len() < 21 && (plan_t.is_empty() || budget.elapsed() < Duration::from_secs(3)) {
            let t = Instant::now();
            let sent = controller_pass(&job, &[], &po, |p| {
                std::hint::black_box(p);
            });
            plan_t.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(sent, n);
            let t = Instant::now();
            let sent = controller_pass(&job, &running, &po, |p| {
                std::hint::black_box(p);
            });
            steady_t.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(sent, 0);
        }
        let mut bytes = 0;
        let budget = Instant::now();
        while body_t.len() < 5 && (body_t.is_empty() || budget.elapsed() < Duration::from_secs(3)) {
            let mut planned = Vec::with_capacity(n);
            controller_pass(&job, &[], &po, |p| planned.push(p));
            let t = Instant::now();
            bytes = planned.into_iter().map(|p| std::hint::black_box(request_body(p)).len()).sum::<usize>();
            body_t.push(t.elapsed().as_secs_f64() * 1e3);
        }
        body_mb.insert(n.to_string(), json!(bytes as f64 / 1e6));
        let plan_ms = median(plan_t);
        let gate = n == 10_000;
        report.row(
            "operator",
            &format!("planning pass, {n} replicas"),
            plan_ms,
            "ms",
            Some(("request bodies: TF_CONFIG written out + JSON encoding of the pods", median(body_t))),
            None,
            if gate { "< 50" } else { "" },
            gate.then_some(plan_ms < 50.0),
        );
        report.row(
            "operator",
            &format!("reconcile, {n} replicas all running"),
            median(steady_t),
            "ms",
            Some(("planning pass (the job's first reconcile)", plan_ms)),
            None,
            "",
            None,
        );
    }
    report.details.insert("operator_request_bodies_mb".into(), Value::Object(body_mb));
    let jobs = if opts.quick { 50 } else { 1_000 };
    let me = std::env::current_exe()?;
    let out = Command::new(me).args(["__plan-mem", &jobs.to_string(), "10"]).output()?;
    if !out.status.success() {
        bail!("planning memory child failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("planning memory child output")?;
    let peak = v["vm_hwm_kib_after"].as_f64().unwrap_or(f64::NAN) / 1024.0;
    let before = v["vm_hwm_kib_before"].as_f64().unwrap_or(f64::NAN) / 1024.0;
    report.row(
        "operator",
        &format!("peak RSS planning {jobs} jobs x 10 replicas"),
        peak,
        "MiB",
        Some(("same process before", before)),
        None,
        "< 50",
        (!opts.quick).then_some(peak < 50.0),
    );
    report.details.insert("operator_memory".into(), v);
    Ok(())
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// Child: holds `jobs` parsed TFJobs (what the controller's cache holds) and reconciles every one
/// of them as new jobs, three passes ([`controller_pass`], each pod's request body written and
/// dropped as it is sent); prints VmHWM before and after.
fn plan_mem_child(args: &[String]) -> Result<()> {
    use tfjob_api::plan::PlanOptions;
    let jobs: usize = args.first().context("jobs")?.parse()?;
    let replicas: usize = args.get(1).context("replicas")?.parse()?;
    let before = vm_hwm_kib();
    let all: Vec<_> = (0..jobs).map(|i| parse_job(&format!("job-{i}"), replicas)).collect::<Result<_>>()?;
    let parsed = vm_hwm_kib();
    let po = PlanOptions::default();
    let mut pods = 0;
    let t = Instant::now();
    for _ in 0..3 {
        for job in &all {
            pods += controller_pass(job, &[], &po, |p| {
                std::hint::black_box(request_body(p));
            });
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let after = vm_hwm_kib();
    println!(
        "{}",
        json!({ "jobs": jobs, "replicas_per_job": replicas, "passes": 3, "pods_planned": pods, "secs": secs, "vm_hwm_kib_before": before, "vm_hwm_kib_parsed": parsed, "vm_hwm_kib_after": after })
    );
    drop(all);
    Ok(())
}

// ---------------------------------------------------------------- plot

/// The picture of the run, drawn by the project's plotting module (titles, axes with units,
/// tick labels, legends; the font is in the binary): for each configuration ours next to
/// TensorFlow 2.20's reference, with the target as a red mark. Left: MLP examples/s; middle:
/// linear regression global steps/s (the single process's millions of steps/s are in the
/// table: next to them the distributed bars would be flat on the axis); right: ps bandwidth
/// for 25M floats over the tensor channel and gRPC, next to loopback TCP.
/// Only the charts of sections the run measured are drawn; false when there is none (no file).
fn plot(rows: &[Row], path: &Path) -> Result<bool> {
    use tfjob::plot::{Bars, Chart, Figure, Plot, write_png};
    let pick = |section: &str, prefix: &str| rows.iter().find(|r| r.section == section && r.metric.starts_with(prefix));
    let ours = |r: Option<&Row>| r.map_or(f64::NAN, |r| r.ours);
    let tf = |r: Option<&Row>| r.and_then(|r| r.tf_reference).unwrap_or(f64::NAN);
    let comparison = |title: &str, y_label: &str, configs: Vec<(&str, Option<&Row>, f64)>| Chart {
        title: title.into(),
        x_label: "configuration (ps + workers)".into(),
        y_label: y_label.into(),
        plot: Plot::Bars {
            categories: configs.iter().map(|c| c.0.to_string()).collect(),
            bars: vec![
                Bars { label: "tfjob-rs".into(), values: configs.iter().map(|c| ours(c.1)).collect(), grey: false },
                Bars { label: "TensorFlow 2.20 (reference)".into(), values: configs.iter().map(|c| tf(c.1)).collect(), grey: true },
            ],
            marks: Some(("target".into(), configs.iter().map(|c| c.2).collect())),
        },
    };
    // MLP targets: 0.8x TensorFlow's single process, 2x its distributed runs.
    let mlp_target = |r: Option<&Row>, f: f64| tf(r) * f;
    let mlp: Vec<(&str, Option<&Row>, f64)> = [
        ("single", "single process: examples/s", 0.8),
        ("1+1 async", "1ps+1w async", 2.0),
        ("1+2 async", "1ps+2w async", 2.0),
        ("1+2 sync", "1ps+2w sync", 2.0),
        ("2+2 async", "2ps+2w async", 2.0),
    ]
    .into_iter()
    .map(|(name, prefix, f)| {
        let r = pick("mlp", prefix);
        (name, r, mlp_target(r, f))
    })
    .collect();
    let linear = vec![("1+2 async", pick("linear", "1ps+2w async: global"), 6_700.0), ("1+2 sync", pick("linear", "1ps+2w sync: global"), 3_000.0)];
    let bandwidth = |prefix: &str| ours(pick("ps", prefix));
    let loopback = pick("ps", "pull of a 25M").and_then(|r| r.baseline).unwrap_or(f64::NAN);
    let ps = Chart {
        title: "ps bandwidth, 25M floats (1 ps)".into(),
        x_label: "transfer".into(),
        y_label: "MB/s".into(),
        plot: Plot::Bars {
            categories: ["pull, channel", "push, channel", "pull, gRPC", "push, gRPC"].map(String::from).to_vec(),
            bars: vec![
                Bars {
                    label: "tfjob-rs".into(),
                    values: vec![
                        bandwidth("pull of a 25M-float variable (1 ps)"),
                        bandwidth("push of a 25M-float gradient (1 ps)"),
                        bandwidth("pull of a 25M-float variable (1 ps, gRPC)"),
                        bandwidth("push of a 25M-float gradient (1 ps, gRPC)"),
                    ],
                    grey: false,
                },
                Bars { label: "loopback TCP (baseline)".into(), values: vec![loopback; 4], grey: true },
            ],
            marks: Some(("target (0.6 x loopback)".into(), vec![0.6 * loopback, 0.6 * loopback, f64::NAN, f64::NAN])),
        },
    };
    let charts = vec![
        comparison("MLP 784-100-10, batch 100", "examples/s", mlp),
        comparison("Linear regression y = 2x + 10", "global steps/s", linear),
        ps,
        limit::chart(rows),
    ];
    // Only the sections the run measured (`--only limit` drew three empty charts).
    let charts: Vec<Chart> = charts.into_iter().filter(measured).collect();
    if charts.is_empty() {
        return Ok(false);
    }
    let figure = Figure { title: "tfjob-bench: tfjob-rs against TensorFlow 2.20 and the machine's own limits".into(), columns: charts.len(), charts };
    write_png(&figure, path, (600 * figure.columns as u32, 600)).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(true)
}

/// A chart with at least one bar of ours measured (references and targets alone say nothing).
fn measured(chart: &tfjob::plot::Chart) -> bool {
    match &chart.plot {
        tfjob::plot::Plot::Bars { bars, .. } => bars.iter().filter(|b| !b.grey).any(|b| b.values.iter().any(|v| v.is_finite())),
        tfjob::plot::Plot::Lines(series) => series.iter().any(|s| !s.points.is_empty()),
    }
}

//! `tfjob-soak`: minutes of TFJob churn against one operator on a test control plane of its own,
//! then its watch caches against the API server, leftovers, memory and reconcile latency (see
//! `tfjob_tests::soak`).
//!
//! Usage: tfjob-soak [--minutes M] [--jobs N] [--sample-secs S] [--seed X]
//!   --minutes M      how long the churn lasts (default 10; fractions allowed)
//!   --jobs N         TFJobs at a time (default 20)
//!   --sample-secs S  how often the operator's memory is printed (default 60)
//!   --seed X         the choice of operations (default: from the clock, printed)

use std::process::ExitCode;
use std::time::Duration;

use tfjob_tests::controlplane::ControlPlane;
use tfjob_tests::soak::{SoakOptions, run};

const USAGE: &str = "usage: tfjob-soak [--minutes M] [--jobs N] [--sample-secs S] [--seed X]";

fn parse() -> Result<SoakOptions, String> {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut o = SoakOptions { duration: Duration::from_secs(600), jobs: 20, sample_every: Duration::from_secs(60), seed };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| v.parse::<f64>().ok().filter(|n| n.is_finite() && *n > 0.0).ok_or_else(|| format!("{flag}: {v:?} is not a positive number"));
        match flag.as_str() {
            "--minutes" => o.duration = Duration::from_secs_f64(number(&value)? * 60.0),
            "--jobs" => o.jobs = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| format!("--jobs: {value:?} is not a positive count"))?,
            "--sample-secs" => o.sample_every = Duration::from_secs_f64(number(&value)?),
            "--seed" => o.seed = value.parse().map_err(|_| format!("--seed: {value:?} is not a number"))?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "soak: {:.1} minutes, {} jobs at a time, seed {} (starting a control plane and the operator)",
        options.duration.as_secs_f64() / 60.0,
        options.jobs,
        options.seed
    );
    let result = ControlPlane::start().and_then(|cp| run(&cp, &options));
    match result {
        Ok(report) => {
            print!("{}", report.render());
            println!("soak: passed: the caches equal the API server's state, nothing was left, the memory stayed flat");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("soak: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

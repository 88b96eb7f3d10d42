//! A day of churn, in minutes: one operator process (the chart's RBAC, watching one namespace)
//! while, for a while, a few TFJobs at a time are created, started, scaled, failed on purpose,
//! finished and deleted on a test control plane, their pods played by the soak itself (status
//! writes, as a kubelet's; no container runs). Then:
//! - the operator's watch caches equal the API server's state (`/debug/caches`: per kind, the
//!   count and a digest of every object's name and resourceVersion, compared with the API
//!   server's lists under the same label selector), once with the jobs there and once after
//!   they are all deleted;
//! - no pod, Service or Secret of any job is left after deletion (the garbage collector);
//! - the operator's resident memory, sampled all along, is flat: at the end it is within
//!   [`RSS_SLACK`] of what it was once the churn had warmed its caches up;
//! - reconcile latency percentiles, from the operator's histogram.
//!
//! `tfjob-soak` (`cargo run --release -p tfjob-tests --bin tfjob-soak -- --minutes 10`) runs it
//! on a control plane of its own; `operator_controlplane.rs` runs a 30-second one in the default
//! test run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tfjob_api::plan::{LABEL_JOB_NAME, LABEL_OPERATOR_NAME, OPERATOR_NAME};
use tfjob_operator::metrics::cache_summary;

use crate::controlplane::ControlPlane;
use crate::operator::{Cluster, Operator, PodState, eventually, operator_account, tfjob};

/// How much the operator's memory may grow from its warmed-up sample to the end: a factor and
/// MiB on top (allocator slack; a leak of a few KiB per job over hundreds of jobs exceeds it).
pub const RSS_SLACK: (f64, f64) = (1.25, 8.0);

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// How long the churn lasts.
    pub duration: Duration,
    /// How many TFJobs exist at a time (at most).
    pub jobs: usize,
    /// How often the operator's memory is sampled and printed.
    pub sample_every: Duration,
    /// Seed of the choice of operations.
    pub seed: u64,
}

/// What was measured.
#[derive(Debug, Default)]
pub struct SoakReport {
    /// Operations done, by kind.
    pub operations: BTreeMap<&'static str, usize>,
    /// Jobs created in all.
    pub jobs_created: usize,
    /// (seconds since the start, operator RSS in MiB).
    pub rss: Vec<(f64, f64)>,
    /// Reconcile latency (p50, p90, p99) in seconds, from the histogram's buckets.
    pub reconcile_quantiles: [f64; 3],
    /// Reconciles in all.
    pub reconciles: f64,
}

impl SoakReport {
    /// The report as lines of text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let ops: Vec<String> = self.operations.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(out, "soak: {} jobs created; operations: {}", self.jobs_created, ops.join(", "));
        let rss: Vec<String> = self.rss.iter().map(|(t, m)| format!("{t:.0}s {m:.1}")).collect();
        let _ = writeln!(out, "soak: operator RSS (MiB): {}", rss.join(" | "));
        let [p50, p90, p99] = self.reconcile_quantiles;
        let _ = writeln!(out, "soak: {} reconciles; latency p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms", self.reconciles, p50 * 1e3, p90 * 1e3, p99 * 1e3);
        out
    }
}

/// A small deterministic generator (xorshift64*): the soak's choices, reproducible by seed.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// A job of the soak, as the soak drives it.
struct SoakJob {
    name: String,
    workers: i32,
    /// `Never` (a failed pod fails the job) or `OnFailure` (it is created again).
    restart: &'static str,
    finished: bool,
}

/// Runs the soak in a namespace of its own on `cp` (see the module documentation).
pub fn run(cp: &ControlPlane, options: &SoakOptions) -> Result<SoakReport> {
    let ns = cp.create_namespace("soak")?;
    let account = operator_account(cp, &ns)?;
    let op = Operator::start_ready(cp, &account, "soak-operator")?;
    let k = Cluster::new(cp, &ns);
    let r = churn_and_check(&k, &op, options);
    r.map_err(|e| anyhow!("{e:#}\noperator log:\n{}", op.log_tail(40)))
}

fn churn_and_check(k: &Cluster<'_>, op: &Operator, options: &SoakOptions) -> Result<SoakReport> {
    let mut report = SoakReport::default();
    let started = Instant::now();
    churn(k, op, options, started, &mut report)?;
    ensure!(!op.log_tail(2000).contains("panicked"), "the operator panicked:\n{}", op.log_tail(60));
    caches_match(k, op).context("with the jobs there")?;
    sample_rss(op, started, &mut report)?;
    check_flat(&report.rss, options)?;
    delete_all(k)?;
    caches_match(k, op).context("after every job was deleted")?;
    let metrics = op.metrics()?;
    report.reconcile_quantiles = [0.5, 0.9, 0.99].map(|q| histogram_quantile(&metrics, "tfjob_reconcile_duration_seconds", q).unwrap_or(f64::NAN));
    report.reconciles = op.metric("tfjob_reconcile_duration_seconds_count")?;
    Ok(report)
}

/// The churn itself, until `options.duration` has passed, sampling the operator's memory.
fn churn(k: &Cluster<'_>, op: &Operator, options: &SoakOptions, started: Instant, report: &mut SoakReport) -> Result<()> {
    let mut choices = Choices(options.seed | 1);
    let mut jobs: Vec<SoakJob> = Vec::new();
    let mut next_sample = started;
    while started.elapsed() < options.duration {
        if Instant::now() >= next_sample {
            sample_rss(op, started, report)?;
            eprintln!(
                "soak: {:.0}s: {} jobs, {} operations, operator RSS {:.1} MiB",
                started.elapsed().as_secs_f64(),
                jobs.len(),
                report.operations.values().sum::<usize>(),
                report.rss.last().map_or(0.0, |r| r.1)
            );
            next_sample += options.sample_every;
        }
        let what = step(k, &mut jobs, &mut choices, options.jobs, &mut report.jobs_created)?;
        *report.operations.entry(what).or_insert(0) += 1;
    }
    Ok(())
}

/// One operation on one job; returns its kind.
fn step(k: &Cluster<'_>, jobs: &mut Vec<SoakJob>, choices: &mut Choices, most: usize, created: &mut usize) -> Result<&'static str> {
    if jobs.len() < most {
        *created += 1;
        let job = SoakJob { name: format!("soak-{created}"), workers: 2, restart: if choices.below(3) == 0 { "Never" } else { "OnFailure" }, finished: false };
        k.apply(&tfjob(&job.name, &[("PS", 1, "OnFailure"), ("Worker", job.workers, job.restart)], json!({"cleanPodPolicy": "None"})).to_string())?;
        jobs.push(job);
        return Ok("create");
    }
    let i = choices.below(jobs.len());
    let pods = k.job_pods(&jobs[i].name)?;
    let job = &mut jobs[i];
    let what = if job.finished { 4 } else { choices.below(5) };
    match what {
        0 => {
            for pod in &pods {
                unless_gone(k.set_pod(pod, PodState::RUNNING))?;
            }
            Ok("start")
        }
        1 => {
            job.workers = 1 + choices.below(4) as i32;
            k.patch_job(&job.name, json!({"spec": {"tfReplicaSpecs": {"Worker": {"replicas": job.workers}}}}))?;
            Ok("scale")
        }
        2 => {
            let workers: Vec<&String> = pods.iter().filter(|p| p.contains("-worker-")).collect();
            if let Some(pod) = workers.get(choices.below(workers.len())) {
                unless_gone(k.set_pod(pod, PodState::failed(1)))?;
                job.finished |= job.restart == "Never";
            }
            Ok("fail a pod")
        }
        3 => {
            let chief = format!("{}-worker-0", job.name);
            if pods.contains(&chief) {
                unless_gone(k.set_pod(&chief, PodState::SUCCEEDED))?;
                job.finished = true;
            }
            Ok("finish")
        }
        _ => {
            k.cp.kubectl_ok(["delete", "tfjob", &job.name, "-n", &k.ns, "--wait=false"])?;
            jobs.remove(i);
            Ok("delete")
        }
    }
}

/// A pod listed a moment ago may be gone (the operator recreates failed pods, deletes scaled-away
/// ones): writing its status then finds nothing, which is no error of the soak.
fn unless_gone(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if format!("{e:#}").contains("NotFound") => Ok(()),
        r => r,
    }
}

fn sample_rss(op: &Operator, started: Instant, report: &mut SoakReport) -> Result<()> {
    report.rss.push((started.elapsed().as_secs_f64(), op.rss_mib()?));
    Ok(())
}

/// The memory at the end against the largest sample of the first third (the caches warmed up).
fn check_flat(rss: &[(f64, f64)], options: &SoakOptions) -> Result<()> {
    let third = options.duration.as_secs_f64() / 3.0;
    let warm = rss.iter().filter(|(t, _)| *t <= third.max(1.0)).map(|(_, m)| *m).fold(0.0, f64::max);
    let end = rss.last().map_or(0.0, |r| r.1);
    let (factor, extra) = RSS_SLACK;
    ensure!(end <= warm * factor + extra, "the operator's memory grew from {warm:.1} MiB (warmed up) to {end:.1} MiB: {rss:?}");
    Ok(())
}

/// Every job deleted, and then nothing of any of them left.
fn delete_all(k: &Cluster<'_>) -> Result<()> {
    k.cp.kubectl_ok(["delete", "tfjobs", "--all", "-n", &k.ns, "--wait=false"])?;
    eventually("no pod, Service or Secret of a job is left", Duration::from_secs(120), || {
        let left = k.cp.kubectl_ok(["get", "pods,services,secrets", "-n", &k.ns, "-l", LABEL_JOB_NAME, "-o", "name"])?;
        let jobs = k.cp.kubectl_ok(["get", "tfjobs", "-n", &k.ns, "-o", "name"])?;
        Ok((left.trim().is_empty() && jobs.trim().is_empty()).then_some(()))
    })
}

/// The operator's `/debug/caches` equals the API server's lists (within 20 s: the caches lag).
pub fn caches_match(k: &Cluster<'_>, op: &Operator) -> Result<()> {
    let mut last = (Value::Null, Value::Null);
    eventually("the operator's watch caches equal the API server's state", Duration::from_secs(20), || {
        let cached: Value = serde_json::from_str(&op.page("/debug/caches")?).context("/debug/caches")?;
        let owned = format!("{LABEL_OPERATOR_NAME}={OPERATOR_NAME}");
        let listed = json!({
            "TFJob": summary(&list(k, "tfjobs", "")?)?,
            "Pod": summary(&list(k, "pods", &owned)?)?,
            "Service": summary(&list(k, "services", &owned)?)?,
        });
        let same = cached == listed;
        last = (cached, listed);
        Ok(same.then_some(()))
    })
    .map_err(|e| anyhow!("{e:#}\ncached: {}\nlisted: {}", last.0, last.1))
}

fn list(k: &Cluster<'_>, kind: &str, selector: &str) -> Result<Vec<Value>> {
    let mut args = vec!["get", kind, "-n", &k.ns, "-o", "json"];
    if !selector.is_empty() {
        args.extend(["-l", selector]);
    }
    let list: Value = serde_json::from_str(&k.cp.kubectl_ok(args)?)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The operator's summary of a cache ([`cache_summary`]: the count, and a SHA-256 of the sorted
/// lines `<namespace>/<name> <resourceVersion>\n`), of the API server's objects.
pub fn summary(objects: &[Value]) -> Result<Value> {
    let metas: Vec<ObjectMeta> = objects.iter().map(|o| serde_json::from_value(o["metadata"].clone())).collect::<Result<_, _>>().context("object metadata")?;
    Ok(cache_summary(metas.iter()))
}

/// The `q` quantile of a Prometheus histogram in an exposition, interpolated within its bucket
/// (as PromQL's `histogram_quantile`); `None` without observations.
pub fn histogram_quantile(exposition: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, value) = rest.split_once("\"}")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, value.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = count - below;
            return Some(if inside > 0.0 { lower + (le - lower) * (rank - below) / inside } else { le });
        }
        (lower, below) = (le, count);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let text = "x_bucket{le=\"0.1\"} 50\nx_bucket{le=\"0.2\"} 90\nx_bucket{le=\"+Inf\"} 100\nx_count 100\n";
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(histogram_quantile(text, "x", 0.5), 0.1));
        assert!(close(histogram_quantile(text, "x", 0.25), 0.05));
        assert!(close(histogram_quantile(text, "x", 0.7), 0.15));
        // Beyond the last finite bucket: its bound, as PromQL answers.
        assert!(close(histogram_quantile(text, "x", 0.99), 0.2));
        assert_eq!(histogram_quantile("x_bucket{le=\"+Inf\"} 0\n", "x", 0.5), None);
    }

    #[test]
    fn summaries_of_listed_objects_are_the_operators() {
        let a = json!({"metadata": {"namespace": "n", "name": "a", "resourceVersion": "1"}});
        let b = json!({"metadata": {"namespace": "n", "name": "b", "resourceVersion": "2"}});
        let metas = [a["metadata"].clone(), b["metadata"].clone()].map(|m| serde_json::from_value::<ObjectMeta>(m).unwrap());
        assert_eq!(summary(&[b, a]).unwrap(), cache_summary(metas.iter()));
    }

    #[test]
    fn memory_that_grows_past_the_slack_is_not_flat() {
        let options = SoakOptions { duration: Duration::from_secs(30), jobs: 4, sample_every: Duration::from_secs(5), seed: 1 };
        assert!(check_flat(&[(0.0, 20.0), (5.0, 30.0), (30.0, 40.0)], &options).is_ok());
        assert!(check_flat(&[(0.0, 20.0), (5.0, 30.0), (30.0, 60.0)], &options).is_err());
    }
}

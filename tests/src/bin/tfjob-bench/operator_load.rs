//! `--only operator-load`: the operator against a real API server (a test control plane of its
//! own, `tests/controlplane`), beside what the same API server does for a bare client.
//!
//! - **Creation rate.** A bare client (the same kube client, no controller logic, as many
//!   objects in flight as the operator has reconciles: `TFJOB_CONCURRENCY`, 8) creates exactly
//!   the objects the operator writes for `jobs` TFJobs of 5 replicas (per job its Secret with the
//!   token and the job's CA, a Service and the pods, from the operator's own planner, owner
//!   references left out), then only the pods and Services, then each TFJob and its objects
//!   owned by it (what the API server and the garbage collector do for the operator's jobs,
//!   without the controller: its watches, Events and status writes). Then the operator, running,
//!   gets the same TFJobs created as fast as the client can: the time from the first create to
//!   the last pod seen on a watch (and, apart, to the last of its pods' `SuccessfulCreatePod`
//!   Events, which the operator writes after the pods), and its API requests per job from the
//!   audit log; and, for each, the CPU seconds of every process (the control plane's, the
//!   operator's, the bench's) per pod. Three rounds alternate the four (one with `--quick`);
//!   the rates are their medians.
//! - **Request prices.** What one request of each kind the operator makes costs the API server
//!   and etcd ([`super::request_prices`]), and from them and the audit log's count the bound:
//!   the highest operator / bare rate those requests allow while the API server's CPU is the limit.
//! - **Memory.** The operator's RSS with 1,000 and 10,000 finished TFJobs (created, their status
//!   set to Succeeded, before the operator starts: what its caches hold on a cluster that ran
//!   jobs for months), against the RSS of the same operator watching an empty namespace.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tfjob_api::api::TFJob;
use tfjob_tests::controlplane::{ControlPlane, cpu_secs, process_name};
use tfjob_tests::node_agent::admin_client;
use tfjob_tests::operator::{Operator, operator_account, requests_by_kind as requests};

use super::{Options, Report, controller_pass};

/// Replicas per job (1 ps + 4 workers).
const REPLICAS: usize = 5;
/// Objects in flight at once: the operator's default `TFJOB_CONCURRENCY`.
pub const CONCURRENCY: usize = 8;

pub fn operator_load(opts: &Options, report: &mut Report) -> Result<()> {
    let jobs = if opts.quick { 10 } else { 100 };
    let finished: &[usize] = if opts.quick { &[100, 300] } else { &[1_000, 10_000] };
    // Kept afterwards: the operators' logs are in its operator-logs/, the audit log in logs/.
    let dir = opts.out.join("controlplane");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    println!("          (operator-load: starting a control plane of its own in {})", dir.display());
    let cp = ControlPlane::start_with(tfjob_tests::controlplane::Options { dir: Some(dir), ..Default::default() })?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let client = rt.block_on(admin_client(cp.kubeconfig_path()))?;
    creation(&cp, &rt, &client, opts, jobs, report)?;
    memory(&cp, &rt, &client, finished, report)
}

// ---------------------------------------------------------------- creation rate

/// The objects the operator writes for one job, in its order, and the job.
pub struct JobObjects {
    pub job: TFJob,
    pub service: Service,
    /// The job's Secret: the token and the CA.
    pub token: Secret,
    pub pods: Vec<Pod>,
}

impl JobObjects {
    /// Every object owned by the job that `owner` refers to.
    fn owned_by(&mut self, owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference) {
        let metas = [&mut self.service.metadata, &mut self.token.metadata].into_iter().chain(self.pods.iter_mut().map(|pod| &mut pod.metadata));
        for meta in metas {
            meta.owner_references = Some(vec![owner.clone()]);
        }
    }
}

/// Seconds of one round of each: the bare client with every object, the bare client with pods
/// and Services only, the bare client with each TFJob and its objects owned by it, the operator.
#[derive(Debug, Default, serde::Serialize)]
struct Round {
    bare_secs: f64,
    bare_pods_secs: f64,
    /// The bare client creating each TFJob and then its objects, owned by it.
    bare_owned_secs: f64,
    operator_secs: f64,
    /// From the first create to the last of the operator's `SuccessfulCreatePod` Events seen
    /// (they are written by a task of their own, after the pods).
    operator_events_secs: f64,
    /// CPU seconds of each process over each timed window (the same four).
    bare_cpu: BTreeMap<String, f64>,
    bare_pods_cpu: BTreeMap<String, f64>,
    bare_owned_cpu: BTreeMap<String, f64>,
    operator_cpu: BTreeMap<String, f64>,
}

/// The CPU seconds that the processes sharing the machine's cores use over a window: the
/// control plane's components, the operator and this bench (the client that creates).
pub struct CpuMeter {
    processes: Vec<(String, u32)>,
}

impl CpuMeter {
    fn new(cp: &ControlPlane, operator: u32) -> CpuMeter {
        let mut processes: Vec<(String, u32)> = cp.pids().iter().map(|&p| (process_name(p), p)).collect();
        processes.push(("operator".into(), operator));
        processes.push(("bench".into(), std::process::id()));
        CpuMeter { processes }
    }

    fn read(&self) -> Vec<f64> {
        self.processes.iter().map(|(_, pid)| cpu_secs(*pid).unwrap_or(0.0)).collect()
    }

    /// Each process's CPU seconds since `before` (a [`CpuMeter::read`]).
    fn since(&self, before: &[f64]) -> BTreeMap<String, f64> {
        self.processes.iter().zip(self.read().into_iter().zip(before)).map(|((name, _), (now, then))| (name.clone(), now - then)).collect()
    }

    /// `f` timed: its result, its seconds, the CPU seconds each process used meanwhile.
    pub fn timed<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<(T, f64, BTreeMap<String, f64>)> {
        let (before, t) = (self.read(), Instant::now());
        let out = f()?;
        Ok((out, t.elapsed().as_secs_f64(), self.since(&before)))
    }
}

/// `cpu` as one line: each process's CPU milliseconds per pod, and the cores they kept busy.
fn cpu_line(cpu: &BTreeMap<String, f64>, pods: usize, secs: f64) -> String {
    let each: Vec<String> = cpu.iter().map(|(name, s)| format!("{name} {:.1}", s * 1e3 / pods as f64)).collect();
    format!("{} ms/pod; {:.2} cores busy", each.join(", "), cpu.values().sum::<f64>() / secs)
}

fn creation(cp: &ControlPlane, rt: &tokio::runtime::Runtime, client: &Client, opts: &Options, jobs: usize, report: &mut Report) -> Result<()> {
    let operator = OperatorUnderLoad::start(cp, rt, client)?;
    // Rounds alternate the three, each on fresh names, so that a slower minute of the machine
    // falls on all of them alike; the figures are the rounds' medians.
    let rounds = if opts.quick { 1 } else { 3 };
    let (mut all_rounds, mut writes, mut pod_writes, mut requests) = (vec![], 0, 0, BTreeMap::new());
    for r in 0..rounds {
        let names: Vec<String> = (0..jobs).map(|i| format!("load-{r}-{i}")).collect();
        let objects = |ns: &str| names.iter().map(|n| job_objects(ns, n)).collect::<Result<Vec<_>>>();
        let mut round = Round::default();
        let ns = cp.create_namespace(&format!("bare-{r}"))?;
        let all = objects(&ns)?;
        (writes, round.bare_secs, round.bare_cpu) = operator.cpu.timed(|| rt.block_on(create_all(client, &ns, all, Writes::All)))?;
        let ns = cp.create_namespace(&format!("bare-pods-{r}"))?;
        let all = objects(&ns)?;
        (pod_writes, round.bare_pods_secs, round.bare_pods_cpu) = operator.cpu.timed(|| rt.block_on(create_all(client, &ns, all, Writes::PodsAndServices)))?;
        let ns = cp.create_namespace(&format!("bare-owned-{r}"))?;
        let all = objects(&ns)?;
        (_, round.bare_owned_secs, round.bare_owned_cpu) = operator.cpu.timed(|| rt.block_on(create_all(client, &ns, all, Writes::OwnedByJob)))?;
        let (secs, events_secs, used) = operator.create(&names, &mut round.operator_cpu)?;
        round.operator_secs = secs;
        round.operator_events_secs = events_secs;
        println!(
            "          round {}: bare {:.1} s, bare pods + Services {:.1} s, bare TFJob + owned objects {:.1} s, operator {:.1} s (its pod Events all written at {:.1} s)",
            r + 1,
            round.bare_secs,
            round.bare_pods_secs,
            round.bare_owned_secs,
            secs,
            events_secs
        );
        let pods = jobs * REPLICAS;
        println!("            CPU, bare: {}", cpu_line(&round.bare_cpu, pods, round.bare_secs));
        println!("            CPU, bare pods + Services: {}", cpu_line(&round.bare_pods_cpu, pods, round.bare_pods_secs));
        println!("            CPU, bare TFJob + owned objects: {}", cpu_line(&round.bare_owned_cpu, pods, round.bare_owned_secs));
        println!("            CPU, operator to its last pod: {}", cpu_line(&round.operator_cpu, pods, secs));
        if r == 0 {
            requests = used;
        }
        all_rounds.push(round);
    }
    let pods = (jobs * REPLICAS) as f64;
    let rate = |secs: fn(&Round) -> f64| super::median(all_rounds.iter().map(|r| pods / secs(r)).collect());
    let (ours, bare, bare_pods) = (rate(|r| r.operator_secs), rate(|r| r.bare_secs), rate(|r| r.bare_pods_secs));
    let bare_owned = rate(|r| r.bare_owned_secs);
    let per_job = requests.values().sum::<usize>() as f64 / jobs as f64;
    let what = format!("{jobs} TFJobs x {REPLICAS} pods");
    report.row(
        "operator-load",
        &format!("{what}: pods/s, operator"),
        ours,
        "pods/s",
        Some(("bare client, same objects", bare)),
        None,
        ">= 0.8 x bare",
        Some(ours >= 0.8 * bare),
    );
    report.row("operator-load", &format!("{what}: pods/s, operator"), ours, "pods/s", Some(("bare client, pods + Services", bare_pods)), None, "", None);
    report.row("operator-load", &format!("{what}: pods/s, operator"), ours, "pods/s", Some(("bare, TFJob + owned objects", bare_owned)), None, "", None);
    let with_events = rate(|r| r.operator_events_secs);
    report.row(
        "operator-load",
        &format!("{what}: pods/s to their last Event"),
        with_events,
        "pods/s",
        Some(("bare client, same objects", bare)),
        None,
        "",
        None,
    );
    report.row(
        "operator-load",
        &format!("{what}: API requests per job, operator"),
        per_job,
        "req",
        Some(("bare client's writes", (writes / jobs) as f64)),
        None,
        "",
        None,
    );
    println!("          operator's requests for {jobs} jobs (the Lease aside): {requests:?}");
    let windows = [
        ("bare", per_pod_cpu(&all_rounds, pods, |r| &r.bare_cpu)),
        ("bare TFJob + owned objects", per_pod_cpu(&all_rounds, pods, |r| &r.bare_owned_cpu)),
        ("operator", per_pod_cpu(&all_rounds, pods, |r| &r.operator_cpu)),
    ];
    for (what, cpu) in windows {
        let each: Vec<String> = cpu.iter().map(|(name, ms)| format!("{name} {ms:.1}")).collect();
        println!("          CPU ms per pod, {what} (medians): {}", each.join(", "));
    }
    let price_details = prices_and_bound(&operator, (jobs, rounds), &requests, ours / bare_pods, report)?;
    report.details.insert(
        "operator_load_creation".into(),
        json!({ "jobs": jobs, "replicas": REPLICAS, "rounds": all_rounds, "bare_writes": writes, "bare_pod_writes": pod_writes, "operator_requests": requests, "request_prices": price_details }),
    );
    Ok(())
}

/// Prices each kind of request (twice the jobs' count of each, one pass a round) and prints
/// the bound they set beside `measured` (operator / bare pods + Services). Returns the prices
/// for the report's details.
fn prices_and_bound(
    op: &OperatorUnderLoad,
    (jobs, rounds): (usize, usize),
    requests: &BTreeMap<String, usize>,
    measured: f64,
    report: &mut Report,
) -> Result<serde_json::Value> {
    let (prices, details) = super::request_prices::print_request_prices(op.cp, op.rt, op.client, &op.cpu, 2 * jobs, rounds)?;
    let Some(bound) = priced_bound(&prices, requests, jobs) else {
        return Ok(details);
    };
    println!(
        "          the bound the API server's CPU sets (its and etcd's ms per job at the prices above): bare pods + Services {:.1}, the operator's requests {:.1} (the TFJob create included): at most {:.3} of the bare client's rate; measured {:.3}, {:.2} of the bound",
        bound.bare_ms,
        bound.operator_ms,
        bound.ratio(),
        measured,
        measured / bound.ratio()
    );
    let what = format!("{jobs} TFJobs x {REPLICAS} pods: operator / bare pods + Services");
    report.row("operator-load", &what, measured, "x", Some(("bound from request prices", bound.ratio())), None, "", None);
    Ok(details)
}

/// What the API server and etcd spend per job, at the measured prices, for the bare client's
/// writes (a Service and the pods) and for the operator's requests (as the audit log counted
/// them, and the TFJob create that starts the job).
struct PricedBound {
    bare_ms: f64,
    operator_ms: f64,
}

impl PricedBound {
    /// The highest operator / bare rate these prices allow when the two share the API server's
    /// CPU: the inverse ratio of their costs per job.
    fn ratio(&self) -> f64 {
        self.bare_ms / self.operator_ms
    }
}

/// `None` (with a note) when a request of the operator's has no price.
fn priced_bound(prices: &BTreeMap<&str, f64>, requests: &BTreeMap<String, usize>, jobs: usize) -> Option<PricedBound> {
    use super::request_prices as p;
    let price = |what: &str| prices.get(what).copied();
    let bare_ms = price(p::SERVICES_CREATED)? + REPLICAS as f64 * price(p::PODS_UNWATCHED)?;
    let mut operator_ms = price(p::TFJOBS_CREATED)?;
    for (kind, n) in requests {
        let Some((_, what)) = p::OPERATOR_REQUESTS.iter().find(|(k, _)| k == kind) else {
            println!("          (no price for the operator's {kind:?}: no bound)");
            return None;
        };
        operator_ms += price(what)? * *n as f64 / jobs as f64;
    }
    Some(PricedBound { bare_ms, operator_ms })
}

/// Each process's CPU milliseconds per pod (`pods` in each round) in the window `pick` of every
/// round: their medians.
fn per_pod_cpu(rounds: &[Round], pods: f64, pick: fn(&Round) -> &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let Some(first) = rounds.first() else { return BTreeMap::new() };
    pick(first)
        .keys()
        .map(|name| (name.clone(), super::median(rounds.iter().map(|r| pick(r).get(name).copied().unwrap_or(0.0) * 1e3 / pods).collect())))
        .collect()
}

/// A TFJob of [`REPLICAS`] replicas in `ns`, as the bench's planning section parses it.
fn tfjob(ns: &str, name: &str) -> Result<TFJob> {
    let mut job = super::parse_job(name, REPLICAS)?;
    job.metadata.namespace = Some(ns.to_string());
    Ok(job)
}

/// What the operator writes for job `name`, from its own planner; no owner references (the job
/// does not exist: the garbage collector would delete them).
pub fn job_objects(ns: &str, name: &str) -> Result<JobObjects> {
    use tfjob_api::{api, plan};
    let job = tfjob(ns, name)?;
    let mut defaulted = job.clone();
    api::apply_defaults(&mut defaulted.spec);
    let ca = tfjob_api::pki::JobCa::generate(name).and_then(|ca| ca.pem()).map_err(|e| anyhow!("{e}"))?;
    let mut pods = vec![];
    controller_pass(&job, &[], &tfjob_api::plan::PlanOptions::default(), |p| pods.push(p.into_pod()));
    for pod in &mut pods {
        pod.metadata.owner_references = None;
        pod.metadata.namespace = Some(ns.to_string());
    }
    let mut service = plan::build_service(&defaulted);
    service.metadata.owner_references = None;
    let tls = plan::replicas_use_tls(&defaulted, plan::AddressLayout::Ours);
    let mut token = plan::build_secret(&defaulted, "a-token-of-the-usual-length-0123456789", Some(&ca).filter(|_| tls));
    token.metadata.owner_references = None;
    let mut job = job;
    job.metadata.uid = None;
    Ok(JobObjects { job, service, token, pods })
}

/// What a bare client writes of each job's objects.
#[derive(Clone, Copy, PartialEq)]
enum Writes {
    /// Everything the operator writes, owned by nothing.
    All,
    /// Only the Service and the pods.
    PodsAndServices,
    /// The TFJob first (as the bench creates it for the operator), then everything the operator
    /// writes, owned by it as the operator's objects are (so the garbage collector tracks them).
    OwnedByJob,
}

/// Creates every job's objects, [`CONCURRENCY`] jobs at a time, each job's in order, as `what`
/// says. Returns the number of writes.
async fn create_all(client: &Client, ns: &str, all: Vec<JobObjects>, what: Writes) -> Result<usize> {
    let (pods, services, secrets) =
        (Api::<Pod>::namespaced(client.clone(), ns), Api::<Service>::namespaced(client.clone(), ns), Api::<Secret>::namespaced(client.clone(), ns));
    let jobs = Api::<TFJob>::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let with_secrets = what != Writes::PodsAndServices;
    let writes = stream::iter(all)
        .map(|mut job| {
            let (pods, services, secrets, jobs, pp) = (&pods, &services, &secrets, &jobs, &pp);
            async move {
                let mut n = 0;
                if what == Writes::OwnedByJob {
                    let created = jobs.create(pp, &job.job).await?;
                    job.owned_by(tfjob_api::plan::owner_reference(&created));
                    n += 1;
                }
                if with_secrets {
                    secrets.create(pp, &job.token).await?;
                    n += 1;
                }
                services.create(pp, &job.service).await?;
                n += 1;
                for pod in &job.pods {
                    pods.create(pp, pod).await?;
                    n += 1;
                }
                Ok::<usize, kube::Error>(n)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_fold(0, |sum, n| async move { Ok(sum + n) })
        .await?;
    Ok(writes)
}

/// The operator, running in a namespace of its own, ready for rounds of TFJobs.
struct OperatorUnderLoad<'a> {
    cp: &'a ControlPlane,
    rt: &'a tokio::runtime::Runtime,
    client: &'a Client,
    ns: String,
    user: String,
    op: Operator,
    cpu: CpuMeter,
}

impl<'a> OperatorUnderLoad<'a> {
    /// A first job, not timed, waits out the operator's start (its first watches).
    fn start(cp: &'a ControlPlane, rt: &'a tokio::runtime::Runtime, client: &'a Client) -> Result<Self> {
        let ns = cp.create_namespace("load")?;
        let account = operator_account(cp, &ns)?;
        let op = Operator::start_ready(cp, &account, "load-operator")?;
        let user = format!("system:serviceaccount:{}:{}", account.namespace, account.service_account);
        let cpu = CpuMeter::new(cp, op.pid());
        let me = OperatorUnderLoad { cp, rt, client, ns, user, op, cpu };
        me.timed(vec![tfjob(&me.ns, "warm-up")?])?;
        Ok(me)
    }

    fn timed(&self, jobs: Vec<TFJob>) -> Result<f64> {
        self.rt.block_on(create_and_wait(self.client, &self.ns, jobs)).map_err(|e| anyhow!("{e:#}\n{}", self.op.log_tail(30)))
    }

    /// `names` created as TFJobs: seconds from the first create to the last of their pods seen
    /// on a watch, and to the last `SuccessfulCreatePod` Event naming their pods listed; the
    /// operator's requests by `verb resource[/subresource]` (the Lease aside). `cpu` gets each
    /// process's CPU seconds up to the last pod.
    fn create(&self, names: &[String], cpu: &mut BTreeMap<String, f64>) -> Result<(f64, f64, BTreeMap<String, usize>)> {
        // Settled: the status writes and events of what came before.
        std::thread::sleep(Duration::from_secs(2));
        let before = requests(self.cp, &self.user)?;
        let jobs = names.iter().map(|n| tfjob(&self.ns, n)).collect::<Result<Vec<_>>>()?;
        let t = Instant::now();
        let secs;
        (secs, _, *cpu) = self.cpu.timed(|| self.timed(jobs))?;
        let since_pods = t.elapsed().as_secs_f64() - secs;
        self.rt.block_on(wait_pod_events(self.client, &self.ns, names))?;
        let events_secs = t.elapsed().as_secs_f64() - since_pods;
        // Settled: the status writes and events that follow the pods.
        std::thread::sleep(Duration::from_secs(5));
        let after = requests(self.cp, &self.user)?;
        let used = after.into_iter().map(|(k, n)| (k.clone(), n - before.get(&k).copied().unwrap_or(0))).filter(|(_, n)| *n > 0).collect();
        Ok((secs, events_secs, used))
    }
}

/// Waits (listing every 200 ms, at most a minute) until every pod of the jobs `names` is named
/// by a `SuccessfulCreatePod` Event.
async fn wait_pod_events(client: &Client, ns: &str, names: &[String]) -> Result<()> {
    use k8s_openapi::api::events::v1::Event;
    let names: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let events = Api::<Event>::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = events.list(&ListParams::default()).await?;
        let n: usize = listed
            .items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("SuccessfulCreatePod") && e.regarding.as_ref().and_then(|r| r.name.as_deref()).is_some_and(|j| names.contains(j))
            })
            .map(|e| tfjob_tests::operator::pods_in_note(e.note.as_deref().unwrap_or_default()))
            .sum();
        if n >= names.len() * REPLICAS {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{n} of {} pods named by SuccessfulCreatePod events after a minute", names.len() * REPLICAS);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `jobs` ([`CONCURRENCY`] at a time) and waits until all their pods were added: the
/// seconds from the first create to the last pod.
async fn create_and_wait(client: &Client, ns: &str, jobs: Vec<TFJob>) -> Result<f64> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let version = pods.list_metadata(&ListParams::default()).await?.metadata.resource_version.unwrap_or_default();
    let seen = tokio::spawn(count_added(pods, version, jobs.len() * REPLICAS));
    let t = Instant::now();
    let api = Api::<TFJob>::namespaced(client.clone(), ns);
    stream::iter(jobs)
        .map(|mut job| {
            let api = &api;
            job.metadata.uid = None;
            async move { api.create(&PostParams::default(), &job).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    tokio::time::timeout(Duration::from_secs(600), seen).await.context("the operator's pods did not all appear within 10 minutes")???;
    Ok(t.elapsed().as_secs_f64())
}

/// Waits on a watch from `version` until `expected` pods were added.
async fn count_added(pods: Api<Pod>, mut version: String, expected: usize) -> Result<()> {
    let mut added = 0;
    while added < expected {
        let mut events = pods.watch(&WatchParams::default().timeout(290), &version).await?.boxed();
        while let Some(event) = events.try_next().await? {
            match event {
                WatchEvent::Added(p) => {
                    added += 1;
                    version = p.meta().resource_version.clone().unwrap_or(version);
                }
                WatchEvent::Modified(p) | WatchEvent::Deleted(p) => version = p.meta().resource_version.clone().unwrap_or(version),
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                WatchEvent::Error(e) => return Err(anyhow!("watching pods: {e:?}")),
            }
            if added >= expected {
                break;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- memory

fn memory(cp: &ControlPlane, rt: &tokio::runtime::Runtime, client: &Client, counts: &[usize], report: &mut Report) -> Result<()> {
    let ns = cp.create_namespace("finished")?;
    let account = operator_account(cp, &ns)?;
    let empty = settled_rss(cp, &account, 0)?;
    let mut created = 0;
    let mut samples = vec![json!({ "jobs": 0, "rss_mib": empty })];
    for &n in counts {
        let t = Instant::now();
        rt.block_on(create_finished(client, &ns, created..n))?;
        println!("          {} finished TFJobs created in {:.1} s", n - created, t.elapsed().as_secs_f64());
        created = n;
        let rss = settled_rss(cp, &account, n)?;
        let goal = (n == 10_000).then_some(rss < 100.0);
        report.row(
            "operator-load",
            &format!("operator RSS, {n} finished TFJobs"),
            rss,
            "MiB",
            Some(("no TFJob", empty)),
            None,
            if n == 10_000 { "< 100 MiB" } else { "" },
            goal,
        );
        samples.push(json!({ "jobs": n, "rss_mib": rss }));
    }
    report.details.insert("operator_load_memory".into(), json!(samples));
    Ok(())
}

/// Creates TFJobs `load-<i>` for `range` and sets each one's status to Succeeded.
async fn create_finished(client: &Client, ns: &str, range: std::ops::Range<usize>) -> Result<()> {
    let api = Api::<TFJob>::namespaced(client.clone(), ns);
    let now = jiff::Timestamp::now().to_string();
    let status = json!({ "status": {
        "conditions": [
            { "type": "Created", "status": "True", "reason": "TFJobCreated", "message": "created", "lastUpdateTime": now, "lastTransitionTime": now },
            { "type": "Succeeded", "status": "True", "reason": "TFJobSucceeded", "message": "succeeded", "lastUpdateTime": now, "lastTransitionTime": now },
        ],
        "replicaStatuses": { "PS": { "succeeded": 1 }, "Worker": { "succeeded": 4 } },
        "startTime": now,
        "completionTime": now,
    }});
    stream::iter(range)
        .map(|i| {
            let (api, status) = (&api, &status);
            async move {
                let name = format!("load-{i}");
                let mut job = tfjob(ns, &name)?;
                job.metadata.uid = None;
                api.create(&PostParams::default(), &job).await?;
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await?;
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Starts an operator on the namespace of `account`, waits until it has reconciled the `jobs`
/// TFJobs there and gone quiet, and returns its largest RSS over 5 s; stops it.
fn settled_rss(cp: &ControlPlane, account: &tfjob_tests::operator::OperatorSetup, jobs: usize) -> Result<f64> {
    let mut op = Operator::start_ready(cp, account, &format!("memory-{jobs}"))?;
    let reconciles = |op: &Operator| op.metric("tfjob_reconcile_duration_seconds_count").unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = reconciles(&op);
        if now >= jobs as f64 && now == last {
            break;
        }
        ensure!(Instant::now() < deadline, "{now} reconciles of {jobs} jobs after 10 minutes:\n{}", op.log_tail(30));
        last = now;
    }
    let mut rss: f64 = 0.0;
    for _ in 0..5 {
        rss = rss.max(op.rss_mib()?);
        std::thread::sleep(Duration::from_secs(1));
    }
    println!("          operator with {jobs} finished TFJobs: {last} reconciles, RSS {rss:.1} MiB");
    op.terminate()?;
    Ok(rss)
}

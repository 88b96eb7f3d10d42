//! The progress reader: every `interval`, reads ps 0's metrics page of each running job (at
//! most `concurrency` reads at once across all jobs, each bounded by `timeout`), writes what it
//! says into the job's `status.trainingProgress`, and runs the built-in throughput autoscaler
//! (`elasticPolicy.autoscale: Throughput`) on it.
//!
//! It needs no rights inside the pods: the page is ps 0's `--metrics_port`, reached at the pod's
//! IP as Prometheus would reach it. A read that fails leaves the last progress in place, with
//! its time. The status fields it writes are its own (server-side apply under
//! [`PROGRESS_MANAGER`]); the reconcile's status writes leave them out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tfjob_api::api::{self, ReplicaType, TFJob};
use tfjob_api::autoscale::{self, Autoscale, AutoscalerState, Decision, Look};
use tfjob_api::plan;
use tfjob_api::progress::{ProgressSample, ProgressTracker, TrainingProgress};
use tfjob_api::status::{self, EventKind};

use crate::controller::Context;
use crate::controller::events;

/// Field manager of the progress reader's status writes.
pub const PROGRESS_MANAGER: &str = "tfjob-operator-progress";

/// A status write that only moves `lastUpdatedTime` waits this long.
const QUIET_WRITE: Duration = Duration::from_secs(60);

/// How often and how much the reader reads.
#[derive(Clone, Copy, Debug)]
pub struct ProgressSettings {
    /// Between two reads of a job.
    pub interval: Duration,
    /// Reads at once, across all jobs.
    pub concurrency: usize,
    /// Of one read.
    pub timeout: Duration,
}

/// Why a page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No answer, or not HTTP 200.
    #[error("{url}: {reason}")]
    Http {
        /// The page.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// An answer without any of the job's figures (not ps 0 of a `tfjob-runtime` job).
    #[error("{0}: no training figures on the page")]
    Empty(String),
}

/// The HTTP client of the reads (plain HTTP/1, connections kept between reads).
pub type PageClient = Client<HttpConnector, Empty<Bytes>>;

/// A client for [`read_sample`].
pub fn page_client() -> PageClient {
    Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).build_http()
}

/// Reads one metrics page, within `timeout`.
pub async fn read_sample(client: &PageClient, url: &str, timeout: Duration) -> Result<ProgressSample, ReadError> {
    let http = |reason: String| ReadError::Http { url: url.to_string(), reason };
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| http(e.to_string()))?;
    let read = async {
        let response = client.get(uri).await.map_err(|e| http(e.to_string()))?;
        if !response.status().is_success() {
            return Err(http(format!("HTTP {}", response.status())));
        }
        let body = response.into_body().collect().await.map_err(|e| http(e.to_string()))?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    let text = tokio::time::timeout(timeout, read).await.map_err(|_| http(format!("no answer within {timeout:?}")))??;
    let sample = ProgressSample::parse(&text);
    if sample.is_empty() { Err(ReadError::Empty(url.to_string())) } else { Ok(sample) }
}

/// What the reader remembers of a job between reads.
#[derive(Default)]
struct JobProgress {
    tracker: ProgressTracker,
    written: Option<TrainingProgress>,
    written_at: Option<std::time::Instant>,
}

/// A job to read now: its key, the page, and the job.
struct ReadTarget {
    uid: String,
    url: String,
    job: Arc<TFJob>,
}

/// Reads every running job's progress until the task is dropped.
pub async fn run(ctx: Arc<Context>, jobs: Store<TFJob>, settings: ProgressSettings) {
    let client = page_client();
    let mut known: HashMap<String, JobProgress> = HashMap::new();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let targets: Vec<ReadTarget> = jobs.state().into_iter().filter_map(|job| read_target(&ctx, job)).collect();
        known.retain(|uid, _| targets.iter().any(|t| &t.uid == uid));
        let client = &client;
        let reads = futures::stream::iter(targets).map(|t| async move {
            let read = read_sample(client, &t.url, settings.timeout).await;
            (t, read)
        });
        let mut reads = reads.buffer_unordered(settings.concurrency.max(1));
        while let Some((target, read)) = reads.next().await {
            let entry = known.entry(target.uid.clone()).or_default();
            match read {
                Ok(sample) => entry.tracker.record(now_secs(&ctx), sample),
                Err(e) => {
                    tracing::debug!(job = %target.job.name_any(), error = %e, "progress not read; the last one stays");
                    continue;
                }
            }
            if let Err(e) = after_read(&ctx, &target.job, entry).await {
                tracing::warn!(job = %target.job.name_any(), error = %e, "progress: cannot write the status or scale");
            }
        }
    }
}

fn now_secs(ctx: &Context) -> f64 {
    (ctx.now)().as_millisecond() as f64 / 1000.0
}

/// The page of a job that trains now: ps 0 running with an IP, serving metrics.
fn read_target(ctx: &Context, job: Arc<TFJob>) -> Option<ReadTarget> {
    let st = job.status.as_ref()?;
    if !ctx.claim.takes(job.spec.run_policy.managed_by.as_deref()) || job.spec.run_policy.suspend || status::final_condition(st).is_some() {
        return None;
    }
    let (pod_name, port) = plan::progress_source(&job.name_any(), &job.spec)?;
    let ns = job.namespace()?;
    let pod: Arc<Pod> = ctx.caches.pods.get(&ObjectRef::new(&pod_name).within(&ns))?;
    let pod_status = pod.status.as_ref()?;
    let ip = pod_status.pod_ip.as_deref().filter(|_| pod_status.phase.as_deref() == Some("Running"))?;
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
    Some(ReadTarget { uid: job.meta().uid.clone()?, url: format!("http://{host}:{port}/metrics"), job })
}

/// After a good read: the autoscaler's decision (a scale through the scale subresource and an
/// Event), then the status when it changed.
async fn after_read(ctx: &Context, job: &TFJob, known: &mut JobProgress) -> Result<(), kube::Error> {
    let progress = known.tracker.progress();
    let autoscaler = autoscale(ctx, job, &known.tracker).await?;
    let old = job.status.as_ref().and_then(|s| s.autoscaler.as_ref());
    let only_time_moved = progress.as_ref().map(|p| TrainingProgress { last_updated_time: None, ..p.clone() })
        == known.written.as_ref().map(|p| TrainingProgress { last_updated_time: None, ..p.clone() });
    let quiet = known.written_at.is_some_and(|t| t.elapsed() < QUIET_WRITE);
    if only_time_moved && quiet && autoscaler.as_ref() == old {
        return Ok(());
    }
    let mut status = json!({ "trainingProgress": progress });
    if let Some(a) = &autoscaler {
        status["autoscaler"] = json!(a);
    }
    let patch = json!({ "apiVersion": format!("{}/{}", api::GROUP, api::VERSION), "kind": api::KIND, "status": status });
    let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    jobs.patch_status(&job.name_any(), &PatchParams::apply(PROGRESS_MANAGER).force(), &Patch::Apply(&patch)).await?;
    known.written = progress;
    known.written_at = Some(std::time::Instant::now());
    Ok(())
}

/// Runs the throughput autoscaler of a job that has one: scales its workers when it says so
/// (as `kubectl scale` does) and records its decisions as Events. Its new state.
async fn autoscale(ctx: &Context, job: &TFJob, tracker: &ProgressTracker) -> Result<Option<AutoscalerState>, kube::Error> {
    let Some(policy) = job.spec.elastic_policy.as_ref().filter(|p| p.autoscale == Some(Autoscale::Throughput)) else {
        return Ok(None);
    };
    let Some(replicas) = api::replica_specs(&job.spec).get(&ReplicaType::Worker).map(|rs| rs.replicas) else {
        return Ok(None);
    };
    let readings: Vec<_> = tracker.readings().cloned().collect();
    let remaining = tracker.latest().and_then(|r| tracker.remaining(&r.sample)).and_then(|r| r.seconds);
    let look = Look { bounds: autoscale::Bounds::of(policy, replicas), replicas, readings: &readings, now: now_secs(ctx), remaining };
    let state = job.status.as_ref().and_then(|s| s.autoscaler.as_ref());
    let (next, decision) = autoscale::decide(state, look);
    match decision {
        Decision::Hold => {}
        Decision::Settle { message } => events::job_event(ctx, job, EventKind::Normal, "AutoscalerSettled", &message),
        Decision::Scale { to, message, .. } => {
            let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
            jobs.patch_scale(&job.name_any(), &PatchParams::default(), &Patch::Merge(&json!({ "spec": { "replicas": to } }))).await?;
            events::job_event(ctx, job, EventKind::Normal, "Autoscaled", &message);
        }
    }
    Ok(Some(next))
}

//! The operator's metrics (`prometheus-client`, OpenMetrics text) and its HTTP endpoints
//! (`/metrics`, `/healthz`, `/readyz`, on axum).
//!
//! Job counters carry the names and labels of Kubeflow's training-operator
//! (`training_operator_jobs_{created,deleted,successful,failed,restarted}_total` with
//! `job_namespace` and `framework="tensorflow"`), so dashboards and alerts written for it work
//! unchanged; they count the same moments: a job seen for the first time (its `Created`
//! condition set), a job deleted by the operator (`ttlSecondsAfterFinished`), a job that
//! succeeded, failed, or started restarting. The operator's own figures keep their `tfjob_`
//! names: reconcile duration (histogram), reconciles under way, reconcile errors by category,
//! replicas recreated, and jobs by phase (read from the watch cache at each scrape).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use tfjob_api::api::{Claim, TFJob, TFJobStatus};
use tfjob_api::status;

/// The `framework` label of Kubeflow's job counters for TFJobs.
pub const FRAMEWORK: &str = "tensorflow";

/// Content type of the OpenMetrics text exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The phases of `tfjob_jobs` (a job's last true condition, [`status::job_phase`]).
const PHASES: [&str; 6] = [status::CREATED, status::RUNNING, status::RESTARTING, status::SUCCEEDED, status::SUSPENDED, status::FAILED];

/// Upper bounds (seconds) of the reconcile-duration histogram's buckets.
const RECONCILE_BUCKETS: [f64; 9] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Labels of Kubeflow's job counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// Namespace of the job.
    pub job_namespace: String,
    /// Always [`FRAMEWORK`].
    pub framework: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    category: String,
}

/// A moment in a job's life that Kubeflow's job counters count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEvent {
    /// The job was seen for the first time (`training_operator_jobs_created_total`).
    Created,
    /// The operator deleted the job (`training_operator_jobs_deleted_total`).
    Deleted,
    /// The job succeeded (`training_operator_jobs_successful_total`).
    Succeeded,
    /// The job failed (`training_operator_jobs_failed_total`).
    Failed,
    /// The job started restarting replicas (`training_operator_jobs_restarted_total`).
    Restarted,
}

/// The counted moments between a job's status before a reconcile and the status it wrote: a
/// condition that became true. Pure; a status that did not change counts nothing, so a
/// reconcile repeated from the same observation never counts twice.
pub fn job_events(old: &TFJobStatus, new: &TFJobStatus) -> Vec<JobEvent> {
    let became_true = |type_: &str| {
        let is_true = |s: &TFJobStatus| s.conditions.iter().any(|c| c.type_ == type_ && c.status == "True");
        is_true(new) && !is_true(old)
    };
    [
        (status::CREATED, JobEvent::Created),
        (status::SUCCEEDED, JobEvent::Succeeded),
        (status::FAILED, JobEvent::Failed),
        (status::RESTARTING, JobEvent::Restarted),
    ]
    .into_iter()
    .filter(|(type_, _)| became_true(type_))
    .map(|(_, event)| event)
    .collect()
}

/// The jobs of the watch cache that this operator takes, by phase, encoded at each scrape
/// (`tfjob_jobs{phase}`). Beside Kubeflow's training-operator the cache also holds its jobs.
#[derive(Debug, Default)]
struct JobsByPhase {
    store: Mutex<Option<(Store<TFJob>, Claim)>>,
}

impl Collector for JobsByPhase {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut counts: Vec<(&str, i64)> = PHASES.iter().map(|p| (*p, 0)).collect();
        if let Ok(store) = self.store.lock()
            && let Some((store, claim)) = store.as_ref()
        {
            let ours = store.state().into_iter().filter(|job| claim.takes(job.spec.run_policy.managed_by.as_deref()));
            for job in ours {
                let status = job.status.clone().unwrap_or_default();
                let phase = status::job_phase(&status);
                if let Some(entry) = counts.iter_mut().find(|(p, _)| *p == phase) {
                    entry.1 += 1;
                }
            }
        }
        let mut family = encoder.encode_descriptor("tfjob_jobs", "TFJobs by phase (the last true condition).", None, MetricType::Gauge)?;
        for (phase, n) in counts {
            ConstGauge::new(n).encode(family.encode_family(&[("phase", phase)])?)?;
        }
        Ok(())
    }
}

/// The watch caches of the jobs, and of the pods and Services they own.
type WatchCaches = (Store<TFJob>, Store<Pod>, Store<Service>);

/// The watch caches, for `/debug/caches`.
#[derive(Default)]
struct CacheStores {
    stores: Mutex<Option<WatchCaches>>,
}

impl std::fmt::Debug for CacheStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheStores")
    }
}

/// What a watch cache holds, to be compared with the API server's lists without showing any
/// object's name: `{"objects": <count>, "digest": <SHA-256, hex, of the objects' lines
/// "<namespace>/<name> <resourceVersion>\n", sorted>}`.
pub fn cache_summary<'a>(objects: impl Iterator<Item = &'a ObjectMeta>) -> serde_json::Value {
    let mut lines: Vec<String> = objects
        .map(|m| {
            format!(
                "{}/{} {}\n",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
                m.resource_version.as_deref().unwrap_or_default()
            )
        })
        .collect();
    lines.sort();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for line in &lines {
        ctx.update(line.as_bytes());
    }
    let digest: String = ctx.finish().as_ref().iter().map(|b| format!("{b:02x}")).collect();
    serde_json::json!({ "objects": lines.len(), "digest": digest })
}

fn store_summary<K: Resource + Clone + 'static>(store: &Store<K>) -> serde_json::Value
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    let state = store.state();
    cache_summary(state.iter().map(|o| o.meta()))
}

/// The operator's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    jobs: [Family<JobLabels, Counter>; 5],
    reconcile_duration: Histogram,
    reconciles_in_flight: Gauge,
    reconcile_errors: Family<ErrorLabels, Counter>,
    replicas_recreated: Counter,
    by_phase: Arc<JobsByPhase>,
    caches: CacheStores,
}

/// One reconcile under way, counted in `tfjob_reconciles_in_flight` until dropped.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let jobs: [Family<JobLabels, Counter>; 5] = Default::default();
        for (family, (name, help)) in jobs.iter().zip([
            ("jobs_created", "Counts number of jobs created"),
            ("jobs_deleted", "Counts number of jobs deleted"),
            ("jobs_successful", "Counts number of jobs successful"),
            ("jobs_failed", "Counts number of jobs failed"),
            ("jobs_restarted", "Counts number of jobs restarted"),
        ]) {
            // The library appends `_total` to counters.
            registry.register(format!("training_operator_{name}"), help, family.clone());
        }
        let reconcile_duration = Histogram::new(RECONCILE_BUCKETS);
        registry.register("tfjob_reconcile_duration_seconds", "Duration of reconciliations.", reconcile_duration.clone());
        let reconciles_in_flight = Gauge::default();
        registry.register(
            "tfjob_reconciles_in_flight",
            "Reconciles started and not finished (one that stays up waits on the API server).",
            reconciles_in_flight.clone(),
        );
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register("tfjob_reconcile_errors", "Reconciliation errors by category.", reconcile_errors.clone());
        let replicas_recreated = Counter::default();
        registry.register("tfjob_restarts", "Replicas recreated after a failure.", replicas_recreated.clone());
        let by_phase = Arc::new(JobsByPhase::default());
        registry.register_collector(Box::new(by_phase.clone()));
        Metrics { registry, jobs, reconcile_duration, reconciles_in_flight, reconcile_errors, replicas_recreated, by_phase, caches: CacheStores::default() }
    }
}

impl Metrics {
    /// Counts a moment of a job in `namespace` under Kubeflow's counter for it.
    pub fn job(&self, namespace: &str, event: JobEvent) {
        let family = &self.jobs[match event {
            JobEvent::Created => 0,
            JobEvent::Deleted => 1,
            JobEvent::Succeeded => 2,
            JobEvent::Failed => 3,
            JobEvent::Restarted => 4,
        }];
        family.get_or_create(&JobLabels { job_namespace: namespace.to_string(), framework: FRAMEWORK.to_string() }).inc();
    }

    /// Counts a reconcile under way until the returned guard is dropped (when the reconcile
    /// finishes, or is dropped at shutdown).
    pub fn reconcile_started(&self) -> InFlight {
        self.reconciles_in_flight.inc();
        InFlight(self.reconciles_in_flight.clone())
    }

    /// Records the duration of one reconcile.
    pub fn reconciled(&self, took: Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Counts a reconcile error (or a failed event publication) of a category.
    pub fn error(&self, category: &str) {
        self.reconcile_errors.get_or_create(&ErrorLabels { category: category.to_string() }).inc();
    }

    /// Counts a replica recreated after a failure.
    pub fn replica_recreated(&self) {
        self.replicas_recreated.inc();
    }

    /// Reads the jobs by phase from this watch cache from now on, counting those `claim` takes.
    pub fn watch_jobs(&self, store: Store<TFJob>, claim: Claim) {
        if let Ok(mut s) = self.by_phase.store.lock() {
            *s = Some((store, claim));
        }
    }

    /// Shows these watch caches on `/debug/caches` from now on.
    pub fn watch_caches(&self, jobs: Store<TFJob>, pods: Store<Pod>, services: Store<Service>) {
        if let Ok(mut s) = self.caches.stores.lock() {
            *s = Some((jobs, pods, services));
        }
    }

    /// `/debug/caches`: [`cache_summary`] of each watch cache (TFJobs, the operator's pods and
    /// Services), `{}` before the controller runs.
    pub fn cache_view(&self) -> serde_json::Value {
        match self.caches.stores.lock().ok().as_deref() {
            Some(Some((jobs, pods, services))) => {
                serde_json::json!({ "TFJob": store_summary(jobs), "Pod": store_summary(pods), "Service": store_summary(services) })
            }
            _ => serde_json::json!({}),
        }
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[derive(Clone)]
struct Endpoints {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

async fn metrics_page(State(s): State<Endpoints>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.metrics.render())
}

async fn debug_caches(State(s): State<Endpoints>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], s.metrics.cache_view().to_string())
}

async fn readyz(State(s): State<Endpoints>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) { (StatusCode::OK, "ok\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready\n") }
}

/// `/metrics`, `/healthz` (always ok while the process serves), `/readyz` (ok while `ready`:
/// this replica leads and its controller runs) and `/debug/caches` (what the watch caches hold,
/// as counts and digests: [`Metrics::cache_view`]).
pub fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/debug/caches", get(debug_caches))
        .with_state(Endpoints { metrics, ready })
}

/// Serves [`router`] on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, ready)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfjob_api::api::JobCondition;

    fn status(conditions: &[(&str, &str)]) -> TFJobStatus {
        TFJobStatus {
            conditions: conditions.iter().map(|(t, s)| JobCondition { type_: t.to_string(), status: s.to_string(), ..Default::default() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn job_events_are_conditions_that_became_true() {
        use JobEvent::*;
        type Conditions<'a> = &'a [(&'a str, &'a str)];
        let cases: Vec<(Conditions, Conditions, Vec<JobEvent>)> = vec![
            (&[], &[], vec![]),
            (&[], &[("Created", "True")], vec![Created]),
            (&[("Created", "True")], &[("Created", "True")], vec![]),
            (&[("Created", "True")], &[("Created", "True"), ("Running", "True")], vec![]),
            (&[("Created", "True"), ("Running", "True")], &[("Created", "True"), ("Running", "False"), ("Restarting", "True")], vec![Restarted]),
            (&[("Restarting", "False")], &[("Restarting", "True")], vec![Restarted]),
            (&[("Running", "True")], &[("Running", "False"), ("Succeeded", "True")], vec![Succeeded]),
            (&[("Running", "True")], &[("Running", "False"), ("Failed", "True")], vec![Failed]),
            (&[("Failed", "True")], &[("Failed", "True")], vec![]),
            // A job created and failed in one pass (invalid spec) counts both.
            (&[], &[("Created", "True"), ("Failed", "True")], vec![Created, Failed]),
        ];
        for (old, new, want) in cases {
            assert_eq!(job_events(&status(old), &status(new)), want, "{old:?} -> {new:?}");
        }
    }

    #[test]
    fn exposition_has_kubeflows_names_and_labels() {
        let m = Metrics::default();
        m.job("team-a", JobEvent::Created);
        m.job("team-a", JobEvent::Created);
        m.job("team-b", JobEvent::Failed);
        m.reconciled(Duration::from_millis(30));
        let under_way = m.reconcile_started();
        drop(m.reconcile_started());
        m.error("conflict");
        m.replica_recreated();
        let text = m.render();
        for line in [
            "# TYPE training_operator_jobs_created counter",
            r#"training_operator_jobs_created_total{job_namespace="team-a",framework="tensorflow"} 2"#,
            r#"training_operator_jobs_failed_total{job_namespace="team-b",framework="tensorflow"} 1"#,
            "# TYPE tfjob_reconcile_duration_seconds histogram",
            r#"tfjob_reconcile_duration_seconds_bucket{le="0.025"} 0"#,
            r#"tfjob_reconcile_duration_seconds_bucket{le="0.05"} 1"#,
            "tfjob_reconcile_duration_seconds_count 1",
            "tfjob_reconciles_in_flight 1",
            r#"tfjob_reconcile_errors_total{category="conflict"} 1"#,
            "tfjob_restarts_total 1",
            r#"tfjob_jobs{phase="Running"} 0"#,
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        drop(under_way);
        assert!(m.render().lines().any(|l| l == "tfjob_reconciles_in_flight 0"));
    }

    /// `tfjob_jobs{phase}` counts the jobs of the watch cache that the operator takes: beside
    /// Kubeflow's training-operator, not Kubeflow's.
    #[test]
    fn jobs_by_phase_counts_only_the_jobs_taken() {
        use kube::runtime::{reflector, watcher};
        use tfjob_api::api::{MANAGED_BY_MULTIKUEUE, MANAGED_BY_TFJOB_RS};
        let (store, mut writer) = reflector::store::<TFJob>();
        for (name, managed_by) in [("plain", None), ("ours", Some(MANAGED_BY_TFJOB_RS)), ("kueue", Some(MANAGED_BY_MULTIKUEUE))] {
            let mut job = TFJob::new(name, Default::default());
            job.metadata.namespace = Some("ns".into());
            job.spec.run_policy.managed_by = managed_by.map(str::to_string);
            job.status = Some(status(&[("Created", "True"), ("Running", "True")]));
            writer.apply_watcher_event(&watcher::Event::Apply(job));
        }
        for (claim, running) in [(Claim::Unmanaged, 2), (Claim::OwnOnly, 1)] {
            let m = Metrics::default();
            m.watch_jobs(store.clone(), claim);
            let line = format!(r#"tfjob_jobs{{phase="Running"}} {running}"#);
            let text = m.render();
            assert!(text.lines().any(|l| l == line), "{claim:?}: no line {line:?} in\n{text}");
        }
    }

    #[test]
    fn cache_summaries_count_and_digest_names_and_versions_in_any_order() {
        let meta = |ns: &str, name: &str, rv: &str| ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        let a = [meta("n", "a", "1"), meta("n", "b", "2")];
        let b = [meta("n", "b", "2"), meta("n", "a", "1")];
        let newer = [meta("n", "a", "1"), meta("n", "b", "3")];
        let fewer = [meta("n", "a", "1")];
        assert_eq!(cache_summary(a.iter()), cache_summary(b.iter()), "order does not matter");
        assert_eq!(cache_summary(a.iter())["objects"], 2);
        assert_ne!(cache_summary(a.iter())["digest"], cache_summary(newer.iter())["digest"], "a resourceVersion does");
        assert_ne!(cache_summary(a.iter())["digest"], cache_summary(fewer.iter())["digest"]);
        // SHA-256 of nothing: anyone can compute the digest from the API server's lists.
        assert_eq!(cache_summary([].iter())["digest"], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}

//! The Kubernetes controller: watches TFJobs and the pods, services and secrets they own,
//! executes the plan ([`crate::plan`]) and the status state machine ([`crate::status`]) with
//! server-side apply, writes status through the status subresource, emits Events, and serves
//! `/metrics`, `/healthz` and `/readyz`. Leader election uses a `coordination.k8s.io` Lease.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as CtrlAction, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::{self, TFJob, TFJobStatus};
use crate::plan::{self, GangScheduler, PlanOptions};
use crate::status::{self, Action, EventKind, Observation, ObservedReplica, Phase};

/// Field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "tfjob-operator";

/// Errors of one reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("kubernetes API error during {op}: {source}")]
    Kube {
        /// What was being done.
        op: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// An object could not be (de)serialised.
    #[error("serialization error: {0}")]
    Serialization(#[from] serde_json::Error),
    /// The object lacks a namespace or name.
    #[error("object without {0}")]
    MissingField(&'static str),
}

impl Error {
    /// Metric category.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409 => "conflict",
            Error::Kube { source: kube::Error::Api(_), .. } => "api",
            Error::Kube { .. } => "transport",
            Error::Serialization(_) => "serialization",
            Error::MissingField(_) => "invalid_object",
        }
    }
}

fn kerr(op: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let op = op.into();
    move |source| Error::Kube { op, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Prometheus metrics of the operator.
#[derive(Default)]
pub struct Metrics {
    reconciles: AtomicU64,
    restarts: AtomicU64,
    duration_buckets: [AtomicU64; BUCKETS.len()],
    duration_sum_micros: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    store: Mutex<Option<Store<TFJob>>>,
}

const BUCKETS: [f64; 9] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

impl Metrics {
    fn observe(&self, d: Duration) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        self.duration_sum_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        let secs = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.duration_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn error(&self, category: &'static str) {
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(category).or_default() += 1;
        }
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP tfjob_jobs TFJobs by phase (last true condition).\n# TYPE tfjob_jobs gauge\n");
        let mut phases: BTreeMap<String, u64> =
            ["Created", "Running", "Restarting", "Succeeded", "Suspended", "Failed"].iter().map(|p| (p.to_string(), 0)).collect();
        if let Ok(store) = self.store.lock()
            && let Some(store) = store.as_ref()
        {
            for job in store.state() {
                let status = job.status.clone().unwrap_or_default();
                *phases.entry(status::job_phase(&status).to_string()).or_default() += 1;
            }
        }
        for (p, n) in phases {
            out.push_str(&format!("tfjob_jobs{{phase=\"{p}\"}} {n}\n"));
        }
        let count = self.reconciles.load(Ordering::Relaxed);
        out.push_str("# HELP tfjob_reconcile_duration_seconds Duration of reconciliations.\n# TYPE tfjob_reconcile_duration_seconds histogram\n");
        for (i, b) in BUCKETS.iter().enumerate() {
            out.push_str(&format!("tfjob_reconcile_duration_seconds_bucket{{le=\"{b}\"}} {}\n", self.duration_buckets[i].load(Ordering::Relaxed)));
        }
        out.push_str(&format!("tfjob_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n"));
        out.push_str(&format!("tfjob_reconcile_duration_seconds_sum {}\n", self.duration_sum_micros.load(Ordering::Relaxed) as f64 / 1e6));
        out.push_str(&format!("tfjob_reconcile_duration_seconds_count {count}\n"));
        out.push_str("# HELP tfjob_restarts_total Replicas recreated after a failure.\n# TYPE tfjob_restarts_total counter\n");
        out.push_str(&format!("tfjob_restarts_total {}\n", self.restarts.load(Ordering::Relaxed)));
        out.push_str("# HELP tfjob_reconcile_errors_total Reconciliation errors by category.\n# TYPE tfjob_reconcile_errors_total counter\n");
        if let Ok(m) = self.errors.lock() {
            for (c, n) in m.iter() {
                out.push_str(&format!("tfjob_reconcile_errors_total{{category=\"{c}\"}} {n}\n"));
            }
        }
        out
    }
}

/// Shared state of the reconciler.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event recorder of the events about a job's pods.
    pub recorder: Recorder,
    /// Who records the events.
    pub reporter: Reporter,
    /// Planner settings.
    pub opts: PlanOptions,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Clock (overridable in tests).
    pub now: fn() -> Timestamp,
}

impl Context {
    /// A context with the default reporter `tfjob-operator`.
    pub fn new(client: Client, opts: PlanOptions) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.to_string(), instance: std::env::var("POD_NAME").ok() };
        Context {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            reporter,
            client,
            opts,
            metrics: Arc::new(Metrics::default()),
            now: Timestamp::now,
        }
    }
}

fn observe_pod(pod: &Pod) -> Option<ObservedReplica> {
    let labels = pod.metadata.labels.as_ref()?;
    let replica_type = api::ReplicaType::parse(labels.get(plan::LABEL_REPLICA_TYPE)?)?;
    let index: i32 = labels.get(plan::LABEL_REPLICA_INDEX)?.parse().ok()?;
    let st = pod.status.as_ref();
    let phase = match st.and_then(|s| s.phase.as_deref()) {
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some("Unknown") => Phase::Unknown,
        _ => Phase::Pending,
    };
    let cs = st.and_then(|s| s.container_statuses.as_ref()).and_then(|cs| cs.iter().find(|c| c.name == api::DEFAULT_CONTAINER_NAME));
    let exit_code = cs.and_then(|c| {
        c.state.as_ref().and_then(|s| s.terminated.as_ref()).or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref())).map(|t| t.exit_code)
    });
    Some(ObservedReplica {
        replica_type,
        index,
        name: pod.name_any(),
        phase,
        exit_code,
        restart_count: cs.map(|c| c.restart_count).unwrap_or(0),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    })
}

fn pod_group_resource(gang: &GangScheduler) -> ApiResource {
    let gvk = match gang {
        GangScheduler::Volcano => GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        GangScheduler::SchedulerPlugins(_) => GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
    };
    ApiResource::from_gvk_with_plural(&gvk, "podgroups")
}

async fn ensure_secret(api: &Api<Secret>, job: &TFJob) -> Result<(), Error> {
    let name = api::secret_name(job.name());
    if api.get_opt(&name).await.map_err(kerr("get secret"))?.is_some() {
        return Ok(());
    }
    let secret = plan::build_secret(job, &plan::random_token());
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(kerr("create secret")(e)),
    }
}

/// A reference to a pod of the job (the `related` object of pod events; it also keeps the
/// recorder from folding events about different pods into one series).
fn pod_ref(job: &TFJob, pod: &str) -> ObjectReference {
    ObjectReference { api_version: Some("v1".into()), kind: Some("Pod".into()), name: Some(pod.to_string()), namespace: job.namespace(), ..Default::default() }
}

async fn publish(ctx: &Context, job: &TFJob, kind: EventKind, reason: &str, message: &str, related: Option<ObjectReference>) {
    let ev = Event {
        type_: match kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: reason.to_string(),
        note: Some(message.chars().take(1000).collect()),
        action: "Reconcile".to_string(),
        secondary: related,
    };
    // A recorder folds an event into a `series` of the last one with the same type, reason and
    // related object, and keeps that one's note: a second `Scaled` would read as a repeat of the
    // first (`Worker 2 → 4` again instead of `Worker 4 → 1`). The job's own events are each
    // published once (after the status they come with is written), so each is an Event of its
    // own; events about a pod name the pod, and fold only into repeats about that pod.
    let published = match &ev.secondary {
        Some(_) => ctx.recorder.publish(&ev, &job.object_ref(&())).await,
        None => {
            let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
            recorder.publish(&ev, &job.object_ref(&())).await
        }
    };
    if let Err(e) = published {
        tracing::warn!(error = %e, reason, "cannot publish event");
        ctx.metrics.error("event");
    }
}

/// Reconciles one TFJob: creates what is missing, deletes what must go, writes the status.
pub async fn reconcile(job: Arc<TFJob>, ctx: Arc<Context>) -> Result<CtrlAction, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&job, &ctx).await;
    ctx.metrics.observe(started.elapsed());
    result
}

async fn reconcile_inner(job: &TFJob, ctx: &Context) -> Result<CtrlAction, Error> {
    if job.metadata.deletion_timestamp.is_some() {
        // Children carry owner references: the garbage collector removes them.
        return Ok(CtrlAction::await_change());
    }
    if job.managed_elsewhere() {
        tracing::debug!(job = job.name(), "managed by another controller; skipped");
        return Ok(CtrlAction::await_change());
    }
    let ns = job.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = job.metadata.name.clone().ok_or(Error::MissingField("name"))?;
    let client = ctx.client.clone();
    let invalid = api::validate(job);
    let mut defaulted = job.clone();
    api::apply_defaults(&mut defaulted.spec);
    let old_status = job.status.clone().unwrap_or_default();

    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let finished = status::is_finished(&old_status);
    if invalid.is_empty() && !finished && !defaulted.spec.run_policy.suspend {
        ensure_secret(&Api::namespaced(client.clone(), &ns), &defaulted).await?;
        let svc_api: Api<Service> = Api::namespaced(client.clone(), &ns);
        let svc = plan::build_service(&defaulted);
        svc_api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&svc)).await.map_err(kerr("apply service"))?;
        if let Some(gang) = &ctx.opts.gang_scheduler {
            let ar = pod_group_resource(gang);
            let pg_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let pg = plan::build_pod_group(&defaulted, gang);
            pg_api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&pg)).await.map_err(kerr("apply podgroup"))?;
        }
    }

    let selector = format!("{}={},{}={}", plan::LABEL_JOB_NAME, name, plan::LABEL_OPERATOR_NAME, plan::OPERATOR_NAME);
    let pods = pods_api.list(&ListParams::default().labels(&selector)).await.map_err(kerr("list pods"))?;
    let uid = job.metadata.uid.clone();
    let observed: Vec<ObservedReplica> =
        pods.items.iter().filter(|p| uid.is_none() || p.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref())).filter_map(observe_pod).collect();

    let outcome = status::reconcile_status(&Observation {
        namespace: &ns,
        name: &name,
        spec: &defaulted.spec,
        status: &old_status,
        replicas: &observed,
        invalid: &invalid,
        now: (ctx.now)(),
    });

    let mut job_deleted = false;
    // The state machine's events are published once the status they come with is written: a
    // status computed from a stale copy of the job is refused (409 below) and so are its events,
    // which the next reconcile computes again if they are still due. (Otherwise a `TFJobCreated`
    // or a `Scaled` would be sent again by every reconcile that runs before the watch delivers
    // the status just written.)
    let mut job_events: Vec<(EventKind, &str, &str)> = Vec::new();
    // Planned at the first pod to create, once per reconcile: the cluster spec is written once
    // and each pod's TF_CONFIG only when that pod is sent.
    let mut planner: Option<plan::PodPlanner> = None;
    for action in &outcome.actions {
        match action {
            Action::CreateReplica { replica_type, index } => {
                let planner = planner.get_or_insert_with(|| plan::PodPlanner::new(&defaulted, &ctx.opts));
                if let Some(planned) = planner.pod(*replica_type, *index) {
                    let pod_name = planned.name().to_string();
                    pods_api
                        .patch(&pod_name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(planned.into_pod()))
                        .await
                        .map_err(kerr(format!("create pod {pod_name}")))?;
                    let msg = format!("Created pod: {pod_name}");
                    let related = Some(pod_ref(job, &pod_name));
                    publish(ctx, job, EventKind::Normal, "SuccessfulCreatePod", &msg, related).await;
                }
            }
            Action::DeleteReplica { name: pod } | Action::RecreateReplica { name: pod, .. } => {
                if matches!(action, Action::RecreateReplica { .. }) {
                    ctx.metrics.restarts.fetch_add(1, Ordering::Relaxed);
                }
                match pods_api.delete(pod, &DeleteParams::default()).await {
                    Ok(_) => {
                        let msg = format!("Deleted pod: {pod}");
                        let related = Some(pod_ref(job, pod));
                        publish(ctx, job, EventKind::Normal, "SuccessfulDeletePod", &msg, related).await;
                    }
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => return Err(kerr(format!("delete pod {pod}"))(e)),
                }
            }
            Action::Event { kind, reason, message } => job_events.push((*kind, reason.as_str(), message.as_str())),
            Action::RequeueAfter(_) => {}
            Action::DeleteJob => {
                let jobs: Api<TFJob> = Api::namespaced(client.clone(), &ns);
                match jobs.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => return Err(kerr("delete job")(e)),
                }
                job_deleted = true;
            }
        }
    }

    // A finished job releases its gang: the PodGroup goes with the pods.
    let newly_finished = !job_deleted && !finished && status::is_finished(&outcome.status);
    if let Some(gang) = ctx.opts.gang_scheduler.as_ref().filter(|_| newly_finished) {
        {
            let ar = pod_group_resource(gang);
            let pg_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            match pg_api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(kerr("delete podgroup")(e)),
            }
        }
    }

    if !job_deleted && status_changed(&old_status, &outcome.status) {
        let jobs: Api<TFJob> = Api::namespaced(client.clone(), &ns);
        let patch = status_patch(job, &outcome.status);
        match jobs.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
            Ok(_) => {}
            // The status was computed from a stale copy of the job (the watch had not delivered
            // our previous status write yet, or the job changed meanwhile). Writing it would undo
            // the newer status (e.g. lose a `recreated` count or a Restarting condition): look
            // again, from the newer version.
            Err(e) if is_status(&e, 409) => {
                tracing::debug!(job = %name, "status computed from a stale job; reconciling again");
                return Ok(CtrlAction::requeue(Duration::from_millis(200)));
            }
            Err(e) => return Err(kerr("patch status")(e)),
        }
    }
    for (kind, reason, message) in job_events {
        publish(ctx, job, kind, reason, message, None).await;
    }

    Ok(match outcome.requeue_after() {
        Some(d) => CtrlAction::requeue(d.max(Duration::from_millis(100))),
        None => CtrlAction::await_change(),
    })
}

/// The server-side apply body of a status write. It carries the `resourceVersion` of the job the
/// status was computed from, so the API server refuses it (409 Conflict) when the job has changed
/// since: a status computed from a stale cache never overwrites a newer one.
pub fn status_patch(job: &TFJob, status: &TFJobStatus) -> serde_json::Value {
    let mut patch = json!({
        "apiVersion": format!("{}/{}", api::GROUP, api::VERSION),
        "kind": api::KIND,
        "status": status,
    });
    if let Some(rv) = &job.metadata.resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    patch
}

/// Whether the status changed beyond `lastReconcileTime` (writing only that would trigger an
/// endless watch loop).
pub fn status_changed(old: &TFJobStatus, new: &TFJobStatus) -> bool {
    let mut a = old.clone();
    let mut b = new.clone();
    a.last_reconcile_time = None;
    b.last_reconcile_time = None;
    a != b
}

/// Requeue policy after an error: count it, retry in 10 seconds.
pub fn error_policy(job: Arc<TFJob>, err: &Error, ctx: Arc<Context>) -> CtrlAction {
    tracing::warn!(job = job.name(), error = %err, "reconcile failed");
    ctx.metrics.error(err.category());
    CtrlAction::requeue(Duration::from_secs(10))
}

/// Flags of `tfjob operator` (each with an environment fallback).
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// Namespace to watch (all namespaces when unset).
    #[arg(long, env = "TFJOB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Maximum number of jobs reconciled concurrently.
    #[arg(long, env = "TFJOB_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,
    /// Cluster domain appended to replica addresses (e.g. `cluster.local`).
    #[arg(long, env = "TFJOB_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Address of the metrics and health server.
    #[arg(long, env = "TFJOB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Log level (a tracing filter such as `info` or `tfjob_operator=debug`).
    #[arg(long, env = "TFJOB_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: `text` or `json`.
    #[arg(long, env = "TFJOB_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Gang scheduler: `volcano` or a scheduler-plugins scheduler name (none when unset).
    #[arg(long, env = "TFJOB_GANG_SCHEDULER")]
    pub gang_scheduler: Option<String>,
    /// Use leader election (a Lease) so that only one replica reconciles.
    #[arg(long, env = "TFJOB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "TFJOB_LEASE_NAME", default_value = "tfjob-operator")]
    pub lease_name: String,
}

fn init_logging(args: &OperatorArgs) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if args.log_format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// Entry point of `tfjob operator`.
pub fn run_operator(args: OperatorArgs) -> ExitCode {
    init_logging(&args);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(operator_main(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Errors that stop `tfjob operator`.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("cannot connect to Kubernetes: {0}")]
    Connect(#[source] kube::Error),
    /// The CRD is not installed.
    #[error(
        "the TFJob CustomResourceDefinition (tfjobs.kubeflow.org) is not installed in this \
         cluster; install it first: `tfjob crd | kubectl apply --server-side -f -` (or \
         `kubectl apply -f crds/tfjob.yaml`)"
    )]
    CrdMissing,
    /// TFJobs cannot be listed (RBAC, connectivity).
    #[error("cannot list TFJobs: {0}")]
    ListJobs(#[source] kube::Error),
    /// The metrics/health address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Checks that the TFJob CRD is served.
pub async fn check_crd(client: &Client, namespace: Option<&str>) -> Result<(), OperatorError> {
    let api: Api<TFJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Err(OperatorError::CrdMissing),
        Err(e) => Err(OperatorError::ListJobs(e)),
    }
}

async fn operator_main(args: OperatorArgs) -> Result<(), OperatorError> {
    let client = Client::try_default().await.map_err(OperatorError::Connect)?;
    check_crd(&client, args.namespace.as_deref()).await?;
    let opts = PlanOptions {
        cluster_domain: args.cluster_domain.clone().filter(|d| !d.is_empty()),
        gang_scheduler: args.gang_scheduler.as_deref().and_then(GangScheduler::from_setting),
    };
    let ctx = Arc::new(Context::new(client.clone(), opts));
    let ready = Arc::new(AtomicBool::new(false));
    let listener =
        tokio::net::TcpListener::bind(&args.metrics_addr).await.map_err(|source| OperatorError::Listen { addr: args.metrics_addr.clone(), source })?;
    tracing::info!(addr = %args.metrics_addr, "serving /metrics, /healthz, /readyz");
    let server = tokio::spawn(serve_http(listener, ctx.metrics.clone(), ready.clone()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
    });
    let wait_stop = {
        let rx = stop_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        }
    };

    let mut lost_leadership = None;
    let mut leader: Option<(Arc<LeaderElector>, tokio::task::JoinHandle<()>)> = None;
    if args.leader_elect {
        // Like client-go: the pod (host) name plus a random suffix, unique per process.
        let host = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_else(|_| "tfjob-operator".to_string());
        let identity = format!("{host}_{}", &plan::random_token()[..12]);
        let elector = LeaderElector {
            api: Api::namespaced(client.clone(), &args.lease_namespace),
            name: args.lease_name.clone(),
            identity,
            lease_duration: Duration::from_secs(15),
        };
        tracing::info!(lease = %args.lease_name, "waiting for leadership");
        tokio::select! {
            _ = elector.acquire() => {},
            _ = wait_stop() => { server.abort(); return Ok(()); }
        }
        tracing::info!("became leader");
        let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
        let elector = Arc::new(elector);
        let keeper = elector.clone();
        let renewals = tokio::spawn(async move {
            keeper.keep().await;
            let _ = lost_tx.send(());
        });
        lost_leadership = Some(lost_rx);
        leader = Some((elector, renewals));
    }

    let controller = build_controller(client.clone(), args.namespace.as_deref(), args.concurrency);
    if let Ok(mut s) = ctx.metrics.store.lock() {
        *s = Some(controller.store());
    }
    let stop = wait_stop();
    let lost = async move {
        match lost_leadership {
            Some(rx) => {
                let _ = rx.await;
                tracing::error!("lost leadership; stopping");
            }
            None => futures::future::pending::<()>().await,
        }
    };
    ready.store(true, Ordering::SeqCst);
    controller
        .graceful_shutdown_on(async move {
            tokio::select! {
                _ = stop => {},
                _ = lost => {},
            }
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(job = %obj, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller event"),
            }
        })
        .await;
    ready.store(false, Ordering::SeqCst);
    if let Some((elector, renewals)) = leader {
        renewals.abort();
        // Hand over at once instead of letting the next leader wait for the lease to expire.
        if let Err(e) = elector.release().await {
            tracing::warn!(error = %e, "cannot release the lease");
        }
    }
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// The kube-rs `Controller` over TFJobs (in `namespace`, or all namespaces) and the pods,
/// services and secrets they own (selected by the operator-name label).
pub fn build_controller(client: Client, namespace: Option<&str>, concurrency: u16) -> Controller<TFJob> {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let owned = watcher::Config::default().labels(&format!("{}={}", plan::LABEL_OPERATOR_NAME, plan::OPERATOR_NAME));
    Controller::new(api::<TFJob>(&client, namespace), watcher::Config::default())
        .owns(api::<Pod>(&client, namespace), owned.clone())
        .owns(api::<Service>(&client, namespace), owned.clone())
        .owns(api::<Secret>(&client, namespace), owned)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
}

/// Serves `/metrics`, `/healthz` and `/readyz` (minimal HTTP/1.1) until the task is aborted.
pub async fn serve_http(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (code, body, ctype) = http_response(path, &metrics, ready.load(Ordering::SeqCst));
            let resp = format!("HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

/// Status line, body and content type for a path of the health/metrics server.
pub fn http_response(path: &str, metrics: &Metrics, ready: bool) -> (&'static str, String, &'static str) {
    match path {
        "/metrics" => ("200 OK", metrics.render(), "text/plain; version=0.0.4"),
        "/healthz" => ("200 OK", "ok\n".into(), "text/plain"),
        "/readyz" if ready => ("200 OK", "ok\n".into(), "text/plain"),
        "/readyz" => ("503 Service Unavailable", "not ready\n".into(), "text/plain"),
        _ => ("404 Not Found", "not found\n".into(), "text/plain"),
    }
}

/// Leader election on a `coordination.k8s.io/v1` Lease.
pub struct LeaderElector {
    /// Lease API (in the operator's namespace).
    pub api: Api<Lease>,
    /// Lease name.
    pub name: String,
    /// This instance.
    pub identity: String,
    /// Lease duration; renewals happen at a third of it.
    pub lease_duration: Duration,
}

impl LeaderElector {
    /// Tries once to take or renew the lease. Returns whether this instance holds it.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let secs = self.lease_duration.as_secs() as i32;
        match self.api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: kube::api::ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_status(&e, 409) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                let holder = spec.holder_identity.clone().unwrap_or_default();
                let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
                    (Some(t), Some(d)) => now.duration_since(t.0).as_secs_f64() > f64::from(d),
                    _ => true,
                };
                if holder != self.identity && !expired && !holder.is_empty() {
                    return Ok(false);
                }
                if holder != self.identity {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.acquire_time = Some(MicroTime(now));
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(MicroTime(now));
                // replace carries the resourceVersion: a concurrent writer makes this fail (409).
                match self.api.replace(&self.name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_status(&e, 409) => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Gives the lease up if this instance holds it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits until this instance holds the lease (API errors are logged and retried).
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.lease_duration / 3).await;
        }
    }

    /// Keeps renewing; returns when the lease is lost (or cannot be renewed in time).
    pub async fn keep(&self) {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.lease_duration / 3).await;
            match self.try_acquire().await {
                Ok(true) => last_ok = Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew lease");
                    if last_ok.elapsed() >= self.lease_duration * 2 / 3 {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_writes_are_conditional_on_the_version_they_were_computed_from() {
        let mut job: TFJob = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns", "resourceVersion": "42"},
            "spec": {"tfReplicaSpecs": {}},
        }))
        .unwrap();
        let status = TFJobStatus { start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH)), ..Default::default() };
        let patch = status_patch(&job, &status);
        assert_eq!(patch["apiVersion"], "kubeflow.org/v1");
        assert_eq!(patch["kind"], "TFJob");
        assert_eq!(patch["metadata"], json!({"resourceVersion": "42"}));
        assert_eq!(patch["status"]["startTime"], "1970-01-01T00:00:00Z");
        assert!(patch.get("spec").is_none(), "{patch}");
        // Without a version (never the case for an object read from the API) no precondition.
        job.metadata.resource_version = None;
        assert!(status_patch(&job, &status).get("metadata").is_none());
    }
}

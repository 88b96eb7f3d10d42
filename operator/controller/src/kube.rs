//! The Kubernetes controller: watches TFJobs and the pods and Services they own (into watch
//! caches, see [`cache`]), executes the plan ([`tfjob_api::plan`]) and the status state machine
//! ([`tfjob_api::status`]), writes status through the status subresource, emits Events, and serves
//! `/metrics`, `/healthz` and `/readyz`. Leader election uses a `coordination.k8s.io` Lease.
//!
//! Light on the API server: a reconcile reads nothing from it. The job comes from the
//! controller's own watch, its pods and Service from the watch caches; it writes only what
//! changes: a pod created or deleted, the Service when it is missing or differs, the status when
//! it changed, the token Secret once per job (it never reads or watches Secrets), each Event
//! once.

pub mod cache;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as CtrlAction, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::metrics::{JobEvent, Metrics};
use tfjob_api::api::{self, TFJob, TFJobStatus};
use tfjob_api::plan::{self, GangScheduler, PlanOptions};
use tfjob_api::status::{self, Action, EventKind, Observation, ObservedReplica, Phase, PodRefusal};

use cache::{CachedPod, Caches, EXPECTATION_TTL, Expectations, Once};

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
    /// The watch caches of pods and Services have not loaded (RBAC, connectivity).
    #[error("the pod and Service caches are not ready yet")]
    CacheNotReady,
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
            Error::CacheNotReady => "cache",
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
    /// Which jobs this operator takes (`--beside-kubeflow`).
    pub claim: api::Claim,
    /// The watch caches of the jobs' pods and Services.
    pub caches: Caches,
    /// Pod writes the pod cache does not show yet, per job.
    pub expectations: Expectations,
    /// Jobs whose token Secret this process has created (or found to exist).
    pub secrets: Once,
    /// Jobs whose PodGroup this process has applied.
    pub pod_groups: Once,
}

impl Context {
    /// A context with the default reporter `tfjob-operator`, reading pods and Services from
    /// `caches` (see [`build_controller`]).
    pub fn new(client: Client, opts: PlanOptions, caches: Caches) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.to_string(), instance: std::env::var("POD_NAME").ok() };
        Context {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            reporter,
            client,
            opts,
            metrics: Arc::new(Metrics::default()),
            now: Timestamp::now,
            claim: api::Claim::default(),
            caches,
            expectations: Expectations::default(),
            secrets: Once::default(),
            pod_groups: Once::default(),
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
    let terminated =
        cs.and_then(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()).or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref())));
    // Without a terminated container, a failed pod says why itself (`Evicted: ...`).
    let pod_reason = st.and_then(|s| s.reason.as_deref()).map(|r| match st.and_then(|s| s.message.as_deref()).filter(|m| !m.is_empty()) {
        Some(m) => format!("{r}: {m}"),
        None => r.to_string(),
    });
    let exit_reason = match terminated {
        Some(t) => t.reason.clone(),
        None if phase == Phase::Failed => pod_reason,
        None => None,
    };
    let unschedulable = st
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")))
        .map(|c| c.message.clone().unwrap_or_else(|| "Unschedulable".to_string()));
    Some(ObservedReplica {
        replica_type,
        index,
        name: pod.name_any(),
        phase,
        exit_code: terminated.map(|t| t.exit_code),
        exit_reason,
        restart_count: cs.map(|c| c.restart_count).unwrap_or(0),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        unschedulable,
    })
}

fn pod_group_resource(gang: &GangScheduler) -> ApiResource {
    let gvk = match gang {
        GangScheduler::Volcano => GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        GangScheduler::SchedulerPlugins(_) => GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
    };
    ApiResource::from_gvk_with_plural(&gvk, "podgroups")
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() }
}

/// Creates the job's token Secret, once: the controller never reads Secrets (it may not), so a
/// Secret that exists already (`AlreadyExists`: created by an earlier run of the operator) is
/// the job's and is kept, token and all.
async fn ensure_secret(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    if ctx.secrets.contains(uid) {
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = plan::build_secret(job, &plan::random_token());
    match api.create(&post_params(), &secret).await {
        Ok(_) => {}
        Err(e) if is_status(&e, 409) => {}
        Err(e) => return Err(kerr("create secret")(e)),
    }
    ctx.secrets.insert(uid);
    Ok(())
}

/// Applies the job's Service (and, when configured, its NetworkPolicy) when the cache shows it
/// missing or different; otherwise writes nothing.
async fn ensure_service(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let desired = plan::build_service(job);
    if let Some(existing) = ctx.caches.service_of(job)
        && cache::service_is_current(&existing, &desired)
    {
        return Ok(());
    }
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    svc_api.patch(job.name(), &apply, &Patch::Apply(&desired)).await.map_err(kerr("apply service"))?;
    if ctx.opts.network_policy {
        let np_api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        let np = plan::build_network_policy(job);
        np_api.patch(job.name(), &apply, &Patch::Apply(&np)).await.map_err(kerr("apply networkpolicy"))?;
    }
    Ok(())
}

/// Applies the job's PodGroup once per job (and process).
async fn ensure_pod_group(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let Some(gang) = &ctx.opts.gang_scheduler else {
        return Ok(());
    };
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    if ctx.pod_groups.contains(uid) {
        return Ok(());
    }
    let ar = pod_group_resource(gang);
    let pg_api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
    let pg = plan::build_pod_group(job, gang);
    pg_api.patch(job.name(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&pg)).await.map_err(kerr("apply podgroup"))?;
    ctx.pod_groups.insert(uid);
    Ok(())
}

/// What the API server's refusal to create a pod means for the job, or `None` when the call
/// failed for another reason (connection, timeout, overload: the reconcile is retried).
fn pod_refusal(pod: &str, e: &kube::Error) -> Option<PodRefusal> {
    match e {
        // Invalid (422) or malformed (400): the same pod would be refused again.
        // Forbidden (403): admission (quota, pod security) may let a later attempt through.
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => {
            Some(PodRefusal { pod: pod.to_string(), message: s.message.clone(), permanent: s.code != 403 })
        }
        _ => None,
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
    ctx.metrics.reconciled(started.elapsed());
    result
}

async fn reconcile_inner(job: &TFJob, ctx: &Context) -> Result<CtrlAction, Error> {
    let ns = job.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = job.metadata.name.clone().ok_or(Error::MissingField("name"))?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // What the controller remembers of a job is keyed by its uid: a job deleted and created
    // again under the same name is another job.
    let key = if uid.is_empty() { format!("{ns}/{name}") } else { uid.clone() };
    if job.metadata.deletion_timestamp.is_some() {
        // Children carry owner references: the garbage collector removes them.
        forget(ctx, &key, &uid);
        return Ok(CtrlAction::await_change());
    }
    if !ctx.claim.takes(job.spec.run_policy.managed_by.as_deref()) {
        tracing::debug!(job = job.name(), "managed by another controller; skipped");
        return Ok(CtrlAction::await_change());
    }
    if !ctx.caches.wait_until_ready(Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady);
    }
    let pods = ctx.caches.pods_of(job);
    let cached: Vec<CachedPod> = pods.iter().map(|p| CachedPod::of(p)).collect();
    if let Some(wait) = ctx.expectations.wait(&key, &cached, Instant::now(), EXPECTATION_TTL) {
        tracing::debug!(job = %name, "waiting for the pod cache to show the last writes");
        return Ok(CtrlAction::requeue(wait));
    }
    let invalid = api::validate(job);
    let mut defaulted = job.clone();
    api::apply_defaults(&mut defaulted.spec);
    let old_status = job.status.clone().unwrap_or_default();
    let finished = status::is_finished(&old_status);
    if finished {
        // A finished job creates nothing any more.
        ctx.secrets.forget(&uid);
        ctx.pod_groups.forget(&uid);
    } else if invalid.is_empty() && !defaulted.spec.run_policy.suspend {
        ensure_service(ctx, &ns, &defaulted).await?;
        ensure_pod_group(ctx, &ns, &defaulted).await?;
    }

    let observed: Vec<ObservedReplica> = pods.iter().filter_map(|p| observe_pod(p)).collect();
    let mut outcome = status::reconcile_status(&Observation {
        namespace: &ns,
        name: &name,
        spec: &defaulted.spec,
        status: &old_status,
        replicas: &observed,
        invalid: &invalid,
        now: (ctx.now)(),
    });
    let creates = outcome.actions.iter().filter(|a| matches!(a, Action::CreateReplica { .. })).count();
    if creates > 0 {
        ensure_secret(ctx, &ns, &defaulted).await?;
    }

    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let uid_of = |pod: &str| -> Option<String> { pods.iter().find(|p| p.metadata.name.as_deref() == Some(pod)).and_then(|p| p.metadata.uid.clone()) };
    let mut job_deleted = false;
    // The state machine's events are published once the status they come with is written: a
    // status computed from a stale copy of the job is refused (409 below) and so are its events,
    // which the next reconcile computes again if they are still due. (Otherwise a `TFJobCreated`
    // or a `Scaled` would be sent again by every reconcile that runs before the watch delivers
    // the status just written.)
    let mut job_events: Vec<Action> = Vec::new();
    let mut refused: Vec<PodRefusal> = Vec::new();
    // Planned at the first pod to create, once per reconcile: the cluster spec is written once
    // and each pod's TF_CONFIG only when that pod is sent.
    let mut planner: Option<plan::PodPlanner> = None;
    for action in &outcome.actions {
        match action {
            // After an invalid pod the job fails: no point sending its other pods.
            Action::CreateReplica { .. } if refused.iter().any(|r| r.permanent) => {}
            Action::CreateReplica { replica_type, index } => {
                let planner = planner.get_or_insert_with(|| plan::PodPlanner::new(&defaulted, &ctx.opts));
                let Some(planned) = planner.pod(*replica_type, *index) else {
                    continue;
                };
                let pod_name = planned.name().to_string();
                match pods_api.create(&post_params(), &planned.into_pod()).await {
                    Ok(created) => {
                        let new_uid = created.metadata.uid.unwrap_or_default();
                        ctx.expectations.created(&key, &pod_name, &new_uid, Instant::now());
                        let msg = format!("Created pod: {pod_name}");
                        let related = Some(pod_ref(job, &pod_name));
                        publish(ctx, job, EventKind::Normal, "SuccessfulCreatePod", &msg, related).await;
                    }
                    // The cache was behind: the pod is there.
                    Err(e) if is_status(&e, 409) => {}
                    Err(e) => match pod_refusal(&pod_name, &e) {
                        Some(r) => {
                            tracing::warn!(job = %name, pod = %pod_name, error = %e, "pod refused");
                            refused.push(r);
                        }
                        None => return Err(kerr(format!("create pod {pod_name}"))(e)),
                    },
                }
            }
            Action::DeleteReplica { name: pod } | Action::RecreateReplica { name: pod, .. } => {
                if matches!(action, Action::RecreateReplica { .. }) {
                    ctx.metrics.replica_recreated();
                }
                // Exactly the pod observed: never a newer pod of the same name.
                let pod_uid = uid_of(pod);
                let params = DeleteParams {
                    preconditions: pod_uid.clone().map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
                    ..Default::default()
                };
                match pods_api.delete(pod, &params).await {
                    Ok(_) => {
                        if let Some(u) = &pod_uid {
                            ctx.expectations.deleted(&key, pod, u, Instant::now());
                        }
                        let msg = format!("Deleted pod: {pod}");
                        let related = Some(pod_ref(job, pod));
                        publish(ctx, job, EventKind::Normal, "SuccessfulDeletePod", &msg, related).await;
                    }
                    Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
                    Err(e) => return Err(kerr(format!("delete pod {pod}"))(e)),
                }
            }
            Action::Event { .. } => job_events.push(action.clone()),
            Action::RequeueAfter(_) => {}
            Action::DeleteJob => {
                let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &ns);
                match jobs.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) => {}
                    Err(e) => return Err(kerr("delete job")(e)),
                }
                ctx.metrics.job(&ns, JobEvent::Deleted);
                forget(ctx, &key, &uid);
                job_deleted = true;
            }
        }
    }
    if creates > 0 || !refused.is_empty() {
        let full_name = format!("{ns}/{name}");
        let now = (ctx.now)();
        job_events.extend(status::record_pod_creations(&mut outcome.status, &full_name, creates, &refused, now));
    }

    // A finished job releases its gang: the PodGroup goes with the pods.
    let newly_finished = !job_deleted && !finished && status::is_finished(&outcome.status);
    if let Some(gang) = ctx.opts.gang_scheduler.as_ref().filter(|_| newly_finished) {
        let ar = pod_group_resource(gang);
        let pg_api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
        match pg_api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => return Err(kerr("delete podgroup")(e)),
        }
    }

    if !job_deleted && status_changed(&old_status, &outcome.status) {
        let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &ns);
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
        for event in crate::metrics::job_events(&old_status, &outcome.status) {
            ctx.metrics.job(&ns, event);
        }
    }
    for event in job_events {
        if let Action::Event { kind, reason, message, pod } = event {
            let related = pod.map(|p| pod_ref(job, &p));
            publish(ctx, job, kind, &reason, &message, related).await;
        }
    }

    // A pod refused for now (quota, admission) is tried again later.
    let retry = (!refused.is_empty()).then_some(Duration::from_secs(10));
    Ok(match outcome.requeue_after().into_iter().chain(retry).min() {
        Some(d) => CtrlAction::requeue(d.max(Duration::from_millis(100))),
        None => CtrlAction::await_change(),
    })
}

/// Drops what the context remembers of a job that is finished or gone.
fn forget(ctx: &Context, key: &str, uid: &str) {
    ctx.expectations.forget(key);
    ctx.secrets.forget(uid);
    ctx.pod_groups.forget(uid);
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
    /// Give every job a NetworkPolicy: only the job's own pods reach its replicas' ports.
    #[arg(long, env = "TFJOB_NETWORK_POLICY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub network_policy: bool,
    /// Use leader election (a Lease) so that only one replica reconciles.
    #[arg(long, env = "TFJOB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "TFJOB_LEASE_NAME", default_value = "tfjob-operator")]
    pub lease_name: String,
    /// Run beside Kubeflow's training-operator: take only the TFJobs whose
    /// `spec.runPolicy.managedBy` is `tfjob-rs.io/operator` (otherwise: every TFJob without
    /// `managedBy`, or with `kubeflow.org/training-operator` or `tfjob-rs.io/operator`).
    #[arg(long, env = "TFJOB_BESIDE_KUBEFLOW", default_value_t = false, action = clap::ArgAction::Set)]
    pub beside_kubeflow: bool,
}

/// Whether log lines get terminal colours: only when stderr is a terminal and `NO_COLOR`
/// (no-color.org) is unset or empty. Under `kubectl logs`, a file or a pipe, plain text.
pub fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_logging(args: &OperatorArgs) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colours = log_colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours);
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
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "tfjob operator starting");
    let client = Client::try_default().await.map_err(OperatorError::Connect)?;
    check_crd(&client, args.namespace.as_deref()).await?;
    let opts = PlanOptions::from_settings(args.cluster_domain.as_deref(), args.gang_scheduler.as_deref(), args.network_policy);
    let (controller, caches) = build_controller(client.clone(), args.namespace.as_deref(), args.concurrency);
    let mut ctx = Context::new(client.clone(), opts, caches);
    if args.beside_kubeflow {
        ctx.claim = api::Claim::OwnOnly;
        tracing::info!("beside Kubeflow: taking only TFJobs with spec.runPolicy.managedBy: {}", api::MANAGED_BY_TFJOB_RS);
    }
    let ctx = Arc::new(ctx);
    let ready = Arc::new(AtomicBool::new(false));
    let listener =
        tokio::net::TcpListener::bind(&args.metrics_addr).await.map_err(|source| OperatorError::Listen { addr: args.metrics_addr.clone(), source })?;
    tracing::info!(addr = %args.metrics_addr, "serving /metrics, /healthz, /readyz");
    let server = tokio::spawn(crate::metrics::serve(listener, ctx.metrics.clone(), ready.clone()));

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

    ctx.metrics.watch_jobs(controller.store(), ctx.claim);
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

/// The kube-rs `Controller` over TFJobs (in `namespace`, or all namespaces), triggered also by
/// the pods and Services they own (selected by the operator-name label), whose watches fill the
/// returned [`Caches`]: give them to the [`Context`] of the reconciler. Secrets are not watched.
pub fn build_controller(client: Client, namespace: Option<&str>, concurrency: u16) -> (Controller<TFJob>, Caches) {
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
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (services, service_writer) = reflector::store::<Service>();
    // The caches keep what a reconcile reads, not the managed fields of every object.
    let pod_events = watcher(api::<Pod>(&client, namespace), owned.clone())
        .default_backoff()
        .modify(|p| p.managed_fields_mut().clear())
        .reflect(pod_writer)
        .touched_objects();
    let service_events = watcher(api::<Service>(&client, namespace), owned)
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(service_writer)
        .touched_objects();
    let controller = Controller::new(api::<TFJob>(&client, namespace), watcher::Config::default())
        .owns_stream(pod_events)
        .owns_stream(service_events)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency));
    (controller, Caches { pods, services })
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
    fn colours_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        let cases: [(bool, Option<&OsStr>, bool); 5] = [
            (true, None, true),
            (true, Some(OsStr::new("")), true),
            (true, Some(OsStr::new("1")), false),
            (false, None, false),
            (false, Some(OsStr::new("")), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(log_colours(terminal, no_color), want, "{terminal} {no_color:?}");
        }
    }

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

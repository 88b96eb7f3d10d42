//! One reconcile of a TFJob, as named steps:
//!
//! 1. [`gate`]: whether there is anything to do (a job being deleted, another controller's job,
//!    caches not ready or not yet showing the controller's last writes, pods or status);
//! 2. [`decide`]: validation, defaults, the observed replicas and the status machine (pure);
//! 3. [`execute`]: the once-per-job objects, then each action of the status machine by the
//!    function of its kind ([`super::execute`]), then what the status records of it;
//! 4. [`super::commit`]: the status, the job's events and metrics, and the requeue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action as CtrlAction;
use tfjob_api::api::{self, TFJob, TFJobStatus};
use tfjob_api::plan;
use tfjob_api::status::{self, Action, Observation, ObservedReplica, Outcome};

use super::admission;
use super::cache::{CachedPod, EXPECTATION_TTL};
use super::commit::commit;
use super::context::Context;
use super::error::Error;
use super::events;
use super::execute::{self, Executed, PodCreation};
use super::kueue_group;
use super::observe::observe_pod;
use super::target::Target;

/// Reconciles one TFJob: creates what is missing, deletes what must go, writes the status.
pub async fn reconcile(job: Arc<TFJob>, ctx: Arc<Context>) -> Result<CtrlAction, Error> {
    let started = Instant::now();
    let _in_flight = ctx.metrics.reconcile_started();
    tracing::debug!(job = job.name(), version = job.metadata.resource_version.as_deref(), "reconcile started");
    // kube's scheduler holds every later trigger of a job while its reconcile runs: one request
    // that is never answered would stop the job for ever.
    let deadline = ctx.reconcile_timeout;
    let result = tokio::time::timeout(deadline, reconcile_steps(&job, &ctx)).await.unwrap_or(Err(Error::Timeout(deadline)));
    let took = started.elapsed();
    ctx.metrics.reconciled(took);
    tracing::debug!(job = job.name(), ?took, ok = result.is_ok(), "reconcile finished");
    result
}

async fn reconcile_steps(job: &TFJob, ctx: &Context) -> Result<CtrlAction, Error> {
    let target = match gate(job, ctx).await? {
        Gate::Stop(action) => return Ok(action),
        Gate::Go(target) => target,
    };
    let mut decision = decide(&target, (ctx.now)());
    let done = execute(ctx, &target, &mut decision).await?;
    commit(ctx, &target, &decision.old_status, &decision.outcome, done).await
}

/// Requeue policy after an error: count it, retry in 10 seconds.
pub fn error_policy(job: Arc<TFJob>, err: &Error, ctx: Arc<Context>) -> CtrlAction {
    tracing::warn!(job = job.name(), error = %err, "reconcile failed");
    ctx.metrics.error(err.category());
    CtrlAction::requeue(Duration::from_secs(10))
}

/// What the gate lets through.
enum Gate<'a> {
    /// Nothing to do now; the controller's next step.
    Stop(CtrlAction),
    /// Reconcile this.
    Go(Box<Target<'a>>),
}

/// Whether the job is to be reconciled now: not when it is being deleted (its children carry
/// owner references: the garbage collector removes them), when it is another controller's
/// (`managedBy`), or while the pod cache does not show the controller's last writes. A job that
/// had finished goes through, but creates nothing any more.
async fn gate<'a>(job: &'a TFJob, ctx: &Context) -> Result<Gate<'a>, Error> {
    let ns = job.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = job.metadata.name.clone().ok_or(Error::MissingField("name"))?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let key = if uid.is_empty() { format!("{ns}/{name}") } else { uid.clone() };
    if job.metadata.deletion_timestamp.is_some() {
        ctx.forget(&key, &uid);
        return Ok(Gate::Stop(CtrlAction::await_change()));
    }
    if !ctx.claim.takes(job.spec.run_policy.managed_by.as_deref()) {
        tracing::debug!(job = job.name(), "managed by another controller; skipped");
        return Ok(Gate::Stop(CtrlAction::await_change()));
    }
    if !ctx.caches.wait_until_ready(Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady);
    }
    let pods = ctx.caches.pods_of(job);
    let cached: Vec<CachedPod> = pods.iter().map(|p| CachedPod::of(p)).collect();
    if let Some(wait) = ctx.expectations.wait(&key, &cached, Instant::now(), EXPECTATION_TTL) {
        tracing::debug!(job = %name, "waiting for the pod cache to show the last writes");
        return Ok(Gate::Stop(CtrlAction::requeue(wait)));
    }
    // The watch delivers the job's new version and with it a reconcile; the requeue is the
    // safety net of a watch that is late.
    if let Some(wait) = ctx.status_writes.wait(&key, job.metadata.resource_version.as_deref(), Instant::now(), EXPECTATION_TTL) {
        tracing::debug!(job = %name, "waiting for the job cache to show the status just written");
        return Ok(Gate::Stop(CtrlAction::requeue(wait.min(Duration::from_secs(1)))));
    }
    let finished = status::is_finished(job.status.as_ref().unwrap_or(&TFJobStatus::default()));
    if finished {
        ctx.forget_once_objects(&uid);
    }
    Ok(Gate::Go(Box::new(Target::new(job, ns, name, uid, key, pods, finished))))
}

/// What a reconcile decided, before anything is written.
struct Decision {
    /// The job with its in-memory defaults (what is planned).
    defaulted: TFJob,
    /// The job is valid and not suspended: its Service and PodGroup are kept.
    runs: bool,
    /// The status the job had.
    old_status: TFJobStatus,
    /// The status machine's new status and actions.
    outcome: Outcome,
    /// How many pods the actions create.
    creates: usize,
}

/// Validation, defaults, the observed replicas and the status machine at `now`: pure.
fn decide(target: &Target<'_>, now: Timestamp) -> Decision {
    let job = target.job;
    // A finished job is not validated again: nothing is created from its spec, and the cache
    // keeps no pod templates of it (`watch::slim_job`).
    let invalid = if target.finished { Vec::new() } else { api::validate(job) };
    let mut defaulted = job.clone();
    api::apply_defaults(&mut defaulted.spec);
    let old_status = job.status.clone().unwrap_or_default();
    let observed: Vec<ObservedReplica> = target.pods.iter().filter_map(|p| observe_pod(p)).collect();
    let outcome = status::reconcile_status(&Observation {
        namespace: &target.ns,
        name: &target.name,
        spec: &defaulted.spec,
        status: &old_status,
        replicas: &observed,
        invalid: &invalid,
        now,
    });
    let creates = outcome.actions.iter().filter(|a| matches!(a, Action::CreateReplica { .. })).count();
    let runs = invalid.is_empty() && !defaulted.spec.run_policy.suspend;
    Decision { defaulted, runs, old_status, outcome, creates }
}

/// Carries out a decision: the once-per-job objects, the actions, then what the status records
/// of the pods created or refused, and the gang released when the job has just finished.
async fn execute(ctx: &Context, target: &Target<'_>, decision: &mut Decision) -> Result<Executed, Error> {
    // A job started under Kubeflow's training-operator keeps its per-replica Services, which its
    // pods' TF_CONFIG names: it gets no Service (nor NetworkPolicy) of this operator's.
    let layout = plan::AddressLayout::of_pods(target.pods.iter().map(|p| p.as_ref()));
    if !target.finished && decision.runs && layout == plan::AddressLayout::Ours {
        execute::ensure_service(ctx, &target.ns, &decision.defaulted).await?;
    }
    if !target.finished && decision.runs {
        execute::ensure_pod_group(ctx, &target.ns, &decision.defaulted).await?;
        execute::ensure_autoscaler(ctx, &target.ns, &decision.defaulted).await?;
    }
    if !target.finished && decision.defaulted.spec.run_policy.suspend {
        execute::release_pod_group(ctx, &target.ns, &decision.defaulted).await?;
    }
    let held = hold_creations(ctx, target, decision).await?;
    let group = if !target.finished && decision.runs { kueue_group::group_of(ctx, target, &decision.defaulted) } else { None };
    let regrouped = match &group {
        Some(g) => kueue_group::regroup(ctx, target, &mut decision.outcome.actions, g).await?,
        None => false,
    };
    if regrouped {
        decision.creates = 0;
    }
    if decision.creates > 0 {
        // The CA goes in whenever the job's replicas run tfjob-runtime, also while its pods keep
        // Kubeflow's layout (without TLS): once those are gone, pods of this operator's layout
        // mount it from the Secret made now.
        execute::ensure_secret(ctx, target, &decision.defaulted, tfjob_api::tls::job_uses_tls(&decision.defaulted)).await?;
    }
    let mut done = Executed::default();
    let result = execute_actions(ctx, target, decision, group.map(|g| g.group), layout, &mut done).await;
    // Announced also when an action failed half-way: those pods are there, or gone, all the same.
    events::pods_changed(ctx, target.job, &done.created, &done.deleted);
    result?;
    done.held = held || regrouped;
    if ctx.kueue_pod_groups {
        kueue_group::release_finalizers(ctx, &target.pods).await?;
        if !done.job_deleted && (target.finished || status::is_finished(&decision.outcome.status)) {
            kueue_group::end_group(ctx, target).await?;
        }
    }
    if decision.creates > 0 || !done.refused.is_empty() {
        let full_name = format!("{}/{}", target.ns, target.name);
        let status = &mut decision.outcome.status;
        done.job_events.extend(status::record_pod_creations(status, &full_name, decision.creates, &done.refused, (ctx.now)()));
    }
    // A finished job releases its gang: the PodGroup goes with the pods.
    if !done.job_deleted && !target.finished && status::is_finished(&decision.outcome.status) {
        execute::delete_pod_group(ctx, &target.ns, &target.name).await?;
    }
    Ok(done)
}

/// Takes out of the decision the pods that may not be created yet (a Volcano gang not taken in,
/// a Kueue admission for fewer replicas) and says why; `true` when any was held.
async fn hold_creations(ctx: &Context, target: &Target<'_>, decision: &mut Decision) -> Result<bool, Error> {
    if decision.creates == 0 {
        return Ok(false);
    }
    let admissions = admission::admissions(ctx, target, &decision.defaulted).await?;
    let held = admission::hold(&mut decision.outcome.actions, &admissions);
    if held.is_empty() {
        return Ok(false);
    }
    decision.creates = decision.outcome.actions.iter().filter(|a| matches!(a, Action::CreateReplica { .. })).count();
    admission::announce(ctx, target, &held).await;
    Ok(true)
}

/// Each action of the status machine, by the function of its kind, into `done`: the job's events
/// are kept for the commit, the pods created and deleted noted for their Events.
async fn execute_actions(
    ctx: &Context,
    target: &Target<'_>,
    decision: &Decision,
    group: Option<plan::KueuePodGroup>,
    layout: plan::AddressLayout,
    done: &mut Executed,
) -> Result<(), Error> {
    // Planned at the first pod to create, once per reconcile: the cluster spec is written once
    // and each pod's TF_CONFIG only when that pod is sent.
    let mut planner: Option<plan::PodPlanner> = None;
    for action in &decision.outcome.actions {
        match action {
            // After a refused pod, none of the job's other pods is sent in this pass: after an
            // invalid pod the job fails, and what refused one for now (a quota, admission)
            // would refuse the next ones too; the retry starts over.
            Action::CreateReplica { .. } if !done.refused.is_empty() => {}
            Action::CreateReplica { replica_type, index } => {
                let planner =
                    planner.get_or_insert_with(|| plan::PodPlanner::with_layout(&decision.defaulted, &ctx.opts, layout).in_kueue_pod_group(group.clone()));
                if layout == plan::AddressLayout::Kubeflow {
                    execute::ensure_replica_service(ctx, &target.ns, &decision.defaulted, *replica_type, *index).await?;
                }
                if let Some(pod) = planner.pod(*replica_type, *index) {
                    match execute::create_pod(ctx, target, pod).await? {
                        PodCreation::Created(name) => done.created.push(name),
                        PodCreation::Existed => {}
                        PodCreation::Refused(r) => done.refused.push(r),
                    }
                }
            }
            Action::RecreateReplica { name, .. } => {
                ctx.metrics.replica_recreated();
                execute::delete_pod(ctx, target, name, &mut done.deleted).await?;
            }
            Action::DeleteReplica { name } => execute::delete_pod(ctx, target, name, &mut done.deleted).await?,
            Action::Event { .. } => done.job_events.push(action.clone()),
            Action::RequeueAfter(_) => {}
            Action::DeleteJob => {
                execute::delete_job(ctx, target).await?;
                done.job_deleted = true;
            }
        }
    }
    Ok(())
}

//! The commit step of a reconcile: the status written when it changed (conditional on the
//! version of the job it was computed from), the job counters of the conditions it turned true,
//! the job's events once that status is written, and when to look at the job again.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as CtrlAction;
use serde_json::json;
use tfjob_api::api::{self, TFJob, TFJobStatus};
use tfjob_api::status::{Outcome, PodRefusal};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, kerr};
use super::events;
use super::execute::Executed;
use super::target::Target;
use crate::api_errors::{CONFLICT, is_status};
use crate::metrics;

/// The server-side apply body of a status write. It carries the `resourceVersion` of the job the
/// status was computed from, so the API server refuses it (409 Conflict) when the job has changed
/// since: a status computed from a stale cache never overwrites a newer one.
///
/// The training progress and the autoscaler's state are left out: the progress reader
/// ([`crate::progress`]) owns them under a field manager of its own, and a reconcile's copy of
/// them may be older than what it wrote since.
pub fn status_patch(job: &TFJob, status: &TFJobStatus) -> serde_json::Value {
    let status = TFJobStatus { training_progress: None, autoscaler: None, ..status.clone() };
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

/// Commits a reconcile of `target`: writes the outcome's status when it differs from `old` (and
/// the job still exists), then publishes the job's events. Returns when to reconcile again.
pub async fn commit(ctx: &Context, target: &Target<'_>, old: &TFJobStatus, outcome: &Outcome, done: Executed) -> Result<CtrlAction, Error> {
    if !done.job_deleted && status_changed(old, &outcome.status) && !write_status(ctx, target, old, &outcome.status).await? {
        return Ok(CtrlAction::requeue(Duration::from_millis(200)));
    }
    // The state machine's events are published once the status they come with is written: a
    // status computed from a stale copy of the job is refused (409 above) and so are its events,
    // which the next reconcile computes again if they are still due. (Otherwise a `TFJobCreated`
    // or a `Scaled` would be sent again by every reconcile that runs before the watch delivers
    // the status just written.)
    events::job_events(ctx, target.job, done.job_events);
    Ok(requeue(outcome, &done.refused, done.held))
}

/// Writes the job's new status and counts the job events its conditions mean; `false` when the
/// status was computed from a stale copy of the job (nothing written: look again).
async fn write_status(ctx: &Context, target: &Target<'_>, old: &TFJobStatus, new: &TFJobStatus) -> Result<bool, Error> {
    let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &target.ns);
    let patch = status_patch(target.job, new);
    match jobs.patch_status(&target.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
        Ok(written) => {
            if let Some(from) = &target.job.metadata.resource_version {
                ctx.status_writes.wrote(&target.key, from, written.metadata.resource_version.as_deref(), std::time::Instant::now());
            }
        }
        // The status was computed from a stale copy of the job (the watch had not delivered
        // our previous status write yet, or the job changed meanwhile). Writing it would undo
        // the newer status (e.g. lose a `recreated` count or a Restarting condition): look
        // again, from the newer version.
        Err(e) if is_status(&e, CONFLICT) => {
            tracing::debug!(job = %target.name, "status computed from a stale job; reconciling again");
            return Ok(false);
        }
        Err(e) => return Err(kerr("patch status")(e)),
    }
    for event in metrics::job_events(old, new) {
        ctx.metrics.job(&target.ns, event);
    }
    Ok(true)
}

/// When to look at the job again: the status machine's earliest requeue, 10 seconds after a pod
/// refused for now (quota, admission), 5 seconds after creations held for a gang or a queue
/// (a PodGroup's phase is read, not watched); at least 100 ms away.
pub fn requeue(outcome: &Outcome, refused: &[PodRefusal], held: bool) -> CtrlAction {
    let retry = (!refused.is_empty()).then_some(Duration::from_secs(10));
    let held = held.then_some(Duration::from_secs(5));
    match outcome.requeue_after().into_iter().chain(retry).chain(held).min() {
        Some(d) => CtrlAction::requeue(d.max(Duration::from_millis(100))),
        None => CtrlAction::await_change(),
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
        let status = TFJobStatus {
            start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        };
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

//! A job queued in Kueue as a plain pod group (`--kueue-pod-groups`): Kueue's `pod` integration
//! admits the job's pods, not its deprecated TFJob integration. The group and the pods marks are
//! [`tfjob_api::gang`]'s; this reads the job's pods for them and keeps the group's life in step
//! with the job's:
//!
//! - a job scaled after its group formed forms a new one: the old size's pods are deleted, and no
//!   pod of the new size is created before they are gone (Kueue admitted the old size);
//! - Kueue's finalizer on a pod that has ended while being deleted (by the operator, by Kueue's
//!   eviction, by the garbage collector) is taken off, so the pod can be created again under its
//!   name; Kueue counts the replacement instead;
//! - when the job has finished, its pods are marked `retriable-in-group: "false"`: Kueue then
//!   finishes the group (and frees its quota) once the pods left have all ended, without waiting
//!   for every pod to succeed (a ps never does).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tfjob_api::api::TFJob;
use tfjob_api::gang::{self, GroupMember, GroupPlan};
use tfjob_api::plan;
use tfjob_api::status::Action;

use super::admission;
use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, kerr};
use super::events;
use super::execute;
use super::target::Target;
use crate::api_errors::{NOT_FOUND, tolerate};

/// The group of the job's pods, when the operator runs queued jobs as pod groups and this job is
/// queued (labelled `kueue.x-k8s.io/queue-name`).
pub fn group_of(ctx: &Context, target: &Target<'_>, job: &TFJob) -> Option<GroupPlan> {
    if !ctx.kueue_pod_groups {
        return None;
    }
    let members: Vec<GroupMember> = target.pods.iter().map(|p| member(p)).collect();
    let generation = job.metadata.generation.unwrap_or_default();
    gang::kueue_pod_group(&target.name, &target.uid, generation, job.metadata.labels.as_ref(), plan::total_replicas(&job.spec), &members)
}

fn member(pod: &Pod) -> GroupMember {
    GroupMember {
        name: pod.name_any(),
        group: pod.labels().get(gang::KUEUE_POD_GROUP_LABEL).cloned(),
        total: pod.annotations().get(gang::KUEUE_GROUP_TOTAL_ANNOTATION).and_then(|t| t.parse().ok()),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// A job whose size changed since its group formed: deletes the pods of the old size (those
/// the status machine does not delete already) and holds every creation until they are gone;
/// `true` when it held any. The event goes out before the deletions, and also when the old
/// size's pods were being deleted already (by Kueue, by hand) when the change was first seen.
pub async fn regroup(ctx: &Context, target: &Target<'_>, actions: &mut Vec<Action>, group: &GroupPlan) -> Result<bool, Error> {
    if !group.regrouping() {
        return Ok(false);
    }
    tracing::debug!(job = %target.name, group = %group.group.name, stale = ?group.stale, leaving = ?group.leaving, "regrouping");
    let message = format!(
        "the job's size changed since Kueue admitted it: its pods stop, and the job queues again as pod group {} of {} pods",
        group.group.name, group.group.total
    );
    let old_pods: Vec<String> = group.stale.iter().chain(&group.leaving).cloned().collect();
    admission::announce(ctx, target, &[("KueueRegroup", message, old_pods)]).await;
    let deleted_already: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteReplica { name } | Action::RecreateReplica { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let to_delete: Vec<String> = group.stale.iter().filter(|p| !deleted_already.contains(&p.as_str())).cloned().collect();
    let mut deleted = Vec::new();
    let result = async {
        for pod in &to_delete {
            execute::delete_pod(ctx, target, pod, &mut deleted).await?;
        }
        Ok::<(), Error>(())
    }
    .await;
    // Announced also when a deletion failed half-way: the pods deleted before it are gone.
    events::pods_changed(ctx, target.job, &[], &deleted);
    result?;
    actions.retain(|a| !matches!(a, Action::CreateReplica { .. }));
    Ok(true)
}

/// Whether Kueue's finalizer may come off `pod`: it is being deleted and has ended (or never ran).
fn ended_in_deletion(pod: &Pod) -> bool {
    let ended = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
    let never_ran = pod.spec.as_ref().is_none_or(|s| s.node_name.is_none());
    pod.metadata.deletion_timestamp.is_some() && pod.finalizers().iter().any(|f| f == gang::KUEUE_POD_FINALIZER) && (ended || never_ran)
}

/// Takes Kueue's finalizer off each of `pods` that has ended while being deleted.
pub async fn release_finalizers(ctx: &Context, pods: &[Arc<Pod>]) -> Result<(), Error> {
    let patch = json!({ "metadata": { "$deleteFromPrimitiveList/finalizers": [gang::KUEUE_POD_FINALIZER] } });
    for pod in pods.iter().filter(|p| ended_in_deletion(p)) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        tolerate(api.patch(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await, &[NOT_FOUND])
            .map_err(kerr(format!("remove Kueue's finalizer from pod {name}")))?;
        tracing::debug!(pod = %name, "Kueue's finalizer taken off a pod that ended while being deleted");
    }
    Ok(())
}

/// A finished job's group may end: marks each pod of the job in a group
/// `retriable-in-group: "false"` (once).
pub async fn end_group(ctx: &Context, target: &Target<'_>) -> Result<(), Error> {
    let patch = json!({ "metadata": { "annotations": { gang::KUEUE_RETRIABLE_ANNOTATION: "false" } } });
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &target.ns);
    for pod in target.pods.iter().filter(|p| p.labels().contains_key(gang::KUEUE_POD_GROUP_LABEL)) {
        if pod.annotations().get(gang::KUEUE_RETRIABLE_ANNOTATION).map(String::as_str) == Some("false") {
            continue;
        }
        let name = pod.name_any();
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() };
        tolerate(api.patch(&name, &params, &Patch::Merge(&patch)).await, &[NOT_FOUND]).map_err(kerr(format!("end the Kueue pod group of pod {name}")))?;
    }
    Ok(())
}

/// Every `period`, takes Kueue's finalizer off the operator's pods that ended while being
/// deleted, whichever job they were of: a job deleted with its pods is not reconciled any more,
/// and its pods would otherwise wait for ever.
pub async fn sweep_finalizers(ctx: Arc<Context>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let pods = ctx.caches.pods.state();
        // A sweep the API server does not answer is given up (kube's client has no read
        // timeout) and tried again at the next period, as a reconcile is.
        match tokio::time::timeout(ctx.reconcile_timeout, release_finalizers(&ctx, &pods)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing Kueue's finalizers"),
            Err(_) => tracing::warn!("releasing Kueue's finalizers: not finished within {:?}; given up", ctx.reconcile_timeout),
        }
    }
}

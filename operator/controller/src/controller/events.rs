//! The Events a reconcile publishes: about a pod of the job (created, deleted, ...) and about
//! the job itself (the status machine's, once the status they come with is written). They are
//! queued, not awaited: [`super::event_queue`] writes them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};
use tfjob_api::api::TFJob;
use tfjob_api::status::{Action, EventKind};

use super::context::Context;
use super::event_queue::Pending;

/// A reference to a pod of the job (the `related` object of pod events; it also keeps the
/// recorder from folding events about different pods into one series).
fn pod_ref(job: &TFJob, pod: &str) -> ObjectReference {
    ObjectReference { api_version: Some("v1".into()), kind: Some("Pod".into()), name: Some(pod.to_string()), namespace: job.namespace(), ..Default::default() }
}

/// Queues a `Normal` event about pod `pod` of the job.
pub fn pod_event(ctx: &Context, job: &TFJob, reason: &str, message: &str, pod: &str) {
    queue(ctx, job, EventKind::Normal, reason, message, Some(pod_ref(job, pod)));
}

/// Queues the status machine's events ([`Action::Event`]; other actions are skipped).
pub fn job_events(ctx: &Context, job: &TFJob, events: Vec<Action>) {
    for event in events {
        if let Action::Event { kind, reason, message, pod } = event {
            let related = pod.map(|p| pod_ref(job, &p));
            queue(ctx, job, kind, &reason, &message, related);
        }
    }
}

/// Queues an event about the job itself (the progress reader's autoscaler decisions).
pub fn job_event(ctx: &Context, job: &TFJob, kind: EventKind, reason: &str, message: &str) {
    queue(ctx, job, kind, reason, message, None);
}

fn queue(ctx: &Context, job: &TFJob, kind: EventKind, reason: &str, message: &str, related: Option<ObjectReference>) {
    let note = message.chars().take(1000).collect();
    ctx.events.push(Pending { regarding: job.object_ref(&()), kind, reason: reason.to_string(), note, related });
}

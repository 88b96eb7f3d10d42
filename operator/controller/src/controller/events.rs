//! The Events a reconcile publishes: about a pod of the job (created, deleted, ...) and about
//! the job itself (the status machine's, once the status they come with is written).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use tfjob_api::api::TFJob;
use tfjob_api::status::{Action, EventKind};

use super::context::Context;

/// A reference to a pod of the job (the `related` object of pod events; it also keeps the
/// recorder from folding events about different pods into one series).
fn pod_ref(job: &TFJob, pod: &str) -> ObjectReference {
    ObjectReference { api_version: Some("v1".into()), kind: Some("Pod".into()), name: Some(pod.to_string()), namespace: job.namespace(), ..Default::default() }
}

/// Publishes a `Normal` event about pod `pod` of the job.
pub async fn pod_event(ctx: &Context, job: &TFJob, reason: &str, message: &str, pod: &str) {
    publish(ctx, job, EventKind::Normal, reason, message, Some(pod_ref(job, pod))).await;
}

/// Publishes the status machine's events ([`Action::Event`]; other actions are skipped).
pub async fn job_events(ctx: &Context, job: &TFJob, events: Vec<Action>) {
    for event in events {
        if let Action::Event { kind, reason, message, pod } = event {
            let related = pod.map(|p| pod_ref(job, &p));
            publish(ctx, job, kind, &reason, &message, related).await;
        }
    }
}

/// Publishes an event about the job itself (the progress reader's autoscaler decisions).
pub async fn job_event(ctx: &Context, job: &TFJob, kind: EventKind, reason: &str, message: &str) {
    publish(ctx, job, kind, reason, message, None).await;
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

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

/// The longest note an Event may carry (the API server refuses one over 1 kB).
const NOTE_LIMIT: usize = 1000;

/// Queues one Event for the pods a reconcile created (`SuccessfulCreatePod`) and one for those
/// it deleted (`SuccessfulDeletePod`), none for none. One pod gets Kubeflow's Event (`Created
/// pod: NAME`, about that pod); several are named in one Event about the job. One Event per
/// pod, as Kubeflow's controllers write, was 5 of the 19 requests that start a 5-replica job
/// (BENCHMARKS.md, "The operator against its limit").
pub fn pods_changed(ctx: &Context, job: &TFJob, created: &[String], deleted: &[String]) {
    for (reason, verb, pods) in [("SuccessfulCreatePod", "Created", created), ("SuccessfulDeletePod", "Deleted", deleted)] {
        let related = match pods {
            [] => continue,
            [pod] => Some(pod_ref(job, pod)),
            _ => None,
        };
        queue(ctx, job, EventKind::Normal, reason, &pods_note(verb, pods, NOTE_LIMIT), related);
    }
}

/// `Created pod: a` for one pod, `Created 3 pods: a, b, c` for more; the names that do not fit
/// in `limit` characters are counted (`..., and 950 more`).
fn pods_note(verb: &str, pods: &[String], limit: usize) -> String {
    if let [pod] = pods {
        return format!("{verb} pod: {pod}");
    }
    let head = format!("{verb} {} pods", pods.len());
    // Room kept for the longest tail this note can have.
    let room = limit.saturating_sub(head.len() + format!(", and {} more", pods.len()).len());
    let mut listed = String::new();
    let mut shown = 0;
    for pod in pods {
        let sep = if shown == 0 { ": " } else { ", " };
        if listed.len() + sep.len() + pod.len() > room {
            break;
        }
        listed.push_str(sep);
        listed.push_str(pod);
        shown += 1;
    }
    match (shown, pods.len() - shown) {
        (_, 0) => format!("{head}{listed}"),
        (0, _) => head,
        (_, rest) => format!("{head}{listed}, and {rest} more"),
    }
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
    let note = message.chars().take(NOTE_LIMIT).collect();
    ctx.events.push(Pending { regarding: job.object_ref(&()), kind, reason: reason.to_string(), note, related });
}

#[cfg(test)]
mod tests {
    use super::pods_note;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("job-worker-{i}")).collect()
    }

    #[test]
    fn a_pods_note_names_every_pod_that_fits_and_counts_the_rest() {
        let cases: &[(&str, usize, usize, &str)] = &[
            ("one pod reads as Kubeflow's", 1, 1000, "Created pod: job-worker-0"),
            ("two", 2, 1000, "Created 2 pods: job-worker-0, job-worker-1"),
            ("five", 5, 1000, "Created 5 pods: job-worker-0, job-worker-1, job-worker-2, job-worker-3, job-worker-4"),
            ("cut", 5, 60, "Created 5 pods: job-worker-0, job-worker-1, and 3 more"),
            ("no name fits", 3, 20, "Created 3 pods"),
        ];
        for (what, n, limit, want) in cases {
            assert_eq!(pods_note("Created", &names(*n), *limit), *want, "{what}");
        }
    }

    #[test]
    fn a_pods_note_of_thousands_of_pods_stays_within_the_limit() {
        for n in [2, 10, 100, 1000, 10_000] {
            let note = pods_note("Deleted", &names(n), 1000);
            assert!(note.len() <= 1000, "{n} pods: {} chars", note.len());
            assert!(note.starts_with(&format!("Deleted {n} pods: job-worker-0")), "{n}: {note}");
        }
        assert!(pods_note("Deleted", &names(10_000), 1000).ends_with("more"));
    }
}

//! What holds a job's pods back before they are created: a Volcano gang that Volcano has not
//! taken in yet (the phase of its PodGroup), and a job queued in Kueue beyond what its Workload
//! admitted. The decisions are [`tfjob_api::gang`]'s; this reads the objects they are made of,
//! only when a reconcile is about to create pods, and takes the held creations out of the status
//! machine's actions.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use tfjob_api::api::TFJob;
use tfjob_api::gang::{self, Admission, GangScheduler};
use tfjob_api::status::{Action, EventKind};

use super::context::Context;
use super::error::{Error, kerr};
use super::events;
use super::target::Target;
use crate::api_errors::{NOT_FOUND, is_status};

/// The PodGroups of `gang` in namespace `ns`.
pub fn pod_group_api(ctx: &Context, ns: &str, gang: &GangScheduler) -> Api<DynamicObject> {
    let gvk = match gang {
        GangScheduler::Volcano => GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        GangScheduler::SchedulerPlugins(_) => GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup"),
        GangScheduler::Kubernetes => GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup"),
    };
    Api::namespaced_with(ctx.client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "podgroups"))
}

fn workload_api(ctx: &Context, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload");
    Api::namespaced_with(ctx.client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "workloads"))
}

/// What lets the job's pods be created now, each holder on its own (a pod is created when all
/// allow it).
pub async fn admissions(ctx: &Context, target: &Target<'_>, job: &TFJob) -> Result<Vec<Admission>, Error> {
    let mut out = Vec::new();
    if ctx.opts.gang_scheduler == Some(GangScheduler::Volcano) {
        let pg = pod_group_api(ctx, &target.ns, &GangScheduler::Volcano).get_opt(&target.name).await.map_err(kerr("get podgroup"))?;
        // Volcano's PodGroup has no status subresource: the scheduler writes the phase in the
        // object.
        let phase = pg.as_ref().and_then(|pg| pg.data["status"]["phase"].as_str().map(str::to_string));
        out.push(gang::volcano_admission(&target.name, phase.as_deref()));
    }
    // A job in a Kueue pod group waits in its pods' scheduling gate instead.
    if ctx.kueue_admission
        && !ctx.kueue_pod_groups
        && let Some(queue) = gang::kueue_queue(job.metadata.labels.as_ref())
    {
        let selector = format!("{}={}", gang::KUEUE_JOB_UID_LABEL, target.uid);
        match workload_api(ctx, &target.ns).list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                let workloads: Vec<serde_json::Value> = list.items.into_iter().map(|w| serde_json::to_value(w).unwrap_or_default()).collect();
                out.push(gang::kueue_admission(queue, &workloads));
            }
            // Kueue is not installed: its label means nothing here (as under Kubeflow).
            Err(e) if is_status(&e, NOT_FOUND) => {
                tracing::debug!(job = %target.name, queue, "labelled for Kueue, but Kueue's Workloads are not served: not held");
            }
            Err(e) => return Err(kerr("list workloads")(e)),
        }
    }
    Ok(out)
}

/// What held some of a job's pods: (reason, message, the pods held).
pub type Held = (&'static str, String, Vec<String>);

/// Takes out of `actions` the creations an admission holds; returns the holders that held one
/// (reason, message) and the pods held.
pub fn hold(actions: &mut Vec<Action>, admissions: &[Admission]) -> Vec<Held> {
    let mut held: Vec<Held> = Vec::new();
    actions.retain(|a| {
        let Action::CreateReplica { replica_type, index } = a else { return true };
        let Some(Admission::Limited { reason, message, .. }) = admissions.iter().find(|ad| !ad.allows(*replica_type, *index)) else {
            return true;
        };
        let pod = format!("{}-{}", replica_type.lower(), index);
        match held.iter_mut().find(|(r, m, _)| r == reason && m == message) {
            Some((_, _, pods)) => pods.push(pod),
            None => held.push((reason, message.clone(), vec![pod])),
        }
        false
    });
    held
}

/// Says once per job and holder why pods wait (an Event on the job and a log line).
pub async fn announce(ctx: &Context, target: &Target<'_>, held: &[Held]) {
    for (reason, message, pods) in held {
        let key = format!("{}/{reason}/{message}", target.key);
        if ctx.held.contains(&key) {
            continue;
        }
        ctx.held.insert(&key);
        tracing::info!(job = %target.name, reason, pods = ?pods, "{message}");
        events::job_event(ctx, target.job, EventKind::Normal, reason, &format!("{message}; not created yet: {}", pods.join(", ")));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tfjob_api::api::ReplicaType;

    use super::*;

    #[test]
    fn held_creations_leave_the_actions_and_say_why() {
        let create = |t, i| Action::CreateReplica { replica_type: t, index: i };
        let mut actions = vec![
            create(ReplicaType::PS, 0),
            create(ReplicaType::Worker, 0),
            create(ReplicaType::Worker, 2),
            Action::DeleteReplica { name: "j-worker-5".into() },
        ];
        let kueue =
            Admission::Limited { counts: BTreeMap::from([(ReplicaType::PS, 1), (ReplicaType::Worker, 2)]), reason: "ExceedsAdmission", message: "k".into() };
        let held = hold(&mut actions, &[Admission::Open, kueue.clone()]);
        assert_eq!(held, vec![("ExceedsAdmission", "k".to_string(), vec!["worker-2".to_string()])]);
        assert_eq!(actions, vec![create(ReplicaType::PS, 0), create(ReplicaType::Worker, 0), Action::DeleteReplica { name: "j-worker-5".into() }]);
        // A closed gang holds every creation, whatever else allows.
        let gang = gang::volcano_admission("j", Some("Pending"));
        let held = hold(&mut actions, &[kueue, gang]);
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].0, held[0].2.clone()), ("GangPending", vec!["ps-0".to_string(), "worker-0".to_string()]));
        assert_eq!(actions, vec![Action::DeleteReplica { name: "j-worker-5".into() }]);
    }
}

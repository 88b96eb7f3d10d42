//! What a pod of a job is to the status machine: its replica, phase, exit code and reason,
//! restarts, whether it is being deleted or cannot be scheduled. Pure.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tfjob_api::status::{ObservedReplica, Phase};
use tfjob_api::{api, plan};

/// The replica a pod of the job is, as the status machine observes it (`None` for a pod
/// without the replica labels).
pub fn observe_pod(pod: &Pod) -> Option<ObservedReplica> {
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
        disrupted: has_condition(st.and_then(|s| s.conditions.as_deref()), "DisruptionTarget"),
    })
}

/// Whether the pod's condition `type_` is `True`.
fn has_condition(conditions: Option<&[k8s_openapi::api::core::v1::PodCondition]>, type_: &str) -> bool {
    conditions.into_iter().flatten().any(|c| c.type_ == type_ && c.status == "True")
}

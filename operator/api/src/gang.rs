//! Gangs and queues, pure: the PodGroup of a job for Volcano or scheduler-plugins coscheduling
//! (its minimum member count is the smallest viable job; its minimum resources the requests of
//! those members), and what lets the controller create a job's pods now ([`Admission`]): a
//! Volcano gang that is not yet `Inqueue` holds them all, a job queued in Kueue runs at most
//! what its admitted Workload counts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};

use crate::api::{self, ReplicaType, TFJobSpec};
use crate::template::parse_quantity;

/// Label of a job queued in Kueue: the name of its LocalQueue.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Label Kueue puts on the Workload of a job: the job's uid.
pub const KUEUE_JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// Annotation naming a pod's Volcano PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// Annotation naming a pod's Volcano task (its replica type, lower case).
pub const VOLCANO_TASK_ANNOTATION: &str = "volcano.sh/task-spec";
/// Label naming a pod's scheduler-plugins PodGroup.
pub const COSCHEDULING_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Volcano's queue when the job names none.
pub const VOLCANO_DEFAULT_QUEUE: &str = "default";

/// Labels or annotations to put on a pod: (key, value).
pub type Marks = Vec<(&'static str, String)>;

/// Gang scheduling through a PodGroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GangScheduler {
    /// Volcano (`scheduling.volcano.sh/v1beta1` PodGroup, scheduler `volcano`).
    Volcano,
    /// scheduler-plugins coscheduling (`scheduling.x-k8s.io/v1alpha1` PodGroup) with the given
    /// scheduler name.
    SchedulerPlugins(String),
    /// Kubernetes' own gang scheduling (KEP-4671: a `scheduling.k8s.io/v1beta1` PodGroup with a
    /// gang policy, each pod naming it in `spec.schedulingGroup`; kube-scheduler's
    /// `GangScheduling` plugin, behind the `GenericWorkload` feature gate in 1.37).
    Kubernetes,
}

impl GangScheduler {
    /// Parses an operator setting: `volcano`, `kubernetes`, or the name of a scheduler-plugins
    /// scheduler.
    pub fn from_setting(s: &str) -> Option<GangScheduler> {
        match s.trim() {
            "" | "none" => None,
            "volcano" => Some(GangScheduler::Volcano),
            "kubernetes" => Some(GangScheduler::Kubernetes),
            other => Some(GangScheduler::SchedulerPlugins(other.to_string())),
        }
    }

    /// Scheduler name set on the pods (Kubernetes' own gangs: the template's, the default
    /// scheduler unless it names another).
    pub fn scheduler_name(&self) -> Option<&str> {
        match self {
            GangScheduler::Volcano => Some("volcano"),
            GangScheduler::SchedulerPlugins(name) => Some(name),
            GangScheduler::Kubernetes => None,
        }
    }

    /// `apiVersion` of its PodGroups.
    pub fn api_version(&self) -> &'static str {
        match self {
            GangScheduler::Volcano => "scheduling.volcano.sh/v1beta1",
            GangScheduler::SchedulerPlugins(_) => "scheduling.x-k8s.io/v1alpha1",
            GangScheduler::Kubernetes => "scheduling.k8s.io/v1beta1",
        }
    }

    /// The labels and annotations that put a pod of type `rtype` of job `job` in its gang.
    pub fn pod_marks(&self, job: &str, rtype: ReplicaType) -> (Marks, Marks) {
        match self {
            GangScheduler::Volcano => (vec![], vec![(VOLCANO_GROUP_ANNOTATION, job.to_string()), (VOLCANO_TASK_ANNOTATION, rtype.lower().to_string())]),
            GangScheduler::SchedulerPlugins(_) => (vec![(COSCHEDULING_GROUP_LABEL, job.to_string())], vec![]),
            // The pod's `spec.schedulingGroup` names its PodGroup instead.
            GangScheduler::Kubernetes => (vec![], vec![]),
        }
    }
}

/// The replica types in the order a gang counts its members: every type but `Worker` first (a
/// job does not run without its ps, chief and evaluator), then the workers. (Kubeflow orders
/// them by the value of each template's PriorityClass; a pure planner cannot read those.)
fn member_order(spec: &TFJobSpec) -> Vec<(ReplicaType, &api::ReplicaSpec)> {
    let specs = api::replica_specs(spec);
    let (workers, others): (Vec<_>, Vec<_>) = specs.into_iter().partition(|(t, _)| *t == ReplicaType::Worker);
    others.into_iter().chain(workers).collect()
}

/// The gang's minimum member count: `schedulingPolicy.minAvailable` when set; otherwise the
/// smallest viable job: every replica that is not a worker, and the fewest workers the job may
/// have (`elasticPolicy.minReplicas`, 1 by default, for an elastic job; all of them otherwise).
/// Scaling an elastic job's workers up never makes its gang wait again.
pub fn min_member(spec: &TFJobSpec) -> i32 {
    if let Some(n) = spec.run_policy.scheduling_policy.as_ref().and_then(|sp| sp.min_available) {
        return n;
    }
    member_order(spec)
        .into_iter()
        .map(|(t, rs)| match (t, &spec.elastic_policy) {
            (ReplicaType::Worker, Some(policy)) => rs.replicas.max(0).min(policy.min_replicas.unwrap_or(1).max(1)),
            _ => rs.replicas.max(0),
        })
        .sum()
}

/// The gang's minimum resources: `schedulingPolicy.minResources` when set; otherwise the sum of
/// the requests of its first `min_member` members ([`member_order`]), a container's limit
/// standing for a request it does not make (as the API server defaults it). Quantities that do
/// not parse are left out (validation reports them).
pub fn min_resources(spec: &TFJobSpec, min_member: i32) -> BTreeMap<String, Quantity> {
    if let Some(r) = spec.run_policy.scheduling_policy.as_ref().and_then(|sp| sp.min_resources.clone()) {
        return r;
    }
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut left = min_member.max(0);
    for (_, rs) in member_order(spec) {
        let count = rs.replicas.max(0).min(left);
        left -= count;
        let containers = rs.template.spec.iter().flat_map(|s| s.containers.iter());
        for resources in containers.filter_map(|c| c.resources.as_ref()) {
            for (name, value) in pod_requests(resources) {
                *sums.entry(name).or_default() += value * f64::from(count);
            }
        }
    }
    sums.into_iter().filter(|(_, v)| *v > 0.0).map(|(k, v)| (k, Quantity(format_quantity(v)))).collect()
}

/// A container's requests, with its limits standing for the requests it does not make.
fn pod_requests(r: &ResourceRequirements) -> BTreeMap<String, f64> {
    let parse = |m: &Option<BTreeMap<String, Quantity>>| -> BTreeMap<String, f64> {
        m.iter().flatten().filter_map(|(k, q)| parse_quantity(&q.0).map(|v| (k.clone(), v))).collect()
    };
    let mut out = parse(&r.limits);
    out.extend(parse(&r.requests));
    out
}

/// A quantity as Kubernetes writes it: whole numbers as they are, others in thousandths (`2500m`).
fn format_quantity(v: f64) -> String {
    let milli = (v * 1000.0).round();
    if milli % 1000.0 == 0.0 { format!("{}", (milli / 1000.0) as i64) } else { format!("{}m", milli as i64) }
}

/// The `spec` of a job's PodGroup for `gang`. Kubernetes' own PodGroup has a gang's minimum
/// count and nothing else of the others' (no queue, resources or timeout: its scheduler waits a
/// fixed 5 minutes for a gang to fit).
pub fn pod_group_spec(spec: &TFJobSpec, gang: &GangScheduler) -> Value {
    let sp = spec.run_policy.scheduling_policy.clone().unwrap_or_default();
    let members = min_member(spec);
    if *gang == GangScheduler::Kubernetes {
        return json!({"schedulingPolicy": {"gang": {"minCount": members.max(1)}}});
    }
    let mut out = Map::new();
    out.insert("minMember".into(), json!(members));
    let resources = min_resources(spec, members);
    if !resources.is_empty() {
        out.insert("minResources".into(), json!(resources));
    }
    match gang {
        GangScheduler::Volcano => {
            out.insert("queue".into(), json!(sp.queue.as_deref().unwrap_or(VOLCANO_DEFAULT_QUEUE)));
            if let Some(p) = &sp.priority_class {
                out.insert("priorityClassName".into(), json!(p));
            }
        }
        GangScheduler::SchedulerPlugins(_) => {
            if let Some(t) = sp.schedule_timeout_seconds {
                out.insert("scheduleTimeoutSeconds".into(), json!(t));
            }
        }
        GangScheduler::Kubernetes => {}
    }
    Value::Object(out)
}

/// Whether the controller may create a job's pods now.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Nothing holds them.
    Open,
    /// Only replicas below each type's count (a type not named: none); `reason` and `message`
    /// say what holds the others.
    Limited {
        /// Admitted replicas of each type.
        counts: BTreeMap<ReplicaType, i32>,
        /// CamelCase reason of the event that says so.
        reason: &'static str,
        /// Why.
        message: String,
    },
}

impl Admission {
    /// None may be created, for `reason`.
    pub fn closed(reason: &'static str, message: String) -> Admission {
        Admission::Limited { counts: BTreeMap::new(), reason, message }
    }

    /// Whether replica (`rtype`, `index`) may be created.
    pub fn allows(&self, rtype: ReplicaType, index: i32) -> bool {
        match self {
            Admission::Open => true,
            Admission::Limited { counts, .. } => index < counts.get(&rtype).copied().unwrap_or(0),
        }
    }
}

/// What a Volcano PodGroup in `phase` lets through: nothing while Volcano has not taken the gang
/// in (`Pending`, or no phase yet), every pod once it is `Inqueue` or further; as Kubeflow's
/// controller does, so that no pod of a gang that does not fit is ever created.
pub fn volcano_admission(job: &str, phase: Option<&str>) -> Admission {
    match phase.unwrap_or_default() {
        "" | "Pending" => Admission::closed(
            "GangPending",
            format!(
                "waiting for Volcano to take PodGroup {job} in (phase {}): no pod is created before it is Inqueue",
                phase.filter(|p| !p.is_empty()).unwrap_or("none yet")
            ),
        ),
        _ => Admission::Open,
    }
}

/// The LocalQueue a job is queued in, when it carries Kueue's label.
pub fn kueue_queue(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels.and_then(|l| l.get(KUEUE_QUEUE_LABEL)).map(String::as_str).filter(|q| !q.is_empty())
}

/// What the Workloads Kueue keeps for a job (the objects as the API returns them) let through:
/// the counts of the pod sets of the one that is admitted (its `status.admission`), nothing while
/// none is. A job scaled up after its admission therefore never runs more than Kueue admitted:
/// Kueue sees the new pod sets, suspends the job and queues it again.
pub fn kueue_admission(queue: &str, workloads: &[Value]) -> Admission {
    let admitted = workloads.iter().find(|w| condition_true(w, "Admitted") && !condition_true(w, "Finished"));
    let Some(w) = admitted else {
        let pending = workloads.iter().find_map(|w| w["metadata"]["name"].as_str()).unwrap_or("(none yet)");
        return Admission::closed("WaitingForAdmission", format!("waiting for Kueue to admit the job in queue {queue} (workload {pending})"));
    };
    let pod_set_count = |name: &str| {
        let sets = w["spec"]["podSets"].as_array().into_iter().flatten();
        sets.filter(|s| s["name"] == name).find_map(|s| s["count"].as_i64())
    };
    let mut counts = BTreeMap::new();
    for a in w["status"]["admission"]["podSetAssignments"].as_array().into_iter().flatten() {
        let Some(name) = a["name"].as_str() else { continue };
        let Some(rtype) = ReplicaType::parse(name) else { continue };
        let count = a["count"].as_i64().or_else(|| pod_set_count(name)).unwrap_or(0);
        counts.insert(rtype, i32::try_from(count).unwrap_or(i32::MAX));
    }
    let name = w["metadata"]["name"].as_str().unwrap_or_default();
    let admitted: Vec<String> = counts.iter().map(|(t, n)| format!("{} {n}", t.as_str())).collect();
    Admission::Limited {
        counts,
        reason: "ExceedsAdmission",
        message: format!(
            "Kueue admitted {} (workload {name}, queue {queue}); the pods beyond it wait until Kueue admits the job's new size",
            admitted.join(", ")
        ),
    }
}

/// Label that puts a pod under Kueue's pod integration (its webhook would add it).
pub const KUEUE_MANAGED_LABEL: &str = "kueue.x-k8s.io/managed";
/// Label naming a pod's Kueue pod group (the name of the group's Workload).
pub const KUEUE_POD_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// Annotation: how many pods the group has.
pub const KUEUE_GROUP_TOTAL_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";
/// Annotation: the pod's role in the group (Kueue's pod set; the replica type, lower case).
pub const KUEUE_ROLE_HASH_ANNOTATION: &str = "kueue.x-k8s.io/role-hash";
/// Annotation that lets Kueue finish a group whose remaining pods have all ended.
pub const KUEUE_RETRIABLE_ANNOTATION: &str = "kueue.x-k8s.io/retriable-in-group";
/// Scheduling gate Kueue removes when it admits the group.
pub const KUEUE_ADMISSION_GATE: &str = "kueue.x-k8s.io/admission";
/// Finalizer with which Kueue keeps count of a group's pods.
pub const KUEUE_POD_FINALIZER: &str = "kueue.x-k8s.io/managed";
/// Label naming a job's (and a group's) WorkloadPriorityClass.
pub const KUEUE_PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";

/// A job queued in Kueue as a plain pod group (Kueue's `pod` integration, which does not need
/// its deprecated TFJob integration): every pod of the job is a member of one group, created
/// gated, with what Kueue's pod webhook would have written on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KueuePodGroup {
    /// The group's name (and its Workload's).
    pub name: String,
    /// The LocalQueue.
    pub queue: String,
    /// Pods in the group: every replica of the job.
    pub total: i32,
    /// The job's WorkloadPriorityClass label, copied to its pods.
    pub priority_class: Option<String>,
}

impl KueuePodGroup {
    /// The labels and annotations of a pod of type `rtype` in the group. Its role (Kueue's pod
    /// set) is its replica type, named rather than hashed from the spec: Kueue's own hash would
    /// change when admission writes a flavour's nodeSelector on the pod.
    pub fn pod_marks(&self, rtype: ReplicaType) -> (Marks, Marks) {
        let mut labels = vec![(KUEUE_MANAGED_LABEL, "true".to_string()), (KUEUE_QUEUE_LABEL, self.queue.clone()), (KUEUE_POD_GROUP_LABEL, self.name.clone())];
        if let Some(p) = &self.priority_class {
            labels.push((KUEUE_PRIORITY_LABEL, p.clone()));
        }
        let annotations = vec![(KUEUE_GROUP_TOTAL_ANNOTATION, self.total.to_string()), (KUEUE_ROLE_HASH_ANNOTATION, rtype.lower().to_string())];
        (labels, annotations)
    }
}

/// A pod of a job as its Kueue pod group sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// Pod name.
    pub name: String,
    /// Its group label, if any.
    pub group: Option<String>,
    /// Its group's total count, if any.
    pub total: Option<i32>,
    /// Being deleted.
    pub terminating: bool,
}

/// The group a queued job's pods are created in, and the pods of an earlier group to delete
/// before any is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPlan {
    /// The group of the pods to create.
    pub group: KueuePodGroup,
    /// Pods that are not in it (an earlier size of the job): deleted first, and no pod is
    /// created while they are there.
    pub stale: Vec<String>,
    /// Pods not in it that are being deleted already (by the operator's own regroup, by
    /// Kueue, by hand): no pod is created while they are there either.
    pub leaving: Vec<String>,
}

impl GroupPlan {
    /// The job is changing groups: pods of another group or size are still there, live or
    /// being deleted.
    pub fn regrouping(&self) -> bool {
        !self.stale.is_empty() || !self.leaving.is_empty()
    }
}

/// The name of the group a job forms at spec `generation`: the job's name (cut to fit a label
/// value), its uid's first 8 characters (a job deleted and created again under the same name
/// forms another group) and the generation (a scaled job forms a new group).
pub fn kueue_group_name(job: &str, uid: &str, generation: i64) -> String {
    let suffix = format!("-{}-g{generation}", uid.chars().take(8).collect::<String>());
    let room = 63usize.saturating_sub(suffix.len());
    let head: String = job.chars().take(room).collect();
    format!("{}{suffix}", head.trim_end_matches(['-', '.']))
}

/// The group of a job labelled for Kueue (`None` when it is not): the group its live pods are
/// in when it still has the job's size (a pod created again after a failure or a preemption
/// joins it), a new one otherwise. Pods of a group of another size are stale: Kueue admitted
/// that size, so the job forms its new group only once they are gone (a scale of a queued job
/// restarts its pods, as under Kueue's TFJob integration).
pub fn kueue_pod_group(
    job: &str,
    uid: &str,
    generation: i64,
    labels: Option<&BTreeMap<String, String>>,
    total: i32,
    members: &[GroupMember],
) -> Option<GroupPlan> {
    let queue = kueue_queue(labels)?.to_string();
    let priority_class = labels.and_then(|l| l.get(KUEUE_PRIORITY_LABEL)).cloned();
    let live: Vec<&GroupMember> = members.iter().filter(|m| !m.terminating).collect();
    // Pods created again join the group of this size (live pods first: the pods being deleted
    // may be of an earlier group of the same size).
    let of_size = |m: &&GroupMember| m.total == Some(total) && m.group.is_some();
    let current = live.iter().copied().find(of_size).or_else(|| members.iter().find(of_size)).and_then(|m| m.group.clone());
    let name = current.unwrap_or_else(|| kueue_group_name(job, uid, generation));
    let other = |m: &&GroupMember| m.group.as_deref() != Some(&name) || m.total != Some(total);
    let (leaving, stale): (Vec<&GroupMember>, Vec<&GroupMember>) = members.iter().filter(other).partition(|m| m.terminating);
    let names = |ms: Vec<&GroupMember>| ms.into_iter().map(|m| m.name.clone()).collect();
    Some(GroupPlan { group: KueuePodGroup { name, queue, total, priority_class }, stale: names(stale), leaving: names(leaving) })
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == kind && c["status"] == "True")
}

#[cfg(test)]
mod tests;

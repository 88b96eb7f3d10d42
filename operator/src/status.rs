//! Pure status state machine: observed replicas in, new status and actions out.
//!
//! [`reconcile_status`] follows Kubeflow's TFJob rules (Running, success, failure, restarts,
//! cleanPodPolicy, suspend, TTL) and fixes Kubeflow's known problems: `Succeeded` and `Failed`
//! are never both true, `activeDeadlineSeconds` asks for a requeue at the deadline,
//! `backoffLimit` bounds every restart (pods recreated under `ExitCode` too), and every
//! transition emits an Event. It uses no client: a Kubernetes, container or process backend
//! feeds it plain observations and executes the returned [`Action`]s.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    self, CleanPodPolicy, JobCondition, ReplicaStatus, ReplicaType, RestartPolicy, SuccessPolicy,
    TFJobSpec, TFJobStatus,
};
use crate::plan;

/// Condition type `Created`.
pub const CREATED: &str = "Created";
/// Condition type `Running`.
pub const RUNNING: &str = "Running";
/// Condition type `Restarting`.
pub const RESTARTING: &str = "Restarting";
/// Condition type `Succeeded`.
pub const SUCCEEDED: &str = "Succeeded";
/// Condition type `Suspended`.
pub const SUSPENDED: &str = "Suspended";
/// Condition type `Failed`.
pub const FAILED: &str = "Failed";

/// Phase of an observed replica (the pod phase, or its process equivalent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Created, not running yet.
    Pending,
    /// Running.
    Running,
    /// Exited successfully (will not run again).
    Succeeded,
    /// Exited with failure (will not run again by itself).
    Failed,
    /// State unknown (node lost): neither counted nor acted upon.
    Unknown,
}

/// One replica as observed by the backend.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedReplica {
    /// Replica type (pods of unknown types are not reported).
    pub replica_type: ReplicaType,
    /// Index.
    pub index: i32,
    /// Pod / process name.
    pub name: String,
    /// Phase.
    pub phase: Phase,
    /// Exit code of the `tensorflow` container when it has terminated.
    pub exit_code: Option<i32>,
    /// In-place restarts of the `tensorflow` container.
    pub restart_count: i32,
    /// Being deleted: not counted, not recreated until gone.
    pub terminating: bool,
}

/// Everything the state machine needs to know about a job at one instant.
#[derive(Clone, Debug)]
pub struct Observation<'a> {
    /// Namespace (for messages; use `default` or any label locally).
    pub namespace: &'a str,
    /// Job name.
    pub name: &'a str,
    /// The (defaulted) spec.
    pub spec: &'a TFJobSpec,
    /// The status as last written.
    pub status: &'a TFJobStatus,
    /// Observed replicas.
    pub replicas: &'a [ObservedReplica],
    /// Validation problems of the spec; when non-empty the job is failed.
    pub invalid: &'a [api::FieldError],
    /// The current time.
    pub now: Timestamp,
}

/// Severity of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// What the backend must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create replica (`replica_type`, `index`) from the current plan.
    CreateReplica {
        /// Type.
        replica_type: ReplicaType,
        /// Index.
        index: i32,
    },
    /// Delete a replica (scale-down, cleanup, suspend).
    DeleteReplica {
        /// Pod / process name.
        name: String,
    },
    /// Delete a failed replica so that it is created again (from the current plan).
    RecreateReplica {
        /// Pod / process name.
        name: String,
        /// Type.
        replica_type: ReplicaType,
        /// Index.
        index: i32,
    },
    /// Record an event on the job.
    Event {
        /// Severity.
        kind: EventKind,
        /// CamelCase reason.
        reason: String,
        /// Message.
        message: String,
    },
    /// Look at the job again after this long even if nothing changes.
    RequeueAfter(Duration),
    /// Delete the job itself (TTL after finish expired).
    DeleteJob,
}

/// Result of [`reconcile_status`].
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The new status to write.
    pub status: TFJobStatus,
    /// Actions, in order.
    pub actions: Vec<Action>,
}

impl Outcome {
    /// The shortest requested requeue, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::RequeueAfter(d) => Some(*d),
                _ => None,
            })
            .min()
    }
}

/// Whether a condition of this type is currently true.
pub fn has_condition(status: &TFJobStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Whether the job has finished (succeeded or failed).
pub fn is_finished(status: &TFJobStatus) -> bool {
    has_condition(status, SUCCEEDED) || has_condition(status, FAILED)
}

/// The phase shown for a job: the type of the last true condition (`Created` when none).
pub fn job_phase(status: &TFJobStatus) -> &str {
    status
        .conditions
        .iter()
        .rev()
        .find(|c| c.status == "True")
        .map(|c| c.type_.as_str())
        .unwrap_or(CREATED)
}

/// Whether an exit code of the `tensorflow` container is retryable under `ExitCode` (>= 128:
/// killed by a signal, e.g. preemption or OOM). Unknown codes are retryable.
pub fn is_retryable_exit_code(code: Option<i32>) -> bool {
    code.is_none_or(|c| c >= 128)
}

struct Machine<'a> {
    obs: &'a Observation<'a>,
    status: TFJobStatus,
    actions: Vec<Action>,
    now: Time,
}

impl<'a> Machine<'a> {
    fn kind_name(&self) -> String {
        format!("{}/{}", self.obs.namespace, self.obs.name)
    }

    fn event(&mut self, kind: EventKind, reason: &str, message: &str) {
        self.actions.push(Action::Event {
            kind,
            reason: reason.to_string(),
            message: message.to_string(),
        });
    }

    /// Kubeflow's `UpdateJobConditions`: no change when a condition of that type already has the
    /// same status and reason; otherwise Running and Restarting replace each other, a terminal
    /// (or Suspended) condition turns Running and Restarting false, and the new condition goes
    /// last. Returns whether anything
    /// changed.
    fn set_condition(&mut self, type_: &str, status: &str, reason: &str, message: &str) -> bool {
        if let Some(c) = self.status.conditions.iter().find(|c| c.type_ == type_)
            && c.status == status
            && c.reason.as_deref() == Some(reason)
        {
            return false;
        }
        let now = self.now.clone();
        let mut kept = Vec::new();
        for mut c in std::mem::take(&mut self.status.conditions) {
            if c.type_ == type_
                || (type_ == RESTARTING && c.type_ == RUNNING)
                || (type_ == RUNNING && c.type_ == RESTARTING)
            {
                continue;
            }
            if (type_ == FAILED || type_ == SUCCEEDED || type_ == SUSPENDED)
                && (c.type_ == RUNNING || c.type_ == RESTARTING)
                && c.status == "True"
            {
                c.status = "False".into();
                c.last_update_time = Some(now.clone());
                c.last_transition_time = Some(now.clone());
            }
            kept.push(c);
        }
        kept.push(JobCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
        self.status.conditions = kept;
        true
    }

    fn finish(&mut self, type_: &str, reason: &str, message: &str) {
        if self.set_condition(type_, "True", reason, message) {
            let kind = if type_ == SUCCEEDED {
                EventKind::Normal
            } else {
                EventKind::Warning
            };
            self.event(kind, reason, message);
        }
        if self.status.completion_time.is_none() {
            self.status.completion_time = Some(self.now.clone());
        }
        self.terminal();
    }

    /// After the end: cleanPodPolicy and TTL.
    fn terminal(&mut self) {
        let policy = &self.obs.spec.run_policy.clean_pod_policy;
        for r in self.obs.replicas.iter().filter(|r| !r.terminating) {
            let delete = match policy {
                CleanPodPolicy::All => true,
                CleanPodPolicy::Running | CleanPodPolicy::Unsupported(_) => {
                    matches!(r.phase, Phase::Running | Phase::Pending)
                }
                CleanPodPolicy::None => false,
            };
            if delete {
                self.actions.push(Action::DeleteReplica {
                    name: r.name.clone(),
                });
            }
        }
        if let Some(ttl) = self.obs.spec.run_policy.ttl_seconds_after_finished {
            let done = self
                .status
                .completion_time
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(self.obs.now);
            let elapsed = self.obs.now.duration_since(done).as_secs_f64().max(0.0);
            let ttl = f64::from(ttl.max(0));
            if elapsed >= ttl {
                self.actions.push(Action::DeleteJob);
            } else {
                self.actions
                    .push(Action::RequeueAfter(Duration::from_secs_f64(ttl - elapsed)));
            }
        }
    }
}

/// Computes the new status of a job and the actions that move it forward.
///
/// Input is plain data ([`Observation`]): the spec, the previous status, the replicas as seen
/// (type, index, phase, exit code of the `tensorflow` container, restart count) and "now".
/// Output ([`Outcome`]) is the status to write and the [`Action`]s to execute: create, delete
/// or recreate replicas, emit events, requeue after a delay, delete the job. Calling it again
/// with the new status and the same observation is a no-op apart from `lastReconcileTime`.
pub fn reconcile_status(obs: &Observation<'_>) -> Outcome {
    let mut m = Machine {
        obs,
        status: obs.status.clone(),
        actions: Vec::new(),
        now: Time(obs.now),
    };
    m.status.last_reconcile_time = Some(m.now.clone());
    let name = obs.name;
    let full = m.kind_name();
    if !m.status.conditions.iter().any(|c| c.type_ == CREATED) {
        let msg = format!("TFJob {name} is created.");
        m.set_condition(CREATED, "True", "TFJobCreated", &msg);
        m.event(EventKind::Normal, "TFJobCreated", &msg);
    }

    if is_finished(&m.status) {
        m.terminal();
        return m.into_outcome();
    }

    if !obs.invalid.is_empty() {
        let problems = obs
            .invalid
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let msg = format!("TFJob {full} is not valid: {problems}");
        m.finish(FAILED, "TFJobFailedValidation", &msg);
        return m.into_outcome();
    }

    let spec = obs.spec;
    let specs = api::replica_specs(spec);

    // Suspend: delete every replica, keep the job.
    if spec.run_policy.suspend {
        for r in obs.replicas.iter().filter(|r| !r.terminating) {
            m.actions.push(Action::DeleteReplica {
                name: r.name.clone(),
            });
        }
        let msg = format!("TFJob {full} is suspended.");
        if m.set_condition(SUSPENDED, "True", "TFJobSuspended", &msg) {
            m.event(EventKind::Normal, "TFJobSuspended", &msg);
        }
        for rs in m.status.replica_statuses.values_mut() {
            rs.active = 0;
        }
        return m.into_outcome();
    }
    if has_condition(&m.status, SUSPENDED) {
        let msg = format!("TFJob {full} is resumed.");
        m.set_condition(SUSPENDED, "False", "TFJobResumed", &msg);
        m.event(EventKind::Normal, "TFJobResumed", &msg);
        m.status.start_time = Some(m.now.clone());
    }
    if m.status.start_time.is_none() {
        m.status.start_time = Some(m.now.clone());
    }

    // Active deadline: fail at the deadline, otherwise come back exactly then.
    if let Some(ads) = spec.run_policy.active_deadline_seconds {
        let start = m.status.start_time.as_ref().map(|t| t.0).unwrap_or(obs.now);
        let elapsed = obs.now.duration_since(start).as_secs_f64().max(0.0);
        let limit = ads.max(0) as f64;
        if elapsed >= limit {
            let msg = format!(
                "TFJob {full} has failed because it was active longer than specified deadline"
            );
            m.finish(FAILED, "TFJobFailed", &msg);
            return m.into_outcome();
        }
        m.actions.push(Action::RequeueAfter(Duration::from_secs_f64(
            limit - elapsed,
        )));
    }

    // Replica counts and per-replica decisions.
    let mut replica_statuses: BTreeMap<String, ReplicaStatus> = BTreeMap::new();
    let mut permanent_failures: Vec<(ReplicaType, i32)> = Vec::new();
    let mut to_recreate: Vec<&ObservedReplica> = Vec::new();
    let mut in_place_restarts: i64 = 0;
    let dynamic = spec.enable_dynamic_worker.unwrap_or(false);
    // Observed replicas by (type, index), in observation order: one pass, not one per index.
    let mut observed: HashMap<(ReplicaType, i32), Vec<&ObservedReplica>> = HashMap::new();
    for r in obs.replicas {
        observed
            .entry((r.replica_type, r.index))
            .or_default()
            .push(r);
    }
    for (&rtype, rs) in &specs {
        let prev = m.status.replica_statuses.get(rtype.as_str());
        let mut st = ReplicaStatus {
            selector: Some(plan::replica_selector(name, rtype)),
            recreated: prev.map(|p| p.recreated).unwrap_or(0),
            ..Default::default()
        };
        for index in 0..rs.replicas.max(0) {
            let here = observed.get(&(rtype, index)).map_or(&[][..], Vec::as_slice);
            if here.is_empty() {
                m.actions.push(Action::CreateReplica {
                    replica_type: rtype,
                    index,
                });
                continue;
            }
            for r in here.iter().filter(|r| !r.terminating) {
                in_place_restarts += i64::from(r.restart_count.max(0));
                match r.phase {
                    Phase::Running => st.active += 1,
                    Phase::Succeeded => st.succeeded += 1,
                    Phase::Failed => {
                        st.failed += 1;
                        let restart = match rs.restart_policy {
                            RestartPolicy::Always | RestartPolicy::OnFailure => true,
                            RestartPolicy::ExitCode => is_retryable_exit_code(r.exit_code),
                            RestartPolicy::Never | RestartPolicy::Unsupported(_) => false,
                        };
                        if restart {
                            to_recreate.push(r);
                        } else if !(dynamic && rtype == ReplicaType::Worker) {
                            permanent_failures.push((rtype, index));
                        }
                    }
                    Phase::Pending | Phase::Unknown => {}
                }
            }
        }
        replica_statuses.insert(rtype.as_str().to_string(), st);
    }
    // Scale-down and stray replicas: out-of-range indices or types no longer in the spec.
    for r in obs.replicas.iter().filter(|r| !r.terminating) {
        let wanted = specs
            .get(&r.replica_type)
            .is_some_and(|rs| r.index < rs.replicas.max(0));
        if !wanted {
            m.actions.push(Action::DeleteReplica {
                name: r.name.clone(),
            });
        }
    }
    m.status.replica_statuses = replica_statuses;

    // Success first: a job whose chief (or worker 0 / all workers) succeeded has succeeded,
    // whatever happened to other replicas; Succeeded and Failed are never both set.
    let has_chief = specs.keys().any(|t| t.is_chief());
    let count = |t: ReplicaType, f: fn(&ReplicaStatus) -> i32| {
        m.status
            .replica_statuses
            .get(t.as_str())
            .map(f)
            .unwrap_or(0)
    };
    let succeeded = if has_chief {
        specs
            .iter()
            .filter(|(t, _)| t.is_chief())
            .all(|(t, rs)| count(*t, |s| s.succeeded) >= rs.replicas)
    } else {
        let workers = specs
            .get(&ReplicaType::Worker)
            .map(|rs| rs.replicas)
            .unwrap_or(0);
        let all = count(ReplicaType::Worker, |s| s.succeeded) >= workers;
        let worker0 = obs.replicas.iter().any(|r| {
            r.replica_type == ReplicaType::Worker
                && r.index == 0
                && !r.terminating
                && r.phase == Phase::Succeeded
                && r.exit_code.unwrap_or(0) == 0
        });
        all || (worker0 && spec.success_policy != Some(SuccessPolicy::AllWorkers))
    };
    if succeeded {
        m.actions
            .retain(|a| !matches!(a, Action::CreateReplica { .. }));
        let msg = format!("TFJob {full} successfully completed.");
        m.finish(SUCCEEDED, "TFJobSucceeded", &msg);
        return m.into_outcome();
    }

    if let Some(&(rtype, _)) = permanent_failures.first() {
        let n = permanent_failures
            .iter()
            .filter(|(t, _)| *t == rtype)
            .count();
        m.actions
            .retain(|a| !matches!(a, Action::CreateReplica { .. }));
        let msg = format!("TFJob {full} has failed because {n} {rtype} replica(s) failed.");
        m.finish(FAILED, "TFJobFailed", &msg);
        return m.into_outcome();
    }

    // Backoff limit bounds every restart: in place (kubelet) and recreations (controller).
    let recreated: i64 = m
        .status
        .replica_statuses
        .values()
        .map(|s| i64::from(s.recreated))
        .sum();
    let restarts = in_place_restarts + recreated;
    if let Some(limit) = spec.run_policy.backoff_limit {
        let limit = i64::from(limit.max(0));
        if restarts > limit
            || (!to_recreate.is_empty() && restarts + to_recreate.len() as i64 > limit)
        {
            m.actions
                .retain(|a| !matches!(a, Action::CreateReplica { .. }));
            let msg = format!(
                "TFJob {full} has failed because it has reached the specified backoff limit"
            );
            m.finish(FAILED, "TFJobFailed", &msg);
            return m.into_outcome();
        }
    }

    if !to_recreate.is_empty() {
        let mut by_type: BTreeMap<ReplicaType, i32> = BTreeMap::new();
        for r in &to_recreate {
            *by_type.entry(r.replica_type).or_default() += 1;
            m.actions.push(Action::RecreateReplica {
                name: r.name.clone(),
                replica_type: r.replica_type,
                index: r.index,
            });
        }
        for (t, n) in &by_type {
            if let Some(s) = m.status.replica_statuses.get_mut(t.as_str()) {
                s.recreated += n;
            }
        }
        let (t, n) = by_type
            .iter()
            .next()
            .map(|(t, n)| (*t, *n))
            .unwrap_or((ReplicaType::Worker, 0));
        let msg = format!("TFJob {full} is restarting because {n} {t} replica(s) failed.");
        if m.set_condition(RESTARTING, "True", "TFJobRestarting", &msg) {
            m.event(EventKind::Warning, "TFJobRestarting", &msg);
        }
        return m.into_outcome();
    }

    let running = if has_chief {
        specs
            .keys()
            .filter(|t| t.is_chief())
            .any(|t| count(*t, |s| s.active) > 0)
    } else {
        count(ReplicaType::Worker, |s| s.active) > 0
    };
    if running {
        let msg = format!("TFJob {full} is running.");
        if m.set_condition(RUNNING, "True", "TFJobRunning", &msg) {
            m.event(EventKind::Normal, "TFJobRunning", &msg);
        }
    }
    m.into_outcome()
}

impl Machine<'_> {
    fn into_outcome(self) -> Outcome {
        Outcome {
            status: self.status,
            actions: self.actions,
        }
    }
}

#[cfg(test)]
mod tests;

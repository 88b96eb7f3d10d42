//! Pure status state machine: observed replicas in, new status and actions out.
//!
//! [`reconcile_status`] follows Kubeflow's TFJob rules (Running, success, failure, restarts,
//! cleanPodPolicy, suspend, TTL) and fixes Kubeflow's known problems: `Succeeded` and `Failed`
//! are never both true, `activeDeadlineSeconds` asks for a requeue at the deadline,
//! `backoffLimit` bounds every restart (pods recreated under `ExitCode` too) but those of pods
//! the cluster stopped (evicted, preempted: `DisruptionTarget`, recreated whatever the exit
//! code), every
//! transition emits an Event, a scale emits one `Scaled` event, and a job whose dynamic workers
//! (`enableDynamicWorker`) all failed fails instead of hanging. It uses no client: a Kubernetes,
//! container or process backend feeds it plain observations and executes the returned
//! [`Action`]s.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{self, CleanPodPolicy, JobCondition, ReplicaStatus, ReplicaType, RestartPolicy, SuccessPolicy, TFJobSpec, TFJobStatus};
use crate::field::FieldError;
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
/// Condition type `Unschedulable`: some pod of the job cannot be scheduled (not a phase).
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// Condition type `ReplicaFailure`: the API server refuses to create a pod of the job for now
/// (quota, admission); not a phase. The name and meaning are a ReplicaSet's.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// The condition types that are phases of a job ([`job_phase`]); the others ([`UNSCHEDULABLE`],
/// [`REPLICA_FAILURE`]) say something about the job's pods.
pub const PHASES: [&str; 6] = [CREATED, RUNNING, RESTARTING, SUCCEEDED, SUSPENDED, FAILED];

/// Event reason of a terminated `tensorflow` container (Kubeflow's).
pub const EXITED_WITH_CODE: &str = "ExitedWithCode";
/// Event reason of a pod the API server refused (Kubeflow's).
pub const FAILED_CREATE_POD: &str = "FailedCreatePod";
/// Reason of the `Failed` condition of a job whose runner was stopped (`tfjob run` and Ctrl-C).
pub const INTERRUPTED: &str = "Interrupted";

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
    /// Why the `tensorflow` container last terminated, as the kubelet says (`Error`,
    /// `OOMKilled`, `Completed`), or why the pod failed without it (`Evicted: ...`).
    pub exit_reason: Option<String>,
    /// In-place restarts of the `tensorflow` container.
    pub restart_count: i32,
    /// Being deleted: not counted, not recreated until gone.
    pub terminating: bool,
    /// The scheduler's message while the pod cannot be scheduled (its `PodScheduled` condition
    /// is `False` with reason `Unschedulable`).
    pub unschedulable: Option<String>,
    /// Stopped by the cluster, not by its program: evicted, preempted, its node lost (the pod's
    /// `DisruptionTarget` condition). Recreated under `ExitCode` whatever the exit code, and not
    /// counted towards `backoffLimit`.
    pub disrupted: bool,
}

impl ObservedReplica {
    /// `pod job-worker-1 exited with code 137 (OOMKilled)`, or `pod job-worker-1 failed
    /// (Evicted: ...)` when no exit code is known.
    pub fn failure(&self) -> String {
        let reason = self.exit_reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        match self.exit_code {
            Some(code) => format!("pod {} exited with code {code}{reason}", self.name),
            None => format!("pod {} failed{reason}", self.name),
        }
    }
}

/// The failures of `failed`, at most five named: `pod a exited with code 1 (Error); pod b ...
/// (and 3 more)`.
fn describe_failures(failed: &[&ObservedReplica]) -> String {
    const NAMED: usize = 5;
    let mut text: Vec<String> = failed.iter().take(NAMED).map(|r| r.failure()).collect();
    if failed.len() > NAMED {
        text.push(format!("and {} more", failed.len() - NAMED));
    }
    text.join("; ")
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
    pub invalid: &'a [FieldError],
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
        /// The pod the event is about, if any (the event's related object).
        pod: Option<String>,
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
    status.conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// The condition that says the job has finished: its first true `Succeeded` or `Failed`.
pub fn final_condition(status: &TFJobStatus) -> Option<&JobCondition> {
    status.conditions.iter().find(|c| c.status == "True" && (c.type_ == SUCCEEDED || c.type_ == FAILED))
}

/// Whether the job has finished (succeeded or failed).
pub fn is_finished(status: &TFJobStatus) -> bool {
    final_condition(status).is_some()
}

/// The phase of a job: the type of the last true condition that is a phase ([`PHASES`];
/// `Created` when none).
pub fn job_phase(status: &TFJobStatus) -> &str {
    status.conditions.iter().rev().find(|c| c.status == "True" && PHASES.contains(&c.type_.as_str())).map(|c| c.type_.as_str()).unwrap_or(CREATED)
}

/// Whether an exit code of the `tensorflow` container is retryable under `ExitCode` (>= 128:
/// killed by a signal, e.g. preemption or OOM). Unknown codes are retryable.
pub fn is_retryable_exit_code(code: Option<i32>) -> bool {
    code.is_none_or(|c| c >= 128)
}

struct Machine<'a> {
    obs: &'a Observation<'a>,
    /// The replica sets of the spec by type.
    specs: BTreeMap<ReplicaType, &'a api::ReplicaSpec>,
    /// `<namespace>/<name>`, as messages name the job.
    full_name: String,
    status: TFJobStatus,
    actions: Vec<Action>,
    now: Time,
}

/// What counting the observed replicas against the spec found.
#[derive(Default)]
struct Tally<'o> {
    /// Replica count planned per type ([`api::planned_replicas`]).
    planned: BTreeMap<ReplicaType, i32>,
    /// Replicas that failed and must not be restarted (dynamic workers aside).
    permanent_failures: Vec<&'o ObservedReplica>,
    /// Workers that failed for good and are tolerated for now (`enableDynamicWorker`,
    /// `workerShares.failedPercent`).
    failed_dynamic_workers: Vec<&'o ObservedReplica>,
    /// Failed replicas that their restart policy recreates.
    to_recreate: Vec<&'o ObservedReplica>,
    /// In-place restarts of the `tensorflow` containers (the kubelet's).
    in_place_restarts: i64,
    /// Replicas restarted in place at least once (for the message of the backoff limit).
    restarted: Vec<&'o ObservedReplica>,
    /// Pending replicas the scheduler cannot place.
    unschedulable: Vec<&'o ObservedReplica>,
}

impl<'o> Tally<'o> {
    /// Counts one replica (not being deleted) into its type's status `st`, and sorts it by what
    /// happens next: restarted in place, recreated after a failure (its `restart_policy`
    /// says so), a failed dynamic worker, a permanent failure, or unschedulable.
    fn count(&mut self, st: &mut ReplicaStatus, r: &'o ObservedReplica, restart_policy: &RestartPolicy, dynamic_worker: bool) {
        self.in_place_restarts += i64::from(r.restart_count.max(0));
        if r.restart_count > 0 {
            self.restarted.push(r);
        }
        match r.phase {
            Phase::Running => st.active += 1,
            Phase::Succeeded => st.succeeded += 1,
            Phase::Failed => {
                st.failed += 1;
                if restarts_after_failure(restart_policy, r) {
                    self.to_recreate.push(r);
                } else if dynamic_worker {
                    self.failed_dynamic_workers.push(r);
                } else {
                    self.permanent_failures.push(r);
                }
            }
            Phase::Pending if r.unschedulable.is_some() => self.unschedulable.push(r),
            Phase::Pending | Phase::Unknown => {}
        }
    }
}

impl<'a> Machine<'a> {
    fn event(&mut self, kind: EventKind, reason: &str, message: &str) {
        self.actions.push(event(kind, reason, message, None));
    }

    fn set_condition(&mut self, type_: &str, status: &str, reason: &str, message: &str) -> bool {
        set_condition(&mut self.status, &self.now, type_, status, reason, message)
    }

    fn finish(&mut self, type_: &str, reason: &str, message: &str) {
        let events = finish(&mut self.status, &self.now, type_, reason, message);
        self.actions.extend(events);
        self.terminal();
    }

    /// An `ExitedWithCode` event (Kubeflow's) for each failed replica with an exit code.
    fn exited(&mut self, failed: &[&ObservedReplica]) {
        for r in failed.iter().filter(|r| r.exit_code.is_some()) {
            let reason = r.exit_reason.as_deref().map(|x| format!(" ({x})")).unwrap_or_default();
            let message = format!("Pod: {}.{} exited with code {}{reason}", self.obs.namespace, r.name, r.exit_code.unwrap_or_default());
            let kind = if r.exit_code == Some(0) { EventKind::Normal } else { EventKind::Warning };
            self.actions.push(event(kind, EXITED_WITH_CODE, &message, Some(r.name.clone())));
        }
    }

    /// Seconds from `since` (now when unset) to now, never negative.
    fn seconds_since(&self, since: Option<&Time>) -> f64 {
        let since = since.map_or(self.obs.now, |t| t.0);
        self.obs.now.duration_since(since).as_secs_f64().max(0.0)
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
                self.actions.push(Action::DeleteReplica { name: r.name.clone() });
            }
        }
        if let Some(ttl) = self.obs.spec.run_policy.ttl_seconds_after_finished {
            let elapsed = self.seconds_since(self.status.completion_time.as_ref());
            let ttl = f64::from(ttl.max(0));
            if elapsed >= ttl {
                self.actions.push(Action::DeleteJob);
            } else {
                self.actions.push(Action::RequeueAfter(Duration::from_secs_f64(ttl - elapsed)));
            }
        }
    }
}

fn event(kind: EventKind, reason: &str, message: &str, pod: Option<String>) -> Action {
    Action::Event { kind, reason: reason.to_string(), message: message.to_string(), pod }
}

/// Kubeflow's `UpdateJobConditions`: no change when a condition of that type already has the
/// same status and reason; otherwise Running and Restarting replace each other, a terminal (or
/// Suspended) condition turns Running, Restarting and Unschedulable false, and the new condition
/// goes last among the true ones: false conditions come first, so the last condition is always
/// the job's latest true state (what `kubectl get tfjobs` shows as State). Returns whether
/// anything changed.
fn set_condition(st: &mut TFJobStatus, now: &Time, type_: &str, status: &str, reason: &str, message: &str) -> bool {
    if let Some(c) = st.conditions.iter().find(|c| c.type_ == type_)
        && c.status == status
        && c.reason.as_deref() == Some(reason)
    {
        return false;
    }
    let mut kept = Vec::new();
    for mut c in std::mem::take(&mut st.conditions) {
        if c.type_ == type_ || (type_ == RESTARTING && c.type_ == RUNNING) || (type_ == RUNNING && c.type_ == RESTARTING) {
            continue;
        }
        if (type_ == FAILED || type_ == SUCCEEDED || type_ == SUSPENDED)
            && [RUNNING, RESTARTING, UNSCHEDULABLE].contains(&c.type_.as_str())
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
        last_transition_time: Some(now.clone()),
    });
    // A stable partition: false (and unknown) conditions first, true ones after.
    let (mut ordered, true_ones): (Vec<_>, Vec<_>) = kept.into_iter().partition(|c| c.status != "True");
    ordered.extend(true_ones);
    st.conditions = ordered;
    true
}

/// Ends the job with condition `type_` (`Succeeded` or `Failed`): the condition, its event
/// (when new) and the completion time.
fn finish(st: &mut TFJobStatus, now: &Time, type_: &str, reason: &str, message: &str) -> Vec<Action> {
    let mut events = Vec::new();
    if set_condition(st, now, type_, "True", reason, message) {
        let kind = if type_ == SUCCEEDED { EventKind::Normal } else { EventKind::Warning };
        events.push(event(kind, reason, message, None));
    }
    if st.completion_time.is_none() {
        st.completion_time = Some(now.clone());
    }
    events
}

/// Ends a job whose runner was stopped before the job finished (Ctrl-C or SIGTERM to `tfjob
/// run`, which stops every replica): `Failed` with reason [`INTERRUPTED`] and `message`, so the
/// status left behind no longer says Running. A job that had already finished keeps its
/// condition. Returns the event to publish.
pub fn interrupt(st: &mut TFJobStatus, now: Timestamp, message: &str) -> Vec<Action> {
    if is_finished(st) {
        return Vec::new();
    }
    finish(st, &Time(now), FAILED, INTERRUPTED, message)
}

/// `workerShares.succeededPercent`, when set.
fn succeeded_share(spec: &TFJobSpec) -> Option<i32> {
    spec.worker_shares.as_ref().and_then(|s| s.succeeded_percent)
}

/// `workerShares.failedPercent`, when set.
fn failed_share(spec: &TFJobSpec) -> Option<i32> {
    spec.worker_shares.as_ref().and_then(|s| s.failed_percent)
}

/// Whether `count` of `total` is at least `percent` % of it (rounded up), and not none.
fn share_reached(count: i32, percent: i32, total: i32) -> bool {
    count > 0 && i64::from(count) * 100 >= i64::from(percent) * i64::from(total)
}

/// A pod the API server refused to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRefusal {
    /// The pod's name.
    pub pod: String,
    /// The API server's answer (e.g. `Pod "j-worker-0" is invalid: spec.containers[0]...`).
    pub message: String,
    /// Whether the same pod would be refused again: the API server found it invalid (422).
    /// Otherwise (quota, admission) a later attempt may succeed.
    pub permanent: bool,
}

/// Records on the status what happened to the pods a reconcile tried to create (`attempted`
/// pods, of which `refused` were refused), and returns the events to publish: a Warning
/// `FailedCreatePod` per refusal; a refused invalid pod fails the job (an invalid template fails
/// every time), any other refusal sets `ReplicaFailure` until a later attempt creates every pod.
pub fn record_pod_creations(st: &mut TFJobStatus, full_name: &str, attempted: usize, refused: &[PodRefusal], now: Timestamp) -> Vec<Action> {
    let now = Time(now);
    let mut events: Vec<Action> = refused
        .iter()
        .map(|r| {
            let message = format!("Error creating: {}", r.message);
            event(EventKind::Warning, FAILED_CREATE_POD, &message, Some(r.pod.clone()))
        })
        .collect();
    if is_finished(st) {
        return events;
    }
    if let Some(r) = refused.iter().find(|r| r.permanent) {
        let msg = format!("TFJob {full_name} has failed because the API server refused pod {}: {}", r.pod, r.message);
        events.extend(finish(st, &now, FAILED, "TFJobFailedValidation", &msg));
    } else if let Some(r) = refused.first() {
        let msg = format!("TFJob {full_name} cannot create pod {} (retrying): {}", r.pod, r.message);
        set_condition(st, &now, REPLICA_FAILURE, "True", FAILED_CREATE_POD, &msg);
    } else if attempted > 0 && has_condition(st, REPLICA_FAILURE) {
        let msg = format!("TFJob {full_name} has created its pods.");
        set_condition(st, &now, REPLICA_FAILURE, "False", "PodsCreated", &msg);
    }
    events
}

/// Computes the new status of a job and the actions that move it forward.
///
/// Input is plain data ([`Observation`]): the spec, the previous status, the replicas as seen
/// (type, index, phase, exit code of the `tensorflow` container, restart count) and "now".
/// Output ([`Outcome`]) is the status to write and the [`Action`]s to execute: create, delete
/// or recreate replicas, emit events, requeue after a delay, delete the job. Calling it again
/// with the new status and the same observation is a no-op apart from `lastReconcileTime`.
///
/// Scaling is a new `replicas` in the spec: the missing indices are created, the highest ones
/// deleted, no other replica touched, and a change of the planned count (recorded in
/// `replicaStatuses.<type>.replicas`) emits one `Scaled` event (`Worker 2 → 4`). Worker 0 of a
/// job without `Chief` or `Master` is its chief and is never scaled away.
pub fn reconcile_status(obs: &Observation<'_>) -> Outcome {
    let mut m = Machine {
        obs,
        specs: api::replica_specs(obs.spec),
        full_name: format!("{}/{}", obs.namespace, obs.name),
        status: obs.status.clone(),
        actions: Vec::new(),
        now: Time(obs.now),
    };
    m.status.last_reconcile_time = Some(m.now.clone());
    m.mark_created();
    if is_finished(&m.status) {
        m.terminal();
        return m.into_outcome();
    }
    if m.fail_if_invalid() || m.suspend() {
        return m.into_outcome();
    }
    m.resume_and_start();
    if m.fail_at_deadline() {
        return m.into_outcome();
    }
    let tally = m.count_replicas();
    m.delete_unwanted();
    let finished_or_restarting =
        m.finish_on_success(&tally) || m.fail_on_permanent_failure(&tally) || m.fail_over_backoff_limit(&tally) || m.recreate_failed(&tally);
    if !finished_or_restarting {
        m.mark_running();
    }
    if !is_finished(&m.status) {
        m.mark_unschedulable(&tally);
    }
    m.into_outcome()
}

impl<'a> Machine<'a> {
    fn mark_created(&mut self) {
        if !self.status.conditions.iter().any(|c| c.type_ == CREATED) {
            let msg = format!("TFJob {} is created.", self.obs.name);
            self.set_condition(CREATED, "True", "TFJobCreated", &msg);
            self.event(EventKind::Normal, "TFJobCreated", &msg);
        }
    }

    /// Fails a job whose spec is not valid. A job that has already started (some replica type
    /// was planned) is not failed for what only an older operator or an older CRD let through:
    /// a `Worker` count below its chief ([`api::worker_floor_error`];
    /// [`Machine::count_replicas`] keeps its worker 0), or a problem in a pod template (its
    /// pods run already; an upgrade of the operator must not kill them).
    fn fail_if_invalid(&mut self) -> bool {
        let started = self.status.replica_statuses.values().any(|s| s.replicas.is_some());
        let floor = api::worker_floor_error(self.obs.spec);
        let tolerated = |e: &FieldError| started && (Some(e) == floor.as_ref() || e.field.contains(".template"));
        let problems: Vec<String> = self.obs.invalid.iter().filter(|e| !tolerated(e)).map(ToString::to_string).collect();
        if problems.is_empty() {
            return false;
        }
        let msg = format!("TFJob {} is not valid: {}", self.full_name, problems.join("; "));
        self.finish(FAILED, "TFJobFailedValidation", &msg);
        true
    }

    /// Suspend: delete every replica, keep the job.
    fn suspend(&mut self) -> bool {
        if !self.obs.spec.run_policy.suspend {
            return false;
        }
        for r in self.obs.replicas.iter().filter(|r| !r.terminating) {
            self.actions.push(Action::DeleteReplica { name: r.name.clone() });
        }
        let msg = format!("TFJob {} is suspended.", self.full_name);
        if self.set_condition(SUSPENDED, "True", "TFJobSuspended", &msg) {
            self.event(EventKind::Normal, "TFJobSuspended", &msg);
        }
        for rs in self.status.replica_statuses.values_mut() {
            rs.active = 0;
        }
        true
    }

    fn resume_and_start(&mut self) {
        if has_condition(&self.status, SUSPENDED) {
            let msg = format!("TFJob {} is resumed.", self.full_name);
            self.set_condition(SUSPENDED, "False", "TFJobResumed", &msg);
            self.event(EventKind::Normal, "TFJobResumed", &msg);
            self.status.start_time = Some(self.now.clone());
        }
        if self.status.start_time.is_none() {
            self.status.start_time = Some(self.now.clone());
        }
    }

    /// Active deadline: fail at the deadline, otherwise come back exactly then.
    fn fail_at_deadline(&mut self) -> bool {
        let Some(ads) = self.obs.spec.run_policy.active_deadline_seconds else {
            return false;
        };
        let elapsed = self.seconds_since(self.status.start_time.as_ref());
        let limit = ads.max(0) as f64;
        if elapsed >= limit {
            let msg = format!("TFJob {} has failed because it was active longer than specified deadline", self.full_name);
            self.finish(FAILED, "TFJobFailed", &msg);
            return true;
        }
        self.actions.push(Action::RequeueAfter(Duration::from_secs_f64(limit - elapsed)));
        false
    }

    /// Counts the observed replicas of every planned index into `replicaStatuses`, creates the
    /// missing ones and sorts the failed ones by what their restart policy says.
    fn count_replicas(&mut self) -> Tally<'a> {
        let obs = self.obs;
        // Workers that failed for good may be tolerated: dynamic workers, or up to a share.
        let dynamic = obs.spec.enable_dynamic_worker.unwrap_or(false) || failed_share(obs.spec).is_some();
        // Observed replicas by (type, index), in observation order: one pass, not one per index.
        let mut observed: HashMap<(ReplicaType, i32), Vec<&'a ObservedReplica>> = HashMap::new();
        for r in obs.replicas {
            observed.entry((r.replica_type, r.index)).or_default().push(r);
        }
        let mut tally = Tally::default();
        let mut replica_statuses: BTreeMap<String, ReplicaStatus> = BTreeMap::new();
        for (&rtype, &rs) in &self.specs.clone() {
            let planned = self.keep_ps0(rtype, api::planned_replicas(obs.spec, rtype, rs));
            let prev = self.status.replica_statuses.get(rtype.as_str());
            let mut st = ReplicaStatus {
                selector: Some(plan::replica_selector(obs.name, rtype)),
                recreated: prev.map(|p| p.recreated).unwrap_or(0),
                replicas: Some(planned),
                ..Default::default()
            };
            let previously_planned = prev.and_then(|p| p.replicas);
            self.announce_scale(rtype, previously_planned, rs.replicas, planned);
            for index in 0..planned {
                let here = observed.get(&(rtype, index)).map_or(&[][..], Vec::as_slice);
                if here.is_empty() {
                    self.actions.push(Action::CreateReplica { replica_type: rtype, index });
                    continue;
                }
                for &r in here.iter().filter(|r| !r.terminating) {
                    tally.count(&mut st, r, &rs.restart_policy, dynamic && rtype == ReplicaType::Worker);
                }
            }
            tally.planned.insert(rtype, planned);
            replica_statuses.insert(rtype.as_str().to_string(), st);
        }
        self.status.replica_statuses = replica_statuses;
        tally
    }

    /// The planned count of `rtype`, except that ps 0 of a running job is not removed: it keeps
    /// the job's layout (the other ps tasks hand their state over to those that stay when a
    /// scale-down removes them, the highest first). A warning says so, about ps 0's pod (so
    /// repeats fold into one series).
    fn keep_ps0(&mut self, rtype: ReplicaType, planned: i32) -> i32 {
        if rtype != ReplicaType::PS || planned >= 1 {
            return planned;
        }
        if !self.obs.replicas.iter().any(|r| r.replica_type == rtype && r.index == 0 && !r.terminating) {
            return planned;
        }
        let msg = format!(
            "PS replicas is {planned}, kept at 1: ps 0 keeps the job's layout and is never removed from a running job \
             (to run without ps tasks, suspend the job first)"
        );
        self.actions.push(event(EventKind::Warning, "ScaleLimited", &msg, Some(plan::pod_name(self.obs.name, rtype, 0))));
        1
    }

    /// A `Scaled` event when the planned count of a type changed since it was last planned (not
    /// when the job is new), and a warning when worker 0 stays against the spec.
    fn announce_scale(&mut self, rtype: ReplicaType, previous: Option<i32>, requested: i32, planned: i32) {
        let Some(previous) = previous.filter(|p| *p != planned) else {
            return;
        };
        self.event(EventKind::Normal, "Scaled", &format!("{rtype} {previous} \u{2192} {planned}"));
        if requested < planned {
            let msg = format!(
                "{rtype} replicas is {requested}, kept at {planned}: worker 0 is the chief of a \
                 job without Chief or Master and is never removed"
            );
            self.event(EventKind::Warning, "ScaleLimited", &msg);
        }
    }

    /// Scale-down and stray replicas: out-of-range indices or types no longer in the spec.
    fn delete_unwanted(&mut self) {
        for r in self.obs.replicas.iter().filter(|r| !r.terminating) {
            let wanted = self.status.replica_statuses.get(r.replica_type.as_str()).and_then(|s| s.replicas).is_some_and(|planned| r.index < planned);
            if !wanted {
                self.actions.push(Action::DeleteReplica { name: r.name.clone() });
            }
        }
    }

    /// A count of `replicaStatuses` (0 for a type not in the spec).
    fn count(&self, rtype: ReplicaType, field: fn(&ReplicaStatus) -> i32) -> i32 {
        self.status.replica_statuses.get(rtype.as_str()).map(field).unwrap_or(0)
    }

    /// Success first: a job whose chief (or worker 0 / all workers) succeeded has succeeded,
    /// whatever happened to other replicas; Succeeded and Failed are never both set.
    fn finish_on_success(&mut self, tally: &Tally) -> bool {
        let planned = |t: ReplicaType| tally.planned.get(&t).copied().unwrap_or(0);
        let succeeded = if api::worker0_is_chief(self.obs.spec) {
            let all = self.count(ReplicaType::Worker, |s| s.succeeded) >= planned(ReplicaType::Worker);
            let worker0 = self.obs.replicas.iter().any(|r| {
                r.replica_type == ReplicaType::Worker && r.index == 0 && !r.terminating && r.phase == Phase::Succeeded && r.exit_code.unwrap_or(0) == 0
            });
            let share = succeeded_share(self.obs.spec)
                .is_some_and(|p| share_reached(self.count(ReplicaType::Worker, |s| s.succeeded), p, planned(ReplicaType::Worker)));
            all || share || (worker0 && self.obs.spec.success_policy != Some(SuccessPolicy::AllWorkers))
        } else {
            self.specs.keys().filter(|t| t.is_chief()).all(|t| self.count(*t, |s| s.succeeded) >= planned(*t))
        };
        if !succeeded {
            return false;
        }
        self.drop_creations();
        let msg = format!("TFJob {} successfully completed.", self.full_name);
        self.finish(SUCCEEDED, "TFJobSucceeded", &msg);
        true
    }

    fn drop_creations(&mut self) {
        self.actions.retain(|a| !matches!(a, Action::CreateReplica { .. }));
    }

    /// A replica failed for good: the job fails, naming the pods, their exit codes and
    /// reasons, with an `ExitedWithCode` event per pod.
    fn fail_on_permanent_failure(&mut self, tally: &Tally) -> bool {
        let (why, failed): (String, Vec<&ObservedReplica>) = match tally.permanent_failures.first() {
            Some(first) => {
                let rtype = first.replica_type;
                let of_type: Vec<_> = tally.permanent_failures.iter().copied().filter(|r| r.replica_type == rtype).collect();
                (format!("{} {rtype} replica(s) failed", of_type.len()), tally.permanent_failures.clone())
            }
            None => match self.lost_dynamic_workers(tally) {
                Some(why) => (why, tally.failed_dynamic_workers.clone()),
                None => return false,
            },
        };
        self.drop_creations();
        let msg = format!("TFJob {} has failed because {why}: {}.", self.full_name, describe_failures(&failed));
        self.exited(&failed);
        self.finish(FAILED, "TFJobFailed", &msg);
        true
    }

    /// With `enableDynamicWorker`, a worker that failed for good is tolerated while another
    /// can finish the job: the job fails when every planned worker failed for good, or when
    /// worker 0 did and it is the chief (no `Chief` or `Master`). With
    /// `workerShares.failedPercent`, also when more than that share of the workers failed for
    /// good. A `Chief` or `Master` that fails fails the job as always.
    fn lost_dynamic_workers(&self, tally: &Tally) -> Option<String> {
        let failed = &tally.failed_dynamic_workers;
        let workers = tally.planned.get(&ReplicaType::Worker).copied().unwrap_or(0);
        let n = i32::try_from(failed.len()).unwrap_or(i32::MAX);
        if failed.is_empty() {
            None
        } else if n >= workers {
            Some(format!("all {} Worker replica(s) failed", failed.len()))
        } else if let Some(p) = failed_share(self.obs.spec).filter(|p| n.saturating_mul(100) > p.saturating_mul(workers)) {
            Some(format!("{n} of {workers} Worker replica(s) failed, more than workerShares.failedPercent ({p} %)"))
        } else if failed.iter().any(|r| r.index == 0) && api::worker0_is_chief(self.obs.spec) {
            Some(format!(
                "Worker 0, the chief of a job without Chief or Master, failed ({} of {workers} \
                 Worker replica(s) failed)",
                failed.len()
            ))
        } else {
            None
        }
    }

    /// Backoff limit bounds every restart: in place (kubelet) and recreations (controller).
    fn fail_over_backoff_limit(&mut self, tally: &Tally) -> bool {
        let Some(limit) = self.obs.spec.run_policy.backoff_limit else {
            return false;
        };
        let recreated: i64 = self.status.replica_statuses.values().map(|s| i64::from(s.recreated)).sum();
        let restarts = tally.in_place_restarts + recreated;
        let limit = i64::from(limit.max(0));
        // Pods the cluster stopped are recreated without counting.
        let pending = tally.to_recreate.iter().filter(|r| !r.disrupted).count() as i64;
        if restarts <= limit && (pending == 0 || restarts + pending <= limit) {
            return false;
        }
        self.drop_creations();
        let mut failures: Vec<String> = tally
            .restarted
            .iter()
            .map(|r| {
                let last = r
                    .exit_code
                    .map(|c| {
                        let reason = r.exit_reason.as_deref().map(|x| format!(" ({x})"));
                        format!(", last exit code {c}{}", reason.unwrap_or_default())
                    })
                    .unwrap_or_default();
                format!("pod {} restarted {} time(s){last}", r.name, r.restart_count)
            })
            .collect();
        failures.extend(tally.to_recreate.iter().map(|r| r.failure()));
        let detail = if failures.is_empty() { String::new() } else { format!(": {}", failures.join("; ")) };
        let msg = format!("TFJob {} has failed because it has reached the specified backoff limit{detail}", self.full_name);
        self.exited(&tally.to_recreate);
        self.finish(FAILED, "TFJobFailed", &msg);
        true
    }

    fn recreate_failed(&mut self, tally: &Tally) -> bool {
        if tally.to_recreate.is_empty() {
            return false;
        }
        let mut by_type: BTreeMap<ReplicaType, i32> = BTreeMap::new();
        let mut counted: BTreeMap<ReplicaType, i32> = BTreeMap::new();
        for r in &tally.to_recreate {
            *by_type.entry(r.replica_type).or_default() += 1;
            // `recreated` is what backoffLimit bounds: not the pods the cluster stopped.
            *counted.entry(r.replica_type).or_default() += i32::from(!r.disrupted);
            self.actions.push(Action::RecreateReplica { name: r.name.clone(), replica_type: r.replica_type, index: r.index });
        }
        for (t, n) in &counted {
            if let Some(s) = self.status.replica_statuses.get_mut(t.as_str()) {
                s.recreated += n;
            }
        }
        let (t, n) = by_type.iter().next().map(|(t, n)| (*t, *n)).unwrap_or((ReplicaType::Worker, 0));
        let msg = format!("TFJob {} is restarting because {n} {t} replica(s) failed: {}.", self.full_name, describe_failures(&tally.to_recreate));
        self.exited(&tally.to_recreate);
        if self.set_condition(RESTARTING, "True", "TFJobRestarting", &msg) {
            self.event(EventKind::Warning, "TFJobRestarting", &msg);
        }
        true
    }

    fn mark_running(&mut self) {
        let running = if api::worker0_is_chief(self.obs.spec) {
            self.count(ReplicaType::Worker, |s| s.active) > 0
        } else {
            self.specs.keys().filter(|t| t.is_chief()).any(|t| self.count(*t, |s| s.active) > 0)
        };
        if running {
            let msg = format!("TFJob {} is running.", self.full_name);
            if self.set_condition(RUNNING, "True", "TFJobRunning", &msg) {
                self.event(EventKind::Normal, "TFJobRunning", &msg);
            }
        }
    }

    /// Pods the scheduler cannot place show on the job: `Unschedulable` (true, with the
    /// scheduler's message, a Warning event when it turns true) until every pod is placed.
    fn mark_unschedulable(&mut self, tally: &Tally) {
        let Some(first) = tally.unschedulable.first() else {
            if has_condition(&self.status, UNSCHEDULABLE) {
                let msg = format!("Every pod of TFJob {} is scheduled.", self.full_name);
                self.set_condition(UNSCHEDULABLE, "False", "Scheduled", &msg);
            }
            return;
        };
        let names: Vec<&str> = tally.unschedulable.iter().take(5).map(|r| r.name.as_str()).collect();
        let more = match tally.unschedulable.len() {
            n if n > names.len() => format!(" and {} more", n - names.len()),
            _ => String::new(),
        };
        let msg = format!(
            "{} pod(s) of TFJob {} cannot be scheduled ({}{more}): {}",
            tally.unschedulable.len(),
            self.full_name,
            names.join(", "),
            first.unschedulable.as_deref().unwrap_or_default()
        );
        if self.set_condition(UNSCHEDULABLE, "True", UNSCHEDULABLE, &msg) {
            let pod = Some(first.name.clone());
            self.actions.push(event(EventKind::Warning, UNSCHEDULABLE, &msg, pod));
        } else if let Some(c) = self.status.conditions.iter_mut().find(|c| c.type_ == UNSCHEDULABLE && c.message.as_deref() != Some(&msg)) {
            // Same state, news: the message follows the pods, without a new event.
            c.message = Some(msg);
            c.last_update_time = Some(self.now.clone());
        }
    }

    fn into_outcome(self) -> Outcome {
        Outcome { status: self.status, actions: self.actions }
    }
}

/// Whether a failed replica is recreated under its restart policy (under `ExitCode`, a pod the
/// cluster stopped always is: an eviction or a preemption says nothing about the program).
fn restarts_after_failure(policy: &RestartPolicy, r: &ObservedReplica) -> bool {
    match policy {
        RestartPolicy::Always | RestartPolicy::OnFailure => true,
        RestartPolicy::ExitCode => r.disrupted || is_retryable_exit_code(r.exit_code),
        RestartPolicy::Never | RestartPolicy::Unsupported(_) => false,
    }
}

#[cfg(test)]
mod tests;

//! Table tests of the status state machine.

use super::*;
use crate::api::{CleanPodPolicy, ReplicaSpec, RestartPolicy, TFJobSpec};
use crate::field::FieldError;

fn spec(types: &[(ReplicaType, i32, RestartPolicy)]) -> TFJobSpec {
    let mut s = TFJobSpec::default();
    for (t, n, p) in types {
        s.tf_replica_specs
            .insert(t.as_str().to_string(), ReplicaSpec { replicas: *n, template: Default::default(), restart_policy: p.clone(), ..Default::default() });
    }
    s
}

fn r(t: ReplicaType, index: i32, phase: Phase) -> ObservedReplica {
    ObservedReplica {
        replica_type: t,
        index,
        name: plan::pod_name("job", t, index),
        phase,
        exit_code: match phase {
            Phase::Succeeded => Some(0),
            Phase::Failed => Some(1),
            _ => None,
        },
        exit_reason: match phase {
            Phase::Succeeded => Some("Completed".into()),
            Phase::Failed => Some("Error".into()),
            _ => None,
        },
        restart_count: 0,
        terminating: false,
        unschedulable: None,
        disrupted: false,
    }
}

fn disrupted(mut o: ObservedReplica) -> ObservedReplica {
    o.disrupted = true;
    o
}

fn with_exit(mut o: ObservedReplica, code: i32) -> ObservedReplica {
    o.exit_code = Some(code);
    o
}

fn t0() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0() + k8s_openapi::jiff::SignedDuration::from_secs(secs)
}

fn run(spec: &TFJobSpec, status: &TFJobStatus, replicas: &[ObservedReplica], now: Timestamp) -> Outcome {
    run_invalid(spec, status, replicas, &[], now)
}

/// [`run`] of a spec with these validation problems.
fn run_invalid(spec: &TFJobSpec, status: &TFJobStatus, replicas: &[ObservedReplica], invalid: &[FieldError], now: Timestamp) -> Outcome {
    reconcile_status(&Observation { namespace: "ns", name: "job", spec, status, replicas, invalid, now })
}

/// (type, status, reason, message) of every condition.
fn conds(s: &TFJobStatus) -> Vec<(String, String, String, String)> {
    s.conditions.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default())).collect()
}

fn c(t: &str, s: &str, reason: &str, msg: &str) -> (String, String, String, String) {
    (t.into(), s.into(), reason.into(), msg.into())
}

fn created() -> (String, String, String, String) {
    c(CREATED, "True", "TFJobCreated", "TFJob job is created.")
}

fn running() -> (String, String, String, String) {
    c(RUNNING, "True", "TFJobRunning", "TFJob ns/job is running.")
}

fn events(o: &Outcome) -> Vec<String> {
    o.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

fn non_events(o: &Outcome) -> Vec<Action> {
    o.actions.iter().filter(|a| !matches!(a, Action::Event { .. })).cloned().collect()
}

use ReplicaType::{Chief, Evaluator, Master, PS, Worker};
use RestartPolicy::{Always, ExitCode, Never, OnFailure};

#[test]
fn new_job_creates_every_replica() {
    let s = spec(&[(PS, 1, Never), (Worker, 2, Never)]);
    let o = run(&s, &TFJobStatus::default(), &[], t0());
    assert_eq!(conds(&o.status), vec![created()]);
    assert_eq!(events(&o), vec!["TFJobCreated"]);
    assert_eq!(
        non_events(&o),
        vec![
            Action::CreateReplica { replica_type: PS, index: 0 },
            Action::CreateReplica { replica_type: Worker, index: 0 },
            Action::CreateReplica { replica_type: Worker, index: 1 },
        ]
    );
    assert_eq!(o.status.start_time, Some(Time(t0())));
    assert_eq!(o.status.last_reconcile_time, Some(Time(t0())));
    let w = &o.status.replica_statuses["Worker"];
    assert_eq!(
        w.selector.as_deref(),
        Some("training.kubeflow.org/job-name=job,training.kubeflow.org/operator-name=tfjob-controller,training.kubeflow.org/replica-type=worker")
    );
}

/// The main table: (name, spec, observed replicas, expected conditions after "Created",
/// expected non-event actions, expected (type, active, succeeded, failed)).
#[test]
fn status_table() {
    type Counts = Vec<(&'static str, i32, i32, i32)>;
    type Cond = (String, String, String, String);
    type Case = (&'static str, TFJobSpec, Vec<ObservedReplica>, Vec<Cond>, Vec<Action>, Counts);
    let cases: Vec<Case> = vec![
        (
            "all pending: no Running",
            spec(&[(PS, 1, Never), (Worker, 2, Never)]),
            vec![r(PS, 0, Phase::Pending), r(Worker, 0, Phase::Pending), r(Worker, 1, Phase::Pending)],
            vec![],
            vec![],
            vec![("PS", 0, 0, 0), ("Worker", 0, 0, 0)],
        ),
        (
            "only ps running: not Running (no worker runs)",
            spec(&[(PS, 1, Never), (Worker, 1, Never)]),
            vec![r(PS, 0, Phase::Running), r(Worker, 0, Phase::Pending)],
            vec![],
            vec![],
            vec![("PS", 1, 0, 0), ("Worker", 0, 0, 0)],
        ),
        (
            "a worker running without chief: Running",
            spec(&[(PS, 1, Never), (Worker, 2, Never)]),
            vec![r(PS, 0, Phase::Running), r(Worker, 0, Phase::Pending), r(Worker, 1, Phase::Running)],
            vec![running()],
            vec![],
            vec![("PS", 1, 0, 0), ("Worker", 1, 0, 0)],
        ),
        (
            "with chief, workers running but chief pending: not Running",
            spec(&[(Chief, 1, Never), (Worker, 2, Never)]),
            vec![r(Chief, 0, Phase::Pending), r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Running)],
            vec![],
            vec![],
            vec![("Chief", 0, 0, 0), ("Worker", 2, 0, 0)],
        ),
        (
            "master running: Running",
            spec(&[(Master, 1, Never), (Worker, 1, Never)]),
            vec![r(Master, 0, Phase::Running), r(Worker, 0, Phase::Pending)],
            vec![running()],
            vec![],
            vec![("Master", 1, 0, 0), ("Worker", 0, 0, 0)],
        ),
        (
            "chief succeeded: Succeeded, running ps cleaned (default cleanPodPolicy Running)",
            spec(&[(Chief, 1, Never), (PS, 1, Never), (Worker, 1, Never)]),
            vec![r(Chief, 0, Phase::Succeeded), r(PS, 0, Phase::Running), r(Worker, 0, Phase::Succeeded)],
            vec![c(SUCCEEDED, "True", "TFJobSucceeded", "TFJob ns/job successfully completed.")],
            vec![Action::DeleteReplica { name: "job-ps-0".into() }],
            vec![("Chief", 0, 1, 0), ("PS", 1, 0, 0), ("Worker", 0, 1, 0)],
        ),
        (
            "worker 0 succeeded with exit 0, no chief: Succeeded",
            spec(&[(PS, 1, Never), (Worker, 2, Never)]),
            vec![r(PS, 0, Phase::Running), r(Worker, 0, Phase::Succeeded), r(Worker, 1, Phase::Running)],
            vec![c(SUCCEEDED, "True", "TFJobSucceeded", "TFJob ns/job successfully completed.")],
            vec![Action::DeleteReplica { name: "job-ps-0".into() }, Action::DeleteReplica { name: "job-worker-1".into() }],
            vec![("PS", 1, 0, 0), ("Worker", 1, 1, 0)],
        ),
        (
            "worker 1 succeeded only: still running",
            spec(&[(Worker, 2, Never)]),
            vec![r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Succeeded)],
            vec![running()],
            vec![],
            vec![("Worker", 1, 1, 0)],
        ),
        (
            "ps failed under Never: Failed, never also Succeeded",
            spec(&[(PS, 2, Never), (Worker, 1, Never)]),
            vec![r(PS, 0, Phase::Failed), r(PS, 1, Phase::Running), r(Worker, 0, Phase::Running)],
            vec![c(FAILED, "True", "TFJobFailed", "TFJob ns/job has failed because 1 PS replica(s) failed: pod job-ps-0 exited with code 1 (Error).")],
            vec![Action::DeleteReplica { name: "job-ps-1".into() }, Action::DeleteReplica { name: "job-worker-0".into() }],
            vec![("PS", 1, 0, 1), ("Worker", 1, 0, 0)],
        ),
        (
            "worker failed under OnFailure: recreated, Restarting",
            spec(&[(Worker, 2, OnFailure)]),
            vec![r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Failed)],
            vec![c(
                RESTARTING,
                "True",
                "TFJobRestarting",
                "TFJob ns/job is restarting because 1 Worker replica(s) failed: pod job-worker-1 exited with code 1 (Error).",
            )],
            vec![Action::RecreateReplica { name: "job-worker-1".into(), replica_type: Worker, index: 1 }],
            vec![("Worker", 1, 0, 1)],
        ),
        (
            "worker failed under Always: recreated",
            spec(&[(Worker, 1, Always)]),
            vec![r(Worker, 0, Phase::Failed)],
            vec![c(
                RESTARTING,
                "True",
                "TFJobRestarting",
                "TFJob ns/job is restarting because 1 Worker replica(s) failed: pod job-worker-0 exited with code 1 (Error).",
            )],
            vec![Action::RecreateReplica { name: "job-worker-0".into(), replica_type: Worker, index: 0 }],
            vec![("Worker", 0, 0, 1)],
        ),
        (
            "ExitCode 137 (retryable): recreated",
            spec(&[(PS, 1, ExitCode), (Worker, 1, ExitCode)]),
            vec![with_exit(r(PS, 0, Phase::Failed), 137), r(Worker, 0, Phase::Running)],
            vec![c(
                RESTARTING,
                "True",
                "TFJobRestarting",
                "TFJob ns/job is restarting because 1 PS replica(s) failed: pod job-ps-0 exited with code 137 (Error).",
            )],
            vec![Action::RecreateReplica { name: "job-ps-0".into(), replica_type: PS, index: 0 }],
            vec![("PS", 0, 0, 1), ("Worker", 1, 0, 0)],
        ),
        (
            "ExitCode 1 (permanent): Failed",
            spec(&[(Worker, 2, ExitCode)]),
            vec![with_exit(r(Worker, 0, Phase::Failed), 1), r(Worker, 1, Phase::Running)],
            vec![c(FAILED, "True", "TFJobFailed", "TFJob ns/job has failed because 1 Worker replica(s) failed: pod job-worker-0 exited with code 1 (Error).")],
            vec![Action::DeleteReplica { name: "job-worker-1".into() }],
            vec![("Worker", 1, 0, 1)],
        ),
        (
            "ExitCode 127 is still permanent",
            spec(&[(Worker, 1, ExitCode)]),
            vec![with_exit(r(Worker, 0, Phase::Failed), 127)],
            vec![c(
                FAILED,
                "True",
                "TFJobFailed",
                "TFJob ns/job has failed because 1 Worker replica(s) failed: pod job-worker-0 exited with code 127 (Error).",
            )],
            vec![],
            vec![("Worker", 0, 0, 1)],
        ),
        (
            "ExitCode: a pod the cluster stopped (DisruptionTarget) is recreated whatever its code",
            spec(&[(Worker, 1, ExitCode)]),
            vec![disrupted(with_exit(r(Worker, 0, Phase::Failed), 1))],
            vec![c(
                RESTARTING,
                "True",
                "TFJobRestarting",
                "TFJob ns/job is restarting because 1 Worker replica(s) failed: pod job-worker-0 exited with code 1 (Error).",
            )],
            vec![Action::RecreateReplica { name: "job-worker-0".into(), replica_type: Worker, index: 0 }],
            vec![("Worker", 0, 0, 1)],
        ),
        (
            "Never: a pod the cluster stopped is not recreated",
            spec(&[(Worker, 1, Never)]),
            vec![disrupted(with_exit(r(Worker, 0, Phase::Failed), 137))],
            vec![c(
                FAILED,
                "True",
                "TFJobFailed",
                "TFJob ns/job has failed because 1 Worker replica(s) failed: pod job-worker-0 exited with code 137 (Error).",
            )],
            vec![],
            vec![("Worker", 0, 0, 1)],
        ),
        (
            "ExitCode 128 is retryable",
            spec(&[(Worker, 1, ExitCode)]),
            vec![with_exit(r(Worker, 0, Phase::Failed), 128)],
            vec![c(
                RESTARTING,
                "True",
                "TFJobRestarting",
                "TFJob ns/job is restarting because 1 Worker replica(s) failed: pod job-worker-0 exited with code 128 (Error).",
            )],
            vec![Action::RecreateReplica { name: "job-worker-0".into(), replica_type: Worker, index: 0 }],
            vec![("Worker", 0, 0, 1)],
        ),
        (
            "scale down: out-of-range and unknown-type replicas deleted",
            spec(&[(Worker, 1, Never)]),
            vec![r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Running), r(Evaluator, 0, Phase::Running)],
            vec![running()],
            vec![Action::DeleteReplica { name: "job-worker-1".into() }, Action::DeleteReplica { name: "job-evaluator-0".into() }],
            vec![("Worker", 1, 0, 0)],
        ),
        (
            "scale up: missing indices created",
            spec(&[(Worker, 3, Never)]),
            vec![r(Worker, 0, Phase::Running)],
            vec![running()],
            vec![Action::CreateReplica { replica_type: Worker, index: 1 }, Action::CreateReplica { replica_type: Worker, index: 2 }],
            vec![("Worker", 1, 0, 0)],
        ),
    ];
    for (name, s, observed, expected_conds, expected_actions, counts) in cases {
        let o = run(&s, &TFJobStatus::default(), &observed, t0());
        let mut want = vec![created()];
        want.extend(expected_conds);
        assert_eq!(conds(&o.status), want, "{name}: conditions");
        assert_eq!(non_events(&o), expected_actions, "{name}: actions");
        let got: Vec<_> = o.status.replica_statuses.iter().map(|(k, v)| (k.as_str(), v.active, v.succeeded, v.failed)).collect();
        let want_counts: Vec<_> = counts.iter().map(|(k, a, s, f)| (*k, *a, *s, *f)).collect();
        assert_eq!(got, want_counts, "{name}: counts");
        assert!(!(has_condition(&o.status, SUCCEEDED) && has_condition(&o.status, FAILED)), "{name}: both terminal");
        // Every transition comes with an event.
        let transitions = o.status.conditions.len();
        let job_events = events(&o).into_iter().filter(|r| r != EXITED_WITH_CODE).count();
        assert_eq!(job_events, transitions, "{name}: one event per transition");
        // And every failed pod acted upon with an `ExitedWithCode` naming it, its code, reason.
        let want_exits: Vec<(String, String)> = observed
            .iter()
            .filter(|r| r.phase == Phase::Failed)
            .map(|r| {
                let code = r.exit_code.unwrap();
                (EXITED_WITH_CODE.to_string(), format!("Pod: ns.{} exited with code {code} (Error)", r.name))
            })
            .collect();
        let exits: Vec<(String, String)> = event_texts(&o).into_iter().filter(|(r, _)| r == EXITED_WITH_CODE).collect();
        assert_eq!(exits, want_exits, "{name}: exit events");
    }
}

#[test]
fn success_policy_all_workers() {
    let mut s = spec(&[(Worker, 2, Never)]);
    s.success_policy = Some(SuccessPolicy::AllWorkers);
    let o = run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Succeeded), r(Worker, 1, Phase::Running)], t0());
    assert!(!has_condition(&o.status, SUCCEEDED));
    assert!(has_condition(&o.status, RUNNING));
    let o = run(&s, &o.status, &[r(Worker, 0, Phase::Succeeded), r(Worker, 1, Phase::Succeeded)], at(5));
    assert!(has_condition(&o.status, SUCCEEDED));
    assert_eq!(o.status.completion_time, Some(Time(at(5))));
    // Running turned false when the job succeeded.
    let run_cond = o.status.conditions.iter().find(|c| c.type_ == RUNNING).unwrap();
    assert_eq!(run_cond.status, "False");
    assert_eq!(job_phase(&o.status), SUCCEEDED);
}

#[test]
fn worker0_nonzero_exit_is_not_success() {
    let s = spec(&[(Worker, 2, OnFailure)]);
    let w0 = ObservedReplica { exit_code: Some(3), ..r(Worker, 0, Phase::Succeeded) };
    let o = run(&s, &TFJobStatus::default(), &[w0, r(Worker, 1, Phase::Running)], t0());
    assert!(!has_condition(&o.status, SUCCEEDED));
}

#[test]
fn terminal_is_terminal() {
    let s = spec(&[(Worker, 1, Never)]);
    let done = run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Succeeded)], t0());
    assert!(has_condition(&done.status, SUCCEEDED));
    // Later the pod is reported failed (or gone): the job stays Succeeded, nothing recreated.
    let o = run(&s, &done.status, &[r(Worker, 0, Phase::Failed)], at(10));
    assert!(has_condition(&o.status, SUCCEEDED));
    assert!(!has_condition(&o.status, FAILED));
    assert_eq!(non_events(&o), vec![]);
    assert!(events(&o).is_empty());
    let o = run(&s, &done.status, &[], at(10));
    assert_eq!(non_events(&o), vec![]);
    assert_eq!(o.status.completion_time, Some(Time(t0())));
}

#[test]
fn clean_pod_policies() {
    let observed = [r(Chief, 0, Phase::Succeeded), r(PS, 0, Phase::Running), r(Worker, 0, Phase::Pending), r(Evaluator, 0, Phase::Failed)];
    for (policy, expected) in [
        (CleanPodPolicy::All, vec!["job-chief-0", "job-ps-0", "job-worker-0", "job-evaluator-0"]),
        (CleanPodPolicy::Running, vec!["job-ps-0", "job-worker-0"]),
        (CleanPodPolicy::None, vec![]),
    ] {
        let mut s = spec(&[(Chief, 1, Never), (PS, 1, Never), (Worker, 1, Never), (Evaluator, 1, OnFailure)]);
        s.run_policy.clean_pod_policy = policy.clone();
        let o = run(&s, &TFJobStatus::default(), &observed, t0());
        assert!(has_condition(&o.status, SUCCEEDED), "{policy:?}");
        let deleted: Vec<_> = o
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::DeleteReplica { name } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let mut deleted = deleted;
        deleted.sort();
        let mut expected = expected;
        expected.sort();
        assert_eq!(deleted, expected, "{policy:?}");
    }
}

#[test]
fn active_deadline_requeues_and_fires_on_time() {
    let mut s = spec(&[(Worker, 1, Never)]);
    s.run_policy.active_deadline_seconds = Some(60);
    let o = run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Running)], t0());
    assert_eq!(o.requeue_after(), Some(Duration::from_secs(60)));
    let o = run(&s, &o.status, &[r(Worker, 0, Phase::Running)], at(45));
    assert_eq!(o.requeue_after(), Some(Duration::from_secs(15)));
    assert!(!has_condition(&o.status, FAILED));
    let o = run(&s, &o.status, &[r(Worker, 0, Phase::Running)], at(60));
    assert_eq!(
        conds(&o.status).last().unwrap(),
        &c(FAILED, "True", "TFJobFailed", "TFJob ns/job has failed because it was active longer than specified deadline")
    );
    assert_eq!(non_events(&o), vec![Action::DeleteReplica { name: "job-worker-0".into() }]);
    assert_eq!(events(&o), vec!["TFJobFailed"]);
}

#[test]
fn backoff_limit_counts_in_place_restarts_and_recreations() {
    let mut s = spec(&[(Worker, 1, OnFailure)]);
    s.run_policy.backoff_limit = Some(2);
    // Two in-place restarts: within the limit.
    let w = ObservedReplica { restart_count: 2, ..r(Worker, 0, Phase::Running) };
    let o = run(&s, &TFJobStatus::default(), &[w], t0());
    assert!(!has_condition(&o.status, FAILED));
    // A third: over the limit.
    let w = ObservedReplica { restart_count: 3, exit_code: Some(137), exit_reason: Some("OOMKilled".into()), ..r(Worker, 0, Phase::Running) };
    let o = run(&s, &TFJobStatus::default(), &[w], t0());
    assert_eq!(
        conds(&o.status).last().unwrap(),
        &c(
            FAILED,
            "True",
            "TFJobFailed",
            "TFJob ns/job has failed because it has reached the specified backoff limit: pod \
             job-worker-0 restarted 3 time(s), last exit code 137 (OOMKilled)"
        )
    );

    // ExitCode recreations count too (Kubeflow ignores them).
    let mut s = spec(&[(Worker, 1, ExitCode)]);
    s.run_policy.backoff_limit = Some(2);
    let mut status = TFJobStatus::default();
    for round in 0..2 {
        let o = run(&s, &status, &[with_exit(r(Worker, 0, Phase::Failed), 137)], at(round));
        assert!(o.actions.contains(&Action::RecreateReplica { name: "job-worker-0".into(), replica_type: Worker, index: 0 }), "round {round}");
        status = o.status;
        assert_eq!(status.replica_statuses["Worker"].recreated, round as i32 + 1);
    }
    let o = run(&s, &status, &[with_exit(r(Worker, 0, Phase::Failed), 137)], at(3));
    assert!(has_condition(&o.status, FAILED));
    assert_eq!(
        conds(&o.status).last().unwrap().3,
        "TFJob ns/job has failed because it has reached the specified backoff limit: pod \
         job-worker-0 exited with code 137 (Error)"
    );
    assert!(!has_condition(&o.status, RESTARTING), "terminal turns Restarting false");
    assert!(!o.actions.iter().any(|a| matches!(a, Action::RecreateReplica { .. })));
}

/// Pods evicted or preempted (DisruptionTarget) are recreated under every restart policy but
/// `Never` and do not count towards `backoffLimit`: with a limit of 0, ten disruptions in a row
/// recreate the pod ten times; the next failure of the program itself fails the job.
#[test]
fn disruptions_do_not_count_towards_the_backoff_limit() {
    for policy in [ExitCode, OnFailure] {
        let mut s = spec(&[(Worker, 1, policy.clone())]);
        s.run_policy.backoff_limit = Some(0);
        let mut status = TFJobStatus::default();
        for round in 0..10 {
            let o = run(&s, &status, &[disrupted(with_exit(r(Worker, 0, Phase::Failed), 143))], at(round));
            assert!(o.actions.contains(&Action::RecreateReplica { name: "job-worker-0".into(), replica_type: Worker, index: 0 }), "{policy:?} round {round}");
            assert!(!has_condition(&o.status, FAILED), "{policy:?} round {round}");
            status = o.status;
        }
        assert_eq!(status.replica_statuses["Worker"].recreated, 0, "{policy:?}");
        let o = run(&s, &status, &[with_exit(r(Worker, 0, Phase::Failed), 137)], at(11));
        assert!(has_condition(&o.status, FAILED), "{policy:?}: {:?}", conds(&o.status));
    }
}

/// A worker that finished its part is never restarted or recreated because another replica
/// failed (Kubeflow's users saw finished workers run again): only the failed pod is acted on,
/// whichever replica failed and under every policy that retries.
#[test]
fn completed_workers_are_never_restarted_when_another_replica_fails() {
    for policy in [OnFailure, ExitCode, Always] {
        for failed in [(Worker, 2), (PS, 0)] {
            let s = spec(&[(PS, 1, policy.clone()), (Worker, 3, policy.clone())]);
            let mut observed = vec![r(PS, 0, Phase::Running), r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Succeeded), r(Worker, 2, Phase::Running)];
            for o in observed.iter_mut().filter(|o| (o.replica_type, o.index) == failed) {
                *o = with_exit(r(failed.0, failed.1, Phase::Failed), 137);
            }
            let o = run(&s, &TFJobStatus::default(), &observed, t0());
            let acted: Vec<&Action> = o.actions.iter().filter(|a| !matches!(a, Action::Event { .. } | Action::RequeueAfter(_))).collect();
            let name = plan::pod_name("job", failed.0, failed.1);
            assert_eq!(acted, vec![&Action::RecreateReplica { name, replica_type: failed.0, index: failed.1 }], "{policy:?}, {failed:?} failed");
        }
    }
}

#[test]
fn restarting_then_running_again() {
    let s = spec(&[(Worker, 1, OnFailure)]);
    let o = run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Running)], t0());
    assert_eq!(conds(&o.status), vec![created(), running()]);
    let o = run(&s, &o.status, &[r(Worker, 0, Phase::Failed)], at(1));
    assert_eq!(job_phase(&o.status), RESTARTING);
    assert!(!o.status.conditions.iter().any(|c| c.type_ == RUNNING), "Restarting replaces Running");
    let o = run(&s, &o.status, &[], at(2));
    assert_eq!(non_events(&o), vec![Action::CreateReplica { replica_type: Worker, index: 0 }]);
    let o = run(&s, &o.status, &[r(Worker, 0, Phase::Running)], at(3));
    assert_eq!(conds(&o.status), vec![created(), running()]);
    assert_eq!(events(&o), vec!["TFJobRunning"]);
    // Steady state: nothing new.
    let again = run(&s, &o.status, &[r(Worker, 0, Phase::Running)], at(4));
    assert!(again.actions.is_empty());
    assert_eq!(conds(&again.status), conds(&o.status));
}

#[test]
fn suspend_and_resume() {
    let mut s = spec(&[(PS, 1, Never), (Worker, 1, Never)]);
    let o = run(&s, &TFJobStatus::default(), &[r(PS, 0, Phase::Running), r(Worker, 0, Phase::Running)], t0());
    s.run_policy.suspend = true;
    let o = run(&s, &o.status, &[r(PS, 0, Phase::Running), r(Worker, 0, Phase::Running)], at(10));
    // False conditions first: the last one is the state (`kubectl get`'s State column).
    assert_eq!(
        conds(&o.status),
        vec![c(RUNNING, "False", "TFJobRunning", "TFJob ns/job is running."), created(), c(SUSPENDED, "True", "TFJobSuspended", "TFJob ns/job is suspended."),]
    );
    assert_eq!(non_events(&o), vec![Action::DeleteReplica { name: "job-ps-0".into() }, Action::DeleteReplica { name: "job-worker-0".into() }]);
    assert_eq!(events(&o), vec!["TFJobSuspended"]);
    s.run_policy.suspend = false;
    let o = run(&s, &o.status, &[], at(100));
    assert_eq!(o.status.start_time, Some(Time(at(100))), "resume resets startTime");
    assert!(conds(&o.status).contains(&c(SUSPENDED, "False", "TFJobResumed", "TFJob ns/job is resumed.")));
    assert_eq!(events(&o), vec!["TFJobResumed"]);
    assert_eq!(non_events(&o).len(), 2);
    // Resumed, not running yet: the state shown is Created, not Suspended.
    assert_eq!(conds(&o.status).last().unwrap().0, CREATED);
    assert_eq!(job_phase(&o.status), CREATED);
}

#[test]
fn ttl_after_finished() {
    let mut s = spec(&[(Worker, 1, Never)]);
    s.run_policy.ttl_seconds_after_finished = Some(30);
    let o = run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Succeeded)], t0());
    assert_eq!(o.requeue_after(), Some(Duration::from_secs(30)));
    let o2 = run(&s, &o.status, &[r(Worker, 0, Phase::Succeeded)], at(29));
    assert_eq!(o2.requeue_after(), Some(Duration::from_secs(1)));
    let o3 = run(&s, &o.status, &[r(Worker, 0, Phase::Succeeded)], at(30));
    assert!(o3.actions.contains(&Action::DeleteJob));
}

#[test]
fn invalid_job_fails_with_warning() {
    let s = spec(&[(PS, 1, Never)]);
    let errs = crate::api::validate_spec(&s);
    let o = run_invalid(&s, &TFJobStatus::default(), &[], &errs, t0());
    let last = conds(&o.status).pop().unwrap();
    assert_eq!(
        last,
        c(
            FAILED,
            "True",
            "TFJobFailedValidation",
            "TFJob ns/job is not valid: spec.tfReplicaSpecs.PS.template.spec.containers: must contain at least one container; spec.tfReplicaSpecs: must contain a Chief, a Master or a Worker replica type"
        )
    );
    assert!(o.actions.iter().any(|a| matches!(a, Action::Event { kind: EventKind::Warning, reason, .. } if reason == "TFJobFailedValidation")));
    assert!(!o.actions.iter().any(|a| matches!(a, Action::CreateReplica { .. })));
}

#[test]
fn a_template_problem_fails_a_new_job_but_not_one_that_runs() {
    let s = spec(&[(Worker, 1, Never)]);
    let typo = FieldError::new("spec.tfReplicaSpecs.Worker.template.spec.containers[0].resource", "unknown field; did you mean \"resources\"?");
    let other = FieldError::new("spec.runPolicy.backoffLimit", "must be >= 0, got -1");
    // (started already, problems, fails)
    let cases = [
        (false, vec![typo.clone()], true),
        (true, vec![typo.clone()], false),
        (true, vec![typo.clone(), other.clone()], true),
        (false, vec![other.clone()], true),
    ];
    for (started, invalid, fails) in cases {
        let status = if started { run(&s, &TFJobStatus::default(), &[r(Worker, 0, Phase::Running)], t0()).status } else { TFJobStatus::default() };
        let observed = [r(Worker, 0, Phase::Running)];
        let o = run_invalid(&s, &status, &observed, &invalid, at(1));
        assert_eq!(has_condition(&o.status, FAILED), fails, "{started} {invalid:?}");
        if fails {
            let msg = conds(&o.status).pop().unwrap().3;
            assert!(msg.contains(&invalid.last().unwrap().to_string()), "{msg}");
        } else {
            assert!(has_condition(&o.status, RUNNING), "{o:#?}");
        }
    }
}

/// (reason, message) of every event.
fn event_texts(o: &Outcome) -> Vec<(String, String)> {
    o.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event { reason, message, .. } => Some((reason.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

fn ev(reason: &str, message: &str) -> (String, String) {
    (reason.into(), message.into())
}

fn running_all(types: &[(ReplicaType, i32)]) -> Vec<ObservedReplica> {
    types.iter().flat_map(|&(t, n)| (0..n).map(move |i| r(t, i, Phase::Running))).collect()
}

fn creates(rtype: ReplicaType, indices: &[i32]) -> Vec<Action> {
    indices.iter().map(|&index| Action::CreateReplica { replica_type: rtype, index }).collect()
}

fn deletes(names: &[&str]) -> Vec<Action> {
    names.iter().map(|n| Action::DeleteReplica { name: n.to_string() }).collect()
}

/// Scaling a running job: (name, spec before, spec after, replicas running before, expected
/// non-event actions, expected events, expected planned Worker count).
#[test]
fn scaling_table() {
    let worker_floor = "Worker replicas is 0, kept at 1: worker 0 is the chief of a job without \
                        Chief or Master and is never removed";
    type Case = (&'static str, Vec<(ReplicaType, i32)>, Vec<(ReplicaType, i32)>, Vec<Action>, Vec<(String, String)>, i32);
    let cases: Vec<Case> = vec![
        (
            "up 2 -> 4: only the missing indices are created",
            vec![(PS, 1), (Worker, 2)],
            vec![(PS, 1), (Worker, 4)],
            creates(Worker, &[2, 3]),
            vec![ev("Scaled", "Worker 2 \u{2192} 4")],
            4,
        ),
        (
            "down 4 -> 1: only the highest indices are deleted",
            vec![(PS, 1), (Worker, 4)],
            vec![(PS, 1), (Worker, 1)],
            deletes(&["job-worker-1", "job-worker-2", "job-worker-3"]),
            vec![ev("Scaled", "Worker 4 \u{2192} 1")],
            1,
        ),
        ("unchanged: no event, nothing touched", vec![(PS, 1), (Worker, 2)], vec![(PS, 1), (Worker, 2)], vec![], vec![], 2),
        (
            "down 2 -> 0 without a chief: worker 0 is kept, with a warning",
            vec![(PS, 1), (Worker, 2)],
            vec![(PS, 1), (Worker, 0)],
            deletes(&["job-worker-1"]),
            vec![ev("Scaled", "Worker 2 \u{2192} 1"), ev("ScaleLimited", worker_floor)],
            1,
        ),
        (
            "down 2 -> 0 with a chief: every worker goes, the chief stays",
            vec![(Chief, 1), (PS, 1), (Worker, 2)],
            vec![(Chief, 1), (PS, 1), (Worker, 0)],
            deletes(&["job-worker-0", "job-worker-1"]),
            vec![ev("Scaled", "Worker 2 \u{2192} 0")],
            0,
        ),
        (
            "a ps count changes too (the planning does not care which type)",
            vec![(PS, 1), (Worker, 1)],
            vec![(PS, 2), (Worker, 1)],
            creates(PS, &[1]),
            vec![ev("Scaled", "PS 1 \u{2192} 2")],
            1,
        ),
    ];
    for (name, before, after, want_actions, want_events, want_workers) in cases {
        let with = |types: &[(ReplicaType, i32)]| spec(&types.iter().map(|&(t, n)| (t, n, OnFailure)).collect::<Vec<_>>());
        let (s0, s1) = (with(&before), with(&after));
        let pods = running_all(&before);
        let first = run(&s0, &TFJobStatus::default(), &pods, t0());
        assert!(!events(&first).contains(&"Scaled".to_string()), "{name}: no Scaled event on creation");
        // What validation says of the new spec (the templates here are empty on purpose).
        let invalid: Vec<_> = crate::api::worker_floor_error(&s1).into_iter().collect();
        let o = run_invalid(&s1, &first.status, &pods, &invalid, at(5));
        assert_eq!(non_events(&o), want_actions, "{name}: actions");
        assert_eq!(event_texts(&o), want_events, "{name}: events");
        assert_eq!(o.status.replica_statuses["Worker"].replicas, Some(want_workers), "{name}: planned Worker count");
        assert!(has_condition(&o.status, RUNNING), "{name}: still running");
        // The next reconcile, with the scale carried out, announces nothing again.
        let now_running: Vec<ObservedReplica> = pods
            .iter()
            .filter(|p| !deletes_of(&o).contains(&p.name))
            .cloned()
            .chain(o.actions.iter().filter_map(|a| match a {
                Action::CreateReplica { replica_type, index } => Some(r(*replica_type, *index, Phase::Running)),
                _ => None,
            }))
            .collect();
        let again = run_invalid(&s1, &o.status, &now_running, &invalid, at(6));
        assert_eq!(again.actions, vec![], "{name}: steady after the scale");
        assert_eq!(again.status.replica_statuses["Worker"].replicas, Some(want_workers), "{name}");
    }
}

/// Lowering PS of a running job deletes the highest ps pods (each hands its state over to the ps
/// tasks that stay before it exits) with a `Scaled` event; ps 0 stays, with a warning, when PS
/// is lowered to 0; once no ps runs (a suspended job), 0 is taken.
#[test]
fn ps_tasks_are_scaled_down_from_the_highest_and_ps0_stays() {
    let with = |ps: i32| spec(&[(PS, ps, OnFailure), (Worker, 2, OnFailure)]);
    let pods = running_all(&[(PS, 3), (Worker, 2)]);
    let first = run(&with(3), &TFJobStatus::default(), &pods, t0());
    let o = run(&with(1), &first.status, &pods, at(5));
    assert_eq!(deletes_of(&o), vec!["job-ps-1".to_string(), "job-ps-2".to_string()]);
    assert_eq!(o.status.replica_statuses["PS"].replicas, Some(1));
    assert_eq!(event_texts(&o), vec![ev("Scaled", "PS 3 \u{2192} 1")]);
    let o = run(&with(0), &first.status, &pods, at(6));
    assert_eq!(o.status.replica_statuses["PS"].replicas, Some(1));
    let warning = o.actions.iter().find_map(|a| match a {
        Action::Event { reason, message, pod, .. } if reason == "ScaleLimited" => Some((message.clone(), pod.clone())),
        _ => None,
    });
    let (message, pod) = warning.expect("a ScaleLimited warning");
    assert!(message.starts_with("PS replicas is 0, kept at 1: ps 0 keeps the job's layout"), "{message}");
    assert_eq!(pod.as_deref(), Some("job-ps-0"));
    // No ps running (the job was suspended): PS 0 is planned, no warning.
    let workers_only: Vec<ObservedReplica> = pods.iter().filter(|p| p.replica_type != PS).cloned().collect();
    let o = run(&with(0), &first.status, &workers_only, at(7));
    assert_eq!(o.status.replica_statuses["PS"].replicas, Some(0));
    assert!(!events(&o).contains(&"ScaleLimited".to_string()), "{:?}", events(&o));
}

fn deletes_of(o: &Outcome) -> Vec<String> {
    o.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeleteReplica { name } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_job_below_its_chief_fails_validation() {
    let s = spec(&[(PS, 1, Never), (Worker, 0, Never)]);
    let invalid: Vec<_> = crate::api::worker_floor_error(&s).into_iter().collect();
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    let o = run_invalid(&s, &TFJobStatus::default(), &[], &invalid, t0());
    let (_, _, reason, message) = conds(&o.status).pop().unwrap();
    assert_eq!(reason, "TFJobFailedValidation");
    assert!(message.contains("spec.tfReplicaSpecs.Worker.replicas: must be at least 1"), "{message}");
    assert_eq!(non_events(&o), vec![]);
}

/// Replicas in the given phases, by type (index = position).
fn in_phases(types: &[(ReplicaType, &[Phase])]) -> Vec<ObservedReplica> {
    types.iter().flat_map(|(t, phases)| phases.iter().enumerate().map(|(i, p)| r(*t, i as i32, *p))).collect()
}

/// `enableDynamicWorker`: (name, spec, replicas in their phases, expected last condition
/// (type, message) or None when the job just runs on).
#[test]
fn dynamic_worker_failures() {
    use Phase::{Failed as F, Running as R};
    type Case = (&'static str, Vec<(ReplicaType, i32, RestartPolicy)>, Vec<ObservedReplica>, Option<(&'static str, &'static str)>);
    let cases: Vec<Case> = vec![
        (
            "chief running, one of two workers failed: tolerated",
            vec![(Chief, 1, Never), (Worker, 2, Never)],
            in_phases(&[(Chief, &[R]), (Worker, &[F, R])]),
            None,
        ),
        ("no chief, worker 1 of 3 failed: tolerated", vec![(PS, 1, Never), (Worker, 3, Never)], in_phases(&[(PS, &[R]), (Worker, &[R, F, R])]), None),
        (
            "no chief, worker 0 failed: it is the chief, the job fails",
            vec![(PS, 1, Never), (Worker, 3, Never)],
            in_phases(&[(PS, &[R]), (Worker, &[F, R, R])]),
            Some((
                FAILED,
                "TFJob ns/job has failed because Worker 0, the chief of a job without Chief or \
                 Master, failed (1 of 3 Worker replica(s) failed): pod job-worker-0 exited with \
                 code 1 (Error).",
            )),
        ),
        (
            "chief running, every worker failed: the job fails, naming how many",
            vec![(Chief, 1, Never), (PS, 2, Never), (Worker, 2, Never)],
            in_phases(&[(Chief, &[R]), (PS, &[R, R]), (Worker, &[F, F])]),
            Some((
                FAILED,
                "TFJob ns/job has failed because all 2 Worker replica(s) failed: pod job-worker-0 \
                 exited with code 1 (Error); pod job-worker-1 exited with code 1 (Error).",
            )),
        ),
        (
            "no chief, every worker failed (exit 3 each, the issue's hang): fails",
            vec![(PS, 2, Never), (Worker, 3, Never)],
            in_phases(&[(PS, &[R, R])]).into_iter().chain((0..3).map(|i| with_exit(r(Worker, i, F), 3))).collect(),
            Some((
                FAILED,
                "TFJob ns/job has failed because all 3 Worker replica(s) failed: pod job-worker-0 \
                 exited with code 3 (Error); pod job-worker-1 exited with code 3 (Error); pod \
                 job-worker-2 exited with code 3 (Error).",
            )),
        ),
        (
            "the chief failed: fails as in any job",
            vec![(Chief, 1, Never), (Worker, 2, Never)],
            in_phases(&[(Chief, &[F]), (Worker, &[R, R])]),
            Some((
                FAILED,
                "TFJob ns/job has failed because 1 Chief replica(s) failed: pod job-chief-0 exited \
                 with code 1 (Error).",
            )),
        ),
        (
            "a worker that its policy restarts is not lost",
            vec![(PS, 1, Never), (Worker, 1, OnFailure)],
            in_phases(&[(PS, &[R]), (Worker, &[F])]),
            Some((
                RESTARTING,
                "TFJob ns/job is restarting because 1 Worker replica(s) failed: pod job-worker-0 \
                 exited with code 1 (Error).",
            )),
        ),
    ];
    for (name, types, observed, want) in cases {
        let mut s = spec(&types);
        s.enable_dynamic_worker = Some(true);
        let o = run(&s, &TFJobStatus::default(), &observed, t0());
        match want {
            None => {
                assert!(!has_condition(&o.status, FAILED), "{name}: {o:#?}");
                assert!(has_condition(&o.status, RUNNING), "{name}: {o:#?}");
            }
            Some((type_, message)) => {
                let (t, status, _, msg) = conds(&o.status).pop().unwrap();
                assert_eq!((t.as_str(), status.as_str(), msg.as_str()), (type_, "True", message), "{name}");
            }
        }
    }
}

/// `workerShares`: (name, succeededPercent, failedPercent, the workers' phases (1 ps running,
/// 4 workers, `Never`), expected last condition (type, message) or None when the job runs on).
#[test]
fn success_and_failure_by_a_share_of_the_workers() {
    use Phase::{Failed as F, Running as R, Succeeded as S};
    type Case = (&'static str, Option<i32>, Option<i32>, [Phase; 4], Option<(&'static str, &'static str)>);
    let cases: Vec<Case> = vec![
        ("1 of 4 failed, 25 % tolerated: runs on, not restarted", None, Some(25), [R, R, R, F], None),
        (
            "2 of 4 failed, 25 % tolerated: fails, saying the share",
            None,
            Some(25),
            [R, R, F, F],
            Some((
                FAILED,
                "TFJob ns/job has failed because 2 of 4 Worker replica(s) failed, more than \
                 workerShares.failedPercent (25 %): pod job-worker-2 exited with code 1 (Error); \
                 pod job-worker-3 exited with code 1 (Error).",
            )),
        ),
        (
            "0 % tolerated: the first failure fails the job",
            None,
            Some(0),
            [R, F, R, R],
            Some((
                FAILED,
                "TFJob ns/job has failed because 1 of 4 Worker replica(s) failed, more than \
                 workerShares.failedPercent (0 %): pod job-worker-1 exited with code 1 (Error).",
            )),
        ),
        (
            "worker 0, the chief, failed: fails whatever the share",
            None,
            Some(50),
            [F, R, R, R],
            Some((
                FAILED,
                "TFJob ns/job has failed because Worker 0, the chief of a job without Chief or \
                 Master, failed (1 of 4 Worker replica(s) failed): pod job-worker-0 exited with \
                 code 1 (Error).",
            )),
        ),
        ("3 of 4 succeeded, 75 % needed: succeeds", Some(75), None, [R, S, S, S], Some((SUCCEEDED, "TFJob ns/job successfully completed."))),
        ("2 of 4 succeeded, 75 % needed: runs on", Some(75), None, [R, S, S, R], None),
        (
            "3 of 4 succeeded and 1 failed, both shares met: succeeds",
            Some(75),
            Some(25),
            [S, S, S, F],
            Some((SUCCEEDED, "TFJob ns/job successfully completed.")),
        ),
    ];
    for (name, succeeded, failed, workers, want) in cases {
        let mut s = spec(&[(PS, 1, Never), (Worker, 4, Never)]);
        s.success_policy = Some(SuccessPolicy::AllWorkers);
        s.worker_shares = Some(crate::api::WorkerShares { succeeded_percent: succeeded, failed_percent: failed });
        let observed = in_phases(&[(PS, &[R]), (Worker, &workers)]);
        let o = run(&s, &TFJobStatus::default(), &observed, t0());
        assert!(!o.actions.iter().any(|a| matches!(a, Action::RecreateReplica { .. } | Action::CreateReplica { .. })), "{name}: {:?}", o.actions);
        match want {
            None => {
                assert!(!has_condition(&o.status, FAILED) && !has_condition(&o.status, SUCCEEDED), "{name}: {o:#?}");
                assert!(has_condition(&o.status, RUNNING), "{name}: {o:#?}");
            }
            Some((type_, message)) => {
                let (t, status, _, msg) = conds(&o.status).pop().unwrap();
                assert_eq!((t.as_str(), status.as_str(), msg.as_str()), (type_, "True", message), "{name}");
            }
        }
    }
}

#[test]
fn terminating_pods_are_neither_counted_nor_duplicated() {
    let s = spec(&[(Worker, 1, Never)]);
    let w = ObservedReplica { terminating: true, ..r(Worker, 0, Phase::Running) };
    let o = run(&s, &TFJobStatus::default(), &[w], t0());
    assert_eq!(non_events(&o), vec![]);
    assert_eq!(o.status.replica_statuses["Worker"].active, 0);
}

#[test]
fn the_final_condition_is_the_first_true_succeeded_or_failed() {
    let c =
        |type_: &str, status: &str| JobCondition { type_: type_.into(), status: status.into(), reason: Some(format!("{type_}{status}")), ..Default::default() };
    let of = |conditions: Vec<JobCondition>| TFJobStatus { conditions, ..Default::default() };
    let cases = [
        (of(vec![]), None),
        (of(vec![c(CREATED, "True"), c(RUNNING, "True")]), None),
        (of(vec![c(RUNNING, "False"), c(FAILED, "False")]), None),
        (of(vec![c(RUNNING, "False"), c(SUCCEEDED, "True")]), Some("SucceededTrue")),
        (of(vec![c(FAILED, "True"), c(SUCCEEDED, "True")]), Some("FailedTrue")),
    ];
    for (status, want) in cases {
        assert_eq!(final_condition(&status).and_then(|c| c.reason.as_deref()), want, "{status:?}");
        assert_eq!(is_finished(&status), want.is_some(), "{status:?}");
    }
}

/// (case, running replicas at the interrupt, finished before it): what an interrupted run leaves.
#[test]
fn an_interrupted_run_is_failed_with_reason_interrupted_unless_it_had_finished() {
    let s = spec(&[(PS, 1, OnFailure), (Worker, 2, OnFailure)]);
    let all = [r(PS, 0, Phase::Running), r(Worker, 0, Phase::Running), r(Worker, 1, Phase::Running)];
    let started = run(&s, &TFJobStatus::default(), &[], t0()).status;
    let running_status = run(&s, &started, &all, at(1)).status;
    let done = [r(PS, 0, Phase::Running), r(Worker, 0, Phase::Succeeded), r(Worker, 1, Phase::Succeeded)];
    let succeeded_status = run(&s, &running_status, &done, at(2)).status;
    assert_eq!(job_phase(&running_status), RUNNING);
    assert_eq!(job_phase(&succeeded_status), SUCCEEDED);
    let cases: [(&str, &TFJobStatus, &str, usize); 3] = [
        ("never started", &TFJobStatus::default(), FAILED, 1),
        ("running", &running_status, FAILED, 1),
        ("succeeded before the signal", &succeeded_status, SUCCEEDED, 0),
    ];
    for (case, before, phase, events) in cases {
        let mut st = before.clone();
        let actions = interrupt(&mut st, at(5), "tfjob run stopped by Ctrl-C");
        assert_eq!(job_phase(&st), phase, "{case}: {:?}", conds(&st));
        assert_eq!(actions.len(), events, "{case}: {actions:?}");
        assert!(!has_condition(&st, RUNNING), "{case}: still Running: {:?}", conds(&st));
        if phase == FAILED {
            let last = conds(&st).pop().unwrap();
            assert_eq!(last, c(FAILED, "True", INTERRUPTED, "tfjob run stopped by Ctrl-C"), "{case}");
            assert_eq!(st.completion_time, Some(Time(at(5))), "{case}");
        } else {
            assert_eq!(&st, before, "{case}: a finished job keeps its status");
        }
    }
}

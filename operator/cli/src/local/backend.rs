//! The contract between the driver of `tfjob run` ([`super::driver`]) and the backends that
//! run its replicas ([`super::process`], [`super::container`]): the [`Backend`] trait, what a
//! backend reports ([`Observed`]) and how it fails ([`RunError`]), and the kubelet's rules
//! every backend follows (restarts in place, final phases, the container's environment).
//!
//! Backends import this module, never the driver.

use tfjob_api::api::{ManifestError, ReplicaType};
use tfjob_api::plan::{ENV_TOKEN, PlannedReplica};
use tfjob_api::status::{self, ObservedReplica};

use super::expand;

/// Errors that stop `tfjob run` before or while it runs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Manifest { path: String, source: ManifestError },
    #[error("{0}: no TFJob found")]
    Empty(String),
    #[error("{path}: holds {count} TFJobs; `tfjob run` runs one job at a time")]
    Several { path: String, count: usize },
    #[error("replica {replica}: {reason}")]
    Start { replica: String, reason: String },
    #[error("run directory {path}: {source}")]
    RunDir { path: String, source: std::io::Error },
    #[error("{0}")]
    Backend(String),
}

/// What a backend reports about one replica (the pod's phase and its
/// `tensorflow` container's last exit code and restarts).
pub type Observed = ObservedReplica;

/// Where replicas run: processes or containers. A backend plays the kubelet:
/// it restarts a replica in place when its pod restart policy says so
/// (`Always`, `OnFailure`), counting restarts, and reports `Failed` or
/// `Succeeded` otherwise.
pub trait Backend {
    /// `host:port` of a replica as the other replicas reach it.
    fn address(&self, rtype: ReplicaType, index: i32, port: i32) -> String;
    /// Starts (or starts again, as a new pod) a replica.
    fn start(&mut self, replica: &PlannedReplica, token: &str) -> Result<(), RunError>;
    /// Stops a replica and forgets it (a deleted pod).
    fn delete(&mut self, name: &str);
    /// The replicas as they are now; restarts replicas in place when due.
    fn observe(&mut self) -> Vec<Observed>;
    /// Stops everything (end of the run, Ctrl-C): nothing is left behind.
    fn shutdown(&mut self);
    /// Where this machine reads a replica's metrics page (ps 0's holds the job's progress),
    /// when it serves one that this machine can reach.
    fn metrics_url(&self, _pod_name: &str) -> Option<String> {
        None
    }
}

/// How long a deleted replica is given between SIGTERM and SIGKILL: a ps
/// removed by a scale-down hands its state over to the ps tasks that stay
/// before it exits (within its own `--shutdown_grace_secs`, 30 s by
/// default, as a pod's `terminationGracePeriodSeconds`); other replicas
/// stop at once.
pub fn stop_grace(rtype: ReplicaType) -> std::time::Duration {
    std::time::Duration::from_secs(if rtype == ReplicaType::PS { 30 } else { 3 })
}

/// The kubelet's decision when the container of a pod with this restart
/// policy (`Always`, `OnFailure`, `Never`) exits with `code`: restart it in
/// place (`Always`, or `OnFailure` on a non-zero code), or let the pod end.
pub fn restarts_in_place(pod_restart_policy: &str, code: i32) -> bool {
    match pod_restart_policy {
        "Always" => true,
        "OnFailure" => code != 0,
        _ => false,
    }
}

/// `; its last error: LINE` for the message of a replica's exit, or nothing
/// when it printed no error line.
pub fn last_error_suffix(line: Option<String>) -> String {
    line.map(|l| format!("; its last error: {l}")).unwrap_or_default()
}

/// What a backend reports for one of its replicas.
pub fn observed(name: &str, planned: &PlannedReplica, phase: status::Phase, exit_code: Option<i32>, restart_count: i32) -> ObservedReplica {
    ObservedReplica {
        replica_type: planned.replica_type,
        index: planned.index,
        name: name.to_string(),
        phase,
        exit_code,
        exit_reason: None,
        restart_count,
        terminating: false,
        unschedulable: None,
        disrupted: false,
    }
}

/// The environment of a planned replica's container as the kubelet builds it: the replica's
/// env with each value's `$(VAR)` references expanded ([`expand`]), then `TFJOB_TOKEN` (on a
/// cluster it comes from the job's Secret, and such values are not expanded). A backend
/// expands `command` and `args` against it.
pub fn replica_environment(planned: &PlannedReplica, token: &str) -> expand::Environment {
    let mut env = expand::Environment::of_values(planned.env.iter().filter(|(name, _)| name != ENV_TOKEN));
    env.define(ENV_TOKEN, token.to_string());
    env
}

/// Phase of a pod whose container ended for good.
pub fn final_phase(code: i32) -> status::Phase {
    if code == 0 { status::Phase::Succeeded } else { status::Phase::Failed }
}

/// The short name of a replica used for logs: `worker-1`.
pub fn short_name(job: &str, pod_name: &str) -> String {
    pod_name.strip_prefix(&format!("{job}-")).unwrap_or(pod_name).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tfjob_api::api::RestartPolicy;

    #[test]
    fn kubelet_restart_decisions() {
        let cases = [
            (RestartPolicy::Always, 0, true),
            (RestartPolicy::Always, 1, true),
            (RestartPolicy::OnFailure, 0, false),
            (RestartPolicy::OnFailure, 137, true),
            (RestartPolicy::Never, 1, false),
            // ExitCode maps to a `Never` pod: the controller recreates it.
            (RestartPolicy::ExitCode, 137, false),
        ];
        for (policy, code, want) in cases {
            assert_eq!(restarts_in_place(policy.pod_restart_policy(), code), want, "{policy:?} {code}");
        }
        assert_eq!(final_phase(0), status::Phase::Succeeded);
        assert_eq!(final_phase(2), status::Phase::Failed);
    }

    #[test]
    fn short_names() {
        assert_eq!(short_name("linreg", "linreg-worker-1"), "worker-1");
        assert_eq!(short_name("a", "b-ps-0"), "b-ps-0");
    }
}

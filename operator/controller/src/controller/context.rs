//! What every reconcile shares: the client, the event queue, the planner's settings, the
//! metrics, the clock, which jobs this operator takes, the watch caches and what the controller
//! remembers of its own writes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::PostParams;
use kube::runtime::events::Reporter;
use tfjob_api::api;
use tfjob_api::plan::PlanOptions;

use super::cache::{Caches, Expectations, Once, StatusWrites};
use super::event_queue::EventQueue;
use crate::metrics::Metrics;

/// Field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "tfjob-operator";

/// How long a reconcile may take by default. The operator creates 110-160 pods a second on the
/// test control plane (BENCHMARKS.md, "The operator against its limit"): the first reconcile of
/// a 10,000-replica job takes one to two minutes. One cut short goes on at its retry.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(300);

/// Shared state of the reconciler.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Where reconciles queue their Events (written by a task of their own).
    pub events: EventQueue,
    /// Planner settings.
    pub opts: PlanOptions,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Clock (overridable in tests).
    pub now: fn() -> Timestamp,
    /// Which jobs this operator takes (`--beside-kubeflow`).
    pub claim: api::Claim,
    /// The watch caches of the jobs' pods and Services.
    pub caches: Caches,
    /// Pod writes the pod cache does not show yet, per job.
    pub expectations: Expectations,
    /// Status writes the TFJob cache does not show yet, per job.
    pub status_writes: StatusWrites,
    /// Jobs whose Secret (token, and CA) this process has created (or found to exist).
    pub secrets: Once,
    /// The seed every job's TLS CA is derived from ([`tfjob_api::pki::JobCa::derive`]): the
    /// same for every operator replica and across restarts ([`crate::startup`] reads it from
    /// its Secret); a random one until then.
    pub tls_seed: Vec<u8>,
    /// Versions of jobs (`<uid>/<generation>`) whose PodGroup this process has applied.
    pub pod_groups: Once,
    /// Suspended jobs whose PodGroup this process has deleted.
    pub released_pod_groups: Once,
    /// Hold the pods of a job labelled for Kueue beyond what its Workload admitted
    /// ([`super::admission`]).
    pub kueue_admission: bool,
    /// Run a job labelled for Kueue as a plain pod group of Kueue's `pod` integration
    /// ([`super::kueue_group`]).
    pub kueue_pod_groups: bool,
    /// Why a job's pods wait (`<job>/<reason>/<message>`), said once.
    pub held: Once,
    /// Versions of jobs (`<uid>/<generation>`) whose HorizontalPodAutoscaler this process has
    /// applied.
    pub autoscalers: Once,
    /// How long a reconcile may take before it is abandoned ([`super::Error::Timeout`]).
    pub reconcile_timeout: Duration,
}

impl Context {
    /// A context with the default reporter `tfjob-operator`, reading pods and Services from
    /// `caches` (see [`super::build_controller`]). Starts the task that writes its Events on
    /// the current tokio runtime.
    pub fn new(client: Client, opts: PlanOptions, caches: Caches) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.to_string(), instance: std::env::var("POD_NAME").ok() };
        let metrics = Arc::new(Metrics::default());
        Context {
            events: EventQueue::start(client.clone(), reporter, metrics.clone()),
            client,
            opts,
            metrics,
            now: Timestamp::now,
            claim: api::Claim::default(),
            caches,
            expectations: Expectations::default(),
            status_writes: StatusWrites::default(),
            secrets: Once::default(),
            tls_seed: tfjob_api::pki::random_seed().to_vec(),
            pod_groups: Once::default(),
            released_pod_groups: Once::default(),
            kueue_admission: true,
            kueue_pod_groups: false,
            held: Once::default(),
            autoscalers: Once::default(),
            reconcile_timeout: RECONCILE_TIMEOUT,
        }
    }

    /// Drops what the context remembers of a job that is gone (`key`: its uid, or
    /// `<namespace>/<name>` without one).
    pub fn forget(&self, key: &str, uid: &str) {
        self.expectations.forget(key);
        self.status_writes.forget(key);
        self.forget_once_objects(uid);
    }

    /// Forgets the once-per-job objects of every job not in `live` (uids): a job deleted while
    /// it ran is not reconciled again, so [`forget`](Self::forget) never ran for it. Returns
    /// how many entries went.
    pub fn forget_gone(&self, live: &std::collections::HashSet<String>) -> usize {
        [&self.secrets, &self.pod_groups, &self.released_pod_groups, &self.held, &self.autoscalers].iter().map(|once| once.retain_jobs(live)).sum::<usize>()
            + self.status_writes.retain_jobs(live)
    }

    /// A finished job creates nothing any more: its token Secret and PodGroup are not written
    /// again.
    pub fn forget_once_objects(&self, uid: &str) {
        self.secrets.forget(uid);
        self.pod_groups.forget_prefix(&format!("{uid}/"));
        self.released_pod_groups.forget(uid);
        self.held.forget_prefix(&format!("{uid}/"));
    }
}

/// Parameters of every create, with this controller as the field manager.
pub fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() }
}

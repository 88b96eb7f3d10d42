//! The parameter server: a variable store with optimizers applied in place,
//! the sync accumulator, and the gRPC service around them.
//!
//! [`ParameterStore`] is synchronous and does all the checking; the gRPC
//! service only collects streams, waits on the sync barrier and maps errors
//! to status codes. Nothing received from the network can panic the store
//! or change a variable unless the whole request is valid.
//!
//! One lock guards the store's state, which is composed of parts that each
//! own theirs (every public method takes the lock once, none across an
//! await; the push and pull paths hold it for one request):
//! - `variables`: the variables and embedding partitions, their encoded
//!   parts, the traffic counters; the pulls.
//! - `membership`: leases of the training tasks, the tasks waited for at
//!   the end, push ids; a task leaving or lost ([`ParameterStore::leave`],
//!   [`ParameterStore::expire_leases`]).
//! - `training`: the training agreement (view, configuration, optimizer,
//!   sync accumulator, step, end of training); handshake, initialisation,
//!   pushes, abstentions, shutdown.
//! - `dispatching`: the shard dispatcher of ps 0.
//! - `checkpointing`: a ps's checkpoint shard, written and restored.
//! - `service`: the gRPC service and the tensor channel's entry.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tonic::Status;

use crate::cluster::TaskId;
use crate::{embedding, proto, tensor};

mod checkpointing;
mod dispatching;
mod membership;
mod service;
mod training;
mod variables;

#[cfg(test)]
mod tests;

pub use service::{PsService, Pulled, SharedPull};
pub use training::check_training_config;
pub use variables::{GrpcPull, MAX_PUSH_ROWS_BYTES, PulledRows, SharedVariable};

/// Why the store refused a request; each maps to one gRPC status code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
}

static BAD_REQUESTS: crate::auth::RefusalLog = crate::auth::RefusalLog::new("invalid");

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        if matches!(e, StoreError::InvalidArgument(_) | StoreError::NotFound(_) | StoreError::PermissionDenied(_)) {
            BAD_REQUESTS.note(&e.to_string());
        }
        match e {
            StoreError::InvalidArgument(m) => Status::invalid_argument(m),
            StoreError::NotFound(m) => Status::not_found(m),
            StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
            StoreError::PermissionDenied(m) => Status::permission_denied(m),
        }
    }
}

impl From<tensor::TensorError> for StoreError {
    fn from(e: tensor::TensorError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

impl From<embedding::RowError> for StoreError {
    fn from(e: embedding::RowError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

/// What a ps knows about its cluster.
#[derive(Debug, Clone)]
pub struct PsConfig {
    pub ps_index: usize,
    /// 0: unknown (a sparse `TF_CONFIG` that lists only this ps): the first
    /// caller's count is taken, and every later caller must agree with it.
    pub num_ps: usize,
    /// The only task allowed to initialise variables and shut the ps down.
    /// `None` lets any task do it (a ps started without a cluster, in tests).
    pub chief: Option<TaskId>,
    /// How long a training task's lease lasts without a call or heartbeat.
    pub lease: Duration,
}

impl PsConfig {
    /// A ps of `num_ps` with the default lease (10 s).
    pub fn new(ps_index: usize, num_ps: usize, chief: Option<TaskId>) -> Self {
        PsConfig { ps_index, num_ps, chief, lease: Duration::from_secs(10) }
    }
}

/// Step, initialisation and end of training, published to waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub step: i64,
    pub initialized: bool,
    pub done: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub pushes_applied: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// Everything the lock guards, by owner.
#[derive(Debug)]
struct State {
    vars: variables::Variables,
    members: membership::Membership,
    training: training::Training,
    dispatch: dispatching::Dispatching,
}

pub struct ParameterStore {
    config: PsConfig,
    state: Mutex<State>,
    progress: watch::Sender<Progress>,
}

/// The task a request names, checked.
fn task_of(t: &Option<proto::TaskId>, field: &str) -> Result<TaskId, StoreError> {
    let t = t.as_ref().ok_or_else(|| StoreError::InvalidArgument(format!("{field}: missing")))?;
    if t.job.is_empty() {
        return Err(StoreError::InvalidArgument(format!("{field}.job: empty")));
    }
    Ok(TaskId::from(t))
}

impl ParameterStore {
    pub fn new(config: PsConfig) -> Self {
        let (progress, _) = watch::channel(Progress::default());
        let state = State {
            vars: Default::default(),
            members: membership::Membership::new(config.lease),
            training: training::Training::new(config.num_ps),
            dispatch: dispatching::Dispatching::new(),
        };
        ParameterStore { config, state: Mutex::new(state), progress }
    }

    pub fn config(&self) -> &PsConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied update
        // visible (updates are applied after every check), so poisoning is
        // recovered from rather than propagated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    pub fn progress(&self) -> Progress {
        self.lock().training.progress
    }

    /// Called with the state locked, so waiters see steps in order.
    fn publish(&self, p: Progress) {
        self.progress.send_if_modified(|cur| {
            let changed = *cur != p;
            *cur = p;
            changed
        });
    }

    fn check_chief(&self, task: &TaskId, what: &str) -> Result<(), StoreError> {
        match &self.config.chief {
            Some(chief) if chief != task => Err(StoreError::PermissionDenied(format!("only the chief ({chief}) may {what}; {task} asked"))),
            _ => Ok(()),
        }
    }

    pub fn stats(&self) -> proto::StatsReply {
        let state = self.lock();
        let training = &state.training;
        let (stale, dup) = training.accumulator.as_ref().map_or((0, 0), |a| (a.stale_dropped, a.duplicates_dropped));
        let counters = &state.vars.counters;
        proto::StatsReply {
            ps_index: self.config.ps_index as u32,
            initialized: training.progress.initialized,
            done: training.progress.done,
            step: training.progress.step,
            pushes_applied: counters.pushes_applied,
            stale_gradients_dropped: stale,
            duplicate_gradients_dropped: dup + state.members.duplicate_pushes,
            bytes_received: counters.bytes_received,
            bytes_sent: counters.bytes_sent,
            variables: state.vars.stats(),
            config: training.agreement.as_ref().and_then(|a| a.config),
            live_tasks: state.members.live_tasks(),
            replicas_to_aggregate: training.accumulator.as_ref().map_or(0, |a| a.required() as u32),
            dispatch: state.dispatch.progress().map(|p| proto::DispatchProgress::from(&p)),
            pending: state.members.pending(),
        }
    }
}

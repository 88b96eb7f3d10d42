//! The store itself: its configuration, the lock over its [`State`], and
//! the progress it publishes to waiters. What a request does under the lock
//! is in the files named after the part it concerns.

use std::sync::atomic::AtomicUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::error::StoreError;
use super::state::{Dispatching, LayoutState, Membership, Progress, Reports, State, Training};
use crate::cluster::TaskId;
use crate::proto;

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
    /// Every ps task's address as this ps started (ps 0 starts the job's
    /// layout from it; empty where not known).
    pub ps_addresses: Vec<String>,
}

impl PsConfig {
    /// A ps of `num_ps` with the default lease (10 s).
    pub fn new(ps_index: usize, num_ps: usize, chief: Option<TaskId>) -> Self {
        PsConfig { ps_index, num_ps, chief, lease: Duration::from_secs(10), ps_addresses: Vec::new() }
    }
}

pub struct ParameterStore {
    pub(super) config: PsConfig,
    state: Mutex<State>,
    progress: watch::Sender<Progress>,
    /// Replies of the tensor channel being computed or written ([`Self::reply_on_its_way`]).
    pub(super) replies_on_their_way: AtomicUsize,
}

impl ParameterStore {
    pub fn new(config: PsConfig) -> Self {
        let (progress, _) = watch::channel(Progress::default());
        let state = State {
            vars: Default::default(),
            members: Membership::new(config.lease),
            training: Training::new(config.num_ps),
            dispatch: Dispatching::new(),
            pending_recut: None,
            layout: LayoutState::new(config.ps_addresses.clone()),
            reports: Reports::default(),
        };
        ParameterStore { config, state: Mutex::new(state), progress, replies_on_their_way: AtomicUsize::new(0) }
    }

    pub fn config(&self) -> &PsConfig {
        &self.config
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
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
    pub(super) fn publish(&self, p: Progress) {
        self.progress.send_if_modified(|cur| {
            let changed = *cur != p;
            *cur = p;
            changed
        });
    }

    pub(super) fn check_chief(&self, task: &TaskId, what: &str) -> Result<(), StoreError> {
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
            loss: state.reports.loss,
            train_steps: state.reports.train_steps,
            evaluation: state.reports.evaluation,
        }
    }
}

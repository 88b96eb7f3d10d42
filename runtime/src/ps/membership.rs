//! Who a ps serves: the training tasks with a live lease, the tasks it waits
//! for before exiting once training is over, and the last push id of each
//! (a retried push is applied once).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::ParameterStore;
use crate::cluster::TaskId;
use crate::proto;

#[derive(Debug)]
pub(super) struct Membership {
    /// How long a training task's lease lasts without a call or heartbeat.
    lease: Duration,
    /// Tasks that joined and have not yet seen the end of training.
    pending: BTreeSet<String>,
    /// Training tasks and when their lease expires.
    leases: BTreeMap<String, Instant>,
    /// Last push id applied per task (retries are not applied twice).
    last_push: BTreeMap<String, u64>,
    pub(super) duplicate_pushes: u64,
}

impl Membership {
    pub(super) fn new(lease: Duration) -> Self {
        Membership { lease, pending: BTreeSet::new(), leases: BTreeMap::new(), last_push: BTreeMap::new(), duplicate_pushes: 0 }
    }

    /// Renews the lease of a training task (an evaluator holds none).
    pub(super) fn renew(&mut self, task: &TaskId) {
        if task.job != "evaluator" {
            self.leases.insert(task.to_string(), Instant::now() + self.lease);
        }
    }

    /// Training tasks with a live lease: how many a sync step of elastic
    /// training waits for (at least one).
    pub(super) fn live(&self) -> usize {
        self.leases.len().max(1)
    }

    pub(super) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    pub(super) fn live_tasks(&self) -> Vec<String> {
        self.leases.keys().cloned().collect()
    }

    pub(super) fn pending(&self) -> Vec<String> {
        self.pending.iter().cloned().collect()
    }

    /// Waits for `task` before exiting once training is over.
    pub(super) fn wait_for(&mut self, task: &TaskId) {
        self.pending.insert(task.to_string());
    }

    /// Records push `push_id` of `worker` (0: no id); false when it was
    /// applied already (a retry), which is counted.
    pub(super) fn first_push(&mut self, worker: &str, push_id: u64) -> bool {
        if push_id > 0 {
            if self.last_push.get(worker).is_some_and(|&last| push_id <= last) {
                self.duplicate_pushes += 1;
                return false;
            }
            self.last_push.insert(worker.to_string(), push_id);
        }
        true
    }

    /// Leases that ran out by `now`.
    fn expired(&self, now: Instant) -> Vec<String> {
        self.leases.iter().filter(|(_, until)| **until <= now).map(|(t, _)| t.clone()).collect()
    }

    /// `task` is gone: neither waited for nor live any more. True when it
    /// held a lease.
    fn forget(&mut self, task: &str) -> bool {
        self.pending.remove(task);
        self.leases.remove(task).is_some()
    }
}

impl ParameterStore {
    /// Renews a task's lease on any call.
    pub fn touch(&self, task: &TaskId) {
        let mut state = self.lock();
        if state.members.leases.contains_key(&task.to_string()) {
            state.members.renew(task);
        }
    }

    /// A training task is alive (heartbeat).
    pub fn heartbeat(&self, task: &TaskId) -> proto::HeartbeatReply {
        let mut state = self.lock();
        state.members.renew(task);
        let p = state.training.progress;
        proto::HeartbeatReply { step: p.step, done: p.done, live_tasks: state.members.lease_count() as u32 }
    }

    /// Expires leases that ran out by `now`; with elastic sync training the
    /// step then aggregates over fewer workers and may complete at once.
    pub fn expire_leases(&self, now: Instant) -> Vec<String> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let expired = state.members.expired(now);
        let mut live_left = false;
        for t in &expired {
            // Gone without a word (killed, node lost): not waited for at the end either.
            tracing::info!("ps:{}: lease of {t} expired", self.config.ps_index);
            live_left |= self.forget_task(state, t);
        }
        if live_left {
            self.after_departure(state);
        }
        expired
    }

    /// A task left the job: it is neither waited for nor counted as live.
    pub fn leave(&self, task: &TaskId) {
        let mut guard = self.lock();
        let state = &mut *guard;
        if self.forget_task(state, &task.to_string()) {
            self.after_departure(state);
        }
    }

    /// A task is gone (its lease expired, or it left): not waited for, not
    /// live, its shards back to todo. True when it held a lease.
    fn forget_task(&self, state: &mut super::State, task: &str) -> bool {
        let live = state.members.forget(task);
        state.dispatch.release(self.config.ps_index, task);
        live
    }

    /// A live task is gone: an elastic sync step aggregates over fewer and
    /// may complete at once.
    fn after_departure(&self, state: &mut super::State) {
        let p = state.training.progress;
        if p.initialized && !p.done {
            state.training.finish_ready_step(&mut state.vars, state.members.live());
            self.publish(state.training.progress);
        }
    }

    /// Training tasks with a live lease.
    pub fn live_tasks(&self) -> Vec<String> {
        self.lock().members.live_tasks()
    }

    /// Training tasks of the cluster spec (the chief aside): the ps waits for
    /// them too when training ends, not only for those that joined. A worker
    /// that starts late (a short job can end before it connects) then still
    /// finds the ps and is told training is over, instead of retrying an
    /// address nobody serves any more. Bounded by the grace period like the rest.
    pub fn expect(&self, tasks: &[TaskId]) {
        let mut state = self.lock();
        for t in tasks {
            if Some(t) != self.config.chief.as_ref() && !state.training.progress.done {
                state.members.wait_for(t);
            }
        }
    }

    /// A task left, or was told training is over: the ps no longer waits for it.
    pub fn release(&self, task: &TaskId) {
        self.lock().members.pending.remove(&task.to_string());
    }

    /// Tasks the ps still waits for before exiting after training ended.
    pub fn pending(&self) -> Vec<String> {
        self.lock().members.pending()
    }
}

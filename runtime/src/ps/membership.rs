//! A training task's lease, its departure or loss (one `forget_task` for
//! both), and the tasks a ps waits for at the end, under the store's lock.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::state::State;
use super::store::ParameterStore;
use crate::cluster::TaskId;
use crate::proto;

impl ParameterStore {
    /// Renews a task's lease on any call.
    pub fn touch(&self, task: &TaskId) {
        let mut state = self.lock();
        if state.members.leases.contains_key(&task.to_string()) {
            state.members.renew(task);
        }
    }

    /// A task is alive (heartbeat): a training task's lease is renewed (an
    /// evaluator holds none: its heartbeat only reports), and the figures
    /// `report` carries are kept for the metrics.
    pub fn heartbeat(&self, task: &TaskId, report: &proto::HeartbeatRequest) -> proto::HeartbeatReply {
        let mut state = self.lock();
        state.members.renew(task);
        state.reports.note(report);
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
    fn forget_task(&self, state: &mut State, task: &str) -> bool {
        let live = state.members.forget(task);
        state.dispatch.release(self.config.ps_index, task);
        live
    }

    /// A live task is gone: an elastic sync step aggregates over fewer and
    /// may complete at once.
    fn after_departure(&self, state: &mut State) {
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

    /// A task was told training is over: the ps no longer waits for it. An
    /// evaluator still is: told, it starts its final evaluation, and the
    /// chief (which ends the job once the ps waits for no evaluator) must
    /// not end the job under it; it is released when it leaves.
    pub fn told_training_is_over(&self, task: &TaskId) {
        if task.job != "evaluator" {
            self.lock().members.pending.remove(&task.to_string());
        }
    }

    /// Tasks the ps still waits for before exiting after training ended.
    pub fn pending(&self) -> Vec<String> {
        self.lock().members.pending()
    }

    /// A reply about to be computed and written. A task counts as told that training is over
    /// when its reply is computed; until that reply is written, the ps must not exit (its
    /// connections would close under it, and the task would take the lost reply for a lost ps
    /// and wait to rejoin one that is gone). Held until the reply is written.
    pub fn reply_on_its_way(&self) -> ReplyOnItsWay<'_> {
        self.replies_on_their_way.fetch_add(1, Ordering::SeqCst);
        ReplyOnItsWay(self)
    }

    /// Whether the ps must wait before it exits: a task not told yet, or a reply on its way.
    pub fn still_telling(&self) -> bool {
        self.replies_on_their_way.load(Ordering::SeqCst) > 0 || !self.pending().is_empty()
    }
}

/// A reply on its way ([`ParameterStore::reply_on_its_way`]), until dropped.
pub struct ReplyOnItsWay<'a>(&'a ParameterStore);

impl Drop for ReplyOnItsWay<'_> {
    fn drop(&mut self) {
        self.0.replies_on_their_way.fetch_sub(1, Ordering::SeqCst);
    }
}

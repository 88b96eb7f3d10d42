//! Who a ps serves: the training tasks with a live lease, the tasks it waits
//! for before exiting once training is over, and the last push id of each
//! (a retried push is applied once).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::cluster::TaskId;

#[derive(Debug)]
pub(in crate::ps) struct Membership {
    /// How long a training task's lease lasts without a call or heartbeat.
    lease: Duration,
    /// Tasks that joined and have not yet seen the end of training.
    pub(in crate::ps) pending: BTreeSet<String>,
    /// Training tasks and when their lease expires.
    pub(in crate::ps) leases: BTreeMap<String, Instant>,
    /// Last push id applied per task (retries are not applied twice).
    last_push: BTreeMap<String, u64>,
    pub(in crate::ps) duplicate_pushes: u64,
}

impl Membership {
    pub(in crate::ps) fn new(lease: Duration) -> Self {
        Membership { lease, pending: BTreeSet::new(), leases: BTreeMap::new(), last_push: BTreeMap::new(), duplicate_pushes: 0 }
    }

    /// Renews the leases of tasks named `job:index` (a move's hand-over).
    pub(in crate::ps) fn renew_named(&mut self, names: &[String]) {
        for name in names.iter().filter(|n| !n.starts_with("evaluator:")) {
            self.leases.insert(name.clone(), Instant::now() + self.lease);
        }
    }

    /// Renews the lease of a training task (an evaluator holds none: its
    /// heartbeats only report, and it never counts as live).
    pub(in crate::ps) fn renew(&mut self, task: &TaskId) {
        if task.job != "evaluator" {
            self.leases.insert(task.to_string(), Instant::now() + self.lease);
        }
    }

    /// Training tasks with a live lease: how many a sync step of elastic
    /// training waits for (at least one).
    pub(in crate::ps) fn live(&self) -> usize {
        self.leases.len().max(1)
    }

    pub(in crate::ps) fn lease_count(&self) -> usize {
        self.leases.len()
    }

    pub(in crate::ps) fn live_tasks(&self) -> Vec<String> {
        self.leases.keys().cloned().collect()
    }

    pub(in crate::ps) fn pending(&self) -> Vec<String> {
        self.pending.iter().cloned().collect()
    }

    /// Waits for `task` before exiting once training is over.
    pub(in crate::ps) fn wait_for(&mut self, task: &TaskId) {
        self.pending.insert(task.to_string());
    }

    /// Records push `push_id` of `worker` (0: no id); false when it was
    /// applied already (a retry), which is counted.
    pub(in crate::ps) fn first_push(&mut self, worker: &str, push_id: u64) -> bool {
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
    pub(in crate::ps) fn expired(&self, now: Instant) -> Vec<String> {
        self.leases.iter().filter(|(_, until)| **until <= now).map(|(t, _)| t.clone()).collect()
    }

    /// `task` is gone: neither waited for nor live any more. True when it
    /// held a lease.
    pub(in crate::ps) fn forget(&mut self, task: &str) -> bool {
        self.pending.remove(task);
        self.leases.remove(task).is_some()
    }
}

//! The shard dispatcher: which examples each worker trains, decided in one
//! place (ps task 0) instead of by every worker from the worker count.
//!
//! The training set is cut into shards of `shard_size` examples (the last
//! shard of an epoch may hold fewer). Every epoch hands its shards out in an
//! order shuffled from the seed. A shard goes todo → doing (handed to one
//! task) → done (reported by a task). A shard whose task is lost (its lease
//! expired, it left, or it asked for another shard without finishing it)
//! goes back to todo and is handed out again before any fresh one: that is a
//! shard *redone*. A fast worker simply asks more often than a slow one.
//! With `num_epochs`, training is finished when every shard of every epoch is
//! done.
//!
//! Pure and synchronous: plain data in, plain data out. The ps wraps it in
//! its lock and its gRPC service; checkpoints save [`DispatcherState`].
//!
//! # State
//! Fresh shards are handed out from a cursor `(epoch, position)` over the
//! epochs' orders, so everything before the cursor was handed out and is
//! done unless it is listed as doing or returned. The state of a run of any
//! length is therefore the cursor, the few shards in flight, and a counter.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::hash::epoch_seed;

/// How the training set is cut into shards. Every worker of a job must
/// present the same plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPlan {
    /// Examples in the training set.
    pub examples: u64,
    /// Examples per shard.
    pub shard_size: u64,
    /// Shuffles every epoch (`--seed`).
    pub seed: u64,
    /// Epochs to train; `None`: as many as training lasts.
    pub num_epochs: Option<u64>,
}

/// A shard: its epoch and its index in the training set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId {
    pub epoch: u64,
    pub index: u64,
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {} of epoch {}", self.index, self.epoch)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    #[error("{field}: {reason}")]
    InvalidPlan { field: &'static str, reason: String },
    #[error("dataset plan mismatch: {0}")]
    PlanMismatch(String),
    #[error("{shard} does not exist: the training set has {shards_per_epoch} shards per epoch")]
    NoSuchShard { shard: ShardId, shards_per_epoch: u64 },
    #[error("{shard} of the checkpoint was never handed out (the checkpoint's next shard is at epoch {}, position {})", next.0, next.1)]
    NotHandedOut { shard: ShardId, next: (u64, u64) },
}

impl ShardPlan {
    /// Checks the sizes: at least one example and one example per shard.
    pub fn new(examples: u64, shard_size: u64, seed: u64, num_epochs: Option<u64>) -> Result<Self, DispatchError> {
        if examples == 0 {
            return Err(DispatchError::InvalidPlan { field: "examples", reason: "the training set is empty".into() });
        }
        Self::check_shard_size(Some(shard_size))?;
        Self::check_num_epochs(num_epochs)?;
        Ok(ShardPlan { examples, shard_size, seed, num_epochs })
    }

    /// `--shard_size` as given (`None`: not given): at least 1. The flags
    /// are checked with this when they are read, and every plan again.
    pub fn check_shard_size(shard_size: Option<u64>) -> Result<(), DispatchError> {
        match shard_size {
            Some(0) => Err(DispatchError::InvalidPlan { field: "--shard_size", reason: "must be at least 1".into() }),
            _ => Ok(()),
        }
    }

    /// `--num_epochs` as given (`None`: unbounded): at least 1.
    pub fn check_num_epochs(num_epochs: Option<u64>) -> Result<(), DispatchError> {
        match num_epochs {
            Some(0) => Err(DispatchError::InvalidPlan { field: "--num_epochs", reason: "must be at least 1".into() }),
            _ => Ok(()),
        }
    }

    pub fn shards_per_epoch(&self) -> u64 {
        self.examples.div_ceil(self.shard_size)
    }

    /// Examples in shard `index` (the last one holds the remainder).
    pub fn shard_examples(&self, index: u64) -> u64 {
        let start = index.saturating_mul(self.shard_size).min(self.examples);
        (start + self.shard_size).min(self.examples) - start
    }

    /// Positions `start..end` of shard `index` in its epoch's order of examples.
    pub fn shard_positions(&self, index: u64) -> std::ops::Range<u64> {
        let start = index.saturating_mul(self.shard_size).min(self.examples);
        start..(start + self.shard_size).min(self.examples)
    }

    /// The order in which epoch `epoch` hands its shards out: a permutation
    /// of `0..shards_per_epoch`, the same for a given seed on every run.
    pub fn epoch_order(&self, epoch: u64) -> Vec<u64> {
        shuffled(self.shards_per_epoch(), epoch_seed(self.seed, epoch, 0x5348_4152_4453))
    }

    /// The order of the training set's examples in epoch `epoch` (shard
    /// `i` is positions [`Self::shard_positions`]`(i)` of it): every example
    /// once, shuffled from the seed and the epoch.
    pub fn example_order(&self, epoch: u64) -> Vec<u64> {
        shuffled(self.examples, epoch_seed(self.seed, epoch, 0x4558_414D_504C))
    }

    /// Names the first field in which `other` differs.
    fn difference(&self, other: &ShardPlan) -> Option<String> {
        let fields = [
            ("examples in the training set", self.examples, other.examples),
            ("--shard_size", self.shard_size, other.shard_size),
            ("--seed", self.seed, other.seed),
            ("--num_epochs (0: unbounded)", self.num_epochs.unwrap_or(0), other.num_epochs.unwrap_or(0)),
        ];
        fields.iter().find(|(_, a, b)| a != b).map(|(name, a, b)| format!("{name}: the job's is {a}, the caller's is {b}"))
    }
}

fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.shuffle(&mut StdRng::seed_from_u64(seed));
    v
}

/// What the dispatcher answers a request for a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handout {
    /// This shard (with this many examples) is the caller's to train.
    Assigned(ShardId, u64),
    /// Nothing to hand out now, but other tasks are still training shards
    /// (one may come back): ask again shortly.
    Wait,
    /// Every shard of every epoch is done.
    Finished,
}

/// What [`ShardDispatcher::next`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// The finished shard was counted as done (false: already done, or not
    /// handed out by this dispatcher).
    pub counted: bool,
    /// The next shard, when one was asked for.
    pub handout: Option<Handout>,
    /// Shards of the caller's that it gave up by asking again (back to todo).
    pub abandoned: usize,
}

/// The dispatcher's figures (the chief's final report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DispatchProgress {
    pub epochs_completed: u64,
    pub examples_trained: u64,
    pub shards_redone: u64,
    pub shards_done: u64,
    pub shards_per_epoch: u64,
    pub finished: bool,
    /// The plan's epochs to train; 0: as many as training lasts. With
    /// `examples_per_epoch`, what the progress is measured against.
    pub num_epochs: u64,
    /// Examples in the training set (one epoch's).
    pub examples_per_epoch: u64,
}

/// What a checkpoint keeps of the dispatcher: shards in flight (doing or
/// returned) come back as todo, and are counted as redone when handed out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatcherState {
    pub plan: ShardPlan,
    /// The next fresh shard: (epoch, position in the epoch's order).
    pub next: (u64, u64),
    /// Shards handed out and not done.
    pub not_done: Vec<ShardId>,
    pub shards_redone: u64,
}

/// The order of the epoch the cursor is in, and its inverse.
#[derive(Debug, Clone)]
struct EpochOrder {
    order: Vec<u64>,
    position_of: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct ShardDispatcher {
    plan: ShardPlan,
    /// (epoch, position in its order) of the next fresh shard.
    next: (u64, u64),
    /// Shards handed out and not done, with the task training each.
    doing: BTreeMap<ShardId, String>,
    /// Shards whose task was lost: handed out again before fresh ones.
    returned: BTreeSet<ShardId>,
    shards_redone: u64,
    current: EpochOrder,
}

impl ShardDispatcher {
    pub fn new(plan: ShardPlan) -> Self {
        Self::from_parts(plan, (0, 0), BTreeSet::new(), 0)
    }

    fn from_parts(plan: ShardPlan, next: (u64, u64), returned: BTreeSet<ShardId>, shards_redone: u64) -> Self {
        let current = Self::order_of(&plan, next.0);
        ShardDispatcher { plan, next, doing: BTreeMap::new(), returned, shards_redone, current }
    }

    fn order_of(plan: &ShardPlan, epoch: u64) -> EpochOrder {
        let order = plan.epoch_order(epoch);
        let mut position_of = vec![0; order.len()];
        for (pos, &index) in order.iter().enumerate() {
            position_of[index as usize] = pos as u64;
        }
        EpochOrder { order, position_of }
    }

    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// Checks a caller's plan against the job's.
    pub fn check_plan(&self, theirs: &ShardPlan) -> Result<(), DispatchError> {
        match self.plan.difference(theirs) {
            None => Ok(()),
            Some(d) => Err(DispatchError::PlanMismatch(d)),
        }
    }

    /// Was `shard` handed out (fresh) already?
    fn handed_out(&self, shard: ShardId) -> bool {
        let (epoch, pos) = self.next;
        shard.index < self.plan.shards_per_epoch() && (shard.epoch < epoch || (shard.epoch == epoch && self.current.position_of[shard.index as usize] < pos))
    }

    fn epoch_limit_reached(&self) -> bool {
        self.plan.num_epochs.is_some_and(|n| self.next.0 >= n)
    }

    /// `task` finished training `finished` (if any) and, when `want`, asks
    /// for the next shard. Any other shard still counted as `task`'s goes
    /// back to todo (a task trains one shard at a time: asking again means
    /// the old one was abandoned, e.g. by a restarted process), but for the
    /// one it keeps when it asks ahead ([`next_keeping`](Self::next_keeping)).
    ///
    /// A report for a shard that is already done changes nothing (a retry,
    /// or a shard handed out again whose first task was only slow); a shard
    /// is done once, whoever reports it first. A report for a shard not yet
    /// handed out changes nothing either: it was trained before this
    /// dispatcher went back to a checkpoint, and those updates were lost with
    /// the ps's values, so it is trained again.
    pub fn next(&mut self, task: &str, finished: Option<ShardId>, want: bool) -> Result<Reply, DispatchError> {
        self.next_keeping(task, finished, None, want)
    }

    /// [`next`](Self::next) from a task that asks for its next shard ahead,
    /// while it still trains `keep`: that shard stays the task's (so a task
    /// holds at most the shard it trains and the one it asked for ahead).
    /// A `keep` that is not the task's (done, handed to another, or from
    /// before a restart) keeps nothing.
    pub fn next_keeping(&mut self, task: &str, finished: Option<ShardId>, keep: Option<ShardId>, want: bool) -> Result<Reply, DispatchError> {
        let counted = match finished {
            Some(shard) => self.mark_done(shard)?,
            None => false,
        };
        let abandoned = self.release_all_but(task, keep);
        let handout = want.then(|| self.hand_out(task));
        Ok(Reply { counted, handout, abandoned })
    }

    /// Marks `shard` done; false when the report changes nothing.
    fn mark_done(&mut self, shard: ShardId) -> Result<bool, DispatchError> {
        if shard.index >= self.plan.shards_per_epoch() {
            return Err(DispatchError::NoSuchShard { shard, shards_per_epoch: self.plan.shards_per_epoch() });
        }
        if !self.handed_out(shard) {
            return Ok(false);
        }
        Ok(self.doing.remove(&shard).is_some() | self.returned.remove(&shard))
    }

    fn hand_out(&mut self, task: &str) -> Handout {
        if let Some(shard) = self.returned.pop_first() {
            self.shards_redone += 1;
            self.doing.insert(shard, task.to_string());
            return Handout::Assigned(shard, self.plan.shard_examples(shard.index));
        }
        if !self.epoch_limit_reached() {
            let (epoch, pos) = self.next;
            let shard = ShardId { epoch, index: self.current.order[pos as usize] };
            self.advance();
            self.doing.insert(shard, task.to_string());
            return Handout::Assigned(shard, self.plan.shard_examples(shard.index));
        }
        if self.doing.is_empty() { Handout::Finished } else { Handout::Wait }
    }

    fn advance(&mut self) {
        self.next.1 += 1;
        if self.next.1 == self.plan.shards_per_epoch() {
            self.next = (self.next.0 + 1, 0);
            self.current = Self::order_of(&self.plan, self.next.0);
        }
    }

    /// `task` is gone (lease expired, left the job): its shards go back to todo.
    pub fn release(&mut self, task: &str) -> usize {
        self.release_all_but(task, None)
    }

    /// `task`'s shards but `keep` go back to todo.
    fn release_all_but(&mut self, task: &str, keep: Option<ShardId>) -> usize {
        let lost: Vec<ShardId> = self.doing.iter().filter(|(s, t)| t.as_str() == task && Some(**s) != keep).map(|(s, _)| *s).collect();
        for s in &lost {
            self.doing.remove(s);
            self.returned.insert(*s);
        }
        lost.len()
    }

    /// Shards handed out and not done.
    fn not_done(&self) -> impl Iterator<Item = &ShardId> {
        self.doing.keys().chain(self.returned.iter())
    }

    pub fn is_finished(&self) -> bool {
        self.epoch_limit_reached() && self.doing.is_empty() && self.returned.is_empty()
    }

    pub fn progress(&self) -> DispatchProgress {
        let plan = &self.plan;
        let per_epoch = plan.shards_per_epoch();
        let (epoch, pos) = self.next;
        // Everything before the cursor was handed out; all of it is done but
        // for the shards in flight.
        let last = per_epoch - 1;
        let last_handed = self.current.position_of[last as usize] < pos;
        let short = plan.shard_size * per_epoch - plan.examples;
        let handed_examples = epoch * plan.examples + pos * plan.shard_size - if last_handed { short } else { 0 };
        let in_flight: u64 = self.not_done().map(|s| plan.shard_examples(s.index)).sum();
        let unfinished_epochs: BTreeSet<u64> = self.not_done().map(|s| s.epoch).filter(|&e| e < epoch).collect();
        DispatchProgress {
            epochs_completed: epoch - unfinished_epochs.len() as u64,
            examples_trained: handed_examples - in_flight,
            shards_redone: self.shards_redone,
            shards_done: epoch * per_epoch + pos - self.not_done().count() as u64,
            shards_per_epoch: per_epoch,
            finished: self.is_finished(),
            num_epochs: plan.num_epochs.unwrap_or(0),
            examples_per_epoch: plan.examples,
        }
    }

    /// What a checkpoint keeps.
    pub fn state(&self) -> DispatcherState {
        DispatcherState { plan: self.plan, next: self.next, not_done: self.not_done().copied().collect(), shards_redone: self.shards_redone }
    }

    /// Back from a checkpoint: the shards that were in flight are todo again.
    pub fn restore(state: &DispatcherState) -> Result<Self, DispatchError> {
        let plan = ShardPlan::new(state.plan.examples, state.plan.shard_size, state.plan.seed, state.plan.num_epochs)?;
        let (epoch, pos) = state.next;
        if pos >= plan.shards_per_epoch() || plan.num_epochs.is_some_and(|n| epoch > n || (epoch == n && pos > 0)) {
            return Err(DispatchError::InvalidPlan { field: "next", reason: format!("({epoch}, {pos}) is outside the plan") });
        }
        let d = Self::from_parts(plan, state.next, BTreeSet::new(), state.shards_redone);
        let mut returned = BTreeSet::new();
        for &s in &state.not_done {
            if s.index >= plan.shards_per_epoch() {
                return Err(DispatchError::NoSuchShard { shard: s, shards_per_epoch: plan.shards_per_epoch() });
            }
            if !d.handed_out(s) {
                return Err(DispatchError::NotHandedOut { shard: s, next: state.next });
            }
            returned.insert(s);
        }
        Ok(ShardDispatcher { returned, ..d })
    }
}

#[cfg(test)]
mod tests;

//! Conversions between the crate's types and the proto messages, as `From`
//! and `TryFrom` impls, written once: a task's id, and the shard dispatcher's
//! plan, shards and figures (the ps answers with them, the worker asks and
//! reports with them).
//!
//! Above [`crate::cluster`] and [`crate::dispatch`], which know nothing of
//! the wire; below every user of the messages.

use crate::cluster::TaskId;
use crate::dispatch::{DispatchError, DispatchProgress, ShardId, ShardPlan};
use crate::proto;

impl From<&TaskId> for proto::TaskId {
    fn from(t: &TaskId) -> Self {
        proto::TaskId { job: t.job.clone(), index: t.index }
    }
}

/// Unchecked (an empty job passes): see `ps`'s `task_of` for the check.
impl From<&proto::TaskId> for TaskId {
    fn from(t: &proto::TaskId) -> Self {
        TaskId { job: t.job.clone(), index: t.index }
    }
}

impl From<ShardId> for proto::ShardRef {
    fn from(s: ShardId) -> Self {
        proto::ShardRef { epoch: s.epoch, index: s.index }
    }
}

impl From<proto::ShardRef> for ShardId {
    fn from(s: proto::ShardRef) -> Self {
        ShardId { epoch: s.epoch, index: s.index }
    }
}

/// `num_epochs` 0 on the wire: as many as training lasts.
impl From<&ShardPlan> for proto::DatasetPlan {
    fn from(p: &ShardPlan) -> Self {
        proto::DatasetPlan { examples: p.examples, shard_size: p.shard_size, seed: p.seed, num_epochs: p.num_epochs.unwrap_or(0) }
    }
}

/// Checked as [`ShardPlan::new`] checks a plan.
impl TryFrom<proto::DatasetPlan> for ShardPlan {
    type Error = DispatchError;
    fn try_from(p: proto::DatasetPlan) -> Result<Self, DispatchError> {
        ShardPlan::new(p.examples, p.shard_size, p.seed, (p.num_epochs > 0).then_some(p.num_epochs))
    }
}

impl From<&DispatchProgress> for proto::DispatchProgress {
    fn from(p: &DispatchProgress) -> Self {
        proto::DispatchProgress {
            epochs_completed: p.epochs_completed,
            examples_trained: p.examples_trained,
            shards_redone: p.shards_redone,
            shards_done: p.shards_done,
            shards_per_epoch: p.shards_per_epoch,
            finished: p.finished,
            num_epochs: p.num_epochs,
            examples_per_epoch: p.examples_per_epoch,
        }
    }
}

impl From<&proto::DispatchProgress> for DispatchProgress {
    fn from(p: &proto::DispatchProgress) -> Self {
        DispatchProgress {
            epochs_completed: p.epochs_completed,
            examples_trained: p.examples_trained,
            shards_redone: p.shards_redone,
            shards_done: p.shards_done,
            shards_per_epoch: p.shards_per_epoch,
            finished: p.finished,
            num_epochs: p.num_epochs,
            examples_per_epoch: p.examples_per_epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let task = TaskId::new("worker", 3);
        assert_eq!(TaskId::from(&proto::TaskId::from(&task)), task);
        let shard = ShardId { epoch: 2, index: 7 };
        assert_eq!(ShardId::from(proto::ShardRef::from(shard)), shard);
        for epochs in [None, Some(3)] {
            let plan = ShardPlan::new(100, 10, 5, epochs).unwrap();
            let wire = proto::DatasetPlan::from(&plan);
            assert_eq!(wire.num_epochs, epochs.unwrap_or(0));
            assert_eq!(ShardPlan::try_from(wire), Ok(plan));
        }
        let bad = proto::DatasetPlan { examples: 10, shard_size: 0, seed: 1, num_epochs: 0 };
        assert_eq!(ShardPlan::try_from(bad).unwrap_err().to_string(), "--shard_size: must be at least 1");
        let p = DispatchProgress {
            epochs_completed: 1,
            examples_trained: 2,
            shards_redone: 3,
            shards_done: 4,
            shards_per_epoch: 5,
            finished: true,
            num_epochs: 6,
            examples_per_epoch: 7,
        };
        assert_eq!(DispatchProgress::from(&proto::DispatchProgress::from(&p)), p);
    }
}

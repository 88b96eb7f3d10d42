//! The shard dispatcher of ps 0 behind the store's lock: created from the
//! first plan a worker presents (or a checkpoint), it hands out shards,
//! counts the finished ones and takes back a lost task's; with the
//! generation of this process, which tells a report of a shard handed out
//! before a restart.

use std::time::{Duration, Instant};

use crate::cluster::TaskId;
use crate::dispatch::{DispatchProgress, DispatcherState, Handout, ShardDispatcher, ShardId, ShardPlan};
use crate::proto::{self, next_shard_reply::Outcome};
use crate::ps::error::StoreError;

#[derive(Debug)]
pub(in crate::ps) struct Dispatching {
    /// The shard dispatcher (ps 0 only), from the first worker's plan or a
    /// checkpoint.
    dispatcher: Option<ShardDispatcher>,
    /// This process's dispatcher generation (see `NextShardRequest.generation`).
    generation: u64,
    /// When an epoch's completion was last logged at INFO.
    epoch_logged: Option<Instant>,
}

/// At most one INFO line per this much time for completed epochs (the
/// others at DEBUG): a long job logs its progress, not thousands of lines.
const EPOCH_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Whether an epoch completed at `now` is logged at INFO: the first one,
/// one per [`EPOCH_LOG_INTERVAL`], and the last (`finished`).
fn epoch_at_info(last: Option<Instant>, now: Instant, finished: bool) -> bool {
    finished || last.is_none_or(|l| now.duration_since(l) >= EPOCH_LOG_INTERVAL)
}

/// Logs what a dispatcher call changed that a person follows: a shard handed
/// out again after a loss, an epoch completed, the end.
fn log_dispatch(ps: usize, task: &TaskId, before: &DispatchProgress, after: &DispatchProgress, handout: Option<Handout>, epoch_at_info: bool) {
    if let Some(Handout::Assigned(shard, _)) = handout
        && after.shards_redone > before.shards_redone
    {
        tracing::info!("ps:{ps}: {shard} handed to {task} again (its worker was lost)");
    }
    if after.epochs_completed > before.epochs_completed {
        let line = format!(
            "ps:{ps}: epoch {} complete ({} examples trained so far, {} shard(s) redone)",
            after.epochs_completed, after.examples_trained, after.shards_redone
        );
        if epoch_at_info {
            tracing::info!("{line}");
        } else {
            tracing::debug!("{line}");
        }
    }
    if after.finished && !before.finished {
        tracing::info!("ps:{ps}: every shard of every epoch is done");
    }
}

/// A handout as the reply carries it: outcome, shard, examples.
fn outcome(handout: Option<Handout>) -> (Outcome, Option<proto::ShardRef>, u64) {
    match handout {
        None => (Outcome::Reported, None, 0),
        Some(Handout::Assigned(s, n)) => (Outcome::Assigned, Some(s.into()), n),
        Some(Handout::Wait) => (Outcome::Wait, None, 0),
        Some(Handout::Finished) => (Outcome::Finished, None, 0),
    }
}

impl Dispatching {
    pub(in crate::ps) fn new() -> Self {
        Dispatching { dispatcher: None, generation: rand::random::<u64>() | 1, epoch_logged: None }
    }

    /// The shard `task` reports finished, unless it was handed out by this
    /// ps before it restarted (its updates since the checkpoint were lost:
    /// it is trained again).
    pub(in crate::ps) fn finished(&self, ps: usize, task: &TaskId, req: &proto::NextShardRequest) -> Option<ShardId> {
        match req.finished.map(ShardId::from) {
            Some(shard) if req.generation != self.generation => {
                tracing::info!(
                    "ps:{ps}: {task} finished {shard}, handed out before this ps restarted: trained again (its updates since the checkpoint were lost)"
                );
                None
            }
            other => other,
        }
    }

    /// The dispatcher, created from `plan` when there is none yet.
    fn for_plan(&mut self, ps: usize, plan: ShardPlan) -> &mut ShardDispatcher {
        self.dispatcher.get_or_insert_with(|| {
            tracing::info!(
                "ps:{ps}: dispatching {} examples in {} shard(s) of {} per epoch{}",
                plan.examples,
                plan.shards_per_epoch(),
                plan.shard_size,
                plan.num_epochs.map(|n| format!(", {n} epoch(s)")).unwrap_or_default()
            );
            ShardDispatcher::new(plan)
        })
    }

    /// One call of `task`: counts `finished`, hands out the next shard when
    /// `want` (keeping `keep` the task's), and says what changed.
    pub(in crate::ps) fn next(
        &mut self,
        ps: usize,
        task: &TaskId,
        plan: ShardPlan,
        finished: Option<ShardId>,
        keep: Option<ShardId>,
        want: bool,
    ) -> Result<proto::NextShardReply, StoreError> {
        let generation = self.generation;
        let dispatcher = self.for_plan(ps, plan);
        dispatcher.check_plan(&plan).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
        let before = dispatcher.progress();
        let reply = dispatcher.next_keeping(&task.to_string(), finished, keep, want).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        let progress = dispatcher.progress();
        if reply.abandoned > 0 {
            tracing::info!("ps:{ps}: {} shard(s) of {task} go back to todo (it asked again without finishing them)", reply.abandoned);
        }
        let now = Instant::now();
        let at_info = epoch_at_info(self.epoch_logged, now, progress.finished);
        if at_info && progress.epochs_completed > before.epochs_completed {
            self.epoch_logged = Some(now);
        }
        log_dispatch(ps, task, &before, &progress, reply.handout, at_info);
        let (outcome, shard, examples) = outcome(reply.handout);
        Ok(proto::NextShardReply { outcome: outcome as i32, shard, examples, progress: Some((&progress).into()), generation })
    }

    /// A training task is gone (lease expired, left): its shards go back to todo.
    pub(in crate::ps) fn release(&mut self, ps: usize, task: &str) {
        if let Some(d) = &mut self.dispatcher {
            let n = d.release(task);
            if n > 0 {
                tracing::info!("ps:{ps}: {n} shard(s) of {task} go back to todo");
            }
        }
    }

    pub(in crate::ps) fn progress(&self) -> Option<DispatchProgress> {
        self.dispatcher.as_ref().map(ShardDispatcher::progress)
    }

    /// What a checkpoint keeps of the dispatcher, as JSON.
    pub(in crate::ps) fn saved(&self) -> Result<Option<String>, serde_json::Error> {
        self.dispatcher.as_ref().map(|d| serde_json::to_string(&d.state())).transpose()
    }

    /// Back from a checkpoint's JSON: the shards in flight then go back to todo.
    pub(in crate::ps) fn restore(&mut self, ps: usize, json: &str) -> Result<(), StoreError> {
        let saved: DispatcherState =
            serde_json::from_str(json).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: the shard dispatcher's state does not parse: {e}")))?;
        let dispatcher = ShardDispatcher::restore(&saved).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: {e}")))?;
        let p = dispatcher.progress();
        tracing::info!(
            "ps:{ps}: shard dispatcher restored: {} epoch(s) and {} shard(s) done, {} in flight at the checkpoint go back to todo",
            p.epochs_completed,
            p.shards_done,
            saved.not_done.len()
        );
        self.dispatcher = Some(dispatcher);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (case, seconds since the last INFO epoch line (None: none yet), finished, at INFO)
    #[test]
    fn completed_epochs_are_logged_at_info_at_a_rate() {
        let now = Instant::now() + Duration::from_secs(60);
        let cases = [
            ("the first epoch", None, false, true),
            ("one second after the last line", Some(1), false, false),
            ("five seconds after", Some(5), false, true),
            ("the last epoch, just after a line", Some(0), true, true),
        ];
        for (case, since, finished, info) in cases {
            let last = since.map(|s| now - Duration::from_secs(s));
            assert_eq!(epoch_at_info(last, now, finished), info, "{case}");
        }
    }
}

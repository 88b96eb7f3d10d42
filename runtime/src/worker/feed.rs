//! [`ShardFeed`]: a training task's batches, shard by shard from the
//! dispatcher on ps 0, with the dispatcher's calls riding on the steps.

use std::sync::Arc;

use crate::client::{ClientError, PsSet};
use crate::data::{Batch, ShardBatches, TrainingSet};
use crate::dispatch::{ShardId, ShardPlan};
use crate::model::Model;
use crate::proto::{self, next_shard_reply::Outcome};
use crate::train::{self, TrainError, TrainSettings, Workload};

/// Batches a worker makes ahead while a step's round trip is on the wire:
/// the next (whose rows the step pulls) and the one after it.
const BATCHES_AHEAD: usize = 2;

/// What the feed gives the loop next.
pub(super) enum Fed {
    Batch(Box<Batch>),
    /// Nothing to train now; ask again shortly.
    Wait,
    /// Every shard of every epoch is done.
    Finished,
}

/// A shard in hand: which, the dispatcher generation it was handed out
/// under, and its batches not taken yet.
struct HeldShard {
    shard: ShardId,
    generation: u64,
    batches: ShardBatches,
}

/// A call to the shard dispatcher that rides on the next step (to ps 0):
/// the report of the shard trained before the one in hand (`keep`), the
/// request for the one after it, or both.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ShardCall {
    finished: Option<(proto::ShardRef, u64)>,
    keep: ShardId,
    want: bool,
}

/// The shard asked for ahead, while the one in hand is finishing.
enum Ahead {
    /// Not asked for yet.
    NotAsked,
    /// Asked for, in the call waiting for the next step.
    Asked,
    /// Handed out: trained when the shard in hand is done.
    Assigned(HeldShard),
    /// Asked, and none came (none to hand out now, or the call failed): the
    /// loop asks as it always did once the shard in hand is done.
    Nothing,
}

/// A task's batches: the shards the dispatcher on ps 0 hands it. A shard is
/// reported done when its last batch has been trained.
///
/// The dispatcher's calls ride on the training steps, and the loop does not
/// wait for them: when the shard in hand has one batch left to take, the
/// next step asks for the shard after it (the task keeps the one it trains),
/// so that the shard's last step already pulls the rows of the next one's
/// first batch; the shard just finished is reported with the next one's
/// first step. The loop calls the dispatcher itself only when no shard came
/// ahead (at the end of an epoch limit, after a failed call). A call of its
/// own and a pull every ten steps cost a sparse model a sixth of its
/// distributed rate (BENCHMARKS.md, "Shard calls on the steps").
pub(super) struct ShardFeed {
    data: Arc<dyn TrainingSet>,
    plan: ShardPlan,
    batch_size: usize,
    /// The shard being trained.
    current: Option<HeldShard>,
    ahead: Ahead,
    /// The call for the next step to carry.
    call: Option<ShardCall>,
    /// The dispatcher's figures, as of the last reply.
    pub(super) progress: Option<proto::DispatchProgress>,
}

impl ShardFeed {
    pub(super) fn new(workload: &Workload, settings: &TrainSettings) -> Result<Self, TrainError> {
        Ok(ShardFeed {
            data: workload.train.clone(),
            plan: train::shard_plan(workload, settings)?,
            batch_size: workload.batch_size,
            current: None,
            ahead: Ahead::NotAsked,
            call: None,
            progress: None,
        })
    }

    fn plan_proto(&self) -> proto::DatasetPlan {
        (&self.plan).into()
    }

    /// The shard whose every batch was taken (and so trained, since the loop
    /// trains a batch before it asks for the next one).
    fn finished(&self) -> Option<(proto::ShardRef, u64)> {
        match &self.current {
            Some(held) if held.batches.is_empty() => Some((held.shard.into(), held.generation)),
            _ => None,
        }
    }

    /// The batch after the one just taken: in the shard in hand, else the
    /// first of the shard handed out ahead.
    pub(super) fn peek(&mut self) -> Option<&Batch> {
        if self.current.as_ref().is_some_and(|held| !held.batches.is_empty()) {
            return self.current.as_mut().and_then(|held| held.batches.peek());
        }
        match &mut self.ahead {
            Ahead::Assigned(held) => held.batches.peek(),
            _ => None,
        }
    }

    /// Makes the next [`BATCHES_AHEAD`] batches (of the shard in hand, then
    /// of the one handed out ahead) and what `model` needs of them before
    /// their steps: work for the time a step's round trip is on the wire.
    pub(super) fn make_ahead(&mut self, model: &dyn Model) {
        let next = match &mut self.ahead {
            Ahead::Assigned(held) => Some(held),
            _ => None,
        };
        let mut left = BATCHES_AHEAD;
        for held in [self.current.as_mut(), next].into_iter().flatten() {
            held.batches.make_ahead(left);
            let mut made = 0;
            while let Some(batch) = held.batches.ahead(made).filter(|_| made < left) {
                model.prepare(batch);
                made += 1;
            }
            left -= made;
            if left == 0 {
                return;
            }
        }
    }

    pub(super) async fn next(&mut self, ps: &PsSet) -> Result<Fed, TrainError> {
        if let Some(batch) = self.current.as_mut().and_then(|held| held.batches.next()) {
            self.ask_ahead_if_due();
            return Ok(Fed::Batch(Box::new(batch)));
        }
        let finished = self.finished();
        self.send_call(ps).await;
        if let Ahead::Assigned(next) = std::mem::replace(&mut self.ahead, Ahead::NotAsked) {
            return self.start(ps, next, finished);
        }
        self.note_trained(ps, finished);
        let reply = ps.next_shard(self.plan_proto(), finished, true).await?;
        self.current = None;
        self.progress = reply.progress;
        match Outcome::try_from(reply.outcome) {
            Ok(Outcome::Assigned) => {
                let held = self.held(&reply)?;
                self.start(ps, held, None)
            }
            Ok(Outcome::Wait) => Ok(Fed::Wait),
            Ok(Outcome::Finished) => Ok(Fed::Finished),
            _ => Err(protocol(&format!("the dispatcher answered {} to a request for a shard", reply.outcome))),
        }
    }

    /// The shard the dispatcher handed out in `reply`, its batches to make.
    fn held(&self, reply: &proto::NextShardReply) -> Result<HeldShard, TrainError> {
        let s = reply.shard.ok_or_else(|| protocol("the dispatcher assigned no shard"))?;
        let shard = ShardId::from(s);
        if shard.index >= self.plan.shards_per_epoch() {
            return Err(protocol(&format!("the dispatcher assigned {shard}, which does not exist")));
        }
        let batches = self.data.shard_batches(&self.plan, shard, self.batch_size);
        Ok(HeldShard { shard, generation: reply.generation, batches })
    }

    /// Makes `next` the shard in hand and takes its first batch; `finished`
    /// (the shard before it, when the call that brought `next` did not
    /// report it) is reported with the next step.
    fn start(&mut self, ps: &PsSet, mut next: HeldShard, finished: Option<(proto::ShardRef, u64)>) -> Result<Fed, TrainError> {
        let first = next.batches.next().ok_or_else(|| protocol(&format!("{} holds no example", next.shard)))?;
        if finished.is_some() {
            self.note_trained(ps, finished);
            self.call = Some(ShardCall { finished, keep: next.shard, want: false });
        }
        self.current = Some(next);
        self.ahead = Ahead::NotAsked;
        self.ask_ahead_if_due();
        Ok(Fed::Batch(Box::new(first)))
    }

    /// Asks for the next shard (with the next step) once the one in hand
    /// has at most one batch left to take.
    fn ask_ahead_if_due(&mut self) {
        let Some(held) = &self.current else { return };
        if !matches!(self.ahead, Ahead::NotAsked) || held.batches.len() > 1 {
            return;
        }
        self.ahead = Ahead::Asked;
        self.call.get_or_insert(ShardCall { finished: None, keep: held.shard, want: false }).want = true;
    }

    /// The call the next step carries, as a request of `ps`'s task. It stays
    /// queued until [`dispatched`](Self::dispatched) hears its answer: a step
    /// that failed leaves it for the next one (reporting a shard twice
    /// changes nothing; asking twice gives the first answer's shard back).
    pub(super) fn call_request(&self, ps: &PsSet) -> Option<proto::NextShardRequest> {
        self.call.map(|c| ps.shard_request(self.plan_proto(), c.finished, Some(c.keep.into()), c.want))
    }

    /// The dispatcher's answer to the call the last step carried.
    pub(super) fn dispatched(&mut self, ps: &PsSet, answer: Option<Result<proto::NextShardReply, String>>) {
        let Some(call) = self.call.take() else { return };
        let reply = match answer {
            Some(Ok(reply)) => reply,
            Some(Err(e)) => {
                if call.finished.is_some() {
                    tracing::warn!("{}: could not report a finished shard ({e}); it may be trained again", ps.task);
                }
                tracing::debug!("{}: the shard dispatcher did not answer the step's call: {e}", ps.task);
                if call.want {
                    self.ahead = Ahead::Nothing;
                }
                return;
            }
            None => {
                // Ps 0 did not answer it (a runtime that does not know the
                // field): it goes as a call of its own when the shard is done.
                self.call = Some(call);
                return;
            }
        };
        if reply.progress.is_some() {
            self.progress = reply.progress;
        }
        if call.want {
            self.ahead = self.ahead_from(&reply);
        }
    }

    fn ahead_from(&self, reply: &proto::NextShardReply) -> Ahead {
        if Outcome::try_from(reply.outcome) != Ok(Outcome::Assigned) {
            return Ahead::Nothing;
        }
        match self.held(reply) {
            Ok(held) => Ahead::Assigned(held),
            Err(e) => {
                tracing::warn!("{e}; asking again when the shard in hand is done");
                Ahead::Nothing
            }
        }
    }

    /// Sends the call no step carried (the shard in hand is done, or
    /// training is), on its own: a call that reports or asks must not cross
    /// it.
    async fn send_call(&mut self, ps: &PsSet) {
        let Some(req) = self.call_request(ps) else { return };
        let answer = ps.next_shard_once(req).await.map_err(|e| e.to_string());
        self.dispatched(ps, Some(answer));
    }

    /// Every shard this task trained, at debug level (target
    /// `tfjob_runtime::shards`), for whoever checks that every example was
    /// trained: `RUST_LOG=info,tfjob_runtime::shards=debug`. Written before
    /// the shard is reported done: a task killed between the two has trained
    /// it all the same (the dispatcher may count it done, or hand it out
    /// again, and then it is logged twice).
    fn note_trained(&self, ps: &PsSet, finished: Option<(proto::ShardRef, u64)>) {
        if let Some((shard, _)) = finished {
            let examples = self.plan.shard_examples(shard.index);
            tracing::debug!(target: "tfjob_runtime::shards", "{}: trained shard {} of epoch {} ({examples} examples)", ps.task, shard.index, shard.epoch);
        }
    }

    /// The ps tasks restarted: the shard in hand, the one asked for ahead
    /// and a call not sent yet are given up (the dispatcher, back from its
    /// checkpoint, hands them out again).
    pub(super) fn abandon(&mut self) {
        self.current = None;
        self.ahead = Ahead::NotAsked;
        self.call = None;
    }

    /// Reports a finished shard without asking for another (a shard handed
    /// out ahead goes back to the dispatcher), and returns the dispatcher's
    /// figures (the last known ones if ps 0 is gone).
    pub(super) async fn close(&mut self, ps: &PsSet) -> Option<proto::DispatchProgress> {
        let finished = self.finished();
        self.send_call(ps).await;
        self.note_trained(ps, finished);
        match ps.next_shard(self.plan_proto(), finished, false).await {
            Ok(reply) => reply.progress,
            Err(e) => {
                tracing::warn!("{}: cannot report to the shard dispatcher: {e}", ps.task);
                self.progress
            }
        }
    }
}

/// A reply of the dispatcher that breaks its protocol.
fn protocol(message: &str) -> TrainError {
    TrainError::Client(ClientError::Protocol(message.to_string()))
}

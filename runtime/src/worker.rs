//! A worker's training loop (the chief's too): between-graph replication
//! against the ps tasks, sync or async, on the shards of the training set
//! that the dispatcher on ps 0 hands out.
//!
//! The loop is small ([`run_worker`]); its steps live in two pieces:
//! - [`ShardFeed`] (`feed`): the batches, shard by shard from the dispatcher; it says
//!   when there is nothing to train for now (others are finishing the last
//!   shards) and when every epoch is done.
//! - [`Trainer`]: this task's place in the job: joining the ps tasks (and
//!   again after a ps restarted), one training step, an idle step (sync: an
//!   abstention, so no step waits for a task with no data), the chief's
//!   checkpoints, the final report.

mod feed;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;

use crate::client::{ClientError, PsSet, Pulled, StepRequest};
use crate::data::Batch;
use crate::metrics::TrainingMetrics;
use crate::model::Model;
use crate::proto::{self, TaskState};
use crate::status::TaskStatus;
use crate::train::{
    self, Aggregate, Checkpointer, FinalReport, Summaries, TaskContext, TrainError, TrainSettings, Workload, layout_changed, needs_recovery, summary_line,
    wait_for_variables, zeros_like,
};
use feed::{Fed, ShardFeed};

/// How long a task with nothing to train waits before it asks again.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// How often the chief asks ps 0 whether a ps set was proposed.
const LAYOUT_POLL: Duration = Duration::from_millis(500);

/// Layout changes one step may follow before the task gives up.
const MAX_FOLLOWS: u32 = 20;

/// Awaits `call` with `work` done while it waits: `call` is polled once (so
/// its requests are sent), then `work` runs, then `call` is awaited. A call
/// answered at once leaves `work` undone.
async fn overlapped<T>(call: impl std::future::Future<Output = T>, work: impl FnOnce()) -> T {
    let mut call = std::pin::pin!(call);
    if let std::task::Poll::Ready(answer) = futures::poll!(call.as_mut()) {
        return answer;
    }
    work();
    call.await
}

/// What a training task's heartbeat reports: its latest loss once it took a
/// step (before, the loss it holds is no loss of the model), and its
/// `--train_steps` bound (0: none).
fn training_report(metrics: &TrainingMetrics, train_steps: i64) -> proto::HeartbeatRequest {
    let stepped = metrics.local_steps.load(Ordering::Relaxed) > 0;
    proto::HeartbeatRequest { loss: stepped.then(|| metrics.last_loss.get() as f32), train_steps, ..Default::default() }
}

/// This task's side of the job: its values, its place in the steps and what
/// it counted.
struct Trainer<'a> {
    task: String,
    ctx: &'a TaskContext,
    ps: Arc<PsSet>,
    /// The ps set the heartbeats go to (follows `ps` across moves).
    lease_target: Arc<std::sync::RwLock<Arc<PsSet>>>,
    /// When the chief last asked ps 0 whether a move is proposed.
    layout_checked: Instant,
    model: &'a dyn Model,
    settings: &'a TrainSettings,
    status: Arc<TaskStatus>,
    metrics: Arc<TrainingMetrics>,
    /// Initialises the variables, checkpoints, and ends training.
    is_chief: bool,
    chief: String,
    params: Vec<ArrayD<f32>>,
    /// The model has sparse embeddings: `params` hold their rows `held_rows`.
    sparse: bool,
    held_rows: Vec<Vec<i64>>,
    pulled: Pulled,
    /// The values may be older than the ps tasks' (the task sat idle): pull
    /// before the next step.
    behind: bool,
    local_steps: u64,
    stale: u64,
    recoveries: u32,
    last_loss: f32,
    global_step: i64,
    started: Instant,
    first_gradient_seen: bool,
    /// Evaluators of the cluster: the chief waits for their final evaluation.
    evaluators: usize,
    /// An async push a move cut in two, whose rest is pushed once the new
    /// layout is joined (the step is not taken again).
    cut_push: Option<CutPush>,
}

/// The rest of a push a move cut in two: what the ps tasks that refused it
/// held, and the step's gradients and rows.
struct CutPush {
    owed: crate::client::remainder::Owed,
    gradients: Vec<ArrayD<f32>>,
    rows: Vec<Vec<i64>>,
}

impl<'a> Trainer<'a> {
    fn new(ctx: &'a TaskContext, model: &'a dyn Model) -> Result<Self, TrainError> {
        let ps = Arc::new(train::ps_set(ctx, model)?);
        let cluster = &ctx.cluster;
        Ok(Trainer {
            task: cluster.task.to_string(),
            ctx,
            lease_target: Arc::new(std::sync::RwLock::new(ps.clone())),
            layout_checked: Instant::now(),
            ps,
            model,
            settings: &ctx.settings,
            status: ctx.status.clone(),
            metrics: ctx.metrics.clone(),
            is_chief: cluster.is_chief(),
            chief: cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default(),
            params: zeros_like(model),
            sparse: model.variables().iter().any(|v| v.is_sparse()),
            held_rows: vec![Vec::new(); model.variables().len()],
            pulled: Pulled { steps: vec![0; cluster.cluster.num_tasks("ps")], done: false, waited: Duration::ZERO, bytes: 0 },
            behind: false,
            local_steps: 0,
            stale: 0,
            recoveries: 0,
            last_loss: f32::NAN,
            global_step: 0,
            started: Instant::now(),
            first_gradient_seen: false,
            evaluators: cluster.cluster.num_tasks("evaluator"),
            cut_push: None,
        })
    }

    fn log_start(&self) {
        let s = self.settings;
        tracing::info!(
            "{}: {} training of {} over {} ps task(s){}; bytes per ps {:?}",
            self.task,
            match (s.sync_replicas, s.replicas_to_aggregate) {
                (false, _) => "async",
                (true, Aggregate::Auto) => "elastic sync",
                (true, _) => "sync",
            },
            self.model.name(),
            self.ps.num_ps(),
            if self.is_chief { " (chief)" } else { "" },
            self.ps.placement().bytes_per_ps()
        );
    }

    /// Joins (again) the ps tasks: handshake, initialisation by the chief (a
    /// no-op where already done), then the current values.
    async fn join(&mut self) -> Result<(), TrainError> {
        if !self.is_chief {
            let message = format!("waiting for the chief ({}) to initialise the variables", self.chief);
            self.status.set(TaskState::Waiting, self.local_steps, self.global_step, &message);
        }
        let replies = self.ps.handshake(false).await?;
        self.learn_chief(&replies);
        self.note_aggregation(&replies);
        if self.is_chief {
            let values = crate::model::init_values(&self.model.variables(), self.settings.seed);
            let already = self.ps.init(&values, 0).await?;
            tracing::info!(
                "{}: {}",
                self.task,
                if already { "variables were already initialised (or restored): resuming" } else { "initialised the variables" }
            );
        }
        self.pulled = wait_for_variables(&self.ps, &mut self.params, crate::client::NO_ROWS, &self.chief, self.settings.init_timeout).await?;
        self.held_rows = vec![Vec::new(); self.params.len()];
        self.behind = false;
        self.global_step = self.global_step.max(self.pulled.steps[0]);
        self.status.set(TaskState::Training, self.local_steps, self.global_step, "training");
        Ok(())
    }

    /// A task that took itself for the chief, while the ps tasks know
    /// another one, is not the chief (a sparse cluster spec that does not
    /// list the chief leaves worker 0 believing it is).
    fn learn_chief(&mut self, replies: &[proto::HandshakeReply]) {
        let Some(named) = replies.iter().find_map(|r| r.chief.as_ref()) else {
            return;
        };
        let named = format!("{}:{}", named.job, named.index);
        if self.is_chief && named != self.task {
            tracing::info!("{}: the ps tasks name {named} as the chief: this task is not the chief", self.task);
            self.is_chief = false;
        }
        self.chief = named;
    }

    /// Says how a sync job counts a step's gradients when this task would
    /// count differently (a worker added or removed after the start of a
    /// job without `--replicas_to_aggregate=auto`).
    fn note_aggregation(&self, replies: &[proto::HandshakeReply]) {
        let ours = &self.ps.config;
        let Some(agreed) = replies.iter().find_map(|r| r.agreed) else { return };
        if !self.settings.sync_replicas
            || !ours.follow_chief_aggregation
            || agreed.elastic == ours.elastic && agreed.replicas_to_aggregate == ours.replicas_to_aggregate
        {
            return;
        }
        if agreed.elastic {
            tracing::info!("{}: this job's sync steps aggregate over the live workers (its chief chose auto)", self.task);
        } else {
            tracing::warn!(
                "{}: this job's sync steps aggregate {} gradient(s), fixed by its chief at the start; this task sees {} training task(s). \
                 Workers beyond {} are backup workers whose late gradients are dropped; with fewer, steps wait (until \
                 --step_timeout_secs). Give --replicas_to_aggregate=auto to a job whose workers come and go.",
                self.task,
                agreed.replicas_to_aggregate,
                ours.total_num_replicas,
                agreed.replicas_to_aggregate
            );
        }
    }

    /// Keeps this task's lease on every ps of the job's layout while it
    /// lives, reporting its latest loss and its `--train_steps` (ps 0
    /// publishes them on its metrics endpoint).
    fn keep_lease(&self) -> AbortOnDropHandle<()> {
        let target = self.lease_target.clone();
        let metrics = self.metrics.clone();
        let train_steps = self.settings.train_steps.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX));
        AbortOnDropHandle::new(crate::metrics::every(self.settings.heartbeat, move || {
            let ps = target.read().map(|p| p.clone()).unwrap_or_else(|p| p.into_inner().clone());
            let report = training_report(&metrics, train_steps);
            async move { ps.heartbeat(report).await }
        }))
    }

    /// Uses the ps tasks of `ps` from now on (heartbeats included).
    fn use_ps(&mut self, ps: PsSet) {
        self.ps = Arc::new(ps);
        match self.lease_target.write() {
            Ok(mut t) => *t = self.ps.clone(),
            Err(p) => *p.into_inner() = self.ps.clone(),
        }
    }

    /// The job's layout changed under a step: take the ps set ps 0 says is
    /// the job's now and join it (the shard in hand is kept: the step is
    /// taken again on the values the move kept).
    async fn follow_layout(&mut self, e: &ClientError) -> Result<(), TrainError> {
        tracing::info!("{}: {e}", self.task);
        self.join_current_layout().await
    }

    /// Joins the ps set ps 0 says is the job's now; when a move commits
    /// while this task joins (between learning the layout and its first
    /// pull), it follows again.
    async fn join_current_layout(&mut self) -> Result<(), TrainError> {
        for _ in 0..MAX_FOLLOWS {
            if let Some(current) = train::current_ps_set(self.ctx, self.model, &self.ps).await? {
                self.use_ps(current);
            }
            match self.join().await {
                Err(TrainError::Client(e)) if layout_changed(&e) => tracing::info!("{}: {e} (while joining)", self.task),
                joined => return joined,
            }
        }
        Err(TrainError::TooManyRecoveries(MAX_FOLLOWS))
    }

    /// The chief, between two steps: when ps 0 holds a proposed ps set (a ps
    /// started into the job), the state moves to it now. A move that fails
    /// leaves the layout as it was (tried again later). True when it moved.
    async fn move_if_proposed(&mut self) -> Result<bool, TrainError> {
        if self.layout_checked.elapsed() < LAYOUT_POLL {
            return Ok(false);
        }
        // Sync moves at a step every ps has reached: until the chief's pull
        // says so it looks again at its next step, not a poll later (async
        // moves at ps 0's step, whatever the others count: under load their
        // counts seldom agree at the instant of a pull, and a job could end
        // before a leaving ps was let go).
        let steps = &self.pulled.steps;
        if self.settings.sync_replicas && steps.iter().any(|&s| s != steps[0]) {
            return Ok(false);
        }
        self.layout_checked = Instant::now();
        let layout = self.ps.layout().await?;
        if layout.proposed.is_empty() || layout.moving {
            return Ok(false);
        }
        let version = layout.version + 1;
        let next = train::ps_set_over(self.ctx, self.model, &layout.proposed, version)?;
        let at_step = if self.settings.sync_replicas { self.pulled.steps[0] } else { -1 };
        match next.take_over(&self.ps, version, at_step).await {
            Ok(moved) => {
                tracing::info!("{}: {moved}", self.task);
                self.use_ps(next);
                self.join().await.map(|()| true)
            }
            Err(e) => {
                tracing::warn!("{}: could not move the job's state to {} ps task(s) ({e}); trying again later", self.task, layout.proposed.len());
                Ok(false)
            }
        }
    }

    /// [`train_on`](Self::train_on), following the job's layout when it
    /// changed under the step (then the step is taken again).
    async fn train_following(&mut self, batch: &Batch, feed: &mut ShardFeed, summaries: &mut Summaries) -> Result<bool, TrainError> {
        for _ in 0..MAX_FOLLOWS {
            match self.train_on(batch, feed, summaries).await {
                Err(TrainError::LayoutChanged(e)) => {
                    self.follow_layout(&e).await?;
                    if let Some(cut) = self.cut_push.take() {
                        return self.push_rest(cut).await.map(|()| false);
                    }
                }
                other => return other,
            }
        }
        Err(TrainError::TooManyRecoveries(MAX_FOLLOWS))
    }

    /// After a move cut this task's async push in two: the part the ps
    /// tasks that refused it held goes to their successors under the new
    /// layout, and the step counts as taken (its batch is not trained
    /// again: that would apply the part already applied a second time).
    /// A rest that cannot be pushed (another move began, a ps restarted) is
    /// dropped with a warning: one push's part, not a reason to stop.
    async fn push_rest(&mut self, cut: CutPush) -> Result<(), TrainError> {
        if !cut.owed.is_empty() {
            match self.ps.push_remainder(&cut.owed, &cut.gradients, &cut.rows).await {
                Ok(bytes) => {
                    let rest = crate::ps::recut::bytes_text(bytes);
                    tracing::info!("{}: a move cut a push in two; its rest ({rest}) went to the ps tasks that hold it now", self.task);
                }
                Err(e) => tracing::warn!("{}: a move cut a push in two and its rest could not be pushed ({e}); it is dropped", self.task),
            }
        }
        self.local_steps += 1;
        self.behind = true;
        Ok(())
    }

    /// Has every ps (sync) or ps 0 (async) reached `--train_steps`?
    fn steps_done(&self) -> bool {
        let Some(n) = self.settings.train_steps else {
            return false;
        };
        let reached = |s: &i64| *s >= n as i64;
        if self.settings.sync_replicas { self.pulled.steps.iter().all(reached) } else { reached(&self.pulled.steps[0]) }
    }

    /// A ps restarted or lost its state: rejoin, and give up the shard in hand.
    async fn recover(&mut self, e: &ClientError, feed: &mut ShardFeed) -> Result<(), TrainError> {
        self.recoveries += 1;
        if self.recoveries > 100 {
            return Err(TrainError::TooManyRecoveries(self.recoveries));
        }
        tracing::warn!("{}: {e}; rejoining the parameter servers", self.task);
        feed.abandon();
        self.join().await
    }

    /// One step on `batch`: gradients pushed and the next values pulled in
    /// one call per ps. Sync: the pull waits until every ps pushed to applied
    /// the step (each ps counts its own steps). Returns true when training is
    /// over.
    async fn train_on(&mut self, batch: &Batch, feed: &mut ShardFeed, summaries: &mut Summaries) -> Result<bool, TrainError> {
        // The rows of the batch's sparse embeddings: pulled with the last
        // step when that knew the batch (within a shard), else now.
        let rows = if self.sparse { self.model.row_ids(batch) } else { Vec::new() };
        if (self.behind || rows != self.held_rows) && !self.pull_now(&rows, feed).await? {
            return Ok(false);
        }
        let t0 = Instant::now();
        let lg = self.model.loss_and_gradients(&self.params, batch);
        self.last_loss = lg.loss;
        let t1 = Instant::now();
        self.metrics.compute_seconds.add((t1 - t0).as_secs_f64());
        let (push_to, min_steps) = self.step_targets();
        let next_rows = self.rows_to_pull(feed);
        let shard_call = feed.call_request(&self.ps);
        let step = StepRequest {
            steps: &self.pulled.steps,
            push_to: &push_to,
            gradients: &lg.gradients,
            pushed_rows: &rows,
            pulled_rows: &next_rows,
            shard_call: shard_call.as_ref(),
        };
        let model = self.model;
        let stepped = self.ps.push_pull(step, &mut self.params, &min_steps, self.settings.step_timeout);
        let stepped = overlapped(stepped, || feed.make_ahead(model)).await;
        let crate::client::Stepped { pushed: replies, pulled: next, first_reply, dispatched } = match stepped {
            Ok(r) => r,
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                return Err(TrainError::StepTimeout { step: min_steps[0], waited: self.settings.step_timeout });
            }
            Err(e) if layout_changed(&e) => {
                if let ClientError::CutByMove { applied, .. } = &e {
                    let refused: Vec<bool> = applied.iter().map(|a| !a).collect();
                    let owed = crate::client::remainder::owed(&self.ps, &refused, &rows);
                    self.cut_push = Some(CutPush { owed, gradients: lg.gradients, rows });
                }
                return Err(TrainError::LayoutChanged(e));
            }
            Err(e) if needs_recovery(&e) => return self.recover(&e, feed).await.map(|()| false),
            Err(e) => return Err(e.into()),
        };
        feed.dispatched(&self.ps, dispatched);
        self.count_step(&next, first_reply, t1, &lg.gradients, &rows);
        self.pulled = next;
        self.held_rows = next_rows;
        self.local_steps += 1;
        self.note_replies(&replies);
        self.log_progress(summaries);
        Ok(self.pulled.done || replies.iter().any(|r| r.done))
    }

    /// The rows a step pulls with the values: those of the batch after it
    /// (when the feed knows it, also across a shard's end).
    fn rows_to_pull(&self, feed: &mut ShardFeed) -> Vec<Vec<i64>> {
        match feed.peek() {
            Some(next) if self.sparse => self.model.row_ids(next),
            _ if self.sparse => vec![Vec::new(); self.params.len()],
            _ => Vec::new(),
        }
    }

    /// Pulls the values (and the rows `rows`) before a step. False when the
    /// ps tasks had to be joined again instead (the step is not taken).
    async fn pull_now(&mut self, rows: &[Vec<i64>], feed: &mut ShardFeed) -> Result<bool, TrainError> {
        match self.ps.pull(&mut self.params, rows, &[], false, self.settings.step_timeout).await {
            Ok(p) => {
                self.pulled = p;
                self.behind = false;
                self.held_rows = rows.to_vec();
                Ok(true)
            }
            Err(e) if layout_changed(&e) => Err(TrainError::LayoutChanged(e)),
            Err(e) if needs_recovery(&e) => self.recover(&e, feed).await.map(|()| false),
            Err(e) => Err(e.into()),
        }
    }

    /// Which ps tasks a step pushes to, and the step each pull waits for.
    /// Sync, with backup workers one ps can still be completing a step that
    /// another has completed: a worker goes on until every ps reached the
    /// last step, pushing only to those that have not.
    fn step_targets(&self) -> (Vec<bool>, Vec<i64>) {
        let sync = self.settings.sync_replicas;
        let last = self.settings.train_steps.map_or(i64::MAX, |n| n as i64);
        let push_to: Vec<bool> = self.pulled.steps.iter().map(|&s| !(sync && s >= last)).collect();
        let min_steps: Vec<i64> = self.pulled.steps.iter().zip(&push_to).map(|(s, &pushed)| if sync && pushed { s + 1 } else { 0 }).collect();
        (push_to, min_steps)
    }

    /// A step's figures. One call does both: until the first reply it is
    /// the push (and the barrier's wait, reported apart), then the pull.
    fn count_step(&self, next: &Pulled, first_reply: Duration, computed: Instant, gradients: &[ArrayD<f32>], rows: &[Vec<i64>]) {
        let m = &self.metrics;
        m.wait_seconds.add(next.waited.as_secs_f64());
        m.push_seconds.add(first_reply.saturating_sub(next.waited).as_secs_f64());
        m.pull_seconds.add(computed.elapsed().saturating_sub(first_reply).as_secs_f64());
        m.bytes_received.fetch_add(next.bytes, Ordering::Relaxed);
        let ids_sent: usize = rows.iter().map(Vec::len).sum();
        m.bytes_sent.fetch_add(gradients.iter().map(|g| g.len() as u64 * 4).sum::<u64>() + ids_sent as u64 * 8, Ordering::Relaxed);
        m.local_steps.fetch_add(1, Ordering::Relaxed);
        m.last_loss.set(self.last_loss as f64);
    }

    /// What the ps tasks answered a step: a stale push, the global step,
    /// the first gradient accepted.
    fn note_replies(&mut self, replies: &[proto::PushGradientsReply]) {
        let m = &self.metrics;
        if replies.iter().any(|r| r.stale) {
            self.stale += 1;
            m.stale_pushes.fetch_add(1, Ordering::Relaxed);
        }
        self.global_step = self.global_step.max(replies[0].step);
        m.global_step.store(self.global_step.max(0) as u64, Ordering::Relaxed);
        self.status.set(TaskState::Training, self.local_steps, self.global_step, "training");
        if !self.first_gradient_seen && replies.iter().any(|r| r.accepted) {
            self.first_gradient_seen = true;
            tracing::info!(
                "{}: first gradient accepted at global_step={} ({:.3}s after the process started)",
                self.task,
                self.global_step,
                crate::process_age().as_secs_f64()
            );
        }
    }

    fn log_progress(&self, summaries: &mut Summaries) {
        let every = self.settings.log_every_steps;
        if every == 0 || !self.local_steps.is_multiple_of(every) {
            return;
        }
        tracing::info!(
            "{}: local_step={} global_step={} loss={:.4}{}",
            self.task,
            self.local_steps,
            self.global_step,
            self.last_loss,
            summary_line(self.model, &self.params)
        );
        let mut scalars = vec![("loss", self.last_loss)];
        let summary = self.model.summary(&self.params);
        scalars.extend(summary.iter().map(|(k, v)| (k.as_str(), *v as f32)));
        summaries.add(self.global_step, &scalars);
    }

    /// Nothing to train for now (the last shards are being trained by
    /// others). Sync: abstain at the ps tasks' current step, so that no step
    /// waits for this task; then wait a little. Returns true when training
    /// is over.
    async fn idle(&mut self, feed: &mut ShardFeed) -> Result<bool, TrainError> {
        self.behind = true;
        if self.settings.sync_replicas {
            let mut steps = self.pulled.steps.clone();
            // An abstention for a step that completed meanwhile counts for
            // nothing: abstain again at the step the ps is at.
            for _ in 0..3 {
                let replies = match self.ps.abstain(&steps).await {
                    Ok(r) => r,
                    Err(e) if layout_changed(&e) => {
                        return self.follow_layout(&e).await.map(|()| false);
                    }
                    Err(e) if needs_recovery(&e) => {
                        return self.recover(&e, feed).await.map(|()| false);
                    }
                    Err(e) => return Err(e.into()),
                };
                if replies.iter().any(|r| r.done) {
                    return Ok(true);
                }
                let late = replies.iter().zip(&steps).any(|(r, &s)| !r.accepted && r.step > s);
                steps = replies.iter().map(|r| r.step).collect();
                if !late {
                    break;
                }
            }
            self.pulled.steps = steps;
        }
        self.status.set(TaskState::Waiting, self.local_steps, self.global_step, "waiting for a shard of the data");
        tokio::time::sleep(IDLE_POLL).await;
        Ok(false)
    }

    /// The model's figures on held-out data with the latest values (a
    /// sparse model's rows of those examples pulled first; none when that
    /// fails).
    async fn evaluate(&mut self, batch: &Batch) -> Option<crate::model::Metrics> {
        if self.sparse {
            let rows = self.model.row_ids(batch);
            if let Err(e) = self.ps.pull(&mut self.params, &rows, &[], false, self.settings.step_timeout).await {
                tracing::warn!("{}: no final evaluation: pulling the held-out examples' rows failed: {e}", self.task);
                return None;
            }
            self.held_rows = rows;
        }
        Some(self.model.evaluate(&self.params, batch))
    }

    /// The chief checkpoints when due. Checkpoints are named by the step of
    /// the values just pulled: in sync training every ps holds exactly that
    /// step now.
    async fn checkpoint_if_due(&self, checkpointer: &mut Checkpointer) -> Result<(), TrainError> {
        let step = self.pulled.steps[0];
        if !self.pulled.done && !self.steps_done() && checkpointer.due(step) {
            checkpointer.save(&self.ps, step, &self.metrics).await?;
        }
        Ok(())
    }

    /// The end: the chief writes the last checkpoint and summaries and tells
    /// every ps that training is over; any other task leaves. Then the report.
    async fn finish(
        mut self,
        workload: &Workload,
        feed: &mut ShardFeed,
        checkpointer: Option<Checkpointer>,
        mut summaries: Summaries,
        train_secs: f64,
    ) -> Result<FinalReport, TrainError> {
        let global_step = self.global_step.max(self.pulled.steps[0]);
        let eval = match workload.eval.as_ref() {
            Some(b) => self.evaluate(b).await,
            None => None,
        };
        // Bounded: at the job's end the ps tasks may be gone already.
        let data = match tokio::time::timeout(crate::client::LEAVE_DEADLINE, feed.close(&self.ps)).await {
            Ok(data) => data,
            Err(_) => feed.progress,
        };
        if self.is_chief {
            if let Some(mut c) = checkpointer
                && global_step > c.last_step
            {
                c.save(&self.ps, global_step, &self.metrics).await?;
            }
            if let Some(m) = &eval {
                summaries.add(global_step, &train::eval_scalars(m));
            }
            let reason = if data.is_some_and(|d| d.finished) { "every epoch trained" } else { "train_steps reached" };
            self.ps.shutdown_proposed(reason, global_step).await;
            self.ps.shutdown(reason, global_step).await?;
            tracing::info!("{}: training done at global_step={global_step} ({reason}); told every ps to finish", self.task);
            self.wait_for_final_evaluation().await;
        } else {
            self.ps.leave("training done").await;
        }
        summaries.close();
        let data = data.filter(|_| self.is_chief);
        Ok(self.final_report(eval, data, global_step, train_secs))
    }

    /// The report of a task whose training is over (the chief's with the
    /// dispatcher's figures), logged as one line too.
    fn final_report(&self, eval: Option<crate::model::Metrics>, data: Option<proto::DispatchProgress>, global_step: i64, train_secs: f64) -> FinalReport {
        let mut r = train::report(&self.task, "worker", self.is_chief, self.model, &self.params, eval);
        if let Some(d) = data {
            r = r.with_data(&(&d).into());
        }
        if r.loss.is_none() {
            r.loss = Some(self.last_loss);
        }
        r.global_step = global_step;
        r.local_steps = self.local_steps;
        r.elapsed_secs = self.started.elapsed().as_secs_f64();
        r.steps_per_sec = self.local_steps as f64 / train_secs.max(1e-9);
        r.stale_gradients_dropped = self.settings.sync_replicas.then_some(self.stale);
        self.status.set(TaskState::Done, self.local_steps, global_step, "done");
        tracing::info!(
            "{}: finished: local_steps={} global_step={global_step} loss={:.4}{}{}",
            self.task,
            self.local_steps,
            r.loss.unwrap_or(f32::NAN),
            r.accuracy.map(|a| format!(" accuracy={a:.4}")).unwrap_or_default() + &r.auc.map(|a| format!(" auc={a:.4}")).unwrap_or_default(),
            summary_line(self.model, &self.params)
        );
        r
    }
}

impl Trainer<'_> {
    /// The chief: once training is over, waits (up to the shutdown grace)
    /// until every evaluator has evaluated the final variables and left, so
    /// the job is done only after its final evaluation (the job ends when
    /// the chief exits). An evaluator the ps tasks never heard of is not
    /// waited for.
    async fn wait_for_final_evaluation(&self) {
        if self.evaluators == 0 {
            return;
        }
        let started = Instant::now();
        let evaluating = |stats: &[proto::StatsReply]| stats.iter().any(|s| s.pending.iter().any(|t| t.starts_with("evaluator:")));
        tracing::info!("{}: waiting for the evaluator's final evaluation", self.task);
        loop {
            // A ps exits as soon as no task it waits for is left: one that no longer answers
            // has seen the evaluator leave (or given up on it after its grace period).
            let stats = match tokio::time::timeout(Duration::from_secs(2), self.ps.stats()).await {
                Ok(stats) => stats,
                Err(_) => {
                    tracing::info!("{}: the ps tasks no longer answer: they have seen every task leave", self.task);
                    return;
                }
            };
            match stats {
                Ok(stats) if !evaluating(&stats) => {
                    tracing::info!("{}: the evaluator evaluated the final variables ({:.1}s)", self.task, started.elapsed().as_secs_f64());
                    return;
                }
                Ok(_) if started.elapsed() < self.settings.shutdown_grace => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(_) => {
                    tracing::warn!("{}: no final evaluation within {:?}; ending anyway", self.task, self.settings.shutdown_grace);
                    return;
                }
                Err(e) => {
                    tracing::info!("{}: the ps tasks no longer answer ({e}): they have seen every task leave", self.task);
                    return;
                }
            }
        }
    }
}

/// A worker's training loop (the chief's too): asks the dispatcher for
/// shards and trains them until `--train_steps` global steps or
/// `--num_epochs` epochs; survives ps restarts (it rejoins and goes on from
/// the ps's step), keeps its lease by heartbeat; the chief writes
/// checkpoints and TensorBoard summaries. `stop` ends the training (the task
/// leaves at once), not its end: once training is over the final
/// evaluation, the chief's last checkpoint and the report are made whatever
/// comes.
pub async fn run_worker(ctx: &TaskContext, workload: &mut Workload, stop: impl std::future::Future<Output = ()>) -> Result<FinalReport, TrainError> {
    let settings = &ctx.settings;
    let trainer = Trainer::new(ctx, workload.model.as_ref())?;
    let mut feed = ShardFeed::new(workload, settings)?;
    let ps = trainer.ps.clone();
    let trained = tokio::select! {
        trained = train_until_done(trainer, &mut feed, settings) => trained?,
        () = stop => {
            // Stopped on purpose (a scale-down, a deleted pod, SIGTERM):
            // the step in flight is dropped and the task deregisters at once.
            let ps_heard = ps.leave("stopping on a signal").await;
            return Err(TrainError::Stopped { ps_heard, ps_total: ps.num_ps() });
        }
    };
    let Trained { trainer, checkpointer, summaries, train_secs, _lease } = trained;
    trainer.finish(workload, &mut feed, checkpointer, summaries, train_secs).await
}

/// A trainer whose training is over, with what its end needs.
struct Trained<'a> {
    trainer: Trainer<'a>,
    checkpointer: Option<Checkpointer>,
    summaries: Summaries,
    train_secs: f64,
    /// Heartbeats go on until the end (the chief may wait for the evaluator).
    _lease: AbortOnDropHandle<()>,
}

/// The loop of [`run_worker`], from joining the job to the end of training.
async fn train_until_done<'a>(mut trainer: Trainer<'a>, feed: &mut ShardFeed, settings: &TrainSettings) -> Result<Trained<'a>, TrainError> {
    trainer.log_start();
    trainer.status.set(TaskState::Waiting, 0, 0, "connecting to the parameter servers");
    // A task (re)started with the TF_CONFIG of an older ps set joins the
    // job's current one.
    trainer.join_current_layout().await?;
    let lease = trainer.keep_lease();
    let mut checkpointer = if trainer.is_chief { Checkpointer::new(&settings.checkpoints, trainer.pulled.steps[0]) } else { None };
    let mut summaries = Summaries::new(if trainer.is_chief { settings.log_dir.as_ref() } else { None }, ".chief");
    let loop_start = Instant::now();
    while !(trainer.pulled.done || trainer.steps_done()) {
        let over = match feed.next(&trainer.ps).await? {
            Fed::Batch(batch) => trainer.train_following(&batch, feed, &mut summaries).await?,
            Fed::Wait => trainer.idle(feed).await?,
            Fed::Finished => {
                tracing::info!("{}: every shard of every epoch is done", trainer.task);
                true
            }
        };
        if over {
            break;
        }
        if let Some(c) = &mut checkpointer {
            trainer.checkpoint_if_due(c).await?;
        }
        if trainer.is_chief
            && trainer.move_if_proposed().await?
            && let Some(c) = &mut checkpointer
        {
            c.after_move();
        }
    }
    Ok(Trained { trainer, checkpointer, summaries, train_secs: loop_start.elapsed().as_secs_f64(), _lease: lease })
}

#[cfg(test)]
mod tests {
    use super::overlapped;

    /// The work runs after the call's first poll and before its answer is taken; a call
    /// answered at once leaves it undone (its batches are then made when taken).
    #[tokio::test]
    async fn work_overlaps_a_call_that_waits_and_is_skipped_for_one_answered_at_once() {
        use std::sync::{Arc, Mutex};
        for answered_at_once in [false, true] {
            let seen = Arc::new(Mutex::new(Vec::<&str>::new()));
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let call = {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push("sent");
                    if !answered_at_once {
                        rx.await.unwrap();
                    }
                    seen.lock().unwrap().push("answered");
                    7
                }
            };
            let answer = overlapped(call, || {
                seen.lock().unwrap().push("work");
                let _ = tx.send(());
            })
            .await;
            assert_eq!(answer, 7);
            let want: &[&str] = if answered_at_once { &["sent", "answered"] } else { &["sent", "work", "answered"] };
            assert_eq!(*seen.lock().unwrap(), want);
        }
    }
}

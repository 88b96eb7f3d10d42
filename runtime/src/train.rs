//! Training: settings, reports, the single-process loop, the evaluator, and
//! the pieces the worker's loop ([`crate::worker`]) is built from (the
//! training configuration, joining the ps tasks, the chief's checkpoints and
//! summaries). The math is in `model` and `optimizer`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use serde::Serialize;
use tonic::Code;

use crate::auth::Credentials;
use crate::checkpoint::{self, ShardData};
use crate::client::{ClientError, ModelVariable, PsSet, Pulled};
use crate::cluster::{ClusterConfig, TaskId};
use crate::data::{Batch, TrainingSet};
use crate::dispatch::{Handout, ShardDispatcher, ShardPlan};
use crate::embedding::RowTable;
use crate::events::EventWriter;
use crate::metrics::TrainingMetrics;
use crate::model::{Metrics, Model};
use crate::optimizer::{Optimizer, Slots};
use crate::placement::{self, PlacementInput};
use crate::proto::{self, TaskState, UpdateMode};
use crate::status::TaskStatus;
use crate::storage::Location;

/// A model with its data: what a task trains or evaluates.
pub struct Workload {
    pub model: Box<dyn Model>,
    /// The whole training set; the shard dispatcher decides which shards of
    /// it a task trains.
    pub train: Arc<dyn TrainingSet>,
    /// Examples per step.
    pub batch_size: usize,
    /// Held-out data for evaluation (the chief's final figures and the
    /// evaluator's periodic ones).
    pub eval: Option<Batch>,
}

/// Shards hold this many batches unless `--shard_size` says otherwise: a
/// dispatcher round trip every ten steps at most, and little work redone
/// when a worker is lost.
pub const DEFAULT_BATCHES_PER_SHARD: u64 = 10;

/// ...and at least this many examples. A `NextShard` round trip costs the
/// two shared cores about 0.3 ms of CPU (tonic and HTTP/2 on both sides):
/// every 10 steps of a small model at batch 1 that was 40 % of the linear
/// sync rate (BENCHMARKS.md, "Where the linear sync rate went"). A thousand
/// examples make it under 1 % for any model, and a lost worker still
/// costs at most a thousand examples redone.
pub const MIN_EXAMPLES_PER_SHARD: u64 = 1_000;

/// Examples per shard when `--shard_size` is not given.
pub fn default_shard_size(batch_size: usize) -> u64 {
    (DEFAULT_BATCHES_PER_SHARD * batch_size as u64).max(MIN_EXAMPLES_PER_SHARD)
}

/// How the training set is cut into shards: the plan every task of a job
/// presents to the dispatcher.
pub fn shard_plan(workload: &Workload, settings: &TrainSettings) -> Result<ShardPlan, TrainError> {
    let shard_size = settings.shard_size.unwrap_or_else(|| default_shard_size(workload.batch_size));
    ShardPlan::new(workload.train.num_examples() as u64, shard_size, settings.seed, settings.num_epochs).map_err(|e| TrainError::Config(e.to_string()))
}

/// What a task of a cluster runs with, whatever its role: where it is, how
/// it trains, how it proves who it is, and what it shows of itself.
pub struct TaskContext {
    pub cluster: ClusterConfig,
    pub settings: TrainSettings,
    pub credentials: Credentials,
    /// What the task's Worker service answers about it.
    pub status: Arc<TaskStatus>,
    /// What its metrics endpoint serves.
    pub metrics: Arc<TrainingMetrics>,
}

/// How many gradients a sync step averages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// One per training task of the cluster (SyncReplicasOptimizer's default).
    AllWorkers,
    /// A fixed number (fewer than the workers makes backup workers).
    Count(u32),
    /// The training tasks whose lease is live: workers may come and go.
    Auto,
}

/// When the chief writes checkpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointSettings {
    /// A local path or an object-store URL.
    pub directory: Option<Location>,
    pub every_steps: Option<u64>,
    pub every_secs: Option<f64>,
    /// Complete checkpoints kept.
    pub keep: usize,
}

/// How training runs; the same for every task of a job.
#[derive(Debug, Clone)]
pub struct TrainSettings {
    /// Global steps to train (`None`: until `num_epochs` are done).
    pub train_steps: Option<u64>,
    /// Epochs of the training set to train (`None`: until `train_steps`).
    pub num_epochs: Option<u64>,
    /// Examples per shard of the training set (`None`:
    /// [`DEFAULT_BATCHES_PER_SHARD`] batches).
    pub shard_size: Option<u64>,
    pub optimizer: Optimizer,
    pub sync_replicas: bool,
    pub replicas_to_aggregate: Aggregate,
    pub log_every_steps: u64,
    /// How long non-chief workers wait for the chief to initialise variables.
    pub init_timeout: Duration,
    /// How long a ps may stay unreachable before the task gives up.
    pub connect_timeout: Duration,
    /// How long one sync step may take before the task gives up.
    pub step_timeout: Duration,
    pub eval_interval: Duration,
    pub partition_threshold_bytes: usize,
    /// Pulls and pushes over the tensor channel rather than gRPC.
    pub tensor_channel: bool,
    pub seed: u64,
    pub checkpoints: CheckpointSettings,
    /// TensorBoard event files: the chief's in it, the evaluator's in `<log_dir>/eval`.
    pub log_dir: Option<Location>,
    /// How often a training task renews its lease.
    pub heartbeat: Duration,
    /// After training: how long a ps waits for the other tasks to notice,
    /// and the chief for the evaluator's final evaluation.
    pub shutdown_grace: Duration,
}

/// The seed when none is given (`--seed`): of the initial values and the data order, and of
/// the files `tfjob-runtime generate` writes.
pub const DEFAULT_SEED: u64 = 1;

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            train_steps: Some(1000),
            num_epochs: None,
            shard_size: None,
            optimizer: Optimizer::sgd(0.01),
            sync_replicas: false,
            replicas_to_aggregate: Aggregate::AllWorkers,
            log_every_steps: 100,
            init_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(120),
            step_timeout: Duration::from_secs(300),
            eval_interval: Duration::from_secs(5),
            partition_threshold_bytes: placement::DEFAULT_PARTITION_THRESHOLD_BYTES,
            tensor_channel: true,
            seed: DEFAULT_SEED,
            checkpoints: CheckpointSettings { keep: 5, ..Default::default() },
            log_dir: None,
            heartbeat: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// The final figures of a task, printed as one JSON line at the end.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FinalReport {
    pub task: String,
    pub role: String,
    pub chief: bool,
    pub global_step: i64,
    pub local_steps: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f32>,
    /// Binary classifiers (the sparse models): area under the ROC curve and
    /// log loss on the held-out examples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auc: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_loss: Option<f32>,
    /// Model figures (`W` and `b` for the linear model).
    #[serde(flatten)]
    pub summary: std::collections::BTreeMap<String, f64>,
    pub elapsed_secs: f64,
    pub steps_per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_gradients_dropped: Option<u64>,
    /// The data as the shard dispatcher counted it (chief and single
    /// process): epochs whose every shard is done, examples of the shards
    /// done, shards handed out again after their worker was lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epochs_completed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub examples_trained: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards_redone: Option<u64>,
    /// Why the task stopped before its training was over (a signal: a
    /// scale-down, a deleted pod, the job's end); its figures are those of
    /// the moment it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl FinalReport {
    /// The figures of a task stopped on a signal while it trained.
    pub fn stopped(task: &str, chief: bool, metrics: &TrainingMetrics, elapsed: Duration) -> FinalReport {
        let local_steps = metrics.local_steps.load(Ordering::Relaxed);
        FinalReport {
            task: task.into(),
            role: "worker".into(),
            chief,
            global_step: metrics.global_step.load(Ordering::Relaxed) as i64,
            local_steps,
            loss: Some(metrics.last_loss.get() as f32).filter(|l| l.is_finite()),
            elapsed_secs: elapsed.as_secs_f64(),
            steps_per_sec: local_steps as f64 / elapsed.as_secs_f64().max(1e-9),
            stopped: Some("on a signal, before training was over".into()),
            ..Default::default()
        }
    }

    /// Adds the dispatcher's figures.
    pub fn with_data(mut self, p: &crate::dispatch::DispatchProgress) -> Self {
        self.epochs_completed = Some(p.epochs_completed);
        self.examples_trained = Some(p.examples_trained);
        self.shards_redone = Some(p.shards_redone);
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Placement(#[from] placement::PlacementError),
    #[error("the chief ({chief}) did not initialise the variables within {waited:?}")]
    InitTimeout { chief: String, waited: Duration },
    #[error(
        "step {step} did not complete within {waited:?}: too few workers are pushing gradients (without \
         --replicas_to_aggregate=auto a sync step needs a fixed number of them, set when the job started: \
         use auto for a job whose workers come and go)"
    )]
    StepTimeout { step: i64, waited: Duration },
    #[error("{0}")]
    Config(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error(transparent)]
    CheckpointFile(#[from] checkpoint::CheckpointError),
    #[error("the parameter servers restarted {0} times; giving up")]
    TooManyRecoveries(u32),
    /// The job's layout changed under a step (a ps added or removed): the
    /// task follows it and takes the step again.
    #[error("the job's layout changed: {0}")]
    LayoutChanged(ClientError),
    /// Stopped on purpose (a signal) after telling the ps tasks it leaves.
    #[error("stopped on a signal; {ps_heard} of {ps_total} ps task(s) heard it leave")]
    Stopped { ps_heard: usize, ps_total: usize },
}

impl TrainError {
    /// Exit code following the `ExitCode` restart policy's contract
    /// ([`crate::exit::code`]): 1-127 permanent (configuration, data, a
    /// refused request), >= 128 transient (a peer gone, storage out of
    /// reach, a timeout that a restart may cure).
    pub fn exit_code(&self) -> u8 {
        use crate::exit::code;
        match self {
            TrainError::Config(_) | TrainError::Placement(_) => code::CONFIG,
            TrainError::Client(e) => match e.code() {
                Some(Code::InvalidArgument | Code::FailedPrecondition | Code::NotFound | Code::PermissionDenied | Code::Unauthenticated) => code::REFUSED,
                _ => code::TRANSIENT,
            },
            TrainError::InitTimeout { .. } | TrainError::StepTimeout { .. } | TrainError::TooManyRecoveries(_) | TrainError::LayoutChanged(_) => {
                code::TRANSIENT
            }
            TrainError::Checkpoint(_) => code::CHECKPOINT,
            TrainError::CheckpointFile(e) => code::of(e.is_transient(), code::CHECKPOINT),
            TrainError::Stopped { .. } => code::TERMINATED,
        }
    }
}

pub(crate) fn zeros_like(model: &dyn Model) -> Vec<ArrayD<f32>> {
    model.variables().iter().map(|v| ArrayD::zeros(v.shape.clone())).collect()
}

pub(crate) fn summary_line(model: &dyn Model, params: &[ArrayD<f32>]) -> String {
    model.summary(params).iter().map(|(k, v)| format!(" {k}={v:.4}")).collect()
}

pub(crate) fn report(task: &str, role: &str, chief: bool, model: &dyn Model, params: &[ArrayD<f32>], eval: Option<Metrics>) -> FinalReport {
    FinalReport {
        task: task.into(),
        role: role.into(),
        chief,
        loss: eval.as_ref().map(|m| m.loss),
        auc: eval.as_ref().and_then(|m| m.auc),
        log_loss: eval.as_ref().filter(|m| m.auc.is_some()).map(|m| m.loss),
        accuracy: eval.and_then(|m| m.accuracy),
        summary: model.summary(params).into_iter().collect(),
        ..Default::default()
    }
}

/// One step's update in this process: each dense variable with its slots,
/// each sparse embedding's rows `rows` in its table.
fn apply_locally(
    optimizer: &Optimizer,
    params: &mut [ArrayD<f32>],
    slots: &mut [Slots],
    tables: &mut [Option<RowTable>],
    gradients: &[ArrayD<f32>],
    rows: &[Vec<i64>],
) {
    for (v, ((p, s), g)) in params.iter_mut().zip(slots).zip(gradients).enumerate() {
        let g = g.as_slice().expect("standard layout");
        match &mut tables[v] {
            Some(t) => t.apply(optimizer, &rows[v], g),
            None => optimizer.apply_all(p.as_slice_mut().expect("standard layout"), s, g),
        }
    }
}

/// Trains in this process alone: no ps, no network. The data comes shard
/// by shard from a dispatcher of its own, as it would from ps 0: the same
/// epochs, the same order. `progress` is called every `log_every_steps`
/// steps with (step, loss, params).
pub fn train_single_process(
    workload: &mut Workload,
    settings: &TrainSettings,
    mut progress: impl FnMut(u64, f32, &dyn Model, &[ArrayD<f32>]),
) -> Result<FinalReport, TrainError> {
    let start = Instant::now();
    let plan = shard_plan(workload, settings)?;
    let mut dispatcher = ShardDispatcher::new(plan);
    let model = workload.model.as_ref();
    let specs = model.variables();
    let mut params = crate::model::init_values(&specs, settings.seed);
    let mut slots: Vec<_> = params.iter().map(|p| settings.optimizer.new_slots(p.len())).collect();
    // Sparse embeddings: their rows here, as a ps would hold them.
    let mut tables: Vec<Option<RowTable>> =
        specs.iter().map(|s| s.is_sparse().then(|| RowTable::whole(&s.name, s.shape[0], s.shape[1], s.init.clone(), settings.seed))).collect();
    let mut loss = f32::NAN;
    let mut step = 0u64;
    let mut finished = None;
    let mut checkpointer = local_checkpointer(&settings.checkpoints)?;
    let steps_done = |step: u64| settings.train_steps.is_some_and(|n| step >= n);
    'shards: while !steps_done(step) {
        let reply = dispatcher.next("local", finished.take(), true).map_err(|e| TrainError::Config(e.to_string()))?;
        let Some(Handout::Assigned(shard, _)) = reply.handout else {
            break;
        };
        for batch in workload.train.shard_batches(&plan, shard, workload.batch_size) {
            if steps_done(step) {
                break 'shards;
            }
            let rows = gather_rows(model, &tables, &mut params, &batch);
            let lg = model.loss_and_gradients(&params, &batch);
            loss = lg.loss;
            apply_locally(&settings.optimizer, &mut params, &mut slots, &mut tables, &lg.gradients, &rows);
            step += 1;
            if settings.log_every_steps > 0 && step.is_multiple_of(settings.log_every_steps) {
                progress(step, loss, model, &params);
            }
            if let Some(c) = checkpointer.as_mut().filter(|c| c.due(step as i64)) {
                save_local(c, step as i64, &local_shard(&specs, &params, &slots, &tables, &dispatcher)?)?;
            }
        }
        finished = Some(shard);
    }
    if finished.is_some() {
        dispatcher.next("local", finished, false).map_err(|e| TrainError::Config(e.to_string()))?;
    }
    if let Some(c) = checkpointer.as_mut().filter(|c| step as i64 > c.last_step) {
        save_local(c, step as i64, &local_shard(&specs, &params, &slots, &tables, &dispatcher)?)?;
    }
    let eval = workload.eval.as_ref().map(|b| {
        gather_rows(model, &tables, &mut params, b);
        model.evaluate(&params, b)
    });
    let mut r = report("local", "single-process", true, model, &params, eval).with_data(&dispatcher.progress());
    if r.loss.is_none() {
        r.loss = Some(loss);
    }
    r.global_step = step as i64;
    r.local_steps = step;
    r.elapsed_secs = start.elapsed().as_secs_f64();
    r.steps_per_sec = step as f64 / r.elapsed_secs.max(1e-9);
    Ok(r)
}

/// The single process's checkpoints, in `--checkpoint_dir` as one ps task
/// writes them (ps 0 of 1), so `export`, `predict` and `evaluate` read them.
/// It trains from the start: a directory that holds a checkpoint already is
/// refused rather than overwritten or silently ignored.
fn local_checkpointer(c: &CheckpointSettings) -> Result<Option<Checkpointer>, TrainError> {
    let Some(dir) = &c.directory else { return Ok(None) };
    let listed = checkpoint::list(dir)?;
    if let Some(last) = listed.last() {
        return Err(TrainError::Config(format!(
            "--checkpoint_dir {dir} holds checkpoints already ({}); training in one process starts from the beginning and does not resume: give an empty directory",
            last.path
        )));
    }
    Ok(Checkpointer::new(c, 0))
}

/// What one ps would save of the variables the single process holds.
fn local_shard(
    specs: &[crate::model::VariableSpec],
    params: &[ArrayD<f32>],
    slots: &[Slots],
    tables: &[Option<RowTable>],
    dispatcher: &ShardDispatcher,
) -> Result<ShardData, TrainError> {
    let mut data = ShardData::default();
    for (((spec, p), s), table) in specs.iter().zip(params).zip(slots).zip(tables) {
        match table {
            Some(t) => {
                let part = serde_json::to_string(&t.part).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
                data.push_rows(&t.name, t.dim(), t.saved(), part);
            }
            None => data.push_dense(&spec.name, &spec.shape, p.as_slice().expect("standard layout"), [&s.first, &s.second], s.updates),
        }
    }
    data.dispatcher = Some(serde_json::to_string(&dispatcher.state()).map_err(|e| TrainError::Checkpoint(e.to_string()))?);
    Ok(data)
}

/// Writes the single process's checkpoint of `step` (shard and index), and
/// prunes old ones.
fn save_local(c: &mut Checkpointer, step: i64, data: &ShardData) -> Result<(), TrainError> {
    let start = Instant::now();
    let info = checkpoint::write_shard(&c.directory, step, 0, 1, data)?;
    let written = checkpoint::write_index(&c.directory, step, 1, &[info])?;
    checkpoint::prune(&c.directory, c.keep)?;
    c.written(step);
    tracing::info!("local: checkpoint of global_step={step} written to {written} in {:.3}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// Puts the rows `batch` touches of every local embedding table into
/// `params`; returns them (per variable).
fn gather_rows(model: &dyn Model, tables: &[Option<RowTable>], params: &mut [ArrayD<f32>], batch: &Batch) -> Vec<Vec<i64>> {
    if tables.iter().all(Option::is_none) {
        return Vec::new();
    }
    let rows = model.row_ids(batch);
    for (v, t) in tables.iter().enumerate() {
        if let Some(t) = t {
            let mut values = Vec::with_capacity(rows[v].len() * t.dim());
            t.gather(&rows[v], &mut values);
            params[v] = ArrayD::from_shape_vec(vec![rows[v].len(), t.dim()], values).expect("rows x dim");
        }
    }
    rows
}

/// The training configuration every ps must agree on.
///
/// Without `--replicas_to_aggregate` the job aggregates as its chief decides
/// at initialisation: one gradient per training task of the chief's cluster
/// spec, or, when that spec lists the workers sparsely (Kubeflow's
/// `enableDynamicWorker`: nobody knows how many there will be), the live
/// workers as with `auto`. Every other task takes the job's choice
/// (`follow_chief_aggregation`), so a worker added or removed later (whose
/// cluster spec counts differently) still joins.
pub fn training_config(cluster: &ClusterConfig, settings: &TrainSettings) -> Result<proto::TrainingConfig, TrainError> {
    let spec = &cluster.cluster;
    let total = spec.training_tasks().len() as u32;
    let dynamic = spec.is_sparse("worker");
    let config = |replicas_to_aggregate, total_num_replicas, elastic, follow_chief_aggregation| proto::TrainingConfig {
        mode: if settings.sync_replicas { UpdateMode::Sync } else { UpdateMode::Async } as i32,
        optimizer: Some(settings.optimizer.to_proto()),
        replicas_to_aggregate,
        total_num_replicas,
        elastic,
        follow_chief_aggregation,
    };
    if !settings.sync_replicas {
        return Ok(config(0, 0, false, false));
    }
    match settings.replicas_to_aggregate {
        Aggregate::Auto => Ok(config(0, 0, true, false)),
        Aggregate::AllWorkers if dynamic => Ok(config(0, 0, true, true)),
        Aggregate::AllWorkers => Ok(config(total, total, false, true)),
        Aggregate::Count(n) if n == 0 || (!dynamic && n > total) => {
            Err(TrainError::Config(format!("--replicas_to_aggregate: {n} is not between 1 and the {total} training task(s) of the cluster")))
        }
        Aggregate::Count(n) => Ok(config(n, if dynamic { 0 } else { total }, false, false)),
    }
}

pub(crate) fn ps_set(ctx: &TaskContext, model: &dyn Model) -> Result<PsSet, TrainError> {
    ps_set_over(ctx, model, &ctx.cluster.cluster.addresses("ps"), 1)
}

/// The ps tasks at `ps_addresses` under layout `version` (ps 0 says which
/// are the job's now; the `TF_CONFIG` a task started with is version 1).
pub(crate) fn ps_set_over(ctx: &TaskContext, model: &dyn Model, ps_addresses: &[String], version: u64) -> Result<PsSet, TrainError> {
    let TaskContext { cluster, settings, credentials, .. } = ctx;
    let specs = model.variables();
    let inputs: Vec<PlacementInput> = specs
        .iter()
        .map(|v| PlacementInput { name: v.name.clone(), shape: v.shape.clone(), embedding: v.embedding.filter(|e| e.sparse).map(|e| e.partition) })
        .collect();
    let placement = placement::place(&inputs, ps_addresses.len(), settings.partition_threshold_bytes)?;
    let variables = specs
        .iter()
        .map(|v| ModelVariable { name: v.name.clone(), shape: v.shape.clone(), rows: v.is_sparse().then(|| (v.init.clone(), settings.seed)) })
        .collect();
    let mut ps =
        PsSet::new(cluster.task.clone(), ps_addresses, credentials, variables, placement, training_config(cluster, settings)?, settings.connect_timeout)?
            .with_layout_version(version);
    ps.set_tensor_channel(settings.tensor_channel);
    Ok(ps)
}

/// The ps tasks of the job's current layout, when it is another than
/// `ps`'s (a move waited for until ps 0 says it is over, up to
/// `--connect_timeout_secs`); `None` when it is the same.
pub(crate) async fn current_ps_set(ctx: &TaskContext, model: &dyn Model, ps: &PsSet) -> Result<Option<PsSet>, TrainError> {
    let start = Instant::now();
    let layout = loop {
        let layout = ps.layout().await?;
        if !layout.moving || start.elapsed() > ctx.settings.connect_timeout {
            break layout;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if layout.version == ps.layout_version() || layout.ps_addresses.is_empty() {
        return Ok(None);
    }
    tracing::info!("{}: following the job's layout version {}: {} ps task(s)", ctx.cluster.task, layout.version, layout.ps_addresses.len());
    Ok(Some(ps_set_over(ctx, model, &layout.ps_addresses, layout.version)?))
}

/// Waits until the chief has initialised the variables, logging while it
/// waits, and pulls them (the sparse embeddings' rows `rows`).
pub(crate) async fn wait_for_variables(
    ps: &PsSet,
    params: &mut [ArrayD<f32>],
    rows: crate::client::Rows<'_>,
    chief: &str,
    timeout: Duration,
) -> Result<crate::client::Pulled, TrainError> {
    let start = Instant::now();
    loop {
        match ps.pull(params, rows, &[], true, Duration::from_secs(5)).await {
            Ok(p) => return Ok(p),
            Err(e) if e.code() == Some(Code::DeadlineExceeded) || matches!(e, ClientError::Interrupted { .. }) => {
                let waited = start.elapsed();
                if waited >= timeout {
                    return Err(TrainError::InitTimeout { chief: chief.into(), waited });
                }
                if matches!(e, ClientError::Interrupted { .. }) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } else {
                    tracing::info!("waiting for the chief ({chief}) to initialise the variables ({:.0}s so far)", waited.as_secs_f64());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The job's layout changed under the request: ask ps 0 for the current
/// one and cut it again.
pub(crate) fn layout_changed(e: &ClientError) -> bool {
    e.is_layout_change()
}

/// Is this error a ps that lost or changed its state (restarted, restored
/// from a checkpoint) rather than a problem with this task?
pub(crate) fn needs_recovery(e: &ClientError) -> bool {
    matches!(e, ClientError::Interrupted { .. }) || e.code() == Some(Code::FailedPrecondition)
}

/// The chief's checkpoints: every ps writes its shard, then the chief
/// writes the index and prunes old checkpoints.
pub(crate) struct Checkpointer {
    directory: Location,
    every_steps: Option<u64>,
    every: Option<Duration>,
    keep: usize,
    pub(crate) last_step: i64,
    last_time: Instant,
    /// The job's layout changed (a move): the next step is checkpointed,
    /// so that a ps restarted from it finds the ps set the job has now.
    after_move: bool,
}

impl Checkpointer {
    pub(crate) fn new(c: &CheckpointSettings, start_step: i64) -> Option<Self> {
        let directory = c.directory.clone()?;
        let every_steps = c.every_steps.filter(|&n| n > 0);
        let every = c.every_secs.filter(|&s| s > 0.0).map(Duration::from_secs_f64);
        Some(Checkpointer { directory, every_steps, every, keep: c.keep.max(1), last_step: start_step, last_time: Instant::now(), after_move: false })
    }

    /// Records a checkpoint written at `step` (by the single process).
    fn written(&mut self, step: i64) {
        self.last_step = step;
        self.last_time = Instant::now();
    }

    /// The job's state moved to another ps set: checkpoint the next step.
    pub(crate) fn after_move(&mut self) {
        self.after_move = true;
    }

    pub(crate) fn due(&self, step: i64) -> bool {
        step > self.last_step
            && (self.after_move
                || self.every_steps.is_some_and(|n| step / n as i64 > self.last_step / n as i64)
                || self.every.is_some_and(|d| self.last_time.elapsed() >= d))
    }

    pub(crate) async fn save(&mut self, ps: &PsSet, step: i64, metrics: &TrainingMetrics) -> Result<(), TrainError> {
        let start = Instant::now();
        let shards = ps.save_checkpoint(&self.directory.to_string(), step).await?;
        let infos = shards
            .iter()
            .map(|j| serde_json::from_str::<crate::checkpoint::ShardInfo>(j))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Checkpoint(format!("a ps described its shard badly: {e}")))?;
        let directory = self.directory.clone();
        let num_ps = ps.num_ps();
        let keep = self.keep;
        let layout = crate::checkpoint::LayoutRecord { version: ps.layout_version(), ps_addresses: ps.addresses().to_vec() };
        let written = tokio::task::spawn_blocking(move || -> Result<crate::storage::Location, crate::checkpoint::CheckpointError> {
            let path = crate::checkpoint::write_index_of(&directory, step, num_ps, &infos, Some(layout))?;
            crate::checkpoint::prune(&directory, keep)?;
            Ok(path)
        })
        .await
        .map_err(|e| TrainError::Checkpoint(e.to_string()))??;
        let secs = start.elapsed().as_secs_f64();
        metrics.checkpoints.fetch_add(1, Ordering::Relaxed);
        metrics.checkpoint_seconds.set(secs);
        tracing::info!("{}: checkpoint of global_step={step} written to {written} in {secs:.3}s", ps.task);
        self.last_step = step;
        self.last_time = Instant::now();
        self.after_move = false;
        Ok(())
    }
}

/// Writes scalars to the TensorBoard event file when there is one; a
/// failure to write is reported once and does not stop training.
pub(crate) struct Summaries {
    writer: Option<EventWriter>,
    last: Option<(Instant, i64)>,
}

impl Summaries {
    pub(crate) fn new(log_dir: Option<&Location>, suffix: &str) -> Self {
        let writer = log_dir.and_then(|dir| match EventWriter::create_in(dir, suffix) {
            Ok(w) => {
                tracing::info!("writing TensorBoard events to {}", w.path().display());
                Some(w)
            }
            Err(e) => {
                tracing::warn!("no TensorBoard events: {e}");
                None
            }
        });
        Summaries { writer, last: None }
    }

    /// Adds `scalars` at `step`, with `global_step/sec` since the last call.
    pub(crate) fn add(&mut self, step: i64, scalars: &[(&str, f32)]) {
        let Some(w) = &mut self.writer else { return };
        let mut all: Vec<(&str, f32)> = scalars.to_vec();
        let now = Instant::now();
        if let Some((t, s)) = self.last {
            let secs = now.duration_since(t).as_secs_f64();
            if secs > 0.0 && step > s {
                all.push(("global_step/sec", ((step - s) as f64 / secs) as f32));
            }
        }
        self.last = Some((now, step));
        if let Err(e) = w.add_scalars(step, &all) {
            tracing::warn!("TensorBoard events: {e}; no more will be written");
            self.writer = None;
        }
    }

    pub(crate) fn close(self) {
        if let Some(w) = self.writer
            && let Err(e) = w.close()
        {
            tracing::warn!("TensorBoard events: {e}");
        }
    }
}

/// The evaluator: pulls the variables whenever the step advanced (at most
/// every `eval_interval`), evaluates on held-out data, logs and writes
/// TensorBoard summaries, and stops when training is over. It only reads,
/// so it never slows training down beyond one pull per interval.
pub async fn run_evaluator(ctx: &TaskContext, workload: &mut Workload) -> Result<FinalReport, TrainError> {
    let TaskContext { cluster, settings, status, .. } = ctx;
    let start = Instant::now();
    let model = workload.model.as_ref();
    let mut ps = ps_set(ctx, model)?;
    let task = cluster.task.to_string();
    let chief = cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default();
    let eval = workload.eval.take().ok_or_else(|| TrainError::Config("the evaluator needs held-out data".into()))?;
    if let Some(current) = current_ps_set(ctx, model, &ps).await? {
        ps = current;
    }
    status.set(TaskState::Waiting, 0, 0, "connecting to the parameter servers");
    ps.handshake(true).await?;
    let mut params = zeros_like(model);
    // The rows of the held-out examples' sparse embeddings: all it reads of them.
    let eval_rows = model.row_ids(&eval);
    let mut pulled = wait_for_variables(&ps, &mut params, &eval_rows, &chief, settings.init_timeout).await?;
    // As TensorFlow's estimators: the evaluator's events in `<log_dir>/eval`,
    // so TensorBoard shows train and eval as two runs side by side.
    let eval_dir = settings.log_dir.as_ref().map(|d| d.child("eval"));
    let mut summaries = Summaries::new(eval_dir.as_ref(), ".eval");
    let mut evaluations = 0u64;
    let mut last;
    loop {
        let metrics_now = model.evaluate(&params, &eval);
        evaluations += 1;
        last = metrics_now.clone();
        note_evaluation(ctx, model, &params, &metrics_now, pulled.steps[0], evaluations);
        ps.heartbeat(evaluation_report(&metrics_now, pulled.steps[0])).await;
        summaries.add(pulled.steps[0], &eval_scalars(&metrics_now));
        if pulled.done {
            tracing::info!("{task}: final evaluation at global_step={} (training is over)", pulled.steps[0]);
            break;
        }
        tokio::time::sleep(settings.eval_interval).await;
        if let Some(p) = next_values(ctx, model, &mut ps, &mut params, &eval_rows, &pulled.steps).await? {
            pulled = p;
        }
    }
    summaries.close();
    let mut r = report(&task, "evaluator", false, model, &params, Some(last));
    r.global_step = pulled.steps[0];
    r.local_steps = evaluations;
    r.elapsed_secs = start.elapsed().as_secs_f64();
    status.set(TaskState::Done, evaluations, pulled.steps[0], "done");
    // The final line goes out before the chief hears that this evaluator is
    // done: the chief then ends the job, and whatever runs the replicas may
    // stop this one at once.
    crate::exit::print_report(&r);
    ps.leave("final evaluation done").await;
    Ok(r)
}

/// One evaluation's figures: counted, shown in the status, logged.
fn note_evaluation(ctx: &TaskContext, model: &dyn Model, params: &[ArrayD<f32>], m: &Metrics, step: i64, evaluations: u64) {
    let metrics = &ctx.metrics;
    metrics.local_steps.fetch_add(1, Ordering::Relaxed);
    metrics.global_step.store(step.max(0) as u64, Ordering::Relaxed);
    metrics.last_loss.set(m.loss as f64);
    ctx.status.set(TaskState::Training, evaluations, step, "evaluating");
    tracing::info!(
        "{}: global_step={step} eval_loss={:.4}{}{}{}",
        ctx.cluster.task,
        m.loss,
        m.accuracy.map(|a| format!(" eval_accuracy={a:.4}")).unwrap_or_default(),
        m.auc.map(|a| format!(" eval_auc={a:.4}")).unwrap_or_default(),
        summary_line(model, params)
    );
}

/// What the evaluator's heartbeat after an evaluation reports: the
/// evaluation, which ps 0 publishes on its metrics endpoint so that one
/// endpoint shows the whole job. The evaluator heartbeats only then (it
/// holds no lease), and whether the ps tasks heard it changes nothing here.
fn evaluation_report(m: &Metrics, step: i64) -> proto::HeartbeatRequest {
    let evaluation = proto::Evaluation { step, loss: m.loss, accuracy: m.accuracy, auc: m.auc };
    proto::HeartbeatRequest { evaluation: Some(evaluation), ..Default::default() }
}

/// The evaluator's next values: a long poll that returns as soon as the
/// step moved on past `steps` or training ended (`None`: it did not within
/// the wait; evaluate again); after a ps restart, once they are back.
async fn next_values(
    ctx: &TaskContext,
    model: &dyn Model,
    ps: &mut PsSet,
    params: &mut [ArrayD<f32>],
    rows: &[Vec<i64>],
    steps: &[i64],
) -> Result<Option<Pulled>, TrainError> {
    let settings = &ctx.settings;
    let next: Vec<i64> = steps.iter().map(|s| s + 1).collect();
    match ps.pull(params, rows, &next, false, settings.step_timeout.max(settings.eval_interval)).await {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.code() == Some(Code::DeadlineExceeded) => Ok(None),
        Err(e) if needs_recovery(&e) || layout_changed(&e) => {
            if let Some(current) = current_ps_set(ctx, model, ps).await? {
                *ps = current;
            }
            tracing::warn!("{}: {e}; waiting for the parameter servers", ctx.cluster.task);
            ps.handshake(true).await?;
            let chief = ctx.cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default();
            Ok(Some(wait_for_variables(ps, params, rows, &chief, settings.init_timeout).await?))
        }
        Err(e) => Err(e.into()),
    }
}

/// The held-out figures as TensorBoard scalars: `eval/loss`,
/// `eval/accuracy`, and for binary classifiers `eval/auc` and `eval/log_loss`.
pub(crate) fn eval_scalars(m: &Metrics) -> Vec<(&'static str, f32)> {
    let mut scalars = vec![("eval/loss", m.loss)];
    scalars.extend(m.accuracy.map(|a| ("eval/accuracy", a)));
    if let Some(auc) = m.auc {
        scalars.push(("eval/auc", auc));
        scalars.push(("eval/log_loss", m.loss));
    }
    scalars
}

/// The task id of the single-process mode.
pub fn local_task() -> TaskId {
    TaskId::new("local", 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shards_hold_ten_batches_and_at_least_a_thousand_examples() {
        // (batch size, examples per shard)
        let cases = [(1, 1_000), (32, 1_000), (100, 1_000), (101, 1_010), (256, 2_560), (4_096, 40_960)];
        for (batch_size, expected) in cases {
            assert_eq!(default_shard_size(batch_size), expected, "batch size {batch_size}");
        }
    }
}

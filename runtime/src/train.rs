//! The training loops: single process, worker (and chief), evaluator. The
//! math is in `model` and `optimizer`; this module only sequences pull,
//! compute, push and the chief's duties, and reports.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use serde::Serialize;
use tonic::Code;

use crate::auth::Credentials;
use crate::client::{ClientError, ModelVariable, PsSet};
use crate::cluster::{ClusterConfig, TaskId};
use crate::data::Batch;
use crate::model::{Metrics, Model};
use crate::optimizer::Optimizer;
use crate::placement::{self, PlacementInput};
use crate::proto::{self, TaskState, UpdateMode};
use crate::events::EventWriter;
use crate::metrics::TrainingMetrics;
use crate::status::TaskStatus;

/// Where batches come from: each worker reads its own shard, forever.
pub trait BatchSource: Send {
    fn next_batch(&mut self) -> Batch;
}

/// A model with its data: what a task trains or evaluates.
pub struct Workload {
    pub model: Box<dyn Model>,
    pub train: Box<dyn BatchSource>,
    /// Held-out data for evaluation (the chief's final figures and the
    /// evaluator's periodic ones).
    pub eval: Option<Batch>,
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
    pub directory: Option<PathBuf>,
    pub every_steps: Option<u64>,
    pub every_secs: Option<f64>,
    /// Complete checkpoints kept.
    pub keep: usize,
}

/// How training runs; the same for every task of a job.
#[derive(Debug, Clone)]
pub struct TrainSettings {
    pub train_steps: u64,
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
    /// Pulls and pushes over the tensor channel rather than gRPC (without TLS).
    pub tensor_channel: bool,
    pub seed: u64,
    pub checkpoints: CheckpointSettings,
    /// TensorBoard event files (chief and evaluator).
    pub log_dir: Option<PathBuf>,
    /// How often a training task renews its lease.
    pub heartbeat: Duration,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            train_steps: 1000,
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
            seed: 1,
            checkpoints: CheckpointSettings { keep: 5, ..Default::default() },
            log_dir: None,
            heartbeat: Duration::from_secs(2),
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
    /// Model figures (`W` and `b` for the linear model).
    #[serde(flatten)]
    pub summary: std::collections::BTreeMap<String, f64>,
    pub elapsed_secs: f64,
    pub steps_per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_gradients_dropped: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Placement(#[from] placement::PlacementError),
    #[error("the chief ({chief}) did not initialise the variables within {waited:?}")]
    InitTimeout { chief: String, waited: Duration },
    #[error("step {step} did not complete within {waited:?}: too few workers are pushing gradients")]
    StepTimeout { step: i64, waited: Duration },
    #[error("{0}")]
    Config(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("the parameter servers restarted {0} times; giving up")]
    TooManyRecoveries(u32),
}

impl TrainError {
    /// Exit code following the `ExitCode` restart policy's contract:
    /// 1-127 permanent (configuration, data), >= 128 transient (a peer gone,
    /// a timeout that a restart may cure).
    pub fn exit_code(&self) -> i32 {
        match self {
            TrainError::Config(_) | TrainError::Placement(_) => 2,
            TrainError::Client(e) => match e.code() {
                Some(Code::InvalidArgument | Code::FailedPrecondition | Code::NotFound | Code::PermissionDenied | Code::Unauthenticated) => 3,
                _ => 138,
            },
            TrainError::InitTimeout { .. } | TrainError::StepTimeout { .. } | TrainError::TooManyRecoveries(_) => 138,
            TrainError::Checkpoint(_) => 4,
        }
    }
}

fn zeros_like(model: &dyn Model) -> Vec<ArrayD<f32>> {
    model.variables().iter().map(|v| ArrayD::zeros(v.shape.clone())).collect()
}

fn summary_line(model: &dyn Model, params: &[ArrayD<f32>]) -> String {
    model.summary(params).iter().map(|(k, v)| format!(" {k}={v:.4}")).collect()
}

fn report(task: &str, role: &str, chief: bool, model: &dyn Model, params: &[ArrayD<f32>], eval: Option<Metrics>) -> FinalReport {
    FinalReport {
        task: task.into(),
        role: role.into(),
        chief,
        loss: eval.as_ref().map(|m| m.loss),
        accuracy: eval.and_then(|m| m.accuracy),
        summary: model.summary(params).into_iter().collect(),
        ..Default::default()
    }
}

/// Trains in this process alone: no ps, no network. `progress` is called
/// every `log_every_steps` steps and at the end with (step, loss, params).
pub fn train_single_process(
    workload: &mut Workload,
    settings: &TrainSettings,
    mut progress: impl FnMut(u64, f32, &dyn Model, &[ArrayD<f32>]),
) -> FinalReport {
    let start = Instant::now();
    let model = workload.model.as_ref();
    let specs = model.variables();
    let mut params = crate::model::init_values(&specs, settings.seed);
    let mut slots: Vec<_> = params.iter().map(|p| settings.optimizer.new_slots(p.len())).collect();
    let mut loss = f32::NAN;
    for step in 1..=settings.train_steps {
        let batch = workload.train.next_batch();
        let lg = model.loss_and_gradients(&params, &batch);
        loss = lg.loss;
        for ((p, s), g) in params.iter_mut().zip(&mut slots).zip(&lg.gradients) {
            settings.optimizer.apply_all(p.as_slice_mut().expect("standard layout"), s, g.as_slice().expect("standard layout"));
        }
        if settings.log_every_steps > 0 && step % settings.log_every_steps == 0 {
            progress(step, loss, model, &params);
        }
    }
    let eval = workload.eval.as_ref().map(|b| model.evaluate(&params, b));
    let mut r = report("local", "single-process", true, model, &params, eval);
    if r.loss.is_none() {
        r.loss = Some(loss);
    }
    r.global_step = settings.train_steps as i64;
    r.local_steps = settings.train_steps;
    r.elapsed_secs = start.elapsed().as_secs_f64();
    r.steps_per_sec = settings.train_steps as f64 / r.elapsed_secs.max(1e-9);
    r
}

/// The training configuration every ps must agree on.
pub fn training_config(cluster: &ClusterConfig, settings: &TrainSettings) -> Result<proto::TrainingConfig, TrainError> {
    let total = cluster.cluster.training_tasks().len() as u32;
    let mode = if settings.sync_replicas { UpdateMode::Sync } else { UpdateMode::Async } as i32;
    let optimizer = Some(settings.optimizer.to_proto());
    if !settings.sync_replicas {
        return Ok(proto::TrainingConfig { mode, optimizer, replicas_to_aggregate: 0, total_num_replicas: 0, elastic: false });
    }
    let required = match settings.replicas_to_aggregate {
        Aggregate::Auto => {
            return Ok(proto::TrainingConfig { mode, optimizer, replicas_to_aggregate: 0, total_num_replicas: 0, elastic: true });
        }
        Aggregate::AllWorkers => total,
        Aggregate::Count(n) => n,
    };
    if required == 0 || required > total {
        return Err(TrainError::Config(format!(
            "--replicas_to_aggregate: {required} is not between 1 and the {total} training task(s) of the cluster"
        )));
    }
    Ok(proto::TrainingConfig { mode, optimizer, replicas_to_aggregate: required, total_num_replicas: total, elastic: false })
}

fn ps_set(cluster: &ClusterConfig, model: &dyn Model, settings: &TrainSettings, credentials: &Credentials) -> Result<PsSet, TrainError> {
    let specs = model.variables();
    let inputs: Vec<PlacementInput> = specs.iter().map(|v| PlacementInput { name: v.name.clone(), shape: v.shape.clone() }).collect();
    let ps_addresses = cluster.cluster.addresses("ps");
    let placement = placement::place(&inputs, ps_addresses.len(), settings.partition_threshold_bytes)?;
    let variables = specs.iter().map(|v| ModelVariable { name: v.name.clone(), shape: v.shape.clone() }).collect();
    let mut ps = PsSet::new(
        cluster.task.clone(),
        &ps_addresses,
        credentials,
        variables,
        placement,
        training_config(cluster, settings)?,
        settings.connect_timeout,
    )?;
    ps.set_tensor_channel(settings.tensor_channel);
    Ok(ps)
}

/// Waits until the chief has initialised the variables, logging while it
/// waits, and pulls them.
async fn wait_for_variables(ps: &PsSet, params: &mut [ArrayD<f32>], chief: &str, timeout: Duration) -> Result<crate::client::Pulled, TrainError> {
    let start = Instant::now();
    loop {
        match ps.pull(params, &[], true, Duration::from_secs(5)).await {
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

/// Is this error a ps that lost or changed its state (restarted, restored
/// from a checkpoint) rather than a problem with this task?
fn needs_recovery(e: &ClientError) -> bool {
    matches!(e, ClientError::Interrupted { .. }) || e.code() == Some(Code::FailedPrecondition)
}

/// Joins (again) the ps tasks: handshake, initialisation by the chief (a
/// no-op where already done), then the current values.
async fn join(
    ps: &PsSet,
    params: &mut [ArrayD<f32>],
    model: &dyn Model,
    settings: &TrainSettings,
    is_chief: bool,
    chief: &str,
) -> Result<crate::client::Pulled, TrainError> {
    ps.handshake(false).await?;
    if is_chief {
        let values = crate::model::init_values(&model.variables(), settings.seed);
        let already = ps.init(&values, 0).await?;
        tracing::info!(
            "{}: {}",
            ps.task,
            if already { "variables were already initialised (or restored): resuming" } else { "initialised the variables" }
        );
    }
    wait_for_variables(ps, params, chief, settings.init_timeout).await
}

/// The chief's checkpoints: every ps writes its shard, then the chief
/// writes the index and prunes old checkpoints.
struct Checkpointer {
    directory: PathBuf,
    every_steps: Option<u64>,
    every: Option<Duration>,
    keep: usize,
    last_step: i64,
    last_time: Instant,
}

impl Checkpointer {
    fn new(c: &CheckpointSettings, start_step: i64) -> Option<Self> {
        let directory = c.directory.clone()?;
        let every_steps = c.every_steps.filter(|&n| n > 0);
        let every = c.every_secs.filter(|&s| s > 0.0).map(Duration::from_secs_f64);
        Some(Checkpointer { directory, every_steps, every, keep: c.keep.max(1), last_step: start_step, last_time: Instant::now() })
    }

    fn due(&self, step: i64) -> bool {
        step > self.last_step
            && (self.every_steps.is_some_and(|n| step / n as i64 > self.last_step / n as i64)
                || self.every.is_some_and(|d| self.last_time.elapsed() >= d))
    }

    async fn save(&mut self, ps: &PsSet, step: i64, metrics: &TrainingMetrics) -> Result<(), TrainError> {
        let start = Instant::now();
        let dir = self.directory.display().to_string();
        let shards = ps.save_checkpoint(&dir, step).await?;
        let infos = shards
            .iter()
            .map(|j| serde_json::from_str::<crate::checkpoint::ShardInfo>(j))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Checkpoint(format!("a ps described its shard badly: {e}")))?;
        let directory = self.directory.clone();
        let num_ps = ps.num_ps();
        let keep = self.keep;
        let written = tokio::task::spawn_blocking(move || -> Result<PathBuf, crate::checkpoint::CheckpointError> {
            let path = crate::checkpoint::write_index(&directory, step, num_ps, &infos)?;
            crate::checkpoint::prune(&directory, keep)?;
            Ok(path)
        })
        .await
        .map_err(|e| TrainError::Checkpoint(e.to_string()))?
        .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let secs = start.elapsed().as_secs_f64();
        metrics.checkpoints.fetch_add(1, Ordering::Relaxed);
        metrics.checkpoint_seconds.set(secs);
        tracing::info!("{}: checkpoint of global_step={step} written to {} in {secs:.3}s", ps.task, written.display());
        self.last_step = step;
        self.last_time = Instant::now();
        Ok(())
    }
}

/// Writes scalars to the TensorBoard event file when there is one; a
/// failure to write is reported once and does not stop training.
struct Summaries {
    writer: Option<EventWriter>,
    last: Option<(Instant, i64)>,
}

impl Summaries {
    fn new(log_dir: Option<&PathBuf>, suffix: &str) -> Self {
        let writer = log_dir.and_then(|dir| match EventWriter::create(dir, suffix) {
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
    fn add(&mut self, step: i64, scalars: &[(&str, f32)]) {
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

    fn close(self) {
        if let Some(w) = self.writer
            && let Err(e) = w.close() {
                tracing::warn!("TensorBoard events: {e}");
            }
    }
}

/// A worker's training loop (the chief's too): between-graph replication
/// against the ps tasks, sync or async. Survives ps restarts (it rejoins
/// and goes on from the ps's step), keeps its lease by heartbeat, and the
/// chief writes checkpoints and TensorBoard summaries.
pub async fn run_worker(
    cluster: &ClusterConfig,
    workload: &mut Workload,
    settings: &TrainSettings,
    credentials: &Credentials,
    status: Arc<TaskStatus>,
    metrics: Arc<TrainingMetrics>,
) -> Result<FinalReport, TrainError> {
    let start = Instant::now();
    let model = workload.model.as_ref();
    let ps = Arc::new(ps_set(cluster, model, settings, credentials)?);
    let task = cluster.task.to_string();
    let chief = cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default();
    let is_chief = cluster.is_chief();
    tracing::info!(
        "{task}: {} training of {} over {} ps task(s){}; bytes per ps {:?}",
        match (settings.sync_replicas, settings.replicas_to_aggregate) {
            (false, _) => "async",
            (true, Aggregate::Auto) => "elastic sync",
            (true, _) => "sync",
        },
        model.name(),
        ps.num_ps(),
        if is_chief { " (chief)" } else { "" },
        ps.placement().bytes_per_ps()
    );
    status.set(TaskState::Waiting, 0, 0, "connecting to the parameter servers");
    if !is_chief {
        status.set(TaskState::Waiting, 0, 0, &format!("waiting for the chief ({chief}) to initialise the variables"));
    }
    let mut params = zeros_like(model);
    let mut pulled = join(&ps, &mut params, model, settings, is_chief, &chief).await?;
    let heartbeat = {
        let ps = ps.clone();
        crate::metrics::every(settings.heartbeat, move || {
            let ps = ps.clone();
            async move { ps.heartbeat().await }
        })
    };
    let _stop_heartbeat = AbortOnDrop(heartbeat);
    status.set(TaskState::Training, 0, pulled.steps[0], "training");

    let train_steps = settings.train_steps as i64;
    let mut checkpointer = if is_chief { Checkpointer::new(&settings.checkpoints, pulled.steps[0]) } else { None };
    let mut summaries = Summaries::new(if is_chief { settings.log_dir.as_ref() } else { None }, ".chief");
    let mut local_steps = 0u64;
    let mut stale = 0u64;
    let mut recoveries = 0u32;
    let mut last_loss = f32::NAN;
    let mut global_step = pulled.steps[0];
    let loop_start = Instant::now();
    loop {
        // Sync: every ps counts its own steps, and with backup workers one
        // ps can still be completing a step that another has completed
        // (each aggregates whichever gradients came first). A worker goes on
        // until every ps reached the last step, pushing only to those that
        // have not: no ps stops an update short, none goes past, and no
        // worker leaves a step that still needs its gradients.
        let reached: Vec<bool> = pulled.steps.iter().map(|&s| s >= train_steps).collect();
        if pulled.done || if settings.sync_replicas { reached.iter().all(|&r| r) } else { reached[0] } {
            break;
        }
        let t0 = Instant::now();
        let batch = workload.train.next_batch();
        let lg = model.loss_and_gradients(&params, &batch);
        last_loss = lg.loss;
        let t1 = Instant::now();
        metrics.compute_seconds.add((t1 - t0).as_secs_f64());
        // Push this step's gradients and pull the next values in one call per
        // ps. Sync: the pull waits until every ps pushed to applied this step
        // (each ps counts its own steps).
        let push_to: Vec<bool> = reached.iter().map(|&r| !(r && settings.sync_replicas)).collect();
        let min_steps: Vec<i64> =
            pulled.steps.iter().zip(&push_to).map(|(s, &pushed)| if settings.sync_replicas && pushed { s + 1 } else { 0 }).collect();
        let stepped = ps.push_pull(&pulled.steps, &push_to, &lg.gradients, &mut params, &min_steps, settings.step_timeout).await;
        let call_time = t1.elapsed();
        let crate::client::Stepped { pushed: replies, pulled: next, first_reply } = match stepped {
            Ok(r) => r,
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                return Err(TrainError::StepTimeout { step: min_steps[0], waited: settings.step_timeout });
            }
            Err(e) if needs_recovery(&e) => {
                recoveries += 1;
                if recoveries > 100 {
                    return Err(TrainError::TooManyRecoveries(recoveries));
                }
                tracing::warn!("{task}: {e}; rejoining the parameter servers");
                pulled = join(&ps, &mut params, model, settings, is_chief, &chief).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // One call does both: until the first reply it is the push (and the
        // barrier's wait, reported apart), then the pull.
        metrics.wait_seconds.add(next.waited.as_secs_f64());
        metrics.push_seconds.add(first_reply.saturating_sub(next.waited).as_secs_f64());
        metrics.pull_seconds.add(call_time.saturating_sub(first_reply).as_secs_f64());
        metrics.bytes_received.fetch_add(next.bytes, Ordering::Relaxed);
        pulled = next;
        local_steps += 1;
        metrics.local_steps.fetch_add(1, Ordering::Relaxed);
        metrics.bytes_sent.fetch_add(lg.gradients.iter().map(|g| g.len() as u64 * 4).sum(), Ordering::Relaxed);
        metrics.last_loss.set(last_loss as f64);
        let done = pulled.done || replies.iter().any(|r| r.done);
        if replies.iter().any(|r| r.stale) {
            stale += 1;
            metrics.stale_pushes.fetch_add(1, Ordering::Relaxed);
        }
        global_step = global_step.max(replies[0].step);
        metrics.global_step.store(global_step.max(0) as u64, Ordering::Relaxed);
        status.set(TaskState::Training, local_steps, global_step, "training");
        if settings.log_every_steps > 0 && local_steps.is_multiple_of(settings.log_every_steps) {
            tracing::info!(
                "{task}: local_step={local_steps} global_step={global_step} loss={last_loss:.4}{}",
                summary_line(model, &params)
            );
            let mut scalars = vec![("loss", last_loss)];
            let summary = model.summary(&params);
            scalars.extend(summary.iter().map(|(k, v)| (k.as_str(), *v as f32)));
            summaries.add(global_step, &scalars);
        }
        if done {
            break;
        }
        // Checkpoints are named by the step of the values just pulled: in
        // sync training every ps holds exactly that step now.
        if let Some(c) = &mut checkpointer {
            let step = pulled.steps[0];
            if !pulled.done && step < train_steps && c.due(step) {
                c.save(&ps, step, &metrics).await?;
            }
        }
    }
    let global_step = global_step.max(pulled.steps[0]);
    let train_secs = loop_start.elapsed().as_secs_f64();
    let eval = workload.eval.as_ref().map(|b| model.evaluate(&params, b));
    if is_chief {
        if let Some(c) = &mut checkpointer
            && global_step > c.last_step {
                c.save(&ps, global_step, &metrics).await?;
            }
        if let Some(m) = &eval {
            let mut scalars = vec![("eval/loss", m.loss)];
            if let Some(a) = m.accuracy {
                scalars.push(("eval/accuracy", a));
            }
            summaries.add(global_step, &scalars);
        }
        ps.shutdown("train_steps reached", global_step).await?;
        tracing::info!("{task}: training done at global_step={global_step}; told every ps to finish");
    } else {
        ps.leave("training done").await;
    }
    summaries.close();
    let mut r = report(&task, "worker", is_chief, model, &params, eval);
    if r.loss.is_none() {
        r.loss = Some(last_loss);
    }
    r.global_step = global_step;
    r.local_steps = local_steps;
    r.elapsed_secs = start.elapsed().as_secs_f64();
    r.steps_per_sec = local_steps as f64 / train_secs.max(1e-9);
    r.stale_gradients_dropped = settings.sync_replicas.then_some(stale);
    status.set(TaskState::Done, local_steps, global_step, "done");
    tracing::info!(
        "{task}: finished: local_steps={local_steps} global_step={global_step} loss={:.4}{}{}",
        r.loss.unwrap_or(f32::NAN),
        r.accuracy.map(|a| format!(" accuracy={a:.4}")).unwrap_or_default(),
        summary_line(model, &params)
    );
    Ok(r)
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The evaluator: pulls the variables whenever the step advanced (at most
/// every `eval_interval`), evaluates on held-out data, logs and writes
/// TensorBoard summaries, and stops when training is over. It only reads,
/// so it never slows training down beyond one pull per interval.
pub async fn run_evaluator(
    cluster: &ClusterConfig,
    workload: &mut Workload,
    settings: &TrainSettings,
    credentials: &Credentials,
    status: Arc<TaskStatus>,
    metrics: Arc<TrainingMetrics>,
) -> Result<FinalReport, TrainError> {
    let start = Instant::now();
    let model = workload.model.as_ref();
    let ps = ps_set(cluster, model, settings, credentials)?;
    let task = cluster.task.to_string();
    let chief = cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default();
    let eval = workload
        .eval
        .take()
        .ok_or_else(|| TrainError::Config("the evaluator needs held-out data".into()))?;
    status.set(TaskState::Waiting, 0, 0, "connecting to the parameter servers");
    ps.handshake(true).await?;
    let mut params = zeros_like(model);
    let mut pulled = wait_for_variables(&ps, &mut params, &chief, settings.init_timeout).await?;
    let mut summaries = Summaries::new(settings.log_dir.as_ref(), ".eval");
    let mut evaluations = 0u64;
    let mut last;
    loop {
        let metrics_now = model.evaluate(&params, &eval);
        evaluations += 1;
        last = metrics_now.clone();
        metrics.local_steps.fetch_add(1, Ordering::Relaxed);
        metrics.global_step.store(pulled.steps[0].max(0) as u64, Ordering::Relaxed);
        metrics.last_loss.set(metrics_now.loss as f64);
        status.set(TaskState::Training, evaluations, pulled.steps[0], "evaluating");
        tracing::info!(
            "{task}: global_step={} eval_loss={:.4}{}{}",
            pulled.steps[0],
            metrics_now.loss,
            metrics_now.accuracy.map(|a| format!(" eval_accuracy={a:.4}")).unwrap_or_default(),
            summary_line(model, &params)
        );
        let mut scalars = vec![("eval/loss", metrics_now.loss)];
        if let Some(a) = metrics_now.accuracy {
            scalars.push(("eval/accuracy", a));
        }
        summaries.add(pulled.steps[0], &scalars);
        if pulled.done {
            break;
        }
        tokio::time::sleep(settings.eval_interval).await;
        // Long poll: returns as soon as the step moved on or training ended.
        let next: Vec<i64> = pulled.steps.iter().map(|s| s + 1).collect();
        match ps.pull(&mut params, &next, false, settings.step_timeout.max(settings.eval_interval)).await {
            Ok(p) => pulled = p,
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => continue,
            Err(e) if needs_recovery(&e) => {
                tracing::warn!("{task}: {e}; waiting for the parameter servers");
                ps.handshake(true).await?;
                pulled = wait_for_variables(&ps, &mut params, &chief, settings.init_timeout).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    summaries.close();
    let mut r = report(&task, "evaluator", false, model, &params, Some(last));
    r.global_step = pulled.steps[0];
    r.local_steps = evaluations;
    r.elapsed_secs = start.elapsed().as_secs_f64();
    status.set(TaskState::Done, evaluations, pulled.steps[0], "done");
    Ok(r)
}

/// The task id of the single-process mode.
pub fn local_task() -> TaskId {
    TaskId::new("local", 0)
}

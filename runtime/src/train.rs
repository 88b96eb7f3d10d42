//! The training loops: single process, worker (and chief), evaluator. The
//! math is in `model` and `optimizer`; this module only sequences pull,
//! compute, push and the chief's duties, and reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use serde::Serialize;
use tonic::Code;

use crate::client::{ClientError, ModelVariable, PsSet};
use crate::cluster::{ClusterConfig, TaskId};
use crate::data::Batch;
use crate::model::{Metrics, Model};
use crate::optimizer::Optimizer;
use crate::placement::{self, PlacementInput};
use crate::proto::{self, TaskState, UpdateMode};
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

/// How training runs; the same for every task of a job.
#[derive(Debug, Clone)]
pub struct TrainSettings {
    pub train_steps: u64,
    pub optimizer: Optimizer,
    pub sync_replicas: bool,
    /// Sync only: gradients per step; `None` means every training task.
    pub replicas_to_aggregate: Option<u32>,
    pub log_every_steps: u64,
    /// How long non-chief workers wait for the chief to initialise variables.
    pub init_timeout: Duration,
    /// How long a ps may stay unreachable before the task gives up.
    pub connect_timeout: Duration,
    /// How long one sync step may take before the task gives up.
    pub step_timeout: Duration,
    pub eval_interval: Duration,
    pub partition_threshold_bytes: usize,
    pub seed: u64,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            train_steps: 1000,
            optimizer: Optimizer::sgd(0.01),
            sync_replicas: false,
            replicas_to_aggregate: None,
            log_every_steps: 100,
            init_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(120),
            step_timeout: Duration::from_secs(300),
            eval_interval: Duration::from_secs(5),
            partition_threshold_bytes: placement::DEFAULT_PARTITION_THRESHOLD_BYTES,
            seed: 1,
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
            TrainError::InitTimeout { .. } | TrainError::StepTimeout { .. } => 138,
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
    let required = settings.replicas_to_aggregate.unwrap_or(total);
    if settings.sync_replicas && (required == 0 || required > total) {
        return Err(TrainError::Config(format!(
            "--replicas_to_aggregate: {required} is not between 1 and the {total} training task(s) of the cluster"
        )));
    }
    Ok(proto::TrainingConfig {
        mode: if settings.sync_replicas { UpdateMode::Sync } else { UpdateMode::Async } as i32,
        optimizer: Some(settings.optimizer.to_proto()),
        replicas_to_aggregate: if settings.sync_replicas { required } else { 0 },
        total_num_replicas: if settings.sync_replicas { total } else { 0 },
    })
}

fn ps_set(cluster: &ClusterConfig, model: &dyn Model, settings: &TrainSettings, token: Option<&str>) -> Result<PsSet, TrainError> {
    let specs = model.variables();
    let inputs: Vec<PlacementInput> = specs.iter().map(|v| PlacementInput { name: v.name.clone(), shape: v.shape.clone() }).collect();
    let ps_addresses = cluster.cluster.addresses("ps");
    let placement = placement::place(&inputs, ps_addresses.len(), settings.partition_threshold_bytes)?;
    let variables = specs.iter().map(|v| ModelVariable { name: v.name.clone(), shape: v.shape.clone() }).collect();
    Ok(PsSet::new(
        cluster.task.clone(),
        &ps_addresses,
        token,
        variables,
        placement,
        training_config(cluster, settings)?,
        settings.connect_timeout,
    )?)
}

/// Waits until the chief has initialised the variables, logging while it
/// waits, and pulls them.
async fn wait_for_variables(ps: &PsSet, params: &mut [ArrayD<f32>], chief: &str, timeout: Duration) -> Result<crate::client::Pulled, TrainError> {
    let start = Instant::now();
    loop {
        match ps.pull(params, &[], true, Duration::from_secs(5)).await {
            Ok(p) => return Ok(p),
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                let waited = start.elapsed();
                if waited >= timeout {
                    return Err(TrainError::InitTimeout { chief: chief.into(), waited });
                }
                tracing::info!("waiting for the chief ({chief}) to initialise the variables ({:.0}s so far)", waited.as_secs_f64());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A worker's training loop (the chief's too): between-graph replication
/// against the ps tasks, sync or async.
pub async fn run_worker(
    cluster: &ClusterConfig,
    workload: &mut Workload,
    settings: &TrainSettings,
    token: Option<&str>,
    status: Arc<TaskStatus>,
) -> Result<FinalReport, TrainError> {
    let start = Instant::now();
    let model = workload.model.as_ref();
    let ps = ps_set(cluster, model, settings, token)?;
    let task = cluster.task.to_string();
    let chief = cluster.cluster.chief().map(|c| c.to_string()).unwrap_or_default();
    let is_chief = cluster.is_chief();
    tracing::info!(
        "{task}: {} training of {} over {} ps task(s){}; placement {:?}",
        if settings.sync_replicas { "sync" } else { "async" },
        model.name(),
        ps.num_ps(),
        if is_chief { " (chief)" } else { "" },
        ps.placement().bytes_per_ps()
    );
    status.set(TaskState::Waiting, 0, 0, "connecting to the parameter servers");
    ps.handshake(false).await?;
    if is_chief {
        let values = crate::model::init_values(&model.variables(), settings.seed);
        let already = ps.init(&values, 0).await?;
        tracing::info!("{task}: {}", if already { "variables were already initialised: resuming" } else { "initialised the variables" });
    } else {
        status.set(TaskState::Waiting, 0, 0, &format!("waiting for the chief ({chief}) to initialise the variables"));
    }
    let mut params = zeros_like(model);
    let mut pulled = wait_for_variables(&ps, &mut params, &chief, settings.init_timeout).await?;
    status.set(TaskState::Training, 0, pulled.steps[0], "training");

    let train_steps = settings.train_steps as i64;
    let mut local_steps = 0u64;
    let mut stale = 0u64;
    let mut last_loss = f32::NAN;
    let mut global_step = pulled.steps[0];
    let loop_start = Instant::now();
    loop {
        if pulled.done || pulled.steps[0] >= train_steps {
            break;
        }
        let batch = workload.train.next_batch();
        let lg = model.loss_and_gradients(&params, &batch);
        last_loss = lg.loss;
        let replies = ps.push(&pulled.steps, &lg.gradients).await?;
        local_steps += 1;
        let done = replies.iter().any(|r| r.done);
        if replies.iter().any(|r| r.stale) {
            stale += 1;
        }
        global_step = global_step.max(replies[0].step);
        status.set(TaskState::Training, local_steps, global_step, "training");
        if settings.log_every_steps > 0 && local_steps % settings.log_every_steps == 0 {
            tracing::info!(
                "{task}: local_step={local_steps} global_step={global_step} loss={last_loss:.4}{}",
                summary_line(model, &params)
            );
        }
        if done {
            break;
        }
        // Sync: wait until every ps applied this step (each ps counts its own steps).
        let min_steps: Vec<i64> = pulled.steps.iter().map(|s| if settings.sync_replicas { s + 1 } else { 0 }).collect();
        pulled = match ps.pull(&mut params, &min_steps, false, settings.step_timeout).await {
            Ok(p) => p,
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => {
                return Err(TrainError::StepTimeout { step: min_steps[0], waited: settings.step_timeout });
            }
            Err(e) => return Err(e.into()),
        };
    }
    let global_step = global_step.max(pulled.steps[0]);
    let train_secs = loop_start.elapsed().as_secs_f64();
    let eval = workload.eval.as_ref().map(|b| model.evaluate(&params, b));
    if is_chief {
        ps.shutdown("train_steps reached", global_step).await?;
        tracing::info!("{task}: training done at global_step={global_step}; told every ps to finish");
    } else {
        ps.leave("training done").await;
    }
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

/// The evaluator: pulls the variables whenever the step advanced (at most
/// every `eval_interval`), evaluates on held-out data, logs, and stops when
/// training is over. It only reads, so it never slows training down beyond
/// one pull per interval.
pub async fn run_evaluator(
    cluster: &ClusterConfig,
    workload: &mut Workload,
    settings: &TrainSettings,
    token: Option<&str>,
    status: Arc<TaskStatus>,
) -> Result<FinalReport, TrainError> {
    let start = Instant::now();
    let model = workload.model.as_ref();
    let ps = ps_set(cluster, model, settings, token)?;
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
    let mut evaluations = 0u64;
    let mut last;
    loop {
        let metrics = model.evaluate(&params, &eval);
        evaluations += 1;
        last = metrics.clone();
        status.set(TaskState::Training, evaluations, pulled.steps[0], "evaluating");
        tracing::info!(
            "{task}: global_step={} eval_loss={:.4}{}{}",
            pulled.steps[0],
            metrics.loss,
            metrics.accuracy.map(|a| format!(" eval_accuracy={a:.4}")).unwrap_or_default(),
            summary_line(model, &params)
        );
        if pulled.done {
            break;
        }
        tokio::time::sleep(settings.eval_interval).await;
        // Long poll: returns as soon as the step moved on or training ended.
        let next: Vec<i64> = pulled.steps.iter().map(|s| s + 1).collect();
        match ps.pull(&mut params, &next, false, settings.step_timeout.max(settings.eval_interval)).await {
            Ok(p) => pulled = p,
            Err(e) if e.code() == Some(Code::DeadlineExceeded) => continue,
            // The ps tasks are gone after the end of training.
            Err(e) if e.code() == Some(Code::Unavailable) && evaluations > 0 => {
                tracing::info!("{task}: the parameter servers are gone; stopping");
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
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

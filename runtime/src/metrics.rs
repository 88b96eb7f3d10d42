//! Prometheus metrics of a task, served on their own port
//! (`--metrics_port`): steps, step time split into compute / push / wait /
//! pull, bytes, stale gradients, live workers, checkpoints. The training
//! loop updates plain atomics; `prometheus-client` encodes them (OpenMetrics
//! text) at each scrape.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::proto;
use crate::ps::ParameterStore;

/// A float kept in an atomic (bits of an f64).
#[derive(Default, Debug)]
pub struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub fn add(&self, v: f64) {
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((f64::from_bits(b) + v).to_bits()));
    }
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Figures a training task (or the evaluator) updates as it goes.
#[derive(Default, Debug)]
pub struct TrainingMetrics {
    pub local_steps: AtomicU64,
    pub global_step: AtomicU64,
    pub compute_seconds: AtomicF64,
    pub push_seconds: AtomicF64,
    /// Time spent waiting at the sync barrier (reported by the ps).
    pub wait_seconds: AtomicF64,
    /// Pull time less the barrier wait.
    pub pull_seconds: AtomicF64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub stale_pushes: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_seconds: AtomicF64,
    pub last_loss: AtomicF64,
}

/// A counter (named without `_total`: the encoder appends it) or a gauge, at a scrape.
fn figure(e: &mut DescriptorEncoder, kind: MetricType, name: &str, help: &str, value: f64) -> Result<(), std::fmt::Error> {
    let metric = e.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(metric),
        _ => ConstGauge::new(value).encode(metric),
    }
}

impl Collector for TrainingMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge};
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        figure(&mut e, Counter, "tfjob_local_steps", "Training steps done by this task.", c(&self.local_steps))?;
        figure(&mut e, Gauge, "tfjob_global_step", "Global step last seen.", c(&self.global_step))?;
        let mut parts = e.encode_descriptor("tfjob_step_seconds", "Time spent in each part of a step.", None, Counter)?;
        for (part, v) in [("compute", &self.compute_seconds), ("push", &self.push_seconds), ("wait", &self.wait_seconds), ("pull", &self.pull_seconds)] {
            ConstCounter::new(v.get()).encode(parts.encode_family(&[("part", part)])?)?;
        }
        figure(&mut e, Counter, "tfjob_bytes_sent", "Tensor bytes sent to the ps tasks.", c(&self.bytes_sent))?;
        figure(&mut e, Counter, "tfjob_bytes_received", "Tensor bytes received from the ps tasks.", c(&self.bytes_received))?;
        figure(&mut e, Counter, "tfjob_stale_pushes", "Pushes dropped as stale (sync backup work).", c(&self.stale_pushes))?;
        figure(&mut e, Counter, "tfjob_checkpoints", "Checkpoints written (chief).", c(&self.checkpoints))?;
        figure(&mut e, Gauge, "tfjob_checkpoint_seconds", "Duration of the last checkpoint.", self.checkpoint_seconds.get())?;
        figure(&mut e, Gauge, "tfjob_loss", "Last training loss.", self.last_loss.get())
    }
}

/// The figures of a ps task, read from its store at each scrape.
pub struct PsMetrics(pub Arc<ParameterStore>);

impl std::fmt::Debug for PsMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PsMetrics")
    }
}

/// One figure of a scrape: kind, name, help, value.
type Figure = (MetricType, &'static str, &'static str, f64);

/// The ps's own figures: its step, traffic, leases.
fn ps_figures(s: &proto::StatsReply) -> Vec<Figure> {
    use MetricType::{Counter, Gauge};
    let variable_bytes: u64 = s.variables.iter().map(|v| v.bytes).sum();
    vec![
        (Gauge, "tfjob_ps_step", "Step of this ps.", s.step as f64),
        (Counter, "tfjob_ps_updates", "Updates applied (async pushes or sync steps).", s.pushes_applied as f64),
        (Counter, "tfjob_ps_bytes_received", "Gradient bytes received.", s.bytes_received as f64),
        (Counter, "tfjob_ps_bytes_sent", "Variable bytes sent.", s.bytes_sent as f64),
        (Counter, "tfjob_ps_stale_gradients_dropped", "Stale gradients dropped (sync).", s.stale_gradients_dropped as f64),
        (Counter, "tfjob_ps_duplicate_gradients_dropped", "Retried or duplicate gradients not applied.", s.duplicate_gradients_dropped as f64),
        (Gauge, "tfjob_ps_workers_live", "Training tasks with a live lease.", s.live_tasks.len() as f64),
        (Gauge, "tfjob_ps_replicas_to_aggregate", "Gradients a sync step needs now.", s.replicas_to_aggregate as f64),
        (Gauge, "tfjob_ps_variable_bytes", "Bytes of variables held.", variable_bytes as f64),
    ]
}

/// The shard dispatcher's figures (ps 0, once a worker asked for a shard),
/// with the plan they are measured against.
fn dispatch_figures(d: &proto::DispatchProgress) -> Vec<Figure> {
    use MetricType::{Counter, Gauge};
    vec![
        (Gauge, "tfjob_ps_epochs_completed", "Epochs whose every shard is done (shard dispatcher).", d.epochs_completed as f64),
        (Counter, "tfjob_ps_examples_trained", "Examples of the shards reported done.", d.examples_trained as f64),
        (Counter, "tfjob_ps_shards_done", "Shards reported done.", d.shards_done as f64),
        (Counter, "tfjob_ps_shards_redone", "Shards handed out again after their worker was lost.", d.shards_redone as f64),
        (Gauge, "tfjob_ps_num_epochs", "Epochs to train (--num_epochs); 0: unbounded.", d.num_epochs as f64),
        (Gauge, "tfjob_ps_examples_per_epoch", "Examples in the training set (one epoch).", d.examples_per_epoch as f64),
    ]
}

/// What the tasks reported by heartbeat, each once known: the figures that
/// show a job's progress without scraping every task.
fn reported_figures(s: &proto::StatsReply) -> Vec<Figure> {
    use MetricType::Gauge;
    let mut figures: Vec<Figure> = Vec::new();
    figures.extend(s.loss.map(|l| (Gauge, "tfjob_ps_loss", "Latest training loss a training task reported.", f64::from(l))));
    if s.train_steps > 0 {
        figures.push((Gauge, "tfjob_ps_train_steps", "Global steps to train (the largest --train_steps reported).", s.train_steps as f64));
    }
    if let Some(e) = &s.evaluation {
        figures.extend([
            (Gauge, "tfjob_ps_eval_step", "Global step of the latest evaluation.", e.step as f64),
            (Gauge, "tfjob_ps_eval_loss", "Loss on held-out data at the latest evaluation.", f64::from(e.loss)),
        ]);
        figures.extend(e.accuracy.map(|a| (Gauge, "tfjob_ps_eval_accuracy", "Accuracy on held-out data at the latest evaluation.", f64::from(a))));
        figures.extend(e.auc.map(|a| (Gauge, "tfjob_ps_eval_auc", "Area under the ROC curve on held-out data at the latest evaluation.", f64::from(a))));
    }
    figures
}

impl Collector for PsMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.stats();
        let mut figures = ps_figures(&s);
        figures.extend(s.dispatch.as_ref().map(dispatch_figures).unwrap_or_default());
        figures.extend(reported_figures(&s));
        for (kind, name, help, value) in figures {
            figure(&mut e, kind, name, help, value)?;
        }
        Ok(())
    }
}

/// The metrics of one task: `collector`'s figures, each labelled `task="<type>:<index>"`.
#[derive(Debug)]
pub struct TaskMetrics(Registry);

impl TaskMetrics {
    pub fn new(task: &str, collector: impl Collector) -> Self {
        let mut registry = Registry::with_labels([(Cow::Borrowed("task"), Cow::Owned(task.to_string()))].into_iter());
        registry.register_collector(Box::new(collector));
        TaskMetrics(registry)
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.0);
        out
    }
}

/// Content type of the OpenMetrics text exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` (and `/healthz`) on `addr` until the returned
/// handle is dropped or aborted.
pub async fn serve(addr: SocketAddr, metrics: Arc<TaskMetrics>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::{Router, routing::get};
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("metrics: cannot listen on {addr}: {e}")))?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([("content-type", CONTENT_TYPE)], metrics.render()) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    }))
}

/// Polls `f` every `period` until the task is aborted (for heartbeats and
/// lease expiry).
pub fn every<F, Fut>(period: Duration, mut f: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            f().await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_format() {
        let m = Arc::new(TrainingMetrics::default());
        m.local_steps.fetch_add(3, Ordering::Relaxed);
        m.push_seconds.add(0.25);
        m.push_seconds.add(0.5);
        let text = TaskMetrics::new("worker:1", m.clone()).render();
        for line in [
            "# TYPE tfjob_local_steps counter",
            "tfjob_local_steps_total{task=\"worker:1\"} 3.0",
            "# TYPE tfjob_step_seconds counter",
            "tfjob_step_seconds_total{task=\"worker:1\",part=\"push\"} 0.75",
            "# TYPE tfjob_global_step gauge",
            "tfjob_global_step{task=\"worker:1\"} 0.0",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
    }

    /// The figures a ps learns from heartbeats and its shard dispatcher
    /// appear once known, and not before.
    #[test]
    fn ps_exposition_shows_the_job_s_progress_once_known() {
        let store = Arc::new(ParameterStore::new(crate::ps::PsConfig::new(0, 1, None)));
        let metrics = TaskMetrics::new("ps:0", PsMetrics(store.clone()));
        let progress = [
            "tfjob_ps_loss",
            "tfjob_ps_train_steps",
            "tfjob_ps_eval_step",
            "tfjob_ps_eval_loss",
            "tfjob_ps_eval_accuracy",
            "tfjob_ps_eval_auc",
            "tfjob_ps_num_epochs",
            "tfjob_ps_examples_per_epoch",
        ];
        let fresh = metrics.render();
        for name in progress {
            assert!(!fresh.contains(name), "{name} before anything was reported:\n{fresh}");
        }
        let worker = crate::cluster::TaskId::new("worker", 0);
        store.heartbeat(&worker, &proto::HeartbeatRequest { loss: Some(0.25), train_steps: 500, ..Default::default() });
        let evaluation = proto::Evaluation { step: 40, loss: 0.5, accuracy: Some(0.75), auc: None };
        store.heartbeat(&crate::cluster::TaskId::new("evaluator", 0), &proto::HeartbeatRequest { evaluation: Some(evaluation), ..Default::default() });
        let plan = proto::DatasetPlan { examples: 25, shard_size: 10, seed: 1, num_epochs: 3 };
        let ask = proto::NextShardRequest { task: Some((&worker).into()), plan: Some(plan), want: true, ..Default::default() };
        store.next_shard(&ask).unwrap();
        let text = metrics.render();
        for line in [
            "tfjob_ps_loss{task=\"ps:0\"} 0.25",
            "tfjob_ps_train_steps{task=\"ps:0\"} 500.0",
            "tfjob_ps_eval_step{task=\"ps:0\"} 40.0",
            "tfjob_ps_eval_loss{task=\"ps:0\"} 0.5",
            "tfjob_ps_eval_accuracy{task=\"ps:0\"} 0.75",
            "tfjob_ps_num_epochs{task=\"ps:0\"} 3.0",
            "tfjob_ps_examples_per_epoch{task=\"ps:0\"} 25.0",
            "tfjob_ps_examples_trained_total{task=\"ps:0\"} 0.0",
        ] {
            assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
        }
        assert!(!text.contains("tfjob_ps_eval_auc"), "no AUC was reported:\n{text}");
        assert!(text.lines().any(|l| l == "tfjob_ps_workers_live{task=\"ps:0\"} 1.0"), "the evaluator holds no lease:\n{text}");
    }
}

//! Prometheus metrics of a task, served on their own port
//! (`--metrics_port`): steps, step time split into compute / push / wait /
//! pull, bytes, stale gradients, live workers, checkpoints.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

/// Appends one metric in the text exposition format.
pub fn write_metric(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

impl TrainingMetrics {
    pub fn render(&self, task: &str) -> String {
        let l = format!("task=\"{task}\"");
        let mut out = String::new();
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        write_metric(&mut out, "tfjob_local_steps_total", "counter", "Training steps done by this task.", &l, c(&self.local_steps));
        write_metric(&mut out, "tfjob_global_step", "gauge", "Global step last seen.", &l, c(&self.global_step));
        let _ = writeln!(out, "# HELP tfjob_step_seconds_total Time spent in each part of a step.");
        let _ = writeln!(out, "# TYPE tfjob_step_seconds_total counter");
        for (part, v) in [("compute", &self.compute_seconds), ("push", &self.push_seconds), ("wait", &self.wait_seconds), ("pull", &self.pull_seconds)] {
            let _ = writeln!(out, "tfjob_step_seconds_total{{{l},part=\"{part}\"}} {}", v.get());
        }
        write_metric(&mut out, "tfjob_bytes_sent_total", "counter", "Tensor bytes sent to the ps tasks.", &l, c(&self.bytes_sent));
        write_metric(&mut out, "tfjob_bytes_received_total", "counter", "Tensor bytes received from the ps tasks.", &l, c(&self.bytes_received));
        write_metric(&mut out, "tfjob_stale_pushes_total", "counter", "Pushes dropped as stale (sync backup work).", &l, c(&self.stale_pushes));
        write_metric(&mut out, "tfjob_checkpoints_total", "counter", "Checkpoints written (chief).", &l, c(&self.checkpoints));
        write_metric(&mut out, "tfjob_checkpoint_seconds", "gauge", "Duration of the last checkpoint.", &l, self.checkpoint_seconds.get());
        write_metric(&mut out, "tfjob_loss", "gauge", "Last training loss.", &l, self.last_loss.get());
        out
    }
}

/// Serves `GET /metrics` (and `/healthz`) on `addr` until the returned
/// handle is dropped or aborted.
pub async fn serve(addr: SocketAddr, render: Arc<dyn Fn() -> String + Send + Sync>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use axum::{Router, routing::get};
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("metrics: cannot listen on {addr}: {e}")))?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let render = render.clone();
                async move { ([("content-type", "text/plain; version=0.0.4")], render()) }
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
        let m = TrainingMetrics::default();
        m.local_steps.fetch_add(3, Ordering::Relaxed);
        m.push_seconds.add(0.25);
        m.push_seconds.add(0.5);
        let text = m.render("worker:1");
        assert!(text.contains("tfjob_local_steps_total{task=\"worker:1\"} 3\n"), "{text}");
        assert!(text.contains("tfjob_step_seconds_total{task=\"worker:1\",part=\"push\"} 0.75\n"), "{text}");
        assert!(text.contains("# TYPE tfjob_step_seconds_total counter\n"));
    }
}

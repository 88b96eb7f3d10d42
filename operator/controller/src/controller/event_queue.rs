//! The queue of the Events reconciles publish, and the one task that writes them in the order
//! queued ([`EventQueue`]), as client-go's event broadcaster does for Kubeflow's controllers.
//! A reconcile does not wait for its Events: they are best-effort (the status is what a job's
//! state is read from), so the pods and status writes a reconcile makes come first, and an Event
//! never holds up the next pod. The queue is bounded; when it is full an Event is dropped with a
//! warning and counted.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tfjob_api::status::EventKind;
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// How many Events may wait for the writer: a 1,000-replica job queues 1,000 pod events in one
/// reconcile, and the writer catches up at the API server's pace.
const QUEUE_CAPACITY: usize = 8192;

/// How long one Event may take to write: kube's client has no read timeout, and one request
/// never answered would stop every Event after it.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// An Event waiting to be written.
pub struct Pending {
    /// The job the event is about.
    pub regarding: ObjectReference,
    /// Normal or Warning.
    pub kind: EventKind,
    /// Why (`SuccessfulCreatePod`, ...).
    pub reason: String,
    /// What happened, for people.
    pub note: String,
    /// The pod the event is about, if any.
    pub related: Option<ObjectReference>,
}

enum Queued {
    Event(Box<Pending>),
    /// Answered once every event queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// Where reconciles queue their Events; one task ([`EventQueue::start`]) writes them.
pub struct EventQueue {
    tx: mpsc::Sender<Queued>,
    metrics: Arc<Metrics>,
    /// Set once an event was dropped (the warning is said once, the count is in the metrics).
    dropped: AtomicBool,
}

impl EventQueue {
    /// A queue and its writer task, which publishes as `reporter` (on the current tokio runtime;
    /// it ends when the queue is dropped).
    pub fn start(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> Self {
        Self::with_capacity(client, reporter, metrics, QUEUE_CAPACITY)
    }

    /// [`start`](Self::start) with room for `capacity` events.
    pub fn with_capacity(client: Client, reporter: Reporter, metrics: Arc<Metrics>, capacity: usize) -> Self {
        Self::with_limits(client, reporter, metrics, capacity, PUBLISH_TIMEOUT)
    }

    /// [`with_capacity`](Self::with_capacity), giving each Event up after `publish_timeout`.
    pub fn with_limits(client: Client, reporter: Reporter, metrics: Arc<Metrics>, capacity: usize, publish_timeout: Duration) -> Self {
        let (tx, rx) = mpsc::channel(capacity);
        let writer = Writer { pod_recorder: Recorder::new(client.clone(), reporter.clone()), client, reporter, metrics: metrics.clone(), publish_timeout };
        tokio::spawn(writer.run(rx));
        EventQueue { tx, metrics, dropped: AtomicBool::new(false) }
    }

    /// Queues an event; drops it (counted) when the queue is full.
    pub fn push(&self, pending: Pending) {
        if self.tx.try_send(Queued::Event(Box::new(pending))).is_err() {
            if !self.dropped.swap(true, Ordering::Relaxed) {
                tracing::warn!("the event queue is full; events are dropped until it drains");
            }
            self.metrics.error("event_dropped");
        }
    }

    /// Waits (at most `timeout`) until every event queued so far is written: at shutdown.
    pub async fn flush(&self, timeout: Duration) {
        let (done_tx, done_rx) = oneshot::channel();
        // One deadline for both waits: a full queue makes the marker itself wait for a slot.
        let flushed = async {
            if self.tx.send(Queued::Flush(done_tx)).await.is_ok() {
                let _ = done_rx.await;
            }
        };
        if tokio::time::timeout(timeout, flushed).await.is_err() {
            tracing::warn!("events not written within {timeout:?} of the shutdown are lost");
        }
    }
}

/// The writer: each event in turn. Events about a pod go through one [`Recorder`], which
/// folds repeats about the same pod into a series; each of the job's own events through a
/// recorder of its own (see [`Writer::publish`]).
struct Writer {
    pod_recorder: Recorder,
    client: Client,
    reporter: Reporter,
    metrics: Arc<Metrics>,
    publish_timeout: Duration,
}

impl Writer {
    async fn run(self, mut rx: mpsc::Receiver<Queued>) {
        while let Some(queued) = rx.recv().await {
            match queued {
                Queued::Event(pending) => self.publish(*pending).await,
                Queued::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn publish(&self, pending: Pending) {
        let Pending { regarding, kind, reason, note, related } = pending;
        let ev = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason,
            note: Some(note),
            action: "Reconcile".to_string(),
            secondary: related,
        };
        // A recorder folds an event into a `series` of the last one with the same type, reason
        // and related object, and keeps that one's note: a second `Scaled` would read as a
        // repeat of the first (`Worker 2 → 4` again instead of `Worker 4 → 1`). The job's own
        // events are each published once (after the status they come with is written), so each
        // is an Event of its own; events about a pod name the pod, and fold only into repeats
        // about that pod.
        let job_recorder;
        let recorder = match &ev.secondary {
            Some(_) => &self.pod_recorder,
            None => {
                job_recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                &job_recorder
            }
        };
        match tokio::time::timeout(self.publish_timeout, recorder.publish(&ev, &regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, reason = %ev.reason, "cannot publish event");
                self.metrics.error("event");
            }
            Err(_) => {
                tracing::warn!(reason = %ev.reason, "cannot publish event: the API server did not answer within {:?}", self.publish_timeout);
                self.metrics.error("event");
            }
        }
    }
}

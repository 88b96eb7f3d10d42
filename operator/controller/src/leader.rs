//! Leader election on a `coordination.k8s.io/v1` Lease: only the replica that holds the lease
//! reconciles; it renews the lease every [`LeaderElector::retry_period`] (client-go's timings: a
//! 15 s lease, renewed every 2 s, given up when not renewed within 10 s), and hands it over when
//! it stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api_errors::{CONFLICT, tolerate};

/// Leader election on a `coordination.k8s.io/v1` Lease.
pub struct LeaderElector {
    /// Lease API (in the operator's namespace).
    pub api: Api<Lease>,
    /// Lease name.
    pub name: String,
    /// This instance.
    pub identity: String,
    /// Lease duration; renewals happen every [`Self::retry_period`].
    pub lease_duration: Duration,
}

impl LeaderElector {
    /// How often the holder renews, and a waiting instance tries to take the lease: 2 s of a
    /// 15 s lease, as client-go's defaults (LeaseDuration 15 s, RetryPeriod 2 s).
    pub fn retry_period(&self) -> Duration {
        self.lease_duration * 2 / 15
    }

    /// How long the holder may go without a renewal before it steps down: two thirds of the
    /// lease (client-go's RenewDeadline, 10 s of 15), so that it has stopped before another
    /// instance may take the lease over.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// Tries once to take or renew the lease. Returns whether this instance holds it.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        match self.api.get_opt(&self.name).await? {
            None => {
                let mut spec = LeaseSpec { acquire_time: Some(MicroTime(now)), lease_transitions: Some(0), ..Default::default() };
                self.hold(&mut spec, now);
                let lease = Lease { metadata: kube::api::ObjectMeta { name: Some(self.name.clone()), ..Default::default() }, spec: Some(spec) };
                Ok(tolerate(self.api.create(&PostParams::default(), &lease).await, &[CONFLICT])?.is_some())
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                let holder = spec.holder_identity.clone().unwrap_or_default();
                if holder != self.identity && !expired(spec, now) && !holder.is_empty() {
                    return Ok(false);
                }
                if holder != self.identity {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.acquire_time = Some(MicroTime(now));
                }
                self.hold(spec, now);
                // replace carries the resourceVersion: a concurrent writer makes this fail (409).
                Ok(tolerate(self.api.replace(&self.name, &PostParams::default(), &lease).await, &[CONFLICT])?.is_some())
            }
        }
    }

    /// Marks `spec` as held by this instance, renewed at `now`.
    fn hold(&self, spec: &mut LeaseSpec, now: Timestamp) {
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(self.lease_duration.as_secs() as i32);
        spec.renew_time = Some(MicroTime(now));
    }

    /// Gives the lease up if this instance holds it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        tolerate(self.api.replace(&self.name, &PostParams::default(), &lease).await, &[CONFLICT])?;
        Ok(())
    }

    /// Waits until this instance holds the lease (API errors are logged and retried).
    pub async fn acquire(&self) {
        loop {
            // kube's client has no read timeout: an attempt never answered is given up.
            match tokio::time::timeout(self.lease_duration, self.try_acquire()).await {
                Ok(Ok(true)) => return,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election"),
                Err(_) => tracing::warn!("leader election: the API server did not answer"),
            }
            tokio::time::sleep(self.retry_period()).await;
        }
    }

    /// Keeps renewing; returns when the lease is lost, or not renewed within the renew deadline
    /// (before another instance may take it over). Renewing every retry period rather than
    /// once a third of the lease leaves a renewal that meets a stalled API server most of the
    /// deadline: a stall of up to ~8 s of a 15 s lease is survived, not ~5 s.
    pub async fn keep(&self) {
        let renew_deadline = self.renew_deadline();
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.retry_period()).await;
            // A renewal the API server never answers (kube's client has no read timeout) must
            // not keep this instance leading after the lease has expired: two leaders would
            // write the same jobs.
            // The lease counts from the renewal's start (its `renewTime`), and so does this.
            let attempt = Instant::now();
            let left = renew_deadline.saturating_sub(attempt.duration_since(last_ok));
            match tokio::time::timeout(left, self.try_acquire()).await {
                Ok(Ok(true)) => last_ok = attempt,
                Ok(Ok(false)) => return,
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew lease"),
                Err(_) => tracing::warn!("cannot renew lease: the API server did not answer"),
            }
            if last_ok.elapsed() >= renew_deadline {
                return;
            }
        }
    }
}

/// How long stepping down waits for the lease's release (the lease expires anyway).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the holder of a lease let it expire (a lease without a renewal time or duration
/// has).
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(t), Some(d)) => now.duration_since(t.0).as_secs_f64() > f64::from(d),
        _ => true,
    }
}

/// The identity of this process in leader election: like client-go, the pod (host) name plus a
/// random suffix, unique per process.
pub fn process_identity() -> String {
    let host = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_else(|_| "tfjob-operator".to_string());
    format!("{host}_{}", &tfjob_api::plan::random_token()[..12])
}

/// The lease held: renewed in a task of its own until it is lost or given up.
pub struct Leadership {
    elector: Arc<LeaderElector>,
    renewals: JoinHandle<()>,
}

impl Leadership {
    /// Starts renewing the lease `elector` holds; the receiver fires when it is lost.
    pub fn keep(elector: LeaderElector) -> (Leadership, oneshot::Receiver<()>) {
        let (lost_tx, lost_rx) = oneshot::channel::<()>();
        let elector = Arc::new(elector);
        let keeper = elector.clone();
        let renewals = tokio::spawn(async move {
            keeper.keep().await;
            let _ = lost_tx.send(());
        });
        (Leadership { elector, renewals }, lost_rx)
    }

    /// Stops renewing and hands the lease over at once instead of letting the next leader wait
    /// for it to expire.
    pub async fn step_down(self) {
        self.renewals.abort();
        match tokio::time::timeout(RELEASE_TIMEOUT, self.elector.release()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot release the lease"),
            Err(_) => tracing::warn!("cannot release the lease: the API server did not answer"),
        }
    }
}

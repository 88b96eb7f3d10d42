//! Start-up of the operator (`tfjob-operator`, and `tfjob operator`): its flags, logging, the
//! check that the CRD is served, the metrics and health server, leader election, and the
//! controller run until SIGTERM or Ctrl-C (or until leadership is lost).

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Controller, Error as ControllerError};
use kube::runtime::reflector::Store;
use tfjob_api::api::{self, TFJob};
use tfjob_api::plan::PlanOptions;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::api_errors::{NOT_FOUND, is_status};
use crate::controller::watch::api_in;
use crate::controller::{Context, build_controller, error_policy, reconcile};
use crate::leader::{LeaderElector, Leadership, process_identity};
use crate::progress::ProgressSettings;

/// Flags of `tfjob operator` (each with an environment fallback).
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// Namespace to watch (all namespaces when unset).
    #[arg(long, env = "TFJOB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Maximum number of jobs reconciled concurrently.
    #[arg(long, env = "TFJOB_CONCURRENCY", default_value_t = 8)]
    pub concurrency: u16,
    /// Seconds after which a reconcile that has not finished is abandoned (an error, retried).
    #[arg(long, env = "TFJOB_RECONCILE_TIMEOUT", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub reconcile_timeout: u64,
    /// Cluster domain appended to replica addresses (e.g. `cluster.local`).
    #[arg(long, env = "TFJOB_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Address of the metrics and health server.
    #[arg(long, env = "TFJOB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Log level (a tracing filter such as `info` or `tfjob_operator=debug`).
    #[arg(long, env = "TFJOB_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: `text` or `json`.
    #[arg(long, env = "TFJOB_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Gang scheduler: `volcano`, `kubernetes` (KEP-4671) or a scheduler-plugins scheduler name
    /// (none when unset).
    #[arg(long, env = "TFJOB_GANG_SCHEDULER")]
    pub gang_scheduler: Option<String>,
    /// Run a job labelled `kueue.x-k8s.io/queue-name` only as far as Kueue admitted it: no pod
    /// while its Workload is not admitted, none beyond the admitted counts (a scale waits for
    /// Kueue to admit the new size). Off: the label is ignored, as Kubeflow's controller does.
    #[arg(long, env = "TFJOB_KUEUE_ADMISSION", default_value_t = true, action = clap::ArgAction::Set)]
    pub kueue_admission: bool,
    /// Run a job labelled `kueue.x-k8s.io/queue-name` as a plain pod group of Kueue's `pod`
    /// integration (for a Kueue whose TFJob integration is off): its pods are created gated and
    /// marked as Kueue's pod webhook would, and Kueue admits them as one group.
    #[arg(long, env = "TFJOB_KUEUE_POD_GROUPS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub kueue_pod_groups: bool,
    /// Give every job a NetworkPolicy: only the job's own pods reach its replicas' ports.
    #[arg(long, env = "TFJOB_NETWORK_POLICY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub network_policy: bool,
    /// Use leader election (a Lease) so that only one replica reconciles.
    #[arg(long, env = "TFJOB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The operator's own namespace: of the leader-election Lease and the TLS seed Secret.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "TFJOB_LEASE_NAME", default_value = "tfjob-operator")]
    pub lease_name: String,
    /// Secret (in the operator's namespace, `POD_NAMESPACE`) holding the seed of every job's
    /// TLS CA ([`crate::seed`]); created at the first start.
    #[arg(long, env = "TFJOB_TLS_SEED_SECRET", default_value = "tfjob-operator-tls-seed")]
    pub tls_seed_secret: String,
    /// Run beside Kubeflow's training-operator: take only the TFJobs whose
    /// `spec.runPolicy.managedBy` is `tfjob-rs.io/operator` (otherwise: every TFJob without
    /// `managedBy`, or with `kubeflow.org/training-operator` or `tfjob-rs.io/operator`).
    #[arg(long, env = "TFJOB_BESIDE_KUBEFLOW", default_value_t = false, action = clap::ArgAction::Set)]
    pub beside_kubeflow: bool,
    /// Seconds between two reads of a running job's progress (ps 0's metrics page, for
    /// `status.trainingProgress` and the throughput autoscaler); 0 turns the reads off.
    #[arg(long, env = "TFJOB_PROGRESS_INTERVAL", default_value_t = 10)]
    pub progress_interval: u64,
    /// Progress reads at once, across all jobs.
    #[arg(long, env = "TFJOB_PROGRESS_CONCURRENCY", default_value_t = 16)]
    pub progress_concurrency: usize,
}

/// Whether log lines get terminal colours: only when stderr is a terminal and `NO_COLOR`
/// (no-color.org) is unset or empty. Under `kubectl logs`, a file or a pipe, plain text.
pub fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_logging(args: &OperatorArgs) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colours = log_colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours);
    let _ = if args.log_format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// Entry point of `tfjob operator`.
pub fn run_operator(args: OperatorArgs) -> ExitCode {
    init_logging(&args);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(operator_main(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors that stop `tfjob operator`.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("cannot connect to Kubernetes: {0}")]
    Connect(#[source] kube::Error),
    /// The CRD is not installed.
    #[error(
        "the TFJob CustomResourceDefinition (tfjobs.kubeflow.org) is not installed in this \
         cluster; install it first: `tfjob crd | kubectl apply --server-side -f -` (or \
         `kubectl apply -f crds/tfjob.yaml`)"
    )]
    CrdMissing,
    /// TFJobs cannot be listed (RBAC, connectivity).
    #[error("cannot list TFJobs: {0}")]
    ListJobs(#[source] kube::Error),
    /// The TLS seed could not be read or created.
    #[error("{0}")]
    Seed(#[from] crate::seed::SeedError),
    /// The metrics/health address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Checks that the TFJob CRD is served.
pub async fn check_crd(client: &Client, namespace: Option<&str>) -> Result<(), OperatorError> {
    let api: Api<TFJob> = api_in(client, namespace);
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, NOT_FOUND) => Err(OperatorError::CrdMissing),
        Err(e) => Err(OperatorError::ListJobs(e)),
    }
}

async fn operator_main(args: OperatorArgs) -> Result<(), OperatorError> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "tfjob operator starting");
    let client = Client::try_default().await.map_err(OperatorError::Connect)?;
    check_crd(&client, args.namespace.as_deref()).await?;
    let tls_seed = crate::seed::load_or_create(&client, &args.lease_namespace, &args.tls_seed_secret).await?;
    let (controller, ctx) = controller_of(&client, &args, tls_seed);
    let ready = Arc::new(AtomicBool::new(false));
    let server = serve_metrics(&args.metrics_addr, &ctx, &ready).await?;
    let stop = Stop::on_signal();
    let (leadership, lost) = match lead(&client, &args, &stop).await {
        Lead::Stopped => {
            server.abort();
            return Ok(());
        }
        Lead::Alone => (None, None),
        Lead::Leader(leadership, lost) => (Some(leadership), Some(lost)),
    };
    ctx.metrics.watch_jobs(controller.store(), ctx.claim);
    ctx.metrics.watch_caches(controller.store(), ctx.caches.pods.clone(), ctx.caches.services.clone());
    let progress = (args.progress_interval > 0).then(|| {
        let settings =
            ProgressSettings { interval: Duration::from_secs(args.progress_interval), concurrency: args.progress_concurrency, timeout: Duration::from_secs(2) };
        AbortOnDrop(tokio::spawn(crate::progress::run(ctx.clone(), controller.store(), settings)))
    });
    let sweep = ctx.kueue_pod_groups.then(|| AbortOnDrop(tokio::spawn(crate::controller::kueue_group::sweep_finalizers(ctx.clone(), Duration::from_secs(10)))));
    let forget = AbortOnDrop(tokio::spawn(forget_gone_jobs(ctx.clone(), controller.store(), Duration::from_secs(60))));
    ready.store(true, Ordering::SeqCst);
    run_controller(controller, ctx.clone(), stop.requested(), lost_leadership(lost)).await;
    ready.store(false, Ordering::SeqCst);
    drop(progress);
    drop(sweep);
    drop(forget);
    ctx.events.flush(Duration::from_secs(5)).await;
    if let Some(leadership) = leadership {
        leadership.step_down().await;
    }
    server.abort();
    tracing::info!("stopped");
    Ok(())
}

/// The controller over the TFJobs the flags select, and the context of its reconciles.
fn controller_of(client: &Client, args: &OperatorArgs, tls_seed: Vec<u8>) -> (Controller<TFJob>, Arc<Context>) {
    let opts = PlanOptions::from_settings(args.cluster_domain.as_deref(), args.gang_scheduler.as_deref(), args.network_policy);
    let (controller, caches) = build_controller(client.clone(), args.namespace.as_deref(), args.concurrency);
    let mut ctx = Context::new(client.clone(), opts, caches);
    ctx.tls_seed = tls_seed;
    ctx.kueue_admission = args.kueue_admission;
    ctx.reconcile_timeout = Duration::from_secs(args.reconcile_timeout);
    ctx.kueue_pod_groups = args.kueue_pod_groups;
    if args.beside_kubeflow {
        ctx.claim = api::Claim::OwnOnly;
        tracing::info!("beside Kubeflow: taking only TFJobs with spec.runPolicy.managedBy: {}", api::MANAGED_BY_TFJOB_RS);
    }
    (controller, Arc::new(ctx))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` (ready while `ready` is set).
async fn serve_metrics(addr: &str, ctx: &Context, ready: &Arc<AtomicBool>) -> Result<JoinHandle<std::io::Result<()>>, OperatorError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| OperatorError::Listen { addr: addr.to_string(), source })?;
    tracing::info!(addr = %addr, "serving /metrics, /healthz, /readyz");
    Ok(tokio::spawn(crate::metrics::serve(listener, ctx.metrics.clone(), ready.clone())))
}

/// Every `period`, drops what the context remembers of jobs no longer in the watch cache (a job
/// deleted while it ran is never reconciled again), so that the operator's memory does not grow
/// with every job it has seen.
async fn forget_gone_jobs(ctx: Arc<Context>, jobs: Store<TFJob>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let live: std::collections::HashSet<String> = jobs.state().iter().filter_map(|j| j.metadata.uid.clone()).collect();
        let gone = ctx.forget_gone(&live);
        if gone > 0 {
            tracing::debug!(entries = gone, "forgot jobs that are gone");
        }
    }
}

/// A task stopped when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Set once SIGTERM or Ctrl-C arrives; any number of tasks wait for it.
struct Stop(watch::Receiver<bool>);

impl Stop {
    fn on_signal() -> Stop {
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutdown requested");
            let _ = stop_tx.send(true);
        });
        Stop(stop_rx)
    }

    /// Completes once the stop was requested.
    fn requested(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }
}

/// What leader election came to.
enum Lead {
    /// No leader election (`--leader-elect=false`).
    Alone,
    /// This process leads; the receiver fires when it loses the lease.
    Leader(Leadership, oneshot::Receiver<()>),
    /// Stopped while waiting for the lease.
    Stopped,
}

/// Waits for the lease (with `--leader-elect`), or for the stop.
async fn lead(client: &Client, args: &OperatorArgs, stop: &Stop) -> Lead {
    if !args.leader_elect {
        return Lead::Alone;
    }
    let elector = LeaderElector {
        api: Api::namespaced(client.clone(), &args.lease_namespace),
        name: args.lease_name.clone(),
        identity: process_identity(),
        lease_duration: Duration::from_secs(15),
    };
    tracing::info!(lease = %args.lease_name, "waiting for leadership");
    tokio::select! {
        _ = elector.acquire() => {},
        _ = stop.requested() => return Lead::Stopped,
    }
    tracing::info!("became leader");
    let (leadership, lost) = Leadership::keep(elector);
    Lead::Leader(leadership, lost)
}

/// Completes when the lease is lost (never without leader election).
async fn lost_leadership(lost: Option<oneshot::Receiver<()>>) {
    match lost {
        Some(rx) => {
            let _ = rx.await;
            tracing::error!("lost leadership; stopping");
        }
        None => futures::future::pending::<()>().await,
    }
}

/// Runs the controller until `stop` completes (then it finishes the reconciles under way) or
/// `lost` does (then it drops them: the lease may be another instance's any moment, and their
/// writes would cross the new leader's).
async fn run_controller(
    controller: Controller<TFJob>,
    ctx: Arc<Context>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
    lost: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let run = controller.graceful_shutdown_on(stop).run(reconcile, error_policy, ctx).for_each(|res| async move {
        match res {
            Ok((obj, _)) => tracing::debug!(job = %obj, "reconciled"),
            // A watch that fails is retried with backoff, and no reconcile sees what it
            // misses meanwhile: worth a warning (client-go's reflectors warn too).
            Err(e @ (ControllerError::QueueError(_) | ControllerError::RunnerError(_))) => tracing::warn!(error = %e, "watch or queue failed; retrying"),
            // Failed reconciles are logged by `error_policy`; a reconcile of a job deleted
            // meanwhile is expected.
            Err(e) => tracing::debug!(error = %e, "controller event"),
        }
    });
    tokio::select! {
        _ = run => {},
        _ = lost => tracing::error!("reconciles under way dropped"),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        let cases: [(bool, Option<&OsStr>, bool); 5] = [
            (true, None, true),
            (true, Some(OsStr::new("")), true),
            (true, Some(OsStr::new("1")), false),
            (false, None, false),
            (false, Some(OsStr::new("")), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(log_colours(terminal, no_color), want, "{terminal} {no_color:?}");
        }
    }
}

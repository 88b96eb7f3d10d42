//! One task of a cluster, from its converted flags to the end of its process:
//! the cluster resolved (`TF_CONFIG` or the classic flags), a ps's store
//! (restored from the latest checkpoint), the background work and the
//! servers started, the role run until it ends or a signal comes, all
//! stopped. Without a cluster, training in this process.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::auth::{Credentials, TlsSource};
use crate::cluster::{self, ClusterConfig, ClusterFlags, ClusterSource, Role};
use crate::exit::{fail, print_report, termination};
use crate::metrics::{PsMetrics, TaskMetrics, TrainingMetrics};
use crate::proto;
use crate::ps::{ParameterStore, PsConfig, PsService};
use crate::server::{self, WorkerService};
use crate::status::TaskStatus;
use crate::storage::Location;
use crate::train::{self, TaskContext, TrainError, TrainSettings};
use crate::workload::{self, WorkloadSpec};

/// The task's server, until it stops.
type ServerHandle = JoinHandle<Result<(), tonic::transport::Error>>;

/// What a task runs with, from its flags. The settings and the workload
/// are checked after the cluster: their errors come second.
pub struct TaskOptions {
    pub cluster: ClusterFlags,
    /// The `TF_CONFIG` environment variable.
    pub tf_config: Option<String>,
    pub settings: Result<TrainSettings, String>,
    pub spec: Result<WorkloadSpec, String>,
    /// The job token (`TFJOB_TOKEN`).
    pub token: Option<String>,
    /// The task's TLS (`--tls_*`), read once the task knows its own address.
    pub tls: Option<TlsSource>,
    /// Where the servers listen (the ports come from the cluster and `--metrics_port`).
    pub bind: IpAddr,
    pub metrics_port: Option<u16>,
    /// A ps: how long a training task's lease lasts (`--lease_secs`, checked
    /// with the settings).
    pub lease_secs: f64,
    /// A ps: how long it waits for the other tasks once training is over.
    pub shutdown_grace: Duration,
}

/// Runs the task, or trains alone when there is no cluster; the process's
/// exit code.
pub async fn run_task(opts: TaskOptions) -> u8 {
    let (cluster, source) = match resolve_cluster(&opts.cluster, opts.tf_config.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let settings = match opts.settings {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let spec = match opts.spec {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let Some(cluster) = cluster else {
        if source.is_none() {
            tracing::info!("no cluster (TF_CONFIG or --ps_hosts/--worker_hosts)");
        }
        return run_single_process(&spec, &settings).await;
    };
    let credentials = match task_credentials(&cluster, opts.token, opts.tls.as_ref()) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    let status = Arc::new(TaskStatus::new(cluster.task.clone()));
    let ctx = TaskContext { cluster, settings, credentials, status, metrics: Arc::new(TrainingMetrics::default()) };
    let ends = Ends { bind: opts.bind, metrics_port: opts.metrics_port, lease_secs: opts.lease_secs, shutdown_grace: opts.shutdown_grace };
    run_cluster_task(&ctx, &spec, &ends).await
}

/// The task's token and TLS: the certificate files read, or its own certificate made for the
/// host of its address.
fn task_credentials(cluster: &ClusterConfig, token: Option<String>, tls: Option<&TlsSource>) -> Result<Credentials, String> {
    let host = cluster.own_address().map(crate::connection::address_host).unwrap_or_default();
    let tls = tls.map(|source| source.load(host)).transpose().map_err(|e| format!("TLS: {e}"))?;
    Ok(Credentials { token, tls })
}

/// The task's addresses and time limits.
struct Ends {
    bind: IpAddr,
    metrics_port: Option<u16>,
    lease_secs: f64,
    shutdown_grace: Duration,
}

/// The cluster this task is part of (none: train alone), and where it was
/// read from; logs it. An error is reported and its exit code returned.
fn resolve_cluster(flags: &ClusterFlags, tf_config: Option<&str>) -> Result<(Option<ClusterConfig>, Option<ClusterSource>), u8> {
    let source = cluster::source(flags, tf_config);
    let cluster = match cluster::resolve(flags, tf_config) {
        Ok(c) => c,
        Err(e) => return Err(fail(2, format_args!("{}{e}", if source == Some(ClusterSource::TfConfig) { "TF_CONFIG: " } else { "" }))),
    };
    if let Some(c) = &cluster {
        let ignored = if c.source == ClusterSource::Flags && tf_config.is_some() { "; TF_CONFIG is set and ignored" } else { "" };
        tracing::info!("{}: cluster from {}{ignored}: {}", c.task, c.source, describe_cluster(&c.cluster));
    }
    // One training task and no ps (a one-replica TFJob run with the classic
    // flags): nothing to share variables with, it trains alone.
    let cluster = cluster.filter(|c| {
        let alone = c.role() == Role::Worker && c.cluster.num_tasks("ps") == 0 && c.cluster.training_tasks().len() == 1;
        if alone {
            tracing::info!("{}: the cluster has no ps task and no other training task: training in this process", c.task);
        }
        !alone
    });
    Ok((cluster, source))
}

/// `ps=[a:1] worker=[b:1,c:1]` (a long job: its first addresses and its size).
fn describe_cluster(spec: &cluster::ClusterSpec) -> String {
    let job = |job: &str| {
        let all = spec.addresses(job);
        match all.len() {
            0..=4 => format!("{job}=[{}]", all.join(",")),
            n => format!("{job}=[{},... {n} tasks]", all[..3].join(",")),
        }
    };
    spec.jobs().map(job).collect::<Vec<_>>().join(" ")
}

/// A task of a cluster: its servers and background work around its role,
/// until the role ends or a signal comes.
async fn run_cluster_task(ctx: &TaskContext, spec: &WorkloadSpec, ends: &Ends) -> u8 {
    let ps = if ctx.cluster.role() == Role::Ps {
        match start_ps(ctx, ends.lease_secs) {
            Ok(store) => Some(store),
            Err((code, e)) => return fail(code, e),
        }
    } else {
        None
    };
    let background = match start_background(ctx, ps.as_ref(), ends).await {
        Ok(b) => b,
        Err(code) => return code,
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = match start_server(ctx, ps.as_ref(), ends.bind, stop_rx).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut background = background;
    if ps.is_some() {
        background.extend(propose_own_layout(ctx));
    }
    let code = run_until_signal(ctx, spec, ps, ends.shutdown_grace).await;
    for h in background {
        h.abort();
    }
    // Graceful: a gRPC reply still being written when the role ended (one telling a worker that
    // training is over) is written first, as tonic's shutdown waits for every connection's
    // streams to end; the tensor channel's replies were waited for in `run_ps`.
    let _ = stop_tx.send(());
    if let Some(handle) = server {
        let _ = tokio::time::timeout(Duration::from_secs(2), handle).await;
    }
    code
}

/// A ps other than ps 0, serving: when the job already trains under
/// another ps set than its `TF_CONFIG`'s (it was started by a scale-up), it
/// proposes its own to ps 0, and the chief moves the state at its next step.
fn propose_own_layout(ctx: &TaskContext) -> Option<JoinHandle<()>> {
    let cluster = &ctx.cluster;
    if cluster.task.index == 0 || cluster.cluster.is_sparse("ps") {
        return None;
    }
    let (task, addresses, credentials, patience) =
        (cluster.task.clone(), cluster.cluster.addresses("ps"), ctx.credentials.clone(), ctx.settings.connect_timeout);
    Some(tokio::spawn(async move {
        match crate::client::mover::propose_if_new(&task, &addresses, &credentials, patience).await {
            Ok(layout) if layout.ps_addresses != addresses => {
                tracing::info!("{task}: the job trains with {} ps task(s); proposed its {} to ps 0", layout.ps_addresses.len(), addresses.len());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("{task}: could not reach ps 0 to compare layouts: {e}"),
        }
    }))
}

/// A ps's store: the tasks it waits for at the end, and the latest complete
/// checkpoint restored when there is one.
fn start_ps(ctx: &TaskContext, lease_secs: f64) -> Result<Arc<ParameterStore>, (u8, String)> {
    let cluster = &ctx.cluster;
    // A ps listed sparsely (Kubeflow's enableDynamicWorker gives a ps only
    // itself) does not know how many ps tasks there are: 0 learns it from
    // the first caller.
    let num_ps = if cluster.cluster.is_sparse("ps") { 0 } else { cluster.cluster.num_tasks("ps") };
    let mut config = PsConfig::new(cluster.task.index as usize, num_ps, cluster.cluster.chief());
    config.lease = Duration::from_secs_f64(lease_secs.max(0.1));
    if num_ps > 0 {
        config.ps_addresses = cluster.cluster.addresses("ps");
    }
    let store = Arc::new(ParameterStore::new(config));
    // The evaluators too: each evaluates the final variables before it leaves.
    let mut expected = cluster.cluster.training_tasks();
    expected.extend(cluster.cluster.tasks("evaluator").into_iter().map(|(i, _)| cluster::TaskId::new("evaluator", i)));
    store.expect(&expected);
    if let Some(dir) = &ctx.settings.checkpoints.directory {
        restore(&store, dir, cluster)?;
    }
    Ok(store)
}

/// Restores a ps from the latest complete checkpoint, if there is one. One
/// written by another number of ps tasks (the job was restarted with more
/// or fewer) is read whole and kept until the first handshake says which
/// pieces this ps holds now.
fn restore(store: &ParameterStore, dir: &Location, cluster: &ClusterConfig) -> Result<(), (u8, String)> {
    use crate::checkpoint;
    // 0 when this ps does not know how many ps tasks there are (a sparse
    // TF_CONFIG): it cuts its part out at the first handshake too.
    let num_ps = store.num_ps();
    // Storage that cannot be reached may come back: a transient exit code.
    let code = |e: &checkpoint::CheckpointError| crate::exit::code::of(e.is_transient(), crate::exit::code::CONFIG);
    let latest = checkpoint::latest_complete(dir).map_err(|e| (code(&e), e.to_string()))?;
    let Some(ckpt) = latest else {
        tracing::info!("{}: no complete checkpoint in {dir}: starting fresh", cluster.task);
        return Ok(());
    };
    // A job whose ps set changed while it trained: the checkpoint's layout,
    // not this task's TF_CONFIG, is the job's.
    let num_ps = match &ckpt.layout {
        Some(layout) if layout_is_the_jobs(layout, &cluster.cluster.addresses("ps")) && (cluster.task.index as usize) < layout.ps_addresses.len() => {
            tracing::info!("{}: the job's layout is version {} ({} ps task(s)), from {}", cluster.task, layout.version, layout.ps_addresses.len(), ckpt.path);
            store.adopt_layout(layout.version, layout.ps_addresses.clone());
            layout.ps_addresses.len()
        }
        _ => num_ps,
    };
    if ckpt.num_ps != num_ps {
        let merged = checkpoint::read_all(&ckpt).map_err(|e| (code(&e), e.to_string()))?;
        let seen = if num_ps == 0 { "an unknown number".to_string() } else { num_ps.to_string() };
        tracing::info!(
            "{}: {} was written by {} ps task(s), this job has {seen}: this ps takes its part of it at the first handshake",
            cluster.task,
            ckpt.path,
            ckpt.num_ps
        );
        let pending = crate::ps::recut::PendingRecut { merged, step: ckpt.global_step, written_by: ckpt.num_ps, path: ckpt.path.to_string() };
        return store.restore_recut(pending).map_err(|e| (2, e.to_string()));
    }
    let data = checkpoint::read_shard(&ckpt, cluster.task.index as usize).map_err(|e| (code(&e), e.to_string()))?;
    let restored = data.variables.len();
    store.restore(data, ckpt.global_step, ckpt.num_ps).map_err(|e| (2, e.to_string()))?;
    tracing::info!("{}: restored {restored} variable(s) from {} (global_step={})", cluster.task, ckpt.path, ckpt.global_step);
    Ok(())
}

/// Whether the job's layout `layout` (from its latest checkpoint) is newer than this task's
/// `TF_CONFIG` (its ps set `ours`) and still the job's: this task restarted with the
/// `TF_CONFIG` it started with after ps tasks were added or removed while the job trained.
/// The layout then names the same ps tasks at a later version, or more of them (ours is a
/// prefix) and those added still answer, or fewer (a prefix of ours) and those removed do not.
/// A job stopped and started again with another number of ps tasks has a `TF_CONFIG` that is
/// the job's: the added ps tasks are gone, or the removed ones run again.
fn layout_is_the_jobs(layout: &crate::checkpoint::LayoutRecord, ours: &[String]) -> bool {
    let all = &layout.ps_addresses;
    let common = ours.len().min(all.len());
    if layout.version <= 1 || ours.is_empty() || all.is_empty() || all[..common] != ours[..common] {
        return false;
    }
    let answers = |a: &String| reachable(a, Duration::from_secs(2));
    match ours.len().cmp(&all.len()) {
        std::cmp::Ordering::Equal => true,
        std::cmp::Ordering::Less => all[common..].iter().all(answers),
        std::cmp::Ordering::Greater => !ours[common..].iter().any(answers),
    }
}

/// A TCP connection to `address` (`host:port`) opens within `timeout`.
fn reachable(address: &str, timeout: Duration) -> bool {
    use std::net::ToSocketAddrs;
    address.to_socket_addrs().ok().and_then(|mut a| a.next()).is_some_and(|a| std::net::TcpStream::connect_timeout(&a, timeout).is_ok())
}

/// A ps's lease expiry, and the metrics server when `--metrics_port` asks.
async fn start_background(ctx: &TaskContext, ps: Option<&Arc<ParameterStore>>, ends: &Ends) -> Result<Vec<JoinHandle<()>>, u8> {
    let mut background = Vec::new();
    if let Some(store) = ps {
        let store = store.clone();
        background.push(crate::metrics::every(Duration::from_millis(200), move || {
            let store = store.clone();
            async move {
                store.expire_leases(std::time::Instant::now());
            }
        }));
    }
    if let Some(port) = ends.metrics_port {
        let task = ctx.cluster.task.to_string();
        let exposition = Arc::new(match ps {
            Some(store) => TaskMetrics::new(&task, PsMetrics(store.clone())),
            None => TaskMetrics::new(&task, ctx.metrics.clone()),
        });
        match crate::metrics::serve(SocketAddr::new(ends.bind, port), exposition).await {
            Ok(h) => background.push(h),
            Err(e) => return Err(fail(3, e)),
        }
    }
    Ok(background)
}

/// The task's gRPC server (and a ps's tensor channel) on its own port, if
/// the cluster gives it one; it stops when `stop` fires.
async fn start_server(ctx: &TaskContext, ps: Option<&Arc<ParameterStore>>, bind: IpAddr, stop: oneshot::Receiver<()>) -> Result<Option<ServerHandle>, u8> {
    let Some(port) = ctx.cluster.own_address().and_then(cluster::port_of) else {
        return Ok(None);
    };
    let worker = WorkerService::new(ctx.status.clone(), None);
    let addr = SocketAddr::new(bind, port);
    let sources = Arc::new(crate::client::mover::GrpcFragmentSource { credentials: ctx.credentials.clone(), patience: ctx.settings.connect_timeout });
    let service = ps.map(|store| PsService::new(store.clone()).with_fragment_source(sources));
    match server::serve(addr, service, worker, &ctx.credentials, async {
        let _ = stop.await;
    })
    .await
    {
        Ok(handle) => {
            let security = match &ctx.credentials.tls {
                Some(tls) => format!("TLS, peers need a certificate of the CA in {}", tls.ca_origin()),
                None => "plaintext".to_string(),
            };
            let token = if ctx.credentials.token.is_some() { ", job token checked" } else { "" };
            tracing::info!("{}: serving on {addr} ({security}{token})", ctx.cluster.task);
            Ok(Some(handle))
        }
        Err(e) => Err(fail(3, e)),
    }
}

/// The role until it ends or a signal comes. A worker stopped on a signal
/// is told to leave, and given the time to say so over the connections it
/// trains on; one whose training is over finishes (its final evaluation and
/// report). A ps stopped once training is over (the job has ended, and
/// `tfjob run` or the operator stops what still runs) reports and exits 0.
async fn run_until_signal(ctx: &TaskContext, spec: &WorkloadSpec, ps: Option<Arc<ParameterStore>>, grace: Duration) -> u8 {
    let (leave_tx, leave_rx) = watch::channel(false);
    let started = Instant::now();
    let role = run_role(ctx, spec, ps.clone(), grace, leave_rx);
    tokio::pin!(role);
    tokio::select! {
        code = &mut role => code,
        code = termination() => match (ctx.cluster.role(), ps) {
            (Role::Worker, _) => {
                tracing::warn!("{}: stopping on signal", ctx.cluster.task);
                let _ = leave_tx.send(true);
                let deadline = grace.max(crate::client::LEAVE_DEADLINE + Duration::from_millis(500));
                tokio::time::timeout(deadline, &mut role).await.unwrap_or(code)
            }
            (Role::Ps, Some(store)) if store.progress().done => {
                tracing::info!("{}: stopped on a signal after training", ctx.cluster.task);
                print_ps_report(&ctx.cluster, &store, started);
                0
            }
            (Role::Ps, Some(store)) if ctx.cluster.task.index > 0 && store.progress().initialized => {
                let code = hand_over(ctx, &store, grace, code).await;
                if code == 0 {
                    print_ps_report(&ctx.cluster, &store, started);
                }
                code
            }
            _ => {
                tracing::warn!("{}: stopping on signal", ctx.cluster.task);
                code
            }
        },
    }
}

/// A ps (not ps 0) stopped on purpose while the job trains: it asks ps 0
/// to let it leave and serves on until the chief has moved its state to the
/// ps tasks that stay (exit 0), or `grace` runs out (exit `code`, as a ps
/// lost: the job recovers from its checkpoint). Only the highest ps tasks
/// can leave; one below a ps that stays waits in vain and says so.
async fn hand_over(ctx: &TaskContext, store: &ParameterStore, grace: Duration, code: u8) -> u8 {
    let task = &ctx.cluster.task;
    if ctx.cluster.cluster.is_sparse("ps") {
        tracing::warn!("{task}: stopping on signal; listed alone (sparse TF_CONFIG), it cannot reach ps 0 to hand its state over");
        return code;
    }
    let ps0 = ctx.cluster.cluster.addresses("ps").first().cloned().unwrap_or_default();
    let reply = match crate::client::mover::ask_to_leave(task, &ps0, &ctx.credentials, Duration::from_secs(5)).await {
        Ok(reply) => reply,
        Err(e) => {
            tracing::warn!("{task}: stopping on signal; could not ask ps 0 to let it leave ({e}): its state is lost");
            return code;
        }
    };
    if task.index as usize >= reply.ps_addresses.len() {
        tracing::info!("{task}: stopped on a signal; it held none of the job's state (not in its layout yet)");
        return 0;
    }
    if reply.proposed.len() > task.index as usize || reply.proposed.is_empty() {
        tracing::warn!("{task}: stopped on a signal; a ps above it stays in the job, so it cannot leave (only the highest can): waiting {grace:?}");
    } else {
        tracing::info!("{task}: stopped on a signal; handing its state over to the {} ps task(s) that stay", reply.proposed.len());
    }
    let start = Instant::now();
    // Short of the grace period: the exit must come before the kill.
    let deadline = grace.saturating_sub(Duration::from_secs(1)).max(Duration::from_secs(1));
    while start.elapsed() < deadline {
        if store.retired() {
            tracing::info!("{task}: handed its state over in {:.2}s; exiting", start.elapsed().as_secs_f64());
            return 0;
        }
        if store.progress().done {
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!("{task}: its state was not moved within {deadline:?}; stopping (the job recovers from its checkpoint)");
    code
}

async fn run_role(ctx: &TaskContext, spec: &WorkloadSpec, store: Option<Arc<ParameterStore>>, grace: Duration, mut leave: watch::Receiver<bool>) -> u8 {
    if ctx.cluster.role() == Role::Ps {
        return run_ps(&ctx.cluster, store.expect("ps store"), &ctx.status, grace).await;
    }
    let mut workload = match workload::build(spec) {
        Ok(w) => w,
        Err(e) => return fail(e.exit_code(), e),
    };
    if ctx.cluster.role() == Role::Evaluator {
        return match train::run_evaluator(ctx, &mut workload).await {
            // Its final line is printed before it tells the chief it is done.
            Ok(_) => 0,
            Err(e) => exit_code(ctx, Err(e)),
        };
    }
    // Resolves once told to leave; never when the sender is gone without a word.
    let told_to_leave = async move {
        if leave.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    exit_code(ctx, crate::worker::run_worker(ctx, &mut workload, told_to_leave).await)
}

/// A worker's or an evaluator's end: its report, or why it stopped. A
/// worker stopped on a signal reports its figures of that moment, so that
/// every task's log ends with its JSON line.
fn exit_code(ctx: &TaskContext, result: Result<train::FinalReport, TrainError>) -> u8 {
    let cluster = &ctx.cluster;
    match result {
        Ok(report) => {
            print_report(&report);
            0
        }
        Err(TrainError::Stopped { ps_heard, ps_total }) => {
            if ps_heard == ps_total {
                tracing::info!("{}: left the job", cluster.task);
            } else {
                tracing::warn!(
                    "{}: stopping; {} of {ps_total} ps task(s) did not hear it leave (gone, or training is over)",
                    cluster.task,
                    ps_total - ps_heard
                );
            }
            print_report(&train::FinalReport::stopped(&cluster.task.to_string(), cluster.is_chief(), &ctx.metrics, crate::process_age()));
            crate::exit::code::TERMINATED
        }
        Err(e) => fail(e.exit_code(), format_args!("{}: {e}", cluster.task)),
    }
}

/// A ps serves until the chief ends training, then waits (up to the grace
/// period) for the other tasks to notice, and exits 0.
async fn run_ps(cluster: &ClusterConfig, store: Arc<ParameterStore>, status: &TaskStatus, grace: Duration) -> u8 {
    let task = &cluster.task;
    status.set(proto::TaskState::Serving, 0, 0, "serving variables");
    let started = Instant::now();
    let mut progress = store.subscribe();
    if progress.wait_for(|p| p.done).await.is_err() {
        return fail(1, "the parameter store closed unexpectedly");
    }
    let step = store.progress().step;
    status.set(proto::TaskState::Done, 0, step, "training is over");
    let deadline = Instant::now() + grace;
    while store.still_telling() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pending = store.pending();
    if !pending.is_empty() {
        tracing::warn!("{task}: exiting after {grace:?} without word from {}", pending.join(", "));
    }
    tracing::info!("{task}: training over at step {}; exiting", store.progress().step);
    print_ps_report(cluster, &store, started);
    0
}

/// A ps's final figures, as one JSON line.
fn print_ps_report(cluster: &ClusterConfig, store: &ParameterStore, started: Instant) {
    let stats = store.stats();
    print_report(&serde_json::json!({
        "task": cluster.task.to_string(),
        "role": "ps",
        "global_step": stats.step,
        "pushes_applied": stats.pushes_applied,
        "stale_gradients_dropped": stats.stale_gradients_dropped,
        "duplicate_gradients_dropped": stats.duplicate_gradients_dropped,
        "bytes_received": stats.bytes_received,
        "bytes_sent": stats.bytes_sent,
        "variables": stats.variables.iter().map(|v| v.name.clone()).collect::<Vec<_>>(),
        "elapsed_secs": started.elapsed().as_secs_f64(),
    }));
}

/// Training in this process, without a cluster.
async fn run_single_process(spec: &WorkloadSpec, settings: &TrainSettings) -> u8 {
    let mut workload = match workload::build(spec) {
        Ok(w) => w,
        Err(e) => return fail(e.exit_code(), e),
    };
    tracing::info!("training {} in this process", workload.model.name());
    let settings = settings.clone();
    let report = tokio::task::spawn_blocking(move || {
        // TensorBoard events of the training loss, as the chief of a cluster writes them.
        let mut summaries = train::Summaries::new(settings.log_dir.as_ref(), ".local");
        let report = train::train_single_process(&mut workload, &settings, |step, loss, model, params| {
            let summary: String = model.summary(params).iter().map(|(k, v)| format!(" {k}={v:.4}")).collect();
            tracing::info!("local: step={step} loss={loss:.4}{summary}");
            summaries.add(step as i64, &[("loss", loss)]);
        });
        summaries.close();
        report
    })
    .await
    .expect("training thread");
    match report {
        Ok(report) => {
            print_report(&report);
            0
        }
        Err(e) => fail(e.exit_code(), format_args!("local: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::LayoutRecord;

    /// A checkpoint's layout is the job's only for a task whose TF_CONFIG is older: the same ps
    /// tasks at a later version, more of them while those added still answer, fewer while
    /// those removed do not.
    #[test]
    fn an_older_tf_config_takes_the_checkpoints_layout() {
        let alive = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let alive = alive.local_addr().unwrap().to_string();
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let layout = |version, a: Vec<String>| LayoutRecord { version, ps_addresses: a };
        let cases = [
            ("grown, the added ps runs", layout(2, s(&["ps0:1", &alive])), s(&["ps0:1"]), true),
            ("grown, then stopped and started with fewer", layout(2, s(&["ps0:1", &dead])), s(&["ps0:1"]), false),
            ("never changed", layout(1, s(&["ps0:1", &alive])), s(&["ps0:1"]), false),
            ("grown and shrunk back: the same ps tasks, a later version", layout(3, s(&["ps0:1", &alive])), s(&["ps0:1", &alive]), true),
            ("shrunk, the removed ps is gone", layout(2, s(&["ps0:1"])), s(&["ps0:1", &dead]), true),
            ("shrunk, then stopped and started with more", layout(2, s(&["ps0:1"])), s(&["ps0:1", &alive]), false),
            ("another ps 0", layout(2, s(&["ps9:1", &alive])), s(&["ps0:1"]), false),
            ("another ps 1", layout(2, s(&["ps0:1", "ps9:1"])), s(&["ps0:1", &dead]), false),
        ];
        for (what, layout, ours, want) in cases {
            assert_eq!(layout_is_the_jobs(&layout, &ours), want, "{what}");
        }
    }
}

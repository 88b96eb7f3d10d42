//! The worker's view of the parameter servers: one gRPC client per ps task,
//! and calls that fan out to all of them concurrently (handshake, init,
//! pull, push, shutdown), splitting and joining variables by the placement.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::try_join_all;
use ndarray::ArrayD;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, IntoRequest, Request, Status};

use crate::auth::{Credentials, TokenAttach};
use crate::channel::ChannelClient;
use crate::cluster::TaskId;
use crate::embedding::EmbeddingPart;
use crate::init::{Init, RowInit};
use crate::lookup::{self, RowsReceiver, TablePart};
use crate::placement::{Placement, Shard};
use crate::proto::{self, RowsPart, TensorPart, parameter_server_client::ParameterServerClient};
use crate::tensor::{self, MAX_MESSAGE_BYTES};

pub mod mover;
pub mod remainder;

pub type PsGrpc = ParameterServerClient<InterceptedService<Channel, TokenAttach>>;

/// Deadline of a call that does not wait on purpose (handshake, push, ...).
pub const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// A request with a deadline: every call inside a job has one.
fn deadline<T>(message: impl IntoRequest<T>, timeout: Duration) -> Request<T> {
    let mut r = message.into_request();
    r.set_timeout(timeout);
    r
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{what} ps:{ps} ({address}): {status}")]
    Rpc { what: &'static str, ps: usize, address: String, status: Status },
    #[error("ps:{ps} ({address}) unreachable for {waited:?}: {status}")]
    Unreachable { ps: usize, address: String, waited: Duration, status: Status },
    #[error("{what} ps:{ps} ({address}) was interrupted: {status}")]
    Interrupted { what: &'static str, ps: usize, address: String, status: Status },
    #[error("{0}")]
    Protocol(String),
    #[error("invalid ps address {address:?}: {reason}")]
    Address { address: String, reason: String },
    /// An async push that a move cut in two: the ps tasks marked in
    /// `applied` had applied it before they froze, the others refused it
    /// (`cause`: the first refusal, "layout changed"). What they refused is
    /// still owed (`remainder::PsSet::push_remainder`).
    #[error("{cause}")]
    CutByMove { applied: Vec<bool>, cause: Box<ClientError> },
}

impl ClientError {
    /// The status code behind the error, if it came from a call.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Rpc { status, .. } | ClientError::Unreachable { status, .. } | ClientError::Interrupted { status, .. } => Some(status.code()),
            ClientError::CutByMove { cause, .. } => cause.code(),
            _ => None,
        }
    }

    /// The job's layout changed under the request (a ps frozen for a move,
    /// or serving a newer layout): ask ps 0 for the current one.
    pub fn is_layout_change(&self) -> bool {
        self.code() == Some(Code::Aborted) && self.to_string().contains("layout changed")
    }
}

/// HTTP/2 settings shared by every client and server of a job. The largest
/// frame a peer may send us: big enough for a whole tensor part (h2's default,
/// 16 KiB, cuts a 318 KB MLP push into 20 frames, each its own write, loopback
/// packet and wake-up on both ends).
pub const H2_MAX_FRAME_BYTES: u32 = 4 << 20;
pub const H2_STREAM_WINDOW_BYTES: u32 = 8 << 20;
pub const H2_CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// Opens a lazily connecting channel to `host:port` with explicit message
/// limits and TCP_NODELAY.
pub fn channel(address: &str, connect_timeout: Duration, credentials: &Credentials) -> Result<Channel, ClientError> {
    let scheme = if credentials.tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| ClientError::Address { address: address.into(), reason: e.to_string() })?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .initial_stream_window_size(Some(H2_STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(H2_CONNECTION_WINDOW_BYTES))
        .max_frame_size(Some(H2_MAX_FRAME_BYTES));
    if let Some(tls) = &credentials.tls {
        let config = tls.client_config(crate::connection::address_host(address)).map_err(|reason| ClientError::Address { address: address.into(), reason })?;
        endpoint = endpoint.tls_config(config).map_err(|e| ClientError::Address { address: address.into(), reason: e.to_string() })?;
    }
    Ok(endpoint.connect_lazy())
}

/// A tensor channel to each ps, over TLS when the job has certificates.
fn channel_clients(addresses: &[String], credentials: &Credentials) -> Result<Vec<ChannelClient>, ClientError> {
    let connector = match &credentials.tls {
        Some(files) => Some(files.channel_config().map_err(ClientError::Protocol)?),
        None => None,
    };
    let client = |a: &String| {
        let plain = ChannelClient::new(a, credentials.token.as_deref(), Duration::from_secs(5));
        match &connector {
            Some(c) => plain.with_tls(c.clone()).map_err(|reason| ClientError::Address { address: a.clone(), reason }),
            None => Ok(plain),
        }
    };
    addresses.iter().map(client).collect()
}

pub fn ps_client(address: &str, credentials: &Credentials, connect_timeout: Duration) -> Result<PsGrpc, ClientError> {
    let attach = TokenAttach::new(credentials.token.as_deref()).map_err(|s| ClientError::Protocol(s.message().to_string()))?;
    Ok(ParameterServerClient::with_interceptor(channel(address, connect_timeout, credentials)?, attach)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Retries while a peer is unreachable (not started yet, restarting), with
/// exponential backoff, up to `patience`; logs while it waits.
pub async fn with_retry<T, F, Fut>(ps: usize, address: &str, what: &'static str, patience: Duration, mut call: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(20);
    let mut last_log = Instant::now();
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(status) if is_transient(&status) => {
                let waited = start.elapsed();
                if waited >= patience {
                    return Err(ClientError::Unreachable { ps, address: address.into(), waited, status });
                }
                if last_log.elapsed() >= Duration::from_secs(5) {
                    tracing::info!("waiting for ps:{ps} at {address} ({:.0}s so far)", waited.as_secs_f64());
                    last_log = Instant::now();
                }
                tokio::time::sleep(delay.min(patience.saturating_sub(waited))).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(status) => {
                return Err(ClientError::Rpc { what, ps, address: address.into(), status });
            }
        }
    }
}

/// For the calls of the training loop: a transient failure may mean the ps
/// restarted (and lost or restored its state), so the loop rejoins instead
/// of blindly retrying.
pub async fn without_retry<T, F, Fut>(ps: usize, address: &str, what: &'static str, call: F) -> Result<T, ClientError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    call().await.map_err(|status| {
        if is_transient(&status) {
            ClientError::Interrupted { what, ps, address: address.into(), status }
        } else {
            ClientError::Rpc { what, ps, address: address.into(), status }
        }
    })
}

/// A peer that is down, restarting, or dropped the connection: worth a
/// retry (pushes carry an id, so a retried push is never applied twice).
pub fn is_transient(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        // Connection resets surface as transport errors with code Unknown.
        Code::Unknown | Code::Internal | Code::Cancelled => {
            status.message().contains("transport error")
                || status.message().contains("connection")
                || std::error::Error::source(status).is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
        }
        _ => false,
    }
}

/// Tells every ps that `task` leaves the job, concurrently, each call bounded
/// by [`LEAVE_DEADLINE`]; errors are ignored (a ps that is gone does not need
/// to know). Returns how many ps tasks heard it.
async fn leave_all(clients: &[PsGrpc], task: &TaskId, reason: &str) -> usize {
    let calls = clients.iter().map(|c| {
        let mut c = c.clone();
        let req = proto::LeaveRequest { task: Some(task.into()), reason: reason.into() };
        async move { c.leave(deadline(req, LEAVE_DEADLINE)).await.is_ok() }
    });
    futures::future::join_all(calls).await.into_iter().filter(|told| *told).count()
}

/// How long a leaving task waits for each ps's answer (a ps that has exited
/// never answers): well inside Kubernetes' default grace period of 30 s, and
/// inside the 3 s the test node agent grants.
pub const LEAVE_DEADLINE: Duration = Duration::from_millis(1500);

/// A variable of the model as the client knows it.
#[derive(Debug, Clone)]
pub struct ModelVariable {
    pub name: String,
    pub shape: Vec<usize>,
    /// A sparse embedding: its rows' initializer and seed (the ps gives
    /// every row its initial value from them).
    pub rows: Option<(Init, u64)>,
}

impl ModelVariable {
    pub fn dense(name: impl Into<String>, shape: Vec<usize>) -> Self {
        ModelVariable { name: name.into(), shape, rows: None }
    }
}

/// The rows of a step's sparse embeddings: per variable of the model, the
/// sorted unique ids whose rows are wanted (or pushed); empty for dense
/// variables. [`NO_ROWS`] for a model without sparse embeddings.
pub type Rows<'a> = &'a [Vec<i64>];

/// No rows at all.
pub const NO_ROWS: Rows<'static> = &[];

/// Which of a step's rows each ps holds: per ps, per partition it holds (in
/// the order of its tables), the positions of that partition's ids in the
/// batch's sorted ids ([`lookup::route_ids`]). Made once for the rows a step
/// pushes and once for those it pulls, and read by every part of the step
/// that needs them.
type RowRoutes = Vec<Vec<Vec<usize>>>;

/// Values pulled from every ps.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// Step of each ps's values.
    pub steps: Vec<i64>,
    pub done: bool,
    /// Longest time a ps waited at the barrier before answering.
    pub waited: Duration,
    /// Tensor bytes received.
    pub bytes: u64,
}

/// Calls PullVariables and collects every reply.
async fn receive_pull(c: &mut PsGrpc, req: proto::PullVariablesRequest, wait: Duration) -> Result<Vec<proto::PullVariablesReply>, Status> {
    let mut stream = c.pull_variables(deadline(req, wait + CALL_DEADLINE)).await?.into_inner();
    let mut replies = Vec::new();
    while let Some(r) = stream.message().await? {
        replies.push(r);
    }
    Ok(replies)
}

/// The push half of one [`PsSet::push_pull`] and the rows it pulls.
#[derive(Debug, Clone, Copy)]
pub struct StepRequest<'a> {
    /// The step of the values pulled from each ps (the push's tag).
    pub steps: &'a [i64],
    /// Which ps tasks to push to.
    pub push_to: &'a [bool],
    pub gradients: &'a [ArrayD<f32>],
    /// The ids of the sparse embeddings' gradient rows.
    pub pushed_rows: Rows<'a>,
    /// The rows to pull after the push (the next batch's).
    pub pulled_rows: Rows<'a>,
    /// A call to the shard dispatcher on ps 0, answered with the step (over
    /// the tensor channel: in the same round trip; over gRPC: after it).
    pub shard_call: Option<&'a proto::NextShardRequest>,
}

/// What every ps replied to one [`PsSet::push_pull`].
#[derive(Debug, Clone)]
pub struct Stepped {
    /// Each ps's reply to the push, in ps order.
    pub pushed: Vec<proto::PushGradientsReply>,
    /// The values pulled after the push.
    pub pulled: Pulled,
    /// When the last ps's first reply arrived (push applied, barrier passed),
    /// from the start of the call.
    pub first_reply: Duration,
    /// The dispatcher's answer to the step's `shard_call` (or why there is
    /// none); `None` when the step had no call.
    pub dispatched: Option<Result<proto::NextShardReply, String>>,
}

/// The parameter servers of a job, seen from one task.
pub struct PsSet {
    pub task: TaskId,
    addresses: Vec<String>,
    clients: Vec<PsGrpc>,
    placement: Placement,
    variables: Vec<ModelVariable>,
    /// For each ps, its shards of dense variables as (variable index, shard).
    shards: Vec<Vec<(usize, Shard)>>,
    /// For each ps, its partitions of sparse embeddings.
    tables: Vec<Vec<TablePart>>,
    pub config: proto::TrainingConfig,
    pub patience: Duration,
    pub part_bytes: usize,
    /// Ids of this task's pushes: microseconds since the epoch at start,
    /// then +1 per push, so they keep increasing across restarts.
    next_push_id: AtomicU64,
    /// The tensor channel to each ps ([`crate::channel`]): pulls and pushes
    /// go there instead of gRPC when `use_channel`.
    channels: Vec<ChannelClient>,
    use_channel: bool,
    /// The layout version the placement is for: every push and pull says it.
    layout_version: u64,
    /// To reach ps tasks outside this set (a move's).
    credentials: Credentials,
}

/// What one ps answered on the tensor channel.
struct ChannelAnswer {
    push: Option<proto::PushGradientsReply>,
    step: i64,
    done: bool,
    waited: Duration,
    bytes: u64,
    first_reply: Duration,
    /// The rows pulled: per partition of the ps (in order), its pieces.
    rows: Vec<Vec<RowsPart>>,
    /// The shard dispatcher's answer (ps 0, when the request had a call).
    dispatched: Option<Result<proto::NextShardReply, String>>,
}

/// The pull half of a tensor channel request: destinations, the rows
/// wanted, the step to wait for on each ps, whether to wait for
/// initialisation, how long.
struct ChannelPull<'a> {
    params: &'a mut [ArrayD<f32>],
    rows: Rows<'a>,
    min_steps: &'a [i64],
    wait_initialized: bool,
    wait: Duration,
}

/// The push half: the step of each ps's values, which ps to push to, the
/// gradients (and the ids of sparse embeddings' rows), the push id.
#[derive(Clone, Copy)]
struct ChannelPush<'a> {
    steps: &'a [i64],
    push_to: &'a [bool],
    gradients: &'a [ArrayD<f32>],
    rows: Rows<'a>,
    push_id: u64,
    /// For ps 0: a call to its shard dispatcher.
    shard_call: Option<&'a proto::NextShardRequest>,
}

/// A pull from ps `ps` must bring every element of each of its shards
/// (`covered[k]`: elements received for `shards[k]`).
/// Each ps's answer to the push of a step on the tensor channel; a ps only
/// pulled from answers as over gRPC.
fn pushed_on_channel(answers: &[ChannelAnswer], push_to: &[bool]) -> Result<Vec<proto::PushGradientsReply>, ClientError> {
    let mut pushed = Vec::with_capacity(answers.len());
    for (ps, a) in answers.iter().enumerate() {
        pushed.push(match (push_to[ps], a.push) {
            (true, Some(p)) => p,
            (true, None) => {
                return Err(ClientError::Protocol(format!("ps:{ps}: the reply says nothing of the push")));
            }
            (false, _) => proto::PushGradientsReply { accepted: false, stale: false, step: a.step, done: a.done },
        });
    }
    Ok(pushed)
}

/// A push's raw parts and rows for one ps on the tensor channel.
type ChannelPushContents<'a> = (Vec<(proto::RawTensorPart, &'a [f32])>, Vec<(proto::RawRowsPart, Vec<u8>)>);

/// Where a part ps `ps` sent lands: the index of its shard among `shards`
/// (sorted by stored name) and its element range, checked.
fn locate_part(ps: usize, shards: &[(usize, Shard)], p: &proto::RawTensorPart) -> Result<(usize, Range<usize>), String> {
    let k = shards.binary_search_by(|(_, s)| s.stored_name.as_str().cmp(&p.name)).map_err(|_| format!("ps:{ps} sent unknown variable {:?}", p.name))?;
    let header = tensor::PartHeader {
        name: &p.name,
        dtype: p.dtype,
        shape: &p.shape,
        offset: p.offset,
        content_len: usize::try_from(p.content_length).unwrap_or(usize::MAX),
    };
    let range = tensor::check_part_header(&header, &shards[k].1.shape).map_err(|e| format!("ps:{ps}: {e}"))?;
    Ok((k, range))
}

/// One ps's reply on the tensor channel as an answer: every dense shard
/// covered when it was pulled (unless training ended first), its rows.
fn channel_answer(
    ps: usize,
    shards: &[(usize, Shard)],
    reply: proto::TensorChannelReply,
    row_bytes: Vec<bytes::Bytes>,
    first_reply: Duration,
    wants_pull: bool,
) -> Result<ChannelAnswer, ClientError> {
    let mut covered = vec![0usize; shards.len()];
    let mut bytes = 0;
    for p in &reply.parts {
        let k = shards.binary_search_by(|(_, s)| s.stored_name.as_str().cmp(&p.name)).expect("located above");
        covered[k] += p.content_length as usize / 4;
        bytes += p.content_length;
    }
    if wants_pull && !(reply.parts.is_empty() && reply.done) {
        check_covered(ps, shards, &covered)?;
    }
    let rows = reply.rows.iter().zip(row_bytes).map(|(h, content)| RowsPart { name: h.name.clone(), count: h.count, content }).collect::<Vec<_>>();
    bytes += rows.iter().map(|r| r.content.len() as u64).sum::<u64>();
    let dispatched = match reply.next_shard {
        Some(answer) => Some(Ok(answer)),
        None if !reply.next_shard_error.is_empty() => Some(Err(reply.next_shard_error)),
        None => None,
    };
    Ok(ChannelAnswer {
        push: reply.push,
        step: reply.step,
        done: reply.done,
        waited: Duration::from_micros(reply.waited_micros),
        bytes,
        first_reply,
        rows: rows.into_iter().map(|r| vec![r]).collect(),
        dispatched,
    })
}

fn check_covered(ps: usize, shards: &[(usize, Shard)], covered: &[usize]) -> Result<(), ClientError> {
    for ((_, s), &got) in shards.iter().zip(covered) {
        if got != s.num_elements() {
            return Err(ClientError::Protocol(format!("ps:{ps} sent {got} of the {} elements of {:?}", s.num_elements(), s.stored_name)));
        }
    }
    Ok(())
}

/// Cuts the variables into the slices each ps's shards cover: for ps `p`,
/// one slice per entry of `shards[p]`, in that order. `ranges[p][k]` is the
/// element range of that shard in variable `shards_var[p][k]`. The ranges of
/// one variable must not overlap (the placement's shards never do).
fn shard_slices<'a>(params: &'a mut [ArrayD<f32>], shard_vars: &[Vec<(usize, std::ops::Range<usize>)>]) -> Vec<Vec<&'a mut [f32]>> {
    let mut out: Vec<Vec<Option<&'a mut [f32]>>> = shard_vars.iter().map(|l| l.iter().map(|_| None).collect()).collect();
    let mut by_var: Vec<Vec<(usize, usize, std::ops::Range<usize>)>> = vec![Vec::new(); params.len()];
    for (ps, list) in shard_vars.iter().enumerate() {
        for (k, (vi, range)) in list.iter().enumerate() {
            by_var[*vi].push((ps, k, range.clone()));
        }
    }
    for (vi, p) in params.iter_mut().enumerate() {
        let mut rest: &'a mut [f32] = p.as_slice_mut().expect("standard layout");
        let mut consumed = 0;
        by_var[vi].sort_by_key(|(_, _, r)| r.start);
        for (ps, k, r) in std::mem::take(&mut by_var[vi]) {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(r.start - consumed);
            let (mine, tail) = tail.split_at_mut(r.len());
            out[ps][k] = Some(mine);
            rest = tail;
            consumed = r.end;
        }
    }
    out.into_iter().map(|l| l.into_iter().map(|s| s.expect("every shard has its slice")).collect()).collect()
}

impl PsSet {
    pub fn new(
        task: TaskId,
        addresses: &[String],
        credentials: &Credentials,
        variables: Vec<ModelVariable>,
        placement: Placement,
        config: proto::TrainingConfig,
        patience: Duration,
    ) -> Result<Self, ClientError> {
        let clients = addresses.iter().map(|a| ps_client(a, credentials, Duration::from_secs(5))).collect::<Result<Vec<_>, _>>()?;
        let mut shards = vec![Vec::new(); addresses.len()];
        let mut tables = vec![Vec::new(); addresses.len()];
        for (vi, v) in variables.iter().enumerate() {
            for s in &placement.variables[&v.name] {
                match s.partition {
                    Some(partition) => tables[s.ps].push(TablePart { var: vi, stored_name: s.stored_name.clone(), partition, dim: s.shape[1] }),
                    None => shards[s.ps].push((vi, s.clone())),
                }
            }
        }
        for list in &mut shards {
            list.sort_by(|a, b| a.1.stored_name.cmp(&b.1.stored_name));
        }
        for list in &mut tables {
            list.sort_by(|a: &TablePart, b| a.stored_name.cmp(&b.stored_name));
        }
        Ok(PsSet {
            task,
            addresses: addresses.to_vec(),
            clients,
            placement,
            variables,
            shards,
            tables,
            config,
            patience,
            part_bytes: tensor::DEFAULT_PART_BYTES,
            next_push_id: AtomicU64::new(SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64)),
            channels: channel_clients(addresses, credentials)?,
            use_channel: true,
            layout_version: 1,
            credentials: credentials.clone(),
        })
    }

    /// The placement is the one of layout `version` (ps 0 told it).
    pub fn with_layout_version(mut self, version: u64) -> Self {
        self.layout_version = version;
        self
    }

    pub fn layout_version(&self) -> u64 {
        self.layout_version
    }

    /// Pulls and pushes over the tensor channel (the default, with or
    /// without TLS) or over gRPC.
    pub fn set_tensor_channel(&mut self, on: bool) {
        self.use_channel = on;
    }

    pub fn uses_tensor_channel(&self) -> bool {
        self.use_channel
    }

    /// One request per ps on the tensor channel, concurrently: the push
    /// (to the ps it names) and the pull, either or both. Each ps's dense
    /// values are read straight into `pull.params`, its rows written there
    /// once every ps answered.
    async fn on_channel(&self, what: &'static str, push: Option<ChannelPush<'_>>, pull: Option<ChannelPull<'_>>) -> Result<Vec<ChannelAnswer>, ClientError> {
        let start = Instant::now();
        let wants_pull = pull.is_some();
        let (mut params, pull_rows, pull_args) = match pull {
            Some(p) => (Some(p.params), p.rows, Some((p.min_steps, p.wait_initialized, p.wait))),
            None => (None, NO_ROWS, None),
        };
        let pull_routes = self.row_routes(pull_rows);
        let push_routes = push.map(|p| self.row_routes(p.rows)).unwrap_or_default();
        let mut rows_of = params.as_deref_mut().map(|params| {
            Self::shape_rows(params, &self.variables, pull_rows);
            self.take_sparse(params)
        });
        let destinations = match params.as_deref_mut() {
            Some(params) => {
                let shard_vars: Vec<Vec<_>> = self.shards.iter().map(|l| l.iter().map(|(vi, s)| (*vi, self.element_range(*vi, s))).collect()).collect();
                shard_slices(params, &shard_vars)
            }
            None => (0..self.num_ps()).map(|_| Vec::new()).collect(),
        };
        let calls = destinations.into_iter().enumerate().map(|(ps, mut destinations)| {
            let push_here = push.filter(|p| p.push_to[ps]);
            let request = proto::TensorChannelRequest {
                push: push_here.map(|p| proto::PushGradientsRequest {
                    task: self.task_proto(),
                    step: p.steps[ps],
                    push_id: p.push_id,
                    layout_version: self.layout_version,
                    ..Default::default()
                }),
                push_parts: Vec::new(),
                pull: pull_args.map(|(min_steps, wait_initialized, wait)| proto::PullVariablesRequest {
                    rows: self.rows_requests(ps, pull_rows, &pull_routes[ps]),
                    ..self.pull_request(min_steps.get(ps).copied().unwrap_or(0), wait_initialized, wait)
                }),
                push_rows: Vec::new(),
                next_shard: push.and_then(|p| p.shard_call).filter(|_| ps == 0).cloned(),
            };
            let (contents, row_contents) = push_here.map(|p| self.channel_push_contents(ps, p, &push_routes[ps])).unwrap_or_default();
            let timeout = pull_args.map_or(CALL_DEADLINE, |(_, _, wait)| wait + CALL_DEADLINE);
            let shards = &self.shards[ps];
            let locate = move |p: &proto::RawTensorPart| locate_part(ps, shards, p);
            let (channel, address) = (&self.channels[ps], &self.addresses[ps]);
            async move {
                let (reply, arrived, row_bytes) =
                    without_retry(ps, address, what, || channel.exchange(request, contents, row_contents, &mut destinations, &locate, timeout)).await?;
                channel_answer(ps, shards, reply, row_bytes, arrived.saturating_duration_since(start), wants_pull)
            }
        });
        let answers = self.join_step(calls, |a: &ChannelAnswer| a.push.as_ref().is_some_and(|p| p.accepted)).await;
        if let (Some(params), Some(rows_of)) = (params, rows_of.as_mut()) {
            self.put_rows(params, pull_rows, &pull_routes, answers.as_deref().unwrap_or_default(), rows_of)?;
        }
        answers
    }

    /// What a push sends ps `ps` on the tensor channel: the gradients of
    /// its dense shards as raw parts (borrowed), its partitions' rows
    /// (`routes`: the positions of the rows it holds, per partition).
    fn channel_push_contents<'a>(&self, ps: usize, p: ChannelPush<'a>, routes: &[Vec<usize>]) -> ChannelPushContents<'a> {
        let mut contents = Vec::new();
        for (vi, s) in &self.shards[ps] {
            let all = p.gradients[*vi].as_slice().expect("standard layout");
            let values = &all[self.element_range(*vi, s)];
            contents.extend(crate::channel::raw_parts(&s.stored_name, &tensor::wire_shape(&s.shape), values, self.part_bytes));
        }
        let mut row_contents = Vec::new();
        for (t, positions) in self.tables[ps].iter().zip(routes) {
            let ids = &p.rows[t.var];
            let content = lookup::push_content(ids, p.gradients[t.var].as_slice().expect("standard layout"), t.dim, positions);
            let header = proto::RawRowsPart { name: t.stored_name.clone(), count: positions.len() as u64, content_length: content.len() as u64 };
            row_contents.push((header, content));
        }
        (contents, row_contents)
    }

    /// Writes the rows every ps answered into the sparse embeddings'
    /// parameters; they go back into `params` whatever happened (the
    /// shapes stay right).
    fn put_rows(
        &self,
        params: &mut [ArrayD<f32>],
        rows: Rows<'_>,
        routes: &RowRoutes,
        answers: &[ChannelAnswer],
        rows_of: &mut [ArrayD<f32>],
    ) -> Result<(), ClientError> {
        let taken = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| !(a.rows.is_empty() && a.done))
            .try_for_each(|(ps, a)| self.take_rows(ps, rows, &routes[ps], &a.rows, rows_of));
        for (vi, v) in self.variables.iter().enumerate() {
            if v.rows.is_some() {
                params[vi] = std::mem::replace(&mut rows_of[vi], ArrayD::zeros(vec![0]));
            }
        }
        taken
    }

    /// Resizes each sparse embedding's parameter to the rows wanted.
    fn shape_rows(params: &mut [ArrayD<f32>], variables: &[ModelVariable], rows: Rows<'_>) {
        for (vi, v) in variables.iter().enumerate() {
            if v.rows.is_some() {
                let want = [rows.get(vi).map_or(0, Vec::len), v.shape[1]];
                if params[vi].shape() != want {
                    params[vi] = ArrayD::zeros(want.to_vec());
                }
            }
        }
    }

    /// Takes the sparse embeddings' rows out of `params` (left empty there,
    /// so that they are no dense destination), by variable index.
    fn take_sparse(&self, params: &mut [ArrayD<f32>]) -> Vec<ArrayD<f32>> {
        self.variables
            .iter()
            .enumerate()
            .map(|(vi, v)| match v.rows {
                Some(_) => std::mem::replace(&mut params[vi], ArrayD::zeros(vec![0, v.shape[1]])),
                None => ArrayD::zeros(vec![0]),
            })
            .collect()
    }

    /// Per ps, per partition it holds, the positions of the rows `rows`
    /// that are in it ([`RowRoutes`]): each id's owner computed once.
    fn row_routes(&self, rows: Rows<'_>) -> RowRoutes {
        let mut routes: RowRoutes = self.tables.iter().map(|tables| vec![Vec::new(); tables.len()]).collect();
        if rows.is_empty() {
            return routes;
        }
        let mut by_variable: Vec<Option<Vec<Vec<usize>>>> = vec![None; rows.len()];
        for (ps, tables) in self.tables.iter().enumerate() {
            for (k, t) in tables.iter().enumerate() {
                let routed = by_variable[t.var].get_or_insert_with(|| lookup::route_ids(&t.partition, &rows[t.var]));
                // Each partition is on one ps: its positions are taken, not copied.
                routes[ps][k] = routed.get_mut(t.partition.index as usize).map(std::mem::take).unwrap_or_default();
            }
        }
        routes
    }

    /// The rows to ask ps `ps` for (`routes`: the positions of those it
    /// holds, per partition).
    fn rows_requests(&self, ps: usize, rows: Rows<'_>, routes: &[Vec<usize>]) -> Vec<proto::RowsRequest> {
        if rows.is_empty() {
            return Vec::new();
        }
        self.tables[ps]
            .iter()
            .zip(routes)
            .map(|(t, positions)| proto::RowsRequest { name: t.stored_name.clone(), ids: lookup::ids_at(&rows[t.var], positions).into() })
            .collect()
    }

    /// Writes the rows ps `ps` sent (per partition, its pieces in order)
    /// where the batch's order puts them.
    fn take_rows(&self, ps: usize, rows: Rows<'_>, routes: &[Vec<usize>], pieces: &[Vec<RowsPart>], dst: &mut [ArrayD<f32>]) -> Result<(), ClientError> {
        if rows.is_empty() {
            return Ok(());
        }
        let protocol = |e: String| ClientError::Protocol(format!("ps:{ps}: {e}"));
        if pieces.len() != self.tables[ps].len() {
            return Err(protocol(format!("rows of {} partition(s) came, {} were asked for", pieces.len(), self.tables[ps].len())));
        }
        for ((t, pieces), positions) in self.tables[ps].iter().zip(pieces).zip(routes) {
            let ids = &rows[t.var];
            let mut receiver = RowsReceiver::new(&t.stored_name, t.dim, ids, positions);
            let out = dst[t.var].as_slice_mut().expect("standard layout");
            for piece in pieces {
                if piece.name != t.stored_name {
                    return Err(protocol(format!("rows of {:?} came where {:?} was asked for", piece.name, t.stored_name)));
                }
                receiver.take(piece.count, &piece.content, out).map_err(protocol)?;
            }
            receiver.finish().map_err(protocol)?;
        }
        Ok(())
    }

    fn pulled_from(answers: &[ChannelAnswer]) -> Pulled {
        Pulled {
            steps: answers.iter().map(|a| a.step).collect(),
            done: answers.iter().any(|a| a.done),
            waited: answers.iter().map(|a| a.waited).max().unwrap_or_default(),
            bytes: answers.iter().map(|a| a.bytes).sum(),
        }
    }

    pub fn num_ps(&self) -> usize {
        self.clients.len()
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    fn task_proto(&self) -> Option<proto::TaskId> {
        Some((&self.task).into())
    }

    /// Elements of variable `vi` covered by a shard (rows are contiguous in
    /// row-major order).
    fn element_range(&self, vi: usize, shard: &Shard) -> std::ops::Range<usize> {
        let row: usize = self.variables[vi].shape.iter().skip(1).product();
        shard.rows.start * row..shard.rows.end * row
    }

    /// The variables ps `ps` holds as this task sees them: its shards of
    /// dense variables, then its embedding partitions.
    fn specs_on(&self, ps: usize) -> (Vec<proto::VariableSpec>, Vec<proto::VariableSpec>) {
        let dense = self.shards[ps]
            .iter()
            .map(|(_, s)| proto::VariableSpec {
                name: s.stored_name.clone(),
                dtype: proto::DataType::DtFloat as i32,
                shape: tensor::wire_shape(&s.shape),
                embedding: None,
            })
            .collect();
        let tables = self.tables[ps]
            .iter()
            .map(|t| {
                let v = &self.variables[t.var];
                let (init, seed) = v.rows.clone().expect("a sparse embedding");
                let p = t.partition;
                let part = EmbeddingPart {
                    variable: v.name.clone(),
                    rows: p.rows,
                    dim: t.dim,
                    strategy: p.strategy,
                    partition: p.index,
                    num_partitions: p.count,
                    init: RowInit::new(&v.name, init, seed),
                };
                proto::VariableSpec {
                    name: t.stored_name.clone(),
                    dtype: proto::DataType::DtFloat as i32,
                    shape: vec![part.partition_rows() as i64, t.dim as i64],
                    embedding: Some(part.to_proto()),
                }
            })
            .collect();
        (dense, tables)
    }

    /// Where each dense piece of ps `ps` sits in its variable.
    fn dense_pieces_on(&self, ps: usize) -> Vec<proto::DensePiece> {
        self.shards[ps]
            .iter()
            .map(|(var, s)| proto::DensePiece {
                name: s.stored_name.clone(),
                variable: s.variable.clone(),
                row_offset: s.rows.start as u64,
                variable_rows: self.variables[*var].shape.first().map_or(1, |&r| r as u64),
            })
            .collect()
    }

    /// Presents this task's view to every ps. `observer` for evaluators.
    pub async fn handshake(&self, observer: bool) -> Result<Vec<proto::HandshakeReply>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let (mut variables, tables) = self.specs_on(ps);
            variables.extend(tables);
            let req = proto::HandshakeRequest {
                task: self.task_proto(),
                config: (!observer).then_some(self.config),
                variables,
                placement_fingerprint: self.placement.fingerprint(),
                num_ps: self.num_ps() as u32,
                observer,
                dense_pieces: self.dense_pieces_on(ps),
            };
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "handshake with", self.patience, move || {
                let mut c = client.clone();
                let req = req.clone();
                async move { c.handshake(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await
    }

    /// Sends the initial values of every variable to its ps (chief only):
    /// the dense ones' values, the embedding partitions' descriptions (their
    /// rows start from their initializer on the ps). Returns true when some
    /// ps was already initialised (a restarted chief).
    pub async fn init(&self, values: &[ArrayD<f32>], step: i64) -> Result<bool, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let mut messages = vec![proto::InitVariablesRequest {
                task: self.task_proto(),
                config: Some(self.config),
                placement_fingerprint: self.placement.fingerprint(),
                part: None,
                step,
                embeddings: self.specs_on(ps).1,
            }];
            for (vi, s) in &self.shards[ps] {
                let all = values[*vi].as_slice().expect("standard layout");
                let parts = tensor::encode_parts(&s.stored_name, &tensor::wire_shape(&s.shape), &all[self.element_range(*vi, s)], self.part_bytes);
                messages.extend(parts.into_iter().map(|p| proto::InitVariablesRequest { part: Some(p), ..Default::default() }));
            }
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "initialise", self.patience, move || {
                let mut c = client.clone();
                let stream = tokio_stream::iter(messages.clone());
                async move { c.init_variables(deadline(stream, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        let replies = try_join_all(calls).await?;
        Ok(replies.iter().any(|r| r.already_initialized))
    }

    fn pull_request(&self, min_step: i64, wait_initialized: bool, wait: Duration) -> proto::PullVariablesRequest {
        proto::PullVariablesRequest {
            task: self.task_proto(),
            names: vec![],
            min_step,
            wait_initialized,
            wait_timeout_ms: wait.as_millis().min(u32::MAX as u128) as u32,
            rows: vec![],
            layout_version: self.layout_version,
        }
    }

    /// Pulls every dense variable from every ps into `params` (which must
    /// have the variables' shapes), and the rows `rows` of the sparse
    /// embeddings (their parameters are resized to them), waiting until ps
    /// `i` reaches `min_steps[i]` (0: no wait). `wait` bounds how long one
    /// server-side wait lasts.
    pub async fn pull(
        &self,
        params: &mut [ArrayD<f32>],
        rows: Rows<'_>,
        min_steps: &[i64],
        wait_initialized: bool,
        wait: Duration,
    ) -> Result<Pulled, ClientError> {
        if self.use_channel {
            let pull = ChannelPull { params, rows, min_steps, wait_initialized, wait };
            return Ok(Self::pulled_from(&self.on_channel("pull from", None, Some(pull)).await?));
        }
        let routes = self.row_routes(rows);
        let calls = (0..self.num_ps()).map(|ps| {
            let req = proto::PullVariablesRequest {
                rows: self.rows_requests(ps, rows, &routes[ps]),
                ..self.pull_request(min_steps.get(ps).copied().unwrap_or(0), wait_initialized, wait)
            };
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "pull from", move || {
                let mut c = client.clone();
                async move { receive_pull(&mut c, req, wait).await }
            })
        });
        let per_ps = try_join_all(calls).await?;
        self.absorb(params, rows, &routes, per_ps)
    }

    /// Takes in what every ps replied to a pull: writes the values into
    /// `params` and sums up steps, `done`, waits and bytes.
    fn absorb(
        &self,
        params: &mut [ArrayD<f32>],
        rows: Rows<'_>,
        routes: &RowRoutes,
        per_ps: Vec<Vec<proto::PullVariablesReply>>,
    ) -> Result<Pulled, ClientError> {
        Self::shape_rows(params, &self.variables, rows);
        let mut steps = Vec::with_capacity(per_ps.len());
        let mut done = false;
        let mut waited = Duration::ZERO;
        let mut bytes = 0u64;
        for (ps, replies) in per_ps.into_iter().enumerate() {
            let step = replies.first().map(|r| r.step).unwrap_or_default();
            steps.push(step);
            waited = waited.max(Duration::from_micros(replies.first().map_or(0, |r| r.waited_micros)));
            bytes += replies.iter().filter_map(|r| r.part.as_ref()).map(|p| p.content.len() as u64).sum::<u64>();
            bytes += replies.iter().filter_map(|r| r.rows.as_ref()).map(|p| p.content.len() as u64).sum::<u64>();
            done |= replies.iter().any(|r| r.done);
            let mut parts = Vec::new();
            let mut pieces: Vec<Vec<RowsPart>> = Vec::new();
            for r in replies {
                parts.extend(r.part);
                if let Some(piece) = r.rows {
                    match pieces.last_mut() {
                        Some(last) if last[0].name == piece.name => last.push(piece),
                        _ => pieces.push(vec![piece]),
                    }
                }
            }
            if parts.is_empty() && pieces.is_empty() && done {
                continue;
            }
            self.scatter(ps, params, &parts)?;
            self.take_rows(ps, rows, &routes[ps], &pieces, params)?;
        }
        Ok(Pulled { steps, done, waited, bytes })
    }

    /// Writes the parts received from one ps into the full variables: the
    /// one copy of the received bytes.
    fn scatter(&self, ps: usize, params: &mut [ArrayD<f32>], parts: &[TensorPart]) -> Result<(), ClientError> {
        let mut covered = vec![0usize; self.shards[ps].len()];
        for part in parts {
            let k = self.shards[ps]
                .binary_search_by(|(_, s)| s.stored_name.as_str().cmp(&part.name))
                .map_err(|_| ClientError::Protocol(format!("ps:{ps} sent unknown variable {:?}", part.name)))?;
            let (vi, shard) = &self.shards[ps][k];
            let range = tensor::check_part(part, &shard.shape).map_err(|e| ClientError::Protocol(format!("ps:{ps}: {e}")))?;
            let base = self.element_range(*vi, shard).start;
            let dst = params[*vi].as_slice_mut().expect("standard layout");
            tensor::copy_f32_from_le(&mut dst[base + range.start..base + range.end], &part.content);
            covered[k] += range.len();
        }
        check_covered(ps, &self.shards[ps], &covered)
    }

    /// The messages of one push to ps `ps`: its shards of the gradients as
    /// parts and its partitions' rows, tagged with the step and the push id.
    fn push_messages(
        &self,
        ps: usize,
        step: i64,
        push_id: u64,
        gradients: &[ArrayD<f32>],
        rows: Rows<'_>,
        routes: &[Vec<usize>],
    ) -> Vec<proto::PushGradientsRequest> {
        let mut messages = Vec::new();
        let layout_version = self.layout_version;
        let message = |messages: &Vec<proto::PushGradientsRequest>, part, rows| {
            let task = if messages.is_empty() { self.task_proto() } else { None };
            proto::PushGradientsRequest { task, step, push_id, part, abstain: false, rows, layout_version, remainder: false }
        };
        for (vi, s) in &self.shards[ps] {
            let all = gradients[*vi].as_slice().expect("standard layout");
            for p in tensor::encode_parts(&s.stored_name, &tensor::wire_shape(&s.shape), &all[self.element_range(*vi, s)], self.part_bytes) {
                messages.push(message(&messages, Some(p), None));
            }
        }
        for (t, positions) in self.tables[ps].iter().zip(routes) {
            let ids = &rows[t.var];
            let grads = gradients[t.var].as_slice().expect("standard layout");
            for (count, content) in lookup::push_pieces(ids, grads, t.dim, positions, self.part_bytes) {
                let piece = RowsPart { name: t.stored_name.clone(), count, content: content.into() };
                messages.push(message(&messages, None, Some(piece)));
            }
        }
        if messages.is_empty() {
            // A ps without variables still counts the push (its step
            // advances with the others').
            messages.push(message(&messages, None, None));
        }
        messages
    }

    /// Pushes gradients to every ps concurrently, each tagged with the step
    /// of the values pulled from that ps. `rows` are the ids of the sparse
    /// embeddings' gradient rows.
    pub async fn push(&self, steps: &[i64], gradients: &[ArrayD<f32>], rows: Rows<'_>) -> Result<Vec<proto::PushGradientsReply>, ClientError> {
        // One id for this push on every ps; a retry resends the same id.
        let push_id = self.next_push_id.fetch_add(1, Ordering::Relaxed);
        if self.use_channel {
            let push_to = vec![true; self.num_ps()];
            let push = ChannelPush { steps, push_to: &push_to, gradients, rows, push_id, shard_call: None };
            let answers = self.on_channel("push to", Some(push), None).await?;
            return answers.into_iter().map(|a| a.push.ok_or_else(|| ClientError::Protocol("the ps's reply says nothing of the push".into()))).collect();
        }
        let routes = self.row_routes(rows);
        let calls = (0..self.num_ps()).map(|ps| {
            let messages = self.push_messages(ps, steps[ps], push_id, gradients, rows, &routes[ps]);
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "push to", move || {
                let mut c = client.clone();
                let stream = tokio_stream::iter(messages);
                async move { c.push_gradients(deadline(stream, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await
    }

    /// One training step against every ps concurrently, one call per ps:
    /// pushes the gradients (tagged with the step of the values pulled from
    /// that ps; `step.pushed_rows` the ids of the sparse embeddings' rows)
    /// to each ps `i` with `push_to[i]`, then pulls the dense variables and
    /// the rows `step.pulled_rows` into `params` once ps `i` reaches
    /// `min_steps[i]` (0: at once). Same semantics as [`push`](Self::push)
    /// followed by [`pull`](Self::pull), one round trip fewer. A ps not
    /// pushed to is only pulled from; its push reply is `accepted: false`
    /// with the step pulled.
    pub async fn push_pull(&self, step: StepRequest<'_>, params: &mut [ArrayD<f32>], min_steps: &[i64], wait: Duration) -> Result<Stepped, ClientError> {
        let StepRequest { steps, push_to, gradients, pushed_rows, pulled_rows, shard_call } = step;
        let push_id = self.next_push_id.fetch_add(1, Ordering::Relaxed);
        if self.use_channel {
            let push = ChannelPush { steps, push_to, gradients, rows: pushed_rows, push_id, shard_call };
            let pull = ChannelPull { params, rows: pulled_rows, min_steps, wait_initialized: false, wait };
            let answers = self.on_channel("push to and pull from", Some(push), Some(pull)).await?;
            let first_reply = answers.iter().map(|a| a.first_reply).max().unwrap_or_default();
            let dispatched = answers.first().and_then(|a| a.dispatched.clone());
            return Ok(Stepped { pushed: pushed_on_channel(&answers, push_to)?, pulled: Self::pulled_from(&answers), first_reply, dispatched });
        }
        let mut stepped = self.push_pull_grpc(step, params, min_steps, wait, push_id).await?;
        if let Some(call) = shard_call {
            stepped.dispatched = Some(self.next_shard_once(call.clone()).await.map_err(|e| e.to_string()));
        }
        Ok(stepped)
    }

    /// [`push_pull`](Self::push_pull) over gRPC: one PushPull call per ps
    /// pushed to (a pull alone to the others), concurrently.
    async fn push_pull_grpc(
        &self,
        step: StepRequest<'_>,
        params: &mut [ArrayD<f32>],
        min_steps: &[i64],
        wait: Duration,
        push_id: u64,
    ) -> Result<Stepped, ClientError> {
        let StepRequest { steps, push_to, gradients, pushed_rows, pulled_rows, .. } = step;
        let start = Instant::now();
        let (pull_routes, push_routes) = (self.row_routes(pulled_rows), self.row_routes(pushed_rows));
        let calls = (0..self.num_ps()).map(|ps| {
            let request =
                proto::PullVariablesRequest { rows: self.rows_requests(ps, pulled_rows, &pull_routes[ps]), ..self.pull_request(min_steps[ps], false, wait) };
            let messages: Option<Vec<proto::PushPullRequest>> = push_to[ps].then(|| {
                let mut pull = Some(proto::PullVariablesRequest { task: None, ..request.clone() });
                self.push_messages(ps, steps[ps], push_id, gradients, pushed_rows, &push_routes[ps])
                    .into_iter()
                    .map(|push| proto::PushPullRequest { push: Some(push), pull: pull.take() })
                    .collect()
            });
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "push to and pull from", move || {
                let mut c = client.clone();
                async move {
                    let Some(messages) = messages else {
                        let replies = receive_pull(&mut c, request, wait).await?;
                        let (step, done) = (replies.first().map_or(0, |r| r.step), replies.iter().any(|r| r.done));
                        return Ok((proto::PushGradientsReply { accepted: false, stale: false, step, done }, start.elapsed(), replies));
                    };
                    let mut stream = c.push_pull(deadline(tokio_stream::iter(messages), wait + CALL_DEADLINE)).await?.into_inner();
                    let mut pushed = None;
                    let mut first_reply = None;
                    let mut replies = Vec::new();
                    while let Some(r) = stream.message().await? {
                        first_reply = first_reply.or_else(|| Some(start.elapsed()));
                        pushed = pushed.or(r.push);
                        replies.extend(r.pull);
                    }
                    let pushed = pushed.ok_or_else(|| Status::internal("PushPull: the reply says nothing of the push"))?;
                    Ok((pushed, first_reply.unwrap_or_default(), replies))
                }
            })
        });
        let mut pushed = Vec::with_capacity(self.num_ps());
        let mut first_reply = Duration::ZERO;
        let mut per_ps = Vec::with_capacity(self.num_ps());
        for (p, first, replies) in self.join_step(calls, |(p, _, _)| p.accepted).await? {
            pushed.push(p);
            first_reply = first_reply.max(first);
            per_ps.push(replies);
        }
        Ok(Stepped { pushed, pulled: self.absorb(params, pulled_rows, &pull_routes, per_ps)?, first_reply, dispatched: None })
    }

    /// Tells every ps that training is over (chief only).
    pub async fn shutdown(&self, reason: &str, final_step: i64) -> Result<(), ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let req = proto::ShutdownRequest { task: self.task_proto(), reason: reason.into(), final_step };
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "shut down", self.patience, move || {
                let mut c = client.clone();
                let req = req.clone();
                async move { c.shutdown(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await.map(|_| ())
    }

    /// Tells every ps this task is leaving (a worker done, scaled away,
    /// stopped on a signal), so no sync step waits for its lease to run out
    /// and its shard of the data goes to another worker at once. It goes over
    /// the connections training opened: no name lookup or handshake stands
    /// between a signal and the ps hearing it. Errors are ignored (a ps that
    /// is already gone does not need to know); returns how many ps tasks
    /// heard it, within [`LEAVE_DEADLINE`].
    pub async fn leave(&self, reason: &str) -> usize {
        tokio::time::timeout(LEAVE_DEADLINE + Duration::from_millis(100), leave_all(&self.clients, &self.task, reason)).await.unwrap_or(0)
    }

    /// Tells every ps `i` that this task has nothing to train at
    /// `steps[i]` (sync training: it waits for a shard of the data), so the
    /// step does not wait for its gradient.
    pub async fn abstain(&self, steps: &[i64]) -> Result<Vec<proto::PushGradientsReply>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let message = proto::PushGradientsRequest {
                task: self.task_proto(),
                step: steps[ps],
                abstain: true,
                layout_version: self.layout_version,
                ..Default::default()
            };
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "abstain on", move || {
                let mut c = client.clone();
                async move { c.push_gradients(deadline(tokio_stream::iter([message]), CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await
    }

    /// The shard dispatcher on ps 0: reports `finished` (if any: the shard
    /// and the generation it was handed out under) and, when `want`, asks
    /// for the next shard. Retried while ps 0 is unreachable.
    pub async fn next_shard(
        &self,
        plan: proto::DatasetPlan,
        finished: Option<(proto::ShardRef, u64)>,
        want: bool,
    ) -> Result<proto::NextShardReply, ClientError> {
        let req = self.shard_request(plan, finished, None, want);
        with_retry(0, &self.addresses[0], "ask for a shard of", self.patience, || self.call_dispatcher(req.clone())).await
    }

    /// One call to the shard dispatcher on ps 0, not retried (the training
    /// loop falls back to [`next_shard`](Self::next_shard) when it fails).
    pub async fn next_shard_once(&self, req: proto::NextShardRequest) -> Result<proto::NextShardReply, ClientError> {
        self.call_dispatcher(req).await.map_err(|status| ClientError::Rpc { what: "ask for a shard of", ps: 0, address: self.addresses[0].clone(), status })
    }

    async fn call_dispatcher(&self, req: proto::NextShardRequest) -> Result<proto::NextShardReply, Status> {
        let mut client = self.clients[0].clone();
        client.next_shard(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner())
    }

    /// A call to the shard dispatcher from this task: it finished `finished`
    /// (the shard and the generation it was handed out under), still trains
    /// `keep` (which stays its own) and, when `want`, asks for a shard.
    pub fn shard_request(
        &self,
        plan: proto::DatasetPlan,
        finished: Option<(proto::ShardRef, u64)>,
        keep: Option<proto::ShardRef>,
        want: bool,
    ) -> proto::NextShardRequest {
        let (finished, generation) = finished.map_or((None, 0), |(s, g)| (Some(s), g));
        proto::NextShardRequest { task: self.task_proto(), plan: Some(plan), finished, want, generation, keep }
    }

    /// Keeps this task's lease on every ps (an evaluator holds none) and
    /// reports the figures of `report` (its `task` is set to this task);
    /// errors are ignored (the next call retries, and a ps that is down is
    /// noticed by the training calls).
    pub async fn heartbeat(&self, report: proto::HeartbeatRequest) {
        let report = proto::HeartbeatRequest { task: self.task_proto(), ..report };
        let calls = (0..self.num_ps()).map(|ps| {
            let mut c = self.clients[ps].clone();
            let req = report.clone();
            async move {
                let _ = c.heartbeat(deadline(req, Duration::from_secs(5))).await;
            }
        });
        futures::future::join_all(calls).await;
    }

    /// Asks every ps to write its shard of the checkpoint of `step` into
    /// `directory`; returns each shard's description (JSON), in ps order.
    pub async fn save_checkpoint(&self, directory: &str, step: i64) -> Result<Vec<String>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let req = proto::SaveCheckpointRequest { task: self.task_proto(), directory: directory.into(), step };
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "checkpoint on", self.patience, move || {
                let mut c = client.clone();
                let req = req.clone();
                async move { c.save_checkpoint(deadline(req, Duration::from_secs(600))).await.map(|r| r.into_inner().shard_info_json) }
            })
        });
        try_join_all(calls).await
    }

    pub async fn stats(&self) -> Result<Vec<proto::StatsReply>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "stats of", self.patience, move || {
                let mut c = client.clone();
                async move { c.stats(deadline(proto::StatsRequest {}, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each shard's slice is exactly its element range of its variable,
    /// whatever the order of ps and shards.
    #[test]
    fn shard_slices_cover_each_range_once() {
        type Case = (Vec<usize>, Vec<Vec<(usize, std::ops::Range<usize>)>>);
        let cases: Vec<Case> = vec![
            // one variable, one ps
            (vec![6], vec![vec![(0, 0..6)]]),
            // one variable cut over two ps
            (vec![6], vec![vec![(0, 0..4)], vec![(0, 4..6)]]),
            // listed out of order, over three ps, one ps with two variables
            (vec![9, 2], vec![vec![(0, 6..9), (1, 0..2)], vec![(0, 0..3)], vec![(0, 3..6)]]),
            // a ps with nothing, an empty variable
            (vec![3, 0], vec![vec![], vec![(1, 0..0), (0, 0..3)]]),
        ];
        for (sizes, shard_vars) in cases {
            let mut params: Vec<ArrayD<f32>> = sizes.iter().map(|&n| ArrayD::zeros(vec![n])).collect();
            let slices = shard_slices(&mut params, &shard_vars);
            for (ps, list) in slices.into_iter().enumerate() {
                assert_eq!(list.len(), shard_vars[ps].len());
                for (k, slice) in list.into_iter().enumerate() {
                    let (vi, range) = &shard_vars[ps][k];
                    assert_eq!(slice.len(), range.len(), "ps {ps} shard {k}");
                    for (j, x) in slice.iter_mut().enumerate() {
                        *x = (*vi * 100 + range.start + j) as f32;
                    }
                }
            }
            for (vi, p) in params.iter().enumerate() {
                let want: Vec<f32> = (0..sizes[vi]).map(|i| (vi * 100 + i) as f32).collect();
                assert_eq!(p.as_slice().unwrap(), want.as_slice(), "variable {vi}: every element written once, in place");
            }
        }
    }
}

//! The worker's view of the parameter servers: one gRPC client per ps task,
//! and calls that fan out to all of them concurrently (handshake, init,
//! pull, push, shutdown), splitting and joining variables by the placement.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::try_join_all;
use ndarray::ArrayD;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, IntoRequest, Request, Status};

use crate::auth::{Credentials, TokenAttach};
use crate::cluster::TaskId;
use crate::placement::{Placement, Shard};
use crate::proto::{self, parameter_server_client::ParameterServerClient, TensorPart};
use crate::tensor::{self, MAX_MESSAGE_BYTES};

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
}

impl ClientError {
    /// The status code behind the error, if it came from a call.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Rpc { status, .. } | ClientError::Unreachable { status, .. } | ClientError::Interrupted { status, .. } => {
                Some(status.code())
            }
            _ => None,
        }
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
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
        let config = tls.client_config(host).map_err(|reason| ClientError::Address { address: address.into(), reason })?;
        endpoint = endpoint.tls_config(config).map_err(|e| ClientError::Address { address: address.into(), reason: e.to_string() })?;
    }
    Ok(endpoint.connect_lazy())
}

pub fn ps_client(address: &str, credentials: &Credentials, connect_timeout: Duration) -> Result<PsGrpc, ClientError> {
    let attach = TokenAttach::new(credentials.token.as_deref()).map_err(|s| ClientError::Protocol(s.message().to_string()))?;
    Ok(ParameterServerClient::with_interceptor(channel(address, connect_timeout, credentials)?, attach)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Retries while a peer is unreachable (not started yet, restarting), with
/// exponential backoff, up to `patience`; logs while it waits.
pub async fn with_retry<T, F, Fut>(
    ps: usize,
    address: &str,
    what: &'static str,
    patience: Duration,
    mut call: F,
) -> Result<T, ClientError>
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
            Err(status) => return Err(ClientError::Rpc { what, ps, address: address.into(), status }),
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

/// A variable of the model as the client knows it.
#[derive(Debug, Clone)]
pub struct ModelVariable {
    pub name: String,
    pub shape: Vec<usize>,
}

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
}

/// The parameter servers of a job, seen from one task.
pub struct PsSet {
    pub task: TaskId,
    addresses: Vec<String>,
    clients: Vec<PsGrpc>,
    placement: Placement,
    variables: Vec<ModelVariable>,
    /// For each ps, its shards as (variable index, shard).
    shards: Vec<Vec<(usize, Shard)>>,
    pub config: proto::TrainingConfig,
    pub patience: Duration,
    pub part_bytes: usize,
    /// Ids of this task's pushes: microseconds since the epoch at start,
    /// then +1 per push, so they keep increasing across restarts.
    next_push_id: AtomicU64,
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
        let clients = addresses
            .iter()
            .map(|a| ps_client(a, credentials, Duration::from_secs(5)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut shards = vec![Vec::new(); addresses.len()];
        for (vi, v) in variables.iter().enumerate() {
            for s in &placement.variables[&v.name] {
                shards[s.ps].push((vi, s.clone()));
            }
        }
        for list in &mut shards {
            list.sort_by(|a, b| a.1.stored_name.cmp(&b.1.stored_name));
        }
        Ok(PsSet {
            task,
            addresses: addresses.to_vec(),
            clients,
            placement,
            variables,
            shards,
            config,
            patience,
            part_bytes: tensor::DEFAULT_PART_BYTES,
            next_push_id: AtomicU64::new(SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64)),
        })
    }

    pub fn num_ps(&self) -> usize {
        self.clients.len()
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    fn task_proto(&self) -> Option<proto::TaskId> {
        Some(proto::TaskId { job: self.task.job.clone(), index: self.task.index })
    }

    /// Elements of variable `vi` covered by a shard (rows are contiguous in
    /// row-major order).
    fn element_range(&self, vi: usize, shard: &Shard) -> std::ops::Range<usize> {
        let row: usize = self.variables[vi].shape.iter().skip(1).product();
        shard.rows.start * row..shard.rows.end * row
    }

    /// Presents this task's view to every ps. `observer` for evaluators.
    pub async fn handshake(&self, observer: bool) -> Result<Vec<proto::HandshakeReply>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let variables = self.shards[ps]
                .iter()
                .map(|(_, s)| proto::VariableSpec {
                    name: s.stored_name.clone(),
                    dtype: proto::DataType::DtFloat as i32,
                    shape: tensor::wire_shape(&s.shape),
                })
                .collect();
            let req = proto::HandshakeRequest {
                task: self.task_proto(),
                config: (!observer).then_some(self.config),
                variables,
                placement_fingerprint: self.placement.fingerprint(),
                num_ps: self.num_ps() as u32,
                observer,
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

    /// Sends the initial values of every variable to its ps (chief only).
    /// Returns true when some ps was already initialised (a restarted chief).
    pub async fn init(&self, values: &[ArrayD<f32>], step: i64) -> Result<bool, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let mut messages = vec![proto::InitVariablesRequest {
                task: self.task_proto(),
                config: Some(self.config),
                placement_fingerprint: self.placement.fingerprint(),
                part: None,
                step,
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
        }
    }

    /// Pulls every variable from every ps into `params` (which must have the
    /// variables' shapes), waiting until ps `i` reaches `min_steps[i]` (0: no
    /// wait). `wait` bounds how long one server-side wait lasts.
    pub async fn pull(
        &self,
        params: &mut [ArrayD<f32>],
        min_steps: &[i64],
        wait_initialized: bool,
        wait: Duration,
    ) -> Result<Pulled, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let req = self.pull_request(min_steps.get(ps).copied().unwrap_or(0), wait_initialized, wait);
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "pull from", move || {
                let mut c = client.clone();
                async move { receive_pull(&mut c, req, wait).await }
            })
        });
        let per_ps = try_join_all(calls).await?;
        self.absorb(params, per_ps)
    }

    /// Takes in what every ps replied to a pull: writes the values into
    /// `params` and sums up steps, `done`, waits and bytes.
    fn absorb(&self, params: &mut [ArrayD<f32>], per_ps: Vec<Vec<proto::PullVariablesReply>>) -> Result<Pulled, ClientError> {
        let mut steps = Vec::with_capacity(per_ps.len());
        let mut done = false;
        let mut waited = Duration::ZERO;
        let mut bytes = 0u64;
        for (ps, replies) in per_ps.into_iter().enumerate() {
            let step = replies.first().map(|r| r.step).unwrap_or_default();
            steps.push(step);
            waited = waited.max(Duration::from_micros(replies.first().map_or(0, |r| r.waited_micros)));
            bytes += replies.iter().filter_map(|r| r.part.as_ref()).map(|p| p.content.len() as u64).sum::<u64>();
            done |= replies.iter().any(|r| r.done);
            let parts: Vec<TensorPart> = replies.into_iter().filter_map(|r| r.part).collect();
            if parts.is_empty() && done {
                continue;
            }
            self.scatter(ps, params, &parts)?;
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
        for (k, (_, s)) in self.shards[ps].iter().enumerate() {
            if covered[k] != s.num_elements() {
                return Err(ClientError::Protocol(format!(
                    "ps:{ps} sent {} of the {} elements of {:?}",
                    covered[k],
                    s.num_elements(),
                    s.stored_name
                )));
            }
        }
        Ok(())
    }

    /// The messages of one push to ps `ps`: its shards of the gradients as
    /// parts, tagged with the step and the push id.
    fn push_messages(&self, ps: usize, step: i64, push_id: u64, gradients: &[ArrayD<f32>]) -> Vec<proto::PushGradientsRequest> {
        let mut messages = Vec::new();
        for (vi, s) in &self.shards[ps] {
            let all = gradients[*vi].as_slice().expect("standard layout");
            for p in tensor::encode_parts(&s.stored_name, &tensor::wire_shape(&s.shape), &all[self.element_range(*vi, s)], self.part_bytes) {
                let task = if messages.is_empty() { self.task_proto() } else { None };
                messages.push(proto::PushGradientsRequest { task, step, push_id, part: Some(p) });
            }
        }
        if messages.is_empty() {
            // A ps without variables still counts the push (its step
            // advances with the others').
            messages.push(proto::PushGradientsRequest { task: self.task_proto(), step, push_id, part: None });
        }
        messages
    }

    /// Pushes gradients to every ps concurrently, each tagged with the step
    /// of the values pulled from that ps.
    pub async fn push(&self, steps: &[i64], gradients: &[ArrayD<f32>]) -> Result<Vec<proto::PushGradientsReply>, ClientError> {
        // One id for this push on every ps; a retry resends the same id.
        let push_id = self.next_push_id.fetch_add(1, Ordering::Relaxed);
        let calls = (0..self.num_ps()).map(|ps| {
            let messages = self.push_messages(ps, steps[ps], push_id, gradients);
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
    /// that ps) to each ps `i` with `push_to[i]`, then pulls the variables
    /// into `params` once ps `i` reaches `min_steps[i]` (0: at once). Same
    /// semantics as [`push`](Self::push) followed by [`pull`](Self::pull),
    /// one round trip fewer. A ps not pushed to is only pulled from; its
    /// push reply is `accepted: false` with the step pulled.
    pub async fn push_pull(
        &self,
        steps: &[i64],
        push_to: &[bool],
        gradients: &[ArrayD<f32>],
        params: &mut [ArrayD<f32>],
        min_steps: &[i64],
        wait: Duration,
    ) -> Result<Stepped, ClientError> {
        let push_id = self.next_push_id.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let calls = (0..self.num_ps()).map(|ps| {
            let request = self.pull_request(min_steps[ps], false, wait);
            let messages: Option<Vec<proto::PushPullRequest>> = push_to[ps].then(|| {
                let mut pull = Some(proto::PullVariablesRequest { task: None, ..request.clone() });
                self.push_messages(ps, steps[ps], push_id, gradients)
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
        for (p, first, replies) in try_join_all(calls).await? {
            pushed.push(p);
            first_reply = first_reply.max(first);
            per_ps.push(replies);
        }
        Ok(Stepped { pushed, pulled: self.absorb(params, per_ps)?, first_reply })
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

    /// Tells every ps this task is leaving; errors are ignored (a ps that is
    /// already gone does not need to know).
    pub async fn leave(&self, reason: &str) {
        let calls = (0..self.num_ps()).map(|ps| {
            let mut c = self.clients[ps].clone();
            let req = proto::LeaveRequest { task: self.task_proto(), reason: reason.into() };
            async move {
                let _ = c.leave(deadline(req, Duration::from_secs(2))).await;
            }
        });
        futures::future::join_all(calls).await;
    }

    /// Keeps this task's lease on every ps; errors are ignored (the next
    /// call retries, and a ps that is down is noticed by the training calls).
    pub async fn heartbeat(&self) {
        let calls = (0..self.num_ps()).map(|ps| {
            let mut c = self.clients[ps].clone();
            let req = proto::HeartbeatRequest { task: self.task_proto() };
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

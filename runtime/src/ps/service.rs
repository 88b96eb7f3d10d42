//! The gRPC service over a [`ParameterStore`] (`ParameterServer` of
//! ps.proto), and the entry of the tensor channel ([`PsService::exchange`]):
//! collects streams, waits on the sync barrier, maps errors to status codes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::error::{StoreError, task_of};
use super::state::{Progress, SharedPull};
use super::store::ParameterStore;
use crate::cluster::TaskId;
use crate::proto::{self, RowsPart, TensorPart, parameter_server_server::ParameterServer};
use crate::tensor;

/// Where a ps staging a move fetches the fragments of another ps (the
/// gRPC client is above this module: it is handed in).
#[tonic::async_trait]
pub trait FragmentSource: Send + Sync {
    /// The source's fragments, put together from its stream as the messages
    /// arrive ([`super::moving::add_message`]).
    async fn fetch(&self, address: &str, req: proto::FetchFragmentsRequest) -> Result<super::recut::Fragments, Status>;
}

/// The largest message of a move's stream.
const MOVE_MESSAGE_BYTES: usize = 4 << 20;

/// The gRPC service over a [`ParameterStore`].
#[derive(Clone)]
pub struct PsService {
    store: Arc<ParameterStore>,
    /// How long a pull waits for its step when the caller gives no limit.
    pub default_wait: Duration,
    pub part_bytes: usize,
    sources: Option<Arc<dyn FragmentSource>>,
}

impl PsService {
    pub fn new(store: Arc<ParameterStore>) -> Self {
        PsService { store, default_wait: Duration::from_secs(30), part_bytes: tensor::DEFAULT_PART_BYTES, sources: None }
    }

    /// Lets this ps fetch fragments from the others when it stages a move.
    pub fn with_fragment_source(mut self, sources: Arc<dyn FragmentSource>) -> Self {
        self.sources = Some(sources);
        self
    }

    /// Fetches what every source supplies of this ps's pieces under the
    /// next layout (this ps's own part from itself), puts them together and
    /// stages them for the commit.
    async fn stage(&self, req: &proto::StageMoveRequest) -> Result<proto::StageMoveReply, Status> {
        self.store.check_chief(&task_of(&req.task, "task")?, "move the job's state")?;
        let own = self.store.config().ps_index;
        let start = std::time::Instant::now();
        let fetch = proto::FetchFragmentsRequest {
            task: req.task.clone(),
            version: req.version,
            variables: req.variables.clone(),
            dense_pieces: req.dense_pieces.clone(),
        };
        let calls = req.sources.iter().enumerate().map(|(i, address)| {
            let fetch = fetch.clone();
            async move {
                if i == own {
                    let store = self.store.clone();
                    return Ok::<_, Status>(
                        tokio::task::spawn_blocking(move || store.fragments_for(&fetch)).await.map_err(|e| Status::internal(e.to_string()))??,
                    );
                }
                let source = self.sources.as_ref().ok_or_else(|| Status::failed_precondition("this ps cannot reach the others (no fragment source)"))?;
                source.fetch(address, fetch).await
            }
        });
        let supplied = futures::future::try_join_all(calls).await?;
        let fetched = start.elapsed().as_secs_f64();
        let moved: usize = supplied.iter().enumerate().filter(|(i, _)| *i != own).map(|(_, f)| f.bytes()).sum();
        let (bytes, rows): (usize, usize) = (supplied.iter().map(|f| f.bytes()).sum(), supplied.iter().map(|f| f.rows()).sum());
        let req_owned = req.clone();
        let staged = tokio::task::spawn_blocking(move || super::moving::staged(&req_owned, supplied)).await.map_err(|e| Status::internal(e.to_string()))??;
        self.store.stage(staged);
        tracing::info!(
            "ps:{own}: staged layout version {}: {rows} embedding rows, {} with slots ({} from other ps tasks) in {:.2}s (fetched in {fetched:.2}s)",
            req.version,
            super::recut::bytes_text(bytes as u64),
            super::recut::bytes_text(moved as u64),
            start.elapsed().as_secs_f64()
        );
        Ok(proto::StageMoveReply { rows: rows as u64, bytes: bytes as u64, moved_bytes: moved as u64 })
    }

    /// Waits until `ready(progress)` or training is over, up to `limit`.
    async fn wait_for(&self, limit: Duration, ready: impl Fn(&Progress) -> bool) -> Result<Progress, Status> {
        let mut rx = self.store.subscribe();
        let waited = tokio::time::timeout(limit, rx.wait_for(|p| p.done || ready(p))).await;
        match waited {
            Ok(Ok(p)) => Ok(*p),
            Ok(Err(_)) => Err(Status::unavailable("the parameter server is stopping")),
            Err(_) => {
                let p = self.store.progress();
                Err(Status::deadline_exceeded(format!("waited {:.1}s: this ps is at step {} (initialised: {})", limit.as_secs_f64(), p.step, p.initialized)))
            }
        }
    }
}

/// What a pull brings: the step and end of training, the barrier's wait,
/// and the values (parts or shared variables).
#[derive(Debug)]
pub struct Pulled<T> {
    pub step: i64,
    pub done: bool,
    pub waited_micros: u64,
    pub values: Option<T>,
}

type PullStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::PullVariablesReply, Status>> + Send>>;
type PushPullStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::PushPullReply, Status>> + Send>>;

impl PsService {
    /// Collects one push (its parts) from a stream and applies it, all or
    /// nothing. The parts stay the received buffers: nothing is copied before
    /// the store reads them.
    async fn receive_push(
        &self,
        stream: impl futures::Stream<Item = Result<proto::PushGradientsRequest, Status>>,
    ) -> Result<(TaskId, proto::PushGradientsReply), Status> {
        let mut stream = std::pin::pin!(stream);
        let limit = self.store.max_push_bytes();
        let mut parts = Vec::new();
        let mut rows = Vec::new();
        let mut header: Option<proto::PushGradientsRequest> = None;
        let mut bytes = 0usize;
        while let Some(m) = stream.next().await {
            let mut m = m?;
            let part = m.part.take();
            if let Some(r) = m.rows.take() {
                bytes += r.content.len();
                if bytes > limit {
                    return Err(Status::invalid_argument(format!("push carries more than {limit} bytes: more than this ps takes")));
                }
                rows.push(r);
            }
            match &header {
                None => header = Some(m),
                Some(h) if h.step != m.step => {
                    return Err(Status::invalid_argument(format!("step: one push carries two steps ({} and {})", h.step, m.step)));
                }
                _ => {}
            }
            if let Some(p) = part {
                bytes += p.content.len();
                if bytes > limit {
                    return Err(Status::invalid_argument(format!("push carries more than {limit} bytes: more than this ps holds")));
                }
                parts.push(p);
            }
        }
        let header = header.ok_or_else(|| Status::invalid_argument("empty PushGradients stream"))?;
        self.apply_push(&header, &parts, &rows)
    }

    /// Applies one received push: its header (task, step, id; an
    /// abstention), its parts and its rows.
    fn apply_push(&self, header: &proto::PushGradientsRequest, parts: &[TensorPart], rows: &[RowsPart]) -> Result<(TaskId, proto::PushGradientsReply), Status> {
        let task = task_of(&header.task, "task")?;
        let reply = if header.abstain {
            if !parts.is_empty() || !rows.is_empty() {
                return Err(StoreError::InvalidArgument("abstain: an abstention carries no gradient, but the push has parts".into()).into());
            }
            self.store.abstain_for_layout(header.layout_version, &task, header.step)?
        } else {
            self.store.push_for_layout(header, &task, parts, rows)?
        };
        if reply.done {
            self.store.told_training_is_over(&task);
        }
        Ok((task, reply))
    }

    /// The store this service serves.
    pub fn store(&self) -> &ParameterStore {
        &self.store
    }

    /// The size of the parts pulls are cut into.
    pub fn part_bytes(&self) -> usize {
        self.part_bytes
    }

    /// Most gradient bytes one push may carry.
    pub fn max_push_bytes(&self) -> usize {
        self.store.max_push_bytes()
    }

    /// One request of the tensor channel ([`crate::channel`]): the push
    /// (header and received parts) when there is one, then the pull when
    /// there is one, with the semantics of PushGradients, PullVariables and
    /// PushPull.
    pub async fn exchange(
        &self,
        push: Option<proto::PushGradientsRequest>,
        parts: &[TensorPart],
        rows: &[RowsPart],
        pull: Option<proto::PullVariablesRequest>,
    ) -> Result<(Option<proto::PushGradientsReply>, Option<Pulled<SharedPull>>), Status> {
        if push.is_none() && !(parts.is_empty() && rows.is_empty()) {
            return Err(Status::invalid_argument("push_parts without a push"));
        }
        let pushed = match push {
            Some(p) => Some(self.apply_push(&p, parts, rows)?),
            None => None,
        };
        let Some(pull) = pull else {
            return Ok((pushed.map(|(_, r)| r), None));
        };
        // As in PushPull: a pull without a task is the pusher's.
        let task = match (&pull.task, &pushed) {
            (None, Some((t, _))) => Some(t.clone()),
            (t, _) => t.as_ref().map(TaskId::from),
        };
        let pulled = self.pull_with(&pull, task.as_ref(), |store| store.shared_pull(&pull.names, &pull.rows)).await?;
        Ok((pushed.map(|(_, r)| r), Some(pulled)))
    }

    /// The replies of one pull: waits for `min_step` (the sync barrier) or
    /// initialisation when asked, then the variables' parts, at least one
    /// message. `task` is the caller (its lease is renewed).
    async fn pull(&self, req: &proto::PullVariablesRequest, task: Option<&TaskId>) -> Result<Vec<proto::PullVariablesReply>, Status> {
        let pulled = self.pull_with(req, task, |store| store.pull_snapshot(&req.names, &req.rows, self.part_bytes)).await?;
        let (step, done, waited_micros) = (pulled.step, pulled.done, pulled.waited_micros);
        let (parts, rows) = pulled.values.unwrap_or_default();
        let reply = |part, rows| proto::PullVariablesReply { step, done, part, waited_micros, rows };
        let mut replies: Vec<proto::PullVariablesReply> = parts.into_iter().map(|part| reply(Some(part), None)).collect();
        replies.extend(rows.iter().flat_map(|r| r.encode(self.part_bytes)).map(|r| reply(None, Some(r))));
        if replies.is_empty() {
            replies.push(reply(None, None));
        }
        Ok(replies)
    }

    /// A pull: waits for `min_step` (the sync barrier) or initialisation
    /// when asked, then takes the values with `take` (none when training
    /// ended before anything was initialised). `task` is the caller (its
    /// lease is renewed; released when training is over).
    async fn pull_with<T>(
        &self,
        req: &proto::PullVariablesRequest,
        task: Option<&TaskId>,
        take: impl FnOnce(&ParameterStore) -> Result<(Progress, T), StoreError>,
    ) -> Result<Pulled<T>, Status> {
        let limit = match req.wait_timeout_ms {
            0 => self.default_wait,
            ms => Duration::from_millis(ms as u64),
        };
        self.store.check_read_layout(req.layout_version)?;
        if let Some(t) = task {
            self.store.touch(t);
        }
        let wait_start = std::time::Instant::now();
        if req.wait_initialized || req.min_step > 0 {
            let p = self.wait_for(limit, |p| (p.initialized && p.step >= req.min_step) || p.frozen).await?;
            if p.frozen && p.step < req.min_step {
                return Err(StoreError::LayoutChanged(format!("this ps is frozen at step {} for a move", p.step)).into());
            }
        }
        let waited_micros = wait_start.elapsed().as_micros() as u64;
        let progress = self.store.progress();
        if progress.done && !progress.initialized {
            if let Some(t) = task {
                self.store.told_training_is_over(t);
            }
            return Ok(Pulled { step: progress.step, done: true, waited_micros, values: None });
        }
        let (progress, values) = take(&self.store)?;
        if progress.done
            && let Some(t) = task
        {
            self.store.told_training_is_over(t);
        }
        Ok(Pulled { step: progress.step, done: progress.done, waited_micros, values: Some(values) })
    }
}

#[tonic::async_trait]
impl ParameterServer for PsService {
    async fn handshake(&self, request: Request<proto::HandshakeRequest>) -> Result<Response<proto::HandshakeReply>, Status> {
        Ok(Response::new(self.store.handshake(request.get_ref())?))
    }

    async fn init_variables(&self, request: Request<Streaming<proto::InitVariablesRequest>>) -> Result<Response<proto::InitVariablesReply>, Status> {
        let mut stream = request.into_inner();
        let mut messages = Vec::new();
        let mut bytes = 0usize;
        while let Some(m) = stream.next().await {
            let m = m?;
            bytes += m.part.as_ref().map_or(0, |p| p.content.len());
            if bytes > tensor::MAX_ASSEMBLED_ELEMENTS * 4 {
                return Err(Status::invalid_argument("InitVariables: more bytes than any variable set can hold"));
            }
            messages.push(m);
        }
        Ok(Response::new(self.store.init(&messages)?))
    }

    type PullVariablesStream = PullStream;

    async fn pull_variables(&self, request: Request<proto::PullVariablesRequest>) -> Result<Response<PullStream>, Status> {
        let req = request.into_inner();
        let task = req.task.as_ref().map(TaskId::from);
        let replies = self.pull(&req, task.as_ref()).await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(replies.into_iter().map(Ok)))))
    }

    async fn push_gradients(&self, request: Request<Streaming<proto::PushGradientsRequest>>) -> Result<Response<proto::PushGradientsReply>, Status> {
        let (_, reply) = self.receive_push(request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    type PushPullStream = PushPullStream;

    async fn push_pull(&self, request: Request<Streaming<proto::PushPullRequest>>) -> Result<Response<PushPullStream>, Status> {
        let mut stream = request.into_inner();
        let first = stream.next().await.ok_or_else(|| Status::invalid_argument("empty PushPull stream"))??;
        let pull = first.pull.ok_or_else(|| Status::invalid_argument("pull: missing in the first PushPull message"))?;
        let pushes = futures::stream::iter([Ok(first.push)]).chain(stream.map(|m| m.map(|m| m.push)));
        let pushes = pushes.map(|m| m.and_then(|p| p.ok_or_else(|| Status::invalid_argument("push: missing in a PushPull message"))));
        let (task, pushed) = self.receive_push(pushes).await?;
        let replies = self.pull(&pull, Some(&task)).await?;
        let mut push = Some(pushed);
        let replies = replies.into_iter().map(move |r| Ok(proto::PushPullReply { push: push.take(), pull: Some(r) }));
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }

    async fn stats(&self, _request: Request<proto::StatsRequest>) -> Result<Response<proto::StatsReply>, Status> {
        Ok(Response::new(self.store.stats()))
    }

    async fn shutdown(&self, request: Request<proto::ShutdownRequest>) -> Result<Response<proto::ShutdownReply>, Status> {
        Ok(Response::new(self.store.shutdown(request.get_ref())?))
    }

    async fn leave(&self, request: Request<proto::LeaveRequest>) -> Result<Response<proto::LeaveReply>, Status> {
        let req = request.into_inner();
        let task = task_of(&req.task, "task")?;
        tracing::info!("ps:{}: {task} left ({})", self.store.config().ps_index, req.reason);
        self.store.leave(&task);
        Ok(Response::new(proto::LeaveReply {}))
    }

    async fn heartbeat(&self, request: Request<proto::HeartbeatRequest>) -> Result<Response<proto::HeartbeatReply>, Status> {
        let task = task_of(&request.get_ref().task, "task")?;
        Ok(Response::new(self.store.heartbeat(&task, request.get_ref())))
    }

    async fn get_layout(&self, _request: Request<proto::GetLayoutRequest>) -> Result<Response<proto::LayoutReply>, Status> {
        Ok(Response::new(self.store.get_layout()))
    }

    async fn propose_layout(&self, request: Request<proto::ProposeLayoutRequest>) -> Result<Response<proto::LayoutReply>, Status> {
        Ok(Response::new(self.store.propose_layout(request.get_ref())?))
    }

    async fn freeze_for_move(&self, request: Request<proto::FreezeRequest>) -> Result<Response<proto::FreezeReply>, Status> {
        Ok(Response::new(self.store.freeze(request.get_ref())?))
    }

    async fn stage_move(&self, request: Request<proto::StageMoveRequest>) -> Result<Response<proto::StageMoveReply>, Status> {
        Ok(Response::new(self.stage(request.get_ref()).await?))
    }

    type FetchFragmentsStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::FragmentsReply, Status>> + Send>>;

    async fn fetch_fragments(&self, request: Request<proto::FetchFragmentsRequest>) -> Result<Response<Self::FetchFragmentsStream>, Status> {
        let store = self.store.clone();
        let req = request.into_inner();
        let fragments = tokio::task::spawn_blocking(move || store.fragments_for(&req)).await.map_err(|e| Status::internal(e.to_string()))??;
        let messages = super::moving::to_messages(fragments, MOVE_MESSAGE_BYTES);
        Ok(Response::new(Box::pin(futures::stream::iter(messages.map(Ok)))))
    }

    async fn commit_move(&self, request: Request<proto::CommitMoveRequest>) -> Result<Response<proto::CommitMoveReply>, Status> {
        Ok(Response::new(self.store.commit(request.get_ref())?))
    }

    async fn next_shard(&self, request: Request<proto::NextShardRequest>) -> Result<Response<proto::NextShardReply>, Status> {
        Ok(Response::new(self.store.next_shard(request.get_ref())?))
    }

    async fn save_checkpoint(&self, request: Request<proto::SaveCheckpointRequest>) -> Result<Response<proto::SaveCheckpointReply>, Status> {
        let req = request.into_inner();
        let task = task_of(&req.task, "task")?;
        let store = self.store.clone();
        let reply = tokio::task::spawn_blocking(move || store.save_checkpoint(&task, &req))
            .await
            .map_err(|e| Status::internal(format!("checkpoint writer: {e}")))??;
        Ok(Response::new(reply))
    }
}

//! The parameter server: a variable store with optimizers applied in place,
//! the sync accumulator, and the gRPC service around them.
//!
//! [`ParameterStore`] is synchronous and does all the checking; the gRPC
//! service only collects streams, waits on the sync barrier and maps errors
//! to status codes. Nothing received from the network can panic the store
//! or change a variable unless the whole request is valid.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::checkpoint;
use crate::cluster::TaskId;
use crate::dispatch::{self, DispatcherState, Handout, ShardDispatcher, ShardId, ShardPlan};
use crate::embedding::{self, EmbeddingPart, RowTable};
use crate::optimizer::{Optimizer, Slots};
use crate::proto::{self, RowsPart, TensorPart, UpdateMode, parameter_server_server::ParameterServer};
use crate::sync::{Averaged, StepCheck, SyncAccumulator, VarKind};
use crate::tensor::{self, PartAssembler};

/// Why the store refused a request; each maps to one gRPC status code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
}

static BAD_REQUESTS: crate::auth::RefusalLog = crate::auth::RefusalLog::new("invalid");

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        if matches!(e, StoreError::InvalidArgument(_) | StoreError::NotFound(_) | StoreError::PermissionDenied(_)) {
            BAD_REQUESTS.note(&e.to_string());
        }
        match e {
            StoreError::InvalidArgument(m) => Status::invalid_argument(m),
            StoreError::NotFound(m) => Status::not_found(m),
            StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
            StoreError::PermissionDenied(m) => Status::permission_denied(m),
        }
    }
}

impl From<tensor::TensorError> for StoreError {
    fn from(e: tensor::TensorError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

impl From<embedding::RowError> for StoreError {
    fn from(e: embedding::RowError) -> Self {
        StoreError::InvalidArgument(e.to_string())
    }
}

/// Most bytes of rows one push may carry (a batch's rows of every embedding
/// partition of a ps): far beyond any batch, short of exhausting memory.
pub const MAX_PUSH_ROWS_BYTES: usize = 256 << 20;

/// What a ps knows about its cluster.
#[derive(Debug, Clone)]
pub struct PsConfig {
    pub ps_index: usize,
    /// 0: unknown (a sparse `TF_CONFIG` that lists only this ps): the first
    /// caller's count is taken, and every later caller must agree with it.
    pub num_ps: usize,
    /// The only task allowed to initialise variables and shut the ps down.
    /// `None` lets any task do it (a ps started without a cluster, in tests).
    pub chief: Option<TaskId>,
    /// How long a training task's lease lasts without a call or heartbeat.
    pub lease: Duration,
}

impl PsConfig {
    /// A ps of `num_ps` with the default lease (10 s).
    pub fn new(ps_index: usize, num_ps: usize, chief: Option<TaskId>) -> Self {
        PsConfig { ps_index, num_ps, chief, lease: Duration::from_secs(10) }
    }
}

/// Step, initialisation and end of training, published to waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub step: i64,
    pub initialized: bool,
    pub done: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub pushes_applied: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

#[derive(Debug)]
struct StoredVar {
    name: String,
    shape: Vec<usize>,
    /// Shared with the tensor channel's pulls in flight, which write it to
    /// their sockets without the lock; an update while one does copies it
    /// first (`Arc::make_mut`), otherwise it is changed in place.
    values: Arc<Vec<f32>>,
    slots: Slots,
    /// Encoded values of the current step as parts (and the part size they
    /// were cut at), shared by every pull until the next update (all workers
    /// of a sync step pull the same bytes).
    encoded: Option<(usize, Vec<TensorPart>)>,
    /// The parts of an earlier step, whose buffers the next encoding reuses
    /// when no pull holds them any more (a fresh 100 MB of buffers per
    /// update is page faults and zeroing every time).
    spare: Vec<TensorPart>,
    /// A partition of an embedding: its rows live here (`values` and
    /// `slots` stay empty), pulled and pushed by id.
    table: Option<RowTable>,
}

impl StoredVar {
    fn dense(name: String, shape: Vec<usize>, values: Vec<f32>, slots: Slots) -> Self {
        StoredVar { name, shape, values: Arc::new(values), slots, encoded: None, spare: Vec::new(), table: None }
    }

    fn rows(name: String, shape: Vec<usize>, table: RowTable) -> Self {
        StoredVar { name, shape, values: Arc::new(Vec::new()), slots: Slots::default(), encoded: None, spare: Vec::new(), table: Some(table) }
    }

    fn kind(&self) -> VarKind {
        match &self.table {
            Some(t) => VarKind::Rows(t.dim()),
            None => VarKind::Dense(self.values.len()),
        }
    }

    fn spec(&self) -> proto::VariableSpec {
        proto::VariableSpec {
            name: self.name.clone(),
            dtype: proto::DataType::DtFloat as i32,
            shape: tensor::wire_shape(&self.shape),
            embedding: self.table.as_ref().map(|t| t.part.to_proto()),
        }
    }

    /// The values changed: the encoded parts are stale.
    fn changed(&mut self) {
        if let Some((_, parts)) = self.encoded.take() {
            self.spare = parts;
        }
    }
}

/// A variable's current values as a pull of the tensor channel takes them.
#[derive(Debug, Clone)]
pub struct SharedVariable {
    pub name: String,
    pub shape: Vec<i64>,
    pub values: Arc<Vec<f32>>,
}

/// Rows of an embedding partition, as a pull takes them: the ids asked for,
/// in that order, and their values (`ids.len() * dim`).
#[derive(Debug, Clone, PartialEq)]
pub struct PulledRows {
    pub name: String,
    pub dim: usize,
    pub ids: Vec<i64>,
    pub values: Vec<f32>,
}

impl PulledRows {
    /// As gRPC messages carry them: parts of at most `part_bytes` (at least
    /// one row each; one empty part when there is no row, so the receiver
    /// learns the partition answered).
    pub fn encode(&self, part_bytes: usize) -> Vec<RowsPart> {
        let per_part = (part_bytes / (8 + 4 * self.dim)).max(1);
        let part = |ids: &[i64], values: &[f32]| {
            let mut content = crate::le::i64_bytes(ids);
            content.extend_from_slice(&tensor::f32_to_bytes(values));
            RowsPart { name: self.name.clone(), count: ids.len() as u64, content: content.into() }
        };
        if self.ids.is_empty() {
            return vec![part(&[], &[])];
        }
        self.ids.chunks(per_part).zip(self.values.chunks(per_part * self.dim)).map(|(i, v)| part(i, v)).collect()
    }
}

/// One piece of a push's rows: ids and their values' bytes.
type RowPiece<'a> = (Vec<i64>, &'a [u8]);

/// The rows of a push, by variable: the pieces of each.
type RowPieces<'a> = Vec<(usize, Vec<RowPiece<'a>>)>;

/// What a pull over gRPC takes: dense variables encoded as parts, rows.
pub type GrpcPull = (Vec<TensorPart>, Vec<PulledRows>);

/// A push's rows of one partition as one list of ids and one of value
/// bytes (borrowed when the push sent them in one piece).
fn concat_rows<'a>(pieces: &'a [(Vec<i64>, &'a [u8])]) -> (std::borrow::Cow<'a, [i64]>, std::borrow::Cow<'a, [u8]>) {
    use std::borrow::Cow;
    match pieces {
        [(ids, values)] => (Cow::Borrowed(ids.as_slice()), Cow::Borrowed(*values)),
        _ => (
            Cow::Owned(pieces.iter().flat_map(|(ids, _)| ids.iter().copied()).collect()),
            Cow::Owned(pieces.iter().flat_map(|(_, v)| v.iter().copied()).collect()),
        ),
    }
}

/// The view that workers and the chief must agree on.
#[derive(Debug, Clone, PartialEq)]
struct Agreement {
    fingerprint: u64,
    variables: Vec<proto::VariableSpec>,
    config: Option<proto::TrainingConfig>,
}

#[derive(Debug, Default)]
struct State {
    agreement: Option<Agreement>,
    optimizer: Option<Optimizer>,
    mode: Option<UpdateMode>,
    vars: Vec<StoredVar>,
    by_name: BTreeMap<String, usize>,
    accumulator: Option<SyncAccumulator>,
    progress: Progress,
    counters: Counters,
    /// Tasks that joined and have not yet seen the end of training.
    pending: BTreeSet<String>,
    /// Training tasks and when their lease expires.
    leases: BTreeMap<String, Instant>,
    /// Last push id applied per task (retries are not applied twice).
    last_push: BTreeMap<String, u64>,
    /// The shard dispatcher (ps 0 only), from the first worker's plan or a
    /// checkpoint.
    dispatcher: Option<ShardDispatcher>,
    /// The number of ps tasks, once known (see [`PsConfig::num_ps`]).
    num_ps: usize,
    duplicate_pushes: u64,
    elastic: bool,
    scratch: Vec<f32>,
}

/// Parts of one variable's gradient: element range and little-endian bytes.
type Ranges<'a> = Vec<(Range<usize>, &'a [u8])>;

pub struct ParameterStore {
    config: PsConfig,
    /// This process's dispatcher generation (see `NextShardRequest.generation`).
    generation: u64,
    state: Mutex<State>,
    progress: watch::Sender<Progress>,
}

fn task_of(t: &Option<proto::TaskId>, field: &str) -> Result<TaskId, StoreError> {
    let t = t.as_ref().ok_or_else(|| StoreError::InvalidArgument(format!("{field}: missing")))?;
    if t.job.is_empty() {
        return Err(StoreError::InvalidArgument(format!("{field}.job: empty")));
    }
    Ok(TaskId { job: t.job.clone(), index: t.index })
}

/// Checks a training configuration on its own.
pub fn check_training_config(c: &proto::TrainingConfig) -> Result<(UpdateMode, Optimizer), StoreError> {
    let mode = match UpdateMode::try_from(c.mode) {
        Ok(m @ (UpdateMode::Async | UpdateMode::Sync)) => m,
        _ => {
            return Err(StoreError::InvalidArgument(format!("config.mode: unknown update mode {}", c.mode)));
        }
    };
    let opt = c.optimizer.as_ref().ok_or_else(|| StoreError::InvalidArgument("config.optimizer: missing".into()))?;
    let optimizer = Optimizer::from_proto(opt).map_err(|e| StoreError::InvalidArgument(format!("config.{e}")))?;
    if mode == UpdateMode::Sync && !c.elastic {
        if c.replicas_to_aggregate == 0 {
            return Err(StoreError::InvalidArgument("config.replicas_to_aggregate: must be at least 1".into()));
        }
        if c.total_num_replicas > 0 && c.replicas_to_aggregate > c.total_num_replicas {
            return Err(StoreError::InvalidArgument(format!(
                "config.replicas_to_aggregate: {} exceeds total_num_replicas {}: the step could never complete",
                c.replicas_to_aggregate, c.total_num_replicas
            )));
        }
    }
    Ok((mode, optimizer))
}

/// Checks a variable as a caller declares it (an embedding partition's
/// spec included).
fn check_spec(v: &proto::VariableSpec) -> Result<Option<EmbeddingPart>, StoreError> {
    if v.dtype != proto::DataType::DtFloat as i32 {
        return Err(StoreError::InvalidArgument(format!("variables.{}: only DT_FLOAT variables are supported", v.name)));
    }
    shape_usize(&v.name, &v.shape)?;
    v.embedding.as_ref().map(|e| EmbeddingPart::from_proto(&v.name, &v.shape, e).map_err(StoreError::InvalidArgument)).transpose()
}

fn shape_usize(name: &str, shape: &[i64]) -> Result<Vec<usize>, StoreError> {
    tensor::num_elements(name, shape)?;
    Ok(shape.iter().map(|&d| d as usize).collect())
}

/// Does a caller (`theirs`) train like the job (`ours`)? Update mode and
/// optimizer must match. A caller that left `--replicas_to_aggregate` to the
/// chief takes the job's aggregation; one that gave it must agree with the
/// job's count (or `auto`). The number of training tasks each sees is never
/// compared: a worker added later sees more.
fn same_training(ours: &proto::TrainingConfig, theirs: &proto::TrainingConfig) -> bool {
    ours.mode == theirs.mode
        && ours.optimizer == theirs.optimizer
        && (theirs.follow_chief_aggregation || (ours.replicas_to_aggregate == theirs.replicas_to_aggregate && ours.elastic == theirs.elastic))
}

/// What to do when two tasks count the gradients of a sync step differently.
fn aggregation_hint(a: &proto::TrainingConfig, b: &proto::TrainingConfig) -> &'static str {
    let aggregation = |c: &proto::TrainingConfig| (c.replicas_to_aggregate, c.total_num_replicas, c.elastic);
    if a.mode == b.mode && a.optimizer == b.optimizer && aggregation(a) != aggregation(b) {
        " (the tasks count a sync step's gradients differently: give every task the same --replicas_to_aggregate, \
         or `auto` for a job whose workers come and go)"
    } else {
        ""
    }
}

/// Explains the first difference between two views of the variables.
fn describe_difference(ours: &[proto::VariableSpec], theirs: &[proto::VariableSpec]) -> String {
    let a: BTreeMap<&str, &proto::VariableSpec> = ours.iter().map(|v| (v.name.as_str(), v)).collect();
    let b: BTreeMap<&str, &proto::VariableSpec> = theirs.iter().map(|v| (v.name.as_str(), v)).collect();
    for (name, v) in &b {
        match a.get(name) {
            None => return format!("variable {name:?} is not placed on this ps"),
            Some(o) if o.shape != v.shape || o.dtype != v.dtype => {
                return format!("variable {name:?}: this ps holds shape {:?}, the caller expects {:?}", o.shape, v.shape);
            }
            _ => {}
        }
    }
    if let Some(name) = a.keys().find(|n| !b.contains_key(*n)) {
        return format!("variable {name:?} of this ps is missing from the caller's placement");
    }
    "the placement fingerprints differ (ps tasks disagree on where variables live)".into()
}

fn progress_proto(p: &dispatch::DispatchProgress) -> proto::DispatchProgress {
    proto::DispatchProgress {
        epochs_completed: p.epochs_completed,
        examples_trained: p.examples_trained,
        shards_redone: p.shards_redone,
        shards_done: p.shards_done,
        shards_per_epoch: p.shards_per_epoch,
        finished: p.finished,
    }
}

/// Logs what a dispatcher call changed that a person follows: a shard handed
/// out again after a loss, an epoch completed, the end.
fn log_dispatch(ps: usize, task: &TaskId, before: &dispatch::DispatchProgress, after: &dispatch::DispatchProgress, handout: Option<Handout>) {
    if let Some(Handout::Assigned(shard, _)) = handout
        && after.shards_redone > before.shards_redone
    {
        tracing::info!("ps:{ps}: {shard} handed to {task} again (its worker was lost)");
    }
    if after.epochs_completed > before.epochs_completed {
        tracing::info!(
            "ps:{ps}: epoch {} complete ({} examples trained so far, {} shard(s) redone)",
            after.epochs_completed,
            after.examples_trained,
            after.shards_redone
        );
    }
    if after.finished && !before.finished {
        tracing::info!("ps:{ps}: every shard of every epoch is done");
    }
}

impl ParameterStore {
    pub fn new(config: PsConfig) -> Self {
        let (progress, _) = watch::channel(Progress::default());
        let state = State { num_ps: config.num_ps, ..State::default() };
        let generation = rand::random::<u64>() | 1;
        ParameterStore { config, generation, state: Mutex::new(state), progress }
    }

    pub fn config(&self) -> &PsConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied update
        // visible (updates are applied after every check), so poisoning is
        // recovered from rather than propagated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    pub fn progress(&self) -> Progress {
        self.lock().progress
    }

    /// Called with the state locked, so waiters see steps in order.
    fn publish(&self, p: Progress) {
        self.progress.send_if_modified(|cur| {
            let changed = *cur != p;
            *cur = p;
            changed
        });
    }

    fn check_chief(&self, task: &TaskId, what: &str) -> Result<(), StoreError> {
        match &self.config.chief {
            Some(chief) if chief != task => Err(StoreError::PermissionDenied(format!("only the chief ({chief}) may {what}; {task} asked"))),
            _ => Ok(()),
        }
    }

    /// Compares a caller's view with the agreed one, or makes it the agreed
    /// one when it is the first.
    fn agree(state: &mut State, theirs: Agreement, observer: bool) -> Result<(), StoreError> {
        match &mut state.agreement {
            None => {
                state.agreement = Some(theirs);
                Ok(())
            }
            Some(ours) => {
                if ours.fingerprint == 0 && ours.variables == theirs.variables {
                    ours.fingerprint = theirs.fingerprint;
                }
                if ours.fingerprint != theirs.fingerprint || ours.variables != theirs.variables {
                    return Err(StoreError::FailedPrecondition(format!("placement mismatch: {}", describe_difference(&ours.variables, &theirs.variables))));
                }
                match (&ours.config, &theirs.config) {
                    (_, _) if observer => Ok(()),
                    (None, Some(c)) => {
                        ours.config = Some(*c);
                        Ok(())
                    }
                    (Some(a), Some(b)) if !same_training(a, b) => Err(StoreError::FailedPrecondition(format!(
                        "training configuration mismatch: this ps trains with {a:?}, the caller with {b:?}{}",
                        aggregation_hint(a, b)
                    ))),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Checks the caller's count of ps tasks; when this ps does not know
    /// its own (a sparse cluster spec), the first count seen is the job's.
    fn check_num_ps(&self, state: &mut State, theirs: u32) -> Result<(), StoreError> {
        let theirs = theirs as usize;
        if state.num_ps == 0 && theirs > self.config.ps_index {
            tracing::info!("ps:{}: the cluster has {theirs} ps task(s) (from the first caller)", self.config.ps_index);
            state.num_ps = theirs;
        }
        if theirs != state.num_ps {
            return Err(StoreError::FailedPrecondition(format!("num_ps: the caller sees {theirs} ps task(s), this ps is one of {}", state.num_ps)));
        }
        Ok(())
    }

    /// The number of ps tasks (0 while unknown).
    pub fn num_ps(&self) -> usize {
        self.lock().num_ps
    }

    pub fn handshake(&self, req: &proto::HandshakeRequest) -> Result<proto::HandshakeReply, StoreError> {
        let task = task_of(&req.task, "task")?;
        let config = if req.observer {
            None
        } else {
            let c = req.config.ok_or_else(|| StoreError::InvalidArgument("config: missing".into()))?;
            check_training_config(&c)?;
            Some(c)
        };
        for v in &req.variables {
            check_spec(v)?;
        }
        let mut variables = req.variables.clone();
        variables.sort_by(|a, b| a.name.cmp(&b.name));
        let mut state = self.lock();
        self.check_num_ps(&mut state, req.num_ps)?;
        Self::agree(&mut state, Agreement { fingerprint: req.placement_fingerprint, variables, config }, req.observer)?;
        Self::configure_if_restored(&mut state)?;
        if Some(&task) != self.config.chief.as_ref() && !state.progress.done {
            state.pending.insert(task.to_string());
        }
        if !req.observer {
            self.renew(&mut state, &task);
        }
        let p = state.progress;
        Ok(proto::HandshakeReply {
            ps_index: self.config.ps_index as u32,
            initialized: p.initialized,
            step: p.step,
            done: p.done,
            chief: self.config.chief.as_ref().map(|c| proto::TaskId { job: c.job.clone(), index: c.index }),
            agreed: if p.initialized { state.agreement.as_ref().and_then(|a| a.config) } else { None },
        })
    }

    /// Initialises the variables from the chief's parts. The first
    /// initialisation wins; later ones change nothing.
    pub fn init(&self, messages: &[proto::InitVariablesRequest]) -> Result<proto::InitVariablesReply, StoreError> {
        let first = messages.first().ok_or_else(|| StoreError::InvalidArgument("empty InitVariables stream".into()))?;
        let task = task_of(&first.task, "task")?;
        self.check_chief(&task, "initialise variables")?;
        let config = first.config.ok_or_else(|| StoreError::InvalidArgument("config: missing".into()))?;
        let (mode, optimizer) = check_training_config(&config)?;
        if first.step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {} is negative", first.step)));
        }
        {
            let state = self.lock();
            if state.progress.initialized {
                return Ok(proto::InitVariablesReply { already_initialized: true, step: state.progress.step });
            }
        }
        // Assemble every variable before touching the state.
        let mut assemblers: BTreeMap<String, PartAssembler> = BTreeMap::new();
        for (i, m) in messages.iter().enumerate() {
            let Some(part) = &m.part else { continue };
            if part.name.is_empty() {
                return Err(StoreError::InvalidArgument(format!("message {i}: part.name is empty")));
            }
            let asm = match assemblers.get_mut(&part.name) {
                Some(a) => a,
                None => assemblers.entry(part.name.clone()).or_insert(PartAssembler::from_part(part)?),
            };
            asm.add(part)?;
        }
        let mut vars = Vec::new();
        for (name, asm) in assemblers {
            let (shape, values) = asm.finish()?;
            vars.push(StoredVar::dense(name, shape, values, optimizer.new_slots(0)));
        }
        for e in &first.embeddings {
            let part = check_spec(e)?.ok_or_else(|| StoreError::InvalidArgument(format!("embeddings.{}: no embedding spec", e.name)))?;
            if vars.iter().any(|v| v.name == e.name) {
                return Err(StoreError::InvalidArgument(format!("embeddings.{}: also sent as a dense variable", e.name)));
            }
            let mut table = RowTable::new(&e.name, part);
            table.use_optimizer(&optimizer);
            vars.push(StoredVar::rows(e.name.clone(), shape_usize(&e.name, &e.shape)?, table));
        }
        for v in &mut vars {
            if v.table.is_none() {
                v.slots = optimizer.new_slots(v.values.len());
            }
        }
        vars.sort_by(|a, b| a.name.cmp(&b.name));
        let specs: Vec<proto::VariableSpec> = vars.iter().map(StoredVar::spec).collect();

        let mut state = self.lock();
        if state.progress.initialized {
            return Ok(proto::InitVariablesReply { already_initialized: true, step: state.progress.step });
        }
        Self::agree(&mut state, Agreement { fingerprint: first.placement_fingerprint, variables: specs, config: Some(config) }, false)?;
        // The chief decides how the job aggregates (a worker's handshake may
        // have come first with its own view).
        if let Some(a) = &mut state.agreement {
            a.config = Some(config);
        }
        let kinds: Vec<VarKind> = vars.iter().map(StoredVar::kind).collect();
        state.by_name = vars.iter().enumerate().map(|(i, v)| (v.name.clone(), i)).collect();
        state.vars = vars;
        state.accumulator = (mode == UpdateMode::Sync).then(|| SyncAccumulator::with_kinds(&kinds, config.replicas_to_aggregate as usize, first.step));
        state.optimizer = Some(optimizer);
        state.mode = Some(mode);
        state.elastic = config.elastic;
        if config.elastic {
            let live = state.leases.len().max(1);
            if let Some(acc) = &mut state.accumulator {
                acc.set_required(live);
            }
        }
        state.progress.initialized = true;
        state.progress.step = first.step;
        let p = state.progress;
        self.publish(p);
        drop(state);
        Ok(proto::InitVariablesReply { already_initialized: false, step: p.step })
    }

    /// Encoded values of the named variables (all when `names` is empty), as
    /// parts of at most `part_bytes`, and the step they belong to. The bytes
    /// are shared, not copied, between pulls of the same step.
    pub fn snapshot(&self, names: &[String], part_bytes: usize) -> Result<(Progress, Vec<TensorPart>), StoreError> {
        let mut state = self.lock();
        Self::check_initialized(&state)?;
        Self::encoded(&mut state, names, part_bytes)
    }

    /// A pull over gRPC: the named dense variables (all when `names` is
    /// empty) as parts of at most `part_bytes`, and the rows asked for, at
    /// one step.
    pub fn pull_snapshot(&self, names: &[String], rows: &[proto::RowsRequest], part_bytes: usize) -> Result<(Progress, GrpcPull), StoreError> {
        let mut state = self.lock();
        Self::check_initialized(&state)?;
        let pulled_rows = Self::gather_rows(&mut state, rows)?;
        let (progress, parts) = Self::encoded(&mut state, names, part_bytes)?;
        Ok((progress, (parts, pulled_rows)))
    }

    /// A pull over the tensor channel: the named dense variables (all when
    /// `names` is empty) shared rather than encoded, and the rows asked for,
    /// at one step.
    pub fn shared_pull(&self, names: &[String], rows: &[proto::RowsRequest]) -> Result<(Progress, SharedPull), StoreError> {
        let mut state = self.lock();
        Self::check_initialized(&state)?;
        let pulled_rows = Self::gather_rows(&mut state, rows)?;
        let (progress, shared) = Self::shared(&mut state, names)?;
        Ok((progress, (shared, pulled_rows)))
    }

    fn check_initialized(state: &State) -> Result<(), StoreError> {
        if state.progress.initialized { Ok(()) } else { Err(StoreError::FailedPrecondition("variables are not initialised yet".into())) }
    }

    /// The rows asked for, checked all before any is read.
    fn gather_rows(state: &mut State, requests: &[proto::RowsRequest]) -> Result<Vec<PulledRows>, StoreError> {
        let mut asked = Vec::with_capacity(requests.len());
        let mut seen = BTreeSet::new();
        for r in requests {
            let i = Self::table_index(state, &r.name)?;
            if !seen.insert(i) {
                return Err(StoreError::InvalidArgument(format!("rows: {:?} is asked for twice", r.name)));
            }
            if r.ids.len() % 8 != 0 {
                return Err(StoreError::InvalidArgument(format!("rows.{}: {} bytes of ids is not a whole number of 8-byte ids", r.name, r.ids.len())));
            }
            let ids = crate::le::i64s(&r.ids);
            state.vars[i].table.as_ref().expect("a table").check_ids(&ids)?;
            asked.push((i, ids));
        }
        let mut out = Vec::with_capacity(asked.len());
        for (i, ids) in asked {
            let table = state.vars[i].table.as_ref().expect("a table");
            let mut values = Vec::new();
            table.gather(&ids, &mut values);
            state.counters.bytes_sent += (ids.len() * 8 + values.len() * 4) as u64;
            out.push(PulledRows { name: table.name.clone(), dim: table.dim(), ids, values });
        }
        Ok(out)
    }

    /// The index of embedding partition `name`.
    fn table_index(state: &State, name: &str) -> Result<usize, StoreError> {
        let &i = state.by_name.get(name).ok_or_else(|| StoreError::NotFound(format!("variable {name:?} is not on this ps")))?;
        if state.vars[i].table.is_none() {
            return Err(StoreError::InvalidArgument(format!("variable {name:?} is not an embedding: it has no rows to pull or push by id")));
        }
        Ok(i)
    }

    fn encoded(state: &mut State, names: &[String], part_bytes: usize) -> Result<(Progress, Vec<TensorPart>), StoreError> {
        let indices = Self::indices(state, names)?;
        let mut out = Vec::with_capacity(indices.len());
        let mut sent = 0u64;
        for i in indices {
            let v = &mut state.vars[i];
            if v.encoded.as_ref().is_none_or(|(size, _)| *size != part_bytes) {
                let spare = std::mem::take(&mut v.spare);
                let parts = tensor::encode_parts_reusing(&v.name, &tensor::wire_shape(&v.shape), &v.values, part_bytes, spare);
                v.encoded = Some((part_bytes, parts));
            }
            let parts = &v.encoded.as_ref().expect("just encoded").1;
            sent += parts.iter().map(|p| p.content.len() as u64).sum::<u64>();
            out.extend(parts.iter().cloned());
        }
        state.counters.bytes_sent += sent;
        Ok((state.progress, out))
    }

    /// The named variables (all when `names` is empty) as they are, shared
    /// rather than encoded: for the tensor channel, which writes them raw.
    pub fn shared_snapshot(&self, names: &[String]) -> Result<(Progress, Vec<SharedVariable>), StoreError> {
        let mut state = self.lock();
        Self::check_initialized(&state)?;
        Self::shared(&mut state, names)
    }

    fn shared(state: &mut State, names: &[String]) -> Result<(Progress, Vec<SharedVariable>), StoreError> {
        let indices = Self::indices(state, names)?;
        let out: Vec<SharedVariable> = indices
            .into_iter()
            .map(|i| {
                let v = &state.vars[i];
                SharedVariable { name: v.name.clone(), shape: tensor::wire_shape(&v.shape), values: v.values.clone() }
            })
            .collect();
        state.counters.bytes_sent += out.iter().map(|v| v.values.len() as u64 * 4).sum::<u64>();
        Ok((state.progress, out))
    }

    /// The dense variables named (all of them when `names` is empty).
    fn indices(state: &State, names: &[String]) -> Result<Vec<usize>, StoreError> {
        if names.is_empty() {
            return Ok((0..state.vars.len()).filter(|&i| state.vars[i].table.is_none()).collect());
        }
        names
            .iter()
            .map(|n| {
                let &i = state.by_name.get(n).ok_or_else(|| StoreError::NotFound(format!("variable {n:?} is not on this ps")))?;
                if state.vars[i].table.is_some() {
                    return Err(StoreError::InvalidArgument(format!("variable {n:?} is an embedding partition: pull its rows by id")));
                }
                Ok(i)
            })
            .collect()
    }

    /// Checks every part of a push against the stored variables and groups
    /// them by variable, requiring each variable to be covered exactly once.
    fn group_parts<'a>(state: &State, parts: &'a [TensorPart]) -> Result<Vec<(usize, Ranges<'a>)>, StoreError> {
        let mut groups: BTreeMap<usize, Ranges<'a>> = BTreeMap::new();
        for p in parts {
            let &i = state.by_name.get(&p.name).ok_or_else(|| StoreError::NotFound(format!("variable {:?} is not on this ps", p.name)))?;
            if state.vars[i].table.is_some() {
                return Err(StoreError::InvalidArgument(format!("variable {:?} is an embedding partition: push its rows by id", p.name)));
            }
            let range = tensor::check_part(p, &state.vars[i].shape)?;
            groups.entry(i).or_default().push((range, &p.content[..]));
        }
        let mut out = Vec::with_capacity(groups.len());
        for (i, mut g) in groups {
            g.sort_by_key(|(r, _)| r.start);
            let mut next = 0;
            for (r, _) in &g {
                if r.start != next {
                    break;
                }
                next = r.end;
            }
            let total = state.vars[i].values.len();
            if next != total || g.iter().map(|(r, _)| r.len()).sum::<usize>() != total {
                return Err(StoreError::InvalidArgument(format!(
                    "variable {:?}: the gradient's parts do not cover its {total} elements exactly once",
                    state.vars[i].name
                )));
            }
            out.push((i, g));
        }
        Ok(out)
    }

    /// Checks the rows of a push and groups them by embedding partition:
    /// each piece's length fits its partition's row width, every id is in
    /// the table and in this partition, and appears once in the push.
    fn group_rows<'a>(state: &State, rows: &'a [RowsPart]) -> Result<RowPieces<'a>, StoreError> {
        let mut groups: BTreeMap<usize, Vec<RowPiece<'a>>> = BTreeMap::new();
        for r in rows {
            let i = Self::table_index(state, &r.name)?;
            let table = state.vars[i].table.as_ref().expect("a table");
            let (ids, values) = embedding::split_rows(&r.name, r.count, table.dim(), &r.content)?;
            groups.entry(i).or_default().push((ids, values));
        }
        for (i, pieces) in &groups {
            state.vars[*i].table.as_ref().expect("a table").check_ids(pieces.iter().flat_map(|(ids, _)| ids))?;
        }
        Ok(groups.into_iter().collect())
    }

    /// Applies (async) or accumulates (sync) one push, all or nothing.
    pub fn push(&self, task: &TaskId, step: i64, push_id: u64, parts: &[TensorPart]) -> Result<proto::PushGradientsReply, StoreError> {
        self.push_with_rows(task, step, push_id, parts, &[])
    }

    /// [`push`](Self::push) with row-sparse gradients of embedding
    /// partitions besides the dense parts: every part and every row is
    /// checked before anything changes.
    pub fn push_with_rows(
        &self,
        task: &TaskId,
        step: i64,
        push_id: u64,
        parts: &[TensorPart],
        rows: &[RowsPart],
    ) -> Result<proto::PushGradientsReply, StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        self.renew(state, task);
        if state.progress.done {
            return Ok(proto::PushGradientsReply { accepted: false, stale: false, step: state.progress.step, done: true });
        }
        if !state.progress.initialized {
            return Err(StoreError::FailedPrecondition("variables are not initialised yet".into()));
        }
        if step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {step} is negative")));
        }
        if step > state.progress.step {
            return Err(StoreError::FailedPrecondition(format!("step {step} is from the future: this ps is at step {}", state.progress.step)));
        }
        let groups = Self::group_parts(state, parts)?;
        let row_groups = if rows.is_empty() { Vec::new() } else { Self::group_rows(state, rows)? };
        let worker = task.to_string();
        if push_id > 0 {
            if state.last_push.get(&worker).is_some_and(|&last| push_id <= last) {
                state.duplicate_pushes += 1;
                return Ok(proto::PushGradientsReply { accepted: false, stale: false, step: state.progress.step, done: false });
            }
            state.last_push.insert(worker.clone(), push_id);
        }
        state.counters.bytes_received += parts.iter().map(|p| p.content.len() as u64).sum::<u64>();
        state.counters.bytes_received += rows.iter().map(|r| r.content.len() as u64).sum::<u64>();
        let Some(optimizer) = state.optimizer else {
            return Err(StoreError::FailedPrecondition("restored from a checkpoint: waiting for a handshake that brings the training configuration".into()));
        };
        let mut reply = proto::PushGradientsReply { accepted: true, ..Default::default() };
        match &mut state.accumulator {
            None => {
                for (i, group) in groups {
                    let v = &mut state.vars[i];
                    v.slots.updates += 1;
                    let t = v.slots.updates;
                    for (range, bytes) in group {
                        // Applied straight from the received bytes when aligned.
                        let grad = tensor::f32_view(bytes, &mut state.scratch);
                        optimizer.apply(Arc::make_mut(&mut v.values).as_mut_slice(), &mut v.slots, range, grad, t);
                    }
                    v.changed();
                }
                for (i, pieces) in &row_groups {
                    let table = state.vars[*i].table.as_mut().expect("a table");
                    let (ids, values) = concat_rows(pieces);
                    let grads = tensor::f32_view(&values, &mut state.scratch);
                    table.apply(&optimizer, &ids, grads);
                }
                state.progress.step += 1;
                state.counters.pushes_applied += 1;
            }
            Some(acc) => match acc.check_step(step) {
                StepCheck::Stale => {
                    acc.record_stale();
                    reply.accepted = false;
                    reply.stale = true;
                }
                StepCheck::Future => {
                    return Err(StoreError::FailedPrecondition(format!("step {step} is from the future")));
                }
                StepCheck::Current => {
                    let mut counted = false;
                    for (i, group) in &groups {
                        counted |= acc.add(*i, &worker, group);
                    }
                    for (i, pieces) in &row_groups {
                        let pieces: Vec<(&[i64], &[u8])> = pieces.iter().map(|(ids, v)| (ids.as_slice(), *v)).collect();
                        counted |= acc.add_rows(*i, &worker, &pieces);
                    }
                    reply.accepted = counted || (groups.is_empty() && row_groups.is_empty());
                    acc.mark_pushed(&worker);
                }
            },
        }
        Self::finish_ready_step(state);
        reply.step = state.progress.step;
        let p = state.progress;
        self.publish(p);
        drop(guard);
        Ok(reply)
    }

    /// `task` has nothing to train at `step` (sync training: it waits for a
    /// shard of the data): it counts towards the step without a gradient.
    /// Does nothing in async training or for a step already completed.
    pub fn abstain(&self, task: &TaskId, step: i64) -> Result<proto::PushGradientsReply, StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        self.renew(state, task);
        let mut reply = proto::PushGradientsReply { step: state.progress.step, done: state.progress.done, ..Default::default() };
        if state.progress.done {
            return Ok(reply);
        }
        if !state.progress.initialized {
            return Err(StoreError::FailedPrecondition("variables are not initialised yet".into()));
        }
        if step < 0 || step > state.progress.step {
            return Err(StoreError::InvalidArgument(format!("step: {step} is not a step of this ps (at step {})", state.progress.step)));
        }
        if let Some(acc) = &mut state.accumulator
            && acc.check_step(step) == StepCheck::Current
        {
            reply.accepted = acc.abstain(&task.to_string());
        }
        Self::finish_ready_step(state);
        reply.step = state.progress.step;
        let p = state.progress;
        self.publish(p);
        Ok(reply)
    }

    /// Applies the averaged gradients when the sync step has enough of them.
    fn finish_ready_step(state: &mut State) {
        let (Some(acc), Some(optimizer)) = (&mut state.accumulator, state.optimizer) else {
            return;
        };
        if state.elastic {
            acc.set_required(state.leases.len().max(1));
        }
        if !acc.ready() {
            return;
        }
        let vars = &mut state.vars;
        acc.finish_step_rows(|i, avg| {
            let v = &mut vars[i];
            match avg {
                Averaged::Dense(avg) => optimizer.apply_all(Arc::make_mut(&mut v.values).as_mut_slice(), &mut v.slots, avg),
                Averaged::Rows(ids, values) => v.table.as_mut().expect("a table").apply(&optimizer, ids, values),
            }
            v.changed();
        });
        state.progress.step = acc.step();
        state.counters.pushes_applied += 1;
    }

    /// The shard dispatcher (ps 0 only): counts the shard `task` finished,
    /// when it names one, and hands out the next when it asks for one. The
    /// first plan presented becomes the job's (unless a checkpoint brought
    /// one); every later one must be the same.
    pub fn next_shard(&self, req: &proto::NextShardRequest) -> Result<proto::NextShardReply, StoreError> {
        use proto::next_shard_reply::Outcome;
        if self.config.ps_index != 0 {
            return Err(StoreError::FailedPrecondition(format!("the shard dispatcher runs on ps 0; this is ps {}", self.config.ps_index)));
        }
        let task = task_of(&req.task, "task")?;
        let p = req.plan.ok_or_else(|| StoreError::InvalidArgument("plan: missing".into()))?;
        let plan = ShardPlan::new(p.examples, p.shard_size, p.seed, (p.num_epochs > 0).then_some(p.num_epochs))
            .map_err(|e| StoreError::InvalidArgument(format!("plan: {e}")))?;
        let finished = req.finished.map(|s| ShardId { epoch: s.epoch, index: s.index });
        let finished = match finished {
            Some(shard) if req.generation != self.generation => {
                tracing::info!(
                    "ps:{}: {task} finished {shard}, handed out before this ps restarted: trained again (its updates since the checkpoint were lost)",
                    self.config.ps_index
                );
                None
            }
            other => other,
        };
        let mut guard = self.lock();
        let state = &mut *guard;
        self.renew(state, &task);
        let ps = self.config.ps_index;
        let dispatcher = state.dispatcher.get_or_insert_with(|| {
            tracing::info!(
                "ps:{ps}: dispatching {} examples in {} shard(s) of {} per epoch{}",
                plan.examples,
                plan.shards_per_epoch(),
                plan.shard_size,
                plan.num_epochs.map(|n| format!(", {n} epoch(s)")).unwrap_or_default()
            );
            ShardDispatcher::new(plan)
        });
        dispatcher.check_plan(&plan).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
        let before = dispatcher.progress();
        let reply = dispatcher.next(&task.to_string(), finished, req.want).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        let progress = dispatcher.progress();
        if reply.abandoned > 0 {
            tracing::info!("ps:{ps}: {} shard(s) of {task} go back to todo (it asked again without finishing them)", reply.abandoned);
        }
        log_dispatch(ps, &task, &before, &progress, reply.handout);
        let (outcome, shard, examples) = match reply.handout {
            None => (Outcome::Reported, None, 0),
            Some(Handout::Assigned(s, n)) => (Outcome::Assigned, Some(proto::ShardRef { epoch: s.epoch, index: s.index }), n),
            Some(Handout::Wait) => (Outcome::Wait, None, 0),
            Some(Handout::Finished) => (Outcome::Finished, None, 0),
        };
        Ok(proto::NextShardReply { outcome: outcome as i32, shard, examples, progress: Some(progress_proto(&progress)), generation: self.generation })
    }

    /// A training task is gone (lease expired, left): its shards go back to todo.
    fn release_shards(&self, state: &mut State, task: &str) {
        if let Some(d) = &mut state.dispatcher {
            let n = d.release(task);
            if n > 0 {
                tracing::info!("ps:{}: {n} shard(s) of {task} go back to todo", self.config.ps_index);
            }
        }
    }

    /// Renews the lease of a training task.
    fn renew(&self, state: &mut State, task: &TaskId) {
        if task.job != "evaluator" {
            state.leases.insert(task.to_string(), Instant::now() + self.config.lease);
        }
    }

    /// Renews a task's lease on any call.
    pub fn touch(&self, task: &TaskId) {
        let mut state = self.lock();
        if state.leases.contains_key(&task.to_string()) {
            self.renew(&mut state, task);
        }
    }

    /// A training task is alive (heartbeat).
    pub fn heartbeat(&self, task: &TaskId) -> proto::HeartbeatReply {
        let mut state = self.lock();
        self.renew(&mut state, task);
        proto::HeartbeatReply { step: state.progress.step, done: state.progress.done, live_tasks: state.leases.len() as u32 }
    }

    /// Expires leases that ran out by `now`; with elastic sync training the
    /// step then aggregates over fewer workers and may complete at once.
    pub fn expire_leases(&self, now: Instant) -> Vec<String> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let expired: Vec<String> = state.leases.iter().filter(|(_, until)| **until <= now).map(|(t, _)| t.clone()).collect();
        for t in &expired {
            state.leases.remove(t);
            // Gone without a word (killed, node lost): not waited for at the end either.
            state.pending.remove(t);
            tracing::info!("ps:{}: lease of {t} expired", self.config.ps_index);
            self.release_shards(state, t);
        }
        if !expired.is_empty() && state.progress.initialized && !state.progress.done {
            Self::finish_ready_step(state);
            let p = state.progress;
            self.publish(p);
        }
        expired
    }

    /// Training tasks with a live lease.
    pub fn live_tasks(&self) -> Vec<String> {
        self.lock().leases.keys().cloned().collect()
    }

    /// Writes this ps's shard of the checkpoint of `req.step` (values, slots
    /// and update counts copied under the lock, written outside it).
    pub fn save_checkpoint(&self, task: &TaskId, req: &proto::SaveCheckpointRequest) -> Result<proto::SaveCheckpointReply, StoreError> {
        self.check_chief(task, "save checkpoints")?;
        if req.directory.is_empty() {
            return Err(StoreError::InvalidArgument("directory: empty".into()));
        }
        if req.step < 0 {
            return Err(StoreError::InvalidArgument(format!("step: {} is negative", req.step)));
        }
        let (data, own_step, num_ps) = {
            let state = self.lock();
            if !state.progress.initialized {
                return Err(StoreError::FailedPrecondition("variables are not initialised yet".into()));
            }
            let mut data = checkpoint::ShardData::default();
            for v in &state.vars {
                if let Some(t) = &v.table {
                    save_rows(&mut data, t).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
                    continue;
                }
                data.variables.push((v.name.clone(), v.shape.clone(), v.values.to_vec()));
                for (k, slot) in [&v.slots.first, &v.slots.second].into_iter().enumerate() {
                    if !slot.is_empty() {
                        data.slots.push((format!("{}:slot{k}", v.name), v.shape.clone(), slot.clone()));
                    }
                }
                data.updates.push((v.name.clone(), v.slots.updates));
            }
            if let Some(d) = &state.dispatcher {
                data.dispatcher = Some(serde_json::to_string(&d.state()).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?);
            }
            if state.num_ps == 0 {
                return Err(StoreError::FailedPrecondition("the number of ps tasks is not known yet (no worker has joined)".into()));
            }
            (data, state.progress.step, state.num_ps)
        };
        let dir = crate::storage::Location::parse(&req.directory).map_err(|e| StoreError::InvalidArgument(format!("directory: {e}")))?;
        let info = checkpoint::write_shard(&dir, req.step, self.config.ps_index, num_ps, &data).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
        let json = serde_json::to_string(&info).map_err(|e| StoreError::FailedPrecondition(e.to_string()))?;
        Ok(proto::SaveCheckpointReply { step: own_step, shard_info_json: json })
    }

    /// Restores this ps from a checkpoint shard (of a checkpoint written by
    /// `num_ps` ps tasks) before serving: the values, the step and the shard
    /// dispatcher's state are back; the training configuration (and so the
    /// optimizer) comes with the first worker's handshake.
    pub fn restore(&self, data: &checkpoint::ShardData, step: i64, num_ps: usize) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.progress.initialized {
            return Err(StoreError::FailedPrecondition("already initialised".into()));
        }
        if state.num_ps == 0 {
            state.num_ps = num_ps;
        }
        let mut vars = Vec::new();
        for (name, shape, values) in &data.variables {
            if shape.iter().product::<usize>() != values.len() {
                return Err(StoreError::InvalidArgument(format!("checkpoint variable {name:?}: shape {shape:?} and {} values", values.len())));
            }
            let slot = |k: usize| data.slots.iter().find(|(n, _, _)| *n == format!("{name}:slot{k}")).map(|(_, _, v)| v.clone()).unwrap_or_default();
            let updates = data.updates.iter().find(|(n, _)| n == name).map_or(0, |(_, u)| *u);
            if let Some((_, ids)) = data.row_ids.iter().find(|(n, _)| n == name) {
                let json = data
                    .embeddings
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, j)| j.as_str())
                    .ok_or_else(|| StoreError::InvalidArgument(format!("checkpoint: embedding partition {name:?} has rows but no description")))?;
                let part: EmbeddingPart =
                    serde_json::from_str(json).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: embedding partition {name:?}: {e}")))?;
                let stored_shape = vec![part.partition_rows() as usize, part.dim];
                let mut table = RowTable::new(name, part);
                table.restore(ids.clone(), values.clone(), [slot(0), slot(1)], updates).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: {e}")))?;
                vars.push(StoredVar::rows(name.clone(), stored_shape, table));
                continue;
            }
            vars.push(StoredVar::dense(name.clone(), shape.clone(), values.clone(), Slots { first: slot(0), second: slot(1), updates }));
        }
        vars.sort_by(|a, b| a.name.cmp(&b.name));
        let variables = vars.iter().map(StoredVar::spec).collect();
        if let Some(json) = &data.dispatcher {
            let saved: DispatcherState =
                serde_json::from_str(json).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: the shard dispatcher's state does not parse: {e}")))?;
            let dispatcher = ShardDispatcher::restore(&saved).map_err(|e| StoreError::InvalidArgument(format!("checkpoint: {e}")))?;
            let p = dispatcher.progress();
            tracing::info!(
                "ps:{}: shard dispatcher restored: {} epoch(s) and {} shard(s) done, {} in flight at the checkpoint go back to todo",
                self.config.ps_index,
                p.epochs_completed,
                p.shards_done,
                saved.not_done.len()
            );
            state.dispatcher = Some(dispatcher);
        }
        // Fingerprint 0: adopted from the first handshake whose variables match.
        state.agreement = Some(Agreement { fingerprint: 0, variables, config: None });
        state.by_name = vars.iter().enumerate().map(|(i, v)| (v.name.clone(), i)).collect();
        state.vars = vars;
        state.progress.initialized = true;
        state.progress.step = step;
        let p = state.progress;
        self.publish(p);
        Ok(())
    }

    /// After a restore, the first configuration seen sets up the optimizer
    /// and the accumulator.
    fn configure_if_restored(state: &mut State) -> Result<(), StoreError> {
        if state.optimizer.is_some() || !state.progress.initialized {
            return Ok(());
        }
        let Some(config) = state.agreement.as_ref().and_then(|a| a.config) else {
            return Ok(());
        };
        let (mode, optimizer) = check_training_config(&config)?;
        for v in &mut state.vars {
            if let Some(t) = &mut v.table {
                t.use_optimizer(&optimizer);
                continue;
            }
            let fresh = optimizer.new_slots(v.values.len());
            // Slots of a different optimizer (or none saved) start afresh.
            if v.slots.first.len() != fresh.first.len() || v.slots.second.len() != fresh.second.len() {
                let updates = v.slots.updates;
                v.slots = fresh;
                v.slots.updates = updates;
            }
        }
        let kinds: Vec<VarKind> = state.vars.iter().map(StoredVar::kind).collect();
        let required = if config.elastic { state.leases.len().max(1) } else { config.replicas_to_aggregate as usize };
        state.accumulator = (mode == UpdateMode::Sync).then(|| SyncAccumulator::with_kinds(&kinds, required, state.progress.step));
        state.optimizer = Some(optimizer);
        state.mode = Some(mode);
        state.elastic = config.elastic;
        Ok(())
    }

    pub fn shutdown(&self, req: &proto::ShutdownRequest) -> Result<proto::ShutdownReply, StoreError> {
        let task = task_of(&req.task, "task")?;
        self.check_chief(&task, "end training")?;
        let mut state = self.lock();
        state.progress.done = true;
        let p = state.progress;
        self.publish(p);
        drop(state);
        tracing::info!("ps:{}: training is over at step {} ({task}: {})", self.config.ps_index, p.step, req.reason);
        Ok(proto::ShutdownReply { step: p.step })
    }

    /// Training tasks of the cluster spec (the chief aside): the ps waits for
    /// them too when training ends, not only for those that joined. A worker
    /// that starts late (a short job can end before it connects) then still
    /// finds the ps and is told training is over, instead of retrying an
    /// address nobody serves any more. Bounded by the grace period like the rest.
    pub fn expect(&self, tasks: &[TaskId]) {
        let mut state = self.lock();
        for t in tasks {
            if Some(t) != self.config.chief.as_ref() && !state.progress.done {
                state.pending.insert(t.to_string());
            }
        }
    }

    /// A task left, or was told training is over: the ps no longer waits for it.
    pub fn release(&self, task: &TaskId) {
        self.lock().pending.remove(&task.to_string());
    }

    /// A task left the job: it is neither waited for nor counted as live.
    pub fn leave(&self, task: &TaskId) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let key = task.to_string();
        state.pending.remove(&key);
        self.release_shards(state, &key);
        if state.leases.remove(&key).is_some() && state.progress.initialized && !state.progress.done {
            Self::finish_ready_step(state);
            let p = state.progress;
            self.publish(p);
        }
    }

    /// Tasks the ps still waits for before exiting after training ended.
    pub fn pending(&self) -> Vec<String> {
        self.lock().pending.iter().cloned().collect()
    }

    pub fn stats(&self) -> proto::StatsReply {
        let state = self.lock();
        let (stale, dup) = state.accumulator.as_ref().map_or((0, 0), |a| (a.stale_dropped, a.duplicates_dropped));
        proto::StatsReply {
            ps_index: self.config.ps_index as u32,
            initialized: state.progress.initialized,
            done: state.progress.done,
            step: state.progress.step,
            pushes_applied: state.counters.pushes_applied,
            stale_gradients_dropped: stale,
            duplicate_gradients_dropped: dup + state.duplicate_pushes,
            bytes_received: state.counters.bytes_received,
            bytes_sent: state.counters.bytes_sent,
            variables: state
                .vars
                .iter()
                .map(|v| proto::VariableStats {
                    name: v.name.clone(),
                    shape: tensor::wire_shape(&v.shape),
                    bytes: v.table.as_ref().map_or(v.values.len() as u64 * 4, |t| t.bytes()),
                    rows: v.table.as_ref().map_or(0, |t| t.len() as u64),
                })
                .collect(),
            config: state.agreement.as_ref().and_then(|a| a.config),
            live_tasks: state.leases.keys().cloned().collect(),
            replicas_to_aggregate: state.accumulator.as_ref().map_or(0, |a| a.required() as u32),
            dispatch: state.dispatcher.as_ref().map(|d| progress_proto(&d.progress())),
            pending: state.pending.iter().cloned().collect(),
        }
    }

    /// Values of a variable, for tests and checkpoints.
    pub fn values(&self, name: &str) -> Option<Vec<f32>> {
        let state = self.lock();
        state.by_name.get(name).map(|&i| state.vars[i].values.to_vec())
    }

    /// Rows `ids` of embedding partition `name` (their initial values when
    /// never updated), and the number of rows it materialised; for tests.
    pub fn rows(&self, name: &str, ids: &[i64]) -> Option<(Vec<f32>, usize)> {
        let state = self.lock();
        let table = state.vars[*state.by_name.get(name)?].table.as_ref()?;
        let mut out = Vec::new();
        table.gather(ids, &mut out);
        Some((out, table.len()))
    }

    /// Most bytes a push may carry: every dense variable of this ps once,
    /// rows up to [`MAX_PUSH_ROWS_BYTES`] when it holds embedding
    /// partitions, plus room for message overhead.
    pub fn max_push_bytes(&self) -> usize {
        let state = self.lock();
        let rows = if state.vars.iter().any(|v| v.table.is_some()) { MAX_PUSH_ROWS_BYTES } else { 0 };
        state.vars.iter().map(|v| v.values.len() * 4).sum::<usize>() + rows + (1 << 20)
    }
}

/// Adds an embedding partition's materialised rows to a checkpoint shard:
/// its values (`[rows, dim]`) and slots under the partition's name, the ids
/// under `<name>:ids`, and the partition's description.
fn save_rows(data: &mut checkpoint::ShardData, t: &RowTable) -> Result<(), serde_json::Error> {
    let (ids, values, slots, updates) = t.saved();
    let shape = vec![ids.len(), t.dim()];
    data.variables.push((t.name.clone(), shape.clone(), values.to_vec()));
    for (k, slot) in slots.into_iter().enumerate() {
        if !slot.is_empty() {
            data.slots.push((format!("{}:slot{k}", t.name), shape.clone(), slot.to_vec()));
        }
    }
    data.updates.push((t.name.clone(), updates));
    data.row_ids.push((t.name.clone(), ids.to_vec()));
    data.embeddings.push((t.name.clone(), serde_json::to_string(&t.part)?));
    Ok(())
}

/// The gRPC service over a [`ParameterStore`].
#[derive(Clone)]
pub struct PsService {
    store: Arc<ParameterStore>,
    /// How long a pull waits for its step when the caller gives no limit.
    pub default_wait: Duration,
    pub part_bytes: usize,
}

impl PsService {
    pub fn new(store: Arc<ParameterStore>) -> Self {
        PsService { store, default_wait: Duration::from_secs(30), part_bytes: tensor::DEFAULT_PART_BYTES }
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

/// What a pull over the tensor channel takes: dense variables shared, rows copied.
pub type SharedPull = (Vec<SharedVariable>, Vec<PulledRows>);

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
            self.store.abstain(&task, header.step)?
        } else {
            self.store.push_with_rows(&task, header.step, header.push_id, parts, rows)?
        };
        if reply.done {
            self.store.release(&task);
        }
        Ok((task, reply))
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
            (t, _) => t.as_ref().map(|t| TaskId { job: t.job.clone(), index: t.index }),
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
        if let Some(t) = task {
            self.store.touch(t);
        }
        let wait_start = std::time::Instant::now();
        if req.wait_initialized || req.min_step > 0 {
            self.wait_for(limit, |p| p.initialized && p.step >= req.min_step).await?;
        }
        let waited_micros = wait_start.elapsed().as_micros() as u64;
        let progress = self.store.progress();
        if progress.done && !progress.initialized {
            if let Some(t) = task {
                self.store.release(t);
            }
            return Ok(Pulled { step: progress.step, done: true, waited_micros, values: None });
        }
        let (progress, values) = take(&self.store)?;
        if progress.done
            && let Some(t) = task
        {
            self.store.release(t);
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
        let task = req.task.as_ref().map(|t| TaskId { job: t.job.clone(), index: t.index });
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
        Ok(Response::new(self.store.heartbeat(&task)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::DataType;
    use crate::tensor::f32_to_bytes;
    use bytes::Bytes;

    fn tid(job: &str, i: u32) -> Option<proto::TaskId> {
        Some(proto::TaskId { job: job.into(), index: i })
    }

    fn config(mode: UpdateMode, required: u32) -> proto::TrainingConfig {
        proto::TrainingConfig {
            mode: mode as i32,
            optimizer: Some(Optimizer::sgd(0.5).to_proto()),
            replicas_to_aggregate: required,
            total_num_replicas: 3,
            elastic: false,
            follow_chief_aggregation: false,
        }
    }

    fn part(name: &str, shape: &[i64], offset: u64, values: &[f32]) -> TensorPart {
        TensorPart { name: name.into(), dtype: DataType::DtFloat as i32, shape: shape.to_vec(), offset, content: f32_to_bytes(values) }
    }

    /// A store holding `w` = [1, 2, 3] (shape [3]) and `b` = [0] (shape [1]).
    fn store(mode: UpdateMode, required: u32) -> ParameterStore {
        let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
        let msgs = vec![
            proto::InitVariablesRequest {
                task: tid("worker", 0),
                config: Some(config(mode, required)),
                placement_fingerprint: 7,
                part: Some(part("w", &[3], 0, &[1.0, 2.0])),
                step: 0,
                embeddings: vec![],
            },
            proto::InitVariablesRequest { part: Some(part("w", &[3], 2, &[3.0])), ..Default::default() },
            proto::InitVariablesRequest { part: Some(part("b", &[1], 0, &[0.0])), ..Default::default() },
        ];
        assert!(!s.init(&msgs).unwrap().already_initialized);
        s
    }

    #[test]
    fn first_initialisation_wins() {
        let s = store(UpdateMode::Async, 1);
        let again = vec![proto::InitVariablesRequest {
            task: tid("worker", 0),
            config: Some(config(UpdateMode::Async, 1)),
            placement_fingerprint: 7,
            part: Some(part("w", &[3], 0, &[9.0, 9.0, 9.0])),
            step: 0,
            embeddings: vec![],
        }];
        assert!(s.init(&again).unwrap().already_initialized);
        assert_eq!(s.values("w").unwrap(), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn only_the_chief_initialises() {
        let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("chief", 0))));
        let msgs = vec![proto::InitVariablesRequest {
            task: tid("worker", 1),
            config: Some(config(UpdateMode::Async, 1)),
            part: Some(part("w", &[1], 0, &[1.0])),
            ..Default::default()
        }];
        assert!(matches!(s.init(&msgs), Err(StoreError::PermissionDenied(_))));
        assert!(!s.progress().initialized);
    }

    #[test]
    fn async_push_applies_at_once() {
        let s = store(UpdateMode::Async, 1);
        let r = s.push(&TaskId::new("worker", 1), 0, 0, &[part("w", &[3], 0, &[2.0, 2.0, 2.0]), part("b", &[1], 0, &[-2.0])]).unwrap();
        assert!(r.accepted);
        assert_eq!(r.step, 1);
        assert_eq!(s.values("w").unwrap(), vec![0.0, 1.0, 2.0]);
        assert_eq!(s.values("b").unwrap(), vec![1.0]);
        // Stale gradients are applied in async training (as in TensorFlow).
        let r = s.push(&TaskId::new("worker", 0), 0, 0, &[part("b", &[1], 0, &[2.0])]).unwrap();
        assert!(r.accepted && !r.stale);
        assert_eq!(s.values("b").unwrap(), vec![0.0]);
    }

    #[test]
    fn sync_push_waits_for_enough_replicas() {
        let s = store(UpdateMode::Sync, 2);
        let w = |g: f32| vec![part("w", &[3], 0, &[g, g, g]), part("b", &[1], 0, &[g])];
        let r = s.push(&TaskId::new("worker", 0), 0, 0, &w(1.0)).unwrap();
        assert!(r.accepted && r.step == 0);
        assert_eq!(s.values("b").unwrap(), vec![0.0], "nothing applied with one of two");
        // A retry from the same worker does not count.
        s.push(&TaskId::new("worker", 0), 0, 0, &w(100.0)).unwrap();
        assert_eq!(s.progress().step, 0);
        let r = s.push(&TaskId::new("worker", 1), 0, 0, &w(3.0)).unwrap();
        assert_eq!(r.step, 1);
        // average 2, lr 0.5 → -1
        assert_eq!(s.values("b").unwrap(), vec![-1.0]);
        // The backup worker's gradient for step 0 is stale now.
        let r = s.push(&TaskId::new("worker", 2), 0, 0, &w(5.0)).unwrap();
        assert!(r.stale && !r.accepted);
        let st = s.stats();
        assert_eq!((st.stale_gradients_dropped, st.duplicate_gradients_dropped), (1, 2));
        assert_eq!(s.values("b").unwrap(), vec![-1.0]);
    }

    /// Every bad push is refused with the right code and changes nothing.
    #[test]
    fn bad_pushes_change_nothing() {
        for mode in [UpdateMode::Async, UpdateMode::Sync] {
            let s = store(mode, 1);
            let good_b = part("b", &[1], 0, &[1.0]);
            type Case = (&'static str, i64, Vec<TensorPart>, fn(&StoreError) -> bool);
            let cases: Vec<Case> = vec![
                ("unknown variable", 0, vec![part("nope", &[1], 0, &[1.0])], |e| matches!(e, StoreError::NotFound(_))),
                ("wrong shape", 0, vec![part("w", &[1, 3], 0, &[1.0, 1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
                ("wrong dtype", 0, vec![TensorPart { dtype: DataType::DtDouble as i32, ..part("b", &[1], 0, &[1.0]) }], |e| {
                    matches!(e, StoreError::InvalidArgument(_))
                }),
                ("wrong byte length", 0, vec![TensorPart { content: Bytes::from_static(&[1, 2, 3, 4, 5]), ..part("b", &[1], 0, &[1.0]) }], |e| {
                    matches!(e, StoreError::InvalidArgument(_))
                }),
                ("part past the end", 0, vec![part("w", &[3], 2, &[1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
                ("variable not fully covered", 0, vec![part("w", &[3], 0, &[1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
                ("overlapping parts", 0, vec![part("w", &[3], 0, &[1.0, 1.0]), part("w", &[3], 1, &[1.0, 1.0])], |e| {
                    matches!(e, StoreError::InvalidArgument(_))
                }),
                ("step from the future", 5, vec![good_b.clone()], |e| matches!(e, StoreError::FailedPrecondition(_))),
                ("negative step", -1, vec![good_b.clone()], |e| matches!(e, StoreError::InvalidArgument(_))),
                ("a bad part poisons the whole push", 0, vec![good_b.clone(), part("nope", &[1], 0, &[1.0])], |e| matches!(e, StoreError::NotFound(_))),
            ];
            for (name, step, parts, code) in cases {
                let err = s.push(&TaskId::new("worker", 1), step, 0, &parts).expect_err(name);
                assert!(code(&err), "{mode:?} {name}: {err:?}");
                assert_eq!(s.values("w").unwrap(), vec![1.0, 2.0, 3.0], "{mode:?} {name}");
                assert_eq!(s.values("b").unwrap(), vec![0.0], "{mode:?} {name}");
                assert_eq!(s.progress().step, 0, "{mode:?} {name}");
            }
        }
    }

    #[test]
    fn listed_tasks_are_waited_for_even_before_they_join() {
        let s = store(UpdateMode::Async, 1);
        s.expect(&[TaskId::new("worker", 0), TaskId::new("worker", 1)]);
        // The chief (worker:0 here) is not waited for; worker:1 is, until it is told.
        assert_eq!(s.pending(), vec!["worker:1".to_string()]);
        s.release(&TaskId::new("worker", 1));
        assert!(s.pending().is_empty());
    }

    /// A tensor channel pull keeps the values of its step while it sends
    /// them: an update meanwhile works on a copy; with no pull holding
    /// them, the update is in place.
    #[test]
    fn shared_pulls_keep_the_values_of_their_step() {
        let s = store(UpdateMode::Async, 1);
        let worker = TaskId::new("worker", 0);
        let grads = || vec![part("w", &[3], 0, &[1.0, 1.0, 1.0]), part("b", &[1], 0, &[1.0])];
        let (p, shared) = s.shared_snapshot(&[]).unwrap();
        assert_eq!(p.step, 0);
        assert_eq!(shared.iter().map(|v| (v.name.as_str(), v.shape.clone())).collect::<Vec<_>>(), vec![("b", vec![1]), ("w", vec![3])]);
        assert_eq!(*shared[1].values, vec![1.0, 2.0, 3.0]);
        s.push(&worker, 0, 0, &grads()).unwrap();
        assert_eq!(*shared[1].values, vec![1.0, 2.0, 3.0], "the pull in flight still sends step 0");
        let now = s.values("w").unwrap();
        assert_ne!(now, vec![1.0, 2.0, 3.0]);
        let (p, again) = s.shared_snapshot(&["w".into()]).unwrap();
        assert_eq!((p.step, again[0].values.to_vec()), (1, now));
        let address = again[0].values.as_ptr();
        drop((shared, again));
        s.push(&worker, 1, 0, &grads()).unwrap();
        let (_, last) = s.shared_snapshot(&["w".into()]).unwrap();
        assert_eq!(last[0].values.as_ptr(), address, "nobody held it: updated in place");
        assert!(matches!(s.shared_snapshot(&["nope".into()]), Err(StoreError::NotFound(_))));
    }

    #[test]
    fn pulls() {
        let s = store(UpdateMode::Async, 1);
        let (p, t) = s.snapshot(&[], 8).unwrap();
        assert_eq!(p.step, 0);
        // w = [1, 2, 3] in parts of 2 elements.
        assert_eq!(t.iter().map(|p| (p.name.as_str(), p.offset)).collect::<Vec<_>>(), vec![("b", 0), ("w", 0), ("w", 2)]);
        assert_eq!(t[2].content, f32_to_bytes(&[3.0]));
        // Same step: the same bytes are shared, not re-encoded.
        let (_, t2) = s.snapshot(&["w".into()], 8).unwrap();
        assert_eq!(t[1].content.as_ptr(), t2[0].content.as_ptr());
        assert!(matches!(s.snapshot(&["nope".into()], 8), Err(StoreError::NotFound(_))));
        let fresh = ParameterStore::new(PsConfig::new(0, 1, None));
        assert!(matches!(fresh.snapshot(&[], 8), Err(StoreError::FailedPrecondition(_))));
        assert!(matches!(fresh.shared_snapshot(&[]), Err(StoreError::FailedPrecondition(_))));
        assert!(matches!(fresh.push(&TaskId::new("worker", 0), 0, 0, &[]), Err(StoreError::FailedPrecondition(_))));
    }

    #[test]
    fn handshake_checks_the_view() {
        let s = store(UpdateMode::Sync, 2);
        let spec =
            |name: &str, shape: &[i64]| proto::VariableSpec { name: name.into(), dtype: DataType::DtFloat as i32, shape: shape.to_vec(), embedding: None };
        let good = proto::HandshakeRequest {
            task: tid("worker", 1),
            config: Some(config(UpdateMode::Sync, 2)),
            variables: vec![spec("w", &[3]), spec("b", &[1])],
            placement_fingerprint: 7,
            num_ps: 1,
            observer: false,
        };
        let r = s.handshake(&good).unwrap();
        assert!(r.initialized);
        let cases: Vec<(&str, proto::HandshakeRequest, &str)> = vec![
            ("shape", proto::HandshakeRequest { variables: vec![spec("w", &[4]), spec("b", &[1])], ..good.clone() }, "variable \"w\": this ps holds shape [3]"),
            ("missing", proto::HandshakeRequest { variables: vec![spec("w", &[3])], ..good.clone() }, "variable \"b\" of this ps is missing"),
            (
                "extra",
                proto::HandshakeRequest { variables: vec![spec("w", &[3]), spec("b", &[1]), spec("c", &[1])], ..good.clone() },
                "\"c\" is not placed on this ps",
            ),
            ("fingerprint", proto::HandshakeRequest { placement_fingerprint: 8, ..good.clone() }, "fingerprints differ"),
            ("config", proto::HandshakeRequest { config: Some(config(UpdateMode::Async, 2)), ..good.clone() }, "training configuration mismatch"),
            ("num_ps", proto::HandshakeRequest { num_ps: 2, ..good.clone() }, "num_ps"),
            ("too many to aggregate", proto::HandshakeRequest { config: Some(config(UpdateMode::Sync, 4)), ..good.clone() }, "exceeds total_num_replicas"),
            ("no task", proto::HandshakeRequest { task: None, ..good.clone() }, "task: missing"),
        ];
        for (name, req, want) in cases {
            let err = s.handshake(&req).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
        // An evaluator's configuration is not compared.
        let obs = proto::HandshakeRequest { observer: true, config: None, task: tid("evaluator", 0), ..good };
        assert!(s.handshake(&obs).is_ok());
    }

    #[test]
    fn shutdown_is_for_the_chief() {
        let s = store(UpdateMode::Async, 1);
        let req = |t| proto::ShutdownRequest { task: t, reason: "done".into(), final_step: 0 };
        assert!(matches!(s.shutdown(&req(tid("worker", 1))), Err(StoreError::PermissionDenied(_))));
        assert!(!s.progress().done);
        s.shutdown(&req(tid("worker", 0))).unwrap();
        assert!(s.progress().done);
        let r = s.push(&TaskId::new("worker", 1), 0, 0, &[part("b", &[1], 0, &[1.0])]).unwrap();
        assert!(r.done && !r.accepted);
        assert_eq!(s.values("b").unwrap(), vec![0.0]);
    }

    #[test]
    fn a_retried_push_is_applied_once() {
        let s = store(UpdateMode::Async, 1);
        let g = [part("b", &[1], 0, &[2.0])];
        let w = TaskId::new("worker", 1);
        assert!(s.push(&w, 0, 1, &g).unwrap().accepted);
        let again = s.push(&w, 0, 1, &g).unwrap();
        assert!(!again.accepted);
        assert_eq!(s.values("b").unwrap(), vec![-1.0]);
        assert!(s.push(&w, 1, 2, &g).unwrap().accepted);
        assert_eq!(s.values("b").unwrap(), vec![-2.0]);
        assert_eq!(s.stats().duplicate_gradients_dropped, 1);
    }

    /// Elastic sync: the step aggregates over the live leases; a worker that
    /// leaves or whose lease expires no longer holds the step back.
    #[test]
    fn elastic_sync_follows_live_workers() {
        let s = ParameterStore::new(PsConfig { lease: Duration::from_millis(50), ..PsConfig::new(0, 1, Some(TaskId::new("worker", 0))) });
        let mut cfg = config(UpdateMode::Sync, 0);
        cfg.elastic = true;
        cfg.total_num_replicas = 0;
        let hs = |i: u32| proto::HandshakeRequest {
            task: tid("worker", i),
            config: Some(cfg),
            variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }],
            placement_fingerprint: 7,
            num_ps: 1,
            observer: false,
        };
        for i in 0..3 {
            s.handshake(&hs(i)).unwrap();
        }
        let init = vec![proto::InitVariablesRequest {
            task: tid("worker", 0),
            config: Some(cfg),
            placement_fingerprint: 7,
            part: Some(part("b", &[1], 0, &[0.0])),
            step: 0,
            embeddings: vec![],
        }];
        s.init(&init).unwrap();
        assert_eq!(s.stats().replicas_to_aggregate, 3);
        let g = [part("b", &[1], 0, &[1.0])];
        s.push(&TaskId::new("worker", 0), 0, 0, &g).unwrap();
        s.push(&TaskId::new("worker", 1), 0, 0, &g).unwrap();
        assert_eq!(s.progress().step, 0, "3 live workers: 2 gradients are not enough");
        // worker 2 leaves (scale-down): the step completes with the two it has.
        s.leave(&TaskId::new("worker", 2));
        assert_eq!(s.progress().step, 1);
        // A new worker joins (scale-up): the next step needs 3 again.
        s.handshake(&hs(3)).unwrap();
        s.push(&TaskId::new("worker", 0), 1, 0, &g).unwrap();
        s.push(&TaskId::new("worker", 3), 1, 0, &g).unwrap();
        assert_eq!(s.progress().step, 1);
        s.push(&TaskId::new("worker", 1), 1, 0, &g).unwrap();
        assert_eq!(s.progress().step, 2);
        // Leases run out for workers 1 and 3; worker 0 alone completes steps.
        std::thread::sleep(Duration::from_millis(60));
        s.heartbeat(&TaskId::new("worker", 0));
        let expired = s.expire_leases(Instant::now());
        assert_eq!(expired, vec!["worker:1".to_string(), "worker:3".to_string()]);
        s.push(&TaskId::new("worker", 0), 2, 0, &g).unwrap();
        assert_eq!(s.progress().step, 3);
        assert_eq!(s.live_tasks(), vec!["worker:0".to_string()]);
    }

    fn shard_request(task: u32, finished: Option<(u64, u64, u64)>, want: bool) -> proto::NextShardRequest {
        proto::NextShardRequest {
            task: tid("worker", task),
            plan: Some(proto::DatasetPlan { examples: 25, shard_size: 10, seed: 3, num_epochs: 1 }),
            finished: finished.map(|(epoch, index, _)| proto::ShardRef { epoch, index }),
            want,
            generation: finished.map_or(0, |(_, _, g)| g),
        }
    }

    fn assigned(r: &proto::NextShardReply) -> (u64, u64, u64) {
        assert_eq!(r.outcome, proto::next_shard_reply::Outcome::Assigned as i32, "{r:?}");
        let s = r.shard.unwrap();
        (s.epoch, s.index, r.generation)
    }

    /// The dispatcher on ps 0: shards handed out and reported; a worker that
    /// leaves or whose lease expires gives its shard back; a report from
    /// before a restart (another generation) does not count.
    #[test]
    fn ps_0_dispatches_shards() {
        let s = ParameterStore::new(PsConfig { lease: Duration::from_millis(50), ..PsConfig::new(0, 1, Some(TaskId::new("worker", 0))) });
        let a = assigned(&s.next_shard(&shard_request(0, None, true)).unwrap());
        let b = assigned(&s.next_shard(&shard_request(1, None, true)).unwrap());
        let c = assigned(&s.next_shard(&shard_request(2, None, true)).unwrap());
        // 25 examples in shards of 10: three shards, all handed out.
        let wait = s.next_shard(&shard_request(3, None, true)).unwrap();
        assert_eq!(wait.outcome, proto::next_shard_reply::Outcome::Wait as i32);
        // worker 1 leaves (scale-down): its shard goes to worker 3.
        s.leave(&TaskId::new("worker", 1));
        let again = assigned(&s.next_shard(&shard_request(3, None, true)).unwrap());
        assert_eq!((again.0, again.1), (b.0, b.1));
        // worker 2's lease expires: its shard waits for the next asker.
        std::thread::sleep(Duration::from_millis(60));
        for w in [0, 3] {
            s.heartbeat(&TaskId::new("worker", w));
        }
        s.expire_leases(Instant::now());
        // A report from another generation (before a restart) does not
        // count: worker 0's shard is given back like any abandoned one.
        let p = s.next_shard(&shard_request(0, Some((a.0, a.1, a.2 + 2)), false)).unwrap().progress.unwrap();
        assert_eq!(p.shards_done, 0);
        let x = assigned(&s.next_shard(&shard_request(0, None, true)).unwrap());
        let y = assigned(&s.next_shard(&shard_request(3, Some(again), true)).unwrap());
        let mut redone = vec![(x.0, x.1), (y.0, y.1)];
        redone.sort();
        let mut lost = vec![(a.0, a.1), (c.0, c.1)];
        lost.sort();
        assert_eq!(redone, lost, "worker 2's and worker 0's shards are trained again");
        s.next_shard(&shard_request(0, Some(x), false)).unwrap();
        let done = s.next_shard(&shard_request(3, Some(y), true)).unwrap();
        assert_eq!(done.outcome, proto::next_shard_reply::Outcome::Finished as i32);
        let p = done.progress.unwrap();
        assert_eq!((p.epochs_completed, p.examples_trained, p.shards_redone, p.finished), (1, 25, 3, true));
        assert_eq!(s.stats().dispatch.unwrap().examples_trained, 25);
        // Bad requests change nothing.
        let other_plan = proto::NextShardRequest {
            plan: Some(proto::DatasetPlan { examples: 26, ..shard_request(0, None, true).plan.unwrap() }),
            ..shard_request(0, None, true)
        };
        let cases = vec![
            (other_plan, "dataset plan mismatch: examples in the training set: the job's is 25, the caller's is 26"),
            (proto::NextShardRequest { plan: None, ..shard_request(0, None, true) }, "plan: missing"),
            (shard_request(0, Some((0, 7, y.2)), true), "shard 7 of epoch 0 does not exist"),
        ];
        for (req, want) in cases {
            let err = s.next_shard(&req).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        assert_eq!(s.stats().dispatch.unwrap().examples_trained, 25);
        let ps1 = ParameterStore::new(PsConfig::new(1, 2, None));
        assert!(ps1.next_shard(&shard_request(0, None, true)).unwrap_err().to_string().contains("runs on ps 0; this is ps 1"));
    }

    /// Sync: a task with nothing to train abstains; the step completes with
    /// the gradients of the others, never with abstentions alone.
    #[test]
    fn idle_workers_abstain() {
        let s = store(UpdateMode::Sync, 3);
        let g = |v: f32| [part("b", &[1], 0, &[v]), part("w", &[3], 0, &[0.0, 0.0, 0.0])];
        assert!(s.abstain(&TaskId::new("worker", 2), 0).unwrap().accepted);
        assert!(!s.abstain(&TaskId::new("worker", 2), 0).unwrap().accepted, "once per step");
        s.push(&TaskId::new("worker", 0), 0, 0, &g(1.0)).unwrap();
        assert_eq!(s.progress().step, 0);
        s.push(&TaskId::new("worker", 1), 0, 0, &g(3.0)).unwrap();
        assert_eq!(s.progress().step, 1);
        // b = 0 - 0.5 * mean(1, 3)
        assert_eq!(s.values("b").unwrap(), vec![-1.0]);
        for w in 0..3 {
            s.abstain(&TaskId::new("worker", w), 1).unwrap();
        }
        assert_eq!(s.progress().step, 1, "no gradient, no step");
        let late = s.abstain(&TaskId::new("worker", 0), 0).unwrap();
        assert!(!late.accepted && late.step == 1);
        assert!(s.abstain(&TaskId::new("worker", 0), 9).unwrap_err().to_string().contains("step: 9 is not a step of this ps"));
        // Async: nothing to count.
        let a = store(UpdateMode::Async, 1);
        assert!(!a.abstain(&TaskId::new("worker", 1), 0).unwrap().accepted);
        assert_eq!(a.progress().step, 0);
    }

    /// Without --replicas_to_aggregate a task takes the chief's aggregation:
    /// a worker that sees another number of training tasks joins.
    #[test]
    fn followers_take_the_chief_s_aggregation() {
        let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
        let follow = |n: u32| proto::TrainingConfig { follow_chief_aggregation: true, total_num_replicas: n, ..config(UpdateMode::Sync, n) };
        let hs = |i: u32, c: proto::TrainingConfig| proto::HandshakeRequest {
            task: tid("worker", i),
            config: Some(c),
            variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }],
            placement_fingerprint: 7,
            num_ps: 1,
            observer: false,
        };
        // A worker with a view of 4 shakes hands before the chief (view: 2) initialises.
        s.handshake(&hs(3, follow(4))).unwrap();
        let init = vec![proto::InitVariablesRequest {
            task: tid("worker", 0),
            config: Some(follow(2)),
            placement_fingerprint: 7,
            part: Some(part("b", &[1], 0, &[0.0])),
            step: 0,
            embeddings: vec![],
        }];
        s.init(&init).unwrap();
        assert_eq!(s.stats().replicas_to_aggregate, 2, "the chief decides");
        let r = s.handshake(&hs(1, follow(1))).unwrap();
        assert_eq!(r.agreed.unwrap().replicas_to_aggregate, 2);
        assert_eq!(r.chief, tid("worker", 0));
        // Given explicitly and differently, the counts must agree.
        let err = s.handshake(&hs(2, config(UpdateMode::Sync, 3))).unwrap_err().to_string();
        assert!(err.contains("training configuration mismatch"), "{err}");
        assert!(err.contains("give every task the same --replicas_to_aggregate"), "{err}");
        s.handshake(&hs(2, config(UpdateMode::Sync, 2))).expect("the same count, given explicitly, with another view of the cluster");
        let err =
            s.handshake(&hs(2, follow(2))).and(s.handshake(&hs(2, proto::TrainingConfig { optimizer: Some(Optimizer::sgd(0.1).to_proto()), ..follow(2) })));
        assert!(err.unwrap_err().to_string().contains("training configuration mismatch"), "the optimizer is still compared");
    }

    #[test]
    fn a_ps_that_does_not_know_the_ps_count_learns_it() {
        let s = ParameterStore::new(PsConfig::new(1, 0, None));
        let hs = |n: u32| proto::HandshakeRequest { task: tid("worker", 0), config: Some(config(UpdateMode::Async, 0)), num_ps: n, ..Default::default() };
        assert!(s.handshake(&hs(1)).is_err(), "ps 1 cannot be one of 1");
        assert_eq!(s.num_ps(), 0);
        s.handshake(&hs(3)).unwrap();
        assert_eq!(s.num_ps(), 3);
        assert!(s.handshake(&hs(2)).unwrap_err().to_string().contains("the caller sees 2 ps task(s), this ps is one of 3"));
    }

    /// The dispatcher's state travels in ps 0's checkpoint shard: restored,
    /// the shards in flight come back as todo.
    #[test]
    fn the_dispatcher_is_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(UpdateMode::Async, 1);
        let a = assigned(&s.next_shard(&shard_request(1, None, true)).unwrap());
        let b = assigned(&s.next_shard(&shard_request(2, None, true)).unwrap());
        s.next_shard(&shard_request(1, Some(a), false)).unwrap();
        let req = proto::SaveCheckpointRequest { task: tid("worker", 0), directory: dir.path().display().to_string(), step: 0 };
        let info: checkpoint::ShardInfo = serde_json::from_str(&s.save_checkpoint(&TaskId::new("worker", 0), &req).unwrap().shard_info_json).unwrap();
        let location = crate::storage::Location::local(dir.path()).unwrap();
        checkpoint::write_index(&location, 0, 1, &[info]).unwrap();
        let ckpt = checkpoint::latest_complete(&location, 1).unwrap().unwrap();
        let restored = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
        restored.restore(&checkpoint::read_shard(&ckpt, 0).unwrap(), 0, 1).unwrap();
        let p = restored.stats().dispatch.unwrap();
        assert_eq!((p.shards_done, p.examples_trained), (1, 10));
        let redo = assigned(&restored.next_shard(&shard_request(3, None, true)).unwrap());
        assert_eq!((redo.0, redo.1), (b.0, b.1), "the shard in flight at the checkpoint is trained again");
        assert_eq!(restored.stats().dispatch.unwrap().shards_redone, 1);
        assert_ne!(redo.2, b.2, "a new generation");
    }

    // ------------------------------------------------------------ embeddings

    /// Partition 1 of 2 (mod) of a 10 × 2 embedding `emb`, uniform(-0.5, 0.5)
    /// rows from seed 7, beside the dense `b`.
    fn emb_spec() -> proto::VariableSpec {
        let part = EmbeddingPart {
            variable: "emb".into(),
            rows: 10,
            dim: 2,
            strategy: crate::placement::PartitionStrategy::Mod,
            partition: 1,
            num_partitions: 2,
            init: crate::init::RowInit::new("emb", crate::init::Init::Uniform { limit: 0.5 }, 7),
        };
        proto::VariableSpec { name: "emb/part_1".into(), dtype: DataType::DtFloat as i32, shape: vec![5, 2], embedding: Some(part.to_proto()) }
    }

    fn sparse_store(mode: UpdateMode, required: u32, optimizer: Optimizer) -> ParameterStore {
        let s = ParameterStore::new(PsConfig::new(1, 2, Some(TaskId::new("worker", 0))));
        let msgs = vec![proto::InitVariablesRequest {
            task: tid("worker", 0),
            config: Some(proto::TrainingConfig { optimizer: Some(optimizer.to_proto()), ..config(mode, required) }),
            placement_fingerprint: 7,
            part: Some(part("b", &[1], 0, &[0.0])),
            step: 0,
            embeddings: vec![emb_spec()],
        }];
        s.init(&msgs).unwrap();
        s
    }

    fn rows_part(ids: &[i64], values: &[f32]) -> RowsPart {
        let mut content = crate::le::i64_bytes(ids);
        content.extend_from_slice(&f32_to_bytes(values));
        RowsPart { name: "emb/part_1".into(), count: ids.len() as u64, content: content.into() }
    }

    fn initial_rows(ids: &[i64]) -> Vec<f32> {
        let init = crate::init::RowInit::new("emb", crate::init::Init::Uniform { limit: 0.5 }, 7);
        let mut out = vec![0.0; ids.len() * 2];
        for (k, &id) in ids.iter().enumerate() {
            init.fill(id, &mut out[k * 2..k * 2 + 2]);
        }
        out
    }

    /// Rows are pulled by id (their initial value until updated), pushed
    /// row-sparse and updated on their own; the ps holds only the rows it
    /// updated; the dense variables keep their path.
    #[test]
    fn embedding_rows_are_pulled_and_pushed_by_id() {
        let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
        let ask = |ids: &[i64]| proto::RowsRequest { name: "emb/part_1".into(), ids: crate::le::i64_bytes(ids).into() };
        let (_, (parts, rows)) = s.pull_snapshot(&[], &[ask(&[9, 1, 5])], 1 << 20).unwrap();
        assert_eq!(parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["b"], "the dense variables only");
        assert_eq!(rows, vec![PulledRows { name: "emb/part_1".into(), dim: 2, ids: vec![9, 1, 5], values: initial_rows(&[9, 1, 5]) }]);
        assert_eq!(s.rows("emb/part_1", &[]).unwrap().1, 0, "a pull materialises nothing");
        let r = s.push_with_rows(&TaskId::new("worker", 1), 0, 0, &[part("b", &[1], 0, &[1.0])], &[rows_part(&[5], &[2.0, -2.0])]).unwrap();
        assert!(r.accepted && r.step == 1);
        let (got, held) = s.rows("emb/part_1", &[1, 5]).unwrap();
        let before = initial_rows(&[1, 5]);
        assert_eq!(got, vec![before[0], before[1], before[2] - 1.0, before[3] + 1.0]);
        assert_eq!(held, 1, "only row 5 was updated");
        assert_eq!(s.values("b").unwrap(), vec![-0.5]);
        let stats = s.stats();
        let v = stats.variables.iter().find(|v| v.name == "emb/part_1").unwrap();
        assert_eq!((v.rows, v.bytes), (1, 2 * 4 + 8));
        // Over the tensor channel's path, the same rows.
        let (_, (shared, rows)) = s.shared_pull(&[], &[ask(&[5])]).unwrap();
        assert_eq!((shared.len(), rows[0].values.clone()), (1, vec![before[2] - 1.0, before[3] + 1.0]));
        // Encoded for gRPC: pieces of whole rows.
        let pieces = PulledRows { name: "e".into(), dim: 2, ids: vec![1, 3, 5], values: vec![0.0; 6] }.encode(32);
        assert_eq!(pieces.iter().map(|p| (p.count, p.content.len())).collect::<Vec<_>>(), vec![(2, 32), (1, 16)]);
    }

    /// Every malformed sparse request is refused with an error naming what
    /// is wrong, and changes nothing.
    #[test]
    fn bad_rows_are_refused_and_change_nothing() {
        let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
        let w = TaskId::new("worker", 1);
        let b = || part("b", &[1], 0, &[1.0]);
        let named = |name: &str, p: RowsPart| RowsPart { name: name.into(), ..p };
        let cases: Vec<(&str, Vec<RowsPart>, &str)> = vec![
            ("id outside the table", vec![rows_part(&[11], &[1.0, 1.0])], "id 11 is outside the table (0..10)"),
            ("negative id", vec![rows_part(&[-1], &[1.0, 1.0])], "id -1 is outside the table"),
            ("id of another partition", vec![rows_part(&[4], &[1.0, 1.0])], "id 4 belongs to partition 0 (mod), not 1"),
            ("duplicate id", vec![rows_part(&[3, 3], &[1.0; 4])], "id 3 appears twice in one request"),
            ("duplicate id across pieces", vec![rows_part(&[3], &[1.0; 2]), rows_part(&[1, 3], &[1.0; 4])], "id 3 appears twice"),
            ("values that do not match dim", vec![rows_part(&[3], &[1.0; 3])], "1 ids need 16 bytes of ids and values (dim 2), the request carries 20"),
            ("count that does not match", vec![RowsPart { count: 2, ..rows_part(&[3], &[1.0; 2]) }], "2 ids need 32 bytes"),
            ("unknown partition", vec![named("nope", rows_part(&[3], &[1.0; 2]))], "variable \"nope\" is not on this ps"),
            ("rows of a dense variable", vec![named("b", rows_part(&[0], &[1.0; 2]))], "variable \"b\" is not an embedding"),
        ];
        for (name, rows, want) in cases {
            let err = s.push_with_rows(&w, 0, 0, &[b()], &rows).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
        let err = s.push_with_rows(&w, 0, 0, &[part("emb/part_1", &[5, 2], 0, &[0.0; 10])], &[]).unwrap_err().to_string();
        assert!(err.contains("is an embedding partition: push its rows by id"), "{err}");
        let ask = |ids: &[i64]| proto::RowsRequest { name: "emb/part_1".into(), ids: crate::le::i64_bytes(ids).into() };
        assert!(s.pull_snapshot(&[], &[ask(&[2])], 1024).unwrap_err().to_string().contains("id 2 belongs to partition 0"));
        assert!(s.pull_snapshot(&["emb/part_1".into()], &[], 1024).unwrap_err().to_string().contains("pull its rows by id"));
        let ragged = proto::RowsRequest { name: "emb/part_1".into(), ids: vec![0u8; 7].into() };
        assert!(s.pull_snapshot(&[], &[ragged], 1024).unwrap_err().to_string().contains("7 bytes of ids"));
        assert_eq!(s.progress().step, 0);
        assert_eq!(s.values("b").unwrap(), vec![0.0]);
        assert_eq!(s.rows("emb/part_1", &[1, 3]).unwrap(), (initial_rows(&[1, 3]), 0), "no row changed or appeared");
        // A bad embedding spec at handshake is named too.
        let mut spec = emb_spec();
        spec.embedding.as_mut().unwrap().partition = 2;
        let hs = proto::HandshakeRequest {
            task: tid("worker", 1),
            config: Some(config(UpdateMode::Async, 1)),
            variables: vec![spec],
            placement_fingerprint: 7,
            num_ps: 2,
            observer: false,
        };
        assert!(s.handshake(&hs).unwrap_err().to_string().contains("partition: 2 is not in 0..2"));
    }

    /// Sync: rows pushed by several workers are averaged per row over the
    /// gradients that held them, then applied with row-wise Adagrad state.
    #[test]
    fn sync_rows_of_several_workers_are_aggregated_per_row() {
        let opt = Optimizer::from_name("adagrad", 0.1, 0.0).unwrap();
        let s = sparse_store(UpdateMode::Sync, 3, opt);
        let push = |w: u32, ids: &[i64], values: &[f32]| {
            s.push_with_rows(&TaskId::new("worker", w), 0, 0, &[part("b", &[1], 0, &[0.0])], &[rows_part(ids, values)]).unwrap()
        };
        push(0, &[1, 3], &[1.0, 1.0, 2.0, 2.0]);
        push(1, &[3], &[4.0, 4.0]);
        assert_eq!(s.progress().step, 0);
        assert_eq!(s.rows("emb/part_1", &[]).unwrap().1, 0, "nothing applied before the step completes");
        push(2, &[], &[]);
        assert_eq!(s.progress().step, 1);
        // Row 1: one gradient (1, 1); row 3: (2 + 4) / 2 = 3. Adagrad from 0.1.
        let init = initial_rows(&[1, 3, 7]);
        let adagrad = |w: f32, g: f32| w - 0.1 * g / (0.1 + g * g).sqrt();
        let (got, held) = s.rows("emb/part_1", &[1, 3, 7]).unwrap();
        let want = [adagrad(init[0], 1.0), adagrad(init[1], 1.0), adagrad(init[2], 3.0), adagrad(init[3], 3.0), init[4], init[5]];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        assert_eq!(held, 2);
        // A stale sparse push changes nothing.
        let r = push(0, &[7], &[5.0, 5.0]);
        assert!(r.stale && !r.accepted);
        assert_eq!(s.rows("emb/part_1", &[7]).unwrap().0, init[4..].to_vec());
    }

    /// The materialised rows (ids, values, slots) travel in the checkpoint
    /// shard; restored, the ps answers the same rows, the others still from
    /// their initial value, and the row-wise slots go on.
    #[test]
    fn embedding_rows_are_checkpointed_and_restored() {
        let dir = tempfile::tempdir().unwrap();
        let opt = Optimizer::from_name("ftrl", 0.1, 0.0).unwrap();
        let s = sparse_store(UpdateMode::Async, 1, opt);
        let w = TaskId::new("worker", 1);
        s.push_with_rows(&w, 0, 0, &[], &[rows_part(&[3, 9], &[1.0, -1.0, 0.5, 0.5])]).unwrap();
        let req = proto::SaveCheckpointRequest { task: tid("worker", 0), directory: dir.path().display().to_string(), step: 1 };
        let info: checkpoint::ShardInfo = serde_json::from_str(&s.save_checkpoint(&TaskId::new("worker", 0), &req).unwrap().shard_info_json).unwrap();
        assert_eq!(info.row_ids, vec![checkpoint::TensorEntry { name: "emb/part_1:ids".into(), shape: vec![2] }]);
        // ps 0's shard: an empty one is enough for the index here.
        let at = crate::storage::Location::local(dir.path()).unwrap();
        let empty = checkpoint::write_shard(&at, 1, 0, 2, &checkpoint::ShardData::default()).unwrap();
        checkpoint::write_index(&at, 1, 2, &[empty, info]).unwrap();
        let ckpt = checkpoint::latest_complete(&at, 2).unwrap().unwrap();
        let text = checkpoint::inspect(&at).unwrap();
        assert!(text.contains("row ids   emb/part_1:ids  2 row(s) materialised"), "{text}");
        let restored = ParameterStore::new(PsConfig::new(1, 2, Some(TaskId::new("worker", 0))));
        restored.restore(&checkpoint::read_shard(&ckpt, 1).unwrap(), 1, 2).unwrap();
        assert_eq!(restored.rows("emb/part_1", &[1, 3, 9]), s.rows("emb/part_1", &[1, 3, 9]));
        // The first handshake brings the configuration; the specs match the restored ones.
        let hs = proto::HandshakeRequest {
            task: tid("worker", 1),
            config: Some(proto::TrainingConfig { optimizer: Some(opt.to_proto()), ..config(UpdateMode::Async, 1) }),
            variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }, emb_spec()],
            placement_fingerprint: 7,
            num_ps: 2,
            observer: false,
        };
        restored.handshake(&hs).unwrap();
        // Both go on identically (FTRL's row-wise n and z came back).
        for st in [&s, &restored] {
            st.push_with_rows(&w, 1, 0, &[part("b", &[1], 0, &[0.0])], &[rows_part(&[3, 7], &[0.25, 0.25, 1.0, 1.0])]).unwrap();
        }
        assert_eq!(restored.rows("emb/part_1", &[1, 3, 7, 9]), s.rows("emb/part_1", &[1, 3, 7, 9]));
    }

    proptest::proptest! {
        /// Malformed sparse pushes (any ids, any count, any bytes) never
        /// panic the ps and never change a row: either the whole push is
        /// valid and applied, or nothing changes.
        #[test]
        fn malformed_sparse_pushes_never_change_a_row(
            ids in proptest::collection::vec(-3i64..14, 0..6),
            count_delta in -1i64..2,
            extra_bytes in 0usize..9,
            value in -4.0f32..4.0,
        ) {
            let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
            let all: Vec<i64> = (0..10).filter(|i| i % 2 == 1).collect();
            let before = s.rows("emb/part_1", &all).unwrap();
            let mut content = crate::le::i64_bytes(&ids);
            content.extend(std::iter::repeat_n(value.to_le_bytes(), ids.len() * 2).flatten());
            content.extend(std::iter::repeat_n(0u8, extra_bytes));
            let count = (ids.len() as i64 + count_delta).max(0) as u64;
            let rows = RowsPart { name: "emb/part_1".into(), count, content: content.into() };
            let valid = count == ids.len() as u64
                && extra_bytes == 0
                && ids.iter().all(|&id| (0..10).contains(&id) && id % 2 == 1)
                && ids.iter().collect::<BTreeSet<_>>().len() == ids.len();
            let result = s.push_with_rows(&TaskId::new("worker", 1), 0, 0, &[], &[rows]);
            proptest::prop_assert_eq!(result.is_ok(), valid, "{:?}", result);
            if !valid {
                proptest::prop_assert_eq!(s.rows("emb/part_1", &all).unwrap(), before);
                proptest::prop_assert_eq!(s.progress().step, 0);
            }
        }
    }
}

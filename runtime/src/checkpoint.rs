//! Checkpoints of the variables held by the ps tasks, and their restore.
//!
//! # Layout
//!
//! ```text
//! DIR/ckpt-0000001200/                         one directory per checkpoint; the step, zero-padded to 10 digits
//!     shard-00000-of-00002.safetensors         written by ps 0 (write_shard)
//!     shard-00001-of-00002.safetensors         written by ps 1
//!     index.json                               written last, by the chief (write_index)
//! ```
//!
//! A shard is a [safetensors](https://github.com/huggingface/safetensors) file:
//! every variable of the ps as an `F32` tensor under its own name, every
//! optimizer slot as an `F32` tensor under the name the ps gives it
//! (conventionally `<variable>:slot0`, `<variable>:slot1`), and every update
//! counter as a one-element `U64` tensor named `<key>:updates`. Its `__metadata__`
//! holds `format` (`tfjob-checkpoint-shard/1`), `global_step`, `ps_index`,
//! `num_ps`, `slots` (a JSON array of the slot tensor names) and `updates` (a
//! JSON array of the update-counter keys), so the file is self-describing and
//! any safetensors reader can open it. The shard of ps 0 also holds the shard
//! dispatcher's state (JSON) under `dispatcher`.
//!
//! An embedding partition holds only its materialised rows: its values as an
//! `F32` tensor `[rows, dim]` under its own name (and its slots likewise),
//! the rows' ids as an `I64` tensor `[rows]` named `<partition>:ids`, listed
//! in the metadata `row_ids` (a JSON array of partition names), and the
//! partition's description (table size, strategy, initializer: what gives
//! every other row its value) in the metadata `embeddings` (a JSON object by
//! partition name).
//!
//! `index.json` records `format` (`tfjob-checkpoint/1`), `global_step`,
//! `num_ps`, the creation time, `checksum: "crc32c"` and, for every shard: its
//! file name, size in bytes, the CRC-32C of the whole file (8 hex digits, the
//! same Castagnoli CRC as TFRecord and TensorFlow's own checkpoints) and the
//! names and shapes of its variables and slots and its update-counter keys.
//!
//! # Atomicity
//!
//! `DIR` is a local path or an object-store URL (`s3://`, `gs://`, `az://`;
//! see [`crate::storage`]). Every file is written whole or not at all: on an
//! object store a PUT is atomic; locally the file is written to a temporary
//! name, synced, renamed to its final name, and the directory is synced. The
//! index is written only after every shard was, so a crash at any point
//! leaves either no index (**incomplete**) or a checkpoint whose every byte
//! was stored before its index was. A checkpoint is
//! **complete** iff its index exists and parses, and every shard it lists exists
//! with the listed size and checksum and parses as a safetensors file holding
//! exactly the listed tensors and metadata. Anything else with an index is
//! **damaged**. Restore ([`latest_complete`]) takes the newest complete one and
//! logs every newer one it skips.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use safetensors::{Dtype, SafeTensors, View};
use serde::{Deserialize, Serialize};

use crate::storage::{Location, StorageError};

/// Name of the index file inside a checkpoint directory.
pub const INDEX_FILE: &str = "index.json";
/// `format` of `index.json`.
pub const INDEX_FORMAT: &str = "tfjob-checkpoint/1";
/// `format` in the `__metadata__` of every shard.
pub const SHARD_FORMAT: &str = "tfjob-checkpoint-shard/1";
/// Value of `checksum` in `index.json`: the algorithm of [`ShardInfo::crc32c`].
pub const CHECKSUM_ALGORITHM: &str = "crc32c";
/// Suffix of the tensor that stores an update counter.
pub const UPDATES_SUFFIX: &str = ":updates";
/// Metadata key of the shard dispatcher's state.
pub const DISPATCHER_KEY: &str = "dispatcher";
/// Suffix of the tensor that stores an embedding partition's row ids.
pub const IDS_SUFFIX: &str = ":ids";

const DIR_PREFIX: &str = "ckpt-";

/// A named f32 tensor: name, shape (row-major), values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// What one ps saves and restores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardData {
    /// The variables stored on this ps.
    pub variables: Vec<NamedTensor>,
    /// Optimizer slot tensors (momentum, Adagrad accumulator, Adam's m and v),
    /// named by the ps, conventionally `<variable>:slot0` and `<variable>:slot1`.
    pub slots: Vec<NamedTensor>,
    /// Update counters (Adam's t) by key, conventionally the variable name.
    pub updates: Vec<(String, u64)>,
    /// The shard dispatcher's state (ps 0 only): JSON of
    /// [`crate::dispatch::DispatcherState`], kept in the metadata key
    /// `dispatcher`, so a restarted ps 0 resumes mid-epoch.
    pub dispatcher: Option<String>,
    /// The row ids of each embedding partition, by partition name: its
    /// values (a variable of this name, `[rows, dim]`) and slots hold those
    /// rows in this order.
    pub row_ids: Vec<(String, Vec<i64>)>,
    /// Each embedding partition's description (JSON of
    /// [`crate::embedding::EmbeddingPart`]), by partition name.
    pub embeddings: Vec<(String, String)>,
}

/// An embedding partition's rows as a checkpoint holds them: ids, values
/// (`[ids, dim]`, row after row), the optimizer's two slots, update count.
pub type SavedRows<'a> = (&'a [i64], &'a [f32], [&'a [f32]; 2], u64);

/// The same, owned: what a move puts together is taken as it is, not copied.
pub type OwnedRows = (Vec<i64>, Vec<f32>, [Vec<f32>; 2], u64);

impl ShardData {
    /// Adds a dense variable with its optimizer slots (`<name>:slot0`,
    /// `<name>:slot1`, those it has) and its update count.
    pub fn push_dense(&mut self, name: &str, shape: &[usize], values: &[f32], slots: [&[f32]; 2], updates: u64) {
        self.push_dense_owned(name, shape, values.to_vec(), slots.map(<[f32]>::to_vec), updates);
    }

    /// [`push_dense`](Self::push_dense) of vectors it takes.
    pub fn push_dense_owned(&mut self, name: &str, shape: &[usize], values: Vec<f32>, slots: [Vec<f32>; 2], updates: u64) {
        self.variables.push((name.to_string(), shape.to_vec(), values));
        self.push_slots(name, shape, slots, updates);
    }

    /// Adds an embedding partition's materialised rows ([`SavedRows`]): its
    /// values (`[rows, dim]`) and slots under the partition's name, the ids under
    /// `<name>:ids`, and the partition's description (`part`, JSON of
    /// [`crate::embedding::EmbeddingPart`]).
    pub fn push_rows(&mut self, name: &str, dim: usize, (ids, values, slots, updates): SavedRows<'_>, part: String) {
        self.push_rows_owned(name, dim, (ids.to_vec(), values.to_vec(), slots.map(<[f32]>::to_vec), updates), part);
    }

    /// [`push_rows`](Self::push_rows) of vectors it takes.
    pub fn push_rows_owned(&mut self, name: &str, dim: usize, (ids, values, slots, updates): OwnedRows, part: String) {
        let shape = [ids.len(), dim];
        self.variables.push((name.to_string(), shape.to_vec(), values));
        self.push_slots(name, &shape, slots, updates);
        self.row_ids.push((name.to_string(), ids));
        self.embeddings.push((name.to_string(), part));
    }

    /// Adds everything of another ps's shard (the first dispatcher state found stays).
    pub fn merge(&mut self, s: ShardData) {
        self.variables.extend(s.variables);
        self.slots.extend(s.slots);
        self.updates.extend(s.updates);
        self.row_ids.extend(s.row_ids);
        self.embeddings.extend(s.embeddings);
        self.dispatcher = self.dispatcher.take().or(s.dispatcher);
    }

    fn push_slots(&mut self, name: &str, shape: &[usize], slots: [Vec<f32>; 2], updates: u64) {
        for (k, slot) in slots.into_iter().enumerate() {
            if !slot.is_empty() {
                self.slots.push((format!("{name}:slot{k}"), shape.to_vec(), slot));
            }
        }
        self.updates.push((name.to_string(), updates));
    }
}

/// Name and shape of one tensor of a shard, as listed in `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
}

/// One written shard: what a ps reports to the chief, and what `index.json` lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub ps_index: usize,
    pub num_ps: usize,
    pub global_step: i64,
    /// File name inside the checkpoint directory ([`shard_file_name`]).
    pub file: String,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// CRC-32C of the whole file.
    #[serde(with = "hex_u32")]
    pub crc32c: u32,
    pub variables: Vec<TensorEntry>,
    pub slots: Vec<TensorEntry>,
    /// Keys of the update counters.
    pub updates: Vec<String>,
    /// The row ids of embedding partitions (`<partition>:ids`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_ids: Vec<TensorEntry>,
}

/// The job's layout when a checkpoint was written (elastic parameter
/// servers): its version and every ps task's address, so that ps tasks
/// restarted with an older `TF_CONFIG` serve the layout the job had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRecord {
    pub version: u64,
    pub ps_addresses: Vec<String>,
}

/// A complete checkpoint (every shard verified when it was found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The checkpoint directory, `DIR/ckpt-<step>`.
    pub path: Location,
    pub global_step: i64,
    pub num_ps: usize,
    pub created_unix_secs: u64,
    /// One per ps, in ps order.
    pub shards: Vec<ShardInfo>,
    /// Absent in checkpoints written before layouts had versions (version 1).
    pub layout: Option<LayoutRecord>,
}

/// State of one `ckpt-*` directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointStatus {
    Complete(Checkpoint),
    /// No index: the chief had not finished it (a crash, or it is being written).
    Incomplete(String),
    /// It has an index, but something it lists is missing, truncated, corrupted or inconsistent.
    Damaged(String),
}

/// One `ckpt-*` directory found by [`list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointListing {
    pub step: i64,
    pub path: Location,
    pub status: CheckpointStatus,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint file {0}")]
    Io(#[from] StorageError),
    #[error("checkpoint {path}: {reason}")]
    InvalidArgument { path: Location, reason: String },
    #[error("checkpoint {path} is incomplete: {reason}")]
    Incomplete { path: Location, reason: String },
    #[error("checkpoint file {path} is damaged: {reason}")]
    Damaged { path: Location, reason: String },
    #[error("checkpoint {path} is already complete; refusing to overwrite its shards")]
    AlreadyComplete { path: Location },
}

impl CheckpointError {
    /// Whether a later try may succeed: only storage that could not be reached.
    pub fn is_transient(&self) -> bool {
        matches!(self, CheckpointError::Io(e) if e.is_transient())
    }
}

fn damaged(path: &Location, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Damaged { path: path.clone(), reason: reason.into() }
}

fn invalid(path: &Location, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::InvalidArgument { path: path.clone(), reason: reason.into() }
}

mod hex_u32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:08x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() != 8 {
            return Err(D::Error::custom(format!("checksum {s:?} is not 8 hex digits")));
        }
        u32::from_str_radix(&s, 16).map_err(|e| D::Error::custom(format!("checksum {s:?}: {e}")))
    }
}

/// `index.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IndexFile {
    format: String,
    global_step: i64,
    num_ps: usize,
    created_unix_secs: u64,
    /// The same instant, RFC 3339 UTC, for people.
    created: String,
    checksum: String,
    shards: Vec<ShardInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    layout: Option<LayoutRecord>,
}

/// `DIR/ckpt-<step zero-padded to 10 digits>`.
pub fn checkpoint_path(dir: &Location, step: i64) -> Location {
    dir.child(&format!("{DIR_PREFIX}{step:010}"))
}

/// `shard-<ps_index>-of-<num_ps>.safetensors`, both zero-padded to 5 digits.
pub fn shard_file_name(ps_index: usize, num_ps: usize) -> String {
    format!("shard-{ps_index:05}-of-{num_ps:05}.safetensors")
}

/// The step of a checkpoint directory name, if it is one (exactly as [`checkpoint_path`] names it).
fn parse_dir_name(name: &str) -> Option<i64> {
    let digits = name.strip_prefix(DIR_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: i64 = digits.parse().ok()?;
    (format!("{step:010}") == digits).then_some(step)
}

/// A tensor to serialize: dtype, shape and its little-endian bytes.
struct RawTensor<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: std::borrow::Cow<'a, [u8]>,
}

impl View for &RawTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn f32_bytes(values: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    #[cfg(target_endian = "little")]
    {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(values))
    }
    #[cfg(not(target_endian = "little"))]
    {
        std::borrow::Cow::Owned(crate::le::f32_bytes(values))
    }
}

fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Checks names and shapes of what a ps wants to save; returns the tensor list.
fn prepare_tensors<'a>(path: &Location, data: &'a ShardData) -> Result<Vec<(String, RawTensor<'a>)>, CheckpointError> {
    let mut tensors = Vec::with_capacity(data.variables.len() + data.slots.len() + data.updates.len());
    let mut seen = BTreeSet::new();
    let mut check_name = |kind: &str, name: &str| {
        if name.is_empty() {
            return Err(invalid(path, format!("a {kind} has an empty name")));
        }
        if !seen.insert(name.to_string()) {
            return Err(invalid(path, format!("tensor name {name:?} ({kind}) is used twice")));
        }
        Ok(())
    };
    for (kind, list) in [("variable", &data.variables), ("slot", &data.slots)] {
        for (name, shape, values) in list {
            check_name(kind, name)?;
            match element_count(shape) {
                Some(n) if n == values.len() => {}
                _ => {
                    return Err(invalid(path, format!("{kind} {name:?}: shape {shape:?} does not hold {} values", values.len())));
                }
            }
            tensors.push((name.clone(), RawTensor { dtype: Dtype::F32, shape: shape.clone(), data: f32_bytes(values) }));
        }
    }
    for (key, count) in &data.updates {
        if key.is_empty() {
            return Err(invalid(path, "an update counter has an empty key"));
        }
        let name = format!("{key}{UPDATES_SUFFIX}");
        check_name("update counter", &name)?;
        let bytes = count.to_le_bytes().to_vec();
        tensors.push((name, RawTensor { dtype: Dtype::U64, shape: vec![1], data: bytes.into() }));
    }
    for (partition, ids) in &data.row_ids {
        let rows = data.variables.iter().find(|(n, _, _)| n == partition).map(|(_, shape, _)| shape.first().copied().unwrap_or(0));
        if rows != Some(ids.len()) {
            return Err(invalid(path, format!("row ids of {partition:?}: {} ids, but its values hold {rows:?} rows", ids.len())));
        }
        if !data.embeddings.iter().any(|(n, _)| n == partition) {
            return Err(invalid(path, format!("embedding partition {partition:?} has no description")));
        }
        let name = format!("{partition}{IDS_SUFFIX}");
        check_name("row ids", &name)?;
        let bytes = crate::le::i64_bytes(ids);
        tensors.push((name, RawTensor { dtype: Dtype::I64, shape: vec![ids.len()], data: bytes.into() }));
    }
    Ok(tensors)
}

/// Writes ps `ps_index`'s shard of the checkpoint at `step` into
/// `dir/ckpt-<step>/shard-<ps_index>-of-<num_ps>.safetensors`, atomically and
/// durably, and returns what the chief needs for the index.
///
/// Several ps tasks may write their shards into the same checkpoint at once.
/// If that checkpoint already has an index, a complete one is never touched
/// ([`CheckpointError::AlreadyComplete`]); a damaged one (e.g. left by a crashed
/// run that reached this step before) loses its index first, so it reads as
/// incomplete until the chief writes a new index.
pub fn write_shard(dir: &Location, step: i64, ps_index: usize, num_ps: usize, data: &ShardData) -> Result<ShardInfo, CheckpointError> {
    let ckpt = checkpoint_path(dir, step);
    if step < 0 {
        return Err(invalid(&ckpt, format!("global step {step} is negative")));
    }
    if num_ps == 0 || ps_index >= num_ps {
        return Err(invalid(&ckpt, format!("ps index {ps_index} is not in 0..{num_ps}")));
    }
    let file = shard_file_name(ps_index, num_ps);
    let shard_path = ckpt.child(&file);
    let tensors = prepare_tensors(&shard_path, data)?;
    let mut metadata: HashMap<String, String> = [
        ("format", SHARD_FORMAT.to_string()),
        ("global_step", step.to_string()),
        ("ps_index", ps_index.to_string()),
        ("num_ps", num_ps.to_string()),
        ("slots", json_names(data.slots.iter().map(|s| &s.0))),
        ("updates", json_names(data.updates.iter().map(|u| &u.0))),
        ("row_ids", json_names(data.row_ids.iter().map(|r| &r.0))),
        ("embeddings", embeddings_json(&data.embeddings).map_err(|e| invalid(&shard_path, e))?),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(state) = &data.dispatcher {
        metadata.insert(DISPATCHER_KEY.to_string(), state.clone());
    }
    let bytes = safetensors::serialize(tensors.iter().map(|(n, t)| (n.clone(), t)), Some(metadata))
        .map_err(|e| invalid(&shard_path, format!("cannot serialize: {e}")))?;

    let index = ckpt.child(INDEX_FILE);
    if index.size()?.is_some() {
        match verify(&ckpt, step) {
            CheckpointStatus::Complete(_) => {
                return Err(CheckpointError::AlreadyComplete { path: ckpt });
            }
            CheckpointStatus::Incomplete(_) => {}
            CheckpointStatus::Damaged(reason) => {
                tracing::warn!(checkpoint = %ckpt, %reason, "rewriting a damaged checkpoint; removing its index first");
                index.delete()?;
            }
        }
    }
    let crc = crc32c::crc32c(&bytes);
    let len = bytes.len() as u64;
    shard_path.write(bytes)?;
    let entries = |list: &[NamedTensor]| list.iter().map(|(name, shape, _)| TensorEntry { name: name.clone(), shape: shape.clone() }).collect();
    Ok(ShardInfo {
        ps_index,
        num_ps,
        global_step: step,
        file,
        bytes: len,
        crc32c: crc,
        variables: entries(&data.variables),
        slots: entries(&data.slots),
        updates: data.updates.iter().map(|(k, _)| k.clone()).collect(),
        row_ids: data.row_ids.iter().map(|(n, ids)| TensorEntry { name: format!("{n}{IDS_SUFFIX}"), shape: vec![ids.len()] }).collect(),
    })
}

/// The embeddings' descriptions as one JSON object (each one already JSON).
fn embeddings_json(embeddings: &[(String, String)]) -> Result<String, String> {
    let mut map = serde_json::Map::new();
    for (name, json) in embeddings {
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("embedding {name:?}: description is not JSON: {e}"))?;
        map.insert(name.clone(), value);
    }
    Ok(serde_json::Value::Object(map).to_string())
}

fn json_names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    serde_json::to_string(&names.collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into())
}

/// The reported shards by ps, each checked: a ps of the job, written for
/// this step and ps count under its own file name, once, and no variable in
/// two of them.
fn shards_by_ps<'a>(ckpt: &Location, step: i64, num_ps: usize, shards: &'a [ShardInfo]) -> Result<BTreeMap<usize, &'a ShardInfo>, CheckpointError> {
    let mut by_ps: BTreeMap<usize, &ShardInfo> = BTreeMap::new();
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for s in shards {
        if s.ps_index >= num_ps {
            return Err(invalid(ckpt, format!("shard of ps {} is not in 0..{num_ps}", s.ps_index)));
        }
        if s.num_ps != num_ps || s.global_step != step {
            return Err(invalid(
                ckpt,
                format!("shard of ps {} was written for step {} with {} ps tasks, not step {step} with {num_ps}", s.ps_index, s.global_step, s.num_ps),
            ));
        }
        if s.file != shard_file_name(s.ps_index, num_ps) {
            return Err(invalid(ckpt, format!("shard of ps {} has an unexpected file name {:?}", s.ps_index, s.file)));
        }
        if by_ps.insert(s.ps_index, s).is_some() {
            return Err(invalid(ckpt, format!("two shards for ps {}", s.ps_index)));
        }
        for v in &s.variables {
            if let Some(other) = owner.insert(&v.name, s.ps_index) {
                return Err(invalid(ckpt, format!("variable {:?} is in the shards of ps {other} and ps {}", v.name, s.ps_index)));
            }
        }
    }
    Ok(by_ps)
}

/// Writes `dir/ckpt-<step>/index.json` (atomically, durably), which makes the
/// checkpoint complete. `shards` are the [`ShardInfo`]s the ps tasks returned;
/// they must be exactly one per ps index in `0..num_ps`, all for `step`, with no
/// variable on two ps tasks, and every shard file must be present with its size.
/// (Their checksums are verified on restore, not here.) Returns the index path.
pub fn write_index(dir: &Location, step: i64, num_ps: usize, shards: &[ShardInfo]) -> Result<Location, CheckpointError> {
    write_index_of(dir, step, num_ps, shards, None)
}

/// [`write_index`] recording the job's layout too.
pub fn write_index_of(dir: &Location, step: i64, num_ps: usize, shards: &[ShardInfo], layout: Option<LayoutRecord>) -> Result<Location, CheckpointError> {
    let ckpt = checkpoint_path(dir, step);
    if step < 0 {
        return Err(invalid(&ckpt, format!("global step {step} is negative")));
    }
    if num_ps == 0 {
        return Err(invalid(&ckpt, "num_ps is 0"));
    }
    let by_ps = shards_by_ps(&ckpt, step, num_ps, shards)?;
    if let Some(missing) = (0..num_ps).find(|i| !by_ps.contains_key(i)) {
        return Err(CheckpointError::Incomplete { path: ckpt, reason: format!("no shard reported for ps {missing} ({} of {num_ps} reported)", by_ps.len()) });
    }
    for s in by_ps.values() {
        let path = ckpt.child(&s.file);
        match path.size()? {
            Some(len) if len == s.bytes => {}
            Some(len) => return Err(damaged(&path, format!("{len} bytes stored, the ps reported {}", s.bytes))),
            None => {
                return Err(CheckpointError::Incomplete { path: ckpt.clone(), reason: format!("{} is missing", s.file) });
            }
        }
    }
    let created_unix_secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let index = IndexFile {
        format: INDEX_FORMAT.to_string(),
        global_step: step,
        num_ps,
        created_unix_secs,
        created: format_utc(created_unix_secs),
        checksum: CHECKSUM_ALGORITHM.to_string(),
        shards: by_ps.into_values().cloned().collect(),
        layout,
    };
    let mut json = serde_json::to_vec_pretty(&index).map_err(|e| invalid(&ckpt, format!("cannot encode index: {e}")))?;
    json.push(b'\n');
    let path = ckpt.child(INDEX_FILE);
    path.write(json)?;
    Ok(path)
}

/// Reads and checks `index.json` of checkpoint directory `ckpt` (named for `step`).
fn read_index(ckpt: &Location, step: i64) -> Result<Checkpoint, CheckpointError> {
    let path = ckpt.child(INDEX_FILE);
    let Some(text) = path.read_if_exists()? else {
        let shards = shard_files(ckpt)?.len();
        return Err(CheckpointError::Incomplete {
            path: ckpt.clone(),
            reason: format!("no {INDEX_FILE} (the chief had not written it); {shards} shard file(s) present"),
        });
    };
    let index: IndexFile = serde_json::from_slice(&text).map_err(|e| damaged(&path, format!("does not parse as a checkpoint index: {e}")))?;
    if index.format != INDEX_FORMAT {
        return Err(damaged(&path, format!("format is {:?}, expected {INDEX_FORMAT:?}", index.format)));
    }
    if index.checksum != CHECKSUM_ALGORITHM {
        return Err(damaged(&path, format!("unknown checksum algorithm {:?}", index.checksum)));
    }
    if index.global_step != step {
        return Err(damaged(&path, format!("global_step is {}, but the directory is for step {step}", index.global_step)));
    }
    if index.num_ps == 0 || index.shards.len() != index.num_ps {
        return Err(damaged(&path, format!("lists {} shards for num_ps {}", index.shards.len(), index.num_ps)));
    }
    for (i, s) in index.shards.iter().enumerate() {
        if s.ps_index != i || s.num_ps != index.num_ps || s.global_step != step || s.file != shard_file_name(i, index.num_ps) {
            return Err(damaged(
                &path,
                format!("shard entry {i} ({:?}, ps {}, step {}, num_ps {}) does not match its position", s.file, s.ps_index, s.global_step, s.num_ps),
            ));
        }
    }
    Ok(Checkpoint {
        path: ckpt.clone(),
        global_step: step,
        num_ps: index.num_ps,
        created_unix_secs: index.created_unix_secs,
        shards: index.shards,
        layout: index.layout,
    })
}

/// Final shard file names present in `ckpt` (temporary files excluded).
fn shard_files(ckpt: &Location) -> Result<Vec<String>, CheckpointError> {
    Ok(ckpt.list()?.files.into_iter().map(|(n, _)| n).filter(|n| !n.starts_with('.') && n.starts_with("shard-") && n.ends_with(".safetensors")).collect())
}

fn meta_value<'m>(path: &Location, meta: &'m HashMap<String, String>, key: &str) -> Result<&'m str, CheckpointError> {
    meta.get(key).map(String::as_str).ok_or_else(|| damaged(path, format!("metadata has no {key:?}")))
}

fn meta_number<T: std::str::FromStr + PartialEq + std::fmt::Display>(
    path: &Location,
    meta: &HashMap<String, String>,
    key: &str,
    expected: T,
) -> Result<(), CheckpointError> {
    let raw = meta_value(path, meta, key)?;
    match raw.parse::<T>() {
        Ok(v) if v == expected => Ok(()),
        _ => Err(damaged(path, format!("metadata {key} is {raw:?}, index.json says {expected}"))),
    }
}

/// The bytes of shard `info`, checked against the index: there, of its
/// size, with its checksum.
fn read_checked(path: &Location, info: &ShardInfo) -> Result<bytes::Bytes, CheckpointError> {
    let Some(bytes) = path.read_if_exists()? else {
        return Err(damaged(path, format!("listed in {INDEX_FILE} but missing")));
    };
    if bytes.len() as u64 != info.bytes {
        return Err(damaged(path, format!("{} bytes, {INDEX_FILE} says {} (truncated or overwritten)", bytes.len(), info.bytes)));
    }
    let crc = crc32c::crc32c(&bytes);
    if crc != info.crc32c {
        return Err(damaged(path, format!("checksum mismatch: crc32c {crc:08x}, {INDEX_FILE} says {:08x} (corrupted data)", info.crc32c)));
    }
    Ok(bytes)
}

/// What a shard's metadata says beyond what it is checked against: its
/// embedding partitions (in the order of their ids' tensors) and their
/// descriptions.
struct ShardMeta {
    partitions: Vec<String>,
    embeddings: BTreeMap<String, serde_json::Value>,
}

/// Checks a shard's metadata against `ckpt` and its index entry `info`.
fn check_meta(path: &Location, meta: &HashMap<String, String>, ckpt: &Checkpoint, info: &ShardInfo) -> Result<ShardMeta, CheckpointError> {
    let format = meta_value(path, meta, "format")?;
    if format != SHARD_FORMAT {
        return Err(damaged(path, format!("metadata format is {format:?}, expected {SHARD_FORMAT:?}")));
    }
    meta_number(path, meta, "global_step", ckpt.global_step)?;
    meta_number(path, meta, "ps_index", info.ps_index)?;
    meta_number(path, meta, "num_ps", ckpt.num_ps)?;
    let names = |key: &str| -> Result<Vec<String>, CheckpointError> {
        serde_json::from_str(meta_value(path, meta, key)?).map_err(|e| damaged(path, format!("metadata {key} is not a JSON list of names: {e}")))
    };
    let slot_names = names("slots")?;
    let update_keys = names("updates")?;
    let listed = |entries: &[TensorEntry]| entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
    if slot_names != listed(&info.slots) || update_keys != info.updates {
        return Err(damaged(path, format!("its slots/updates metadata differs from {INDEX_FILE}")));
    }
    // Shards written before embeddings existed have neither key.
    let partitions = if meta.contains_key("row_ids") { names("row_ids")? } else { Vec::new() };
    let id_names: Vec<String> = partitions.iter().map(|p| format!("{p}{IDS_SUFFIX}")).collect();
    if id_names != listed(&info.row_ids) {
        return Err(damaged(path, format!("its row_ids metadata differs from {INDEX_FILE}")));
    }
    let embeddings = match meta.get("embeddings") {
        Some(json) => serde_json::from_str(json).map_err(|e| damaged(path, format!("metadata embeddings is not a JSON object: {e}")))?,
        None => BTreeMap::new(),
    };
    Ok(ShardMeta { partitions, embeddings })
}

/// A shard's tensors by type, by name.
#[derive(Default)]
struct Tensors {
    f32s: HashMap<String, (Vec<usize>, Vec<f32>)>,
    u64s: HashMap<String, u64>,
    i64s: HashMap<String, Vec<i64>>,
}

impl Tensors {
    /// Every tensor of `st`: f32 values, u64 counters, i64 ids; anything
    /// else is damage.
    fn read(path: &Location, st: &SafeTensors<'_>) -> Result<Self, CheckpointError> {
        let mut t = Tensors::default();
        for (name, view) in st.tensors() {
            match view.dtype() {
                Dtype::F32 => {
                    t.f32s.insert(name, (view.shape().to_vec(), crate::le::f32s(view.data())));
                }
                Dtype::U64 if view.data().len() == 8 => {
                    t.u64s.insert(name, crate::le::u64_at(view.data()));
                }
                Dtype::I64 if view.shape().len() == 1 => {
                    t.i64s.insert(name, crate::le::i64s(view.data()));
                }
                other => {
                    return Err(damaged(path, format!("tensor {name:?} has dtype {other} and shape {:?}", view.shape())));
                }
            }
        }
        Ok(t)
    }

    fn len(&self) -> usize {
        self.f32s.len() + self.u64s.len() + self.i64s.len()
    }

    /// The f32 tensors `entries`, of the shapes they list.
    fn take_f32(&mut self, path: &Location, entries: &[TensorEntry]) -> Result<Vec<NamedTensor>, CheckpointError> {
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            match self.f32s.remove(&e.name) {
                Some((shape, values)) if shape == e.shape => out.push((e.name.clone(), shape, values)),
                Some((shape, _)) => {
                    return Err(damaged(path, format!("tensor {:?} has shape {shape:?}, {INDEX_FILE} says {:?}", e.name, e.shape)));
                }
                None => return Err(damaged(path, format!("has no f32 tensor {:?}", e.name))),
            }
        }
        Ok(out)
    }

    /// The update counters of `keys`.
    fn take_updates(&mut self, path: &Location, keys: &[String]) -> Result<Vec<(String, u64)>, CheckpointError> {
        let mut updates = Vec::with_capacity(keys.len());
        for key in keys {
            let name = format!("{key}{UPDATES_SUFFIX}");
            let count = self.u64s.remove(&name).ok_or_else(|| damaged(path, format!("has no u64 tensor {name:?}")))?;
            updates.push((key.clone(), count));
        }
        Ok(updates)
    }
}

/// The row ids and descriptions of the embedding partitions of `meta`,
/// each as many ids as its values hold rows.
type PartitionRows = (Vec<(String, Vec<i64>)>, Vec<(String, String)>);

fn take_rows(
    path: &Location,
    tensors: &mut Tensors,
    meta: &ShardMeta,
    entries: &[TensorEntry],
    variables: &[NamedTensor],
) -> Result<PartitionRows, CheckpointError> {
    let mut row_ids = Vec::with_capacity(meta.partitions.len());
    let mut descriptions = Vec::with_capacity(meta.partitions.len());
    for (partition, entry) in meta.partitions.iter().zip(entries) {
        let ids = tensors.i64s.remove(&entry.name).ok_or_else(|| damaged(path, format!("has no i64 tensor {:?}", entry.name)))?;
        let rows = variables.iter().find(|(n, _, _)| n == partition).map(|(_, shape, _)| shape.first().copied().unwrap_or(0));
        if rows != Some(ids.len()) || entry.shape != [ids.len()] {
            return Err(damaged(path, format!("{} ids for embedding partition {partition:?}, whose values hold {rows:?} rows", ids.len())));
        }
        let description = meta.embeddings.get(partition).ok_or_else(|| damaged(path, format!("embedding partition {partition:?} has no description")))?;
        row_ids.push((partition.clone(), ids));
        descriptions.push((partition.clone(), description.to_string()));
    }
    Ok((row_ids, descriptions))
}

/// Reads one shard of `ckpt`, verifying size, checksum, safetensors structure,
/// metadata and that its tensors are exactly those the index lists.
fn load_shard(ckpt: &Checkpoint, info: &ShardInfo) -> Result<ShardData, CheckpointError> {
    let path = ckpt.path.child(&info.file);
    let bytes = read_checked(&path, info)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| damaged(&path, format!("not a valid safetensors file: {e}")))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| damaged(&path, format!("not a valid safetensors file: {e}")))?;
    let empty = HashMap::new();
    let meta = header.metadata().as_ref().unwrap_or(&empty);
    let shard_meta = check_meta(&path, meta, ckpt, info)?;
    let mut tensors = Tensors::read(&path, &st)?;
    let expected_tensors = info.variables.len() + info.slots.len() + info.updates.len() + info.row_ids.len();
    let held = tensors.len();
    if held != expected_tensors {
        return Err(damaged(&path, format!("holds {held} tensors, {INDEX_FILE} lists {expected_tensors}")));
    }
    let variables = tensors.take_f32(&path, &info.variables)?;
    let slots = tensors.take_f32(&path, &info.slots)?;
    let updates = tensors.take_updates(&path, &info.updates)?;
    let (row_ids, embeddings) = take_rows(&path, &mut tensors, &shard_meta, &info.row_ids, &variables)?;
    Ok(ShardData { variables, slots, updates, dispatcher: meta.get(DISPATCHER_KEY).cloned(), row_ids, embeddings })
}

/// Fully checks the checkpoint directory `ckpt` (named for `step`): index and every shard.
pub fn verify(ckpt: &Location, step: i64) -> CheckpointStatus {
    let result = read_index(ckpt, step).and_then(|c| {
        for info in &c.shards {
            load_shard(&c, info)?;
        }
        Ok(c)
    });
    match result {
        Ok(c) => CheckpointStatus::Complete(c),
        Err(CheckpointError::Incomplete { reason, .. }) => CheckpointStatus::Incomplete(reason),
        Err(e) => CheckpointStatus::Damaged(reason_in(ckpt, &e)),
    }
}

/// The reason of an error, with paths relative to the checkpoint directory.
fn reason_in(ckpt: &Location, e: &CheckpointError) -> String {
    let prefix = format!("{ckpt}/");
    match e {
        CheckpointError::Damaged { path, reason } => format!("{}: {reason}", path.to_string().strip_prefix(&prefix).unwrap_or(&path.to_string())),
        other => other.to_string().replace(&prefix, ""),
    }
}

/// `(step, path)` of every checkpoint directory in `dir`, oldest first. A missing `dir` has none.
fn checkpoint_dirs(dir: &Location) -> Result<Vec<(i64, Location)>, CheckpointError> {
    let mut out: Vec<(i64, Location)> = dir.list()?.dirs.iter().filter_map(|name| Some((parse_dir_name(name)?, dir.child(name)))).collect();
    out.sort_by_key(|(step, _)| *step);
    Ok(out)
}

/// Every checkpoint in `dir`, oldest first, each fully verified. A missing `dir` lists nothing.
pub fn list(dir: &Location) -> Result<Vec<CheckpointListing>, CheckpointError> {
    Ok(checkpoint_dirs(dir)?
        .into_iter()
        .map(|(step, path)| {
            let status = verify(&path, step);
            CheckpointListing { step, path, status }
        })
        .collect())
}

/// The newest complete checkpoint in `dir`, if any, whatever its number of
/// ps tasks (a ps cuts its part out of one written by another number,
/// [`crate::ps::recut`]). Newer incomplete or damaged ones are skipped with
/// a warning naming what is wrong.
pub fn latest_complete(dir: &Location) -> Result<Option<Checkpoint>, CheckpointError> {
    for (step, path) in checkpoint_dirs(dir)?.into_iter().rev() {
        match verify(&path, step) {
            CheckpointStatus::Complete(c) => return Ok(Some(c)),
            CheckpointStatus::Incomplete(reason) => {
                tracing::warn!(checkpoint = %path, step, %reason, "skipping incomplete checkpoint");
            }
            CheckpointStatus::Damaged(reason) => {
                tracing::warn!(checkpoint = %path, step, %reason, "skipping damaged checkpoint");
            }
        }
    }
    Ok(None)
}

/// Reads (and verifies) the shard of ps `ps_index` of a complete checkpoint.
pub fn read_shard(ckpt: &Checkpoint, ps_index: usize) -> Result<ShardData, CheckpointError> {
    let info = ckpt
        .shards
        .iter()
        .find(|s| s.ps_index == ps_index)
        .ok_or_else(|| invalid(&ckpt.path, format!("has no shard for ps {ps_index} (it has {} shards)", ckpt.shards.len())))?;
    load_shard(ckpt, info)
}

/// Every shard of a complete checkpoint merged into one, in ps order: for the
/// evaluator, for exporting, or to re-place variables over a different number
/// of ps tasks.
pub fn read_all(ckpt: &Checkpoint) -> Result<ShardData, CheckpointError> {
    let mut all = ShardData::default();
    for info in &ckpt.shards {
        all.merge(load_shard(ckpt, info)?);
    }
    Ok(all)
}

/// Deletes old checkpoints: keeps the newest `keep_last` complete ones (at
/// least 1; the newest complete one is never deleted), deletes every older
/// checkpoint whatever its state, and every incomplete or damaged one older
/// than the newest complete one. Incomplete ones newer than the newest
/// complete one are kept: they may be being written. Returns what it deleted.
pub fn prune(dir: &Location, keep_last: usize) -> Result<Vec<Location>, CheckpointError> {
    let keep_last = keep_last.max(1);
    let mut complete = 0usize;
    let mut deleted = Vec::new();
    for (step, path) in checkpoint_dirs(dir)?.into_iter().rev() {
        let delete = if complete >= keep_last {
            true
        } else {
            match verify(&path, step) {
                CheckpointStatus::Complete(_) => {
                    complete += 1;
                    false
                }
                _ => complete > 0,
            }
        };
        if delete {
            remove_checkpoint(&path)?;
            deleted.push(path);
        }
    }
    deleted.reverse();
    Ok(deleted)
}

/// Removes the index first, so a checkpoint half-deleted by a crash reads as incomplete.
fn remove_checkpoint(path: &Location) -> Result<(), CheckpointError> {
    path.child(INDEX_FILE).delete()?;
    Ok(path.delete_all()?)
}

/// A human-readable listing of `dir` for `tfjob-runtime checkpoint inspect DIR`:
/// every checkpoint with its step and status, and for complete ones every shard
/// with its variables, slots and update counters.
pub fn inspect(dir: &Location) -> Result<String, CheckpointError> {
    use std::fmt::Write as _;
    let listing = list(dir)?;
    let mut out = String::new();
    if listing.is_empty() {
        let _ = writeln!(out, "no checkpoints in {dir}");
        return Ok(out);
    }
    let latest = listing.iter().rev().find_map(|l| match &l.status {
        CheckpointStatus::Complete(c) => Some(c.global_step),
        _ => None,
    });
    let _ = writeln!(out, "{} checkpoint(s) in {dir}; latest complete: {}", listing.len(), latest.map_or("none".to_string(), |s| format!("step {s}")));
    for l in &listing {
        let name = l.path.name();
        match &l.status {
            CheckpointStatus::Complete(c) => {
                let total: u64 = c.shards.iter().map(|s| s.bytes).sum();
                let _ = writeln!(
                    out,
                    "{name}  step {}  complete  {} shard(s), {total} bytes, created {}",
                    c.global_step,
                    c.num_ps,
                    format_utc(c.created_unix_secs)
                );
                for s in &c.shards {
                    let _ = writeln!(out, "  ps {}  {}  {} bytes  crc32c {:08x}", s.ps_index, s.file, s.bytes, s.crc32c);
                    for v in &s.variables {
                        let _ = writeln!(out, "    variable  {}  {:?}", v.name, v.shape);
                    }
                    for v in &s.slots {
                        let _ = writeln!(out, "    slot      {}  {:?}", v.name, v.shape);
                    }
                    for k in &s.updates {
                        let _ = writeln!(out, "    updates   {k}");
                    }
                    for r in &s.row_ids {
                        let _ = writeln!(out, "    row ids   {}  {} row(s) materialised", r.name, r.shape.first().copied().unwrap_or(0));
                    }
                }
                if let Some(line) = dispatcher_line(c) {
                    let _ = writeln!(out, "  {line}");
                }
            }
            CheckpointStatus::Incomplete(reason) => {
                let _ = writeln!(out, "{name}  step {}  INCOMPLETE: {reason}", l.step);
            }
            CheckpointStatus::Damaged(reason) => {
                let _ = writeln!(out, "{name}  step {}  DAMAGED: {reason}", l.step);
            }
        }
    }
    Ok(out)
}

/// Where the data stood at a checkpoint, from its shard dispatcher's state
/// (`None` when the checkpoint has none).
fn dispatcher_line(ckpt: &Checkpoint) -> Option<String> {
    let json = read_shard(ckpt, 0).ok()?.dispatcher?;
    let line = match serde_json::from_str::<crate::dispatch::DispatcherState>(&json)
        .map_err(|e| e.to_string())
        .and_then(|s| crate::dispatch::ShardDispatcher::restore(&s).map_err(|e| e.to_string()))
    {
        Ok(d) => {
            let p = d.progress();
            let (epoch, pos) = d.state().next;
            format!(
                "data: {} epoch(s) complete, next shard at epoch {epoch} position {pos} of {}, {} shard(s) in flight (trained again on restore), {} examples trained, {} shard(s) redone",
                p.epochs_completed,
                p.shards_per_epoch,
                d.state().not_done.len(),
                p.examples_trained,
                p.shards_redone
            )
        }
        Err(e) => format!("data: the shard dispatcher's state does not parse: {e}"),
    };
    Some(line)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch (proleptic Gregorian, UTC).
pub fn format_utc(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Shift the epoch to 0000-03-01 so leap days fall at the end of a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests;

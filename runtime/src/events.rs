//! TensorBoard event files: the chief and the evaluator log scalars (loss,
//! accuracy, steps/s, ...) by step to `--log_dir`, and TensorBoard plots them.
//!
//! # Format
//!
//! A file named `events.out.tfevents.<unix seconds, 10 digits>.<hostname><suffix>`
//! holds a sequence of TFRecords:
//!
//! ```text
//! u64 LE   length of data
//! u32 LE   masked CRC-32C of the 8 length bytes
//! [u8]     data: one serialized `tensorflow.Event`
//! u32 LE   masked CRC-32C of data
//! ```
//!
//! (mask = `((crc >> 15) | (crc << 17)) + 0xa282ead8`, see [`mask`]).
//! The first event carries `file_version = "brain.Event:2"`; every later one a
//! `Summary` of `simple_value` scalars. The messages below are the subset of
//! TensorFlow's `tensorflow/core/util/event.proto` and
//! `tensorflow/core/framework/summary.proto` that this needs, with the same
//! field numbers; fields they do not list are skipped when reading.
//!
//! # Durability
//!
//! Each record reaches the file in a single write of the whole record, so a
//! reader never sees half a record unless the process dies in the middle of
//! that write. Records are flushed to the OS every [`FlushPolicy::max_pending`]
//! records, and a background thread flushes pending ones after at most
//! [`FlushPolicy::interval`], so TensorBoard sees progress and a crash loses
//! only the last few seconds.
//!
//! # Object stores
//!
//! An object cannot be appended to. On an object store (`--log_dir
//! s3://...`, see [`EventWriter::create_in`]) the writer keeps the records of
//! its current object in memory and uploads the object whole at every flush
//! (by the background thread only: the training loop never waits for the
//! network). A PUT replaces an object atomically, so a reader sees the file
//! grow as it would locally. Once an object holds [`ROLL_BYTES`], the writer
//! rolls over to a new object named `<first object's name>.<part, 5 digits>`,
//! which starts with its own `file_version` record: names sort in the order
//! they were written, as TensorBoard reads a directory's event files, and no
//! upload is ever larger than [`ROLL_BYTES`] plus one interval's records.

use std::fs::{self, File, OpenOptions};

use crate::storage::{Location, StorageError};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;

/// `file_version` of the first event of every file, as TensorFlow 1.x and 2.x write it.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Added to a rotated CRC by [`mask`], as TensorFlow's `crc32c::Mask` does.
const MASK_DELTA: u32 = 0xA282_EAD8;

/// Masks a CRC the way TFRecord stores it: rotate right by 15 bits, add a constant.
/// (A CRC of data that itself embeds CRCs is weak; the mask avoids that.)
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Inverse of [`mask`].
pub fn unmask(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

/// The masked CRC-32C (Castagnoli, the `crc32c` crate) of `data`, as a
/// TFRecord frame carries it.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

/// Bytes of TFRecord framing around each record's data: length, its CRC, the data's CRC.
const FRAMING: usize = 8 + 4 + 4;

/// On an object store, an event file rolls over to a new object once it holds this many bytes.
pub const ROLL_BYTES: usize = 256 * 1024;

/// `tensorflow.Event` (event.proto), the fields this runtime writes.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// Global step the event belongs to.
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

/// `Event.what`: what happened.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// `string file_version = 3`, set in the first record of a file.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// `Summary summary = 5`.
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary` (summary.proto): `repeated Value value = 1`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: `string tag = 1`, `oneof value { float simple_value = 2; ... }`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(oneof = "Value", tags = "2")]
    pub value: Option<Value>,
}

/// `Summary.Value.value`. Being a oneof, a present `0.0` is still written.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("event log directory {}: {source}", dir.display())]
    Dir { dir: PathBuf, source: io::Error },
    #[error("event file {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("event file {0}")]
    Storage(#[from] StorageError),
    #[error("event file suffix {suffix:?}: {reason}")]
    InvalidSuffix { suffix: String, reason: &'static str },
    #[error("event file {}: summary tag {tag:?} is invalid: {reason}", path.display())]
    InvalidTag { path: PathBuf, tag: String, reason: &'static str },
    #[error("event file {}: a background flush failed earlier: {message}", path.display())]
    BackgroundFlush { path: PathBuf, message: String },
    #[error("event file {}: truncated record at byte {offset}: {what}", path.display())]
    Truncated { path: PathBuf, offset: u64, what: String },
    #[error(
        "event file {}: record at byte {offset}: length checksum mismatch (stored {stored:#010x}, computed {computed:#010x}); the file is corrupted",
        path.display()
    )]
    LengthChecksum { path: PathBuf, offset: u64, stored: u32, computed: u32 },
    #[error(
        "event file {}: record at byte {offset}: data checksum mismatch (stored {stored:#010x}, computed {computed:#010x}); the file is corrupted",
        path.display()
    )]
    DataChecksum { path: PathBuf, offset: u64, stored: u32, computed: u32 },
    #[error("event file {}: record at byte {offset} is not a tensorflow.Event: {source}", path.display())]
    Decode { path: PathBuf, offset: u64, source: prost::DecodeError },
}

/// When buffered records are handed to the OS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Pending records are flushed at most this long after they were added.
    pub interval: Duration,
    /// Flush as soon as this many records are pending (1 = every record).
    pub max_pending: usize,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy { interval: Duration::from_secs(2), max_pending: 100 }
    }
}

/// Where the records go: a local file (appended to), or objects of an
/// object store (uploaded whole, rolled over; see the module's docs).
enum Out {
    File(BufWriter<File>),
    Objects(RolledObjects),
}

/// The objects of one event file on an object store.
struct RolledObjects {
    dir: Location,
    /// The first object's name; later ones are `<first>.<part:05>`.
    first: String,
    part: u32,
    /// Every record of the current object.
    buffer: Vec<u8>,
    /// How many bytes of `buffer` the store holds.
    stored: usize,
    roll_bytes: usize,
}

impl RolledObjects {
    fn name(&self) -> String {
        if self.part == 0 { self.first.clone() } else { format!("{}.{:05}", self.first, self.part) }
    }

    /// Uploads the current object if it grew; rolls over once it is full.
    fn flush(&mut self) -> Result<(), StorageError> {
        if self.stored < self.buffer.len() {
            self.dir.child(&self.name()).write(self.buffer.clone())?;
            self.stored = self.buffer.len();
        }
        if self.buffer.len() >= self.roll_bytes {
            self.part += 1;
            self.buffer = encode_record(&file_version_event(now_secs()).encode_to_vec());
            self.stored = 0;
        }
        Ok(())
    }
}

struct Sink {
    out: Out,
    pending: usize,
    /// First error of the background flusher, reported by the next call.
    failed: Option<String>,
}

impl Sink {
    fn write_all(&mut self, record: &[u8]) -> io::Result<()> {
        match &mut self.out {
            Out::File(f) => f.write_all(record),
            Out::Objects(o) => {
                o.buffer.extend_from_slice(record);
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        match &mut self.out {
            Out::File(f) => f.flush().map_err(|e| e.to_string())?,
            Out::Objects(o) => o.flush().map_err(|e| e.to_string())?,
        }
        self.pending = 0;
        Ok(())
    }

    /// Whether a flush may run on the caller's thread: a file's may, an
    /// upload is left to the background thread.
    fn flushes_inline(&self) -> bool {
        matches!(self.out, Out::File(_))
    }
}

/// The first event of every file.
fn file_version_event(wall_time: f64) -> Event {
    Event { wall_time, step: 0, what: Some(What::FileVersion(FILE_VERSION.to_string())) }
}

/// Appends scalar summaries to one new event file.
///
/// Dropping the writer flushes it (a failure is logged); call [`EventWriter::close`]
/// to see that error instead.
pub struct EventWriter {
    path: PathBuf,
    sink: Arc<Mutex<Sink>>,
    policy: FlushPolicy,
    last_flush: Instant,
    /// Dropping the sender stops the flusher thread.
    stop: Option<mpsc::Sender<()>>,
    flusher: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter").field("path", &self.path).field("policy", &self.policy).finish()
    }
}

fn lock(sink: &Mutex<Sink>) -> MutexGuard<'_, Sink> {
    sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The host name as it may appear in a file name (TensorFlow puts it there too).
fn file_hostname() -> String {
    let raw = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let clean: String = raw.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect();
    if clean.is_empty() { "localhost".to_string() } else { clean }
}

/// `events.out.tfevents.<unix seconds, 10 digits>.<hostname><suffix>`, as TensorFlow names them.
fn base_name(wall_time: f64, suffix: &str) -> String {
    format!("events.out.tfevents.{:010}.{}{}", wall_time as u64, file_hostname(), suffix)
}

fn check_suffix(suffix: &str) -> Result<(), EventError> {
    if suffix.contains('/') || suffix.contains('\\') || suffix.contains('\0') {
        return Err(EventError::InvalidSuffix { suffix: suffix.to_string(), reason: "must not contain '/', '\\' or NUL" });
    }
    Ok(())
}

/// Frames `data` as one TFRecord.
pub fn encode_record(data: &[u8]) -> Vec<u8> {
    let mut rec = Vec::with_capacity(data.len() + FRAMING);
    let len = (data.len() as u64).to_le_bytes();
    rec.extend_from_slice(&len);
    rec.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    rec.extend_from_slice(data);
    rec.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    rec
}

impl EventWriter {
    /// Creates `log_dir` if needed and a new event file in it, named
    /// `events.out.tfevents.<secs>.<hostname><suffix>`, whose first record is the
    /// `file_version` event. `suffix` is appended as is (e.g. `""`, `".chief"`,
    /// `".eval"`); it may not contain a path separator. Never overwrites a file:
    /// if the name is taken, `.<pid>.<n>` is appended.
    pub fn create(log_dir: &Path, suffix: &str) -> Result<Self, EventError> {
        Self::create_with(log_dir, suffix, FlushPolicy::default())
    }

    /// [`EventWriter::create`] with an explicit flush policy.
    pub fn create_with(log_dir: &Path, suffix: &str, policy: FlushPolicy) -> Result<Self, EventError> {
        check_suffix(suffix)?;
        let dir_err = |source| EventError::Dir { dir: log_dir.to_path_buf(), source };
        fs::create_dir_all(log_dir).map_err(dir_err)?;
        let wall_time = now_secs();
        let base = base_name(wall_time, suffix);
        let mut attempt = 0u32;
        let (path, file) = loop {
            let name = if attempt == 0 { base.clone() } else { format!("{base}.{}.{attempt}", std::process::id()) };
            let path = log_dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 1000 => attempt += 1,
                Err(source) => return Err(EventError::Io { path, source }),
            }
        };
        Self::start(path, Out::File(BufWriter::new(file)), policy, wall_time)
    }

    /// A new event file in `log_dir`, a local path or an object-store URL
    /// (see the module's docs for how objects are written).
    pub fn create_in(log_dir: &Location, suffix: &str) -> Result<Self, EventError> {
        Self::create_in_with(log_dir, suffix, FlushPolicy::default(), ROLL_BYTES)
    }

    /// [`EventWriter::create_in`] with an explicit flush policy and roll-over size.
    pub fn create_in_with(log_dir: &Location, suffix: &str, policy: FlushPolicy, roll_bytes: usize) -> Result<Self, EventError> {
        if let Some(dir) = log_dir.local_path() {
            return Self::create_with(dir, suffix, policy);
        }
        check_suffix(suffix)?;
        let wall_time = now_secs();
        // The pid keeps two writers of one host and second apart.
        let base = base_name(wall_time, &format!(".{}{suffix}", std::process::id()));
        let mut first = base.clone();
        let mut attempt = 0u32;
        while log_dir.child(&first).size()?.is_some() {
            attempt += 1;
            first = format!("{base}.{attempt}");
        }
        let path = PathBuf::from(log_dir.child(&first).to_string());
        let objects = RolledObjects { dir: log_dir.clone(), first, part: 0, buffer: Vec::new(), stored: 0, roll_bytes: roll_bytes.max(1) };
        Self::start(path, Out::Objects(objects), policy, wall_time)
    }

    /// Starts the flusher and writes the `file_version` record.
    fn start(path: PathBuf, out: Out, policy: FlushPolicy, wall_time: f64) -> Result<Self, EventError> {
        let policy = FlushPolicy { max_pending: policy.max_pending.max(1), ..policy };
        let sink = Arc::new(Mutex::new(Sink { out, pending: 0, failed: None }));
        let (stop, stopped) = mpsc::channel::<()>();
        let flusher = {
            let sink = Arc::clone(&sink);
            let interval = policy.interval.max(Duration::from_millis(10));
            std::thread::Builder::new()
                .name("event-flush".into())
                .spawn(move || {
                    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                        let mut s = lock(&sink);
                        if s.pending > 0
                            && s.failed.is_none()
                            && let Err(e) = s.flush()
                        {
                            s.failed = Some(e);
                        }
                    }
                })
                .map_err(|source| EventError::Io { path: path.clone(), source })?
        };
        let mut writer = EventWriter { path, sink, policy, last_flush: Instant::now(), stop: Some(stop), flusher: Some(flusher) };
        writer.write_event(&file_version_event(wall_time))?;
        writer.flush()?;
        Ok(writer)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io_err(&self, source: io::Error) -> EventError {
        EventError::Io { path: self.path.clone(), source }
    }

    /// Appends one event (any event: the scalar helpers build on this).
    pub fn write_event(&mut self, event: &Event) -> Result<(), EventError> {
        let record = encode_record(&event.encode_to_vec());
        let due = {
            let mut s = lock(&self.sink);
            if let Some(message) = s.failed.clone() {
                return Err(EventError::BackgroundFlush { path: self.path.clone(), message });
            }
            s.write_all(&record).map_err(|e| self.io_err(e))?;
            s.pending += 1;
            s.flushes_inline() && (s.pending >= self.policy.max_pending || self.last_flush.elapsed() >= self.policy.interval)
        };
        if due {
            self.flush()?;
        }
        Ok(())
    }

    /// Logs `value` under `tag` at `step`.
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<(), EventError> {
        self.add_scalars(step, &[(tag, value)])
    }

    /// Logs several scalars of the same step as one event. An empty slice writes nothing.
    pub fn add_scalars(&mut self, step: i64, scalars: &[(&str, f32)]) -> Result<(), EventError> {
        if scalars.is_empty() {
            return Ok(());
        }
        let mut value = Vec::with_capacity(scalars.len());
        for &(tag, v) in scalars {
            if tag.is_empty() {
                return Err(EventError::InvalidTag { path: self.path.clone(), tag: tag.into(), reason: "it is empty" });
            }
            if tag.chars().any(char::is_control) {
                return Err(EventError::InvalidTag { path: self.path.clone(), tag: tag.into(), reason: "it contains a control character" });
            }
            value.push(SummaryValue { tag: tag.to_string(), value: Some(Value::SimpleValue(v)) });
        }
        let event = Event { wall_time: now_secs(), step, what: Some(What::Summary(Summary { value })) };
        self.write_event(&event)
    }

    /// Hands every buffered record to the OS.
    pub fn flush(&mut self) -> Result<(), EventError> {
        let mut s = lock(&self.sink);
        if let Some(message) = s.failed.clone() {
            return Err(EventError::BackgroundFlush { path: self.path.clone(), message });
        }
        s.flush().map_err(|message| EventError::BackgroundFlush { path: self.path.clone(), message })?;
        drop(s);
        self.last_flush = Instant::now();
        Ok(())
    }

    /// Flushes, syncs the file to disk and stops the flusher thread.
    pub fn close(mut self) -> Result<(), EventError> {
        self.stop_flusher();
        self.flush()?;
        let s = lock(&self.sink);
        match &s.out {
            Out::File(f) => f.get_ref().sync_all().map_err(|e| self.io_err(e)),
            // A stored object is durable.
            Out::Objects(_) => Ok(()),
        }
    }

    fn stop_flusher(&mut self) {
        self.stop.take();
        if let Some(handle) = self.flusher.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        self.stop_flusher();
        let mut s = lock(&self.sink);
        if let Err(e) = s.flush() {
            tracing::warn!(path = %self.path.display(), error = %e, "could not flush event file");
        }
    }
}

/// Splits `bytes` (the content of `path`) into TFRecord payloads, verifying both
/// CRCs of every record. Returns each payload with its byte offset in the file.
pub fn read_records<'a>(path: &Path, bytes: &'a [u8]) -> Result<Vec<(u64, &'a [u8])>, EventError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let offset = pos as u64;
        let rest = &bytes[pos..];
        let truncated = |what: String| EventError::Truncated { path: path.to_path_buf(), offset, what };
        if rest.len() < 12 {
            return Err(truncated(format!("{} bytes left, a record header needs 12", rest.len())));
        }
        let len_bytes: [u8; 8] = rest[..8].try_into().expect("slice of 8");
        let stored = crate::le::u32_at(&rest[8..12]);
        let computed = masked_crc32c(&len_bytes);
        if stored != computed {
            return Err(EventError::LengthChecksum { path: path.to_path_buf(), offset, stored, computed });
        }
        let len = u64::from_le_bytes(len_bytes);
        let available = (rest.len() - 12) as u64;
        if len > available.saturating_sub(4) {
            return Err(truncated(format!("the record declares {len} data bytes + 4 checksum bytes, only {available} bytes follow")));
        }
        let len = len as usize;
        let data = &rest[12..12 + len];
        let stored = crate::le::u32_at(&rest[12 + len..16 + len]);
        let computed = masked_crc32c(data);
        if stored != computed {
            return Err(EventError::DataChecksum { path: path.to_path_buf(), offset, stored, computed });
        }
        out.push((offset, data));
        pos += FRAMING + len;
    }
    Ok(out)
}

/// Reads every event of an event file, verifying both CRCs of every record.
/// Any corruption or truncation is an error naming the file and the byte offset.
pub fn read_events(path: &Path) -> Result<Vec<Event>, EventError> {
    let bytes = fs::read(path).map_err(|source| EventError::Io { path: path.to_path_buf(), source })?;
    decode_events(path, &bytes)
}

/// The events of `bytes`, the content of the event file `path` (named in errors).
pub fn decode_events(path: &Path, bytes: &[u8]) -> Result<Vec<Event>, EventError> {
    read_records(path, bytes)?
        .into_iter()
        .map(|(offset, data)| Event::decode(data).map_err(|source| EventError::Decode { path: path.to_path_buf(), offset, source }))
        .collect()
}

/// Every `simple_value` scalar of an event file, in file order: `(tag, step, value)`.
pub fn scalars(path: &Path) -> Result<Vec<(String, i64, f32)>, EventError> {
    Ok(scalars_of(read_events(path)?))
}

/// Every `simple_value` scalar of `events`, in order: `(tag, step, value)`.
pub fn scalars_of(events: Vec<Event>) -> Vec<(String, i64, f32)> {
    let mut out = Vec::new();
    for event in events {
        if let Some(What::Summary(summary)) = event.what {
            for v in summary.value {
                if let Some(Value::SimpleValue(x)) = v.value {
                    out.push((v.tag, event.step, x));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

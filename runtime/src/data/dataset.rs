//! A [`Dataset`] in memory, the [`TrainingSet`] trait through which
//! training reads data shard by shard, and [`DataError`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ndarray::Array2;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::batch::{Batch, Targets, rows_at};
use super::shard::{PickExamples, ShardBatches};
use crate::dispatch::{ShardId, ShardPlan};

/// What can be wrong with data: a file (named, with what is wrong in it)
/// or inputs and targets that do not fit together.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file or object of an object store (or a local one read through it).
    #[error("cannot read {0}")]
    Storage(#[from] crate::storage::StorageError),
    #[error("{}: corrupt gzip data: {source}", path.display())]
    Gzip {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not an IDX {expected_kind} file: magic number {found:#010x}, expected {expected:#010x}", path.display())]
    BadMagic { path: PathBuf, expected_kind: &'static str, found: u32, expected: u32 },
    #[error("{}: truncated {part}: expected {expected} bytes, found {found}", path.display())]
    Truncated { path: PathBuf, part: &'static str, expected: u64, found: u64 },
    #[error("{}: {extra} bytes after the data the header announces", path.display())]
    TrailingBytes { path: PathBuf, extra: u64 },
    #[error("{}: bad header: {reason}", path.display())]
    BadHeader { path: PathBuf, reason: String },
    #[error("{}: label {label} of example {index} is out of range 0..{num_classes}", path.display())]
    LabelOutOfRange { path: PathBuf, index: usize, label: u32, num_classes: u32 },
    #[error("{} has {images} images but {} has {labels} labels", images_path.display(), labels_path.display())]
    CountMismatch { images_path: PathBuf, labels_path: PathBuf, images: usize, labels: usize },
    #[error("{}: images have {found} pixels, but {} has {expected}", path.display(), other.display())]
    ImageSizeMismatch { path: PathBuf, other: PathBuf, found: usize, expected: usize },
    #[error("{}: no {name} (nor {name}.gz) in this directory", dir.display())]
    Missing { dir: PathBuf, name: &'static str },
    #[error("dataset: {inputs} input rows but {targets} targets")]
    LengthMismatch { inputs: usize, targets: usize },
    #[error("{}: line {line}: {reason}", path.display())]
    Csv { path: PathBuf, line: u64, reason: String },
    #[error("{}: header: {reason}", path.display())]
    CsvHeader { path: PathBuf, reason: String },
    #[error("{}: no examples", path.display())]
    NoExamples { path: PathBuf },
    #[error("{}: images without labels (give the labels file)", path.display())]
    NoLabels { path: PathBuf },
    #[error("{}: line {line}: {reason} (--skip_bad_lines goes on without it)", path.display())]
    BadLine { path: PathBuf, line: u64, reason: String },
    #[error("{pattern:?}: no file matches")]
    NoMatch { pattern: String },
    #[error("{}: cannot write the decompressed copy: {source}", path.display())]
    Spill {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A flag that does not apply to this input.
    #[error("--{flag}: {reason}")]
    UnusedFlag { flag: &'static str, reason: String },
}

impl DataError {
    /// Whether reading again later may succeed (storage that could not be
    /// reached); bad data, a missing file or a bad flag are permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            DataError::Storage(e) => e.is_transient(),
            DataError::Io { source, .. } => crate::storage::io_error_is_transient(source.kind()),
            _ => false,
        }
    }
}

/// Inputs (one row per example) with their targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    x: Array2<f32>,
    targets: Targets,
}

impl Dataset {
    /// Fails if `x` and `targets` hold different numbers of examples.
    pub fn new(x: Array2<f32>, targets: Targets) -> Result<Self, DataError> {
        if x.nrows() != targets.len() {
            return Err(DataError::LengthMismatch { inputs: x.nrows(), targets: targets.len() });
        }
        Ok(Dataset { x, targets })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.x.nrows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Features per example.
    pub fn input_dim(&self) -> usize {
        self.x.ncols()
    }

    pub fn x(&self) -> &Array2<f32> {
        &self.x
    }

    pub fn targets(&self) -> &Targets {
        &self.targets
    }

    /// For labelled data, the largest label plus one (`None` for
    /// regression data or an empty set).
    pub fn num_classes(&self) -> Option<usize> {
        match &self.targets {
            Targets::Labels(l) => l.iter().max().map(|&m| m as usize + 1),
            Targets::Values(_) => None,
        }
    }

    pub fn into_parts(self) -> (Array2<f32>, Targets) {
        (self.x, self.targets)
    }

    /// The examples at `indices`, in that order, as a batch.
    ///
    /// # Panics
    /// If an index is out of range.
    pub fn select(&self, indices: &[usize]) -> Batch {
        Batch { x: rows_at(&self.x, indices), targets: self.targets.select(indices), sparse: None }
    }

    /// The first `n` examples (all of them if there are fewer), e.g. for
    /// evaluation on held-out data.
    pub fn head(&self, n: usize) -> Batch {
        let n = n.min(self.len());
        let targets = match &self.targets {
            Targets::Values(v) => Targets::Values(v.slice(ndarray::s![..n, ..]).to_owned()),
            Targets::Labels(l) => Targets::Labels(l[..n].to_vec()),
        };
        Batch { x: self.x.slice(ndarray::s![..n, ..]).to_owned(), targets, sparse: None }
    }

    /// The whole set as one batch.
    pub fn to_batch(&self) -> Batch {
        Batch { x: self.x.clone(), targets: self.targets.clone(), sparse: None }
    }
}

impl PickExamples for Dataset {
    fn pick(&self, indices: &[usize]) -> Batch {
        self.select(indices)
    }
}

/// A training set as the shard dispatcher sees it: its size, and the batches
/// of any shard of any epoch. Which shards a worker trains is decided by the
/// dispatcher on ps 0, never by the worker itself.
pub trait TrainingSet: Send + Sync {
    /// Examples in the set.
    fn num_examples(&self) -> usize;
    /// The examples of `shard` under `plan`, in batches of `batch_size`
    /// (the last batch of a shard may hold fewer), in training order, each
    /// made when it is first needed.
    fn shard_batches(&self, plan: &ShardPlan, shard: ShardId, batch_size: usize) -> ShardBatches;
}

/// A dataset held in memory, read shard by shard: epoch `e` visits the
/// examples in [`ShardPlan::example_order`]`(e)` and its shard `i` is the run
/// of positions [`ShardPlan::shard_positions`]`(i)` of that order, so the
/// shards of an epoch hold every example once, in an order shuffled anew for
/// every epoch (like `shuffle().batch()` per epoch).
pub struct InMemoryTrainingSet {
    data: Arc<Dataset>,
    /// The last epoch's order of examples (shards come mostly from one epoch
    /// at a time; computing an order costs a shuffle of the whole set).
    order: Mutex<Option<CachedOrder>>,
}

/// An epoch's order of examples: (epoch, seed, order).
type CachedOrder = (u64, u64, Arc<Vec<u64>>);

impl InMemoryTrainingSet {
    pub fn new(data: Dataset) -> Self {
        InMemoryTrainingSet { data: Arc::new(data), order: Mutex::new(None) }
    }

    pub fn dataset(&self) -> &Dataset {
        &self.data
    }

    fn example_order(&self, plan: &ShardPlan, epoch: u64) -> Arc<Vec<u64>> {
        let mut cached = self.order.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some((e, seed, order)) if *e == epoch && *seed == plan.seed => order.clone(),
            _ => {
                let order = Arc::new(plan.example_order(epoch));
                *cached = Some((epoch, plan.seed, order.clone()));
                order
            }
        }
    }
}

impl TrainingSet for InMemoryTrainingSet {
    fn num_examples(&self) -> usize {
        self.data.len()
    }

    /// # Panics
    /// If `plan` is not a plan of this set (another number of examples) or
    /// `batch_size` is 0: bugs of the caller.
    fn shard_batches(&self, plan: &ShardPlan, shard: ShardId, batch_size: usize) -> ShardBatches {
        assert_eq!(plan.examples, self.data.len() as u64, "the plan is for another training set");
        let order = self.example_order(plan, shard.epoch);
        let positions = plan.shard_positions(shard.index);
        let indices: Vec<usize> = order[positions.start as usize..positions.end as usize].iter().map(|&i| i as usize).collect();
        ShardBatches::picked(self.data.clone(), indices, batch_size)
    }
}

/// An endless stream of batches of one size from a dataset: each epoch
/// visits every example once in an order shuffled from the seed; a batch
/// that reaches the end of an epoch continues in the next one (like
/// `shuffle().repeat().batch()`), so every batch is full.
///
/// An empty dataset yields empty batches.
#[derive(Debug, Clone)]
pub struct Sampler {
    data: Dataset,
    batch_size: usize,
    rng: StdRng,
    order: Vec<usize>,
    pos: usize,
    epochs: u64,
    indices: Vec<usize>,
}

impl Sampler {
    /// # Panics
    /// If `batch_size` is 0.
    pub fn new(data: Dataset, batch_size: usize, seed: u64) -> Self {
        assert!(batch_size > 0, "sampler: batch_size must be at least 1");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..data.len()).collect();
        order.shuffle(&mut rng);
        Sampler { data, batch_size, rng, order, pos: 0, epochs: 0, indices: Vec::with_capacity(batch_size) }
    }

    /// The next batch of `batch_size` examples.
    pub fn next_batch(&mut self) -> Batch {
        self.indices.clear();
        if !self.order.is_empty() {
            while self.indices.len() < self.batch_size {
                if self.pos == self.order.len() {
                    self.order.shuffle(&mut self.rng);
                    self.pos = 0;
                    self.epochs += 1;
                }
                let take = (self.batch_size - self.indices.len()).min(self.order.len() - self.pos);
                self.indices.extend_from_slice(&self.order[self.pos..self.pos + take]);
                self.pos += take;
            }
        }
        self.data.select(&self.indices)
    }

    /// Epochs completed so far (an epoch completes when a batch needs an
    /// example beyond its end).
    pub fn epochs(&self) -> u64 {
        self.epochs
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn dataset(&self) -> &Dataset {
        &self.data
    }
}

impl Iterator for Sampler {
    type Item = Batch;

    /// Never `None`.
    fn next(&mut self) -> Option<Batch> {
        Some(self.next_batch())
    }
}

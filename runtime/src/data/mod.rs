//! Datasets: the synthetic line of the classic example, IDX files (MNIST
//! and images of any size), CSV files, and a synthetic learnable
//! classification set. Nothing is downloaded.
//!
//! A [`Dataset`] holds inputs and targets. Training reads it through the
//! [`TrainingSet`] trait, shard by shard as the shard dispatcher
//! ([`crate::dispatch`]) hands shards out; [`InMemoryTrainingSet`] does that
//! for a dataset held in memory. A [`Sampler`] turns a dataset into an
//! endless stream of shuffled [`Batch`]es (for tests and benchmarks).
//!
//! `batch` and `dataset` hold what every reader and consumer shares; the
//! other files are the formats and generators. This file only declares and
//! re-exports.

mod batch;
mod csv;
mod dataset;
mod generate;
mod idx;
mod shard;
mod source;
mod sparse;
mod stream;
mod synthetic;

pub use batch::{Batch, BatchRows, SparseFeatures, Targets, rows_at};
pub use dataset::{DataError, Dataset, InMemoryTrainingSet, Sampler, TrainingSet};
pub use generate::{GENERATED_EVAL_BASE, Generator, auc};
pub use shard::{PickExamples, ShardBatches};
pub use sparse::{CRITEO_CATEGORICALS, CRITEO_INTEGERS, Feature, SparseExample, SparseFormat, feature_key, sparse_batch};
pub use stream::{FileSet, GeneratedTrainingSet, StreamedTrainingSet, expand_files, read_head};

pub use csv::{CsvData, CsvOptions, DEFAULT_LABEL_COLUMN, LabelKind, read_csv};
pub use idx::{
    IdxSets, MNIST_CLASSES, MNIST_FILES, Mnist, load_idx_dir, load_mnist, read_idx_examples, read_idx_images, read_idx_labels, read_idx_pair, read_mnist_pair,
};
pub use source::{DataFormat, DataOptions, InputData, TrainingData, load_training_data, read_input};
pub use synthetic::{
    IMAGE_LATENT_DIMS, LINE_INTERCEPT, LINE_NOISE_STDDEV, LINE_POINTS, LINE_SLOPE, synthetic_classification, synthetic_images, synthetic_line,
};

#[cfg(test)]
mod tests;

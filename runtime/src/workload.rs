//! From command-line choices to a [`Workload`]: the model, the training set
//! (cut into shards by the dispatcher, not by the worker) and held-out data.
//!
//! `spec` holds what every builder shares (the flags as a [`WorkloadSpec`],
//! the Keras and sparse options, [`WorkloadError`]); `build` the built-in
//! models and the choice among builders; `keras` the Keras models and the
//! checks that every data flag is one the chosen model can use; `sparse` the
//! sparse models; `inference` serving a trained model. This file only
//! declares and re-exports.

mod build;
mod inference;
mod keras;
mod sparse;
mod spec;

pub use build::build;
pub use inference::{InferenceSpec, inference_model};
pub use keras::{check_example_shape, check_flags, check_num_classes};
pub use spec::{KerasOptions, SYNTHETIC_TRAIN_EXAMPLES, SparseOptions, WorkloadError, WorkloadSpec, is_sparse_model};

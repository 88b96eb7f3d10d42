//! From command-line choices to a [`Workload`]: the model, the training set
//! (cut into shards by the dispatcher, not by the worker) and held-out data.
//! The built-in models are here; Keras models and the data flags they share
//! with them are in `workload/keras.rs`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::data::{self, Dataset, InMemoryTrainingSet};
use crate::model::{self, Activation, Model, ModelConfig, WeightInit};
use crate::train::Workload;

mod inference;
mod keras;
mod sparse;

pub use inference::{InferenceSpec, inference_model};
pub use keras::{KerasOptions, check_example_shape, check_flags, check_num_classes};
pub use sparse::{SparseOptions, is_sparse_model};

/// What to train, as given on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// `linear`, `softmax` or `mlp`.
    pub model: String,
    /// `--hidden_units`, `--activation`, `--weight_init`: the mlp's only
    /// (`None`: 100, sigmoid, truncated_normal); given for another model, an
    /// error ([`check_flags`]).
    pub hidden_units: Option<Vec<usize>>,
    pub activation: Option<String>,
    pub weight_init: Option<String>,
    /// Examples per step; `None` picks the model's classic default.
    pub batch_size: Option<usize>,
    pub data_dir: Option<PathBuf>,
    pub seed: u64,
    /// Held-out examples for evaluation.
    pub eval_examples: usize,
    /// `--keras_model`, `--loss`, `--from_logits`.
    pub keras: KerasOptions,
    /// `--data_format`, `--label_column`, `--feature_columns`, `--num_classes`.
    pub data: data::DataOptions,
    /// The sparse models' flags (`--train_files`, `--embedding_dim`, ...).
    pub sparse: SparseOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("--{field}: {reason}")]
    Flag { field: &'static str, reason: String },
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error(transparent)]
    Keras(#[from] model::keras::KerasError),
}

/// Examples in the synthetic classification set when no `--data_dir` is given.
pub const SYNTHETIC_TRAIN_EXAMPLES: usize = 20_000;

/// Builds the model, the whole training set (every task holds it; which
/// examples a task trains is the shard dispatcher's decision) and the
/// held-out data for evaluation.
pub fn build(spec: &WorkloadSpec) -> Result<Workload, WorkloadError> {
    if is_sparse_model(&spec.model) && spec.keras.model_file.is_none() {
        return sparse::build(spec);
    }
    if spec.sparse.train_files.is_some() || spec.sparse.format.is_some() {
        return Err(WorkloadError::Flag {
            field: "train_files",
            reason: "--train_files and the libsvm and criteo formats are for --model=sparse_lr or wide_deep".into(),
        });
    }
    keras::check_flags(spec)?;
    let (model, train, test, default_batch) = match &spec.keras.model_file {
        Some(file) => keras::model_and_data(spec, file)?,
        None => built_in(spec)?,
    };
    let batch_size = spec.batch_size.unwrap_or(default_batch);
    if batch_size == 0 {
        return Err(WorkloadError::Flag { field: "batch_size", reason: "must be at least 1".into() });
    }
    let eval = test.head(spec.eval_examples.max(1));
    Ok(Workload { model, train: Arc::new(InMemoryTrainingSet::new(train)), batch_size, eval: Some(eval) })
}

/// A built-in model (linear, softmax, mlp) with its training and held-out
/// data, and its classic batch size.
fn built_in(spec: &WorkloadSpec) -> Result<(Box<dyn Model>, Dataset, Dataset, usize), WorkloadError> {
    let (hidden_units, activation) = mlp_options(spec.hidden_units.as_deref(), spec.activation.as_deref())?;
    let weight_init = match &spec.weight_init {
        Some(w) => w.parse::<WeightInit>().map_err(as_flag)?,
        None => WeightInit::default(),
    };
    let name = spec.model.to_ascii_lowercase();
    let (train, test, input_dim, num_classes, default_batch) = match name.as_str() {
        "linear" => {
            let train = data::synthetic_line(spec.seed);
            let test = data::synthetic_line(spec.seed.wrapping_add(1_000_003));
            (train, test, 1, 1, 1)
        }
        "softmax" | "mlp" => {
            let (train, test, classes) = match &spec.data_dir {
                Some(dir) => {
                    let d = data::load_training_data(dir, &spec.data, data::LabelKind::Classes)?;
                    let classes = d.num_classes(&spec.data).unwrap_or(2);
                    tracing::info!(
                        "read {} training and {} held-out examples of {} features, {classes} classes, from {}",
                        d.train.len(),
                        d.test.len(),
                        d.train.input_dim(),
                        dir.display()
                    );
                    (d.train, d.test, classes)
                }
                None => {
                    let classes = spec.data.num_classes.unwrap_or(10);
                    tracing::info!(
                        "no --data_dir given: using synthetic MNIST-shaped data ({SYNTHETIC_TRAIN_EXAMPLES} training examples of 784 pixels, {classes} classes)"
                    );
                    // The same seed on every task: the same set, then each task takes its own shard.
                    let (train, test) = data::synthetic_images(784, classes.max(1), SYNTHETIC_TRAIN_EXAMPLES, spec.eval_examples.max(1), 20240601);
                    (train, test, classes)
                }
            };
            let dim = train.input_dim();
            (train, test, dim, classes, 100)
        }
        other => {
            return Err(WorkloadError::Flag {
                field: "model",
                reason: format!("unknown model {other:?} (linear, softmax, mlp, sparse_lr, wide_deep; or --keras_model FILE)"),
            });
        }
    };
    let model = model::build_model(&ModelConfig { name: name.clone(), input_dim, num_classes, hidden_units, activation, weight_init })?;
    Ok((model, train, test, default_batch))
}

/// The mlp's hidden layers and activation from `--hidden_units` and
/// `--activation` (defaults: one layer of 100, sigmoid: the classic
/// 784-100-10 network).
pub(crate) fn mlp_options(hidden_units: Option<&[usize]>, activation: Option<&str>) -> Result<(Vec<usize>, Activation), WorkloadError> {
    let activation = match activation {
        Some(a) => a.parse::<Activation>().map_err(as_flag)?,
        None => Activation::Sigmoid,
    };
    Ok((hidden_units.map_or_else(|| vec![100], <[usize]>::to_vec), activation))
}

/// A bad value of a model flag, as the flag's error.
fn as_flag(e: model::ModelError) -> WorkloadError {
    match e {
        model::ModelError::Invalid { field, reason } => WorkloadError::Flag { field, reason },
        other => WorkloadError::Model(other),
    }
}

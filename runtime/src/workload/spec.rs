//! What to train, as the command line gives it ([`WorkloadSpec`]), the
//! options of the Keras and sparse models, and the errors of building a
//! workload: what every workload builder shares.

use std::path::{Path, PathBuf};

use crate::data::{self, SparseFormat};
use crate::model::keras::{KerasError, KerasModel, default_loss, load_model_file};
use crate::model::{self, Activation};
use crate::placement::PartitionStrategy;

/// What to train, as given on the command line.
#[derive(Debug, Clone, Default, PartialEq)]
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

impl WorkloadError {
    /// Whether building again later may succeed (data on storage that could
    /// not be reached); a bad flag, model or data is permanent.
    pub fn is_transient(&self) -> bool {
        matches!(self, WorkloadError::Data(e) if e.is_transient())
    }

    /// The exit code of a task that could not build its workload.
    pub fn exit_code(&self) -> u8 {
        crate::exit::code::of(self.is_transient(), crate::exit::code::CONFIG)
    }
}

/// Examples in the synthetic classification set when no `--data_dir` is given.
pub const SYNTHETIC_TRAIN_EXAMPLES: usize = 20_000;

/// `--keras_model`, `--loss`, `--from_logits`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KerasOptions {
    /// The JSON of `model.to_json()`.
    pub model_file: Option<PathBuf>,
    /// `None`: from the model's last activation ([`default_loss`]).
    pub loss: Option<String>,
    pub from_logits: bool,
}

impl KerasOptions {
    /// Reads the model file and builds the model with the loss `--loss`
    /// names (or the one its last activation implies).
    pub fn build(&self, file: &Path, seed: u64) -> Result<KerasModel, WorkloadError> {
        let spec = load_model_file(file)?;
        let loss = match &self.loss {
            Some(name) => name.parse().map_err(|reason| WorkloadError::Flag { field: "loss", reason })?,
            None => {
                let loss = default_loss(&spec);
                tracing::info!("no --loss given: {loss}, from the model's last activation");
                loss
            }
        };
        KerasModel::new(&spec, loss, self.from_logits, seed).map_err(|e| KerasError::InFile { path: file.to_path_buf(), source: Box::new(e) }.into())
    }
}

/// The flags of the sparse models and their data.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseOptions {
    /// `--data_format` libsvm or criteo (default: criteo for wide_deep, libsvm for sparse_lr).
    pub format: Option<SparseFormat>,
    pub train_files: Option<String>,
    pub eval_files: Option<String>,
    pub skip_bad_lines: bool,
    pub embedding_dim: usize,
    pub hash_buckets: usize,
    pub partition: PartitionStrategy,
    /// Pull and push the embeddings whole (the baseline).
    pub dense_embeddings: bool,
    /// Training examples generated when no `--train_files` is given.
    pub generated_examples: u64,
}

impl Default for SparseOptions {
    fn default() -> Self {
        SparseOptions {
            format: None,
            train_files: None,
            eval_files: None,
            skip_bad_lines: false,
            embedding_dim: 8,
            hash_buckets: 1 << 20,
            partition: PartitionStrategy::Consistent,
            dense_embeddings: false,
            generated_examples: 20_000,
        }
    }
}

/// Is `model` one of the sparse models?
pub fn is_sparse_model(model: &str) -> bool {
    matches!(model.to_ascii_lowercase().as_str(), "sparse_lr" | "wide_deep")
}

/// A bad value of `--field`, as the flag's error.
pub(crate) fn flag(field: &'static str, reason: impl Into<String>) -> WorkloadError {
    WorkloadError::Flag { field, reason: reason.into() }
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
pub(crate) fn as_flag(e: model::ModelError) -> WorkloadError {
    match e {
        model::ModelError::Invalid { field, reason } => WorkloadError::Flag { field, reason },
        other => WorkloadError::Model(other),
    }
}

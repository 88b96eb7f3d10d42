//! The built-in models (linear, softmax, mlp) with their data, and
//! [`build`], which picks the builder a [`WorkloadSpec`] asks for.

use std::sync::Arc;

use super::spec::{SYNTHETIC_TRAIN_EXAMPLES, WorkloadError, WorkloadSpec, as_flag, is_sparse_model, mlp_options};
use super::{keras, sparse};
use crate::data::{self, Dataset, InMemoryTrainingSet};
use crate::model::{self, Model, ModelConfig, WeightInit};
use crate::train::Workload;

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

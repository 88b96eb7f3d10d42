//! Models with explicit forward and backward passes on ndarray.
//!
//! A model is plain data: its variables (name, shape, initialiser) and pure
//! functions from parameter values and a batch to loss, gradients and
//! metrics. Parameters and gradients are passed in the order of
//! [`Model::variables`].

use ndarray::ArrayD;

use crate::data::Batch;

/// How a variable's initial value is drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Init {
    Zeros,
    Constant(f32),
    /// Normal(0, stddev).
    Normal { stddev: f32 },
    /// Normal(0, stddev) truncated at two standard deviations (TensorFlow's
    /// `truncated_normal`).
    TruncatedNormal { stddev: f32 },
    /// Uniform(-limit, limit).
    Uniform { limit: f32 },
}

/// A trainable variable of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

impl VariableSpec {
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Figures computed on a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub loss: f32,
    /// Fraction of correct predictions, for classifiers.
    pub accuracy: Option<f32>,
    pub examples: usize,
}

/// Loss and gradients of one batch.
#[derive(Debug, Clone)]
pub struct LossAndGradients {
    pub loss: f32,
    /// One per variable, same order and shape as [`Model::variables`].
    pub gradients: Vec<ArrayD<f32>>,
}

pub trait Model: Send + Sync {
    /// A short name (`linear`, `softmax`, `mlp`).
    fn name(&self) -> &str;
    fn variables(&self) -> Vec<VariableSpec>;
    /// Mean loss over the batch and its gradients with respect to every variable.
    fn loss_and_gradients(&self, params: &[ArrayD<f32>], batch: &Batch) -> LossAndGradients;
    /// Loss (and accuracy for classifiers) without gradients.
    fn evaluate(&self, params: &[ArrayD<f32>], batch: &Batch) -> Metrics;
    /// Figures worth printing in a log line beside the loss, read from the
    /// parameters (`W` and `b` for the linear model; empty for others).
    fn summary(&self, _params: &[ArrayD<f32>]) -> Vec<(String, f64)> {
        Vec::new()
    }
}

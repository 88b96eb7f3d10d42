//! The built-in models' configuration ([`ModelConfig`]: name, sizes,
//! activation, weight initialiser), its errors, and the names Keras gives
//! their Dense layers.

use std::fmt;
use std::str::FromStr;

/// Activation of the hidden layers of an [`Mlp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `1 / (1 + e^-z)`, as in the classic MNIST tutorials.
    Sigmoid,
    /// `max(0, z)`, as in `mnist_replica.py`.
    Relu,
    Tanh,
}

impl Activation {
    pub const ALL: [Activation; 3] = [Activation::Sigmoid, Activation::Relu, Activation::Tanh];

    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Sigmoid => "sigmoid",
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Activation {
    type Err = ModelError;
    /// Case-insensitive `sigmoid`, `relu` or `tanh`.
    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sigmoid" => Ok(Activation::Sigmoid),
            "relu" => Ok(Activation::Relu),
            "tanh" => Ok(Activation::Tanh),
            _ => Err(ModelError::Invalid { field: "activation", reason: format!("unknown activation {s:?} (expected sigmoid, relu or tanh)") }),
        }
    }
}

/// How the weight matrices of an [`Mlp`] are initialised (biases always
/// start at zero). The linear and softmax models keep their classic
/// initialisers whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightInit {
    /// `truncated_normal(stddev = 1/sqrt(fan_in))`, as the classic
    /// distributed MNIST example (`mnist_replica.py`) did.
    #[default]
    TruncatedNormal,
    /// Normal(0, 1): the initialisation of the reference figure in
    /// `shared/data/synthetic-mnist/README.md` (sigmoid, lr 0.5, batch 100).
    Normal,
}

impl WeightInit {
    pub fn as_str(self) -> &'static str {
        match self {
            WeightInit::TruncatedNormal => "truncated_normal",
            WeightInit::Normal => "normal",
        }
    }
}

impl fmt::Display for WeightInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WeightInit {
    type Err = ModelError;
    /// Case-insensitive `truncated_normal` (or `truncated-normal`) or `normal`.
    fn from_str(s: &str) -> Result<Self, ModelError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "truncated_normal" | "truncated-normal" => Ok(WeightInit::TruncatedNormal),
            "normal" => Ok(WeightInit::Normal),
            _ => Err(ModelError::Invalid { field: "weight_init", reason: format!("unknown initialisation {s:?} (expected truncated_normal or normal)") }),
        }
    }
}

/// What [`build_model`] builds.
///
/// - `linear`: uses `input_dim` (the number of features, 1 for the classic
///   example); `num_classes`, `hidden_units`, `activation` and
///   `weight_init` are ignored.
/// - `softmax`: uses `input_dim` and `num_classes` (at least 2);
///   `hidden_units`, `activation` and `weight_init` are ignored.
/// - `mlp`: uses everything; `hidden_units` must list at least one width,
///   each at least 1.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `linear`, `softmax` or `mlp` (case-insensitive).
    pub name: String,
    pub input_dim: usize,
    pub num_classes: usize,
    pub hidden_units: Vec<usize>,
    pub activation: Activation,
    pub weight_init: WeightInit,
}

impl ModelConfig {
    /// The classic `y = W·x + b` example has `n_features = 1`.
    pub fn linear(n_features: usize) -> Self {
        ModelConfig {
            name: "linear".into(),
            input_dim: n_features,
            num_classes: 1,
            hidden_units: Vec::new(),
            activation: Activation::Sigmoid,
            weight_init: WeightInit::default(),
        }
    }

    pub fn softmax(input_dim: usize, num_classes: usize) -> Self {
        ModelConfig { name: "softmax".into(), num_classes, ..Self::linear(input_dim) }
    }

    /// E.g. `ModelConfig::mlp(784, &[100], 10, Activation::Sigmoid)` for
    /// the classic 784-100-10 network.
    pub fn mlp(input_dim: usize, hidden_units: &[usize], num_classes: usize, activation: Activation) -> Self {
        ModelConfig { name: "mlp".into(), input_dim, num_classes, hidden_units: hidden_units.to_vec(), activation, weight_init: WeightInit::default() }
    }

    pub fn with_weight_init(mut self, weight_init: WeightInit) -> Self {
        self.weight_init = weight_init;
        self
    }
}

/// A [`ModelConfig`] that cannot be built. [`ModelError::field`] names the
/// offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("model name: unknown model {name:?} (expected linear, softmax or mlp)")]
    UnknownModel { name: String },
    #[error("model {model}: {field}: {reason}")]
    BadSize { model: &'static str, field: &'static str, reason: String },
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl ModelError {
    /// The name of the [`ModelConfig`] field (or flag) that is wrong.
    pub fn field(&self) -> &'static str {
        match self {
            ModelError::UnknownModel { .. } => "name",
            ModelError::BadSize { field, .. } | ModelError::Invalid { field, .. } => field,
        }
    }
}

/// The name Keras gives the `i`-th Dense layer of a model, counted from 0:
/// `dense`, `dense_1`, `dense_2`, ...
pub fn dense_layer_name(i: usize) -> String {
    if i == 0 { "dense".to_string() } else { format!("dense_{i}") }
}

/// The variable `<layer>/<weight>` of the `i`-th Dense layer (`dense_1/kernel`).
pub(crate) fn dense_variable(i: usize, weight: &str) -> String {
    format!("{}/{weight}", dense_layer_name(i))
}

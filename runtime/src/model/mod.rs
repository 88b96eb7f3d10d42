//! Models with explicit forward and backward passes on ndarray.
//!
//! A model is plain data: its variables (name, shape, initialiser) and pure
//! functions from parameter values and a batch to loss, gradients and
//! metrics. Parameters and gradients are passed in the order of
//! [`Model::variables`].
//!
//! Three built-in models, built from a [`ModelConfig`] by [`build_model`]:
//!
//! | name      | type                  | variables (in order)                              |
//! |-----------|-----------------------|---------------------------------------------------|
//! | `linear`  | [`LinearRegression`]  | `dense/kernel` `[n_features, 1]`, `dense/bias` `[1]` |
//! | `softmax` | [`SoftmaxRegression`] | `dense/kernel` `[n_in, n_classes]`, `dense/bias` `[n_classes]` |
//! | `mlp`     | [`Mlp`]               | see [`Mlp`]: `dense/kernel`, `dense/bias`, `dense_1/kernel`, `dense_1/bias` for one hidden layer |
//!
//! Models defined by Keras's `model.to_json()` are built by [`keras::KerasModel`].
//!
//! The built-in models are presets: each is a stack of Keras Dense layers
//! ([`preset_spec`]) whose variables have the same names, shapes and
//! initialisers, so a checkpoint of one is exported, and used by `predict`
//! and `evaluate`, as that Keras model ([`preset`]). They train with their
//! own fused forward and backward passes (the benchmarked hot path); the
//! tests check that both compute the same loss and gradients.
//!
//! The arithmetic is written once, generically over the float type (see
//! [`Real`]), so the tests can run the very same code in `f64` for finite
//! difference gradient checks; the models run it in `f32`.

use std::fmt;
use std::str::FromStr;

use ndarray::{ArrayD, ArrayView2, ArrayViewD, Ix2, NdFloat};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::data::{Batch, Targets};
use crate::init::{Init, RowInit, fill_init};
use crate::placement::PartitionStrategy;

mod dense;
pub mod keras;
mod linear;
mod sparse;

pub use dense::{Mlp, SoftmaxRegression};
pub use linear::LinearRegression;
pub use sparse::{SparseModel, SparseModelConfig};

/// A trainable variable of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
    /// Set for an embedding (`shape` `[rows, dim]`): its rows are
    /// partitioned over every ps task and each row starts from its own
    /// value ([`crate::init::RowInit`]).
    pub embedding: Option<EmbeddingDecl>,
}

/// How an embedding variable is stored and moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingDecl {
    pub partition: PartitionStrategy,
    /// Pulled and pushed by row (the batch's rows only; the ps keeps the
    /// rows updated so far). False: pulled and pushed whole like a dense
    /// variable (the baseline sparse training is compared against); its
    /// rows still start from the same values.
    pub sparse: bool,
}

impl VariableSpec {
    /// A dense variable.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, init: Init) -> Self {
        VariableSpec { name: name.into(), shape, init, embedding: None }
    }

    /// An embedding of `rows × dim`.
    pub fn embedding(name: impl Into<String>, rows: usize, dim: usize, init: Init, decl: EmbeddingDecl) -> Self {
        VariableSpec { name: name.into(), shape: vec![rows, dim], init, embedding: Some(decl) }
    }

    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// An embedding pulled and pushed by row.
    pub fn is_sparse(&self) -> bool {
        self.embedding.is_some_and(|e| e.sparse)
    }

    /// The shape a worker holds it in: a sparse embedding's rows of the
    /// moment (`[n, dim]`, none at first); any other variable whole.
    pub fn held_shape(&self, rows: usize) -> Vec<usize> {
        if self.is_sparse() { vec![rows, self.shape[1]] } else { self.shape.clone() }
    }
}

/// Figures computed on a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub loss: f32,
    /// Fraction of correct predictions, for classifiers.
    pub accuracy: Option<f32>,
    pub examples: usize,
    /// Area under the ROC curve, for binary classifiers (the sparse models).
    pub auc: Option<f32>,
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
    /// An empty batch gives loss 0 and zero gradients.
    ///
    /// # Panics
    /// If `params` do not match [`Model::variables`] (count and shapes, the
    /// message names the variable), or the batch has the wrong number of
    /// features, the wrong kind of targets or a label out of range: all
    /// bugs of the caller, since loaders validate what they read.
    fn loss_and_gradients(&self, params: &[ArrayD<f32>], batch: &Batch) -> LossAndGradients;
    /// Loss (and accuracy for classifiers) without gradients.
    fn evaluate(&self, params: &[ArrayD<f32>], batch: &Batch) -> Metrics;
    /// Figures worth printing in a log line beside the loss, read from the
    /// parameters (`W` and `b` for the linear model; empty for others).
    fn summary(&self, _params: &[ArrayD<f32>]) -> Vec<(String, f64)> {
        Vec::new()
    }
    /// The rows of each sparse embedding the batch touches: one list per
    /// variable of [`Model::variables`] (empty for the others), each sorted
    /// and without repeats. The parameters of a sparse embedding passed to
    /// [`loss_and_gradients`](Model::loss_and_gradients) and
    /// [`evaluate`](Model::evaluate) are these rows, in this order, and so
    /// is its gradient.
    fn row_ids(&self, _batch: &Batch) -> Vec<Vec<i64>> {
        vec![Vec::new(); self.variables().len()]
    }
}

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

/// Builds the model a [`ModelConfig`] describes.
pub fn build_model(cfg: &ModelConfig) -> Result<Box<dyn Model>, ModelError> {
    let name = cfg.name.trim().to_ascii_lowercase();
    let bad = |model: &'static str, field: &'static str, reason: String| ModelError::BadSize { model, field, reason };
    match name.as_str() {
        "linear" => {
            if cfg.input_dim == 0 {
                return Err(bad("linear", "input_dim", "must be at least 1".into()));
            }
            Ok(Box::new(LinearRegression::new(cfg.input_dim)))
        }
        "softmax" | "mlp" => {
            let model: &'static str = if name == "mlp" { "mlp" } else { "softmax" };
            if cfg.input_dim == 0 {
                return Err(bad(model, "input_dim", "must be at least 1".into()));
            }
            if cfg.num_classes < 2 {
                return Err(bad(model, "num_classes", format!("must be at least 2, got {}", cfg.num_classes)));
            }
            if model == "softmax" {
                return Ok(Box::new(SoftmaxRegression::new(cfg.input_dim, cfg.num_classes)));
            }
            if cfg.hidden_units.is_empty() {
                return Err(bad("mlp", "hidden_units", "needs at least one hidden layer (use the softmax model for none)".into()));
            }
            if let Some(i) = cfg.hidden_units.iter().position(|&w| w == 0) {
                return Err(bad("mlp", "hidden_units", format!("hidden layer {i} has 0 units; every layer needs at least 1")));
            }
            Ok(Box::new(Mlp::new(cfg.input_dim, &cfg.hidden_units, cfg.num_classes, cfg.activation, cfg.weight_init)))
        }
        _ => Err(ModelError::UnknownModel { name: cfg.name.clone() }),
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

/// The built-in model `cfg` as the Keras model it is, with the loss it
/// trains with: `linear` is `Dense(1)` with mse; `softmax` is
/// `Dense(n_classes, softmax)` and `mlp` `Dense(h, activation)`... then
/// `Dense(n_classes, softmax)`, with sparse categorical cross-entropy. The
/// variables of the Keras model are those of [`build_model`]'s (names,
/// shapes, initialisers). Errors as [`build_model`]'s.
pub fn preset_spec(cfg: &ModelConfig) -> Result<(keras::ModelSpec, keras::Loss), ModelError> {
    use keras::{Act, InitSpec, KerasFormat, LayerKind, LayerSpec, Loss};
    let model = build_model(cfg)?;
    let name = model.name().to_string();
    let variables = model.variables();
    let init = |v: &VariableSpec| match v.init {
        Init::Zeros => InitSpec::Zeros,
        Init::Constant(c) => InitSpec::Constant(c),
        Init::Normal { stddev } => InitSpec::RandomNormal { stddev },
        Init::TruncatedNormal { stddev } => InitSpec::TruncatedNormal { stddev },
        Init::Uniform { limit } => InitSpec::RandomUniform { limit },
    };
    let hidden = match name.as_str() {
        "mlp" => cfg.hidden_units.len(),
        _ => 0,
    };
    let hidden_act = match cfg.activation {
        Activation::Sigmoid => Act::Sigmoid,
        Activation::Relu => Act::Relu,
        Activation::Tanh => Act::Tanh,
    };
    let (last_act, loss) = if name == "linear" { (Act::Linear, Loss::MeanSquaredError) } else { (Act::Softmax, Loss::SparseCategoricalCrossentropy) };
    let layers = variables
        .chunks_exact(2)
        .enumerate()
        .map(|(i, kb)| LayerSpec {
            name: dense_layer_name(i),
            class: "Dense".into(),
            kind: LayerKind::Dense {
                units: kb[0].shape[1],
                activation: if i < hidden { hidden_act } else { last_act },
                use_bias: true,
                kernel_init: init(&kb[0]),
                bias_init: init(&kb[1]),
            },
        })
        .collect();
    Ok((keras::ModelSpec { name, format: KerasFormat::Keras3, input_shape: vec![cfg.input_dim], layers }, loss))
}

/// The built-in model `cfg` as a [`keras::KerasModel`] ([`preset_spec`]):
/// what `export`, `predict` and `evaluate` see in its checkpoints.
pub fn preset(cfg: &ModelConfig) -> Result<keras::KerasModel, ModelError> {
    let (spec, loss) = preset_spec(cfg)?;
    keras::KerasModel::new(&spec, loss, false, 1).map_err(|e| ModelError::Invalid { field: "model", reason: e.to_string() })
}

/// Initial values of `specs`, in order. Deterministic given `seed`: the
/// values are drawn one variable after another from one generator seeded
/// with `seed`. `TruncatedNormal` resamples draws beyond two standard
/// deviations, like TensorFlow's `truncated_normal`. An embedding's rows
/// each come from their own generator ([`RowInit`]), so a dense embedding
/// starts exactly as its sparse twin's rows do; a sparse embedding has no
/// values here (`[0, dim]`: the ps gives every row its initial value).
pub fn init_values(specs: &[VariableSpec], seed: u64) -> Vec<ArrayD<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    specs
        .iter()
        .map(|spec| {
            let mut values = vec![0.0f32; if spec.is_sparse() { 0 } else { spec.num_elements() }];
            match spec.embedding {
                Some(_) => {
                    let rows = RowInit::new(&spec.name, spec.init.clone(), seed);
                    for (id, row) in values.chunks_mut(spec.shape[1].max(1)).enumerate() {
                        rows.fill(id as i64, row);
                    }
                }
                None => fill_init(&spec.init, &mut rng, &mut values),
            }
            ArrayD::from_shape_vec(spec.held_shape(0), values).expect("shape matches the element count")
        })
        .collect()
}

/// The float types the model arithmetic is written for (`f32` for
/// training, `f64` for the finite-difference checks in tests).
pub trait Real: NdFloat {
    /// The value of an `f64` constant in this type.
    fn cst(v: f64) -> Self;
    /// Widens to `f64`.
    fn widen(self) -> f64;
}

impl Real for f32 {
    #[inline]
    fn cst(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn widen(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    #[inline]
    fn cst(v: f64) -> Self {
        v
    }
    #[inline]
    fn widen(self) -> f64 {
        self
    }
}

/// Targets as the generic arithmetic sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TargetsView<'a, F> {
    Values(ArrayView2<'a, F>),
    Labels(&'a [u32]),
}

/// What one pass over a batch produces.
#[derive(Debug, Clone)]
pub(crate) struct Pass<F> {
    /// Mean loss over the batch, accumulated in f64.
    pub loss: f64,
    /// Correct predictions, for classifiers.
    pub correct: Option<usize>,
    /// Gradients (when asked for), in variable order.
    pub gradients: Vec<ArrayD<F>>,
}

/// Checks `params` against `specs` (count and shapes), naming the variable
/// that is wrong. Parameters with a wrong shape are a bug of the caller.
pub(crate) fn check_params<F>(model: &str, specs: &[VariableSpec], params: &[ArrayD<F>]) {
    assert_eq!(params.len(), specs.len(), "{model}: expected {} parameter tensors, got {}", specs.len(), params.len());
    for (spec, p) in specs.iter().zip(params) {
        assert_eq!(p.shape(), spec.shape.as_slice(), "{model}: variable {} has shape {:?}, expected {:?}", spec.name, p.shape(), spec.shape);
    }
}

/// A parameter viewed as a matrix (a 1-d bias becomes a single row).
pub(crate) fn as_matrix<'a, F>(p: &'a ArrayD<F>) -> ArrayView2<'a, F> {
    let v: ArrayViewD<'a, F> = p.view();
    if v.ndim() == 1 {
        let n = v.len();
        v.into_shape_with_order((1, n)).expect("1-d to row")
    } else {
        v.into_dimensionality::<Ix2>().expect("2-d parameter")
    }
}

/// Metrics of a pass over `batch`.
pub(crate) fn metrics(pass_loss: f64, correct: Option<usize>, batch: &Batch) -> Metrics {
    let n = batch.len();
    Metrics {
        loss: pass_loss as f32,
        accuracy: match correct {
            Some(c) if n > 0 => Some(c as f32 / n as f32),
            _ => None,
        },
        examples: n,
        auc: None,
    }
}

/// The batch's targets as the generic arithmetic sees them.
pub(crate) fn targets_view(t: &Targets) -> TargetsView<'_, f32> {
    match t {
        Targets::Values(v) => TargetsView::Values(v.view()),
        Targets::Labels(l) => TargetsView::Labels(l),
    }
}

#[cfg(test)]
mod tests;

//! What a model is to the rest of the runtime: its variables
//! ([`VariableSpec`]), the [`Model`] trait, their initial values, and the
//! float arithmetic every model shares ([`Real`], passes, metrics).

use ndarray::{ArrayD, ArrayView2, ArrayViewD, Ix2, NdFloat};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::data::{Batch, Targets};
use crate::init::{Init, RowInit, fill_init};
use crate::placement::PartitionStrategy;

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
    /// The work on `batch` that needs no parameters, done ahead: a worker
    /// calls it for the batches after the next while a step's round trip is
    /// on the wire. The sparse models find the batch's rows (kept with the
    /// batch for [`row_ids`](Model::row_ids)); the others have nothing to do.
    fn prepare(&self, _batch: &Batch) {}
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

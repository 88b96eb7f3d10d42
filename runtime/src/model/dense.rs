//! Softmax regression and the multi-layer perceptron: stacks of dense
//! layers ending in a softmax cross-entropy, sharing one forward and
//! backward pass.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayD, ArrayView2, Axis, Zip};

use super::config::{Activation, WeightInit, dense_variable};
use super::spec::{LossAndGradients, Metrics, Model, Pass, Real, TargetsView, VariableSpec, as_matrix, check_params, metrics, targets_view};
use crate::data::Batch;
use crate::init::Init;

/// Softmax (multinomial logistic) regression: `logits = x·weights + biases`,
/// loss = mean over the batch of the softmax cross-entropy.
///
/// Variables (named as Keras names the one Dense layer of the same model,
/// [`crate::model::preset_spec`]): `dense/kernel` (the tutorial's `weights`)
/// `[n_in, n_classes]` and `dense/bias` (`biases`) `[n_classes]`, both
/// zeros, as in TensorFlow's MNIST beginner tutorial. Targets must be
/// [`Targets::Labels`](crate::data::Targets::Labels) in `0..n_classes`.
#[derive(Debug, Clone)]
pub struct SoftmaxRegression {
    input_dim: usize,
    num_classes: usize,
    specs: Vec<VariableSpec>,
}

impl SoftmaxRegression {
    /// # Panics
    /// If a size is 0 ([`build_model`](crate::model::build_model) reports that as an error).
    pub fn new(input_dim: usize, num_classes: usize) -> Self {
        assert!(input_dim > 0 && num_classes > 0, "softmax: sizes must be at least 1");
        let specs = vec![
            VariableSpec::new(dense_variable(0, "kernel"), vec![input_dim, num_classes], Init::Zeros),
            VariableSpec::new(dense_variable(0, "bias"), vec![num_classes], Init::Zeros),
        ];
        SoftmaxRegression { input_dim, num_classes, specs }
    }

    pub fn input_dim(&self) -> usize {
        self.input_dim
    }

    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    pub(crate) fn pass<F: Real>(&self, params: &[ArrayD<F>], x: ArrayView2<'_, F>, t: TargetsView<'_, F>, want_gradients: bool) -> Pass<F> {
        check_params("softmax", &self.specs, params);
        let layers = [(as_matrix(&params[0]), as_matrix(&params[1]))];
        dense_pass("softmax", &layers, Activation::Sigmoid, x, labels_of("softmax", t), want_gradients)
    }
}

/// A multi-layer perceptron: hidden dense layers with one activation, then a
/// dense output layer with softmax cross-entropy (mean over the batch).
///
/// Variables are named as Keras names the Dense layers of the same model
/// ([`crate::model::preset_spec`]: `dense`, `dense_1`, ... from the input), so that
/// `export`, `predict` and `evaluate` treat a trained mlp as that Keras model,
/// in this order:
/// - one hidden layer: `dense/kernel` `[n_in, h]`, `dense/bias` `[h]`, then the
///   output layer `dense_1/kernel` `[h, n_classes]`, `dense_1/bias` `[n_classes]`
///   (784-100-10: the classic example's `hid_w` `[784, 100]`, `hid_b` `[100]`,
///   `sm_w` `[100, 10]`, `sm_b` `[10]`);
/// - several hidden layers: `dense/...`, `dense_1/...`, `dense_2/...`, then the
///   output layer's.
///
/// Weights are initialised per [`WeightInit`]; biases start at zero.
#[derive(Debug, Clone)]
pub struct Mlp {
    input_dim: usize,
    hidden_units: Vec<usize>,
    num_classes: usize,
    activation: Activation,
    weight_init: WeightInit,
    specs: Vec<VariableSpec>,
}

impl Mlp {
    /// # Panics
    /// If `hidden_units` is empty or a size is 0 ([`build_model`](crate::model::build_model)
    /// reports those as errors).
    pub fn new(input_dim: usize, hidden_units: &[usize], num_classes: usize, activation: Activation, weight_init: WeightInit) -> Self {
        assert!(input_dim > 0 && num_classes > 0, "mlp: sizes must be at least 1");
        assert!(!hidden_units.is_empty() && hidden_units.iter().all(|&h| h > 0), "mlp: needs hidden layers of at least 1 unit");
        let weight = |fan_in: usize| match weight_init {
            WeightInit::TruncatedNormal => Init::TruncatedNormal { stddev: 1.0 / (fan_in as f32).sqrt() },
            WeightInit::Normal => Init::Normal { stddev: 1.0 },
        };
        let mut specs = Vec::with_capacity(2 * hidden_units.len() + 2);
        let mut fan_in = input_dim;
        for (i, &h) in hidden_units.iter().enumerate() {
            specs.push(VariableSpec::new(dense_variable(i, "kernel"), vec![fan_in, h], weight(fan_in)));
            specs.push(VariableSpec::new(dense_variable(i, "bias"), vec![h], Init::Zeros));
            fan_in = h;
        }
        let out = hidden_units.len();
        specs.push(VariableSpec::new(dense_variable(out, "kernel"), vec![fan_in, num_classes], weight(fan_in)));
        specs.push(VariableSpec::new(dense_variable(out, "bias"), vec![num_classes], Init::Zeros));
        Mlp { input_dim, hidden_units: hidden_units.to_vec(), num_classes, activation, weight_init, specs }
    }

    pub fn input_dim(&self) -> usize {
        self.input_dim
    }

    pub fn hidden_units(&self) -> &[usize] {
        &self.hidden_units
    }

    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    pub fn activation(&self) -> Activation {
        self.activation
    }

    pub fn weight_init(&self) -> WeightInit {
        self.weight_init
    }

    pub(crate) fn pass<F: Real>(&self, params: &[ArrayD<F>], x: ArrayView2<'_, F>, t: TargetsView<'_, F>, want_gradients: bool) -> Pass<F> {
        check_params("mlp", &self.specs, params);
        let layers: Vec<_> = params.chunks_exact(2).map(|wb| (as_matrix(&wb[0]), as_matrix(&wb[1]))).collect();
        dense_pass("mlp", &layers, self.activation, x, labels_of("mlp", t), want_gradients)
    }
}

fn labels_of<'a, F>(model: &str, t: TargetsView<'a, F>) -> &'a [u32] {
    match t {
        TargetsView::Labels(l) => l,
        TargetsView::Values(_) => panic!("{model}: needs class labels (Targets::Labels), got regression values"),
    }
}

impl Activation {
    /// Applies the activation to `z` in place.
    fn forward_inplace<F: Real>(self, z: &mut Array2<F>) {
        let one = F::one();
        match self {
            Activation::Sigmoid => z.mapv_inplace(|v| one / (one + (-v).exp())),
            Activation::Relu => z.mapv_inplace(|v| if v > F::zero() { v } else { F::zero() }),
            Activation::Tanh => z.mapv_inplace(|v| v.tanh()),
        }
    }

    /// Multiplies `delta` by the derivative of the activation, written in
    /// terms of the activation's output `a`.
    fn backward_inplace<F: Real>(self, delta: &mut Array2<F>, a: &Array2<F>) {
        let one = F::one();
        let zip = Zip::from(delta).and(a);
        match self {
            Activation::Sigmoid => zip.for_each(|d, &a| *d *= a * (one - a)),
            Activation::Relu => zip.for_each(|d, &a| {
                if a <= F::zero() {
                    *d = F::zero()
                }
            }),
            Activation::Tanh => zip.for_each(|d, &a| *d *= one - a * a),
        }
    }
}

/// `x·w + b` with `b` a single row broadcast over the batch.
fn affine<F: Real>(x: ArrayView2<'_, F>, w: ArrayView2<'_, F>, b: ArrayView2<'_, F>) -> Array2<F> {
    let mut z = Array2::zeros((x.nrows(), w.ncols()));
    z.rows_mut().into_iter().for_each(|mut row| row.assign(&b.row(0)));
    general_mat_mul(F::one(), &x, &w, F::one(), &mut z);
    z
}

/// Softmax cross-entropy of each row of `logits` against `labels`,
/// numerically stable (log-sum-exp with the row maximum subtracted).
/// Returns the summed loss (f64) and the number of rows whose arg-max is
/// the label. With `want_gradient`, `logits` is replaced by the gradient of
/// the *mean* loss: `(softmax - one_hot) / n`.
pub(super) fn softmax_cross_entropy<F: Real>(model: &str, logits: &mut Array2<F>, labels: &[u32], want_gradient: bool) -> (f64, usize) {
    let n = logits.nrows();
    let classes = logits.ncols();
    assert_eq!(labels.len(), n, "{model}: batch has {n} rows but {} labels", labels.len());
    let inv_n = F::cst(1.0 / n.max(1) as f64);
    let mut loss = 0.0f64;
    let mut correct = 0usize;
    for (mut row, &label) in logits.rows_mut().into_iter().zip(labels) {
        let y = label as usize;
        assert!(y < classes, "{model}: label {label} out of range 0..{classes}");
        let (mut arg, mut max) = (0usize, row[0]);
        for (j, &v) in row.iter().enumerate().skip(1) {
            if v > max {
                arg = j;
                max = v;
            }
        }
        if arg == y {
            correct += 1;
        }
        let zy = row[y];
        if want_gradient {
            row.mapv_inplace(|v| (v - max).exp());
            let sum = row.sum();
            loss += sum.widen().ln() - (zy - max).widen();
            let scale = inv_n / sum;
            row.mapv_inplace(|e| e * scale);
            row[y] -= inv_n;
        } else {
            let sum = row.iter().fold(F::zero(), |s, &v| s + (v - max).exp());
            loss += sum.widen().ln() - (zy - max).widen();
        }
    }
    (loss, correct)
}

/// Forward (and backward) through `layers` = [(W, b as a row)]: every layer
/// but the last is followed by `activation`; the last one gives the logits.
/// Gradients come out in the order W0, b0, W1, b1, ...
fn dense_pass<F: Real>(
    model: &str,
    layers: &[(ArrayView2<'_, F>, ArrayView2<'_, F>)],
    activation: Activation,
    x: ArrayView2<'_, F>,
    labels: &[u32],
    want_gradients: bool,
) -> Pass<F> {
    let n = x.nrows();
    let (w0, _) = layers[0];
    assert_eq!(x.ncols(), w0.nrows(), "{model}: batch has {} features, the model {}", x.ncols(), w0.nrows());
    let hidden = layers.len() - 1;
    // Outputs of the hidden layers, kept for the backward pass.
    let mut acts: Vec<Array2<F>> = Vec::with_capacity(hidden);
    for (w, b) in &layers[..hidden] {
        let input = acts.last().map_or(x, |a| a.view());
        let mut z = affine(input, *w, *b);
        activation.forward_inplace(&mut z);
        acts.push(z);
    }
    let (w_out, b_out) = layers[hidden];
    let mut logits = affine(acts.last().map_or(x, |a| a.view()), w_out, b_out);
    let (loss_sum, correct) = softmax_cross_entropy(model, &mut logits, labels, want_gradients);
    let loss = if n == 0 { 0.0 } else { loss_sum / n as f64 };
    if !want_gradients {
        return Pass { loss, correct: Some(correct), gradients: Vec::new() };
    }
    // Gradients, filled from the output layer backwards.
    let mut gradients: Vec<ArrayD<F>> = Vec::with_capacity(2 * layers.len());
    let mut delta = logits; // d loss / d logits
    for l in (0..=hidden).rev() {
        let input = if l == 0 { x } else { acts[l - 1].view() };
        if l < hidden {
            activation.backward_inplace(&mut delta, &acts[l]);
        }
        let db = delta.sum_axis(Axis(0));
        let dw = input.t().dot(&delta);
        gradients.push(db.into_dyn());
        gradients.push(dw.into_dyn());
        if l > 0 {
            delta = delta.dot(&layers[l].0.t());
        }
    }
    gradients.reverse();
    Pass { loss, correct: Some(correct), gradients }
}

macro_rules! classifier_model {
    ($ty:ty, $name:literal) => {
        impl Model for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn variables(&self) -> Vec<VariableSpec> {
                self.specs.clone()
            }

            fn loss_and_gradients(&self, params: &[ArrayD<f32>], batch: &Batch) -> LossAndGradients {
                let p = self.pass(params, batch.x.view(), targets_view(&batch.targets), true);
                LossAndGradients { loss: p.loss as f32, gradients: p.gradients }
            }

            fn evaluate(&self, params: &[ArrayD<f32>], batch: &Batch) -> Metrics {
                let p = self.pass(params, batch.x.view(), targets_view(&batch.targets), false);
                metrics(p.loss, p.correct, batch)
            }
        }
    };
}

classifier_model!(SoftmaxRegression, "softmax");
classifier_model!(Mlp, "mlp");

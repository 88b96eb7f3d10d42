//! Models defined by Keras: the JSON of `model.to_json()` (Keras 2 or 3) of a
//! Sequential or a plain functional stack, trained with the loss of
//! `--loss`.
//!
//! Layers: InputLayer, Dense (activations linear, relu, sigmoid, tanh,
//! softmax), Activation, Dropout, Flatten, Reshape, Conv2D and
//! MaxPooling2D/AveragePooling2D (channels-last, `valid`/`same`, strides),
//! Embedding (first layer only: the example's features are its ids).
//!
//! Variables are named `<layer name>/<weight name>` in Keras's shapes, in
//! layer order: Dense and Conv2D have `kernel` (`[in, units]`,
//! `[kh, kw, in_channels, filters]`) and `bias` (unless `use_bias` is
//! false), Embedding has `embeddings` (`[input_dim, output_dim]`). Their
//! initial values are drawn from `--seed` by the initialisers the JSON names
//! (Keras's defaults: glorot_uniform kernels, zero biases, uniform(-0.05,
//! 0.05) embeddings), with Keras's fan-in/fan-out rules.
//!
//! Dropout: the mask of the n-th training batch this process computes is
//! drawn from a generator seeded by (`--seed`, n, the layer's position), so a
//! run that sees the same batches draws the same masks; evaluation and
//! prediction use no dropout.

use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{Array2, ArrayD, ArrayView2};

use super::spec::{LossAndGradients, Metrics, Model, Pass, Real, TargetsView, VariableSpec, check_params, metrics, targets_view};
use crate::data::{Batch, Targets};
use crate::hash;
use crate::init::Init;

mod conv;
mod json;
mod layers;
mod loss;

pub use json::{Act, InitSpec, KerasError, KerasFormat, LayerKind, LayerSpec, ModelSpec, SUPPORTED_LAYERS, load_model_file, parse_model_json};
pub use loss::{Head, Loss};

use json::FanMode;
use layers::{Cache, Layer, Op};

/// A Keras model definition made trainable: layers with fixed shapes, the
/// loss, and the variables.
#[derive(Debug)]
pub struct KerasModel {
    name: String,
    input_shape: Vec<usize>,
    layers: Vec<Layer>,
    specs: Vec<VariableSpec>,
    loss: Loss,
    head: Head,
    seed: u64,
    /// Training batches computed so far: numbers the dropout masks.
    training_batches: AtomicU64,
}

/// How a variance-scaling truncated normal corrects its standard deviation
/// for the truncation at two standard deviations (Keras's constant).
const TRUNCATED_STDDEV_CORRECTION: f64 = 0.879_625_661_034_239_8;

impl KerasModel {
    /// Builds the model `spec` describes for `loss`. Without `from_logits`,
    /// the cross-entropies need the model to end in softmax (categorical)
    /// or sigmoid (binary), as Keras's default `from_logits=False` expects;
    /// with it, the outputs are the logits.
    pub fn new(spec: &ModelSpec, loss: Loss, from_logits: bool, seed: u64) -> Result<Self, KerasError> {
        let mut layers = Vec::with_capacity(spec.layers.len());
        let mut specs = Vec::new();
        let mut shape = spec.input_shape.clone();
        for l in &spec.layers {
            let layer = build_layer(l, &shape, &mut specs)?;
            shape = layer.output_shape.clone();
            layers.push(layer);
        }
        let last = layers.last().expect("parse_model_json rejects a model without layers");
        if shape.len() != 1 {
            return Err(KerasError::Layer {
                layer: last.name.clone(),
                class: last.class.clone(),
                reason: format!("the model's output must be one vector per example, this one is {shape:?} (add a Flatten)"),
            });
        }
        let head = output_head(&mut layers, loss, from_logits)?;
        Ok(KerasModel { name: spec.name.clone(), input_shape: spec.input_shape.clone(), layers, specs, loss, head, seed, training_batches: AtomicU64::new(0) })
    }

    /// The name in the JSON (`sequential`, ...).
    pub fn keras_name(&self) -> &str {
        &self.name
    }

    /// One example's shape (`[28, 28, 1]`).
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// Features per example: the elements of [`KerasModel::input_shape`].
    pub fn input_dim(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// Units of the last layer.
    pub fn output_units(&self) -> usize {
        self.layers.last().map_or(0, |l| l.output_shape[0])
    }

    pub fn loss(&self) -> Loss {
        self.loss
    }

    pub fn head(&self) -> Head {
        self.head
    }

    /// One line per layer: name, class, output shape, variables.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for l in &self.layers {
            let vars: Vec<String> =
                self.specs[l.first_variable..l.first_variable + l.num_variables].iter().map(|v| format!("{} {:?}", v.name, v.shape)).collect();
            out += &format!("{} ({}) -> {:?} {}\n", l.name, l.class, l.output_shape, vars.join(", "));
        }
        out
    }

    /// Checks that `x` can be the model's input: one row of
    /// [`KerasModel::input_dim`] features per example, and for an
    /// Embedding integer ids below its `input_dim`. The error names the
    /// first example (row) that does not fit.
    pub fn check_inputs(&self, x: &Array2<f32>) -> Result<(), String> {
        if x.ncols() != self.input_dim() {
            return Err(format!("examples have {} features but the model's input {:?} has {}", x.ncols(), self.input_shape, self.input_dim()));
        }
        if let Some(Op::Embedding { input_dim, .. }) = self.layers.first().map(|l| &l.op) {
            let bad = |v: f32| !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < *input_dim);
            if let Some((i, row)) = x.rows().into_iter().enumerate().find(|(_, r)| r.iter().any(|&v| bad(v))) {
                let v = row.iter().find(|&&v| bad(v)).expect("found above");
                return Err(format!("example {i}: {v} is not an embedding id (an integer in 0..{input_dim})"));
            }
        }
        Ok(())
    }

    /// Checks targets against the loss and the output units.
    pub fn check_targets(&self, targets: &Targets) -> Result<(), String> {
        self.loss.check_targets(targets, self.output_units())
    }

    /// The model's outputs for `x` (`[n, features]`): what Keras's
    /// `model.predict` gives (probabilities after a softmax or sigmoid,
    /// logits with `--from_logits`). No dropout.
    pub fn predict(&self, params: &[ArrayD<f32>], x: ArrayView2<'_, f32>) -> Array2<f32> {
        self.outputs(params, x)
    }

    /// [`KerasModel::predict`] for any float type.
    pub(crate) fn outputs<F: Real>(&self, params: &[ArrayD<F>], x: ArrayView2<'_, F>) -> Array2<F> {
        let (z, _) = self.forward(params, x, None, false);
        let mut out = z.into_dyn();
        match self.head {
            Head::Softmax => Act::Softmax.forward(&mut out),
            Head::Sigmoid => Act::Sigmoid.forward(&mut out),
            Head::Identity => {}
        }
        out.into_dimensionality().expect("2-d outputs")
    }

    /// The last layer's values (`[n, units]`) and, when `keep`, each layer's cache.
    fn forward<F: Real>(&self, params: &[ArrayD<F>], x: ArrayView2<'_, F>, dropout_seed: Option<u64>, keep: bool) -> (Array2<F>, Vec<Cache<F>>) {
        check_params("keras", &self.specs, params);
        let n = x.nrows();
        assert_eq!(x.ncols(), self.input_dim(), "keras: batch has {} features, the model {}", x.ncols(), self.input_dim());
        let mut shape = vec![n];
        shape.extend_from_slice(&self.input_shape);
        let mut a = x.as_standard_layout().into_owned().into_shape_with_order(shape).expect("element count checked");
        let mut caches = Vec::with_capacity(if keep { self.layers.len() } else { 0 });
        for (i, layer) in self.layers.iter().enumerate() {
            let seed = dropout_seed.map(|s| hash::dropout_seed(s, i as u64));
            let (out, cache) = layer.forward(params, a, seed, keep);
            if keep {
                caches.push(cache);
            }
            a = out;
        }
        let units = self.output_units();
        (a.into_shape_with_order((n, units)).expect("output [n, units]"), caches)
    }

    /// Loss, correct predictions and (when `want_gradients`) gradients of a
    /// batch. `dropout_seed`: the seed of this pass's dropout masks (none:
    /// no dropout).
    pub(crate) fn pass<F: Real>(
        &self,
        params: &[ArrayD<F>],
        x: ArrayView2<'_, F>,
        t: TargetsView<'_, F>,
        dropout_seed: Option<u64>,
        want_gradients: bool,
    ) -> Pass<F> {
        let n = x.nrows();
        let (mut z, mut caches) = self.forward(params, x, dropout_seed, want_gradients);
        let (loss_sum, correct) = self.loss.compute(self.head, &mut z, t, want_gradients);
        let loss = if n == 0 { 0.0 } else { loss_sum / n as f64 };
        if !want_gradients {
            return Pass { loss, correct, gradients: Vec::new() };
        }
        let mut gradients: Vec<ArrayD<F>> = self.specs.iter().map(|s| ArrayD::zeros(s.shape.clone())).collect();
        // Layers before the first one with variables need no input gradient.
        let first_trained = self.layers.iter().position(|l| l.num_variables > 0).unwrap_or(self.layers.len());
        let mut dy = Some(z.into_dyn());
        for (i, layer) in self.layers.iter().enumerate().rev() {
            let (Some(d), Some(cache)) = (dy.take(), caches.pop()) else { break };
            dy = layer.backward(params, cache, d, &mut gradients, i > first_trained);
        }
        Pass { loss, correct, gradients }
    }
}

/// The loss when `--loss` is not given, from the model's last activation:
/// softmax -> sparse_categorical_crossentropy, sigmoid -> binary_crossentropy,
/// anything else -> mse.
pub fn default_loss(spec: &ModelSpec) -> Loss {
    let last = spec.layers.last().map(|l| match &l.kind {
        LayerKind::Dense { activation, .. } | LayerKind::Conv2D { activation, .. } | LayerKind::Activation(activation) => *activation,
        _ => Act::Linear,
    });
    match last {
        Some(Act::Softmax) => Loss::SparseCategoricalCrossentropy,
        Some(Act::Sigmoid) => Loss::BinaryCrossentropy,
        _ => Loss::MeanSquaredError,
    }
}

impl Model for KerasModel {
    fn name(&self) -> &str {
        "keras"
    }

    fn variables(&self) -> Vec<VariableSpec> {
        self.specs.clone()
    }

    fn loss_and_gradients(&self, params: &[ArrayD<f32>], batch: &Batch) -> LossAndGradients {
        let n = self.training_batches.fetch_add(1, Ordering::Relaxed);
        let p = self.pass(params, batch.x.view(), targets_view(&batch.targets), Some(hash::dropout_seed(self.seed, n)), true);
        LossAndGradients { loss: p.loss as f32, gradients: p.gradients }
    }

    fn evaluate(&self, params: &[ArrayD<f32>], batch: &Batch) -> Metrics {
        let p = self.pass(params, batch.x.view(), targets_view(&batch.targets), None, false);
        metrics(p.loss, p.correct, batch)
    }
}

/// The layer `l` on inputs of one-example shape `input`, appending its
/// variables to `specs`.
fn build_layer(l: &LayerSpec, input: &[usize], specs: &mut Vec<VariableSpec>) -> Result<Layer, KerasError> {
    let err = |reason: String| KerasError::Layer { layer: l.name.clone(), class: l.class.clone(), reason };
    let first_variable = specs.len();
    let mut variable = |weight: &str, shape: Vec<usize>, init: InitSpec| {
        let init = initial(init, &shape);
        specs.push(VariableSpec::new(format!("{}/{weight}", l.name), shape, init));
    };
    let last = input.last().copied().unwrap_or(0);
    let (op, output_shape) = match &l.kind {
        LayerKind::Dense { units, activation, use_bias, kernel_init, bias_init } => {
            if input.is_empty() {
                return Err(err("needs an input with at least one axis".into()));
            }
            variable("kernel", vec![last, *units], *kernel_init);
            if *use_bias {
                variable("bias", vec![*units], *bias_init);
            }
            let mut out = input.to_vec();
            *out.last_mut().expect("checked above") = *units;
            (Op::Dense { units: *units, activation: *activation, use_bias: *use_bias }, out)
        }
        LayerKind::Activation(act) => (Op::Activation(*act), input.to_vec()),
        LayerKind::Dropout { rate } => (Op::Dropout { rate: *rate }, input.to_vec()),
        LayerKind::Flatten => (Op::Reshape, vec![input.iter().product()]),
        LayerKind::Reshape { target_shape } => (Op::Reshape, reshape_target(input, target_shape).map_err(err)?),
        LayerKind::Conv2D { filters, kernel_size, strides, padding, activation, use_bias, kernel_init, bias_init } => {
            let geometry = conv::Geometry::new(input, *kernel_size, *strides, *padding).map_err(err)?;
            variable("kernel", vec![kernel_size[0], kernel_size[1], geometry.channels, *filters], *kernel_init);
            if *use_bias {
                variable("bias", vec![*filters], *bias_init);
            }
            let out = vec![geometry.out_h, geometry.out_w, *filters];
            (Op::Conv2D { geometry, filters: *filters, activation: *activation, use_bias: *use_bias }, out)
        }
        LayerKind::Pool2D { kind, pool_size, strides, padding } => {
            let geometry = conv::Geometry::new(input, *pool_size, *strides, *padding).map_err(err)?;
            let out = vec![geometry.out_h, geometry.out_w, geometry.channels];
            (Op::Pool { kind: *kind, geometry }, out)
        }
        LayerKind::Embedding { input_dim, output_dim, init } => {
            variable("embeddings", vec![*input_dim, *output_dim], *init);
            let mut out = input.to_vec();
            out.push(*output_dim);
            (Op::Embedding { input_dim: *input_dim, output_dim: *output_dim }, out)
        }
    };
    let num_variables = specs.len() - first_variable;
    Ok(Layer { name: l.name.clone(), class: l.class.clone(), op, input_shape: input.to_vec(), output_shape, first_variable, num_variables })
}

/// The shape Reshape gives an input of shape `input` (one `-1` inferred).
fn reshape_target(input: &[usize], target: &[i64]) -> Result<Vec<usize>, String> {
    let total: usize = input.iter().product();
    let known: usize = target.iter().filter(|&&d| d > 0).map(|&d| d as usize).product();
    let unknown = target.iter().filter(|&&d| d == -1).count();
    let fits = match unknown {
        0 => known == total,
        1 => known > 0 && total.is_multiple_of(known),
        _ => false,
    };
    if !fits {
        return Err(format!("target_shape {target:?} does not fit an input of shape {input:?} ({total} elements)"));
    }
    Ok(target.iter().map(|&d| if d == -1 { total / known } else { d as usize }).collect())
}

/// Keras's fans of a variable: `[in, out]` for matrices, the receptive
/// field times the channels for convolution kernels, the size for vectors.
fn fans(shape: &[usize]) -> (f64, f64) {
    match shape {
        [] => (1.0, 1.0),
        [n] => (*n as f64, *n as f64),
        [a, b] => (*a as f64, *b as f64),
        _ => {
            let receptive: usize = shape[..shape.len() - 2].iter().product();
            ((receptive * shape[shape.len() - 2]) as f64, (receptive * shape[shape.len() - 1]) as f64)
        }
    }
}

/// The initialiser of a variable of `shape`.
fn initial(init: InitSpec, shape: &[usize]) -> Init {
    match init {
        InitSpec::Zeros => Init::Zeros,
        InitSpec::Constant(c) => Init::Constant(c),
        InitSpec::RandomUniform { limit } => Init::Uniform { limit },
        InitSpec::RandomNormal { stddev } => Init::Normal { stddev },
        InitSpec::TruncatedNormal { stddev } => Init::TruncatedNormal { stddev },
        InitSpec::VarianceScaling { scale, mode, uniform } => {
            let (fan_in, fan_out) = fans(shape);
            let n = match mode {
                FanMode::In => fan_in,
                FanMode::Out => fan_out,
                FanMode::Avg => (fan_in + fan_out) / 2.0,
            }
            .max(1.0);
            let variance = scale as f64 / n;
            if uniform {
                Init::Uniform { limit: (3.0 * variance).sqrt() as f32 }
            } else {
                Init::TruncatedNormal { stddev: (variance.sqrt() / TRUNCATED_STDDEV_CORRECTION) as f32 }
            }
        }
    }
}

/// Takes the softmax or sigmoid a cross-entropy needs off the last layer
/// (the loss works on logits) and says what turns logits into outputs.
fn output_head(layers: &mut [Layer], loss: Loss, from_logits: bool) -> Result<Head, KerasError> {
    let last = layers.last_mut().expect("at least one layer");
    let (layer, class) = (last.name.clone(), last.class.clone());
    let err = move |reason: String| KerasError::Layer { layer: layer.clone(), class: class.clone(), reason };
    let act = match &mut last.op {
        Op::Dense { activation, .. } | Op::Conv2D { activation, .. } | Op::Activation(activation) => Some(activation),
        _ => None,
    };
    let ends_in = act.as_ref().map_or(Act::Linear, |a| **a);
    let wanted = match loss {
        Loss::MeanSquaredError if from_logits => return Err(err("--from_logits goes with a cross-entropy loss, not mse".into())),
        Loss::MeanSquaredError => return Ok(Head::Identity),
        Loss::BinaryCrossentropy => (Act::Sigmoid, Head::Sigmoid),
        _ => (Act::Softmax, Head::Softmax),
    };
    if from_logits {
        return match ends_in {
            Act::Softmax | Act::Sigmoid => Err(err(format!("with --from_logits the outputs are logits, but the model ends in {}", ends_in.as_str()))),
            _ => Ok(Head::Identity),
        };
    }
    if ends_in != wanted.0 {
        return Err(err(format!(
            "{loss} takes probabilities (Keras's from_logits=False): the model must end in {}, it ends in {} (or pass --from_logits if its outputs are logits)",
            wanted.0.as_str(),
            ends_in.as_str()
        )));
    }
    if let Some(a) = act {
        *a = Act::Linear;
    }
    Ok(wanted.1)
}

#[cfg(test)]
mod tests;

//! Building a built-in model from its [`ModelConfig`], and the same model
//! as the Keras model it is (a preset).

use super::config::{Activation, ModelConfig, ModelError, dense_layer_name};
use super::dense::{Mlp, SoftmaxRegression};
use super::keras;
use super::linear::LinearRegression;
use super::spec::{Model, VariableSpec};
use crate::init::Init;

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

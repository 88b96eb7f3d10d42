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
//!
//! `spec` holds what a model is ([`Model`], [`VariableSpec`]) and the
//! arithmetic all models share, `config` the built-in models' configuration,
//! `build` their construction; this file only declares and re-exports.

mod build;
mod config;
mod dense;
pub mod keras;
mod linear;
mod sparse;
mod spec;

pub use build::{build_model, preset, preset_spec};
pub(crate) use config::dense_variable;
pub use config::{Activation, ModelConfig, ModelError, WeightInit, dense_layer_name};
pub use dense::{Mlp, SoftmaxRegression};
pub use linear::LinearRegression;
pub use sparse::{SparseModel, SparseModelConfig};
pub use spec::{EmbeddingDecl, LossAndGradients, Metrics, Model, Real, VariableSpec, init_values};

#[cfg(test)]
mod tests;

//! Which model `predict` and `evaluate` run on a checkpoint: the Keras model
//! of `--keras_model`, or a built-in model named as in training (`--model`,
//! `--hidden_units`, `--activation`) as the Keras model it is
//! ([`crate::model::preset`]), its input size and classes read from the
//! checkpoint.

use std::collections::BTreeMap;

use ndarray::ArrayD;

use super::keras::check_mlp_flags;
use super::spec::{KerasOptions, WorkloadError, mlp_options};
use crate::data::DataOptions;
use crate::model::keras::KerasModel;
use crate::model::{self, Activation, ModelConfig, WeightInit};

/// The model and data flags of `predict` and `evaluate`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferenceSpec {
    /// `--model`: a built-in model (`linear`, `softmax`, `mlp`) instead of
    /// `--keras_model`.
    pub model: Option<String>,
    pub hidden_units: Option<Vec<usize>>,
    pub activation: Option<String>,
    pub keras: KerasOptions,
    pub data: DataOptions,
}

fn flag(field: &'static str, reason: impl Into<String>) -> WorkloadError {
    WorkloadError::Flag { field, reason: reason.into() }
}

impl InferenceSpec {
    /// The flags name exactly one model, and only flags it can use.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let built_in = match (&self.model, &self.keras.model_file) {
            (Some(m), Some(_)) => {
                return Err(flag("model", format!("{m:?} and --keras_model both name a model: give one")));
            }
            (None, None) => {
                return Err(flag(
                    "keras_model",
                    "missing: give the model the checkpoint holds: --keras_model FILE, or --model linear|softmax|mlp (with --hidden_units and --activation as in training)",
                ));
            }
            (Some(m), None) => Some(m.to_ascii_lowercase()),
            (None, Some(_)) => None,
        };
        check_mlp_flags(built_in.as_deref(), &[("hidden_units", self.hidden_units.is_some()), ("activation", self.activation.is_some())])?;
        let Some(name) = built_in else { return Ok(()) };
        if !["linear", "softmax", "mlp"].contains(&name.as_str()) {
            return Err(flag("model", format!("unknown model {name:?} (linear, softmax, mlp; or --keras_model FILE)")));
        }
        if self.keras.loss.is_some() {
            return Err(flag("loss", "goes with --keras_model (the built-in models have their own loss)"));
        }
        if self.keras.from_logits {
            return Err(flag("from_logits", "goes with --keras_model"));
        }
        if name == "linear" && self.data.num_classes.is_some() {
            return Err(flag("num_classes", "goes with a classifier; the linear model's targets are values"));
        }
        Ok(())
    }

    /// Whether the model's targets are classes (a Keras model's: its loss's).
    pub fn is_classifier(&self, keras: Option<&KerasModel>) -> bool {
        match keras {
            Some(m) => m.loss().is_classification(),
            None => !self.model.as_deref().is_some_and(|m| m.eq_ignore_ascii_case("linear")),
        }
    }
}

/// The built-in model of `spec` with the sizes of the checkpoint `values`
/// (read from `path`): the input size from the first layer's kernel
/// (`dense/kernel`), the classes from the output layer's bias. A checkpoint
/// of another model is an error saying so; hidden layers other than the
/// checkpoint's show up as a variable of the wrong shape when its values are
/// taken.
pub fn inference_model(spec: &InferenceSpec, path: &str, values: &BTreeMap<String, ArrayD<f32>>) -> Result<KerasModel, WorkloadError> {
    let name = spec.model.as_deref().unwrap_or("linear").to_ascii_lowercase();
    let (hidden_units, activation) = match name.as_str() {
        "mlp" => mlp_options(spec.hidden_units.as_deref(), spec.activation.as_deref())?,
        _ => (Vec::new(), Activation::Sigmoid),
    };
    let not_built_in = |missing: &str| {
        flag(
            "model",
            format!(
                "checkpoint {path} has no variable {missing}: it is not of the {name} model{} (it has: {})",
                if name == "mlp" { " with these --hidden_units" } else { "" },
                values.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    };
    let first = model::dense_variable(0, "kernel");
    let input_dim = match values.get(&first).map(|k| k.shape()) {
        Some([rows, _]) => *rows,
        _ => return Err(not_built_in(&first)),
    };
    let output_bias = model::dense_variable(hidden_units.len(), "bias");
    let num_classes = match name.as_str() {
        "linear" => 1,
        _ => values.get(&output_bias).map(|b| b.len()).ok_or_else(|| not_built_in(&output_bias))?,
    };
    let cfg = ModelConfig { name, input_dim, num_classes, hidden_units, activation, weight_init: WeightInit::default() };
    Ok(model::preset(&cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: Option<&str>) -> InferenceSpec {
        InferenceSpec { model: model.map(String::from), ..Default::default() }
    }

    #[test]
    fn flags_name_one_model_and_what_it_uses() {
        let keras = KerasOptions { model_file: Some("m.json".into()), ..Default::default() };
        let classes = DataOptions { num_classes: Some(3), ..Default::default() };
        // (case, spec, Ok or the flag named)
        let cases: Vec<(&str, InferenceSpec, Result<(), &str>)> = vec![
            ("keras", InferenceSpec { keras: keras.clone(), ..spec(None) }, Ok(())),
            ("mlp", InferenceSpec { hidden_units: Some(vec![8]), activation: Some("relu".into()), ..spec(Some("mlp")) }, Ok(())),
            ("softmax with classes", InferenceSpec { data: classes.clone(), ..spec(Some("softmax")) }, Ok(())),
            ("neither", spec(None), Err("keras_model")),
            ("both", InferenceSpec { keras: keras.clone(), ..spec(Some("mlp")) }, Err("model")),
            ("unknown", spec(Some("resnet")), Err("model")),
            ("hidden units of keras", InferenceSpec { keras: keras.clone(), hidden_units: Some(vec![8]), ..spec(None) }, Err("hidden_units")),
            ("activation of softmax", InferenceSpec { activation: Some("relu".into()), ..spec(Some("softmax")) }, Err("activation")),
            ("loss of mlp", InferenceSpec { keras: KerasOptions { loss: Some("mse".into()), ..Default::default() }, ..spec(Some("mlp")) }, Err("loss")),
            ("classes of linear", InferenceSpec { data: classes, ..spec(Some("linear")) }, Err("num_classes")),
        ];
        for (case, spec, want) in cases {
            match (spec.check(), want) {
                (Ok(()), Ok(())) => {}
                (Err(WorkloadError::Flag { field, .. }), Err(flag)) => {
                    assert_eq!(field, flag, "{case}")
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn built_in_sizes_come_from_the_checkpoint() {
        let cfg = ModelConfig::mlp(4, &[6, 5], 3, Activation::Relu);
        let values: BTreeMap<String, ArrayD<f32>> =
            model::build_model(&cfg).unwrap().variables().into_iter().map(|v| (v.name, ArrayD::zeros(v.shape))).collect();
        let path = "ckpt";
        let mlp = InferenceSpec { hidden_units: Some(vec![6, 5]), activation: Some("relu".into()), ..spec(Some("mlp")) };
        let model = inference_model(&mlp, path, &values).unwrap();
        assert_eq!((model.input_dim(), model.output_units()), (4, 3));
        use crate::model::Model;
        assert_eq!(model.variables(), model::preset(&cfg).unwrap().variables());
        // One hidden layer too few: a smaller model, whose values the checkpoint cannot give.
        let smaller = inference_model(&InferenceSpec { hidden_units: Some(vec![6]), ..mlp.clone() }, path, &values).unwrap();
        let err = crate::trained::params_in_order(path, &smaller.variables(), &values).unwrap_err().to_string();
        assert!(err.contains("does not have: dense_2/bias, dense_2/kernel"), "{err}");
        let err = inference_model(&InferenceSpec { hidden_units: Some(vec![6, 5, 2]), ..mlp.clone() }, path, &values).unwrap_err().to_string();
        assert!(err.contains("no variable dense_3/bias: it is not of the mlp model with these --hidden_units"), "{err}");
        let err = inference_model(&spec(Some("softmax")), path, &BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("ckpt has no variable dense/kernel: it is not of the softmax model"), "{err}");
    }
}

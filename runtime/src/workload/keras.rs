//! A Keras model (`--keras_model`) with its data, and the checks that every
//! data flag is one the chosen model can use.

use std::path::Path;

use super::spec::{SYNTHETIC_TRAIN_EXAMPLES, WorkloadError, WorkloadSpec, flag};
use crate::data::{self, DataFormat, Dataset, LabelKind};
use crate::model::Model;
use crate::model::keras::{KerasModel, Loss};

/// Every flag given must be one the model and the data format use: a flag
/// that would be ignored is an error naming it.
pub fn check_flags(spec: &WorkloadSpec) -> Result<(), WorkloadError> {
    let d = &spec.data;
    let keras = spec.keras.model_file.is_some();
    if !keras {
        if spec.keras.loss.is_some() {
            return Err(flag(
                "loss",
                "goes with --keras_model (the built-in models have their own loss: mse for linear, softmax cross-entropy for softmax and mlp)",
            ));
        }
        if spec.keras.from_logits {
            return Err(flag("from_logits", "goes with --keras_model"));
        }
    }
    // --model defaults to linear, so only another name shows it was given.
    if keras && !spec.model.eq_ignore_ascii_case("linear") {
        return Err(flag("model", format!("{:?} and --keras_model both name a model: give one", spec.model)));
    }
    let model = if keras { None } else { Some(spec.model.as_str()) };
    let mlp_flags = [("hidden_units", spec.hidden_units.is_some()), ("activation", spec.activation.is_some()), ("weight_init", spec.weight_init.is_some())];
    check_mlp_flags(model, &mlp_flags)?;
    if !keras && spec.model.eq_ignore_ascii_case("linear") {
        let given = [("data_dir", spec.data_dir.is_some()), ("data_format", d.format.is_some()), ("num_classes", d.num_classes.is_some())];
        if let Some(name) = given.iter().find(|(_, g)| *g).map(|(n, _)| *n) {
            return Err(flag(
                name,
                "the linear model trains on the classic example's synthetic line and reads no data (--model=softmax, --model=mlp or --keras_model read data)",
            ));
        }
    }
    let csv_only = [("label_column", d.label_column.is_some()), ("feature_columns", d.feature_columns.is_some())];
    if let Some(name) = csv_only.iter().find(|(_, g)| *g).map(|(n, _)| *n) {
        if spec.data_dir.is_none() {
            return Err(flag(name, "needs --data_dir (with --data_format=csv)"));
        }
        if d.format != Some(DataFormat::Csv) {
            return Err(flag(name, "goes with --data_format=csv"));
        }
    }
    if d.format.is_some() && spec.data_dir.is_none() {
        return Err(flag("data_format", "needs --data_dir"));
    }
    if d.num_classes == Some(0) {
        return Err(flag("num_classes", "must be at least 1"));
    }
    Ok(())
}

/// `--hidden_units`, `--activation` and `--weight_init` (each with whether
/// it was given) shape the mlp's hidden layers: with a Keras model (`model`
/// `None`: its layers are in its JSON) or another built-in model they would
/// mean nothing, and are errors.
pub(super) fn check_mlp_flags(model: Option<&str>, given: &[(&'static str, bool)]) -> Result<(), WorkloadError> {
    let Some((name, _)) = given.iter().find(|(_, g)| *g) else { return Ok(()) };
    match model {
        Some(m) if m.eq_ignore_ascii_case("mlp") => Ok(()),
        Some(m) => Err(flag(name, format!("goes with --model=mlp; the {} model has no hidden layers", m.to_ascii_lowercase()))),
        None => Err(flag(name, "goes with --model=mlp; a Keras model's layers and initialisers are those of its JSON")),
    }
}

/// `--num_classes` must be the number of classes the model's output tells
/// apart: its output units (2 for one sigmoid unit). The error names both.
pub fn check_num_classes(model: &KerasModel, num_classes: Option<usize>) -> Result<(), WorkloadError> {
    let Some(n) = num_classes else { return Ok(()) };
    let units = model.output_units();
    let classes = match model.loss() {
        Loss::MeanSquaredError => return Err(flag("num_classes", "goes with a classifier; this model's loss is mse (its targets are values)")),
        Loss::BinaryCrossentropy if units == 1 => 2,
        _ => units,
    };
    if n == classes {
        return Ok(());
    }
    Err(flag("num_classes", format!("{n}, but the model's output has {units} unit(s): {classes} classes")))
}

/// The Keras model of `file` with its training and held-out data, and
/// Keras's default batch size (32).
pub fn model_and_data(spec: &WorkloadSpec, file: &Path) -> Result<(Box<dyn Model>, Dataset, Dataset, usize), WorkloadError> {
    let model = spec.keras.build(file, spec.seed)?;
    check_num_classes(&model, spec.data.num_classes)?;
    let loss = model.loss();
    tracing::info!("{}: Keras model {:?}, loss {loss}:\n{}", file.display(), model.keras_name(), model.describe().trim_end());
    let kind = if loss.is_classification() { LabelKind::Classes } else { LabelKind::Values };
    let (train, test) = match &spec.data_dir {
        Some(dir) => {
            let d = data::load_training_data(dir, &spec.data, kind)?;
            check_example_shape(&d.train_file, d.example_shape.as_deref(), model.input_shape())?;
            for (set, file) in [(&d.train, &d.train_file), (&d.test, &d.test_file)] {
                fits(&model, set, file)?;
            }
            tracing::info!("read {} training and {} held-out examples from {}", d.train.len(), d.test.len(), dir.display());
            (d.train, d.test)
        }
        None => synthetic(&model, spec)?,
    };
    Ok((Box::new(model), train, test, 32))
}

/// Without `--data_dir`: a synthetic classification set shaped for the model
/// (for a classifier ending in softmax, whose input is not embedding ids).
fn synthetic(model: &KerasModel, spec: &WorkloadSpec) -> Result<(Dataset, Dataset), WorkloadError> {
    let softmax_classifier = matches!(model.loss(), Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy) && model.output_units() >= 2;
    if !softmax_classifier || model.check_inputs(&ndarray::Array2::from_elem((1, model.input_dim()), 0.5)).is_err() {
        return Err(flag(
            "data_dir",
            format!("missing: synthetic data is only made for softmax classifiers of real-valued inputs; this model ({}) needs data", model.loss()),
        ));
    }
    let classes = model.output_units();
    tracing::info!(
        "no --data_dir given: using synthetic data shaped for the model ({SYNTHETIC_TRAIN_EXAMPLES} training examples of {:?}, {classes} classes)",
        model.input_shape()
    );
    Ok(data::synthetic_images(model.input_dim(), classes, SYNTHETIC_TRAIN_EXAMPLES, spec.eval_examples.max(1), 20240601))
}

/// Checks the examples and targets of a set read from `file` against the model.
pub fn fits(model: &KerasModel, set: &Dataset, file: &Path) -> Result<(), WorkloadError> {
    let err = |reason: String| WorkloadError::Flag { field: "data_dir", reason: format!("{}: {reason}", file.display()) };
    model.check_inputs(set.x()).map_err(err)?;
    model.check_targets(set.targets()).map_err(err)
}

/// IDX images must have the model's height and width (and channels), not
/// just as many pixels.
pub fn check_example_shape(file: &Path, example: Option<&[usize]>, input: &[usize]) -> Result<(), WorkloadError> {
    let Some(example) = example else { return Ok(()) };
    let fits = match (example, input) {
        (_, [_]) => true,
        ([h, w], [mh, mw, 1]) | ([h, w], [mh, mw]) => (h, w) == (mh, mw),
        (e, m) => e == m,
    };
    if fits {
        return Ok(());
    }
    let size = |s: &[usize]| s.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
    Err(flag("data_dir", format!("{}: examples are {} but the model's input is {}", file.display(), size(example), size(input))))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::spec::KerasOptions;
    use super::*;
    use crate::data::DataOptions;

    fn spec(model: &str) -> WorkloadSpec {
        WorkloadSpec {
            model: model.into(),
            hidden_units: None,
            activation: None,
            weight_init: None,
            batch_size: None,
            data_dir: None,
            seed: 1,
            eval_examples: 10,
            keras: KerasOptions::default(),
            data: DataOptions::default(),
            sparse: Default::default(),
        }
    }

    #[test]
    fn flags_a_model_cannot_use_are_errors() {
        let dir = Some(PathBuf::from("data"));
        let csv = DataOptions { format: Some(DataFormat::Csv), ..Default::default() };
        let keras = KerasOptions { model_file: Some("m.json".into()), ..Default::default() };
        // (case, spec, Ok or the flag named)
        let cases: Vec<(&str, WorkloadSpec, Result<(), &str>)> = vec![
            ("linear alone", spec("linear"), Ok(())),
            ("linear with data", WorkloadSpec { data_dir: dir.clone(), ..spec("linear") }, Err("data_dir")),
            ("linear with classes", WorkloadSpec { data: DataOptions { num_classes: Some(3), ..Default::default() }, ..spec("linear") }, Err("num_classes")),
            ("mlp with data", WorkloadSpec { data_dir: dir.clone(), ..spec("mlp") }, Ok(())),
            ("mlp with csv", WorkloadSpec { data_dir: dir.clone(), data: csv.clone(), ..spec("mlp") }, Ok(())),
            ("format without data", WorkloadSpec { data: csv.clone(), ..spec("mlp") }, Err("data_format")),
            (
                "label column with idx",
                WorkloadSpec { data_dir: dir.clone(), data: DataOptions { label_column: Some("y".into()), ..Default::default() }, ..spec("mlp") },
                Err("label_column"),
            ),
            (
                "feature columns with csv",
                WorkloadSpec { data_dir: dir.clone(), data: DataOptions { feature_columns: Some(vec!["a".into()]), ..csv.clone() }, ..spec("softmax") },
                Ok(()),
            ),
            ("loss without keras", WorkloadSpec { keras: KerasOptions { loss: Some("mse".into()), ..Default::default() }, ..spec("mlp") }, Err("loss")),
            ("from_logits without keras", WorkloadSpec { keras: KerasOptions { from_logits: true, ..Default::default() }, ..spec("mlp") }, Err("from_logits")),
            ("keras with data (the default model name is linear)", WorkloadSpec { data_dir: dir.clone(), keras: keras.clone(), ..spec("linear") }, Ok(())),
            ("keras and a built-in model", WorkloadSpec { keras: keras.clone(), ..spec("mlp") }, Err("model")),
            (
                "zero classes",
                WorkloadSpec { data_dir: dir.clone(), data: DataOptions { num_classes: Some(0), ..Default::default() }, ..spec("mlp") },
                Err("num_classes"),
            ),
            (
                "mlp with its flags",
                WorkloadSpec { hidden_units: Some(vec![8, 4]), activation: Some("relu".into()), weight_init: Some("normal".into()), ..spec("mlp") },
                Ok(()),
            ),
            ("hidden units of linear", WorkloadSpec { hidden_units: Some(vec![8]), ..spec("linear") }, Err("hidden_units")),
            ("activation of softmax", WorkloadSpec { activation: Some("relu".into()), ..spec("softmax") }, Err("activation")),
            ("weight init of softmax", WorkloadSpec { weight_init: Some("normal".into()), ..spec("softmax") }, Err("weight_init")),
            ("hidden units of a keras model", WorkloadSpec { hidden_units: Some(vec![8]), keras: keras.clone(), ..spec("linear") }, Err("hidden_units")),
            ("activation of a keras model", WorkloadSpec { activation: Some("tanh".into()), keras: keras.clone(), ..spec("linear") }, Err("activation")),
            ("weight init of a keras model", WorkloadSpec { weight_init: Some("normal".into()), keras: keras.clone(), ..spec("linear") }, Err("weight_init")),
        ];
        for (case, spec, want) in cases {
            match (check_flags(&spec), want) {
                (Ok(()), Ok(())) => {}
                (Err(WorkloadError::Flag { field, .. }), Err(flag)) => assert_eq!(field, flag, "{case}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn idx_images_must_have_the_models_size() {
        let f = Path::new("train-images-idx3-ubyte");
        // (example shape, model input, fits)
        let cases: Vec<(Option<Vec<usize>>, Vec<usize>, bool)> = vec![
            (Some(vec![28, 28]), vec![28, 28, 1], true),
            (Some(vec![28, 28]), vec![28, 28], true),
            (Some(vec![28, 28]), vec![784], true),
            (Some(vec![28, 28]), vec![14, 56, 1], false),
            (Some(vec![28, 28]), vec![28, 28, 3], false),
            (Some(vec![32, 32, 3]), vec![32, 32, 3], true),
            (Some(vec![32, 32, 3]), vec![32, 96], false),
            (None, vec![5, 5, 1], true),
        ];
        for (example, input, fits) in cases {
            let got = check_example_shape(f, example.as_deref(), &input);
            assert_eq!(got.is_ok(), fits, "{example:?} into {input:?}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("train-images-idx3-ubyte: examples are"), "{e}");
            }
        }
    }
}

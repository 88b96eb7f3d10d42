use std::path::{Path, PathBuf};

use ndarray::{Array2, ArrayD};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::json::{InitSpec, Padding, PoolKind};
use super::*;
use crate::model::tests::worst_ratio;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/keras").join(name)
}

fn load(name: &str) -> ModelSpec {
    load_model_file(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn model(name: &str, loss: Loss) -> KerasModel {
    KerasModel::new(&load(name), loss, false, 1).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn names_and_shapes(m: &KerasModel) -> Vec<(String, Vec<usize>)> {
    m.variables().into_iter().map(|v| (v.name, v.shape)).collect()
}

fn vars(list: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
    list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
}

// ------------------------------------------------------------ reading JSON

#[test]
fn reads_keras2_and_keras3_json_alike() {
    use Loss::SparseCategoricalCrossentropy as Scc;
    // (fixture, input shape, variables, Keras's count_params())
    type Case = (&'static str, Vec<usize>, Vec<(String, Vec<usize>)>, usize);
    let cases: Vec<Case> = vec![
        ("cnn", vec![12, 12, 1], vars(&[("conv2d/kernel", &[3, 3, 1, 8]), ("conv2d/bias", &[8]), ("dense/kernel", &[200, 4]), ("dense/bias", &[4])]), 884),
        ("mlp", vec![12, 12, 1], vars(&[("hidden/kernel", &[144, 32]), ("hidden/bias", &[32]), ("output/kernel", &[32, 4]), ("output/bias", &[4])]), 4772),
        (
            "all_layers",
            vec![9, 8, 2],
            vars(&[
                ("conv_same/kernel", &[3, 2, 2, 6]),
                ("conv_same/bias", &[6]),
                ("conv_valid/kernel", &[2, 2, 6, 4]),
                ("dense_rows/kernel", &[4, 5]),
                ("dense_rows/bias", &[5]),
                ("logits/kernel", &[45, 7]),
                ("logits/bias", &[7]),
                ("dense_out/kernel", &[7, 3]),
                ("dense_out/bias", &[3]),
            ]),
            545,
        ),
        ("embedding", vec![5], vars(&[("embedding/embeddings", &[20, 4]), ("dense/kernel", &[20, 3]), ("dense/bias", &[3])]), 143),
        ("tabular", vec![4], vars(&[("hidden/kernel", &[4, 16]), ("hidden/bias", &[16]), ("output/kernel", &[16, 3]), ("output/bias", &[3])]), 131),
    ];
    for (name, input, want, count) in cases {
        let k2 = load(&format!("{name}.keras2.json"));
        let k3 = load(&format!("{name}.keras3.json"));
        assert_eq!((k2.format, k3.format), (KerasFormat::Keras2, KerasFormat::Keras3), "{name}");
        assert_eq!(k2.layers, k3.layers, "{name}: the two formats describe the same layers");
        assert_eq!((&k2.input_shape, &k3.input_shape), (&input, &input), "{name}");
        let m = KerasModel::new(&k3, Scc, false, 1).unwrap();
        assert_eq!(names_and_shapes(&m), want, "{name}:\n{}", m.describe());
        let params: usize = m.variables().iter().map(VariableSpec::num_elements).sum();
        assert_eq!(params, count, "{name}: as many parameters as Keras counts");
        assert_eq!(m.head(), Head::Softmax);
    }
}

#[test]
fn reads_every_option_of_the_all_layers_model() {
    let spec = load("all_layers.keras3.json");
    let kinds: Vec<&LayerKind> = spec.layers.iter().map(|l| &l.kind).collect();
    assert!(matches!(
        kinds[0],
        LayerKind::Conv2D { filters: 6, kernel_size: [3, 2], strides: [2, 1], padding: Padding::Same, activation: Act::Tanh, use_bias: true, .. }
    ));
    assert_eq!(kinds[1], &LayerKind::Pool2D { kind: PoolKind::Average, pool_size: [2, 2], strides: [1, 1], padding: Padding::Same });
    assert!(matches!(kinds[2], LayerKind::Conv2D { use_bias: false, kernel_init: InitSpec::VarianceScaling { scale: 2.0, uniform: false, .. }, .. }));
    assert_eq!(kinds[3], &LayerKind::Pool2D { kind: PoolKind::Max, pool_size: [2, 3], strides: [1, 2], padding: Padding::Valid });
    assert_eq!(kinds[4], &LayerKind::Reshape { target_shape: vec![-1, 4] });
    assert!(matches!(kinds[5], LayerKind::Dense { units: 5, activation: Act::Sigmoid, bias_init: InitSpec::Constant(1.0), .. }));
    assert_eq!(kinds[7], &LayerKind::Dropout { rate: 0.25 });
    assert_eq!(kinds[9], &LayerKind::Activation(Act::Relu));
    assert_eq!(kinds[11], &LayerKind::Activation(Act::Softmax));
}

#[test]
fn unsupported_layers_and_options_are_errors_naming_them() {
    // (fixture, what the message must contain)
    let cases = [
        ("unsupported_layer", vec!["batch_norm", "unsupported layer class BatchNormalization"]),
        ("unsupported_option", vec!["dilated", "Conv2D", "dilation_rate", "only 1"]),
        ("unsupported_regularizer", vec!["dense", "kernel_regularizer"]),
        ("branching", vec!["plain stack"]),
    ];
    for (name, wants) in cases {
        for format in ["keras2", "keras3"] {
            let file = format!("{name}.{format}.json");
            let err = load_model_file(&fixture(&file)).expect_err(&file).to_string();
            assert!(err.contains(&file), "{file}: the error names the file: {err}");
            for want in &wants {
                assert!(err.contains(want), "{file}: {err:?} lacks {want:?}");
            }
        }
    }
}

/// Without an InputLayer the input shape comes from Keras 3's
/// `build_input_shape` (a Sequential built with `model.build(shape)`) or
/// Keras 2's `batch_input_shape` on the first layer (later layers' copies are
/// not the model's input).
#[test]
fn input_shape_without_an_input_layer() {
    let keras3 = |build: &str| {
        format!(
            r#"{{"module": "keras", "class_name": "Sequential", "config": {{"name": "s", "trainable": true, "layers": [
                {{"module": "keras.layers", "class_name": "Flatten", "config": {{"name": "flatten", "data_format": "channels_last"}}}},
                {{"module": "keras.layers", "class_name": "Dense", "config": {{"name": "dense", "units": 3, "activation": "softmax"}}}}]{build}}}}}"#
        )
    };
    let keras2 = |first: &str, second: &str| {
        format!(
            r#"{{"class_name": "Sequential", "keras_version": "2.15.0", "config": {{"name": "s", "layers": [
                {{"class_name": "Dense", "config": {{"name": "d1", "units": 4, "activation": "relu"{first}}}}},
                {{"class_name": "Dense", "config": {{"name": "d2", "units": 2{second}}}}}]}}}}"#
        )
    };
    // (document, the input shape or words of the error)
    let cases: Vec<(String, Result<Vec<usize>, &str>)> = vec![
        (keras3(r#", "build_input_shape": [null, 28, 28, 1]"#), Ok(vec![28, 28, 1])),
        (keras3(r#", "build_input_shape": [null, 7]"#), Ok(vec![7])),
        (keras3(""), Err("no input shape")),
        (keras3(r#", "build_input_shape": [null, null]"#), Err("build_input_shape: [null,null]: every dimension but the batch must be a known positive size")),
        (keras3(r#", "build_input_shape": [5]"#), Err("build_input_shape: [5] is not a batch shape")),
        (keras2(r#", "batch_input_shape": [null, 6]"#, ""), Ok(vec![6])),
        (keras2(r#", "batch_input_shape": [null, 6]"#, r#", "batch_input_shape": [null, 4]"#), Ok(vec![6])),
        (keras2("", r#", "batch_input_shape": [null, 4]"#), Err("no input shape")),
        (keras2(r#", "batch_input_shape": [null, 0]"#, ""), Err("batch_input_shape")),
    ];
    for (text, want) in cases {
        match (parse_model_json(&text), want) {
            (Ok(spec), Ok(shape)) => {
                assert_eq!(spec.input_shape, shape, "{text}");
                let format = if text.contains("keras_version") { KerasFormat::Keras2 } else { KerasFormat::Keras3 };
                assert_eq!(spec.format, format);
            }
            (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{text}: {e} lacks {words:?}"),
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn bad_json_gives_clear_errors() {
    let dense = |config: &str| {
        format!(
            r#"{{"class_name": "Sequential", "config": {{"name": "s", "layers": [
                {{"class_name": "InputLayer", "config": {{"batch_input_shape": [null, 3], "name": "in"}}}},
                {{"class_name": "Dense", "config": {{"name": "d", {config}}}}}]}}}}"#
        )
    };
    let cases: Vec<(String, &str)> = vec![
        ("[1, 2]".into(), "class_name"),
        ("{not json".into(), "not JSON"),
        (r#"{"class_name": "Sequential", "config": {"layers": []}}"#.into(), "has no layers"),
        (r#"{"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense", "config": {"name": "d", "units": 2}}]}}"#.into(), "no input shape"),
        (r#"{"class_name": "Graph", "config": {"layers": []}}"#.into(), "only Sequential and Functional"),
        (dense(r#""units": 0"#), "units: 0 is not a positive integer"),
        (dense(r#""units": 2, "activation": "gelu""#), "activation: \"gelu\""),
        (dense(r#""units": 2, "use_bias": "yes""#), "use_bias"),
        (dense(r#""units": 2, "trainable": false"#), "trainable"),
        (dense(r#""units": 2, "dtype": "float16""#), "dtype"),
        (dense(r#""units": 2, "kernel_initializer": {"class_name": "Orthogonal", "config": {}}"#), "kernel_initializer: Orthogonal"),
        (dense(r#""units": 2, "kernel_initializer": {"class_name": "RandomUniform", "config": {"minval": 0, "maxval": 1}}"#), "symmetric"),
        (
            dense(r#""units": 2, "kernel_initializer": {"class_name": "RandomNormal", "config": {"mean": 0, "stddev": 1, "extra": 3}}"#),
            "kernel_initializer.extra",
        ),
        (dense(r#""units": 2, "lora_rank": 4"#), "lora_rank: 4 is not supported"),
        (dense(r#""units": 2, "lora_rank": null, "quantization_config": null"#), ""),
    ];
    for (text, want) in cases {
        match parse_model_json(&text) {
            Ok(_) if want.is_empty() => {}
            Ok(spec) => panic!("{text}: parsed as {spec:?}, wanted an error with {want:?}"),
            Err(e) => assert!(!want.is_empty() && e.to_string().contains(want), "{text}: {e} lacks {want:?}"),
        }
    }
}

#[test]
fn loss_and_last_activation_must_agree() {
    use Loss::*;
    // (fixture, loss, from_logits, Ok(head) or the error's words)
    let cases: Vec<(&str, Loss, bool, Result<Head, &str>)> = vec![
        ("tabular", SparseCategoricalCrossentropy, false, Ok(Head::Softmax)),
        ("tabular", CategoricalCrossentropy, false, Ok(Head::Softmax)),
        ("tabular", BinaryCrossentropy, false, Err("must end in sigmoid, it ends in softmax")),
        ("tabular", MeanSquaredError, false, Ok(Head::Identity)),
        ("tabular", SparseCategoricalCrossentropy, true, Err("ends in softmax")),
        ("binary", BinaryCrossentropy, false, Ok(Head::Sigmoid)),
        ("regression", SparseCategoricalCrossentropy, false, Err("must end in softmax, it ends in linear")),
        ("regression", SparseCategoricalCrossentropy, true, Ok(Head::Identity)),
        ("regression", MeanSquaredError, true, Err("--from_logits goes with a cross-entropy")),
        ("all_layers", SparseCategoricalCrossentropy, false, Ok(Head::Softmax)),
    ];
    for (name, loss, from_logits, want) in cases {
        let got = KerasModel::new(&load(&format!("{name}.keras3.json")), loss, from_logits, 1);
        match (got, want) {
            (Ok(m), Ok(head)) => assert_eq!(m.head(), head, "{name} {loss}"),
            (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{name} {loss}: {e}"),
            (got, want) => panic!("{name} {loss} from_logits={from_logits}: got {:?}, want {want:?}", got.map(|m| m.head())),
        }
    }
    let mut spec = load("cnn.keras3.json");
    spec.layers.remove(2); // the Flatten: the output is [5, 5, 4]
    let err = KerasModel::new(&spec, SparseCategoricalCrossentropy, false, 1).unwrap_err().to_string();
    assert!(err.contains("one vector per example"), "{err}");
}

// -------------------------------------------- the forward pass against Keras

/// Weights, inputs and Keras's `model.predict` outputs written by make_fixtures.py.
fn reference(name: &str) -> (Vec<ArrayD<f32>>, Array2<f32>, Array2<f32>, KerasModel) {
    let m = model(&format!("{name}.keras3.json"), Loss::SparseCategoricalCrossentropy);
    let text = std::fs::read_to_string(fixture(&format!("{name}.reference.json"))).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let flat = |v: &serde_json::Value, out: &mut Vec<f32>| {
        fn walk(v: &serde_json::Value, out: &mut Vec<f32>) {
            match v {
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
                x => out.push(x.as_f64().unwrap() as f32),
            }
        }
        walk(v, out)
    };
    let params = m
        .variables()
        .iter()
        .map(|spec| {
            let mut values = Vec::new();
            flat(&doc["weights"][&spec.name], &mut values);
            ArrayD::from_shape_vec(spec.shape.clone(), values).unwrap_or_else(|e| panic!("{name}: {}: {e}", spec.name))
        })
        .collect();
    let matrix = |key: &str| {
        let rows = doc[key].as_array().unwrap();
        let mut values = Vec::new();
        rows.iter().for_each(|r| flat(r, &mut values));
        Array2::from_shape_vec((rows.len(), values.len() / rows.len()), values).unwrap()
    };
    (params, matrix("inputs"), matrix("outputs"), m)
}

#[test]
fn predictions_match_keras_itself() {
    for name in ["cnn", "all_layers", "embedding", "tabular"] {
        let (params, x, want, m) = reference(name);
        m.check_inputs(&x).unwrap();
        let got = m.predict(&params, x.view());
        assert_eq!(got.dim(), want.dim(), "{name}");
        for (g, w) in got.iter().zip(want.iter()) {
            assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{name}: got {got:?}\nKeras {want:?}");
        }
    }
}

// ------------------------------------------------------- gradient checks

fn layer(name: &str, kind: LayerKind) -> LayerSpec {
    let class = match &kind {
        LayerKind::Dense { .. } => "Dense",
        LayerKind::Activation(_) => "Activation",
        LayerKind::Dropout { .. } => "Dropout",
        LayerKind::Flatten => "Flatten",
        LayerKind::Reshape { .. } => "Reshape",
        LayerKind::Conv2D { .. } => "Conv2D",
        LayerKind::Pool2D { kind: PoolKind::Max, .. } => "MaxPooling2D",
        LayerKind::Pool2D { .. } => "AveragePooling2D",
        LayerKind::Embedding { .. } => "Embedding",
    };
    LayerSpec { name: name.into(), class: class.into(), kind }
}

const GLOROT: InitSpec = InitSpec::VarianceScaling { scale: 1.0, mode: json::FanMode::Avg, uniform: true };

fn dense(name: &str, units: usize, activation: Act) -> LayerSpec {
    layer(name, LayerKind::Dense { units, activation, use_bias: true, kernel_init: GLOROT, bias_init: InitSpec::Zeros })
}

fn conv(name: &str, filters: usize, k: [usize; 2], s: [usize; 2], padding: Padding, activation: Act, use_bias: bool) -> LayerSpec {
    layer(name, LayerKind::Conv2D { filters, kernel_size: k, strides: s, padding, activation, use_bias, kernel_init: GLOROT, bias_init: InitSpec::Zeros })
}

fn pool(name: &str, kind: PoolKind, p: [usize; 2], s: [usize; 2], padding: Padding) -> LayerSpec {
    layer(name, LayerKind::Pool2D { kind, pool_size: p, strides: s, padding })
}

fn spec(input: &[usize], layers: Vec<LayerSpec>) -> ModelSpec {
    ModelSpec { name: "test".into(), format: KerasFormat::Keras3, input_shape: input.to_vec(), layers }
}

/// Targets for `m`: labels below the output units (0/1 for binary), or values.
fn random_targets(m: &KerasModel, n: usize, values: bool, rng: &mut StdRng) -> Targets {
    let k = m.output_units();
    match m.loss() {
        Loss::MeanSquaredError => Targets::Values(Array2::from_shape_simple_fn((n, k), || rng.sample(StandardNormal))),
        Loss::CategoricalCrossentropy if values => Targets::Values(Array2::from_shape_simple_fn((n, k), || rng.random::<f32>())),
        Loss::BinaryCrossentropy => Targets::Labels((0..n).map(|_| rng.random_range(0..2)).collect()),
        _ => Targets::Labels((0..n).map(|_| rng.random_range(0..k as u32)).collect()),
    }
}

/// f64 analytic gradients against central differences, and the f32 pass
/// against the f64 one, at random parameters (biases too) and inputs.
/// Dropout draws its mask from a fixed seed, the same in every evaluation.
fn gradient_check(case: &str, m: &KerasModel, n: usize, ids: Option<usize>, values: bool, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let params: Vec<ArrayD<f64>> =
        m.variables().iter().map(|s| ArrayD::from_shape_simple_fn(s.shape.clone(), || 0.7 * rng.sample::<f64, _>(StandardNormal))).collect();
    let x: Array2<f64> = match ids {
        Some(vocab) => Array2::from_shape_simple_fn((n, m.input_dim()), || rng.random_range(0..vocab) as f64),
        None => Array2::from_shape_simple_fn((n, m.input_dim()), || rng.sample(StandardNormal)),
    };
    let targets = random_targets(m, n, values, &mut rng);
    m.check_targets(&targets).unwrap();
    let t64 = match &targets {
        Targets::Values(v) => Some(v.mapv(|v| v as f64)),
        Targets::Labels(_) => None,
    };
    let view = || match (&targets, &t64) {
        (Targets::Labels(l), _) => TargetsView::Labels(l),
        (_, Some(v)) => TargetsView::Values(v.view()),
        _ => unreachable!(),
    };
    let dropout = Some(seed ^ 0xd00d);
    let analytic = m.pass(&params, x.view(), view(), dropout, true);
    let eps = 1e-6;
    let mut p = params.clone();
    let numeric: Vec<ArrayD<f64>> = (0..p.len())
        .map(|v| {
            let mut g = ArrayD::zeros(p[v].raw_dim());
            for i in 0..p[v].len() {
                let orig = p[v].as_slice().unwrap()[i];
                p[v].as_slice_mut().unwrap()[i] = orig + eps;
                let plus = m.pass(&p, x.view(), view(), dropout, false).loss;
                p[v].as_slice_mut().unwrap()[i] = orig - eps;
                let minus = m.pass(&p, x.view(), view(), dropout, false).loss;
                p[v].as_slice_mut().unwrap()[i] = orig;
                g.as_slice_mut().unwrap()[i] = (plus - minus) / (2.0 * eps);
            }
            g
        })
        .collect();
    let (r, at) = worst_ratio(&analytic.gradients, &numeric, 1e-7, 1e-4);
    assert!(r <= 1.0, "{case}: f64 analytic vs finite differences: {at} (ratio {r:.3})\n{}", m.describe());
    // The f32 pass the workers run computes the same.
    let p32: Vec<ArrayD<f32>> = params.iter().map(|p| p.mapv(|v| v as f32)).collect();
    let x32 = x.mapv(|v| v as f32);
    let t32 = match &targets {
        Targets::Values(v) => TargetsView::Values(v.view()),
        Targets::Labels(l) => TargetsView::Labels(l),
    };
    let f32_pass = m.pass(&p32, x32.view(), t32, dropout, true);
    assert!((f32_pass.loss - analytic.loss).abs() <= 1e-4 * analytic.loss.abs().max(1.0), "{case}: f32 loss {} vs f64 {}", f32_pass.loss, analytic.loss);
    let (r, at) = worst_ratio(&f32_pass.gradients, &analytic.gradients, 1e-4, 1e-2);
    assert!(r <= 1.0, "{case}: f32 vs f64 gradients: {at} (ratio {r:.3})");
}

#[test]
fn every_layer_passes_a_gradient_check() {
    use Act::*;
    use Loss::*;
    use Padding::*;
    let flat = || layer("flatten", LayerKind::Flatten);
    // (case, input shape, layers, loss, from_logits, batch, embedding ids, value targets)
    type Case = (&'static str, Vec<usize>, Vec<LayerSpec>, Loss, bool, usize, Option<usize>, bool);
    let mut cases: Vec<Case> = Vec::new();
    for act in [Linear, Relu, Sigmoid, Tanh, Softmax] {
        cases.push(("dense + activation", vec![5], vec![dense("d1", 4, act), dense("out", 3, Softmax)], SparseCategoricalCrossentropy, false, 6, None, false));
        cases.push((
            "Activation layer",
            vec![5],
            vec![dense("d1", 4, Linear), layer("act", LayerKind::Activation(act)), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            6,
            None,
            false,
        ));
    }
    cases.extend([
        (
            "dense on rows of a sequence",
            vec![3, 4],
            vec![dense("rows", 2, Tanh), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            5,
            None,
            false,
        ),
        (
            "no bias",
            vec![4],
            vec![
                layer("nb", LayerKind::Dense { units: 3, activation: Relu, use_bias: false, kernel_init: GLOROT, bias_init: InitSpec::Zeros }),
                dense("out", 2, Softmax),
            ],
            SparseCategoricalCrossentropy,
            false,
            4,
            None,
            false,
        ),
        (
            "conv valid",
            vec![5, 6, 2],
            vec![conv("c", 3, [3, 2], [1, 1], Valid, Relu, true), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "conv same strided, then conv",
            vec![7, 6, 2],
            vec![conv("c1", 3, [3, 3], [2, 2], Same, Tanh, true), conv("c2", 2, [2, 2], [1, 1], Same, Linear, false), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "max pool valid",
            vec![6, 6, 1],
            vec![conv("c", 2, [3, 3], [1, 1], Same, Linear, true), pool("p", PoolKind::Max, [2, 2], [2, 2], Valid), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "max pool same overlapping",
            vec![5, 5, 1],
            vec![conv("c", 2, [2, 2], [1, 1], Same, Linear, true), pool("p", PoolKind::Max, [3, 3], [2, 2], Same), flat(), dense("out", 2, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "average pool valid",
            vec![6, 6, 1],
            vec![conv("c", 2, [3, 3], [1, 1], Valid, Tanh, true), pool("p", PoolKind::Average, [2, 2], [1, 2], Valid), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "average pool same",
            vec![5, 5, 1],
            vec![conv("c", 2, [2, 2], [1, 1], Same, Linear, true), pool("p", PoolKind::Average, [2, 3], [2, 2], Same), flat(), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            3,
            None,
            false,
        ),
        (
            "reshape",
            vec![6],
            vec![
                dense("d", 8, Tanh),
                layer("r", LayerKind::Reshape { target_shape: vec![2, -1, 2] }),
                layer("r2", LayerKind::Reshape { target_shape: vec![2, 2, 2] }),
                conv("c", 2, [2, 2], [1, 1], Same, Linear, true),
                flat(),
                dense("out", 3, Softmax),
            ],
            SparseCategoricalCrossentropy,
            false,
            4,
            None,
            false,
        ),
        (
            "dropout",
            vec![6],
            vec![dense("d", 8, Relu), layer("drop", LayerKind::Dropout { rate: 0.3 }), dense("out", 3, Softmax)],
            SparseCategoricalCrossentropy,
            false,
            5,
            None,
            false,
        ),
        (
            "embedding",
            vec![4],
            vec![
                layer("emb", LayerKind::Embedding { input_dim: 7, output_dim: 3, init: InitSpec::RandomUniform { limit: 0.05 } }),
                flat(),
                dense("out", 3, Softmax),
            ],
            SparseCategoricalCrossentropy,
            false,
            6,
            Some(7),
            false,
        ),
        ("categorical on labels", vec![4], vec![dense("out", 3, Softmax)], CategoricalCrossentropy, false, 5, None, false),
        ("categorical on distributions", vec![4], vec![dense("out", 3, Softmax)], CategoricalCrossentropy, false, 5, None, true),
        ("sparse from logits", vec![4], vec![dense("out", 3, Linear)], SparseCategoricalCrossentropy, true, 5, None, false),
        ("binary", vec![4], vec![dense("d", 3, Tanh), dense("out", 1, Sigmoid)], BinaryCrossentropy, false, 6, None, false),
        (
            "binary separate activation",
            vec![4],
            vec![dense("out", 1, Linear), layer("sig", LayerKind::Activation(Sigmoid))],
            BinaryCrossentropy,
            false,
            6,
            None,
            false,
        ),
        ("binary from logits", vec![4], vec![dense("out", 1, Linear)], BinaryCrossentropy, true, 6, None, false),
        ("mse", vec![4], vec![dense("d", 3, Sigmoid), dense("out", 2, Linear)], MeanSquaredError, false, 5, None, false),
        ("mse through softmax", vec![4], vec![dense("out", 3, Softmax)], MeanSquaredError, false, 5, None, false),
    ]);
    for (i, (case, input, layers, loss, from_logits, n, ids, values)) in cases.into_iter().enumerate() {
        let m = KerasModel::new(&spec(&input, layers), loss, from_logits, 1).unwrap_or_else(|e| panic!("{case}: {e}"));
        for seed in [1u64, 2] {
            gradient_check(case, &m, n, ids, values, 100 * i as u64 + seed);
        }
    }
}

#[test]
fn the_gradient_check_catches_a_wrong_backward_pass() {
    // A gradient 0.1% off must fail the comparison the check makes;
    // otherwise the check proves nothing.
    let m = KerasModel::new(
        &spec(&[5, 5, 1], vec![conv("c", 2, [3, 3], [1, 1], Padding::Same, Act::Linear, true), layer("f", LayerKind::Flatten), dense("out", 2, Act::Softmax)]),
        Loss::SparseCategoricalCrossentropy,
        false,
        1,
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let params: Vec<ArrayD<f64>> =
        m.variables().iter().map(|s| ArrayD::from_shape_simple_fn(s.shape.clone(), || rng.sample::<f64, _>(StandardNormal))).collect();
    let x = Array2::from_shape_simple_fn((3, 25), || rng.sample::<f64, _>(StandardNormal));
    let labels = vec![0u32, 1, 1];
    let mut analytic = m.pass(&params, x.view(), TargetsView::Labels(&labels), None, true).gradients;
    let mut numeric = analytic.clone();
    let eps = 1e-6;
    let mut p = params.clone();
    let k = &mut p[0];
    let orig = k.as_slice().unwrap()[4];
    k.as_slice_mut().unwrap()[4] = orig + eps;
    let plus = m.pass(&p, x.view(), TargetsView::Labels(&labels), None, false).loss;
    p[0].as_slice_mut().unwrap()[4] = orig - eps;
    let minus = m.pass(&p, x.view(), TargetsView::Labels(&labels), None, false).loss;
    numeric[0].as_slice_mut().unwrap()[4] = (plus - minus) / (2.0 * eps);
    assert!(worst_ratio(&analytic, &numeric, 1e-7, 1e-4).0 <= 1.0);
    analytic[0].as_slice_mut().unwrap()[4] *= 1.001;
    assert!(worst_ratio(&analytic, &numeric, 1e-7, 1e-4).0 > 1.0);
}

// ----------------------------------------------- initialisation, dropout

#[test]
fn initial_values_follow_keras_defaults() {
    let m = model("cnn.keras3.json", Loss::SparseCategoricalCrossentropy);
    let specs = m.variables();
    // glorot_uniform: limit sqrt(6 / (fan_in + fan_out)); conv fans are 3*3*1 and 3*3*8.
    assert_eq!(specs[0].init, Init::Uniform { limit: (6.0f64 / (9.0 + 72.0)).sqrt() as f32 });
    assert_eq!(specs[1].init, Init::Zeros);
    assert_eq!(specs[2].init, Init::Uniform { limit: (6.0f64 / 204.0).sqrt() as f32 });
    let values = crate::model::init_values(&specs, 7);
    assert_eq!(values, crate::model::init_values(&specs, 7), "deterministic given the seed");
    assert_ne!(values, crate::model::init_values(&specs, 8));
    let limit = (6.0f32 / 204.0).sqrt();
    assert!(values[2].iter().all(|v| v.abs() <= limit));
    assert!(values[2].iter().any(|v| v.abs() > 0.8 * limit), "values spread over the range");
    assert!(values[1].iter().all(|&v| v == 0.0));
    let emb = model("embedding.keras3.json", Loss::SparseCategoricalCrossentropy);
    assert_eq!(emb.variables()[0].init, Init::Uniform { limit: 0.05 });
    // he_normal: truncated normal of stddev sqrt(2 / fan_in) / 0.8796...
    let all = model("all_layers.keras3.json", Loss::SparseCategoricalCrossentropy);
    let he = all.variables().into_iter().find(|v| v.name == "conv_valid/kernel").unwrap();
    assert_eq!(he.init, Init::TruncatedNormal { stddev: ((2.0f64 / 24.0).sqrt() / TRUNCATED_STDDEV_CORRECTION) as f32 });
}

#[test]
fn dropout_masks_depend_on_seed_and_batch_and_evaluation_has_none() {
    let m = |seed| {
        KerasModel::new(
            &spec(&[20], vec![layer("drop", LayerKind::Dropout { rate: 0.5 }), dense("out", 2, Act::Softmax)]),
            Loss::SparseCategoricalCrossentropy,
            false,
            seed,
        )
        .unwrap()
    };
    let (a, b, c) = (m(1), m(1), m(2));
    let params = crate::model::init_values(&a.variables(), 3);
    let batch = Batch { x: Array2::from_elem((4, 20), 1.0), targets: Targets::Labels(vec![0, 1, 0, 1]), sparse: None };
    let losses = |m: &KerasModel| (0..3).map(|_| m.loss_and_gradients(&params, &batch).loss).collect::<Vec<_>>();
    let (la, lb, lc) = (losses(&a), losses(&b), losses(&c));
    assert_eq!(la, lb, "the same seed draws the same masks, batch after batch");
    assert_ne!(la, lc, "another seed, other masks");
    assert!(la[0] != la[1] && la[1] != la[2], "each batch its own mask: {la:?}");
    // Evaluation: no dropout, so it equals the pass without a mask.
    let eval = a.evaluate(&params, &batch).loss;
    let plain = a.pass(&params, batch.x.view(), targets_view(&batch.targets), None, false).loss as f32;
    assert_eq!(eval, plain);
    assert_eq!(eval, a.evaluate(&params, &batch).loss);
}

#[test]
fn input_and_target_checks_name_the_example() {
    let emb = model("embedding.keras3.json", Loss::SparseCategoricalCrossentropy);
    assert!(emb.check_inputs(&Array2::from_elem((2, 5), 3.0)).is_ok());
    let err = emb.check_inputs(&Array2::from_elem((2, 4), 3.0)).unwrap_err();
    assert!(err.contains("4 features") && err.contains("[5]"), "{err}");
    let mut x = Array2::from_elem((3, 5), 1.0);
    x[[2, 1]] = 20.0;
    assert!(emb.check_inputs(&x).unwrap_err().contains("example 2: 20 is not an embedding id (an integer in 0..20)"));
    x[[2, 1]] = 1.5;
    assert!(emb.check_inputs(&x).unwrap_err().contains("example 2: 1.5"));
    let err = emb.check_targets(&Targets::Labels(vec![0, 2, 3])).unwrap_err();
    assert!(err.contains("example 2 has class 3") && err.contains("3 output units"), "{err}");
    let bin = model("binary.keras3.json", Loss::BinaryCrossentropy);
    assert!(bin.check_targets(&Targets::Labels(vec![0, 1])).is_ok());
    assert!(bin.check_targets(&Targets::Labels(vec![0, 2])).unwrap_err().contains("classes 0 and 1"));
    let reg = model("regression.keras3.json", Loss::MeanSquaredError);
    assert!(reg.check_targets(&Targets::Values(Array2::zeros((2, 2)))).is_ok());
    assert!(reg.check_targets(&Targets::Values(Array2::zeros((2, 1)))).unwrap_err().contains("1 columns"));
}

#[test]
fn a_cnn_learns_and_evaluates() {
    // Bright 3x3 blob in one of four quadrants of a 12x12 image: the class.
    let m = model("cnn.keras3.json", Loss::SparseCategoricalCrossentropy);
    let mut rng = StdRng::seed_from_u64(3);
    let mut make = |n: usize| {
        let mut x = Array2::<f32>::from_shape_simple_fn((n, 144), || 0.2 * rng.random::<f32>());
        let labels: Vec<u32> = (0..n).map(|_| rng.random_range(0..4)).collect();
        for (i, &c) in labels.iter().enumerate() {
            let (r0, c0) = (rng.random_range(0..3) + 6 * (c as usize / 2), rng.random_range(0..3) + 6 * (c as usize % 2));
            for r in r0..r0 + 3 {
                for col in c0..c0 + 3 {
                    x[[i, r * 12 + col]] = 1.0;
                }
            }
        }
        Batch { x, targets: Targets::Labels(labels), sparse: None }
    };
    let test = make(200);
    let mut params = crate::model::init_values(&m.variables(), 1);
    let before = m.evaluate(&params, &test);
    for _ in 0..150 {
        let batch = make(32);
        let lg = m.loss_and_gradients(&params, &batch);
        for (p, g) in params.iter_mut().zip(&lg.gradients) {
            p.scaled_add(-0.1, g);
        }
    }
    let after = m.evaluate(&params, &test);
    assert!(after.loss < before.loss * 0.5, "{before:?} -> {after:?}");
    assert!(after.accuracy.unwrap() > 0.9, "{after:?}");
}

use ndarray::{Array2, ArrayD, arr1, arr2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::spec::{Pass, TargetsView};
use super::*;
use crate::data::{Batch, Targets};
use crate::data::{Sampler, synthetic_classification, synthetic_line};
use crate::init::Init;

// ---------------------------------------------------------------- helpers

/// The generic pass of each model, so the same code runs in f32 and f64.
#[derive(Debug, Clone)]
enum Any {
    Linear(LinearRegression),
    Softmax(SoftmaxRegression),
    Mlp(Mlp),
}

impl Any {
    fn pass<F: Real>(&self, params: &[ArrayD<F>], x: &Array2<F>, t: TargetsView<'_, F>, grads: bool) -> Pass<F> {
        match self {
            Any::Linear(m) => m.pass(params, x.view(), t, grads),
            Any::Softmax(m) => m.pass(params, x.view(), t, grads),
            Any::Mlp(m) => m.pass(params, x.view(), t, grads),
        }
    }

    fn model(&self) -> &dyn Model {
        match self {
            Any::Linear(m) => m,
            Any::Softmax(m) => m,
            Any::Mlp(m) => m,
        }
    }
}

fn normal(rng: &mut StdRng) -> f32 {
    rng.sample(StandardNormal)
}

/// Random parameters (biases too, so their gradients are exercised away
/// from zero), scaled by `scale`.
fn random_params(specs: &[VariableSpec], scale: f32, rng: &mut StdRng) -> Vec<ArrayD<f32>> {
    specs.iter().map(|s| ArrayD::from_shape_simple_fn(s.shape.clone(), || normal(rng) * scale)).collect()
}

/// A random batch for `model`: Gaussian inputs, random labels or values.
fn random_batch(model: &Any, n: usize, input_dim: usize, classes: usize, rng: &mut StdRng) -> Batch {
    let x = Array2::from_shape_simple_fn((n, input_dim), || normal(rng));
    let targets = match model {
        Any::Linear(_) => Targets::Values(Array2::from_shape_simple_fn((n, 1), || normal(rng) * 3.0)),
        _ => Targets::Labels((0..n).map(|_| rng.random_range(0..classes as u32)).collect()),
    };
    Batch { x, targets, sparse: None }
}

fn widen(a: &ArrayD<f32>) -> ArrayD<f64> {
    a.mapv(|v| v as f64)
}

/// Central finite differences of the f64 loss with respect to every
/// parameter element.
fn numerical_gradients(model: &Any, params: &[ArrayD<f64>], x: &Array2<f64>, t: TargetsView<'_, f64>, eps: f64) -> Vec<ArrayD<f64>> {
    let mut p = params.to_vec();
    let mut out = Vec::new();
    for v in 0..p.len() {
        let mut g = ArrayD::zeros(p[v].raw_dim());
        for i in 0..p[v].len() {
            let orig = p[v].as_slice().unwrap()[i];
            p[v].as_slice_mut().unwrap()[i] = orig + eps;
            let plus = model.pass(&p, x, t, false).loss;
            p[v].as_slice_mut().unwrap()[i] = orig - eps;
            let minus = model.pass(&p, x, t, false).loss;
            p[v].as_slice_mut().unwrap()[i] = orig;
            g.as_slice_mut().unwrap()[i] = (plus - minus) / (2.0 * eps);
        }
        out.push(g);
    }
    out
}

/// The worst element of `got` against `want`, as
/// |got - want| / (atol + rtol * max(|got|, |want|)); at most 1 passes.
pub(super) fn worst_ratio<A: Copy + Into<f64>>(got: &[ArrayD<A>], want: &[ArrayD<f64>], atol: f64, rtol: f64) -> (f64, String) {
    assert_eq!(got.len(), want.len(), "number of gradients");
    let mut worst = (0.0, String::new());
    for (v, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "shape of gradient {v}");
        for (i, (&g, &w)) in g.iter().zip(w.iter()).enumerate() {
            let g: f64 = g.into();
            let r = (g - w).abs() / (atol + rtol * g.abs().max(w.abs()));
            if r.is_nan() || r > worst.0 {
                worst = (r, format!("variable {v} element {i}: got {g:e}, want {w:e}"));
            }
        }
    }
    worst
}

fn targets_f64(t: &Targets) -> (Option<Array2<f64>>, Option<Vec<u32>>) {
    match t {
        Targets::Values(v) => (Some(v.mapv(|v| v as f64)), None),
        Targets::Labels(l) => (None, Some(l.clone())),
    }
}

fn view<'a>(values: &'a Option<Array2<f64>>, labels: &'a Option<Vec<u32>>) -> TargetsView<'a, f64> {
    match (values, labels) {
        (Some(v), _) => TargetsView::Values(v.view()),
        (_, Some(l)) => TargetsView::Labels(l),
        _ => unreachable!(),
    }
}

/// Checks `model`'s gradients at random parameters on a random batch:
/// the f64 analytic gradient against f64 central differences (tight), and
/// the f32 gradient and loss the model reports against the f64 ones.
fn gradient_check(model: &Any, n: usize, input_dim: usize, classes: usize, param_scale: f32, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let specs = model.model().variables();
    let params = random_params(&specs, param_scale, &mut rng);
    let batch = random_batch(model, n, input_dim, classes, &mut rng);
    let p64: Vec<_> = params.iter().map(widen).collect();
    let x64 = batch.x.mapv(|v| v as f64);
    let (vals, labels) = targets_f64(&batch.targets);
    let t64 = view(&vals, &labels);

    let analytic = model.pass(&p64, &x64, t64, true);
    let numeric = numerical_gradients(model, &p64, &x64, t64, 1e-5);
    let (r, at) = worst_ratio(&analytic.gradients, &numeric, 1e-8, 1e-5);
    assert!(r <= 1.0, "{model:?}: f64 analytic vs finite differences: {at} (ratio {r:.3})");

    let lg = model.model().loss_and_gradients(&params, &batch);
    let rel_loss = (lg.loss as f64 - analytic.loss).abs() / analytic.loss.abs().max(1e-3);
    assert!(rel_loss < 1e-5, "{model:?}: f32 loss {} vs f64 loss {}", lg.loss, analytic.loss);
    let (r, at) = worst_ratio(&lg.gradients, &analytic.gradients, 1e-6, 1e-3);
    assert!(r <= 1.0, "{model:?}: f32 vs f64 gradients: {at} (ratio {r:.3})");

    // evaluate reports the same loss as loss_and_gradients.
    let m = model.model().evaluate(&params, &batch);
    assert_eq!(m.examples, n);
    assert!((m.loss - lg.loss).abs() <= 1e-6 * lg.loss.abs().max(1.0), "evaluate loss {} vs {}", m.loss, lg.loss);
}

fn mlp(input: usize, hidden: &[usize], classes: usize, act: Activation) -> Any {
    Any::Mlp(Mlp::new(input, hidden, classes, act, WeightInit::TruncatedNormal))
}

// ---------------------------------------------------------- gradient checks

#[test]
fn gradients_match_finite_differences() {
    use Activation::*;
    // (model, batch size, input dim, classes, parameter scale)
    let cases: Vec<(Any, usize, usize, usize, f32)> = vec![
        (Any::Linear(LinearRegression::new(1)), 1, 1, 1, 1.0),
        (Any::Linear(LinearRegression::new(1)), 17, 1, 1, 1.0),
        (Any::Linear(LinearRegression::new(5)), 8, 5, 1, 0.5),
        (Any::Softmax(SoftmaxRegression::new(1, 2)), 3, 1, 2, 1.0),
        (Any::Softmax(SoftmaxRegression::new(7, 4)), 9, 7, 4, 0.5),
        (Any::Softmax(SoftmaxRegression::new(12, 10)), 20, 12, 10, 2.0),
        (mlp(4, &[3], 2, Sigmoid), 5, 4, 2, 1.0),
        (mlp(4, &[3], 2, Relu), 5, 4, 2, 1.0),
        (mlp(4, &[3], 2, Tanh), 5, 4, 2, 1.0),
        (mlp(9, &[6], 5, Sigmoid), 11, 9, 5, 1.0),
        (mlp(9, &[6], 5, Relu), 11, 9, 5, 1.0),
        (mlp(9, &[6], 5, Tanh), 11, 9, 5, 1.0),
        (mlp(6, &[5, 4], 3, Sigmoid), 7, 6, 3, 1.0),
        (mlp(6, &[5, 4], 3, Relu), 7, 6, 3, 1.0),
        (mlp(6, &[5, 4], 3, Tanh), 7, 6, 3, 1.0),
        (mlp(3, &[8, 2, 5], 4, Sigmoid), 6, 3, 4, 1.0),
        (mlp(3, &[8, 2, 5], 4, Relu), 6, 3, 4, 1.0),
        (mlp(3, &[8, 2, 5], 4, Tanh), 6, 3, 4, 1.0),
        (mlp(20, &[1], 3, Tanh), 4, 20, 3, 1.0),
    ];
    for (i, (model, n, d, c, scale)) in cases.iter().enumerate() {
        for seed in [1u64, 2, 3] {
            gradient_check(model, *n, *d, *c, *scale, 1000 * i as u64 + seed);
        }
    }
}

#[test]
fn gradient_checker_detects_a_wrong_gradient() {
    // The check above would be worthless if a wrong gradient passed it.
    let model = mlp(4, &[3], 2, Activation::Sigmoid);
    let mut rng = StdRng::seed_from_u64(7);
    let params: Vec<_> = random_params(&model.model().variables(), 1.0, &mut rng).iter().map(widen).collect();
    let batch = random_batch(&model, 5, 4, 2, &mut rng);
    let x = batch.x.mapv(|v| v as f64);
    let (vals, labels) = targets_f64(&batch.targets);
    let t = view(&vals, &labels);
    let mut analytic = model.pass(&params, &x, t, true).gradients;
    let numeric = numerical_gradients(&model, &params, &x, t, 1e-5);
    assert!(worst_ratio(&analytic, &numeric, 1e-8, 1e-5).0 <= 1.0);
    analytic[0].as_slice_mut().unwrap()[1] *= 1.001;
    assert!(worst_ratio(&analytic, &numeric, 1e-8, 1e-5).0 > 1.0);
}

// ------------------------------------------------------------ exact values

#[test]
fn linear_loss_is_the_mean_squared_error_not_halved() {
    let m = LinearRegression::new(1);
    let params = vec![arr1(&[2.0f32]).into_shape_with_order(vec![1, 1]).unwrap(), arr1(&[1.0f32]).into_dyn()];
    // pred = 2x + 1 = [3, 5, 1]; errors [0, -1, 2] -> mean square 5/3.
    let batch = Batch { x: arr2(&[[1.0f32], [2.0], [0.0]]), targets: Targets::Values(arr2(&[[3.0f32], [6.0], [-1.0]])), sparse: None };
    let lg = m.loss_and_gradients(&params, &batch);
    assert!((lg.loss - 5.0 / 3.0).abs() < 1e-6, "{}", lg.loss);
    // dL/dW = 2/n sum (pred - y) x = 2/3 (0 - 2 + 0); dL/db = 2/3 (0 - 1 + 2).
    assert!((lg.gradients[0][[0, 0]] - (-4.0 / 3.0)).abs() < 1e-6);
    assert!((lg.gradients[1][[0]] - 2.0 / 3.0).abs() < 1e-6);
    let metrics = m.evaluate(&params, &batch);
    assert_eq!(metrics, Metrics { loss: lg.loss, accuracy: None, examples: 3, auc: None });
    assert_eq!(m.summary(&params), vec![("W".to_string(), 2.0), ("b".to_string(), 1.0)]);
}

#[test]
fn linear_summary_names_each_weight_when_there_are_several() {
    let m = LinearRegression::new(2);
    let params = vec![arr2(&[[0.5f32], [-1.0]]).into_dyn(), arr1(&[3.0f32]).into_dyn()];
    let names: Vec<_> = m.summary(&params).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["W[0]", "W[1]", "b"]);
}

#[test]
fn softmax_cross_entropy_values_and_accuracy() {
    let m = SoftmaxRegression::new(2, 3);
    // logits = x (weights = [[1,0,0],[0,1,0]], biases 0): row 0 -> [0, 0, 0], row 1 -> [2, 0, 0].
    let params = vec![arr2(&[[1.0f32, 0.0, 0.0], [0.0, 1.0, 0.0]]).into_dyn(), arr1(&[0.0f32, 0.0, 0.0]).into_dyn()];
    let batch = Batch { x: arr2(&[[0.0f32, 0.0], [2.0, 0.0]]), targets: Targets::Labels(vec![1, 0]), sparse: None };
    let e2 = 2.0f64.exp();
    let want = (3.0f64.ln() + ((e2 + 2.0).ln() - 2.0)) / 2.0;
    let metrics = m.evaluate(&params, &batch);
    assert!((metrics.loss as f64 - want).abs() < 1e-6, "{} vs {want}", metrics.loss);
    // Row 0 is a three-way tie: the first class wins, which is wrong; row 1 is right.
    assert_eq!(metrics.accuracy, Some(0.5));
    assert_eq!(metrics.examples, 2);
    // The bias gradient is the mean of softmax - one_hot.
    let lg = m.loss_and_gradients(&params, &batch);
    let p1 = [e2 / (e2 + 2.0), 1.0 / (e2 + 2.0), 1.0 / (e2 + 2.0)];
    let want_db = [(1.0 / 3.0 + p1[0] - 1.0) / 2.0, (1.0 / 3.0 - 1.0 + p1[1]) / 2.0, (1.0 / 3.0 + p1[2]) / 2.0];
    for (g, w) in lg.gradients[1].iter().zip(want_db) {
        assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
    }
}

#[test]
fn softmax_is_stable_for_huge_logits() {
    let m = SoftmaxRegression::new(1, 2);
    let params = vec![arr2(&[[1.0f32, -1.0]]).into_dyn(), arr1(&[0.0f32, 0.0]).into_dyn()];
    let batch = Batch { x: arr2(&[[500.0f32], [-500.0]]), targets: Targets::Labels(vec![1, 1]), sparse: None };
    let lg = m.loss_and_gradients(&params, &batch);
    // Row 0: logits [500, -500], label 1: loss 1000. Row 1: label right, loss ~0.
    assert!((lg.loss - 500.0).abs() < 1e-3, "{}", lg.loss);
    assert!(lg.gradients.iter().all(|g| g.iter().all(|v| v.is_finite())));
    assert_eq!(m.evaluate(&params, &batch).accuracy, Some(0.5));
}

#[test]
fn sigmoid_mlp_is_finite_with_saturated_units() {
    let m = Mlp::new(3, &[4], 2, Activation::Sigmoid, WeightInit::Normal);
    let mut rng = StdRng::seed_from_u64(5);
    let params = random_params(&m.variables(), 300.0, &mut rng);
    let batch = Batch { x: Array2::from_elem((4, 3), 1.0), targets: Targets::Labels(vec![0, 1, 0, 1]), sparse: None };
    let lg = m.loss_and_gradients(&params, &batch);
    assert!(lg.loss.is_finite());
    assert!(lg.gradients.iter().all(|g| g.iter().all(|v| v.is_finite())));
}

#[test]
fn an_empty_batch_gives_zero_loss_and_zero_gradients() {
    let models: Vec<Box<dyn Model>> =
        vec![Box::new(LinearRegression::new(2)), Box::new(SoftmaxRegression::new(2, 3)), Box::new(Mlp::new(2, &[4], 3, Activation::Relu, WeightInit::Normal))];
    for m in models {
        let params = init_values(&m.variables(), 3);
        let targets = if m.name() == "linear" { Targets::Values(Array2::zeros((0, 1))) } else { Targets::Labels(vec![]) };
        let batch = Batch { x: Array2::zeros((0, 2)), targets, sparse: None };
        let lg = m.loss_and_gradients(&params, &batch);
        assert_eq!(lg.loss, 0.0, "{}", m.name());
        assert_eq!(lg.gradients.len(), params.len());
        for (g, p) in lg.gradients.iter().zip(&params) {
            assert_eq!(g.shape(), p.shape());
            assert!(g.iter().all(|&v| v == 0.0));
        }
        let metrics = m.evaluate(&params, &batch);
        assert_eq!((metrics.loss, metrics.accuracy, metrics.examples), (0.0, None, 0));
    }
}

#[test]
#[should_panic(expected = "variable dense/bias has shape [3], expected [4]")]
fn wrong_parameter_shapes_are_named() {
    let m = Mlp::new(2, &[4], 3, Activation::Relu, WeightInit::Normal);
    let mut params = init_values(&m.variables(), 3);
    params[1] = ArrayD::zeros(vec![3]);
    let batch = Batch { x: Array2::zeros((1, 2)), targets: Targets::Labels(vec![0]), sparse: None };
    m.loss_and_gradients(&params, &batch);
}

// ------------------------------------------------------- building models

fn names_and_shapes(m: &dyn Model) -> Vec<(String, Vec<usize>)> {
    m.variables().into_iter().map(|v| (v.name, v.shape)).collect()
}

fn ns(list: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
    list.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect()
}

#[test]
fn build_model_variables() {
    use Activation::*;
    type Variables = Vec<(String, Vec<usize>)>;
    let cases: Vec<(ModelConfig, &str, Variables)> = vec![
        (ModelConfig::linear(1), "linear", ns(&[("dense/kernel", &[1, 1]), ("dense/bias", &[1])])),
        (ModelConfig::linear(3), "linear", ns(&[("dense/kernel", &[3, 1]), ("dense/bias", &[1])])),
        (
            ModelConfig { name: "Linear".into(), hidden_units: vec![100], ..ModelConfig::linear(1) },
            "linear",
            ns(&[("dense/kernel", &[1, 1]), ("dense/bias", &[1])]),
        ),
        (ModelConfig::softmax(784, 10), "softmax", ns(&[("dense/kernel", &[784, 10]), ("dense/bias", &[10])])),
        (
            ModelConfig::mlp(784, &[100], 10, Sigmoid),
            "mlp",
            ns(&[("dense/kernel", &[784, 100]), ("dense/bias", &[100]), ("dense_1/kernel", &[100, 10]), ("dense_1/bias", &[10])]),
        ),
        (
            ModelConfig::mlp(784, &[256, 128, 64], 10, Relu),
            "mlp",
            ns(&[
                ("dense/kernel", &[784, 256]),
                ("dense/bias", &[256]),
                ("dense_1/kernel", &[256, 128]),
                ("dense_1/bias", &[128]),
                ("dense_2/kernel", &[128, 64]),
                ("dense_2/bias", &[64]),
                ("dense_3/kernel", &[64, 10]),
                ("dense_3/bias", &[10]),
            ]),
        ),
    ];
    for (cfg, name, want) in cases {
        let m = build_model(&cfg).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
        assert_eq!(m.name(), name);
        assert_eq!(names_and_shapes(m.as_ref()), want, "{cfg:?}");
    }
}

#[test]
fn build_model_initialisers() {
    let inits = |cfg: &ModelConfig| build_model(cfg).unwrap().variables().into_iter().map(|v| v.init).collect::<Vec<_>>();
    let n1 = Init::Normal { stddev: 1.0 };
    assert_eq!(inits(&ModelConfig::linear(1)), vec![n1.clone(), n1.clone()]);
    assert_eq!(inits(&ModelConfig::softmax(5, 3)), vec![Init::Zeros, Init::Zeros]);
    let classic = ModelConfig::mlp(784, &[100], 10, Activation::Sigmoid);
    assert_eq!(classic.weight_init, WeightInit::TruncatedNormal);
    assert_eq!(inits(&classic), vec![Init::TruncatedNormal { stddev: 1.0 / 28.0 }, Init::Zeros, Init::TruncatedNormal { stddev: 0.1 }, Init::Zeros]);
    assert_eq!(inits(&classic.with_weight_init(WeightInit::Normal)), vec![n1.clone(), Init::Zeros, n1, Init::Zeros]);
}

#[test]
fn build_model_errors_name_the_field() {
    let cases: Vec<(ModelConfig, &str, &str)> = vec![
        (ModelConfig { name: "cnn".into(), ..ModelConfig::linear(1) }, "name", "unknown model \"cnn\""),
        (ModelConfig::linear(0), "input_dim", "at least 1"),
        (ModelConfig::softmax(0, 10), "input_dim", "at least 1"),
        (ModelConfig::softmax(784, 1), "num_classes", "at least 2"),
        (ModelConfig::mlp(784, &[100], 0, Activation::Relu), "num_classes", "at least 2"),
        (ModelConfig::mlp(0, &[100], 10, Activation::Relu), "input_dim", "at least 1"),
        (ModelConfig::mlp(784, &[], 10, Activation::Relu), "hidden_units", "at least one hidden layer"),
        (ModelConfig::mlp(784, &[100, 0], 10, Activation::Relu), "hidden_units", "hidden layer 1 has 0 units"),
    ];
    for (cfg, field, text) in cases {
        let err = build_model(&cfg).err().unwrap_or_else(|| panic!("{cfg:?} should fail"));
        assert_eq!(err.field(), field, "{cfg:?}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(field) && msg.contains(text), "{cfg:?}: {msg}");
    }
}

#[test]
fn activation_and_weight_init_parse() {
    for a in Activation::ALL {
        assert_eq!(a.to_string().parse::<Activation>().unwrap(), a);
    }
    assert_eq!("ReLU".parse::<Activation>().unwrap(), Activation::Relu);
    assert_eq!("softplus".parse::<Activation>().unwrap_err().field(), "activation");
    assert_eq!("truncated-normal".parse::<WeightInit>().unwrap(), WeightInit::TruncatedNormal);
    assert_eq!("normal".parse::<WeightInit>().unwrap(), WeightInit::Normal);
    assert_eq!("xavier".parse::<WeightInit>().unwrap_err().field(), "weight_init");
}

// ---------------------------------------------------------- initial values

fn spec(name: &str, shape: &[usize], init: Init) -> VariableSpec {
    VariableSpec::new(name, shape.to_vec(), init)
}

#[test]
fn init_values_follow_their_initialisers() {
    let specs = vec![
        spec("z", &[3, 4], Init::Zeros),
        spec("c", &[5], Init::Constant(0.25)),
        spec("n", &[200, 100], Init::Normal { stddev: 2.0 }),
        spec("t", &[200, 100], Init::TruncatedNormal { stddev: 0.5 }),
        spec("u", &[20000], Init::Uniform { limit: 3.0 }),
    ];
    let v = init_values(&specs, 42);
    assert_eq!(v.len(), specs.len());
    for (s, a) in specs.iter().zip(&v) {
        assert_eq!(a.shape(), s.shape.as_slice(), "{}", s.name);
    }
    assert!(v[0].iter().all(|&x| x == 0.0));
    assert!(v[1].iter().all(|&x| x == 0.25));
    let stats = |a: &ArrayD<f32>| {
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    };
    let (mean, sd) = stats(&v[2]);
    assert!(mean.abs() < 0.05 && (sd - 2.0).abs() < 0.05, "normal: mean {mean} sd {sd}");
    assert!(v[2].iter().any(|&x| x.abs() > 2.0 * 2.0), "a plain normal goes beyond 2 stddev");
    // Truncated at 2 stddev: the standard deviation of N(0,1) truncated to [-2, 2] is 0.8796.
    assert!(v[3].iter().all(|&x| x.abs() <= 1.0));
    let (mean, sd) = stats(&v[3]);
    assert!(mean.abs() < 0.02 && (sd - 0.5 * 0.8796).abs() < 0.01, "truncated: mean {mean} sd {sd}");
    assert!(v[4].iter().all(|&x| x.abs() <= 3.0));
    let (mean, sd) = stats(&v[4]);
    assert!(mean.abs() < 0.05 && (sd - 3.0 / 3f64.sqrt()).abs() < 0.03, "uniform: mean {mean} sd {sd}");
}

#[test]
fn init_values_are_deterministic_given_the_seed() {
    let specs = Mlp::new(10, &[7], 3, Activation::Relu, WeightInit::TruncatedNormal).variables();
    assert_eq!(init_values(&specs, 9), init_values(&specs, 9));
    assert_ne!(init_values(&specs, 9)[0], init_values(&specs, 10)[0]);
}

// --------------------------------------------------------- models learn

fn sgd(model: &dyn Model, params: &mut [ArrayD<f32>], sampler: &mut Sampler, lr: f32, steps: usize) -> f32 {
    let mut loss = f32::NAN;
    for _ in 0..steps {
        let lg = model.loss_and_gradients(params, &sampler.next_batch());
        loss = lg.loss;
        for (p, g) in params.iter_mut().zip(&lg.gradients) {
            p.scaled_add(-lr, g);
        }
    }
    loss
}

#[test]
fn linear_regression_learns_the_line() {
    let model = build_model(&ModelConfig::linear(1)).unwrap();
    let mut params = init_values(&model.variables(), 1);
    // The classic example: one sample per step.
    let mut sampler = Sampler::new(synthetic_line(7), 1, 7);
    sgd(model.as_ref(), &mut params, &mut sampler, 0.05, 3000);
    let summary = model.summary(&params);
    let (w, b) = (summary[0].1, summary[1].1);
    assert!((w - 2.0).abs() < 0.3 && (b - 10.0).abs() < 0.2, "W = {w}, b = {b}");
    let held_out = synthetic_line(8).to_batch();
    let loss = model.evaluate(&params, &held_out).loss;
    // The noise variance is 0.33^2 = 0.109.
    assert!(loss < 0.16, "held-out loss {loss}");
}

fn learns_classification(cfg: ModelConfig, lr: f32, steps: usize, min_accuracy: f32) {
    let (train, test) = synthetic_classification(cfg.input_dim, cfg.num_classes, 4000, 1000, 11);
    let model = build_model(&cfg).unwrap();
    let mut params = init_values(&model.variables(), 2);
    let before = model.evaluate(&params, &test.to_batch());
    let mut sampler = Sampler::new(train, 50, 3);
    sgd(model.as_ref(), &mut params, &mut sampler, lr, steps);
    let after = model.evaluate(&params, &test.to_batch());
    let acc = after.accuracy.unwrap();
    assert!(acc >= min_accuracy && after.loss < before.loss, "{cfg:?}: before {before:?}, after {after:?}");
}

#[test]
fn softmax_regression_learns() {
    learns_classification(ModelConfig::softmax(20, 4), 0.5, 600, 0.9);
}

#[test]
fn mlp_learns_with_each_activation() {
    for act in Activation::ALL {
        let lr = if act == Activation::Sigmoid { 1.0 } else { 0.2 };
        learns_classification(ModelConfig::mlp(20, &[32], 4, act), lr, 800, 0.85);
    }
    learns_classification(ModelConfig::mlp(20, &[24, 16], 4, Activation::Tanh), 0.2, 800, 0.85);
}

#[test]
fn mlp_reproduces_the_tensorflow_reference_on_synthetic_mnist() {
    // shared/data/synthetic-mnist/README.md: the 784-100-10 sigmoid MLP with
    // weights N(0,1), biases 0, plain SGD lr 0.5, batch 100 reaches roughly
    // 0.67 test accuracy after 2,000 steps in TensorFlow.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/synthetic-mnist");
    if !dir.is_dir() {
        println!("skipped: {} is absent", dir.display());
        return;
    }
    let mnist = crate::data::load_mnist(&dir).unwrap();
    let cfg = ModelConfig::mlp(784, &[100], 10, Activation::Sigmoid).with_weight_init(WeightInit::Normal);
    let model = build_model(&cfg).unwrap();
    let mut params = init_values(&model.variables(), 1);
    let mut sampler = Sampler::new(mnist.train, 100, 1);
    sgd(model.as_ref(), &mut params, &mut sampler, 0.5, 2000);
    let accuracy = model.evaluate(&params, &mnist.test.to_batch()).accuracy.unwrap();
    assert!((0.6..0.75).contains(&accuracy), "test accuracy {accuracy}, the reference is about 0.67");
}

// ------------------------------------------------------------- presets

/// Every built-in model is the Keras model of its preset: the same
/// variables (names, shapes, initialisers), and the same loss, gradients,
/// accuracy and outputs on the same parameters and batch.
#[test]
fn built_in_models_are_their_keras_presets() {
    use Activation::*;
    let cases = [
        ModelConfig::linear(1),
        ModelConfig::linear(3),
        ModelConfig::softmax(5, 3),
        ModelConfig::mlp(4, &[6], 3, Sigmoid),
        ModelConfig::mlp(4, &[5, 3], 7, Relu).with_weight_init(WeightInit::Normal),
        ModelConfig::mlp(3, &[2, 2, 2], 2, Tanh),
    ];
    let mut rng = StdRng::seed_from_u64(11);
    for cfg in cases {
        let built_in = build_model(&cfg).unwrap();
        let keras = preset(&cfg).unwrap();
        assert_eq!(keras.variables(), built_in.variables(), "{cfg:?}");
        let any = match cfg.name.as_str() {
            "linear" => Any::Linear(LinearRegression::new(cfg.input_dim)),
            "softmax" => Any::Softmax(SoftmaxRegression::new(cfg.input_dim, cfg.num_classes)),
            _ => Any::Mlp(Mlp::new(cfg.input_dim, &cfg.hidden_units, cfg.num_classes, cfg.activation, cfg.weight_init)),
        };
        let params = random_params(&built_in.variables(), 0.7, &mut rng);
        let batch = random_batch(&any, 9, cfg.input_dim, cfg.num_classes, &mut rng);
        let (a, b) = (built_in.loss_and_gradients(&params, &batch), keras.loss_and_gradients(&params, &batch));
        assert!((a.loss - b.loss).abs() < 1e-5 * a.loss.abs().max(1.0), "{cfg:?}: {} vs {}", a.loss, b.loss);
        for (ga, gb) in a.gradients.iter().zip(&b.gradients) {
            let diff = (ga - gb).iter().fold(0.0f32, |m, d| m.max(d.abs()));
            assert!(diff < 1e-5, "{cfg:?}: gradients differ by {diff}");
        }
        let (ea, eb) = (built_in.evaluate(&params, &batch), keras.evaluate(&params, &batch));
        assert_eq!(ea.accuracy, eb.accuracy, "{cfg:?}");
    }
    assert_eq!((dense_layer_name(0), dense_layer_name(2)), ("dense".to_string(), "dense_2".to_string()));
    assert_eq!(preset(&ModelConfig::softmax(4, 1)).unwrap_err().field(), "num_classes");
}

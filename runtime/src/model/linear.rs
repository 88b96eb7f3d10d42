//! Linear regression, the classic first TensorFlow example.

use ndarray::{Array1, ArrayD, ArrayView2, Zip};

use super::config::dense_variable;
use super::spec::{LossAndGradients, Metrics, Model, Pass, Real, TargetsView, VariableSpec, as_matrix, check_params, metrics, targets_view};
use crate::data::Batch;
use crate::init::Init;

/// `pred = x·W + b`, loss = mean over the batch of `(y - pred)^2` (TF's
/// `reduce_mean(square(Y - pred))`, not halved).
///
/// Variables (named as Keras names the one Dense layer of the same model,
/// [`crate::model::preset_spec`]): `dense/kernel` (the classic example's `W`)
/// `[n_features, 1]` and `dense/bias` (`b`) `[1]`, both drawn from Normal(0, 1)
/// like the classic example's `tf.Variable(rng.randn())`. Targets must be
/// [`Targets::Values`](crate::data::Targets::Values) with one column.
#[derive(Debug, Clone)]
pub struct LinearRegression {
    n_features: usize,
    specs: Vec<VariableSpec>,
}

impl LinearRegression {
    /// # Panics
    /// If `n_features` is 0 ([`build_model`](crate::model::build_model) reports that as an error).
    pub fn new(n_features: usize) -> Self {
        assert!(n_features > 0, "linear: n_features must be at least 1");
        let specs = vec![
            VariableSpec::new(dense_variable(0, "kernel"), vec![n_features, 1], Init::Normal { stddev: 1.0 }),
            VariableSpec::new(dense_variable(0, "bias"), vec![1], Init::Normal { stddev: 1.0 }),
        ];
        LinearRegression { n_features, specs }
    }

    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Loss (and gradients when `want_gradients`) for inputs `x` and targets `t`.
    pub(crate) fn pass<F: Real>(&self, params: &[ArrayD<F>], x: ArrayView2<'_, F>, t: TargetsView<'_, F>, want_gradients: bool) -> Pass<F> {
        check_params("linear", &self.specs, params);
        let n = x.nrows();
        assert_eq!(x.ncols(), self.n_features, "linear: batch has {} features, the model {}", x.ncols(), self.n_features);
        let y = match t {
            TargetsView::Values(y) => y,
            TargetsView::Labels(_) => panic!("linear: needs regression targets (Targets::Values), got class labels"),
        };
        assert_eq!(y.dim(), (n, 1), "linear: targets have shape {:?}, expected [{n}, 1]", y.shape());
        let w = as_matrix(&params[0]);
        let b = params[1].iter().next().copied().expect("b has one element");
        if n == 0 {
            let gradients = if want_gradients { params.iter().map(|p| ArrayD::zeros(p.raw_dim())).collect() } else { Vec::new() };
            return Pass { loss: 0.0, correct: None, gradients };
        }
        // r = pred - y
        let mut r = x.dot(&w);
        Zip::from(&mut r).and(&y).for_each(|r, &y| *r = *r + b - y);
        let loss = r.iter().map(|&v| v.widen() * v.widen()).sum::<f64>() / n as f64;
        let mut gradients = Vec::new();
        if want_gradients {
            // d loss / d pred = 2 (pred - y) / n
            let scale = F::cst(2.0 / n as f64);
            r.mapv_inplace(|v| v * scale);
            let dw = x.t().dot(&r);
            let db = Array1::from_elem(1, r.sum());
            gradients = vec![dw.into_dyn(), db.into_dyn()];
        }
        Pass { loss, correct: None, gradients }
    }
}

impl Model for LinearRegression {
    fn name(&self) -> &str {
        "linear"
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
        metrics(p.loss, None, batch)
    }

    /// `W` and `b` for the one-feature model; `W[i]` for each feature and
    /// `b` otherwise.
    fn summary(&self, params: &[ArrayD<f32>]) -> Vec<(String, f64)> {
        check_params("linear", &self.specs, params);
        let mut out = Vec::with_capacity(self.n_features + 1);
        if self.n_features == 1 {
            out.push(("W".to_string(), params[0].iter().next().copied().unwrap_or(0.0) as f64));
        } else {
            out.extend(params[0].iter().enumerate().map(|(i, &w)| (format!("W[{i}]"), w as f64)));
        }
        out.push(("b".to_string(), params[1].iter().next().copied().unwrap_or(0.0) as f64));
        out
    }
}

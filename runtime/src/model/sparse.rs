//! Click-through models over hashed sparse features (batches of
//! [`crate::data::SparseFeatures`]): `sparse_lr` and `wide_deep`. A
//! feature's row in a table is `key % hash_buckets`.
//!
//! - `sparse_lr`: logistic regression, `logit = bias + Σ value · w[row] +
//!   dense · u`. Variables: `linear/weights` (embedding `[buckets, 1]`),
//!   `linear/bias` `[1]`, and `linear/dense` `[dense_dim, 1]` when the data
//!   have dense inputs (criteo's integers).
//! - `wide_deep`: the same linear part (`wide/...`) plus an MLP over the
//!   embeddings of the categorical fields: each field's features are
//!   combined as TensorFlow's `embedding_lookup_sparse` with the `mean`
//!   combiner (`Σ value · e[row] / Σ |value|`), the fields' vectors and the
//!   dense inputs concatenated, then relu hidden layers (`--hidden_units`)
//!   and one logit. Variables: `wide/weights`, `wide/bias`,
//!   (`wide/dense`), `deep/embeddings` (embedding `[buckets,
//!   embedding_dim]`), `deep/hidden<k>/kernel`, `deep/hidden<k>/bias`,
//!   `deep/logits/kernel`, `deep/logits/bias`.
//!
//! Loss: the sigmoid cross-entropy (log loss), mean over the batch.
//! Labels are classes 0 and 1. Embeddings are sparse (pulled and pushed by
//! row) unless the model is built with dense embeddings (the baseline).

use ndarray::{Array2, ArrayD, ArrayView2, Axis, Ix2};

use super::spec::{EmbeddingDecl, LossAndGradients, Metrics, Model, Real, VariableSpec, check_params};
use crate::data::{Batch, BatchRows, SparseFeatures, Targets};
use crate::init::Init;
use crate::placement::PartitionStrategy;

/// What a sparse model is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseModelConfig {
    pub hash_buckets: usize,
    pub embedding_dim: usize,
    pub hidden_units: Vec<usize>,
    /// Dense inputs per example (criteo: 13).
    pub dense_dim: usize,
    /// Categorical fields (criteo: 26; libsvm: 1).
    pub fields: usize,
    pub partition: PartitionStrategy,
    /// Pull and push the embeddings by row (false: whole, as dense variables).
    pub sparse_embeddings: bool,
}

/// `sparse_lr` or `wide_deep`.
#[derive(Debug, Clone)]
pub struct SparseModel {
    name: &'static str,
    cfg: SparseModelConfig,
    specs: Vec<VariableSpec>,
    deep: bool,
}

/// Where the variables are in the list.
const WEIGHTS: usize = 0;
const BIAS: usize = 1;

impl SparseModel {
    pub fn sparse_lr(cfg: SparseModelConfig) -> Self {
        Self::build("sparse_lr", cfg, false)
    }

    pub fn wide_deep(cfg: SparseModelConfig) -> Self {
        Self::build("wide_deep", cfg, true)
    }

    fn build(name: &'static str, cfg: SparseModelConfig, deep: bool) -> Self {
        let prefix = if deep { "wide" } else { "linear" };
        let decl = EmbeddingDecl { partition: cfg.partition, sparse: cfg.sparse_embeddings };
        let mut specs = vec![
            VariableSpec::embedding(format!("{prefix}/weights"), cfg.hash_buckets, 1, Init::Zeros, decl),
            VariableSpec::new(format!("{prefix}/bias"), vec![1], Init::Zeros),
        ];
        if cfg.dense_dim > 0 {
            specs.push(VariableSpec::new(format!("{prefix}/dense"), vec![cfg.dense_dim, 1], Init::Zeros));
        }
        if deep {
            let dim = cfg.embedding_dim;
            specs.push(VariableSpec::embedding("deep/embeddings", cfg.hash_buckets, dim, Init::TruncatedNormal { stddev: 1.0 / (dim as f32).sqrt() }, decl));
            let mut fan_in = cfg.fields * dim + cfg.dense_dim;
            for (k, &h) in cfg.hidden_units.iter().enumerate() {
                specs.push(VariableSpec::new(
                    format!("deep/hidden{k}/kernel"),
                    vec![fan_in, h],
                    Init::TruncatedNormal { stddev: (2.0 / fan_in as f32).sqrt() },
                ));
                specs.push(VariableSpec::new(format!("deep/hidden{k}/bias"), vec![h], Init::Zeros));
                fan_in = h;
            }
            specs.push(VariableSpec::new("deep/logits/kernel", vec![fan_in, 1], Init::TruncatedNormal { stddev: (1.0 / fan_in as f32).sqrt() }));
            specs.push(VariableSpec::new("deep/logits/bias", vec![1], Init::Zeros));
        }
        SparseModel { name, cfg, specs, deep }
    }

    fn dense_index(&self) -> Option<usize> {
        (self.cfg.dense_dim > 0).then_some(2)
    }

    fn embeddings_index(&self) -> usize {
        2 + usize::from(self.cfg.dense_dim > 0)
    }

    /// The table row of a feature key.
    fn row(&self, key: u64) -> i64 {
        (key % self.cfg.hash_buckets as u64) as i64
    }

    /// The rows of the embeddings the batch touches (sorted, unique), and each key's slot among
    /// them.
    fn rows_of<'f>(&self, f: &'f SparseFeatures) -> std::borrow::Cow<'f, BatchRows> {
        f.batch_rows(self.cfg.hash_buckets as u64)
    }

    /// Loss, logits and (when asked) gradients, generically.
    pub(crate) fn pass<F: Real>(&self, params: &[ArrayD<F>], batch: &Batch, want_gradients: bool) -> (f64, Vec<f64>, Vec<ArrayD<F>>) {
        let f = batch.sparse.as_ref().expect("a sparse model needs a batch of sparse features");
        let Targets::Labels(labels) = &batch.targets else { panic!("{}: labels must be classes 0 and 1", self.name) };
        // Each feature's place in the weights and embeddings: among the batch's rows when the
        // worker holds only those, else the row itself.
        let batch_rows;
        let dense_slots: Vec<usize>;
        let (held_rows, slots): (usize, &[usize]) = if self.cfg.sparse_embeddings {
            batch_rows = self.rows_of(f);
            (batch_rows.rows.len(), &batch_rows.slots)
        } else {
            dense_slots = f.keys.iter().map(|&k| self.row(k) as usize).collect();
            (0, &dense_slots)
        };
        let held: Vec<usize> = self.specs.iter().map(|s| if s.is_sparse() { held_rows } else { s.shape[0] }).collect();
        let specs: Vec<VariableSpec> = self.specs.iter().zip(&held).map(|(s, &n)| VariableSpec { shape: s.held_shape(n), ..s.clone() }).collect();
        check_params(self.name, &specs, params);
        let n = batch.len();
        let w = params[WEIGHTS].as_slice().expect("standard layout");
        let mut logits: Vec<F> = (0..n).map(|i| f.range(i).fold(params[BIAS][[0]], |z, j| z + F::cst(f64::from(f.values[j])) * w[slots[j]])).collect();
        if let Some(d) = self.dense_index() {
            let x = batch.x.mapv(|v| F::cst(f64::from(v)));
            let u = params[d].view().into_dimensionality::<Ix2>().expect("2-d");
            for (z, extra) in logits.iter_mut().zip(x.dot(&u).column(0)) {
                *z += *extra;
            }
        }
        let deep = self.deep.then(|| self.deep_forward(params, batch, f, slots));
        if let Some(d) = &deep {
            for (z, extra) in logits.iter_mut().zip(d.logits.column(0)) {
                *z += *extra;
            }
        }
        let (loss, dz) = log_loss(&logits, labels);
        let out: Vec<f64> = logits.iter().map(|z| z.widen()).collect();
        if !want_gradients {
            return (loss, out, Vec::new());
        }
        let grads = self.backward(&specs, params, batch, slots, deep, &dz);
        (loss, out, grads)
    }

    /// The gradients of every variable (shaped as `specs`: the weights and embeddings as the
    /// rows held), from `dz`, the loss's gradient with respect to each example's logit.
    fn backward<F: Real>(
        &self,
        specs: &[VariableSpec],
        params: &[ArrayD<F>],
        batch: &Batch,
        slots: &[usize],
        deep: Option<DeepForward<F>>,
        dz: &[F],
    ) -> Vec<ArrayD<F>> {
        let f = batch.sparse.as_ref().expect("a sparse model needs a batch of sparse features");
        let mut grads: Vec<ArrayD<F>> = specs.iter().map(|s| ArrayD::zeros(s.shape.clone())).collect();
        {
            let gw = grads[WEIGHTS].as_slice_mut().expect("standard layout");
            for (i, &d) in dz.iter().enumerate() {
                for j in f.range(i) {
                    gw[slots[j]] += d * F::cst(f64::from(f.values[j]));
                }
            }
        }
        grads[BIAS][[0]] = dz.iter().fold(F::zero(), |a, &b| a + b);
        if let Some(d) = self.dense_index() {
            let x = batch.x.mapv(|v| F::cst(f64::from(v)));
            let dzv = ndarray::Array1::from(dz.to_vec());
            let g = x.t().dot(&dzv);
            grads[d] = g.insert_axis(Axis(1)).into_dyn();
        }
        if let Some(d) = deep {
            self.deep_backward(params, f, slots, d, dz, &mut grads);
        }
        grads.into_iter().map(|g| if g.is_standard_layout() { g } else { g.as_standard_layout().into_owned() }).collect()
    }
}

/// The mean log loss of `logits` against `labels` (a label above 1 counts as 1), and its
/// gradient with respect to each logit.
fn log_loss<F: Real>(logits: &[F], labels: &[u32]) -> (f64, Vec<F>) {
    let n = logits.len();
    let mut loss = 0.0;
    let mut dz = Vec::with_capacity(n);
    for (&z, &y) in logits.iter().zip(labels) {
        let zf = z.widen();
        let y = f64::from(y.min(1));
        loss += zf.max(0.0) - zf * y + (-zf.abs()).exp().ln_1p();
        dz.push(F::cst((1.0 / (1.0 + (-zf).exp()) - y) / n.max(1) as f64));
    }
    let loss = if n == 0 { 0.0 } else { loss / n as f64 };
    (loss, dz)
}

/// What the deep part's forward pass keeps for its backward pass.
struct DeepForward<F> {
    /// The input of each layer (the concatenated embeddings and dense inputs first).
    inputs: Vec<Array2<F>>,
    /// The pre-activations of the hidden layers.
    pre: Vec<Array2<F>>,
    logits: Array2<F>,
    /// Per example and field, the sum of |value| (the mean combiner's divisor).
    norms: Array2<F>,
}

fn matrix<F>(p: &ArrayD<F>) -> ArrayView2<'_, F> {
    p.view().into_dimensionality::<Ix2>().expect("2-d")
}

fn row_vector<F: Clone>(p: &ArrayD<F>) -> ndarray::ArrayView1<'_, F> {
    p.view().into_dimensionality::<ndarray::Ix1>().expect("1-d")
}

impl SparseModel {
    fn deep_forward<F: Real>(&self, params: &[ArrayD<F>], batch: &Batch, f: &SparseFeatures, slots: &[usize]) -> DeepForward<F> {
        let (n, dim, fields, dd) = (batch.len(), self.cfg.embedding_dim, self.cfg.fields, self.cfg.dense_dim);
        let e = params[self.embeddings_index()].as_slice().expect("standard layout");
        let mut h0 = Array2::<F>::zeros((n, fields * dim + dd));
        let mut norms = Array2::<F>::zeros((n, fields));
        for i in 0..n {
            for j in f.range(i) {
                let (field, v, r) = ((f.fields[j] as usize).min(fields - 1), f.values[j], slots[j]);
                norms[[i, field]] += F::cst(f64::from(v.abs()));
                for k in 0..dim {
                    h0[[i, field * dim + k]] += F::cst(f64::from(v)) * e[r * dim + k];
                }
            }
            for field in 0..fields {
                let norm = norms[[i, field]];
                if norm > F::zero() {
                    for k in 0..dim {
                        h0[[i, field * dim + k]] /= norm;
                    }
                }
            }
            for j in 0..dd {
                h0[[i, fields * dim + j]] = F::cst(f64::from(batch.x[[i, j]]));
            }
        }
        let first = self.embeddings_index() + 1;
        let mut inputs = vec![h0];
        let mut pre = Vec::new();
        for k in 0..self.cfg.hidden_units.len() {
            let z = inputs[k].dot(&matrix(&params[first + 2 * k])) + row_vector(&params[first + 2 * k + 1]);
            inputs.push(z.mapv(|v| if v > F::zero() { v } else { F::zero() }));
            pre.push(z);
        }
        let last = first + 2 * self.cfg.hidden_units.len();
        let logits = inputs.last().expect("the input").dot(&matrix(&params[last])) + row_vector(&params[last + 1]);
        DeepForward { inputs, pre, logits, norms }
    }

    fn deep_backward<F: Real>(&self, params: &[ArrayD<F>], f: &SparseFeatures, slots: &[usize], d: DeepForward<F>, dz: &[F], grads: &mut [ArrayD<F>]) {
        let first = self.embeddings_index() + 1;
        let layers = self.cfg.hidden_units.len();
        let last = first + 2 * layers;
        let mut delta = Array2::from_shape_vec((dz.len(), 1), dz.to_vec()).expect("n x 1");
        grads[last] = d.inputs[layers].t().dot(&delta).into_dyn();
        grads[last + 1] = delta.sum_axis(Axis(0)).into_dyn();
        let mut upstream = delta.dot(&matrix(&params[last]).t());
        for k in (0..layers).rev() {
            delta = upstream * &d.pre[k].mapv(|v| if v > F::zero() { F::one() } else { F::zero() });
            grads[first + 2 * k] = d.inputs[k].t().dot(&delta).into_dyn();
            grads[first + 2 * k + 1] = delta.sum_axis(Axis(0)).into_dyn();
            upstream = delta.dot(&matrix(&params[first + 2 * k]).t());
        }
        // `upstream` is the gradient of the concatenated input: back to the rows.
        let (dim, fields) = (self.cfg.embedding_dim, self.cfg.fields);
        let ge = grads[self.embeddings_index()].as_slice_mut().expect("standard layout");
        for i in 0..dz.len() {
            for j in f.range(i) {
                let (field, v, r) = ((f.fields[j] as usize).min(fields - 1), f.values[j], slots[j]);
                let norm = d.norms[[i, field]];
                let scale = if norm > F::zero() { F::cst(f64::from(v)) / norm } else { F::cst(f64::from(v)) };
                for k in 0..dim {
                    ge[r * dim + k] += scale * upstream[[i, field * dim + k]];
                }
            }
        }
    }
}

impl Model for SparseModel {
    fn name(&self) -> &str {
        self.name
    }

    fn variables(&self) -> Vec<VariableSpec> {
        self.specs.clone()
    }

    fn loss_and_gradients(&self, params: &[ArrayD<f32>], batch: &Batch) -> LossAndGradients {
        let (loss, _, gradients) = self.pass(params, batch, true);
        LossAndGradients { loss: loss as f32, gradients }
    }

    /// Log loss, accuracy at 0.5 and AUC.
    fn evaluate(&self, params: &[ArrayD<f32>], batch: &Batch) -> Metrics {
        let (loss, logits, _) = self.pass(params, batch, false);
        let Targets::Labels(labels) = &batch.targets else { panic!("{}: labels must be classes 0 and 1", self.name) };
        let correct = logits.iter().zip(labels).filter(|(z, y)| u32::from(**z > 0.0) == (**y).min(1)).count();
        let auc = crate::data::auc(&logits, labels);
        Metrics {
            loss: loss as f32,
            accuracy: (!labels.is_empty()).then(|| correct as f32 / labels.len() as f32),
            examples: labels.len(),
            auc: auc.is_finite().then_some(auc as f32),
        }
    }

    fn prepare(&self, batch: &Batch) {
        if let (Some(f), true) = (&batch.sparse, self.cfg.sparse_embeddings) {
            self.rows_of(f);
        }
    }

    fn row_ids(&self, batch: &Batch) -> Vec<Vec<i64>> {
        let rows = match (&batch.sparse, self.cfg.sparse_embeddings) {
            (Some(f), true) => self.rows_of(f),
            _ => std::borrow::Cow::Owned(BatchRows::default()),
        };
        self.specs.iter().map(|s| if s.is_sparse() { rows.rows.clone() } else { Vec::new() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Generator, SparseFormat, sparse_batch};
    use crate::embedding::RowTable;
    use crate::optimizer::Optimizer;

    fn config(format: SparseFormat, sparse: bool) -> SparseModelConfig {
        SparseModelConfig {
            hash_buckets: 97,
            embedding_dim: 3,
            hidden_units: vec![4, 3],
            dense_dim: format.dense_dim(),
            fields: format.fields(),
            partition: PartitionStrategy::Mod,
            sparse_embeddings: sparse,
        }
    }

    fn models(format: SparseFormat, sparse: bool) -> [SparseModel; 2] {
        [SparseModel::sparse_lr(config(format, sparse)), SparseModel::wide_deep(config(format, sparse))]
    }

    /// Random parameters as the model holds them for `batch`.
    fn params(m: &SparseModel, batch: &Batch, seed: u64) -> Vec<ArrayD<f64>> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let rows = m.row_ids(batch);
        m.variables().iter().zip(&rows).map(|(s, r)| ArrayD::from_shape_simple_fn(s.held_shape(r.len()), || rng.random::<f64>() - 0.5)).collect()
    }

    /// Both models, with sparse and dense embeddings, over both formats:
    /// the analytic gradient against central finite differences in f64.
    #[test]
    fn gradient_checks() {
        for format in [SparseFormat::Libsvm, SparseFormat::Criteo] {
            let g = Generator::new(format, 11);
            let examples: Vec<_> = (0..6).map(|i| g.example(i).0).collect();
            let batch = sparse_batch(&examples, format);
            for sparse in [true, false] {
                for m in models(format, sparse) {
                    let mut p = params(&m, &batch, 3);
                    let (_, _, analytic) = m.pass(&p, &batch, true);
                    let eps = 1e-6;
                    for v in 0..p.len() {
                        // Dense tables are large: check the touched rows and a few others.
                        let n = p[v].len();
                        let check: Vec<usize> = if n > 60 { (0..n).step_by(7).collect() } else { (0..n).collect() };
                        for i in check {
                            let orig = p[v].as_slice().unwrap()[i];
                            p[v].as_slice_mut().unwrap()[i] = orig + eps;
                            let plus = m.pass(&p, &batch, false).0;
                            p[v].as_slice_mut().unwrap()[i] = orig - eps;
                            let minus = m.pass(&p, &batch, false).0;
                            p[v].as_slice_mut().unwrap()[i] = orig;
                            let numeric = (plus - minus) / (2.0 * eps);
                            let got = analytic[v].as_slice().unwrap()[i];
                            assert!(
                                (got - numeric).abs() <= 1e-7 + 1e-5 * numeric.abs(),
                                "{} {format} sparse={sparse} variable {v} element {i}: {got} vs {numeric}",
                                m.name
                            );
                        }
                    }
                }
            }
        }
    }

    /// The same small model trained with a dense embedding (pulled whole,
    /// updated everywhere with zero gradients off the batch) and with a
    /// sparse one (rows of the batch, row-wise state) ends with the same
    /// variables, for SGD and Adagrad.
    #[test]
    fn dense_and_sparse_embeddings_train_the_same_variables() {
        let format = SparseFormat::Criteo;
        let g = Generator::new(format, 4);
        for opt in [Optimizer::sgd(0.3), Optimizer::from_name("adagrad", 0.3, 0.0).unwrap()] {
            let dense = SparseModel::wide_deep(config(format, false));
            let sparse = SparseModel::wide_deep(config(format, true));
            let mut dp = crate::model::init_values(&dense.variables(), 9);
            let mut dslots: Vec<_> = dp.iter().map(|p| opt.new_slots(p.len())).collect();
            let mut sp = crate::model::init_values(&sparse.variables(), 9);
            let mut sslots: Vec<_> = sp.iter().map(|p| opt.new_slots(p.len())).collect();
            let specs = sparse.variables();
            let mut tables: Vec<Option<RowTable>> =
                specs.iter().map(|s| s.is_sparse().then(|| RowTable::whole(&s.name, s.shape[0], s.shape[1], s.init.clone(), 9))).collect();
            for step in 0..8u64 {
                let examples: Vec<_> = (step * 16..step * 16 + 16).map(|i| g.example(i).0).collect();
                let batch = sparse_batch(&examples, format);
                let lg = dense.loss_and_gradients(&dp, &batch);
                for ((p, s), gr) in dp.iter_mut().zip(&mut dslots).zip(&lg.gradients) {
                    opt.apply_all(p.as_slice_mut().unwrap(), s, gr.as_slice().unwrap());
                }
                let rows = sparse.row_ids(&batch);
                for (v, t) in tables.iter().enumerate() {
                    if let Some(t) = t {
                        let mut values = Vec::new();
                        t.gather(&rows[v], &mut values);
                        sp[v] = ArrayD::from_shape_vec(vec![rows[v].len(), t.dim()], values).unwrap();
                    }
                }
                let lg = sparse.loss_and_gradients(&sp, &batch);
                for (v, gr) in lg.gradients.iter().enumerate() {
                    match &mut tables[v] {
                        Some(t) => t.apply(&opt, &rows[v], gr.as_slice().unwrap()),
                        None => opt.apply_all(sp[v].as_slice_mut().unwrap(), &mut sslots[v], gr.as_slice().unwrap()),
                    }
                }
            }
            for (v, s) in specs.iter().enumerate() {
                let want = dp[v].as_slice().unwrap();
                let got: Vec<f32> = match &tables[v] {
                    Some(t) => {
                        let all: Vec<i64> = (0..s.shape[0] as i64).collect();
                        let mut out = Vec::new();
                        t.gather(&all, &mut out);
                        out
                    }
                    None => sp[v].as_slice().unwrap().to_vec(),
                };
                for (a, b) in got.iter().zip(want) {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{} {}: {a} vs {b}", opt.name(), s.name);
                }
            }
        }
    }

    #[test]
    fn evaluation_reports_log_loss_and_auc() {
        let format = SparseFormat::Libsvm;
        let g = Generator::new(format, 2);
        let m = SparseModel::sparse_lr(config(format, true));
        let batch = sparse_batch(&(0..200).map(|i| g.example(i).0).collect::<Vec<_>>(), format);
        let p: Vec<ArrayD<f32>> = m.variables().iter().zip(m.row_ids(&batch)).map(|(s, r)| ArrayD::zeros(s.held_shape(r.len()))).collect();
        let metrics = m.evaluate(&p, &batch);
        assert!((metrics.loss - std::f32::consts::LN_2).abs() < 1e-6, "all logits 0: log loss ln 2");
        assert_eq!(metrics.auc, Some(0.5), "all scores tie");
        assert_eq!(metrics.examples, 200);
    }
}

//! The losses of `--loss`, computed as Keras computes them (mean over the
//! batch; binary cross-entropy and mse also over the outputs), from the
//! logits when the model ends in softmax or sigmoid (that activation is
//! then applied only for predictions), which is exact and stable where
//! Keras would clip probabilities at 1e-7.

use std::fmt;
use std::str::FromStr;

use ndarray::{Array2, Zip};

use crate::data::Targets;
use crate::model::dense::softmax_cross_entropy;
use crate::model::spec::{Real, TargetsView};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    SparseCategoricalCrossentropy,
    CategoricalCrossentropy,
    BinaryCrossentropy,
    MeanSquaredError,
}

impl Loss {
    pub const ALL: [Loss; 4] = [Loss::SparseCategoricalCrossentropy, Loss::CategoricalCrossentropy, Loss::BinaryCrossentropy, Loss::MeanSquaredError];

    pub fn as_str(self) -> &'static str {
        match self {
            Loss::SparseCategoricalCrossentropy => "sparse_categorical_crossentropy",
            Loss::CategoricalCrossentropy => "categorical_crossentropy",
            Loss::BinaryCrossentropy => "binary_crossentropy",
            Loss::MeanSquaredError => "mse",
        }
    }

    /// Whether the targets are classes (everything but mse).
    pub fn is_classification(self) -> bool {
        self != Loss::MeanSquaredError
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Loss {
    type Err = String;
    /// Keras's names (`mean_squared_error` for mse too).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sparse_categorical_crossentropy" => Ok(Loss::SparseCategoricalCrossentropy),
            "categorical_crossentropy" => Ok(Loss::CategoricalCrossentropy),
            "binary_crossentropy" => Ok(Loss::BinaryCrossentropy),
            "mse" | "mean_squared_error" => Ok(Loss::MeanSquaredError),
            _ => Err(format!("unknown loss {s:?} (sparse_categorical_crossentropy, categorical_crossentropy, binary_crossentropy, mse)")),
        }
    }
}

/// What turns the last layer's values into the model's outputs: the
/// softmax or sigmoid the loss takes logits of, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    Softmax,
    Sigmoid,
    Identity,
}

impl Loss {
    /// Checks targets against a model with `outputs` output units: classes
    /// below `outputs` (or 0/1 for binary cross-entropy with one output),
    /// values with `outputs` columns. The error says what does not fit.
    pub fn check_targets(self, targets: &Targets, outputs: usize) -> Result<(), String> {
        match (self, targets) {
            (Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy, Targets::Labels(l)) => match l.iter().position(|&c| c as usize >= outputs) {
                Some(i) => Err(format!("example {i} has class {} but the model has {outputs} output units (classes 0..{outputs})", l[i])),
                None => Ok(()),
            },
            (Loss::BinaryCrossentropy, Targets::Labels(l)) => {
                if outputs != 1 {
                    return Err(format!("binary_crossentropy on class labels needs one output unit, the model has {outputs}"));
                }
                match l.iter().position(|&c| c > 1) {
                    Some(i) => Err(format!("example {i} has class {}: binary_crossentropy needs classes 0 and 1", l[i])),
                    None => Ok(()),
                }
            }
            (Loss::MeanSquaredError, Targets::Labels(_)) if outputs != 1 => {
                Err(format!("mse on one target column needs one output unit, the model has {outputs}"))
            }
            (Loss::SparseCategoricalCrossentropy, Targets::Values(_)) => Err("sparse_categorical_crossentropy needs class labels, not values".into()),
            (_, Targets::Values(v)) if v.ncols() != outputs => Err(format!("targets have {} columns but the model has {outputs} output units", v.ncols())),
            _ => Ok(()),
        }
    }

    /// The summed loss over the batch and the number of correct
    /// predictions (classification), from `z`: logits under a softmax or
    /// sigmoid head, else the outputs. With `want_gradient`, `z` becomes
    /// the gradient of the *mean* loss with respect to it.
    ///
    /// # Panics
    /// If the targets do not fit (see [`Loss::check_targets`]): a bug of the caller.
    pub(crate) fn compute<F: Real>(self, head: Head, z: &mut Array2<F>, t: TargetsView<'_, F>, want_gradient: bool) -> (f64, Option<usize>) {
        let n = z.nrows();
        let inv_n = F::cst(1.0 / n.max(1) as f64);
        match (self, head, t) {
            (Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy, Head::Softmax | Head::Identity, TargetsView::Labels(l)) => {
                let (loss, correct) = softmax_cross_entropy("keras", z, l, want_gradient);
                (loss, Some(correct))
            }
            (Loss::CategoricalCrossentropy, _, TargetsView::Values(y)) => categorical_values(z, y, inv_n, want_gradient),
            (Loss::BinaryCrossentropy, _, t) => {
                let y = values_of(t, n);
                let inv = inv_n / F::cst(z.ncols().max(1) as f64);
                let mut loss = 0.0;
                let mut correct = 0;
                Zip::from(&mut *z).and(&y).for_each(|z, &y| {
                    // max(z, 0) - z y + ln(1 + e^-|z|), stable for any z.
                    let zz = *z;
                    loss += (zz.max(F::zero()) - zz * y + (F::one() + (-zz.abs()).exp()).ln()).widen();
                    if (zz > F::zero()) == (y > F::cst(0.5)) {
                        correct += 1;
                    }
                    if want_gradient {
                        *z = (F::one() / (F::one() + (-zz).exp()) - y) * inv;
                    }
                });
                (loss / z.ncols().max(1) as f64, Some(correct / z.ncols().max(1)))
            }
            (Loss::MeanSquaredError, _, t) => {
                let y = values_of(t, n);
                let k = z.ncols().max(1) as f64;
                let scale = F::cst(2.0) * inv_n / F::cst(k);
                let mut loss = 0.0;
                Zip::from(&mut *z).and(&y).for_each(|z, &y| {
                    let r = *z - y;
                    loss += r.widen() * r.widen();
                    if want_gradient {
                        *z = r * scale;
                    }
                });
                (loss / k, None)
            }
            (loss, head, _) => panic!("keras: loss {loss} with head {head:?} on these targets: the model's checks let through what they should not"),
        }
    }
}

/// Targets as an `[n, k]` array of values (class labels become one column).
fn values_of<F: Real>(t: TargetsView<'_, F>, n: usize) -> Array2<F> {
    match t {
        TargetsView::Values(v) => v.to_owned(),
        TargetsView::Labels(l) => Array2::from_shape_fn((n, 1), |(i, _)| F::cst(l[i] as f64)),
    }
}

/// Categorical cross-entropy of logits `z` against target distributions
/// `y` (rows of one-hot or probabilities): `sum_j y_j (lse(z) - z_j)`;
/// correct when the arg-max of `z` is the arg-max of `y`.
fn categorical_values<F: Real>(z: &mut Array2<F>, y: ndarray::ArrayView2<'_, F>, inv_n: F, want_gradient: bool) -> (f64, Option<usize>) {
    let mut loss = 0.0;
    let mut correct = 0;
    for (mut zr, yr) in z.rows_mut().into_iter().zip(y.rows()) {
        let argmax =
            |r: ndarray::ArrayView1<'_, F>| r.iter().enumerate().fold((0, F::neg_infinity()), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0;
        if argmax(zr.view()) == argmax(yr) {
            correct += 1;
        }
        let max = zr.fold(F::neg_infinity(), |m, &v| if v > m { v } else { m });
        let sum = zr.fold(F::zero(), |s, &v| s + (v - max).exp());
        let lse = max + sum.ln();
        let total = yr.sum();
        loss += yr.iter().zip(zr.iter()).map(|(&y, &z)| (y * (lse - z)).widen()).sum::<f64>();
        if want_gradient {
            Zip::from(&mut zr).and(&yr).for_each(|z, &y| *z = (total * (*z - lse).exp() - y) * inv_n);
        }
    }
    (loss, Some(correct))
}

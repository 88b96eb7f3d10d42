//! The layers as computed: shapes fixed when the model is built, a forward
//! pass that keeps what the backward pass needs, and the backward pass.
//! Tensors carry the batch as their first axis; one example's shape is
//! Keras's shape without the batch dimension.

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewD, Axis, IxDyn, Zip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::conv::{self, Geometry, PoolCache};
use super::json::{Act, PoolKind};
use crate::model::spec::Real;

/// What a layer computes, with the sizes fixed at build time.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `act(x·kernel + bias)` over the last axis.
    Dense {
        units: usize,
        activation: Act,
        use_bias: bool,
    },
    Activation(Act),
    /// Inverted dropout: kept elements are scaled by `1 / (1 - rate)`.
    Dropout {
        rate: f32,
    },
    /// Flatten and Reshape: the same elements in the same order, another shape.
    Reshape,
    Conv2D {
        geometry: Geometry,
        filters: usize,
        activation: Act,
        use_bias: bool,
    },
    Pool {
        kind: PoolKind,
        geometry: Geometry,
    },
    /// Rows of `embeddings` picked by the integer ids of the input.
    Embedding {
        input_dim: usize,
        output_dim: usize,
    },
}

/// One layer of a built model.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub name: String,
    pub class: String,
    pub op: Op,
    /// One example's input and output shapes.
    pub input_shape: Vec<usize>,
    pub output_shape: Vec<usize>,
    /// Index of the layer's first variable in the model's variable list.
    pub first_variable: usize,
    /// Its variables: `kernel` (and `bias`), or `embeddings`.
    pub num_variables: usize,
}

/// What the forward pass keeps for the backward pass.
#[derive(Debug, Clone)]
pub enum Cache<F> {
    None,
    /// The input (of Dense) and the activation's output.
    Dense {
        input: ArrayD<F>,
        output: ArrayD<F>,
    },
    Activation {
        output: ArrayD<F>,
    },
    /// Per element: 0 or `1 / (1 - rate)`.
    Dropout {
        mask: ArrayD<F>,
    },
    Conv {
        cols: Array2<F>,
        output: ArrayD<F>,
    },
    Pool(PoolCache),
    Embedding {
        ids: Vec<usize>,
    },
}

/// `a` (batch first) as rows of its last axis: `[elements / last, last]`.
fn rows_of<F>(a: ArrayViewD<'_, F>) -> ArrayView2<'_, F> {
    let last = a.shape().last().copied().unwrap_or(1);
    let rows = a.len().checked_div(last).unwrap_or(0);
    a.into_shape_with_order((rows, last)).expect("standard layout")
}

/// The same elements with the batch of `n` examples of `shape` each.
fn with_batch<F: Clone>(a: ArrayD<F>, n: usize, shape: &[usize]) -> ArrayD<F> {
    let mut full = Vec::with_capacity(shape.len() + 1);
    full.push(n);
    full.extend_from_slice(shape);
    a.as_standard_layout().into_owned().into_shape_with_order(IxDyn(&full)).expect("element count fixed at build time")
}

impl Act {
    /// Applies the activation to `z` in place (softmax over the last axis).
    pub fn forward<F: Real>(self, z: &mut ArrayD<F>) {
        let (zero, one) = (F::zero(), F::one());
        match self {
            Act::Linear => {}
            Act::Relu => z.mapv_inplace(|v| if v > zero { v } else { zero }),
            Act::Sigmoid => z.mapv_inplace(|v| one / (one + (-v).exp())),
            Act::Tanh => z.mapv_inplace(|v| v.tanh()),
            Act::Softmax => {
                let last = z.shape().last().copied().unwrap_or(1);
                let rows = z.len() / last.max(1);
                for mut row in z.view_mut().into_shape_with_order((rows, last)).expect("standard layout").rows_mut() {
                    let max = row.fold(F::neg_infinity(), |m, &v| if v > m { v } else { m });
                    row.mapv_inplace(|v| (v - max).exp());
                    let sum = row.sum();
                    row.mapv_inplace(|v| v / sum);
                }
            }
        }
    }

    /// Turns `d` (the gradient with respect to the activation's output
    /// `a`) into the gradient with respect to its input, in place.
    pub fn backward<F: Real>(self, d: &mut ArrayD<F>, a: &ArrayD<F>) {
        let one = F::one();
        match self {
            Act::Linear => {}
            Act::Relu => Zip::from(d).and(a).for_each(|d, &a| {
                if a <= F::zero() {
                    *d = F::zero()
                }
            }),
            Act::Sigmoid => Zip::from(d).and(a).for_each(|d, &a| *d *= a * (one - a)),
            Act::Tanh => Zip::from(d).and(a).for_each(|d, &a| *d *= one - a * a),
            Act::Softmax => {
                // d_in = s * (d - sum(d * s)) per row.
                let last = a.shape().last().copied().unwrap_or(1);
                let rows = a.len() / last.max(1);
                let s = a.view().into_shape_with_order((rows, last)).expect("standard layout");
                let mut d2 = d.view_mut().into_shape_with_order((rows, last)).expect("standard layout");
                for (mut dr, sr) in d2.rows_mut().into_iter().zip(s.rows()) {
                    let dot = dr.iter().zip(sr.iter()).fold(F::zero(), |acc, (&d, &s)| acc + d * s);
                    Zip::from(&mut dr).and(&sr).for_each(|d, &s| *d = s * (*d - dot));
                }
            }
        }
    }
}

impl Layer {
    fn kernel<'a, F>(&self, params: &'a [ArrayD<F>]) -> &'a ArrayD<F> {
        &params[self.first_variable]
    }

    fn bias<'a, F>(&self, params: &'a [ArrayD<F>], use_bias: bool) -> Option<&'a ArrayD<F>> {
        use_bias.then(|| &params[self.first_variable + 1])
    }

    /// The layer's output for input `x` (`[n, input_shape...]`), and what
    /// its backward pass needs when `keep`. `dropout_seed` draws the
    /// dropout mask; without it (evaluation, prediction) dropout is the
    /// identity.
    pub fn forward<F: Real>(&self, params: &[ArrayD<F>], x: ArrayD<F>, dropout_seed: Option<u64>, keep: bool) -> (ArrayD<F>, Cache<F>) {
        let n = x.shape()[0];
        match &self.op {
            Op::Dense { units, activation, use_bias } => {
                let w = rows_of(self.kernel(params).view());
                let mut z = rows_of(x.view()).dot(&w);
                if let Some(b) = self.bias(params, *use_bias) {
                    z += &b.view().into_shape_with_order(*units).expect("bias [units]");
                }
                let mut out = with_batch(z.into_dyn(), n, &self.output_shape);
                activation.forward(&mut out);
                let cache = if keep { Cache::Dense { input: x, output: out.clone() } } else { Cache::None };
                (out, cache)
            }
            Op::Activation(act) => {
                let mut out = x;
                act.forward(&mut out);
                let cache = if keep { Cache::Activation { output: out.clone() } } else { Cache::None };
                (out, cache)
            }
            Op::Dropout { rate } => match dropout_seed {
                None => (x, Cache::None),
                Some(seed) => {
                    let mut rng = StdRng::seed_from_u64(seed);
                    let scale = F::cst(1.0 / (1.0 - *rate as f64));
                    let mask = x.mapv(|_| if rng.random::<f32>() >= *rate { scale } else { F::zero() });
                    let out = &x * &mask;
                    (out, if keep { Cache::Dropout { mask } } else { Cache::None })
                }
            },
            Op::Reshape => (with_batch(x, n, &self.output_shape), Cache::None),
            Op::Conv2D { geometry, filters, activation, use_bias } => {
                let cols = conv::im2col(geometry, &x.view());
                let k = self.kernel(params).view().into_shape_with_order((cols.ncols(), *filters)).expect("kernel [kh, kw, c, filters]");
                let mut z = cols.dot(&k);
                if let Some(b) = self.bias(params, *use_bias) {
                    z += &b.view().into_shape_with_order(*filters).expect("bias [filters]");
                }
                let mut out = with_batch(z.into_dyn(), n, &self.output_shape);
                activation.forward(&mut out);
                let cache = if keep { Cache::Conv { cols, output: out.clone() } } else { Cache::None };
                (out, cache)
            }
            Op::Pool { kind, geometry } => {
                let (out, cache) = conv::pool_forward(*kind, geometry, &x.view(), keep);
                (out, cache.map_or(Cache::None, Cache::Pool))
            }
            Op::Embedding { input_dim, output_dim } => {
                let table = rows_of(self.kernel(params).view());
                let ids: Vec<usize> = x.iter().map(|&v| id_of(v, *input_dim)).collect();
                let mut out = Array2::<F>::zeros((ids.len(), *output_dim));
                for (mut row, &id) in out.rows_mut().into_iter().zip(&ids) {
                    row.assign(&table.row(id));
                }
                let out = with_batch(out.into_dyn(), n, &self.output_shape);
                (out, if keep { Cache::Embedding { ids } } else { Cache::None })
            }
        }
    }

    /// Given `dy`, the gradient of the loss with respect to this layer's
    /// output, adds the gradients of its variables into `grads` and returns
    /// the gradient with respect to its input when `need_input_gradient`.
    pub fn backward<F: Real>(
        &self,
        params: &[ArrayD<F>],
        cache: Cache<F>,
        mut dy: ArrayD<F>,
        grads: &mut [ArrayD<F>],
        need_input_gradient: bool,
    ) -> Option<ArrayD<F>> {
        let n = dy.shape()[0];
        match (&self.op, cache) {
            (Op::Dense { units, activation, use_bias }, Cache::Dense { input, output }) => {
                activation.backward(&mut dy, &output);
                let dz = rows_of(dy.view());
                let x = rows_of(input.view());
                self.add_weight_gradients(grads, x.t().dot(&dz).into_dyn(), *use_bias, dz, *units);
                need_input_gradient.then(|| with_batch(dz.dot(&rows_of(self.kernel(params).view()).t()).into_dyn(), n, &self.input_shape))
            }
            (Op::Activation(act), Cache::Activation { output }) => {
                act.backward(&mut dy, &output);
                Some(dy)
            }
            (Op::Dropout { .. }, Cache::Dropout { mask }) => Some(dy * mask),
            (Op::Dropout { .. }, Cache::None) => Some(dy),
            (Op::Reshape, _) => Some(with_batch(dy, n, &self.input_shape)),
            (Op::Conv2D { geometry, filters, activation, use_bias }, Cache::Conv { cols, output }) => {
                activation.backward(&mut dy, &output);
                let dz = dy.view().into_shape_with_order((cols.nrows(), *filters)).expect("conv output rows");
                let dk = cols.t().dot(&dz).into_shape_with_order(self.kernel(params).raw_dim()).expect("kernel shape");
                self.add_weight_gradients(grads, dk, *use_bias, dz, *filters);
                need_input_gradient.then(|| {
                    let k = self.kernel(params).view().into_shape_with_order((cols.ncols(), *filters)).expect("kernel [kh, kw, c, filters]");
                    conv::col2im(geometry, dz.dot(&k.t()).view(), n)
                })
            }
            (Op::Pool { geometry, .. }, Cache::Pool(cache)) => need_input_gradient.then(|| conv::pool_backward(geometry, &cache, &dy)),
            (Op::Embedding { .. }, Cache::Embedding { ids }) => {
                let g = &mut grads[self.first_variable];
                let (rows, width) = (g.shape()[0], g.shape()[1]);
                let mut table = g.view_mut().into_shape_with_order((rows, width)).expect("embeddings [input_dim, output_dim]");
                for (row, &id) in rows_of(dy.view()).rows().into_iter().zip(&ids) {
                    let mut dst = table.row_mut(id);
                    dst += &row;
                }
                None
            }
            (op, _) => panic!("layer {}: the forward pass of {op:?} kept nothing for the backward pass", self.name),
        }
    }

    fn add_weight_gradients<F: Real>(&self, grads: &mut [ArrayD<F>], dkernel: ArrayD<F>, use_bias: bool, dz: ArrayView2<'_, F>, width: usize) {
        grads[self.first_variable] += &dkernel;
        if use_bias {
            grads[self.first_variable + 1] += &dz.sum_axis(Axis(0)).into_shape_with_order(width).expect("bias width").into_dyn();
        }
    }
}

/// The embedding row of an input value: an integer in `0..input_dim`
/// (checked by the model's input check before any pass).
fn id_of<F: Real>(v: F, input_dim: usize) -> usize {
    let w = v.widen();
    assert!(w >= 0.0 && w.fract() == 0.0 && (w as usize) < input_dim, "embedding id {w} is not an integer in 0..{input_dim}");
    w as usize
}

//! The arithmetic of Conv2D and the 2-d pooling layers on channels-last
//! tensors `[n, height, width, channels]`: output sizes and padding as
//! TensorFlow computes them, im2col so a convolution is one matrix product
//! (through ndarray's `dot`, i.e. matrixmultiply), and pooling with its
//! backward pass.

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewD};

use super::json::{Padding, PoolKind};
use crate::model::spec::Real;

/// Where a `k_h x k_w` window with strides `s_h, s_w` visits an
/// `in_h x in_w` image, and the output size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub in_h: usize,
    pub in_w: usize,
    pub channels: usize,
    pub k_h: usize,
    pub k_w: usize,
    pub s_h: usize,
    pub s_w: usize,
    /// Rows (columns) of zero padding before the image; TensorFlow puts the
    /// odd one after.
    pub pad_top: usize,
    pub pad_left: usize,
    pub out_h: usize,
    pub out_w: usize,
}

impl Geometry {
    /// `input` is `[height, width, channels]`. `valid`: windows inside the
    /// image, `(in - k) / s + 1` of them; `same`: `ceil(in / s)` windows,
    /// padded evenly (the extra row or column after).
    pub fn new(input: &[usize], kernel: [usize; 2], strides: [usize; 2], padding: Padding) -> Result<Self, String> {
        let &[in_h, in_w, channels] = input else {
            return Err(format!("needs an input of shape [height, width, channels], got {input:?}"));
        };
        let [k_h, k_w] = kernel;
        let [s_h, s_w] = strides;
        let axis = |size: usize, k: usize, s: usize| -> Result<(usize, usize), String> {
            match padding {
                Padding::Valid if size < k => Err(format!("a window of {k} does not fit in an input of {size} with padding \"valid\"")),
                Padding::Valid => Ok(((size - k) / s + 1, 0)),
                Padding::Same => {
                    let out = size.div_ceil(s);
                    let total = ((out - 1) * s + k).saturating_sub(size);
                    Ok((out, total / 2))
                }
            }
        };
        let (out_h, pad_top) = axis(in_h, k_h, s_h)?;
        let (out_w, pad_left) = axis(in_w, k_w, s_w)?;
        Ok(Geometry { in_h, in_w, channels, k_h, k_w, s_h, s_w, pad_top, pad_left, out_h, out_w })
    }

    /// The input row and column of window element `(ky, kx)` of output
    /// `(oy, ox)`, if inside the image.
    #[inline]
    fn source(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let y = (oy * self.s_h + ky).checked_sub(self.pad_top)?;
        let x = (ox * self.s_w + kx).checked_sub(self.pad_left)?;
        (y < self.in_h && x < self.in_w).then_some((y, x))
    }

    /// Elements of one example's input.
    fn in_len(&self) -> usize {
        self.in_h * self.in_w * self.channels
    }
}

/// Calls `f(input, patch)` for every window element of every output
/// position that lies inside the image: `input` is the flat offset of the
/// element's `channels` values in `[n, h, w, c]`, `patch` the offset of the
/// same values in the patch rows `[n * out_h * out_w, k_h * k_w * c]`.
fn for_each_patch_element(g: &Geometry, n: usize, mut f: impl FnMut(usize, usize)) {
    let c = g.channels;
    let row_len = g.k_h * g.k_w * c;
    for b in 0..n {
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                let row = ((b * g.out_h + oy) * g.out_w + ox) * row_len;
                for ky in 0..g.k_h {
                    for kx in 0..g.k_w {
                        if let Some((y, x)) = g.source(oy, ox, ky, kx) {
                            f(b * g.in_len() + (y * g.in_w + x) * c, row + (ky * g.k_w + kx) * c);
                        }
                    }
                }
            }
        }
    }
}

/// The patches of `x` (`[n, h, w, c]`, standard layout) as rows:
/// `[n * out_h * out_w, k_h * k_w * c]`, each row ordered `(ky, kx, c)` like
/// a Keras kernel `[k_h, k_w, c, filters]` flattened; padding is zeros.
pub fn im2col<F: Real>(g: &Geometry, x: &ArrayViewD<'_, F>) -> Array2<F> {
    let n = x.shape()[0];
    let c = g.channels;
    let mut cols = Array2::<F>::zeros((n * g.out_h * g.out_w, g.k_h * g.k_w * c));
    let src = x.as_slice().expect("conv input in standard layout");
    let dst = cols.as_slice_mut().expect("fresh array");
    for_each_patch_element(g, n, |input, patch| dst[patch..patch + c].copy_from_slice(&src[input..input + c]));
    cols
}

/// The adjoint of [`im2col`]: adds every patch row of `dcols` back into
/// the input positions it was read from; returns `[n, h, w, c]`.
pub fn col2im<F: Real>(g: &Geometry, dcols: ArrayView2<'_, F>, n: usize) -> ArrayD<F> {
    let c = g.channels;
    let mut dx = ArrayD::<F>::zeros(vec![n, g.in_h, g.in_w, c]);
    let dst = dx.as_slice_mut().expect("fresh array");
    let dcols = dcols.as_standard_layout();
    let src = dcols.as_slice().expect("standard layout");
    for_each_patch_element(g, n, |input, patch| {
        for (d, &s) in dst[input..input + c].iter_mut().zip(&src[patch..patch + c]) {
            *d += s;
        }
    });
    dx
}

/// What the backward pass of a pooling layer needs.
#[derive(Debug, Clone)]
pub enum PoolCache {
    /// For each output element, the flat index of the input element that won.
    Max(Vec<usize>),
    Average,
}

/// Pools `x` (`[n, h, w, c]`) over the windows of `g`: the maximum, or the
/// mean of the window's elements inside the image (padding is not counted,
/// as in TensorFlow). Returns `[n, out_h, out_w, c]`.
pub fn pool_forward<F: Real>(kind: PoolKind, g: &Geometry, x: &ArrayViewD<'_, F>, keep: bool) -> (ArrayD<F>, Option<PoolCache>) {
    let n = x.shape()[0];
    let c = g.channels;
    let mut out = ArrayD::<F>::zeros(vec![n, g.out_h, g.out_w, c]);
    let mut winners = Vec::new();
    if keep && kind == PoolKind::Max {
        winners.reserve(out.len());
    }
    let src = x.as_slice().expect("pool input in standard layout");
    let dst = out.as_slice_mut().expect("fresh array");
    let mut o = 0;
    for b in 0..n {
        for oy in 0..g.out_h {
            for ox in 0..g.out_w {
                for ch in 0..c {
                    let mut best: Option<(F, usize)> = None;
                    let (mut sum, mut count) = (F::zero(), 0usize);
                    for ky in 0..g.k_h {
                        for kx in 0..g.k_w {
                            let Some((y, xx)) = g.source(oy, ox, ky, kx) else { continue };
                            let i = b * g.in_len() + (y * g.in_w + xx) * c + ch;
                            let v = src[i];
                            match kind {
                                PoolKind::Max => {
                                    if best.is_none_or(|(m, _)| v > m) {
                                        best = Some((v, i));
                                    }
                                }
                                PoolKind::Average => {
                                    sum += v;
                                    count += 1;
                                }
                            }
                        }
                    }
                    dst[o] = match kind {
                        PoolKind::Max => {
                            let (m, i) = best.expect("every window holds at least one input element");
                            if keep {
                                winners.push(i);
                            }
                            m
                        }
                        PoolKind::Average => sum / F::cst(count.max(1) as f64),
                    };
                    o += 1;
                }
            }
        }
    }
    let cache = match kind {
        _ if !keep => None,
        PoolKind::Max => Some(PoolCache::Max(winners)),
        PoolKind::Average => Some(PoolCache::Average),
    };
    (out, cache)
}

/// The gradient with respect to the pooling layer's input, given the
/// gradient `dy` of its output.
pub fn pool_backward<F: Real>(g: &Geometry, cache: &PoolCache, dy: &ArrayD<F>) -> ArrayD<F> {
    let n = dy.shape()[0];
    let c = g.channels;
    let mut dx = ArrayD::<F>::zeros(vec![n, g.in_h, g.in_w, c]);
    let dst = dx.as_slice_mut().expect("fresh array");
    let dy = dy.as_standard_layout();
    let src = dy.as_slice().expect("standard layout");
    match cache {
        PoolCache::Max(winners) => {
            for (&i, &d) in winners.iter().zip(src) {
                dst[i] += d;
            }
        }
        PoolCache::Average => {
            let mut o = 0;
            for b in 0..n {
                for oy in 0..g.out_h {
                    for ox in 0..g.out_w {
                        let inside: Vec<(usize, usize)> =
                            (0..g.k_h).flat_map(|ky| (0..g.k_w).map(move |kx| (ky, kx))).filter_map(|(ky, kx)| g.source(oy, ox, ky, kx)).collect();
                        let scale = F::one() / F::cst(inside.len().max(1) as f64);
                        for ch in 0..c {
                            let d = src[o + ch] * scale;
                            for &(y, xx) in &inside {
                                dst[b * g.in_len() + (y * g.in_w + xx) * c + ch] += d;
                            }
                        }
                        o += c;
                    }
                }
            }
        }
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_and_padding_follow_tensorflow() {
        // (input h, kernel, stride, padding) -> (out, pad before)
        let cases = [
            (28, 3, 1, Padding::Valid, 26, 0),
            (28, 3, 1, Padding::Same, 28, 1),
            (28, 2, 2, Padding::Valid, 14, 0),
            (27, 2, 2, Padding::Valid, 13, 0),
            (27, 2, 2, Padding::Same, 14, 0), // total pad 1: all after
            (5, 3, 2, Padding::Same, 3, 1),
            (6, 3, 2, Padding::Same, 3, 0), // total pad 1
            (7, 4, 1, Padding::Same, 7, 1), // total pad 3: 1 before, 2 after
            (3, 3, 1, Padding::Valid, 1, 0),
        ];
        for (size, k, s, padding, out, pad) in cases {
            let g = Geometry::new(&[size, size, 1], [k, k], [s, s], padding).unwrap();
            assert_eq!((g.out_h, g.pad_top, g.out_w, g.pad_left), (out, pad, out, pad), "{size} k{k} s{s} {padding:?}");
        }
        assert!(Geometry::new(&[2, 5, 1], [3, 3], [1, 1], Padding::Valid).unwrap_err().contains("does not fit"));
        assert!(Geometry::new(&[4, 4], [2, 2], [1, 1], Padding::Valid).is_err());
    }

    #[test]
    fn im2col_reads_patches_in_kernel_order_with_zero_padding() {
        // One 3x3 image of 2 channels, values 10*pixel + channel.
        let x = ArrayD::from_shape_fn(vec![1, 3, 3, 2], |i| (10 * (i[1] * 3 + i[2]) + i[3]) as f64);
        let g = Geometry::new(&[3, 3, 2], [2, 2], [1, 1], Padding::Same).unwrap();
        // same with k=2: total pad 1, all after.
        assert_eq!((g.out_h, g.pad_top), (3, 0));
        let cols = im2col(&g, &x.view());
        assert_eq!(cols.dim(), (9, 8));
        // Output (0, 0): pixels (0,0) (0,1) (1,0) (1,1).
        assert_eq!(cols.row(0).to_vec(), vec![0.0, 1.0, 10.0, 11.0, 30.0, 31.0, 40.0, 41.0]);
        // Output (2, 2): pixel (2,2) then padding.
        assert_eq!(cols.row(8).to_vec(), vec![80.0, 81.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), y> == <x, col2im(y)> for any x, y.
        let g = Geometry::new(&[5, 4, 3], [3, 2], [2, 1], Padding::Same).unwrap();
        let x = ArrayD::from_shape_fn(vec![2, 5, 4, 3], |i| ((i[0] * 7 + i[1] * 5 + i[2] * 3 + i[3]) % 11) as f64 - 5.0);
        let cols = im2col(&g, &x.view());
        let y = Array2::from_shape_fn(cols.dim(), |(r, c)| ((r * 3 + c * 7) % 13) as f64 - 6.0);
        let lhs: f64 = (&cols * &y).sum();
        let rhs: f64 = (&x * &col2im(&g, y.view(), 2)).sum();
        assert!((lhs - rhs).abs() < 1e-9, "{lhs} vs {rhs}");
    }

    #[test]
    fn pooling_values() {
        let x = ArrayD::from_shape_vec(vec![1, 2, 3, 1], vec![1.0, 5.0, 2.0, 4.0, 3.0, 6.0]).unwrap();
        let g = Geometry::new(&[2, 3, 1], [2, 2], [2, 2], Padding::Same).unwrap();
        let (max, _) = pool_forward(PoolKind::Max, &g, &x.view(), false);
        assert_eq!(max.as_slice().unwrap(), &[5.0, 6.0]);
        // The second window holds only column 2: padding is not averaged in.
        let (avg, cache) = pool_forward(PoolKind::Average, &g, &x.view(), true);
        assert_eq!(avg.as_slice().unwrap(), &[3.25, 4.0]);
        let dx = pool_backward(&g, &cache.unwrap(), &ArrayD::from_elem(vec![1, 1, 2, 1], 1.0));
        assert_eq!(dx.as_slice().unwrap(), &[0.25, 0.25, 0.5, 0.25, 0.25, 0.5]);
        let (_, cache) = pool_forward(PoolKind::Max, &g, &x.view(), true);
        let dx = pool_backward(&g, &cache.unwrap(), &ArrayD::from_elem(vec![1, 1, 2, 1], 1.0));
        assert_eq!(dx.as_slice().unwrap(), &[0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    }
}

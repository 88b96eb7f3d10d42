//! Generated data: the line of the classic linear-regression example and a
//! learnable classification set. Both are deterministic given their seed.

use ndarray::{Array2, Axis};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::{Dataset, Targets};

/// Points on the line: `linspace(-1, 1, 101)`.
pub const LINE_POINTS: usize = 101;
pub const LINE_SLOPE: f32 = 2.0;
pub const LINE_INTERCEPT: f32 = 10.0;
/// Standard deviation of the Gaussian noise added to each target.
pub const LINE_NOISE_STDDEV: f32 = 0.33;

/// The classic example's data: `train_X = linspace(-1, 1, 101)`,
/// `train_Y = 2 * train_X + 10 + noise` with noise ~ Normal(0, 0.33) drawn
/// from `seed`. `x` is `[101, 1]` and the targets are values `[101, 1]`, in
/// increasing `x` order.
pub fn synthetic_line(seed: u64) -> Dataset {
    let mut rng = StdRng::seed_from_u64(seed);
    let step = 2.0f64 / (LINE_POINTS - 1) as f64;
    let x = Array2::from_shape_fn((LINE_POINTS, 1), |(i, _)| (-1.0 + step * i as f64) as f32);
    let y = x.mapv(|x| {
        let noise: f32 = rng.sample(StandardNormal);
        LINE_SLOPE * x + LINE_INTERCEPT + LINE_NOISE_STDDEV * noise
    });
    Dataset::new(x, Targets::Values(y)).expect("one target per input")
}

/// A learnable classification set with separate train and held-out
/// splits drawn from the same distribution: inputs uniform in [0, 1)
/// (like scaled pixels), a random linear map `T` ~ Normal(0, 1)
/// `[input_dim, num_classes]`, and label = argmax over classes of
/// `(x - 0.5)·T`. The classes are linearly separable, so softmax regression
/// and MLPs can reach high accuracy. Deterministic given `seed`.
///
/// # Panics
/// If `input_dim` or `num_classes` is 0.
pub fn synthetic_classification(
    input_dim: usize,
    num_classes: usize,
    train_examples: usize,
    test_examples: usize,
    seed: u64,
) -> (Dataset, Dataset) {
    assert!(input_dim > 0, "synthetic_classification: input_dim must be at least 1");
    assert!(num_classes > 0, "synthetic_classification: num_classes must be at least 1");
    let mut rng = StdRng::seed_from_u64(seed);
    let t = Array2::from_shape_simple_fn((input_dim, num_classes), || rng.sample::<f32, _>(StandardNormal));
    let mut split = |n: usize| {
        let x = Array2::from_shape_simple_fn((n, input_dim), || rng.random::<f32>());
        let scores = (&x - 0.5f32).dot(&t);
        let labels = scores
            .axis_iter(Axis(0))
            .map(|row| {
                let mut best = 0;
                for (j, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = j;
                    }
                }
                best as u32
            })
            .collect();
        Dataset::new(x, Targets::Labels(labels)).expect("one label per input")
    };
    let train = split(train_examples);
    let test = split(test_examples);
    (train, test)
}

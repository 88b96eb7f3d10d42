//! Generated data: the line of the classic linear-regression example and a
//! learnable classification set. Both are deterministic given their seed.

use ndarray::{Array2, Axis};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::batch::Targets;
use super::dataset::Dataset;

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
pub fn synthetic_classification(input_dim: usize, num_classes: usize, train_examples: usize, test_examples: usize, seed: u64) -> (Dataset, Dataset) {
    assert!(input_dim > 0, "synthetic_classification: input_dim must be at least 1");
    assert!(num_classes > 0, "synthetic_classification: num_classes must be at least 1");
    let mut rng = StdRng::seed_from_u64(seed);
    let t = Array2::from_shape_simple_fn((input_dim, num_classes), || rng.sample::<f32, _>(StandardNormal));
    let mut split = |n: usize| {
        let x = Array2::from_shape_simple_fn((n, input_dim), || rng.random::<f32>());
        let scores = (&x - 0.5f32).dot(&t);
        let labels = argmax_rows(&scores);
        Dataset::new(x, Targets::Labels(labels)).expect("one label per input")
    };
    let train = split(train_examples);
    let test = split(test_examples);
    (train, test)
}

/// The index of the largest score of each row (the first one on ties).
fn argmax_rows(scores: &Array2<f32>) -> Vec<u32> {
    scores
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
        .collect()
}

/// Latent dimensions of [`synthetic_images`].
pub const IMAGE_LATENT_DIMS: usize = 8;

/// MNIST-shaped synthetic images, built like `shared/data/synthetic-mnist`:
/// a few latent factors `z ~ N(0,1)^8` mixed into `input_dim` pixels
/// (`x = clip(z·A - 0.8, 0, 1)`, about a fifth of them non-zero, like
/// MNIST), and label = argmax of the standardised projection of `x` on a
/// random `T`. The low-dimensional structure makes it learnable within a
/// few hundred steps, as real digits are. Train and test are separate draws.
///
/// # Panics
/// If `input_dim` or `num_classes` is 0.
pub fn synthetic_images(input_dim: usize, num_classes: usize, train_examples: usize, test_examples: usize, seed: u64) -> (Dataset, Dataset) {
    assert!(input_dim > 0 && num_classes > 0, "synthetic_images: sizes must be at least 1");
    let mut rng = StdRng::seed_from_u64(seed);
    let scale = 1.0 / (IMAGE_LATENT_DIMS as f32).sqrt();
    let a = Array2::from_shape_simple_fn((IMAGE_LATENT_DIMS, input_dim), || scale * rng.sample::<f32, _>(StandardNormal));
    let t = Array2::from_shape_simple_fn((input_dim, num_classes), || rng.sample::<f32, _>(StandardNormal));
    let total = train_examples + test_examples;
    let z = Array2::from_shape_simple_fn((total, IMAGE_LATENT_DIMS), || rng.sample::<f32, _>(StandardNormal));
    let x = z.dot(&a).mapv(|v| (v - 0.8).clamp(0.0, 1.0));
    // Standardise each class score over the whole set so classes are balanced-ish.
    let mean = x.mean_axis(Axis(0)).expect("at least one example");
    let mut scores = (&x - &mean).dot(&t);
    let std = scores.std_axis(Axis(0), 0.0);
    let smean = scores.mean_axis(Axis(0)).expect("at least one example");
    scores -= &smean;
    scores /= &std.mapv(|s| if s > 0.0 { s } else { 1.0 });
    let labels = argmax_rows(&scores);
    let train_x = x.slice(ndarray::s![..train_examples, ..]).to_owned();
    let test_x = x.slice(ndarray::s![train_examples.., ..]).to_owned();
    let train = Dataset::new(train_x, Targets::Labels(labels[..train_examples].to_vec())).expect("one label per input");
    let test = Dataset::new(test_x, Targets::Labels(labels[train_examples..].to_vec())).expect("one label per input");
    (train, test)
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn synthetic_images_are_deterministic_sparse_and_varied() {
        let (train, test) = synthetic_images(784, 10, 2000, 500, 7);
        let (train2, _) = synthetic_images(784, 10, 2000, 500, 7);
        assert_eq!(train, train2);
        assert_eq!((train.len(), test.len(), train.input_dim()), (2000, 500, 784));
        let nonzero = train.x().iter().filter(|&&v| v > 0.0).count() as f64 / train.x().len() as f64;
        assert!((0.05..0.5).contains(&nonzero), "fraction of lit pixels {nonzero}");
        assert!(train.x().iter().all(|&v| (0.0..=1.0).contains(&v)));
        let Targets::Labels(labels) = train.targets() else { panic!("labels") };
        let mut counts = [0usize; 10];
        for &l in labels {
            counts[l as usize] += 1;
        }
        // Every class appears, none dominates.
        assert!(counts.iter().all(|&c| c > 0 && c < 800), "{counts:?}");
    }
}

//! Small learnable datasets that the tests write themselves, in the MNIST IDX format the runtime
//! reads with `--data_dir` (the four files under MNIST's names, uncompressed).
//!
//! [`write_blobs`]: every class is a fixed random image of `side`×`side` pixels; an example is
//! its class's image plus Gaussian noise. With `noise` around 1.0 a linear classifier reaches
//! about 0.95, and not 1.0, so a broken training run shows in the accuracy.

use std::path::Path;

use anyhow::{Context, Result};

/// A deterministic stream of numbers (splitmix64): the tests need no random-number crate.
struct Numbers(u64);

impl Numbers {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// An IDX file: the magic for unsigned bytes and `dims.len()` dimensions, the sizes, the bytes.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

/// Writes `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and
/// `t10k-labels-idx1-ubyte` into `dir`: `train` and `test` examples of `side`×`side` pixels in
/// `classes` classes (at most 10), each its class's image (pixels of 0 or 0.5) plus noise of
/// standard deviation `noise` × 0.25, clipped to [0, 1]. Deterministic given `seed`.
pub fn write_blobs(dir: &Path, train: usize, test: usize, side: usize, classes: usize, noise: f64, seed: u64) -> Result<()> {
    assert!((1..=10).contains(&classes), "classes must be 1 to 10");
    let mut rng = Numbers(seed);
    let pixels = side * side;
    let prototypes: Vec<Vec<f64>> = (0..classes).map(|_| (0..pixels).map(|_| if rng.next_u64().is_multiple_of(2) { 0.5 } else { 0.0 }).collect()).collect();
    let mut split = |n: usize| {
        let mut images = Vec::with_capacity(n * pixels);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            let c = (rng.next_u64() % classes as u64) as usize;
            labels.push(c as u8);
            for p in &prototypes[c] {
                let v = (p + 0.25 * noise * rng.normal()).clamp(0.0, 1.0);
                images.push((v * 255.0).round() as u8);
            }
        }
        (images, labels)
    };
    let s = side as u32;
    for (prefix, n) in [("train", train), ("t10k", test)] {
        let (images, labels) = split(n);
        let write = |name: String, bytes: Vec<u8>| std::fs::write(dir.join(&name), bytes).with_context(|| format!("writing {name}"));
        write(format!("{prefix}-images-idx3-ubyte"), idx(&[n as u32, s, s], &images))?;
        write(format!("{prefix}-labels-idx1-ubyte"), idx(&[n as u32], &labels))?;
    }
    Ok(())
}

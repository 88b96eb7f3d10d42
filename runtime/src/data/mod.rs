//! Datasets: the synthetic line of the classic example, MNIST IDX files,
//! and a synthetic learnable classification set. Nothing is downloaded.

use ndarray::Array2;

/// What a batch is trained against.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// Regression targets, one row per example.
    Values(Array2<f32>),
    /// Class labels in `0..num_classes`.
    Labels(Vec<u32>),
}

/// A batch: one row of `x` per example.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub x: Array2<f32>,
    pub targets: Targets,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.x.nrows()
    }
    pub fn is_empty(&self) -> bool {
        self.x.nrows() == 0
    }
}

//! MNIST in the IDX format: files given by path, plain or gzipped (told
//! apart by their first bytes, not their names).
//!
//! An IDX file is a big-endian header — two zero bytes, a type byte
//! (`0x08` = unsigned byte), the number of dimensions — then one `u32` per
//! dimension, then the data. Images are idx3 (`[n, rows, cols]`) of any
//! size, or idx4 (`[n, rows, cols, channels]`) or idx2 (`[n, features]`);
//! labels idx1 (`[n]`). MNIST's own loaders ([`read_mnist_pair`],
//! [`load_mnist`]) require its 10 classes; [`read_idx_pair`] and
//! [`load_idx_dir`] take the classes from the data.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use ndarray::Array2;

use super::batch::Targets;
use super::dataset::{DataError, Dataset};
use crate::storage;

/// Classes of MNIST labels.
pub const MNIST_CLASSES: u32 = 10;

/// The four files of the MNIST distribution (each may also end in `.gz`):
/// train images, train labels, test images, test labels.
pub const MNIST_FILES: [&str; 4] = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const IDX_UBYTE: u8 = 0x08;

/// The train and test sets of MNIST.
#[derive(Debug, Clone, PartialEq)]
pub struct Mnist {
    pub train: Dataset,
    pub test: Dataset,
}

/// The contents of `path`, gunzipped when it starts with the gzip magic.
/// `path` may be an object-store URL (`--data_dir s3://bucket/mnist`).
pub(super) fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = match path.to_str().filter(|p| storage::is_url(p)) {
        Some(url) => storage::read(url).map(Vec::from)?,
        None => fs::read(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?,
    };
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    MultiGzDecoder::new(raw.as_slice()).read_to_end(&mut out).map_err(|source| DataError::Gzip { path: path.to_path_buf(), source })?;
    Ok(out)
}

/// Checks the header of an unsigned-byte IDX file of `ndim` dimensions (or,
/// for images, any of `ndims`) and that the data has exactly the announced
/// size; returns the dimensions and the data.
fn parse_idx<'a>(path: &Path, bytes: &'a [u8], ndims: std::ops::RangeInclusive<u8>, kind: &'static str) -> Result<(Vec<usize>, &'a [u8]), DataError> {
    let truncated =
        |part, expected: usize, found: usize| DataError::Truncated { path: path.to_path_buf(), part, expected: expected as u64, found: found as u64 };
    if bytes.len() < 4 {
        return Err(truncated("header", 4, bytes.len()));
    }
    let ndim = bytes[3];
    let found = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if bytes[..3] != [0, 0, IDX_UBYTE] || !ndims.contains(&ndim) {
        // Images are named by their usual idx3 magic.
        let typical = if ndims.contains(&3) { 3 } else { *ndims.start() };
        let expected = u32::from_be_bytes([0, 0, IDX_UBYTE, typical]);
        return Err(DataError::BadMagic { path: path.to_path_buf(), expected_kind: kind, found, expected });
    }
    let header_len = 4 + 4 * ndim as usize;
    if bytes.len() < header_len {
        return Err(truncated("header", header_len, bytes.len()));
    }
    let dims: Vec<usize> = bytes[4..header_len].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let total = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DataError::BadHeader { path: path.to_path_buf(), reason: format!("dimensions {dims:?} are too large") })?;
    let data = &bytes[header_len..];
    if data.len() < total {
        return Err(truncated("data", total, data.len()));
    }
    if data.len() > total {
        return Err(DataError::TrailingBytes { path: path.to_path_buf(), extra: (data.len() - total) as u64 });
    }
    Ok((dims, data))
}

/// Reads an idx3 unsigned-byte image file of any size (or idx4 with
/// channels, or idx2 of plain features): one row per image, pixels scaled
/// from 0..=255 to `[0, 1]` and flattened row by row, channels last (784
/// per row for MNIST's 28x28).
pub fn read_idx_images(path: impl AsRef<Path>) -> Result<Array2<f32>, DataError> {
    read_idx_examples(path).map(|(x, _)| x)
}

/// [`read_idx_images`], and the shape of one example (`[rows, cols]`,
/// `[rows, cols, channels]` or `[features]`).
pub fn read_idx_examples(path: impl AsRef<Path>) -> Result<(Array2<f32>, Vec<usize>), DataError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    let (dims, data) = parse_idx(path, &bytes, 2..=4, "images (idx3, unsigned byte)")?;
    let (n, shape) = (dims[0], dims[1..].to_vec());
    if shape.contains(&0) {
        let size: Vec<String> = shape.iter().map(usize::to_string).collect();
        return Err(DataError::BadHeader { path: path.to_path_buf(), reason: format!("images of {} pixels", size.join("x")) });
    }
    let pixels: Vec<f32> = data.iter().map(|&b| b as f32 * (1.0 / 255.0)).collect();
    let x = Array2::from_shape_vec((n, shape.iter().product()), pixels).expect("size checked against the header");
    Ok((x, shape))
}

/// Reads an idx1 unsigned-byte label file; every label must be below
/// `num_classes`.
pub fn read_idx_labels(path: impl AsRef<Path>, num_classes: u32) -> Result<Vec<u32>, DataError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    let (_, data) = parse_idx(path, &bytes, 1..=1, "labels (idx1, unsigned byte)")?;
    if let Some(index) = data.iter().position(|&l| l as u32 >= num_classes) {
        return Err(DataError::LabelOutOfRange { path: path.to_path_buf(), index, label: data[index] as u32, num_classes });
    }
    Ok(data.iter().map(|&l| l as u32).collect())
}

/// Reads a pair of image and label files (labels in `0..10`) into a dataset.
pub fn read_mnist_pair(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Dataset, DataError> {
    read_idx_pair(images, labels, Some(MNIST_CLASSES)).map(|(d, _)| d)
}

/// Reads a pair of image and label files into a dataset, with the shape of
/// one example; labels must be below `num_classes` when it is given.
pub fn read_idx_pair(images: impl AsRef<Path>, labels: impl AsRef<Path>, num_classes: Option<u32>) -> Result<(Dataset, Vec<usize>), DataError> {
    let (images, labels) = (images.as_ref(), labels.as_ref());
    let (x, shape) = read_idx_examples(images)?;
    let y = read_idx_labels(labels, num_classes.unwrap_or(u32::MAX))?;
    if x.nrows() != y.len() {
        return Err(DataError::CountMismatch { images_path: images.to_path_buf(), labels_path: labels.to_path_buf(), images: x.nrows(), labels: y.len() });
    }
    Ok((Dataset::new(x, Targets::Labels(y))?, shape))
}

/// `dir/name` if it exists, else `dir/name.gz`. `dir` may be an object-store URL.
pub(super) fn find(dir: &Path, name: &'static str) -> Result<PathBuf, DataError> {
    // A store that cannot be asked (no credentials, out of reach) is an
    // error of its own, not a missing file.
    let exists = |p: &Path| -> Result<bool, DataError> {
        match p.to_str().filter(|p| storage::is_url(p)) {
            Some(url) => Ok(storage::Location::parse(url)?.size()?.is_some()),
            None => Ok(p.is_file()),
        }
    };
    let plain = dir.join(name);
    if exists(&plain)? {
        return Ok(plain);
    }
    let gz = dir.join(format!("{name}.gz"));
    if exists(&gz)? {
        return Ok(gz);
    }
    Err(DataError::Missing { dir: dir.to_path_buf(), name })
}

/// Reads the four MNIST files ([`MNIST_FILES`], each plain or `.gz`) from
/// `dir`.
pub fn load_mnist(dir: impl AsRef<Path>) -> Result<Mnist, DataError> {
    let sets = load_idx_dir(dir, Some(MNIST_CLASSES))?;
    Ok(Mnist { train: sets.train, test: sets.test })
}

/// Train and test sets read from IDX files, with the shape of one example.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxSets {
    pub train: Dataset,
    pub test: Dataset,
    pub example_shape: Vec<usize>,
    /// The four files read, in [`MNIST_FILES`] order.
    pub files: [PathBuf; 4],
}

/// Reads the four files named as MNIST's ([`MNIST_FILES`], each plain or
/// `.gz`) from `dir`, with images of any size and labels below `num_classes`
/// when given; train and test images must have the same shape.
pub fn load_idx_dir(dir: impl AsRef<Path>, num_classes: Option<u32>) -> Result<IdxSets, DataError> {
    let dir = dir.as_ref();
    let [train_images, train_labels, test_images, test_labels] = MNIST_FILES;
    let files = [find(dir, train_images)?, find(dir, train_labels)?, find(dir, test_images)?, find(dir, test_labels)?];
    let (train, example_shape) = read_idx_pair(&files[0], &files[1], num_classes)?;
    let (test, test_shape) = read_idx_pair(&files[2], &files[3], num_classes)?;
    if train.input_dim() != test.input_dim() || example_shape != test_shape {
        return Err(DataError::ImageSizeMismatch { path: files[2].clone(), other: files[0].clone(), found: test.input_dim(), expected: train.input_dim() });
    }
    Ok(IdxSets { train, test, example_shape, files })
}

//! Conversion between the wire tensor (dtype, shape, raw little-endian bytes)
//! and `f32` buffers / ndarray, and the cutting of large tensors into parts
//! of bounded size.
//!
//! The hot path reads received bytes in place: when a buffer happens to be
//! 4-byte aligned it is reinterpreted as `&[f32]` (little-endian hosts),
//! otherwise elements are read with `from_le_bytes`; nothing is copied on
//! the way but into the destination.

use bytes::Bytes;
use ndarray::ArrayD;

use crate::proto::{DataType, Tensor, TensorPart};

/// Default size of one part of a tensor on the wire: about 2 MiB.
pub const DEFAULT_PART_BYTES: usize = 2 << 20;

/// Largest message either side accepts. Parts are much smaller, so no
/// message comes near it; it is set explicitly on every server and client.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorError {
    #[error("tensor {name:?}: unsupported dtype {dtype} (only DT_FLOAT is stored)")]
    UnsupportedDtype { name: String, dtype: i32 },
    #[error("tensor {name:?}: negative or overflowing dimension in shape {shape:?}")]
    BadShape { name: String, shape: Vec<i64> },
    #[error("tensor {name:?}: {len} content bytes is not a whole number of {elem}-byte elements")]
    RaggedBytes { name: String, len: usize, elem: usize },
    #[error("tensor {name:?}: part at element {offset} with {count} elements runs past the end ({total} elements)")]
    PartOutOfRange { name: String, offset: u64, count: usize, total: usize },
    #[error("tensor {name:?}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, got: Vec<i64> },
    #[error("tensor {name:?}: parts cover {covered} of {total} elements (missing or overlapping parts)")]
    Incomplete { name: String, covered: usize, total: usize },
}

/// Size in bytes of one element of a dtype, `None` for unknown ones.
pub fn dtype_size(dtype: i32) -> Option<usize> {
    match DataType::try_from(dtype).ok()? {
        DataType::DtFloat | DataType::DtInt32 => Some(4),
        DataType::DtDouble | DataType::DtInt64 => Some(8),
        DataType::DtInvalid => None,
    }
}

/// Number of elements of a wire shape, checking every dimension.
pub fn num_elements(name: &str, shape: &[i64]) -> Result<usize, TensorError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| TensorError::BadShape { name: name.into(), shape: shape.to_vec() })
}

pub fn wire_shape(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// Encodes f32 values as little-endian bytes: the one copy made when a value
/// leaves its owner.
pub fn f32_to_bytes(values: &[f32]) -> Bytes {
    if cfg!(target_endian = "little") { Bytes::copy_from_slice(bytemuck::cast_slice(values)) } else { Bytes::from(crate::le::f32_bytes(values)) }
}

/// Reads little-endian f32 bytes as a slice without copying when the
/// buffer is aligned, `None` otherwise (or on big-endian hosts).
fn aligned_f32(bytes: &[u8]) -> Option<&[f32]> {
    if cfg!(target_endian = "little") { bytemuck::try_cast_slice(bytes).ok() } else { None }
}

/// `dst[i] = value of element i` for little-endian f32 bytes.
/// `bytes.len()` must be `4 * dst.len()`.
pub fn copy_f32_from_le(dst: &mut [f32], bytes: &[u8]) {
    debug_assert_eq!(bytes.len(), dst.len() * 4);
    match aligned_f32(bytes) {
        Some(src) => dst.copy_from_slice(src),
        None => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = crate::le::f32_at(c);
            }
        }
    }
}

/// Little-endian f32 bytes as values: the received bytes themselves when
/// they are aligned (no copy), else a copy in `scratch`.
pub fn f32_view<'a>(bytes: &'a [u8], scratch: &'a mut Vec<f32>) -> &'a [f32] {
    if let Some(values) = aligned_f32(bytes) {
        return values;
    }
    scratch.resize(bytes.len() / 4, 0.0);
    copy_f32_from_le(scratch, bytes);
    scratch
}

/// `dst[i] += element i` for little-endian f32 bytes: gradient accumulation
/// straight from received bytes.
pub fn add_f32_from_le(dst: &mut [f32], bytes: &[u8]) {
    debug_assert_eq!(bytes.len(), dst.len() * 4);
    match aligned_f32(bytes) {
        Some(src) => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d += *s;
            }
        }
        None => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d += crate::le::f32_at(c);
            }
        }
    }
}

/// Cuts a tensor into parts of at most `part_bytes` content bytes (rounded
/// down to whole elements, at least one element). The parts share `content`:
/// no bytes are copied. A zero-element tensor gives one empty part, so the
/// receiver still learns its name and shape.
pub fn split_into_parts(name: &str, shape: &[i64], content: Bytes, part_bytes: usize) -> impl Iterator<Item = TensorPart> + use<> {
    let per_part = (part_bytes / 4).max(1) * 4;
    let total = content.len();
    let name = name.to_string();
    let shape = shape.to_vec();
    let starts: Vec<usize> = if total == 0 { vec![0] } else { (0..total).step_by(per_part).collect() };
    starts.into_iter().map(move |start| {
        let end = (start + per_part).min(total);
        TensorPart { name: name.clone(), dtype: DataType::DtFloat as i32, shape: shape.clone(), offset: (start / 4) as u64, content: content.slice(start..end) }
    })
}

/// Encodes f32 values straight into parts of at most `part_bytes` content
/// bytes (as [`split_into_parts`] cuts them), each part its own buffer of
/// part size: no buffer of the whole tensor is made (for a 100 MB tensor that
/// would be a fresh mmap, page faults and zeroing on every call).
pub fn encode_parts(name: &str, shape: &[i64], values: &[f32], part_bytes: usize) -> Vec<TensorPart> {
    encode_parts_reusing(name, shape, values, part_bytes, Vec::new())
}

/// [`encode_parts`], writing into the buffers of `spare` (parts encoded
/// earlier) where nothing else holds them any more.
pub fn encode_parts_reusing(name: &str, shape: &[i64], values: &[f32], part_bytes: usize, spare: Vec<TensorPart>) -> Vec<TensorPart> {
    let per_part = (part_bytes / 4).max(1);
    let mut buffers = spare.into_iter().filter_map(|p| p.content.try_into_mut().ok());
    let mut part = |offset: usize, chunk: &[f32]| {
        let mut buf = buffers.next().unwrap_or_default();
        buf.clear();
        buf.reserve(chunk.len() * 4);
        if cfg!(target_endian = "little") {
            buf.extend_from_slice(bytemuck::cast_slice(chunk));
        } else {
            chunk.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        }
        TensorPart { name: name.to_string(), dtype: DataType::DtFloat as i32, shape: shape.to_vec(), offset: offset as u64, content: buf.freeze() }
    };
    if values.is_empty() {
        return vec![part(0, values)];
    }
    values.chunks(per_part).enumerate().map(|(i, chunk)| part(i * per_part, chunk)).collect()
}

/// Checks a received part against the expected shape of its tensor and
/// returns the element range it covers.
pub fn check_part(part: &TensorPart, expected_shape: &[usize]) -> Result<std::ops::Range<usize>, TensorError> {
    let header = PartHeader { name: &part.name, dtype: part.dtype, shape: &part.shape, offset: part.offset, content_len: part.content.len() };
    check_part_header(&header, expected_shape)
}

/// What [`check_part`] looks at: a part without its content (the tensor
/// channel reads the content only once the header is checked).
#[derive(Debug, Clone, Copy)]
pub struct PartHeader<'a> {
    pub name: &'a str,
    pub dtype: i32,
    pub shape: &'a [i64],
    pub offset: u64,
    pub content_len: usize,
}

/// [`check_part`] on a header.
pub fn check_part_header(part: &PartHeader<'_>, expected_shape: &[usize]) -> Result<std::ops::Range<usize>, TensorError> {
    if part.dtype != DataType::DtFloat as i32 {
        return Err(TensorError::UnsupportedDtype { name: part.name.into(), dtype: part.dtype });
    }
    if part.shape.len() != expected_shape.len() || part.shape.iter().zip(expected_shape).any(|(&a, &b)| a < 0 || a as u64 != b as u64) {
        return Err(TensorError::ShapeMismatch { name: part.name.into(), expected: expected_shape.to_vec(), got: part.shape.to_vec() });
    }
    if !part.content_len.is_multiple_of(4) {
        return Err(TensorError::RaggedBytes { name: part.name.into(), len: part.content_len, elem: 4 });
    }
    let total: usize = expected_shape.iter().product();
    let count = part.content_len / 4;
    let start = usize::try_from(part.offset).ok().filter(|s| s.checked_add(count).is_some_and(|e| e <= total));
    match start {
        Some(s) => Ok(s..s + count),
        None => Err(TensorError::PartOutOfRange { name: part.name.into(), offset: part.offset, count, total }),
    }
}

/// Collects the parts of one tensor into a dense f32 buffer, checking that
/// they cover every element exactly once.
#[derive(Debug)]
pub struct PartAssembler {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
    covered: usize,
}

impl PartAssembler {
    pub fn new(name: &str, shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        PartAssembler { name: name.to_string(), shape, values: vec![0.0; n], covered: 0 }
    }
    /// Starts from the first part's own shape (for a receiver that does not
    /// know the shape in advance).
    pub fn from_part(part: &TensorPart) -> Result<Self, TensorError> {
        let n = num_elements(&part.name, &part.shape)?;
        if n > MAX_ASSEMBLED_ELEMENTS {
            return Err(TensorError::BadShape { name: part.name.clone(), shape: part.shape.clone() });
        }
        Ok(Self::new(&part.name, part.shape.iter().map(|&d| d as usize).collect()))
    }
    pub fn add(&mut self, part: &TensorPart) -> Result<(), TensorError> {
        let range = check_part(part, &self.shape)?;
        self.covered += range.len();
        copy_f32_from_le(&mut self.values[range], &part.content);
        Ok(())
    }
    pub fn finish(self) -> Result<(Vec<usize>, Vec<f32>), TensorError> {
        if self.covered != self.values.len() {
            return Err(TensorError::Incomplete { name: self.name, covered: self.covered, total: self.values.len() });
        }
        Ok((self.shape, self.values))
    }
}

/// Upper bound on the elements of a tensor assembled from the network
/// (1 Gi elements, 4 GiB): a shape claiming more is refused before any
/// allocation.
pub const MAX_ASSEMBLED_ELEMENTS: usize = 1 << 30;

/// A whole f32 tensor for the wire.
pub fn tensor_from_array(a: &ArrayD<f32>) -> Tensor {
    let content = match a.as_slice() {
        Some(s) => f32_to_bytes(s),
        None => f32_to_bytes(&a.iter().copied().collect::<Vec<_>>()),
    };
    Tensor { dtype: DataType::DtFloat as i32, shape: wire_shape(a.shape()), content }
}

/// A wire tensor as an f32 array.
pub fn array_from_tensor(t: &Tensor) -> Result<ArrayD<f32>, TensorError> {
    if t.dtype != DataType::DtFloat as i32 {
        return Err(TensorError::UnsupportedDtype { name: String::new(), dtype: t.dtype });
    }
    let n = num_elements("", &t.shape)?;
    if t.content.len() != n * 4 {
        return Err(TensorError::RaggedBytes { name: String::new(), len: t.content.len(), elem: 4 });
    }
    let mut v = vec![0.0; n];
    copy_f32_from_le(&mut v, &t.content);
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    Ok(ArrayD::from_shape_vec(shape, v).expect("element count checked"))
}

/// A string scalar/vector travels as raw UTF-8 bytes with dtype INVALID and
/// an empty shape (the session demo's constant).
pub fn tensor_from_str(s: &str) -> Tensor {
    Tensor { dtype: DataType::DtInvalid as i32, shape: vec![], content: Bytes::copy_from_slice(s.as_bytes()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn decode_aligned_and_unaligned() {
        let values: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let bytes = le(&values);
        // Put the same bytes at every offset 0..4 of a larger buffer, so at
        // least three of them are not 4-byte aligned.
        for shift in 0..4 {
            let mut buf = vec![0u8; bytes.len() + 4];
            buf[shift..shift + bytes.len()].copy_from_slice(&bytes);
            let slice = &buf[shift..shift + bytes.len()];
            let mut out = vec![0.0; values.len()];
            copy_f32_from_le(&mut out, slice);
            assert_eq!(out, values, "shift {shift}");
            let mut scratch = Vec::new();
            assert_eq!(f32_view(slice, &mut scratch), &values[..], "shift {shift}");
            let mut acc = vec![1.0; values.len()];
            add_f32_from_le(&mut acc, slice);
            let want: Vec<f32> = values.iter().map(|v| v + 1.0).collect();
            assert_eq!(acc, want, "shift {shift}");
        }
    }

    #[test]
    fn encode_is_little_endian() {
        let b = f32_to_bytes(&[1.0, -2.5]);
        assert_eq!(&b[..], &le(&[1.0, -2.5])[..]);
    }

    #[test]
    fn encode_parts_cuts_like_split_into_parts() {
        for (n, part_bytes) in [(0usize, 8usize), (1, 8), (10, 8), (10, 12), (1001, 400), (5, 3)] {
            let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let shape = [n as i64];
            let split: Vec<_> = split_into_parts("v", &shape, f32_to_bytes(&values), part_bytes).collect();
            assert_eq!(encode_parts("v", &shape, &values, part_bytes), split, "n={n} part_bytes={part_bytes}");
        }
    }

    /// Re-encoding into spare parts gives the same parts, in the spare
    /// buffers where nothing else holds them, in new ones where a pull does.
    #[test]
    fn encoding_reuses_spare_buffers_nobody_holds() {
        let shape = [10i64];
        let old: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let new: Vec<f32> = (0..10).map(|i| -(i as f32)).collect();
        for held in [false, true] {
            let spare = encode_parts("v", &shape, &old, 16);
            let addresses: Vec<*const u8> = spare.iter().map(|p| p.content.as_ptr()).collect();
            let in_flight: Vec<Bytes> = if held { spare.iter().map(|p| p.content.clone()).collect() } else { vec![] };
            let parts = encode_parts_reusing("v", &shape, &new, 16, spare);
            assert_eq!(parts, encode_parts("v", &shape, &new, 16));
            for (p, a) in parts.iter().zip(&addresses) {
                assert_eq!(p.content.as_ptr() == *a, !held, "held by a pull: {held}");
            }
            // What a pull in flight holds is untouched.
            for (b, p) in in_flight.iter().zip(encode_parts("v", &shape, &old, 16)) {
                assert_eq!(b, &p.content);
            }
        }
    }

    #[test]
    fn split_and_assemble_round_trip() {
        for (n, part_bytes) in [(0usize, 8usize), (1, 8), (10, 8), (10, 12), (1000, 4096), (1001, 400), (5, 3)] {
            let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let shape = vec![n as i64];
            let parts: Vec<_> = split_into_parts("v", &shape, f32_to_bytes(&values), part_bytes).collect();
            assert!(parts.iter().all(|p| p.content.len() <= part_bytes.max(4)), "n={n}");
            let mut asm = PartAssembler::from_part(&parts[0]).unwrap();
            for p in &parts {
                asm.add(p).unwrap();
            }
            let (s, v) = asm.finish().unwrap();
            assert_eq!(s, vec![n]);
            assert_eq!(v, values, "n={n} part_bytes={part_bytes}");
        }
    }

    #[test]
    fn bad_parts_are_refused() {
        let good = TensorPart { name: "w".into(), dtype: DataType::DtFloat as i32, shape: vec![2, 3], offset: 2, content: Bytes::from(le(&[1.0, 2.0])) };
        assert_eq!(check_part(&good, &[2, 3]), Ok(2..4));
        let cases: Vec<(&str, TensorPart, &str)> = vec![
            ("dtype", TensorPart { dtype: DataType::DtInt64 as i32, ..good.clone() }, "unsupported dtype"),
            ("shape", TensorPart { shape: vec![3, 2], ..good.clone() }, "expected shape [2, 3]"),
            ("rank", TensorPart { shape: vec![6], ..good.clone() }, "expected shape"),
            ("ragged", TensorPart { content: Bytes::from_static(&[0, 0, 0]), ..good.clone() }, "whole number"),
            ("past end", TensorPart { offset: 5, ..good.clone() }, "runs past the end"),
            ("huge offset", TensorPart { offset: u64::MAX, ..good.clone() }, "runs past the end"),
            ("negative dim", TensorPart { shape: vec![-2, 3], ..good.clone() }, "expected shape"),
        ];
        for (name, part, want) in cases {
            let err = check_part(&part, &[2, 3]).expect_err(name).to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
        // Parts that leave a gap are detected when assembling.
        let mut asm = PartAssembler::new("w", vec![2, 3]);
        asm.add(&good).unwrap();
        assert!(matches!(asm.finish(), Err(TensorError::Incomplete { covered: 2, total: 6, .. })));
        // A shape claiming absurd sizes is refused before allocating.
        let huge = TensorPart { shape: vec![1 << 40, 1 << 40], ..good };
        assert!(PartAssembler::from_part(&huge).is_err());
    }

    #[test]
    fn array_round_trip() {
        let a = ArrayD::from_shape_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let t = tensor_from_array(&a);
        assert_eq!(t.shape, vec![2, 2]);
        assert_eq!(array_from_tensor(&t).unwrap(), a);
        let bad = Tensor { content: Bytes::from_static(&[1, 2, 3, 4]), ..t };
        assert!(array_from_tensor(&bad).is_err());
    }
}

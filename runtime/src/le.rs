//! Little-endian numbers in byte slices, as the wire (tensor parts, row ids),
//! checkpoints (safetensors) and TFRecord frames carry them: every decode
//! and encode of the crate's, written once.
//!
//! A leaf. Whole f32 slices are cast without a copy where alignment allows
//! in [`crate::tensor`], which falls back to [`f32_at`] element by element.

/// The f32 in the first 4 bytes of `b` (which must hold them).
#[inline(always)]
pub fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The u32 in the first 4 bytes of `b` (which must hold them).
#[inline]
pub fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// The u64 in the first 8 bytes of `b` (which must hold them).
#[inline]
pub fn u64_at(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The i64 in the first 8 bytes of `b` (which must hold them).
#[inline]
pub fn i64_at(b: &[u8]) -> i64 {
    i64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Every whole f32 of `bytes` (a trailing partial one is left out).
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(f32_at).collect()
}

/// Every whole i64 of `bytes` (a trailing partial one is left out): row ids.
pub fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(i64_at).collect()
}

/// `values` as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    // Sized up front: a flat_map's collect cannot know its length and grows by doubling.
    let mut out = Vec::with_capacity(values.len() * 4);
    values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    out
}

/// `values` as little-endian bytes: row ids.
pub fn i64_bytes(values: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 8);
    values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_byte_order() {
        let ids = [0i64, -2, i64::MAX, 1 << 40];
        let bytes = i64_bytes(&ids);
        assert_eq!(&bytes[8..16], &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(i64s(&bytes), ids);
        assert_eq!(i64s(&bytes[..20]), ids[..2], "a partial id is left out");
        let values = [1.5f32, -0.0, f32::MAX];
        let bytes = f32_bytes(&values);
        assert_eq!(&bytes[..4], &[0, 0, 0xc0, 0x3f]);
        assert_eq!(f32s(&bytes), values);
        assert_eq!(f32_at(&bytes[4..]).to_bits(), (-0.0f32).to_bits());
        let raw = [0x78, 0x56, 0x34, 0x12, 0xf0, 0xde, 0xbc, 0x9a, 0xff];
        assert_eq!(u32_at(&raw), 0x1234_5678);
        assert_eq!(u64_at(&raw), 0x9abc_def0_1234_5678);
        assert_eq!(i64_at(&raw), 0x9abc_def0_1234_5678u64 as i64);
    }
}

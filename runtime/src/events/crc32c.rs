//! CRC-32C (Castagnoli), the checksum of TFRecord files and of checkpoint shards.
//!
//! Reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF (the
//! iSCSI / SSE4.2 / TensorFlow `crc32c` variant). Portable slicing-by-8: the
//! tables are computed at compile time, eight bytes are folded per step.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Added to a rotated CRC by [`mask`], as TensorFlow's `crc32c::Mask` does.
const MASK_DELTA: u32 = 0xA282_EAD8;

const TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            bit += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    extend(0, data)
}

/// Continues `crc` (a finished CRC-32C of some prefix, or 0 for none) over `data`:
/// `extend(crc32c(a), b) == crc32c(a ++ b)`.
pub fn extend(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for b in &mut chunks {
        let lo = c ^ u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        c = TABLES[7][(lo & 0xFF) as usize]
            ^ TABLES[6][((lo >> 8) & 0xFF) as usize]
            ^ TABLES[5][((lo >> 16) & 0xFF) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][b[4] as usize]
            ^ TABLES[2][b[5] as usize]
            ^ TABLES[1][b[6] as usize]
            ^ TABLES[0][b[7] as usize];
    }
    for &byte in chunks.remainder() {
        c = (c >> 8) ^ TABLES[0][((c ^ byte as u32) & 0xFF) as usize];
    }
    !c
}

/// Masks a CRC the way TFRecord stores it: rotate right by 15 bits, add a constant.
/// (A CRC of data that itself embeds CRCs is weak; the mask avoids that.)
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Inverse of [`mask`].
pub fn unmask(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference, written straight from the definition.
    fn slow(data: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// RFC 3720 (iSCSI), appendix B.4.
    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
    }

    #[test]
    fn sliced_matches_bitwise_for_every_length_and_split() {
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(crc32c(&data[..len]), slow(&data[..len]), "len {len}");
        }
        let whole = crc32c(&data);
        for split in [0, 1, 7, 8, 9, 150, 299, 300] {
            assert_eq!(extend(crc32c(&data[..split]), &data[split..]), whole, "split {split}");
        }
    }

    #[test]
    fn mask_is_rotate_plus_delta_and_inverts() {
        // 0xE3069283 rotated right by 15 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
        assert_eq!(mask(0xE306_9283), 0xC78A_B0E5);
        assert_eq!(mask(0), MASK_DELTA);
        for c in [0u32, 1, 0xE306_9283, 0xFFFF_FFFF, 0x8000_0000, 0x1234_5678] {
            assert_ne!(mask(c), c);
            assert_eq!(unmask(mask(c)), c);
        }
    }
}

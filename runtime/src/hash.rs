//! Stable hashes and seeds: the same bits on every platform, build and
//! restart, since they decide what is written and read back: a variable's
//! place and the placement's fingerprint, every embedding row's initial value
//! (and so the values in checkpoints), the generated data, the order of the
//! examples in every epoch and the dropout masks of a step.
//!
//! A leaf: imports nothing of the crate. Changing any value here changes
//! training results and old checkpoints' meaning; the tests pin them.

/// FNV-1a, 64-bit: small, stable across builds and platforms. Hashes names
/// (a variable's, a feature's) into keys.
pub struct Fnv1a(pub u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    #[inline]
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A seed for one purpose from a base seed and two parts (splitmix64's
/// finaliser over them): well-spread bits from inputs that differ in a few.
/// An embedding row's generator (seed, variable key, row id), a generated
/// example's, a feature key's, a data shard's order.
#[inline]
pub fn derive_seed(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.rotate_left(29).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The shard dispatcher's seed for one purpose (the shard order, the example
/// order) of one epoch (splitmix64 of the parts).
#[inline]
pub fn epoch_seed(seed: u64, epoch: u64, purpose: u64) -> u64 {
    let mut z = seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ purpose.rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A Keras model's dropout seed: of training batch `n` from the model's
/// seed, then of layer `n` from the batch's (SplitMix64's finaliser of the
/// two).
#[inline]
pub fn dropout_seed(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The owner (ps index, `0..num_ps`) of embedding row `id` under jump consistent hashing (the
/// `consistent` partition strategy; see `layout.rs`). It decides which ps holds a row, so a
/// checkpoint's rows are read back where they were written: pinned by the tests below.
pub fn row_owner(id: u64, num_ps: usize) -> usize {
    if num_ps <= 1 {
        return 0;
    }
    // The row id is mixed first: ids are often small and consecutive.
    let key = derive_seed(id, 0x4c41_594f_5554, 0);
    if num_ps == 2 {
        // Two ps, the usual case, without the jumps' division (a sparse
        // step asks each of its ids' owner): the first jump (b = 0) goes to
        // j = ⌊2^31 / (k + 1)⌋ with k = next_key >> 33 < 2^31; the f64
        // quotient of two exact operands is below 2 exactly when k + 1 >
        // 2^30 (the largest quotient below 2, 2^31 / (2^30 + 1), is ~2^-29
        // from it, far from rounding up), that is when the key's top bit is
        // set. Then j = 1 and the next jump, from b = 1, lands at 2 or
        // beyond: owner 1. Otherwise j >= 2: owner 0. Checked against the
        // jumps by `two_ps_owners_are_the_jumps_owners`.
        return (next_jump_key(key) >> 63) as usize;
    }
    row_owner_by_jumps(key, num_ps)
}

/// The jump consistent hash's key after one more jump (an LCG step).
#[inline]
fn next_jump_key(key: u64) -> u64 {
    key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1)
}

/// Jump consistent hashing of a mixed `key` into `num_ps` buckets: jumps
/// forward while the next jump stays below `num_ps`.
fn row_owner_by_jumps(mut key: u64, num_ps: usize) -> usize {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < num_ps as i64 {
        b = j;
        key = next_jump_key(key);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

/// Pinned outputs: they decide the initial values in checkpoints, the
/// generated data and the data order, so moving or renaming these functions
/// must not change a bit.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_owners_keep_their_values() {
        let owners: Vec<usize> = (0..16u64).map(|id| row_owner(id, 3)).collect();
        let of_big: Vec<usize> = [1u64 << 40, 123_456_789, u64::MAX].iter().map(|&id| row_owner(id, 7)).collect();
        assert_eq!((owners, of_big), (vec![2, 0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1], vec![5, 4, 0]));
    }

    /// The two-ps shortcut gives what the jumps give: for a million row
    /// ids, consecutive and spread, and for keys next to the top bit's edge.
    #[test]
    fn two_ps_owners_are_the_jumps_owners() {
        let spread = (0..500_000u64).map(|k| derive_seed(k, 1, 2));
        for id in (0..500_000u64).chain(spread) {
            let key = derive_seed(id, 0x4c41_594f_5554, 0);
            assert_eq!(row_owner(id, 2), row_owner_by_jumps(key, 2), "row {id}");
        }
        // Keys whose next jump lands at k = 2^30 - 1, 2^30 and 2^30 + 1
        // (the edge of the quotient 2), and at the ends.
        for k in [0u64, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1] {
            for low in [0u64, 1, (1 << 33) - 1] {
                let next = (k << 33) | low;
                let key = previous_jump_key(next);
                assert_eq!(next_jump_key(key), next);
                assert_eq!((next_jump_key(key) >> 63) as usize, row_owner_by_jumps(key, 2), "k {k:#x}, low {low:#x}");
            }
        }
    }

    /// The key whose next jump is `next` (the LCG's multiplier is odd, so
    /// it has an inverse modulo 2^64).
    fn previous_jump_key(next: u64) -> u64 {
        let m = 2_862_933_555_777_941_757u64;
        // Newton's iteration for the inverse modulo 2^64: each step doubles
        // the correct low bits (m is its own inverse modulo 8).
        let mut inv = m;
        for _ in 0..5 {
            inv = inv.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(inv)));
        }
        next.wrapping_sub(1).wrapping_mul(inv)
    }

    #[test]
    fn seed_functions_keep_their_values() {
        let three: [(u64, u64, u64, u64); 4] = [
            (0x0, 0x0, 0x0, 0x0000000000000000),
            (0x1, 0x2, 0x3, 0x885571ef44d9cc9b),
            (0x7, 0x4558, 0x0, 0x24e3ace79d78cbab),
            (u64::MAX, 0x5, 0x535041525345, 0xc49abdf0970f2394),
        ];
        for (a, b, c, want) in three {
            assert_eq!(derive_seed(a, b, c), want, "derive_seed (embedding::mix before) ({a:#x}, {b:#x}, {c:#x})");
        }
        let two: [(u64, u64, u64); 4] =
            [(0x0, 0x0, 0x5c4722af355e9512), (0x1, 0x2, 0x8c9a5c8d6b31afde), (0x2a, 0x7, 0x028b68a114d87371), (u64::MAX, 0x3, 0x2acd0d4654f61356)];
        for (a, b, want) in two {
            assert_eq!(dropout_seed(a, b), want, "dropout_seed (keras::mix before) ({a:#x}, {b:#x})");
        }
        let epoch: [(u64, u64, u64, u64); 4] = [
            (0x0, 0x0, 0x0, 0x0000000000000000),
            (0x1, 0x2, 0x534841524453, 0xd25b336a6454680f),
            (0x9, 0x0, 0x4558414d504c, 0xe14c49ba4a68069f),
            (u64::MAX, 0x1, 0x3, 0x11cebe8040952e9a),
        ];
        for (a, b, c, want) in epoch {
            assert_eq!(epoch_seed(a, b, c), want, "epoch_seed (dispatch::mix before) ({a:#x}, {b:#x}, {c:#x})");
        }
    }

    #[test]
    fn fnv1a_keeps_its_values() {
        let cases = [("", 0xcbf29ce484222325u64), ("a", 0xaf63dc4c8601ec8c), ("emb", 0xc2ec1718f04f892f), ("dense/kernel", 0x00e866201259ba30)];
        for (text, want) in cases {
            let mut h = Fnv1a::default();
            h.write(text.as_bytes());
            assert_eq!(h.0, want, "{text:?}");
        }
    }
}

//! Pinned outputs of the hash and seed functions: they decide the initial
//! values in checkpoints, the generated data and the data order, so moving or
//! renaming them must not change a bit.

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::embedding::RowInit;
use crate::model::{Init, fill_init};
use crate::placement::Fnv1a;

#[test]
fn seed_functions_keep_their_values() {
    let three: [(u64, u64, u64, u64); 4] = [
        (0x0, 0x0, 0x0, 0x0000000000000000),
        (0x1, 0x2, 0x3, 0x885571ef44d9cc9b),
        (0x7, 0x4558, 0x0, 0x24e3ace79d78cbab),
        (u64::MAX, 0x5, 0x535041525345, 0xc49abdf0970f2394),
    ];
    for (a, b, c, want) in three {
        assert_eq!(crate::embedding::mix(a, b, c), want, "embedding::mix({a:#x}, {b:#x}, {c:#x})");
    }
    let two: [(u64, u64, u64); 4] =
        [(0x0, 0x0, 0x5c4722af355e9512), (0x1, 0x2, 0x8c9a5c8d6b31afde), (0x2a, 0x7, 0x028b68a114d87371), (u64::MAX, 0x3, 0x2acd0d4654f61356)];
    for (a, b, want) in two {
        assert_eq!(crate::model::keras::mix(a, b), want, "keras::mix({a:#x}, {b:#x})");
    }
    let epoch: [(u64, u64, u64, u64); 4] = [
        (0x0, 0x0, 0x0, 0x0000000000000000),
        (0x1, 0x2, 0x534841524453, 0xd25b336a6454680f),
        (0x9, 0x0, 0x4558414d504c, 0xe14c49ba4a68069f),
        (u64::MAX, 0x1, 0x3, 0x11cebe8040952e9a),
    ];
    for (a, b, c, want) in epoch {
        assert_eq!(crate::dispatch::mix(a, b, c), want, "dispatch::mix({a:#x}, {b:#x}, {c:#x})");
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

/// Initial values as bits: a row's (from its variable, the seed and its id)
/// and a variable's (from one generator).
#[test]
fn initial_values_keep_their_bits() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut row = [0.0f32; 3];
    RowInit::new("emb", Init::Normal { stddev: 1.0 }, 3).fill(5, &mut row);
    assert_eq!(bits(&row), ROW_NORMAL, "{row:?}");
    RowInit::new("wide/kernel", Init::Uniform { limit: 0.05 }, 1).fill(1 << 20, &mut row);
    assert_eq!(bits(&row), ROW_UNIFORM, "{row:?}");
    let mut values = [0.0f32; 4];
    fill_init(&Init::TruncatedNormal { stddev: 0.1 }, &mut StdRng::seed_from_u64(1), &mut values);
    assert_eq!(bits(&values), TRUNCATED, "{values:?}");
}

const ROW_NORMAL: [u32; 3] = [0x3d4432d9, 0xbeef3305, 0xbde3ddbe];
const ROW_UNIFORM: [u32; 3] = [0x3c3f3bad, 0x3d3c6818, 0xbd3be3c2];
const TRUNCATED: [u32; 4] = [0x3e2a5afd, 0x3d97b04f, 0xbc504f45, 0xbd7b28a2];

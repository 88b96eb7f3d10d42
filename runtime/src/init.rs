//! Initial values: how a variable's are drawn ([`Init`], [`fill_init`]) and
//! the rule that gives every row of an embedding its own ([`RowInit`]).
//!
//! A leaf above [`crate::hash`]: deterministic given the seed, so every task
//! and every restart computes the same values, and a checkpoint's values
//! mean the same to every build.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use crate::hash::{Fnv1a, derive_seed};

/// How a variable's initial value is drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Init {
    Zeros,
    Constant(f32),
    /// Normal(0, stddev).
    Normal {
        stddev: f32,
    },
    /// Normal(0, stddev) truncated at two standard deviations (TensorFlow's
    /// `truncated_normal`).
    TruncatedNormal {
        stddev: f32,
    },
    /// Uniform(-limit, limit).
    Uniform {
        limit: f32,
    },
}

/// Draws `out.len()` values of `init` from `rng`.
pub fn fill_init(init: &Init, rng: &mut StdRng, out: &mut [f32]) {
    match *init {
        Init::Zeros => out.fill(0.0),
        Init::Constant(c) => out.fill(c),
        Init::Normal { stddev } => out.iter_mut().for_each(|v| *v = rng.sample::<f32, _>(StandardNormal) * stddev),
        Init::TruncatedNormal { stddev } => out.iter_mut().for_each(|v| {
            *v = loop {
                let x: f32 = rng.sample(StandardNormal);
                if x.abs() <= 2.0 {
                    break x * stddev;
                }
            }
        }),
        Init::Uniform { limit } => {
            let limit = limit.abs();
            out.iter_mut().for_each(|v| *v = (rng.random::<f32>() * 2.0 - 1.0) * limit);
        }
    }
}

/// The initial value of any row of one embedding variable: drawn from
/// `init` by a generator seeded with `seed`, the variable's name and the
/// row's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowInit {
    pub init: Init,
    pub seed: u64,
    /// FNV-1a of the variable's name.
    key: u64,
}

impl RowInit {
    pub fn new(variable: &str, init: Init, seed: u64) -> Self {
        let mut h = Fnv1a::default();
        h.write(variable.as_bytes());
        RowInit { init, seed, key: h.0 }
    }

    /// Writes row `id`'s initial value into `out` (`dim` values).
    pub fn fill(&self, id: i64, out: &mut [f32]) {
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, self.key, id as u64));
        fill_init(&self.init, &mut rng, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's initial value depends on the variable, the seed and the id
    /// only: the same wherever and whenever it is computed.
    #[test]
    fn rows_start_from_their_own_deterministic_value() {
        let a = RowInit::new("emb", Init::Normal { stddev: 1.0 }, 3);
        let row = |init: &RowInit, id| {
            let mut out = [0.0f32; 4];
            init.fill(id, &mut out);
            out
        };
        assert_eq!(row(&a, 5), row(&a.clone(), 5));
        assert_ne!(row(&a, 5), row(&a, 6));
        assert_ne!(row(&a, 5), row(&RowInit::new("emb", Init::Normal { stddev: 1.0 }, 4), 5), "another seed");
        assert_ne!(row(&a, 5), row(&RowInit::new("other", Init::Normal { stddev: 1.0 }, 3), 5), "another variable");
        assert_eq!(row(&RowInit::new("emb", Init::Zeros, 3), 5), [0.0; 4]);
        let u = row(&RowInit::new("emb", Init::Uniform { limit: 0.05 }, 3), 9);
        assert!(u.iter().all(|v| v.abs() <= 0.05) && u.iter().any(|v| *v != 0.0), "{u:?}");
    }

    /// Pinned (they are in checkpoints): initial values as bits, a row's
    /// (from its variable, the seed and its id) and a variable's (from one
    /// generator).
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
}

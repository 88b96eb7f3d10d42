//! A generator of learnable click-through data with known weights, in both
//! sparse formats, for tests, benchmarks and the example: every example is
//! a pure function of (`seed`, its index), so a training set of any size
//! costs no memory, and the true model is known: its AUC on the held-out
//! examples is the AUC a model can hope for ([`Generator::achievable_auc`]).
//!
//! - libsvm: 5 to 12 distinct features out of 400 per example, value 1;
//!   each feature has a weight drawn from N(0, 0.7).
//! - criteo: the 13 integer fields are counts (10% missing) entering as
//!   `a_j * (ln(1 + v) - 2)`, `a_j` from N(0, 0.25); the 26 categorical
//!   fields take one of 4 to 40 values each (5% missing), 8 hex digits as
//!   in Criteo's logs, each value with a weight from N(0, 0.45).
//!
//! The label is a click with probability `sigmoid(bias + the weights of
//! the example's features)`.

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::sparse::{CRITEO_CATEGORICALS, CRITEO_INTEGERS, Feature, SparseExample, SparseFormat, feature_key};
use crate::hash::derive_seed;

/// Held-out examples are those from this index on (training examples
/// count from 0): the two never meet.
pub const GENERATED_EVAL_BASE: u64 = 1 << 40;

const LIBSVM_VOCABULARY: u64 = 400;

/// Learnable data of one format from one seed.
#[derive(Clone)]
pub struct Generator {
    pub format: SparseFormat,
    pub seed: u64,
    /// The true model of this seed, drawn once.
    truth: std::sync::Arc<TrueModel>,
}

impl PartialEq for Generator {
    fn eq(&self, other: &Self) -> bool {
        (self.format, self.seed) == (other.format, other.seed)
    }
}

impl Eq for Generator {}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("format", &self.format).field("seed", &self.seed).finish_non_exhaustive()
    }
}

/// A draw from N(0, 1) fixed by its parts.
fn normal(seed: u64, a: u64, b: u64) -> f64 {
    StdRng::seed_from_u64(derive_seed(seed, a, b)).sample::<f64, _>(StandardNormal)
}

fn criteo_vocabulary(field: usize) -> u64 {
    4 + (field as u64 * 13) % 37
}

/// The weights of a generator's true model, with the key of each feature they belong to.
/// Each weight is a draw of [`normal`], which seeds a random generator of its own: drawn per
/// example, the weights were most of the cost of an example (three quarters of a
/// single-process `sparse_lr` step went to making its batch). Drawn once per generator, an
/// example is the same to the bit.
struct TrueModel {
    /// libsvm: feature `i` (1-based) at `i - 1`: its key and weight.
    libsvm: Vec<(u64, f64)>,
    /// criteo: the integer fields' coefficients `a_j`.
    criteo_integers: Vec<f64>,
    /// criteo: per categorical field, per value, its key and weight.
    criteo_categories: Vec<Vec<(u64, f64)>>,
}

impl TrueModel {
    fn draw(format: SparseFormat, seed: u64) -> TrueModel {
        let mut truth = TrueModel { libsvm: vec![], criteo_integers: vec![], criteo_categories: vec![] };
        match format {
            SparseFormat::Libsvm => {
                truth.libsvm = (1..=LIBSVM_VOCABULARY)
                    .map(|i| {
                        let key = feature_key(0, &i.to_le_bytes());
                        (key, 0.7 * normal(seed, 0x11B5, key))
                    })
                    .collect();
            }
            SparseFormat::Criteo => {
                truth.criteo_integers = (0..CRITEO_INTEGERS).map(|j| 0.25 * normal(seed, 0xD0, j as u64)).collect();
                truth.criteo_categories = (0..CRITEO_CATEGORICALS)
                    .map(|f| {
                        (0..criteo_vocabulary(f))
                            .map(|value| {
                                let key = feature_key(f as u32, category(seed, f, value).as_bytes());
                                (key, 0.45 * normal(seed, 0xCA7 + f as u64, key))
                            })
                            .collect()
                    })
                    .collect();
            }
        }
        truth
    }
}

/// The text of value `value` of categorical field `field`.
fn category(seed: u64, field: usize, value: u64) -> String {
    format!("{:08x}", derive_seed(seed, field as u64, value) as u32)
}

impl Generator {
    pub fn new(format: SparseFormat, seed: u64) -> Self {
        Generator { format, seed, truth: std::sync::Arc::new(TrueModel::draw(format, seed)) }
    }

    /// Example `index` and its true logit.
    pub fn example(&self, index: u64) -> (SparseExample, f64) {
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, index, 0x4558));
        let (mut example, logit) = match self.format {
            SparseFormat::Libsvm => self.libsvm(&mut rng),
            SparseFormat::Criteo => self.criteo(&mut rng),
        };
        let p = 1.0 / (1.0 + (-logit).exp());
        example.label = u32::from(rng.random::<f64>() < p);
        (example, logit)
    }

    /// A libsvm example (label not drawn yet) and its true logit.
    fn libsvm(&self, rng: &mut StdRng) -> (SparseExample, f64) {
        let k = rng.random_range(5..=12);
        let mut indices: Vec<usize> = sample(rng, LIBSVM_VOCABULARY as usize, k).into_vec();
        indices.sort_unstable();
        let drawn = indices.iter().map(|&i| self.truth.libsvm[i]);
        let features = drawn.clone().map(|(key, _)| Feature { field: 0, key, value: 1.0 }).collect();
        let logit = -0.3 + drawn.map(|(_, w)| w).sum::<f64>();
        (SparseExample { label: 0, dense: vec![], features }, logit)
    }

    /// A criteo example (label not drawn yet) and its true logit.
    fn criteo(&self, rng: &mut StdRng) -> (SparseExample, f64) {
        let mut e = SparseExample::default();
        for _ in 0..CRITEO_INTEGERS {
            let missing = rng.random::<f64>() < 0.1;
            let v = ((rng.random::<f64>() * 4.0).exp() - 1.0).floor();
            e.dense.push(if missing { 0.0 } else { v.ln_1p() as f32 });
        }
        let mut weights = Vec::with_capacity(CRITEO_CATEGORICALS);
        for f in 0..CRITEO_CATEGORICALS {
            let value = rng.random_range(0..criteo_vocabulary(f));
            if rng.random::<f64>() < 0.05 {
                continue;
            }
            let (key, w) = self.truth.criteo_categories[f][value as usize];
            e.features.push(Feature { field: f as u32, key, value: 1.0 });
            weights.push(w);
        }
        let dense: f64 = e.dense.iter().zip(&self.truth.criteo_integers).map(|(&v, a)| a * (f64::from(v) - 2.0)).sum();
        let logit = -0.5 + dense + weights.iter().sum::<f64>();
        (e, logit)
    }

    /// Example `index` as a line of its format (with its newline). Parsing
    /// it gives [`example`](Self::example)`(index)`.
    pub fn line(&self, index: u64) -> String {
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, index, 0x4558));
        let label = self.example(index).0.label;
        match self.format {
            SparseFormat::Libsvm => {
                let k = rng.random_range(5..=12);
                let mut indices: Vec<u64> = sample(&mut rng, LIBSVM_VOCABULARY as usize, k).into_iter().map(|i| i as u64 + 1).collect();
                indices.sort_unstable();
                let features: Vec<String> = indices.iter().map(|i| format!("{i}:1")).collect();
                format!("{label} {}\n", features.join(" "))
            }
            SparseFormat::Criteo => {
                let mut fields = vec![label.to_string()];
                for _ in 0..CRITEO_INTEGERS {
                    let missing = rng.random::<f64>() < 0.1;
                    let v = ((rng.random::<f64>() * 4.0).exp() - 1.0).floor();
                    fields.push(if missing { String::new() } else { format!("{}", v as i64) });
                }
                for f in 0..CRITEO_CATEGORICALS {
                    let value = rng.random_range(0..criteo_vocabulary(f));
                    let missing = rng.random::<f64>() < 0.05;
                    fields.push(if missing { String::new() } else { category(self.seed, f, value) });
                }
                format!("{}\n", fields.join("\t"))
            }
        }
    }

    /// The AUC of the true model on `n` held-out examples: what a model
    /// that learnt the weights exactly reaches on them.
    pub fn achievable_auc(&self, n: u64) -> f64 {
        let (scores, labels): (Vec<f64>, Vec<u32>) = (0..n)
            .map(|i| {
                let (e, logit) = self.example(GENERATED_EVAL_BASE + i);
                (logit, e.label)
            })
            .unzip();
        auc(&scores, &labels)
    }
}

/// The area under the ROC curve of `scores` for binary `labels` (1 is
/// positive): the probability that a random positive scores above a
/// random negative, ties counting half (the Mann-Whitney U statistic with
/// average ranks). NaN without both classes.
pub fn auc<S: Copy + Into<f64>>(scores: &[S], labels: &[u32]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].into().total_cmp(&scores[b].into()));
    let positives = labels.iter().filter(|&&l| l > 0).count() as f64;
    let negatives = labels.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return f64::NAN;
    }
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]].into() == scores[order[i]].into() {
            j += 1;
        }
        let average_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += order[i..=j].iter().filter(|&&k| labels[k] > 0).count() as f64 * average_rank;
        i = j + 1;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_by_hand() {
        let cases: Vec<(Vec<f64>, Vec<u32>, f64)> = vec![
            (vec![0.1, 0.9], vec![0, 1], 1.0),
            (vec![0.9, 0.1], vec![0, 1], 0.0),
            (vec![0.5, 0.5], vec![0, 1], 0.5),
            // Pairs (pos, neg): (.8,.3) (.8,.6) (.4,.3) (.4,.6): 3 of 4.
            (vec![0.3, 0.8, 0.4, 0.6], vec![0, 1, 1, 0], 0.75),
            // A tie between a positive and a negative counts half: (1 + .5) / 2.
            (vec![0.2, 0.7, 0.7, 0.9], vec![0, 0, 1, 1], (2.0 + 1.5) / 4.0),
        ];
        for (scores, labels, want) in cases {
            assert!((auc(&scores, &labels) - want).abs() < 1e-12, "{scores:?} {labels:?}");
        }
        assert!(auc(&[0.1f64, 0.2], &[1, 1]).is_nan());
    }

    /// The true logit of an example drawn weight by weight, as before the weights were drawn
    /// once per generator: what the drawn-once weights must give to the bit.
    fn logit_drawn_per_example(g: &Generator, e: &SparseExample) -> f64 {
        match g.format {
            SparseFormat::Libsvm => -0.3 + e.features.iter().map(|f| 0.7 * normal(g.seed, 0x11B5, f.key) * f64::from(f.value)).sum::<f64>(),
            SparseFormat::Criteo => {
                let dense: f64 = e.dense.iter().enumerate().map(|(j, &v)| 0.25 * normal(g.seed, 0xD0, j as u64) * (f64::from(v) - 2.0)).sum();
                -0.5 + dense + e.features.iter().map(|f| 0.45 * normal(g.seed, 0xCA7 + u64::from(f.field), f.key)).sum::<f64>()
            }
        }
    }

    #[test]
    fn weights_drawn_once_give_the_logits_drawn_per_example_to_the_bit() {
        for format in [SparseFormat::Libsvm, SparseFormat::Criteo] {
            for seed in [0, 5, 42] {
                let g = Generator::new(format, seed);
                for i in (0..300).chain(GENERATED_EVAL_BASE..GENERATED_EVAL_BASE + 50) {
                    let (e, logit) = g.example(i);
                    assert_eq!(logit.to_bits(), logit_drawn_per_example(&g, &e).to_bits(), "{format} seed {seed} example {i}");
                }
            }
        }
    }

    /// Lines parse back to the examples; the data are learnable: the true
    /// model ranks clicks well, and the labels follow its probabilities.
    #[test]
    fn generated_lines_are_the_examples_and_learnable() {
        for format in [SparseFormat::Libsvm, SparseFormat::Criteo] {
            let g = Generator::new(format, 5);
            for i in [0u64, 1, 77, GENERATED_EVAL_BASE + 3] {
                let parsed = format.parse(&g.line(i)).unwrap().unwrap();
                assert_eq!(parsed, g.example(i).0, "{format} example {i}");
            }
            let auc = g.achievable_auc(3000);
            assert!((0.75..0.95).contains(&auc), "{format}: achievable AUC {auc}");
            assert_eq!(g.achievable_auc(500), Generator::new(format, 5).achievable_auc(500), "deterministic");
            assert_ne!(g.example(1), Generator::new(format, 6).example(1), "the seed matters");
            let clicks = (0..2000).filter(|&i| g.example(i).0.label == 1).count();
            assert!((300..1700).contains(&clicks), "{format}: {clicks} clicks of 2000");
        }
    }
}

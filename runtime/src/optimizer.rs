//! Optimizers applied on the ps (and in single-process training), with
//! TensorFlow 1.x's update rules. Pure functions over slices; slot variables
//! (momentum accumulators, Adam's m and v) live beside the variable.

use crate::proto;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// `var -= lr * g`
    Sgd,
    /// `accum = momentum * accum + g; var -= lr * accum` (Nesterov:
    /// `var -= lr * (g + momentum * accum)`).
    Momentum { momentum: f32, use_nesterov: bool },
    /// `accum += g^2; var -= lr * g / sqrt(accum)`.
    Adagrad { initial_accumulator_value: f32 },
    /// `lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); m = b1 m + (1 - b1) g;
    /// v = b2 v + (1 - b2) g^2; var -= lr_t * m / (sqrt(v) + eps)`.
    Adam { beta1: f32, beta2: f32, epsilon: f32 },
    /// FTRL-Proximal (McMahan et al., TensorFlow's `ApplyFtrl` with
    /// `learning_rate_power = -0.5`), the click-through classic: with `n`
    /// the accumulator (slot 0) and `z` the linear term (slot 1),
    /// `n' = n + g^2; z += g - (sqrt(n') - sqrt(n)) / lr * var; n = n';
    /// var = |z| <= l1 ? 0 : (sign(z) * l1 - z) / (sqrt(n) / lr + 2 * l2)`.
    /// l1 makes weights exactly zero, l2 shrinks them.
    Ftrl { initial_accumulator_value: f32, l1: f32, l2: f32 },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Optimizer {
    pub kind: OptimizerKind,
    pub learning_rate: f32,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimizerError {
    #[error("optimizer: unknown name {0:?} (sgd, momentum, nesterov, adagrad, adam, ftrl)")]
    UnknownName(String),
    #[error("optimizer.{field}: {value} is out of range ({range})")]
    OutOfRange { field: &'static str, value: f32, range: &'static str },
    #[error("{field}: only the ftrl optimizer regularises (this job trains with {optimizer})")]
    NotFtrl { field: &'static str, optimizer: &'static str },
}

/// Slot variables of one variable (or of one part of it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slots {
    /// Momentum accumulator, Adagrad accumulator, Adam's m, or FTRL's n.
    pub first: Vec<f32>,
    /// Adam's v, or FTRL's z.
    pub second: Vec<f32>,
    /// Updates applied so far (Adam's t).
    pub updates: u64,
}

impl Optimizer {
    pub fn sgd(learning_rate: f32) -> Self {
        Optimizer { kind: OptimizerKind::Sgd, learning_rate }
    }

    /// From the command line's `--optimizer` name and hyper-parameters, with
    /// TensorFlow's defaults for what is not given.
    pub fn from_name(name: &str, learning_rate: f32, momentum: f32) -> Result<Self, OptimizerError> {
        let kind = match name.to_ascii_lowercase().as_str() {
            "sgd" | "gradientdescent" | "gradient_descent" => OptimizerKind::Sgd,
            "momentum" => OptimizerKind::Momentum { momentum, use_nesterov: false },
            "nesterov" => OptimizerKind::Momentum { momentum, use_nesterov: true },
            "adagrad" => OptimizerKind::Adagrad { initial_accumulator_value: 0.1 },
            "adam" => OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
            "ftrl" => OptimizerKind::Ftrl { initial_accumulator_value: 0.1, l1: 0.0, l2: 0.0 },
            other => return Err(OptimizerError::UnknownName(other.to_string())),
        };
        let o = Optimizer { kind, learning_rate };
        o.validate()?;
        Ok(o)
    }

    /// FTRL's l1 and l2 regularization strengths (TensorFlow's
    /// `l1_regularization_strength`, `l2_regularization_strength`). Any
    /// other optimizer refuses a nonzero one: it would be silently ignored.
    pub fn with_regularization(mut self, l1: f32, l2: f32) -> Result<Self, OptimizerError> {
        match &mut self.kind {
            OptimizerKind::Ftrl { l1: a, l2: b, .. } => {
                (*a, *b) = (l1, l2);
                self.validate()?;
                Ok(self)
            }
            _ if l1 != 0.0 => Err(OptimizerError::NotFtrl { field: "--l1_regularization_strength", optimizer: self.name() }),
            _ if l2 != 0.0 => Err(OptimizerError::NotFtrl { field: "--l2_regularization_strength", optimizer: self.name() }),
            _ => Ok(self),
        }
    }

    /// The `--optimizer` name.
    pub fn name(&self) -> &'static str {
        match self.kind {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum { use_nesterov: false, .. } => "momentum",
            OptimizerKind::Momentum { use_nesterov: true, .. } => "nesterov",
            OptimizerKind::Adagrad { .. } => "adagrad",
            OptimizerKind::Adam { .. } => "adam",
            OptimizerKind::Ftrl { .. } => "ftrl",
        }
    }

    pub fn validate(&self) -> Result<(), OptimizerError> {
        let check = |field, value: f32, ok: bool, range| {
            if ok { Ok(()) } else { Err(OptimizerError::OutOfRange { field, value, range }) }
        };
        check("learning_rate", self.learning_rate, self.learning_rate.is_finite() && self.learning_rate > 0.0, "> 0")?;
        match self.kind {
            OptimizerKind::Sgd => Ok(()),
            OptimizerKind::Momentum { momentum, .. } => check("momentum", momentum, (0.0..1.0).contains(&momentum), "[0, 1)"),
            OptimizerKind::Adagrad { initial_accumulator_value: v } => check("initial_accumulator_value", v, v.is_finite() && v > 0.0, "> 0"),
            OptimizerKind::Adam { beta1, beta2, epsilon } => {
                check("beta1", beta1, (0.0..1.0).contains(&beta1), "[0, 1)")?;
                check("beta2", beta2, (0.0..1.0).contains(&beta2), "[0, 1)")?;
                check("epsilon", epsilon, epsilon.is_finite() && epsilon > 0.0, "> 0")
            }
            OptimizerKind::Ftrl { initial_accumulator_value: v, l1, l2 } => {
                check("initial_accumulator_value", v, v.is_finite() && v > 0.0, "> 0")?;
                check("l1_regularization_strength", l1, l1.is_finite() && l1 >= 0.0, ">= 0")?;
                check("l2_regularization_strength", l2, l2.is_finite() && l2 >= 0.0, ">= 0")
            }
        }
    }

    /// Fresh slots for a variable of `n` elements.
    pub fn new_slots(&self, n: usize) -> Slots {
        match self.kind {
            OptimizerKind::Sgd => Slots::default(),
            OptimizerKind::Momentum { .. } => Slots { first: vec![0.0; n], ..Default::default() },
            OptimizerKind::Adagrad { initial_accumulator_value } => Slots { first: vec![initial_accumulator_value; n], ..Default::default() },
            OptimizerKind::Adam { .. } => Slots { first: vec![0.0; n], second: vec![0.0; n], updates: 0 },
            OptimizerKind::Ftrl { initial_accumulator_value, .. } => Slots { first: vec![initial_accumulator_value; n], second: vec![0.0; n], updates: 0 },
        }
    }

    /// The slot values of a fresh element, per slot (what [`new_slots`](Self::new_slots) fills with).
    pub fn fresh_slot_values(&self) -> Vec<f32> {
        match self.kind {
            OptimizerKind::Sgd => vec![],
            OptimizerKind::Momentum { .. } => vec![0.0],
            OptimizerKind::Adagrad { initial_accumulator_value } => vec![initial_accumulator_value],
            OptimizerKind::Adam { .. } => vec![0.0, 0.0],
            OptimizerKind::Ftrl { initial_accumulator_value, .. } => vec![initial_accumulator_value, 0.0],
        }
    }

    /// Applies one update to `var[range]` with gradient `grad` (same length
    /// as the range). `t` is the number of this update (1 for the first),
    /// shared by all parts of one variable within one update.
    pub fn apply(&self, var: &mut [f32], slots: &mut Slots, range: std::ops::Range<usize>, grad: &[f32], t: u64) {
        let lr = self.learning_rate;
        let var = &mut var[range.clone()];
        debug_assert_eq!(var.len(), grad.len());
        match self.kind {
            OptimizerKind::Sgd => {
                for (w, g) in var.iter_mut().zip(grad) {
                    *w -= lr * g;
                }
            }
            OptimizerKind::Momentum { momentum, use_nesterov } => {
                let acc = &mut slots.first[range];
                for ((w, a), g) in var.iter_mut().zip(acc.iter_mut()).zip(grad) {
                    *a = *a * momentum + g;
                    *w -= if use_nesterov { lr * (g + momentum * *a) } else { lr * *a };
                }
            }
            OptimizerKind::Adagrad { .. } => {
                let acc = &mut slots.first[range];
                for ((w, a), g) in var.iter_mut().zip(acc.iter_mut()).zip(grad) {
                    *a += g * g;
                    *w -= lr * g / a.sqrt();
                }
            }
            OptimizerKind::Adam { beta1, beta2, epsilon } => {
                let t = t.max(1) as i32;
                let lr_t = lr * (1.0 - beta2.powi(t)).sqrt() / (1.0 - beta1.powi(t));
                let (m, v) = (&mut slots.first[range.clone()], &mut slots.second[range]);
                for (((w, m), v), g) in var.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(grad) {
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *w -= lr_t * *m / (v.sqrt() + epsilon);
                }
            }
            OptimizerKind::Ftrl { l1, l2, .. } => {
                let (n, z) = (&mut slots.first[range.clone()], &mut slots.second[range]);
                for (((w, n), z), g) in var.iter_mut().zip(n.iter_mut()).zip(z.iter_mut()).zip(grad) {
                    let n_new = *n + g * g;
                    *z += g - (n_new.sqrt() - n.sqrt()) / lr * *w;
                    *n = n_new;
                    *w = if z.abs() <= l1 { 0.0 } else { (z.signum() * l1 - *z) / (n_new.sqrt() / lr + 2.0 * l2) };
                }
            }
        }
    }

    /// Applies a whole-variable update and counts it.
    pub fn apply_all(&self, var: &mut [f32], slots: &mut Slots, grad: &[f32]) {
        slots.updates += 1;
        let t = slots.updates;
        self.apply(var, slots, 0..var.len(), grad, t);
    }

    pub fn to_proto(&self) -> proto::OptimizerConfig {
        let mut c = proto::OptimizerConfig { learning_rate: self.learning_rate, ..Default::default() };
        match self.kind {
            OptimizerKind::Sgd => c.kind = proto::OptimizerKind::OptimizerSgd as i32,
            OptimizerKind::Momentum { momentum, use_nesterov } => {
                c.kind = proto::OptimizerKind::OptimizerMomentum as i32;
                c.momentum = momentum;
                c.use_nesterov = use_nesterov;
            }
            OptimizerKind::Adagrad { initial_accumulator_value } => {
                c.kind = proto::OptimizerKind::OptimizerAdagrad as i32;
                c.initial_accumulator_value = initial_accumulator_value;
            }
            OptimizerKind::Adam { beta1, beta2, epsilon } => {
                c.kind = proto::OptimizerKind::OptimizerAdam as i32;
                c.beta1 = beta1;
                c.beta2 = beta2;
                c.epsilon = epsilon;
            }
            OptimizerKind::Ftrl { initial_accumulator_value, l1, l2 } => {
                c.kind = proto::OptimizerKind::OptimizerFtrl as i32;
                c.initial_accumulator_value = initial_accumulator_value;
                c.l1_regularization_strength = l1;
                c.l2_regularization_strength = l2;
            }
        }
        c
    }

    pub fn from_proto(c: &proto::OptimizerConfig) -> Result<Self, OptimizerError> {
        let kind = match proto::OptimizerKind::try_from(c.kind) {
            Ok(proto::OptimizerKind::OptimizerSgd) => OptimizerKind::Sgd,
            Ok(proto::OptimizerKind::OptimizerMomentum) => OptimizerKind::Momentum { momentum: c.momentum, use_nesterov: c.use_nesterov },
            Ok(proto::OptimizerKind::OptimizerAdagrad) => OptimizerKind::Adagrad { initial_accumulator_value: c.initial_accumulator_value },
            Ok(proto::OptimizerKind::OptimizerAdam) => OptimizerKind::Adam { beta1: c.beta1, beta2: c.beta2, epsilon: c.epsilon },
            Ok(proto::OptimizerKind::OptimizerFtrl) => OptimizerKind::Ftrl {
                initial_accumulator_value: c.initial_accumulator_value,
                l1: c.l1_regularization_strength,
                l2: c.l2_regularization_strength,
            },
            _ => return Err(OptimizerError::UnknownName(format!("kind {}", c.kind))),
        };
        let o = Optimizer { kind, learning_rate: c.learning_rate };
        o.validate()?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs()))
    }

    /// Each optimizer against values worked out by hand from TensorFlow's
    /// formulas, over two updates.
    #[test]
    fn arithmetic() {
        let g1 = [0.5f32, -1.0];
        let g2 = [0.25f32, 2.0];
        let cases: Vec<(&str, Optimizer, [f32; 2], [f32; 2])> = vec![
            ("sgd", Optimizer::sgd(0.1), [0.95, 1.1], [0.925, 0.9]),
            (
                "momentum 0.9",
                Optimizer { kind: OptimizerKind::Momentum { momentum: 0.9, use_nesterov: false }, learning_rate: 0.1 },
                // acc1 = g1 = [.5,-1]; w1 = [1-.05, 1+.1]
                // acc2 = .9*acc1 + g2 = [.7, 1.1]; w2 = w1 - .1*acc2
                [0.95, 1.1],
                [0.88, 0.99],
            ),
            (
                "nesterov 0.9",
                Optimizer { kind: OptimizerKind::Momentum { momentum: 0.9, use_nesterov: true }, learning_rate: 0.1 },
                // w1 = 1 - .1*(g1 + .9*g1) = [1-.095, 1+.19]
                // acc2 = [.7,1.1]; w2 = w1 - .1*(g2 + .9*acc2) = [.905-.088, 1.19-.299]
                [0.905, 1.19],
                [0.817, 0.891],
            ),
            (
                "adagrad 0.1",
                Optimizer { kind: OptimizerKind::Adagrad { initial_accumulator_value: 0.1 }, learning_rate: 0.1 },
                // acc1 = [.35, 1.1]; w1 = 1 - .1*g1/sqrt(acc1)
                [1.0 - 0.05 / 0.35f32.sqrt(), 1.0 + 0.1 / 1.1f32.sqrt()],
                [1.0 - 0.05 / 0.35f32.sqrt() - 0.025 / 0.4125f32.sqrt(), 1.0 + 0.1 / 1.1f32.sqrt() - 0.2 / 5.1f32.sqrt()],
            ),
            (
                "adam",
                Optimizer { kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 }, learning_rate: 0.1 },
                // t=1: m = .1 g, v = .001 g^2, lr_t = .1*sqrt(.001)/.1; step = lr_t*m/sqrt(v) = .1*sign(g)
                [0.9, 1.1],
                {
                    let lr2 = 0.1 * (1.0 - 0.999f32.powi(2)).sqrt() / (1.0 - 0.9f32.powi(2));
                    let m = [0.9 * 0.05 + 0.1 * 0.25, 0.9 * -0.1 + 0.1 * 2.0];
                    let v = [0.999 * 0.00025 + 0.001 * 0.0625, 0.999 * 0.001 + 0.001 * 4.0];
                    [0.9 - lr2 * m[0] / (v[0] as f32).sqrt(), 1.1 - lr2 * m[1] / (v[1] as f32).sqrt()]
                },
            ),
        ];
        for (name, opt, want1, want2) in cases {
            let mut w = vec![1.0f32, 1.0];
            let mut slots = opt.new_slots(2);
            opt.apply_all(&mut w, &mut slots, &g1);
            assert!(close(&w, &want1), "{name} step 1: {w:?} vs {want1:?}");
            opt.apply_all(&mut w, &mut slots, &g2);
            assert!(close(&w, &want2), "{name} step 2: {w:?} vs {want2:?}");
            // Round trip through the wire config.
            assert_eq!(Optimizer::from_proto(&opt.to_proto()).unwrap(), opt, "{name}");
        }
    }

    /// FTRL-Proximal against steps worked out by hand (lr 0.1, l1 0.05,
    /// l2 0.01, initial accumulator 0.1), one element at a time: each row is
    /// (w, n, z) before, the gradient, and (w, n, z) after.
    #[test]
    fn ftrl_by_hand() {
        let opt = Optimizer::from_name("ftrl", 0.1, 0.0).unwrap().with_regularization(0.05, 0.01).unwrap();
        #[rustfmt::skip]
        let steps: [([f32; 3], f32, [f32; 3]); 5] = [
            // n' = .1 + .25 = .35; z = 0 + .5 - (sqrt(.35) - sqrt(.1)) / .1 * 1 = .5 - 2.753802 = -2.253802;
            // w = (-.05 + 2.253802) / (sqrt(.35) / .1 + .02) = 2.203802 / 5.936080 = .3712555
            ([1.0, 0.1, 0.0], 0.5, [0.371_255_5, 0.35, -2.253_802]),
            // n' = .35 + .0625 = .4125; z = -2.253802 + .25 - (sqrt(.4125) - sqrt(.35)) / .1 * .3712555 = -2.191857;
            // w = (-.05 + 2.191857) / (sqrt(.4125) / .1 + .02) = 2.141857 / 6.442649 = .3324514
            ([0.371_255_5, 0.35, -2.253_802], 0.25, [0.332_451_4, 0.4125, -2.191_857]),
            // n' = 1.1; z = -1 - (sqrt(1.1) - sqrt(.1)) / .1 * 1 = -1 - 7.325811 = -8.325811;
            // w = (-.05 + 8.325811) / (10.488088 + .02) = .7875658
            ([1.0, 0.1, 0.0], -1.0, [0.787_565_8, 1.1, -8.325_811]),
            // |z| = .03 <= l1: the weight is exactly 0 (l1 sparsity).
            ([0.0, 0.1, 0.0], 0.03, [0.0, 0.1009, 0.03]),
            // z = .2, n' = .14: w = (.05 - .2) / (sqrt(.14) / .1 + .02) = -.15 / 3.761657 = -.03987604
            ([0.0, 0.1, 0.0], 0.2, [-0.039_876_04, 0.14, 0.2]),
        ];
        for (i, (before, g, after)) in steps.iter().enumerate() {
            let mut w = [before[0]];
            let mut slots = Slots { first: vec![before[1]], second: vec![before[2]], updates: 0 };
            opt.apply_all(&mut w, &mut slots, &[*g]);
            let got = [w[0], slots.first[0], slots.second[0]];
            assert!(close(&got, after), "step {i}: got {got:?}, want {after:?}");
        }
        // Fresh slots: the accumulator starts at initial_accumulator_value, z at 0.
        assert_eq!(opt.new_slots(2), Slots { first: vec![0.1, 0.1], second: vec![0.0, 0.0], updates: 0 });
        assert_eq!(Optimizer::from_proto(&opt.to_proto()).unwrap(), opt);
        // Other optimizers refuse regularization rather than ignore it.
        let err = Optimizer::sgd(0.1).with_regularization(0.1, 0.0).unwrap_err().to_string();
        assert!(err.contains("--l1_regularization_strength: only the ftrl optimizer regularises"), "{err}");
        assert!(opt.with_regularization(-1.0, 0.0).is_err());
    }

    /// Applying an update part by part equals applying it whole.
    #[test]
    fn parts_equal_whole() {
        let opt = Optimizer::from_name("adam", 0.01, 0.0).unwrap();
        let g: Vec<f32> = (0..10).map(|i| (i as f32 - 4.5) * 0.3).collect();
        let mut whole = vec![0.5f32; 10];
        let mut s1 = opt.new_slots(10);
        opt.apply(&mut whole, &mut s1, 0..10, &g, 1);
        let mut parts = vec![0.5f32; 10];
        let mut s2 = opt.new_slots(10);
        opt.apply(&mut parts, &mut s2, 0..3, &g[0..3], 1);
        opt.apply(&mut parts, &mut s2, 3..10, &g[3..10], 1);
        assert_eq!(whole, parts);
        assert_eq!(s1, s2);
    }

    #[test]
    fn bad_configs() {
        assert!(matches!(Optimizer::from_name("rmsprop", 0.1, 0.0), Err(OptimizerError::UnknownName(_))));
        assert!(Optimizer::from_name("sgd", 0.0, 0.0).is_err());
        assert!(Optimizer::from_name("sgd", f32::NAN, 0.0).is_err());
        assert!(Optimizer::from_name("momentum", 0.1, 1.5).is_err());
        let bad = proto::OptimizerConfig { kind: 99, learning_rate: 0.1, ..Default::default() };
        assert!(Optimizer::from_proto(&bad).is_err());
    }
}

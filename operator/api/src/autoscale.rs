//! Elastic workers that size themselves: the `elasticPolicy` of a TFJob, its checks, and the
//! built-in throughput policy ([`decide`]).
//!
//! `elasticPolicy` mirrors the fields of Kubeflow's `PyTorchJob` elasticPolicy that apply to a
//! TFJob (`minReplicas`, `maxReplicas`, `metrics`): with `metrics` the controller makes a
//! HorizontalPodAutoscaler that scales the job's `Worker` replicas through the TFJob's scale
//! subresource. `autoscale: Throughput` needs no metrics pipeline: the controller (or `tfjob
//! run`) reads the job's examples/s from ps 0 ([`crate::progress`]) and calls [`decide`], which
//! climbs while a step up pays and steps back when it did not:
//!
//! - after every change it waits `settleSeconds`, then measures the rate over at least
//!   `measureSeconds`;
//! - a step up from `m` to `n` workers pays when the rate grew by at least `minGainPercent`% of
//!   what `n - m` more workers would add at perfect scaling (`rate(m) / m * (n - m)`); then it
//!   steps up again (by half the count, at least one: 1, 2, 3, 4, 6, 9, ...);
//! - when it did not pay, it steps back to `m` and stays there `cooldownSeconds`, then measures
//!   `m` again and probes once more (the best count moves when the data or the cluster does);
//! - it never leaves `[minReplicas, maxReplicas]` (`minReplicas` is at least 1: worker 0 may be
//!   the chief), and makes no change when the job would end before the change could be measured.
//!
//! Its state is plain data ([`AutoscalerState`], kept in `status.autoscaler`), so a restarted
//! controller goes on where the last one was. A leaf beside [`crate::progress`]: it imports
//! nothing else of this crate.

use k8s_openapi::api::autoscaling::v2::MetricSpec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::field::FieldError;
use crate::progress::{Reading, short_number};

/// `spec.elasticPolicy`: bounds of the `Worker` count and what changes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticPolicy {
    /// The fewest workers (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_replicas: Option<i32>,
    /// The most workers (default: the job's `Worker` replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_replicas: Option<i32>,
    /// Metrics of a HorizontalPodAutoscaler (autoscaling/v2) that the controller makes for the
    /// job's `Worker` replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricSpec>,
    /// A built-in policy: `Throughput` (add workers while they raise the job's examples/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<Autoscale>,
    /// Settings of the `Throughput` policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<ThroughputSettings>,
}

/// The built-in policies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub enum Autoscale {
    /// Add workers while each step up raises the job's examples/s enough ([`decide`]).
    Throughput,
}

/// Settings of the `Throughput` policy (every field has a default).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputSettings {
    /// A step up pays when the rate grows by at least this share (%) of what the added workers
    /// would add at perfect scaling (default 10: throughput first, a worker stays while it adds a
    /// tenth of a worker's share; 50 keeps only workers that add half).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub min_gain_percent: Option<i32>,
    /// Seconds after a change before measuring (workers start, pull, warm up; default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub settle_seconds: Option<i32>,
    /// Seconds a measurement spans at least (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub measure_seconds: Option<i32>,
    /// Seconds to stay at the count stepped back to before probing again (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cooldown_seconds: Option<i32>,
}

/// The policy's settings with their defaults filled in, and the job's bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Fewest workers.
    pub min: i32,
    /// Most workers.
    pub max: i32,
    /// A share of 1 (0.5 for 50%).
    pub min_gain: f64,
    /// Seconds.
    pub settle: f64,
    /// Seconds.
    pub measure: f64,
    /// Seconds.
    pub cooldown: f64,
}

impl Bounds {
    /// The policy of a job whose `Worker` replicas are `replicas` (the default maximum).
    pub fn of(policy: &ElasticPolicy, replicas: i32) -> Bounds {
        let t = policy.throughput.clone().unwrap_or_default();
        let min = policy.min_replicas.unwrap_or(1).max(1);
        Bounds {
            min,
            max: policy.max_replicas.unwrap_or(replicas).max(min),
            min_gain: f64::from(t.min_gain_percent.unwrap_or(10).clamp(1, 100)) / 100.0,
            settle: f64::from(t.settle_seconds.unwrap_or(15).max(0)),
            measure: f64::from(t.measure_seconds.unwrap_or(15).max(1)),
            cooldown: f64::from(t.cooldown_seconds.unwrap_or(600).max(0)),
        }
    }

    /// The next count up from `n` (half again, at least one more), within the maximum.
    pub fn step_up(&self, n: i32) -> i32 {
        (n + (n / 2).max(1)).min(self.max)
    }
}

/// A rate measured at a worker count.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// Workers.
    pub replicas: i32,
    /// Examples (or, for a job whose data is not dispatched, steps) per second.
    pub rate: f64,
}

/// `status.autoscaler`: what the throughput policy knows (its whole state).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerState {
    /// The worker count the policy last saw or set.
    pub replicas: i32,
    /// When that count was set (seconds since the Unix epoch).
    pub since: f64,
    /// The rate at the count this one was stepped up from (absent: not stepped up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stepped_from: Option<Measured>,
    /// The last rate measured at `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<Measured>,
    /// Settled at `replicas` until then (seconds since the Unix epoch): no probing before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_until: Option<f64>,
    /// The last decision, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<String>,
}

/// What the policy asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Leave the count as it is.
    Hold,
    /// Set the `Worker` replicas to `to` (from `from`); `message` says why, with the numbers.
    Scale {
        /// The count now.
        from: i32,
        /// The count to set.
        to: i32,
        /// `Worker 4 → 6: 10.2k → 14.9k examples/s ...`.
        message: String,
    },
    /// A measurement settled the count (no change); `message` says why.
    Settle {
        /// Why, with the numbers.
        message: String,
    },
}

/// One look at a job: its bounds, its `Worker` replicas in the spec now, its readings (oldest
/// first), the time, and the seconds it has left when known.
#[derive(Clone, Copy, Debug)]
pub struct Look<'a> {
    /// The policy's bounds and settings.
    pub bounds: Bounds,
    /// The spec's `Worker` replicas.
    pub replicas: i32,
    /// Recent readings of ps 0.
    pub readings: &'a [Reading],
    /// Seconds since the Unix epoch.
    pub now: f64,
    /// Seconds the job has left at its rate (`None`: unbounded or unknown).
    pub remaining: Option<f64>,
}

/// The throughput measured at the current count: the examples (else steps) trained between
/// the first reading at least `settle` seconds after the change and the latest, when they
/// span at least `measure` seconds.
pub fn measure(bounds: &Bounds, since: f64, readings: &[Reading]) -> Option<f64> {
    let counter = |r: &Reading| r.sample.examples_trained.or(r.sample.global_step);
    let last = readings.last()?;
    let first = readings.iter().find(|r| r.at >= since + bounds.settle && counter(r).is_some())?;
    let span = last.at - first.at;
    if span < bounds.measure {
        return None;
    }
    Some((counter(last)? - counter(first)?) / span)
}

/// The policy's next move, and its new state ([`crate::autoscale`] says how it climbs).
pub fn decide(state: Option<&AutoscalerState>, look: Look<'_>) -> (AutoscalerState, Decision) {
    let b = look.bounds;
    // A count the policy did not set (the first look, or a `kubectl scale`): start from it.
    let mut st = match state {
        Some(s) if s.replicas == look.replicas => s.clone(),
        _ => look.fresh(look.replicas),
    };
    let within = look.replicas.clamp(b.min, b.max);
    if within != look.replicas {
        let message = format!("Worker {} → {within}: outside elasticPolicy's [{}, {}]", look.replicas, b.min, b.max);
        return scale(look.fresh(within), look.replicas, within, message);
    }
    let Some(rate) = measure(&b, st.since, look.readings) else {
        return (st, Decision::Hold);
    };
    let here = Measured { replicas: st.replicas, rate };
    st.measured = Some(here);
    match st.settled_until {
        Some(until) => after_cooldown(st, here, until, &look),
        None => after_step(st, here, &look),
    }
}

impl Look<'_> {
    /// The state of a count set now.
    fn fresh(&self, replicas: i32) -> AutoscalerState {
        AutoscalerState { replicas, since: self.now, ..Default::default() }
    }

    /// No change the job would not live to measure.
    fn too_late(&self) -> bool {
        self.remaining.is_some_and(|left| left < self.bounds.settle + self.bounds.measure)
    }
}

/// Settled at `here`: once the cooldown is over, probe the next count up from what it trains now.
fn after_cooldown(st: AutoscalerState, here: Measured, until: f64, look: &Look<'_>) -> (AutoscalerState, Decision) {
    let n = here.replicas;
    if look.now < until || n >= look.bounds.max || look.too_late() {
        return (st, Decision::Hold);
    }
    let to = look.bounds.step_up(n);
    let message = format!("Worker {n} → {to}: probing again after the cooldown ({} examples/s at {n})", short_number(here.rate));
    scale(AutoscalerState { stepped_from: Some(here), ..look.fresh(to) }, n, to, message)
}

/// Measured `here` after a step (or at the start): back when the step did not pay, settled at
/// the maximum or near the job's end, else up again.
fn after_step(st: AutoscalerState, here: Measured, look: &Look<'_>) -> (AutoscalerState, Decision) {
    let (b, n) = (look.bounds, here.replicas);
    let verdict = st.stepped_from.map(|from| Verdict::of(&b, from, here));
    if let Some(v) = verdict.filter(|v| !v.paid) {
        let to = v.from.replicas;
        let back = AutoscalerState { measured: Some(v.from), settled_until: Some(look.now + b.cooldown), ..look.fresh(to) };
        return scale(back, n, to, format!("Worker {n} → {to}: {}", v.describe(true)));
    }
    if n >= b.max || look.too_late() {
        let why = if n >= b.max { format!("at elasticPolicy's maxReplicas {}", b.max) } else { "the job ends before another step could be measured".into() };
        let message = match verdict {
            Some(v) => format!("Worker {n} settled: {}; {why}", v.describe(false)),
            None => format!("Worker {n} settled at {} examples/s: {why}", short_number(here.rate)),
        };
        let settled = AutoscalerState { settled_until: Some(look.now + b.cooldown), last_decision: Some(message.clone()), ..st };
        return (settled, Decision::Settle { message });
    }
    let to = b.step_up(n);
    let message = match verdict {
        Some(v) => format!("Worker {n} → {to}: {}", v.describe(false)),
        None => format!("Worker {n} → {to}: {} examples/s at {n}, trying more", short_number(here.rate)),
    };
    scale(AutoscalerState { stepped_from: Some(here), ..look.fresh(to) }, n, to, message)
}

/// The state after a change, and the change.
fn scale(mut st: AutoscalerState, from: i32, to: i32, message: String) -> (AutoscalerState, Decision) {
    st.last_decision = Some(message.clone());
    (st, Decision::Scale { from, to, message })
}

/// Whether a step up from `from` to `to` paid.
#[derive(Clone, Copy, Debug)]
struct Verdict {
    from: Measured,
    to: Measured,
    /// What perfect scaling would have added.
    perfect: f64,
    paid: bool,
}

impl Verdict {
    fn of(b: &Bounds, from: Measured, to: Measured) -> Verdict {
        let added = f64::from((to.replicas - from.replicas).max(1));
        let perfect = from.rate / f64::from(from.replicas.max(1)) * added;
        Verdict { from, to, perfect, paid: to.rate - from.rate >= b.min_gain * perfect }
    }

    /// `10.2k → 14.9k examples/s at 4 → 6 workers (+4.7k, perfect scaling +5.1k)`.
    fn describe(&self, stepping_back: bool) -> String {
        let gain = self.to.rate - self.from.rate;
        let sign = if gain >= 0.0 { "+" } else { "-" };
        let outcome = if stepping_back { "; the step up did not pay" } else { "" };
        format!(
            "{} → {} examples/s at {} → {} workers ({sign}{}, perfect scaling +{}){outcome}",
            short_number(self.from.rate),
            short_number(self.to.rate),
            self.from.replicas,
            self.to.replicas,
            short_number(gain.abs()),
            short_number(self.perfect)
        )
    }
}

/// Checks `spec.elasticPolicy` against the job's `Worker` replicas and the `tensorflow`
/// container's args of its workers (`None`: no `Worker` replica set).
pub fn check_policy(policy: &ElasticPolicy, workers: Option<(i32, &[String])>, errs: &mut Vec<FieldError>) {
    const PATH: &str = "spec.elasticPolicy";
    let Some((replicas, args)) = workers else {
        errs.push(FieldError::new(PATH, "needs a Worker replica set: it scales the job's workers"));
        return;
    };
    let min = policy.min_replicas.unwrap_or(1);
    let max = policy.max_replicas.unwrap_or(replicas);
    if min < 1 {
        errs.push(FieldError::new(format!("{PATH}.minReplicas"), format!("must be at least 1, got {min}")));
    }
    if min > max {
        errs.push(FieldError::new(PATH, format!("minReplicas {min} is more than maxReplicas {max}")));
    } else if !(min..=max).contains(&replicas) {
        errs.push(FieldError::new(PATH, format!("the Worker replicas {replicas} are outside [minReplicas {min}, maxReplicas {max}]")));
    }
    if policy.autoscale.is_some() && !policy.metrics.is_empty() {
        errs.push(FieldError::new(PATH, "give either autoscale or metrics: two autoscalers would fight over the Worker replicas"));
    }
    if (policy.autoscale.is_some() || !policy.metrics.is_empty()) && sync_with_fixed_aggregation(args) {
        errs.push(FieldError::new(
            PATH,
            "the workers train in sync mode (--sync_replicas) with a fixed --replicas_to_aggregate: its aggregation count cannot \
             follow the workers an autoscaler adds or removes; use --replicas_to_aggregate=auto",
        ));
    }
}

/// Whether `tfjob-runtime` args ask for sync training with a fixed aggregation count (a number
/// given to `--replicas_to_aggregate`; without the flag the job aggregates as its chief decides
/// at the start, which cannot follow later workers either).
pub fn sync_with_fixed_aggregation(args: &[String]) -> bool {
    let value = |names: &[&str]| -> Option<Option<String>> {
        args.iter().enumerate().find_map(|(i, a)| {
            names.iter().find_map(|n| match a.strip_prefix(n) {
                Some("") => Some(args.get(i + 1).filter(|v| !v.starts_with("--")).cloned()),
                Some(rest) => rest.strip_prefix('=').map(|v| Some(v.to_string())),
                None => None,
            })
        })
    };
    let sync = match value(&["--sync_replicas", "--sync-replicas"]) {
        Some(Some(v)) => v == "true" || v == "1",
        Some(None) => true,
        None => false,
    };
    sync && value(&["--replicas_to_aggregate", "--replicas-to-aggregate"]).flatten().is_none_or(|v| v != "auto")
}

#[cfg(test)]
mod tests;

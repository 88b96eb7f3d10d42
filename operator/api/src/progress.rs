//! A job's training progress as its status shows it (`status.trainingProgress`), from what the
//! job's own metrics endpoint says.
//!
//! ps task 0 sees every step and runs the shard dispatcher, and the workers and the evaluator
//! report their loss and held-out figures to it, so its `/metrics` page (`tfjob-runtime
//! --metrics_port`) holds the whole job's progress. Whoever runs the job (the operator, `tfjob
//! run`) reads that page now and then, feeds each reading to a [`ProgressTracker`], and writes
//! [`ProgressTracker::progress`] into the status. Everything here is pure: text and times in,
//! figures out.
//!
//! A leaf: it imports nothing of this crate.

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The span the rates are measured over (the "examples/s over the last minute").
pub const RATE_WINDOW_SECS: f64 = 60.0;

/// Readings kept: a little more than [`RATE_WINDOW_SECS`] (and whatever an autoscaler needs).
pub const HISTORY_SECS: f64 = 600.0;

/// `status.trainingProgress`: where training is, as last read from the job. Rates and
/// estimates are integers or decimal strings (no floats in an API object).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingProgress {
    /// The global step (ps 0's step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_step: Option<i64>,
    /// Epochs whose every example was trained (jobs whose data the shard dispatcher hands out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_completed: Option<i64>,
    /// The epochs the job trains (`--num_epochs`); absent when unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_epochs: Option<i64>,
    /// The step the job stops at (`--train_steps`); absent when unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_steps: Option<i64>,
    /// Examples of the shards trained so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples_trained: Option<i64>,
    /// Examples trained per second over the last minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples_per_second: Option<i64>,
    /// Global steps per second over the last minute (a decimal string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_second: Option<String>,
    /// How much of the job's bound (epochs, else steps) is done, 0-100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_percentage: Option<i32>,
    /// Seconds left at the current rate, when the job is bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_remaining_seconds: Option<i64>,
    /// The same, for people: `1h05m`, `3m20s`, `40s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_remaining_time_summary: Option<String>,
    /// The latest training loss and held-out figures (`loss`, `eval_loss`, `eval_accuracy`,
    /// `eval_auc`), values as decimal strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<ProgressMetric>,
    /// When these figures were read from the job. A reading that fails leaves the last one in
    /// place with its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated_time: Option<Time>,
}

/// One named figure of [`TrainingProgress::metrics`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ProgressMetric {
    /// `loss`, `eval_loss`, `eval_accuracy` or `eval_auc`.
    pub name: String,
    /// The value, as a decimal string.
    pub value: String,
}

/// What one read of ps 0's metrics page says (`None`: the page does not have it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgressSample {
    /// `tfjob_ps_step`.
    pub global_step: Option<f64>,
    /// `tfjob_ps_epochs_completed`.
    pub epochs_completed: Option<f64>,
    /// `tfjob_ps_num_epochs` (0: unbounded).
    pub num_epochs: Option<f64>,
    /// `tfjob_ps_examples_per_epoch`.
    pub examples_per_epoch: Option<f64>,
    /// `tfjob_ps_examples_trained_total`.
    pub examples_trained: Option<f64>,
    /// `tfjob_ps_train_steps` (0: unbounded).
    pub train_steps: Option<f64>,
    /// `tfjob_ps_workers_live`.
    pub workers_live: Option<f64>,
    /// `tfjob_ps_loss`, `tfjob_ps_eval_loss`, `tfjob_ps_eval_accuracy`, `tfjob_ps_eval_auc`
    /// by the names [`TrainingProgress::metrics`] gives them.
    pub figures: BTreeMap<&'static str, f64>,
}

/// The figures [`ProgressSample::figures`] reads: metric name, name in the status.
const FIGURES: [(&str, &str); 4] =
    [("tfjob_ps_loss", "loss"), ("tfjob_ps_eval_loss", "eval_loss"), ("tfjob_ps_eval_accuracy", "eval_accuracy"), ("tfjob_ps_eval_auc", "eval_auc")];

impl ProgressSample {
    /// Reads the figures from a Prometheus / OpenMetrics text page. Lines it does not know, or
    /// cannot read, are skipped: the page of a newer or older runtime still gives what it has.
    ///
    /// (The text format is a line per sample, `name{labels} value`; the few lines needed here
    /// do not warrant a parser crate, and the known ones are not maintained.)
    pub fn parse(text: &str) -> ProgressSample {
        let mut s = ProgressSample::default();
        for (name, value) in text.lines().filter_map(sample_line) {
            let slot = match name {
                "tfjob_ps_step" => &mut s.global_step,
                "tfjob_ps_epochs_completed" => &mut s.epochs_completed,
                "tfjob_ps_num_epochs" => &mut s.num_epochs,
                "tfjob_ps_examples_per_epoch" => &mut s.examples_per_epoch,
                "tfjob_ps_examples_trained_total" | "tfjob_ps_examples_trained" => &mut s.examples_trained,
                "tfjob_ps_train_steps" => &mut s.train_steps,
                "tfjob_ps_workers_live" => &mut s.workers_live,
                _ => {
                    if let Some((_, figure)) = FIGURES.iter().find(|(metric, _)| *metric == name) {
                        s.figures.insert(figure, value);
                    }
                    continue;
                }
            };
            *slot = Some(value);
        }
        s
    }

    /// Whether the page had any of the job's figures (a task that is not ps 0, or not a
    /// `tfjob-runtime`, has none).
    pub fn is_empty(&self) -> bool {
        *self == ProgressSample::default()
    }
}

/// `name` and value of a sample line (`name{labels} value [timestamp]`); `None` for comments,
/// blank lines and values that are not numbers.
fn sample_line(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    // After the labels (which may hold spaces inside quotes) come the value and an optional
    // timestamp.
    let rest = match line[name_end..].strip_prefix('{') {
        Some(labels) => &labels[labels.rfind('}')? + 1..],
        None => &line[name_end..],
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, value))
}

/// A reading at a time (seconds since the Unix epoch).
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// When it was read.
    pub at: f64,
    /// What it said.
    pub sample: ProgressSample,
}

/// The recent readings of one job: enough for its rates, its estimate, and the throughput
/// autoscaler ([`crate::autoscale`]).
#[derive(Clone, Debug, Default)]
pub struct ProgressTracker {
    readings: VecDeque<Reading>,
}

impl ProgressTracker {
    /// Adds a reading. Counters that went back (ps 0 restarted from an older checkpoint) start
    /// the history again: a rate across the restart would be wrong.
    pub fn record(&mut self, at: f64, sample: ProgressSample) {
        if let Some(last) = self.readings.back() {
            let went_back = |f: fn(&ProgressSample) -> Option<f64>| matches!((f(&last.sample), f(&sample)), (Some(a), Some(b)) if b < a);
            if went_back(|s| s.examples_trained) || went_back(|s| s.global_step) || at < last.at {
                self.readings.clear();
            }
        }
        self.readings.push_back(Reading { at, sample });
        while self.readings.front().is_some_and(|r| r.at < at - HISTORY_SECS) {
            self.readings.pop_front();
        }
    }

    /// The readings kept, oldest first.
    pub fn readings(&self) -> impl DoubleEndedIterator<Item = &Reading> + '_ {
        self.readings.iter()
    }

    /// The latest reading.
    pub fn latest(&self) -> Option<&Reading> {
        self.readings.back()
    }

    /// The rate of a counter over the last [`RATE_WINDOW_SECS`] (at least two readings that
    /// have it, at least one second apart).
    fn rate(&self, counter: fn(&ProgressSample) -> Option<f64>) -> Option<f64> {
        let last = self.readings.back()?;
        let end = counter(&last.sample)?;
        let first = self.readings.iter().find(|r| r.at >= last.at - RATE_WINDOW_SECS && counter(&r.sample).is_some())?;
        let span = last.at - first.at;
        if span < 1.0 {
            return None;
        }
        Some((end - counter(&first.sample)?) / span)
    }

    /// Examples trained per second over the last minute.
    pub fn examples_per_second(&self) -> Option<f64> {
        self.rate(|s| s.examples_trained)
    }

    /// Global steps per second over the last minute.
    pub fn steps_per_second(&self) -> Option<f64> {
        self.rate(|s| s.global_step)
    }

    /// The status figures of the latest reading (`None` before the first).
    pub fn progress(&self) -> Option<TrainingProgress> {
        let last = self.readings.back()?;
        let s = &last.sample;
        let int = |v: Option<f64>| v.map(|v| v.round() as i64);
        let bounded = |v: Option<f64>| v.filter(|n| *n > 0.0).map(|v| v.round() as i64);
        let mut p = TrainingProgress {
            global_step: int(s.global_step),
            epochs_completed: int(s.epochs_completed),
            num_epochs: bounded(s.num_epochs),
            train_steps: bounded(s.train_steps),
            examples_trained: int(s.examples_trained),
            examples_per_second: int(self.examples_per_second()),
            steps_per_second: self.steps_per_second().map(|r| format!("{r:.2}")),
            metrics: s.figures.iter().map(|(name, v)| ProgressMetric { name: name.to_string(), value: format!("{v:.4}") }).collect(),
            last_updated_time: Timestamp::from_millisecond((last.at * 1000.0) as i64).ok().map(Time),
            ..Default::default()
        };
        if let Some(left) = self.remaining(s) {
            p.progress_percentage = Some((left.done * 100.0).clamp(0.0, 100.0).floor() as i32);
            if let Some(secs) = left.seconds {
                p.estimated_remaining_seconds = Some(secs.round() as i64);
                p.estimated_remaining_time_summary = Some(duration_summary(secs));
            }
        }
        Some(p)
    }

    /// How much of the job's bound is done, and the seconds left at the recent rate: by
    /// examples when it trains a number of epochs, else by steps when it has `--train_steps`.
    pub fn remaining(&self, s: &ProgressSample) -> Option<Remaining> {
        let by_epochs = || {
            let total = s.num_epochs.filter(|n| *n > 0.0)? * s.examples_per_epoch.filter(|n| *n > 0.0)?;
            Some((s.examples_trained?, total, self.examples_per_second()))
        };
        let by_steps = || Some((s.global_step?, s.train_steps.filter(|n| *n > 0.0)?, self.steps_per_second()));
        let (done, total, rate) = by_epochs().or_else(by_steps)?;
        let left = (total - done).max(0.0);
        let seconds = match rate {
            _ if left == 0.0 => Some(0.0),
            Some(r) if r > 0.0 => Some(left / r),
            _ => None,
        };
        Some(Remaining { done: done / total, seconds })
    }
}

/// The share of a bounded job that is done, and the time left ([`ProgressTracker::remaining`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Remaining {
    /// 0 to 1.
    pub done: f64,
    /// Seconds left at the recent rate (`None`: no rate yet).
    pub seconds: Option<f64>,
}

/// `2h05m`, `3m20s`, `40s`.
pub fn duration_summary(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `12.3k`, `4.5M`, `870`: a rate for a status line or an Event.
pub fn short_number(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        _ => format!("{v:.0}"),
    }
}

#[cfg(test)]
mod tests;

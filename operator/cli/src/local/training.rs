//! The picture of training that `tfjob run` leaves in the run directory
//! (`training.png`): loss, and accuracy or AUC, of every replica against
//! the global step, and the job's global steps per second.
//!
//! It is read from what the replicas print, as they print it: the
//! runtime's progress lines (`global_step=200 loss=0.31`, the evaluator's
//! `eval_loss=` / `eval_accuracy=`, `auc=`) and the final JSON line of each
//! task. The time of a point is when `tfjob run` read its line.

use std::collections::BTreeMap;
use std::path::Path;

use crate::plot::{Chart, Figure, Plot, PlotError, Series};

/// The figures a line may carry, as logged (`key=value`) and in the final JSON.
const KEYS: [&str; 6] = ["loss", "accuracy", "auc", "eval_loss", "eval_accuracy", "eval_auc"];

/// What one line says about training: the global step and figures at it.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub step: i64,
    pub figures: Vec<(&'static str, f64)>,
}

/// The number at the start of `s` (a value of `key=value`, maybe followed by a quote or comma).
fn leading_number(s: &str) -> Option<f64> {
    let end = s.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))).unwrap_or(s.len());
    s[..end].parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The progress a line of a replica's output reports, if any: a progress
/// line with `global_step=N` and figures, or the final JSON report.
pub fn progress_in(line: &str) -> Option<Progress> {
    let line = line.trim();
    if line.starts_with('{')
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(line)
        && let Some(step) = v.get("global_step").and_then(|s| s.as_i64())
    {
        // The evaluator's final figures are held-out ones, as its progress lines say.
        let evaluator = v.get("role").and_then(|r| r.as_str()) == Some("evaluator");
        let figures: Vec<(&'static str, f64)> = KEYS
            .iter()
            .filter_map(|k| {
                let value = v.get(*k)?.as_f64()?;
                let key = if evaluator && !k.starts_with("eval_") { KEYS.iter().find(|e| e.strip_prefix("eval_") == Some(k))? } else { k };
                Some((*key, value))
            })
            .collect();
        return (!figures.is_empty()).then_some(Progress { step, figures });
    }
    let mut step = None;
    let mut figures = Vec::new();
    for token in line.split(|c: char| c.is_whitespace() || c == '"') {
        let Some((key, value)) = token.split_once('=') else {
            continue;
        };
        if key == "global_step" {
            step = leading_number(value).map(|v| v as i64);
        } else if let Some(k) = KEYS.iter().find(|k| **k == key) {
            figures.extend(leading_number(value).map(|v| (*k, v)));
        }
    }
    Some(Progress { step: step?, figures }).filter(|p| !p.figures.is_empty())
}

/// The largest `global_step=N` in a line, if any (the runtime's log lines
/// and final JSON carry it).
pub fn global_step_in(line: &str) -> Option<i64> {
    let mut best = None;
    for key in ["global_step=", "\"global_step\":"] {
        for rest in line.split(key).skip(1) {
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(v) = digits.parse::<i64>() {
                best = Some(best.map_or(v, |b: i64| b.max(v)));
            }
        }
    }
    best
}

/// One figure of one replica at a global step, and when it was read (seconds into the run).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub secs: f64,
    pub step: i64,
    pub key: &'static str,
    pub value: f64,
}

/// Every sample of a run, by replica.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingRecord {
    pub samples: BTreeMap<String, Vec<Sample>>,
    /// `(seconds into the run, global step)` of every line with a global step.
    pub steps: Vec<(f64, i64)>,
}

impl TrainingRecord {
    /// Records what a replica's line says, read at `secs` into the run.
    pub fn line(&mut self, replica: &str, line: &str, secs: f64) {
        if let Some(step) = global_step_in(line) {
            self.steps.push((secs, step));
        }
        if let Some(p) = progress_in(line) {
            let samples = self.samples.entry(replica.to_string()).or_default();
            samples.extend(p.figures.into_iter().map(|(key, value)| Sample { secs, step: p.step, key, value }));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// `replica: figure` series of the samples whose key is one of `keys`.
    fn series(&self, keys: &[&str]) -> Vec<Series> {
        let mut out = Vec::new();
        for (replica, samples) in &self.samples {
            for key in keys {
                let points: Vec<(f64, f64)> = samples.iter().filter(|s| s.key == *key).map(|s| (s.step as f64, s.value)).collect();
                if !points.is_empty() {
                    let label = if key.starts_with("eval_") { format!("{replica} (held-out)") } else { replica.clone() };
                    out.push(Series { label, points });
                }
            }
        }
        out
    }

    /// The picture: loss; accuracy or AUC when some replica logged them;
    /// global steps per second.
    pub fn figure(&self, job: &str) -> Figure {
        let mut charts = vec![Chart {
            title: "Loss".into(),
            x_label: "global step".into(),
            y_label: "loss (per replica's batches; held-out for eval)".into(),
            plot: Plot::Lines(self.series(&["loss", "eval_loss"])),
        }];
        for (name, keys) in [("Accuracy", ["accuracy", "eval_accuracy"]), ("AUC", ["auc", "eval_auc"])] {
            let series = self.series(&keys);
            if !series.is_empty() {
                charts.push(Chart {
                    title: name.into(),
                    x_label: "global step".into(),
                    y_label: format!("{} (fraction)", name.to_lowercase()),
                    plot: Plot::Lines(series),
                });
            }
        }
        charts.push(Chart {
            title: "Training speed".into(),
            x_label: "global step".into(),
            y_label: "global steps/s".into(),
            plot: Plot::Lines(vec![Series { label: "job".into(), points: steps_per_sec(&self.steps, rate_window(&self.steps)) }]),
        });
        Figure { title: format!("TFJob {job}: training under tfjob run"), columns: 2, charts }
    }

    /// Draws [`TrainingRecord::figure`] to `path`.
    pub fn write_png(&self, job: &str, path: &Path) -> Result<(), PlotError> {
        crate::plot::write_png(&self.figure(job), path, (1400, 900))
    }
}

/// Global steps per second against the global step, from `(seconds, step)`
/// observations: the job's step is the largest seen so far; a rate is taken
/// over each stretch of at least `window` seconds. The time after the last
/// step (replicas finishing) is left out.
pub fn steps_per_sec(observations: &[(f64, i64)], window: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut high = i64::MIN;
    let mut from: Option<(f64, i64)> = None;
    for &(secs, step) in observations {
        high = high.max(step);
        match from {
            None => from = Some((secs, high)),
            Some((t0, s0)) if secs - t0 >= window => {
                out.push((high as f64, (high - s0) as f64 / (secs - t0)));
                from = Some((secs, high));
            }
            Some(_) => {}
        }
    }
    while out.last().is_some_and(|p| p.1 == 0.0) {
        out.pop();
    }
    out
}

/// A window for [`steps_per_sec`]: about 20 rates over the training, none
/// shorter than 50 ms.
pub fn rate_window(observations: &[(f64, i64)]) -> f64 {
    let high = observations.iter().map(|o| o.1).max().unwrap_or(0);
    let first = observations.first().map_or(0.0, |o| o.0);
    let end = observations.iter().find(|o| o.1 == high).map_or(first, |o| o.0);
    ((end - first) / 20.0).max(0.05)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_of_lines() {
        let cases: [(&str, Option<Progress>); 8] = [
            (
                "2024-01-01T00:00:00Z  INFO worker:0: local_step=100 global_step=205 loss=0.3100 W=1.9 b=9.8",
                Some(Progress { step: 205, figures: vec![("loss", 0.31)] }),
            ),
            (
                "INFO evaluator:0: global_step=400 eval_loss=0.5000 eval_accuracy=0.8125",
                Some(Progress { step: 400, figures: vec![("eval_loss", 0.5), ("eval_accuracy", 0.8125)] }),
            ),
            (
                r#"{"task":"worker:0","global_step":4000,"loss":0.25,"accuracy":0.9,"W":2.0}"#,
                Some(Progress { step: 4000, figures: vec![("loss", 0.25), ("accuracy", 0.9)] }),
            ),
            (r#"{"task":"ps:0","role":"ps","global_step":4000}"#, None),
            (
                r#"{"task":"evaluator:0","role":"evaluator","global_step":1200,"loss":0.5,"accuracy":0.8}"#,
                Some(Progress { step: 1200, figures: vec![("eval_loss", 0.5), ("eval_accuracy", 0.8)] }),
            ),
            ("ps:0: serving on 127.0.0.1:2222", None),
            ("worker:0: global_step=10 loss=NaN", None),
            (r#"{"fields":{"message":"worker:1: local_step=5 global_step=9 loss=1.5"}}"#, Some(Progress { step: 9, figures: vec![("loss", 1.5)] })),
        ];
        for (line, want) in cases {
            assert_eq!(progress_in(line), want, "{line}");
        }
    }

    #[test]
    fn rates_over_windows_of_the_highest_step() {
        let obs = [(0.0, 0), (0.5, 50), (1.0, 100), (1.2, 90), (2.0, 300), (2.5, 310), (3.0, 400)];
        assert_eq!(steps_per_sec(&obs, 1.0), vec![(100.0, 100.0), (300.0, 200.0), (400.0, 100.0)]);
        assert!(steps_per_sec(&[], 1.0).is_empty());
        // Nothing after the last step: replicas finishing are not a rate of 0.
        assert_eq!(steps_per_sec(&[(0.0, 0), (1.0, 100), (2.0, 100), (3.0, 100)], 1.0), vec![(100.0, 100.0)]);
        assert_eq!(rate_window(&[(0.0, 0), (4.0, 400), (100.0, 400)]), 0.2);
        assert_eq!(rate_window(&[(0.0, 0), (0.1, 10)]), 0.05);
    }

    #[test]
    fn the_figure_has_a_chart_per_kind_of_figure() {
        let mut r = TrainingRecord::default();
        r.line("worker-0", "worker:0: local_step=1 global_step=1 loss=2.0", 0.1);
        r.line("worker-0", "worker:0: local_step=2 global_step=100 loss=1.0", 1.5);
        r.line("evaluator-0", "evaluator:0: global_step=100 eval_loss=1.1 eval_accuracy=0.7", 1.6);
        r.line("ps-0", "ps:0: training is over at step 100", 2.0);
        let f = r.figure("j");
        let titles: Vec<&str> = f.charts.iter().map(|c| c.title.as_str()).collect();
        assert_eq!(titles, ["Loss", "Accuracy", "Training speed"]);
        let Plot::Lines(loss) = &f.charts[0].plot else { panic!() };
        let labels: Vec<&str> = loss.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["evaluator-0 (held-out)", "worker-0"]);
        assert_eq!(loss[1].points, vec![(1.0, 2.0), (100.0, 1.0)]);
    }

    #[test]
    fn global_steps_in_lines() {
        for (line, want) in [
            ("worker:1: local_step=100 global_step=205 loss=0.1", Some(205)),
            ("{\"global_step\":4000,\"W\":2.0}", Some(4000)),
            ("ps:0: serving on 127.0.0.1:2222", None),
            ("global_step=x", None),
        ] {
            assert_eq!(global_step_in(line), want, "{line}");
        }
    }
}

//! `--plot-tf FILE`: the picture of a side-by-side run against TensorFlow
//! (`benchmarks/tf/compare.py` writes `tf-compare.json`; this draws it, since the script keeps to
//! Python's standard library). One chart per workload, each on its own scale (linear's single
//! process makes millions of examples/s, wide_deep's hundreds of thousands): for every
//! configuration ours next to TensorFlow's, and a red mark at our single process, the limit the
//! distributed runs are measured against.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use tfjob::plot::{Bars, Chart, Figure, Plot};

/// One row of `tf-compare.json`'s `summary`: a workload in one configuration, medians of the rounds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SummaryRow {
    pub workload: String,
    /// `single`, `async` or `sync` (compare.py's `CONFIGS`).
    pub config: String,
    pub ours_examples_per_sec: Option<f64>,
    pub tf_examples_per_sec: Option<f64>,
    pub ours_single_examples_per_sec: Option<f64>,
}

/// The configurations in the order drawn, with their labels (compare.py's `CONFIG_LABELS`).
const CONFIGS: [(&str, &str); 3] = [("single", "1 process"), ("async", "1 ps + 2 async"), ("sync", "1 ps + 2 sync")];

/// The workloads in the order they first appear.
fn workloads(rows: &[SummaryRow]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.workload.as_str()) {
            names.push(&r.workload);
        }
    }
    names
}

/// "ours / TF" per configuration, for the chart's title: `6.4x, 14.6x, 13.9x`.
fn ratios(rows: &[&SummaryRow]) -> String {
    let ratio = |r: &&SummaryRow| match (r.ours_examples_per_sec, r.tf_examples_per_sec) {
        (Some(o), Some(t)) if t > 0.0 => format!("{:.1}x", o / t),
        _ => "-".into(),
    };
    rows.iter().map(ratio).collect::<Vec<_>>().join(", ")
}

/// One workload's chart: categories are the configurations it has.
fn workload_chart(name: &str, rows: &[SummaryRow]) -> Chart {
    let (labels, of): (Vec<String>, Vec<&SummaryRow>) =
        CONFIGS.iter().filter_map(|(c, label)| Some((label.to_string(), rows.iter().find(|r| r.workload == name && r.config == *c)?))).unzip();
    let value = |v: Option<f64>| v.unwrap_or(f64::NAN);
    Chart {
        title: format!("{name}: ours / TF {}", ratios(&of)),
        x_label: "configuration".into(),
        y_label: "examples/s".into(),
        plot: Plot::Bars {
            categories: labels,
            bars: vec![
                Bars { label: "tfjob-rs".into(), values: of.iter().map(|r| value(r.ours_examples_per_sec)).collect(), grey: false },
                Bars { label: "TensorFlow".into(), values: of.iter().map(|r| value(r.tf_examples_per_sec)).collect(), grey: true },
            ],
            marks: Some(("tfjob-rs in one process (the limit)".into(), of.iter().map(|r| value(r.ours_single_examples_per_sec)).collect())),
        },
    }
}

/// The whole picture: a chart per workload, in the order of the rows.
pub fn figure(rows: &[SummaryRow], tensorflow: &str) -> Figure {
    let charts: Vec<Chart> = workloads(rows).into_iter().map(|w| workload_chart(w, rows)).collect();
    Figure {
        title: format!("tfjob-rs against TensorFlow {tensorflow} side by side, and the single-process limit (examples/s, medians of the rounds)"),
        columns: charts.len().clamp(1, 4),
        charts,
    }
}

/// Reads `json` (compare.py's `tf-compare.json`) and draws it to `png` (default: beside it,
/// `tf-compare.png`). Returns the picture's path.
pub fn plot_tf(json: &Path, png: Option<PathBuf>) -> Result<PathBuf> {
    let text = std::fs::read(json).with_context(|| format!("reading {}", json.display()))?;
    let doc: serde_json::Value = serde_json::from_slice(&text).with_context(|| format!("{}: not JSON", json.display()))?;
    let rows: Vec<SummaryRow> = serde_json::from_value(doc["summary"].clone()).with_context(|| format!("{}: its summary", json.display()))?;
    anyhow::ensure!(!rows.is_empty(), "{}: no summary rows (did the run measure anything?)", json.display());
    let tensorflow = doc["meta"]["tensorflow"].as_str().unwrap_or("2.x");
    let png = png.unwrap_or_else(|| json.with_file_name("tf-compare.png"));
    let figure = figure(&rows, tensorflow);
    tfjob::plot::write_png(&figure, &png, (600 * figure.columns as u32, 600)).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(png)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &str, config: &str, ours: Option<f64>, tf: Option<f64>, single: Option<f64>) -> SummaryRow {
        SummaryRow {
            workload: workload.into(),
            config: config.into(),
            ours_examples_per_sec: ours,
            tf_examples_per_sec: tf,
            ours_single_examples_per_sec: single,
        }
    }

    #[test]
    fn a_chart_per_workload_with_ours_tf_and_the_limit() {
        let rows = vec![
            row("sparse_lr", "single", Some(1_500_000.0), Some(240_000.0), Some(1_500_000.0)),
            row("sparse_lr", "async", Some(1_000_000.0), Some(80_000.0), Some(1_500_000.0)),
            row("sparse_lr", "sync", Some(900_000.0), None, Some(1_500_000.0)),
            row("mlp", "async", Some(150_000.0), Some(25_000.0), None),
        ];
        let f = figure(&rows, "2.20.0");
        assert_eq!(f.columns, 2);
        assert_eq!(f.charts.len(), 2);
        assert_eq!(f.charts[0].title, "sparse_lr: ours / TF 6.2x, 12.5x, -");
        let Plot::Bars { categories, bars, marks } = &f.charts[0].plot else { panic!("bars") };
        assert_eq!(categories, &["1 process", "1 ps + 2 async", "1 ps + 2 sync"]);
        assert_eq!(bars[0].values, [1_500_000.0, 1_000_000.0, 900_000.0]);
        assert_eq!(bars[1].values[..2], [240_000.0, 80_000.0]);
        assert!(bars[1].values[2].is_nan() && bars[1].grey);
        assert_eq!(marks.as_ref().unwrap().1, [1_500_000.0; 3]);
        // A workload with one configuration measured: one category, no limit known.
        let Plot::Bars { categories, marks, .. } = &f.charts[1].plot else { panic!("bars") };
        assert_eq!(categories, &["1 ps + 2 async"]);
        assert!(marks.as_ref().unwrap().1[0].is_nan());
        assert_eq!(f.charts[1].title, "mlp: ours / TF 6.0x");
    }

    #[test]
    fn the_script_s_summary_reads_and_draws() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("tf-compare.json");
        let doc = serde_json::json!({
            "meta": {"tensorflow": "2.20.0"},
            "summary": [
                {"workload": "linear", "config": "single", "ours_examples_per_sec": 900000.0, "tf_examples_per_sec": 4000.0,
                 "ours_single_examples_per_sec": 900000.0, "tf_single_examples_per_sec": 4000.0, "ours_quality": {"loss": 0.1}},
                {"workload": "linear", "config": "async", "ours_examples_per_sec": 30000.0, "tf_examples_per_sec": null,
                 "ours_single_examples_per_sec": 900000.0, "tf_single_examples_per_sec": 4000.0}
            ]
        });
        std::fs::write(&json, doc.to_string()).unwrap();
        let png = plot_tf(&json, None).unwrap();
        assert_eq!(png, dir.path().join("tf-compare.png"));
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        std::fs::write(&json, r#"{"meta": {}, "summary": []}"#).unwrap();
        let e = plot_tf(&json, None).unwrap_err().to_string();
        assert!(e.contains("no summary rows"), "{e}");
    }
}

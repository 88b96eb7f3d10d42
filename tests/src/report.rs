//! What a training replica reports: `tfjob-runtime` ends its output with one JSON line
//! (`global_step`, `loss`, the linear model's `W` and `b`, `accuracy`, ...). The end-to-end tests
//! read it from wherever the replica's log went (a run directory, the node agent's files).

use anyhow::{Context, Result, anyhow, ensure};
use serde_json::Value;

/// The last JSON line of a replica's log.
pub fn final_report(log: &str, who: &str) -> Result<Value> {
    let line = log.lines().rev().find(|l| l.starts_with('{')).ok_or_else(|| anyhow!("{who}: no final report in its log:\n{log}"))?;
    serde_json::from_str(line).with_context(|| format!("{who}: {line}"))
}

/// The linear regression of the examples (y = 2x + 10) converged: `W` within 0.1 of 2 and `b`
/// within 0.1 of 10.
pub fn ensure_linear(report: &Value, who: &str) -> Result<()> {
    let (w, b) = (report["W"].as_f64().unwrap_or(f64::NAN), report["b"].as_f64().unwrap_or(f64::NAN));
    ensure!((w - 2.0).abs() < 0.1 && (b - 10.0).abs() < 0.1, "{who}: W = {w}, b = {b}");
    Ok(())
}

/// The global step at which a ps saw training end (its log's `training is over at step N`,
/// written when the chief ends training; no update is applied after it).
pub fn final_step_of_ps(log: &str, who: &str) -> Result<i64> {
    log.lines()
        .find_map(|l| l.split("training is over at step ").nth(1)?.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("{who}: no `training is over at step N` in its log:\n{log}"))
}

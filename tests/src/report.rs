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

/// The linear regression of the examples converged: `W` and `b` within 0.1 of the least-squares
/// line through the examples the jobs train on (y = 2x + 10 plus noise, `tfjob-runtime`'s default
/// seed). That line, W = 2.05 and b = 10.00, is where SGD goes, not the line the noise was added
/// to: checked against (2, 10), a run that had come as close to the data's line as usual could be
/// refused (W = 2.1006 in a CI run, 0.05 above it).
pub fn ensure_linear(report: &Value, who: &str) -> Result<()> {
    let (w, b) = (report["W"].as_f64().unwrap_or(f64::NAN), report["b"].as_f64().unwrap_or(f64::NAN));
    let (fit_w, fit_b) = least_squares_line(&tfjob_runtime::data::synthetic_line(tfjob_runtime::train::DEFAULT_SEED));
    ensure!(
        (w - fit_w).abs() < 0.1 && (b - fit_b).abs() < 0.1,
        "{who}: W = {w}, b = {b}; the least-squares line of its examples is W = {fit_w:.4}, b = {fit_b:.4}"
    );
    Ok(())
}

/// Slope and intercept of the least-squares line through a dataset of one input and one value.
fn least_squares_line(data: &tfjob_runtime::data::Dataset) -> (f64, f64) {
    let xs: Vec<f64> = data.x().column(0).iter().map(|&v| f64::from(v)).collect();
    let tfjob_runtime::data::Targets::Values(y) = data.targets() else { panic!("the line's targets are values") };
    let ys: Vec<f64> = y.column(0).iter().map(|&v| f64::from(v)).collect();
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let slope = sxy / sxx;
    (slope, my - slope * mx)
}

/// The global step at which a ps saw training end (its log's `training is over at step N`,
/// written when the chief ends training; no update is applied after it).
pub fn final_step_of_ps(log: &str, who: &str) -> Result<i64> {
    log.lines()
        .find_map(|l| l.split("training is over at step ").nth(1)?.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("{who}: no `training is over at step N` in its log:\n{log}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_linear_check_measures_from_the_least_squares_line_of_the_examples() {
        let (w, b) = least_squares_line(&tfjob_runtime::data::synthetic_line(tfjob_runtime::train::DEFAULT_SEED));
        assert!((w - 2.0).abs() < 0.1 && (b - 10.0).abs() < 0.1, "the examples lie along y = 2x + 10: W = {w}, b = {b}");
        // (W, b, passes?)
        let cases = [
            (w, b, true),
            (w + 0.09, b - 0.09, true),
            (w + 0.11, b, false),
            (w, b + 0.11, false),
            (2.1006, 9.9877, true),
            (1.9, 10.0, false),
            (f64::NAN, b, false),
        ];
        for (cw, cb, ok) in cases {
            assert_eq!(ensure_linear(&json!({"W": cw, "b": cb}), "w0").is_ok(), ok, "W = {cw}, b = {cb} (fit {w}, {b})");
        }
    }
}

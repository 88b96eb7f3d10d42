//! Katib reads a trial's metrics from the output of the pod labelled
//! `training.kubeflow.org/job-role: master` with its StdOut collector's default filter. This
//! renders `examples/katib/experiment.yaml`'s trial template as Katib would (its
//! `${trialParameters...}` filled in), trains that TFJob with `tfjob run`, and reads the chief's
//! real output the way Katib's collector does (v0.19.0,
//! `pkg/metricscollector/v1beta1/file-metricscollector`): `loss` at every log step and at the
//! end, `accuracy` at the end, each a number, each line's timestamp readable, the last values
//! the job's final ones.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, ensure};
use jiff::Timestamp;
use regex::Regex;
use serde_json::Value;
use tfjob_tests::local::{tfjob, write};
use tfjob_tests::operator::repo_root;
use tfjob_tests::report::final_report;

/// Katib's default metrics filter (`pkg/metricscollector/v1beta1/common/const.go`).
const KATIB_FILTER: &str = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)";

/// One observation as Katib's collector records it: the line's timestamp (when its first
/// word is one), the metric's name and its value as text.
#[derive(Debug)]
struct Observation {
    at: Option<Timestamp>,
    name: String,
    value: String,
}

/// What Katib's text parser keeps of `log` for metrics `names`: lines that contain one of the
/// names, every match of the filter on such a line whose name is exactly a wanted one.
fn katib_observations(log: &str, names: &[&str]) -> Vec<Observation> {
    let filter = Regex::new(KATIB_FILTER).expect("Katib's filter compiles");
    let mut out = Vec::new();
    for line in log.lines().filter(|l| names.iter().any(|n| l.contains(n))) {
        let at = line.split(' ').next().and_then(|w| w.parse::<Timestamp>().ok());
        for m in filter.captures_iter(line) {
            let name = m[1].trim();
            if names.contains(&name) {
                out.push(Observation { at, name: name.to_string(), value: m[2].trim().to_string() });
            }
        }
    }
    out
}

#[test]
fn katibs_filter_reads_only_exact_names_and_numbers() {
    let log = "2026-01-01T00:00:00Z  INFO chief:0: local_step=250 global_step=462 loss=0.6953\n\
               eval_loss=0.1 my-loss=0.2\n\
               chief:0: finished: loss=5e-1 accuracy=0.8003";
    let got: Vec<(bool, String, String)> = katib_observations(log, &["loss", "accuracy"]).into_iter().map(|o| (o.at.is_some(), o.name, o.value)).collect();
    let want = [(true, "loss", "0.6953"), (false, "loss", "5e-1"), (false, "accuracy", "0.8003")];
    assert_eq!(got, want.map(|(t, n, v)| (t, n.to_string(), v.to_string())));
}

/// The Experiment's trial template as Katib hands it to the cluster: its parameters filled in,
/// named like a trial.
fn rendered_trial(learning_rate: &str, batch_size: &str) -> Result<String> {
    let path = repo_root().join("examples/katib/experiment.yaml");
    let text = std::fs::read_to_string(&path)?;
    let experiment: Value = serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let params: Vec<&str> =
        experiment["spec"]["trialTemplate"]["trialParameters"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    ensure!(params == ["learningRate", "batchSize"], "trial parameters: {params:?}");
    ensure!(experiment["spec"]["trialTemplate"]["primaryPodLabels"]["training.kubeflow.org/job-role"] == "master", "{experiment:#}");
    let mut trial = experiment["spec"]["trialTemplate"]["trialSpec"].clone();
    trial["metadata"] = serde_json::json!({ "name": "tfjob-softmax-random-trial-1" });
    let rendered = serde_json::to_string(&trial)?.replace("${trialParameters.learningRate}", learning_rate).replace("${trialParameters.batchSize}", batch_size);
    ensure!(!rendered.contains("${trialParameters."), "a parameter left in the trial: {rendered}");
    Ok(rendered)
}

#[test]
fn the_katib_example_trial_trains_and_its_master_prints_what_katib_collects() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let manifest = write(dir.path(), "trial.json", &rendered_trial("0.3", "64")?);
    let run_dir = dir.path().join("run");
    let out = Command::new(tfjob()?).arg("run").arg(&manifest).arg("--run-dir").arg(&run_dir).stdin(Stdio::null()).output()?;
    let log = std::fs::read_to_string(run_dir.join("chief-0.log")).unwrap_or_default();
    ensure!(out.status.success(), "tfjob run failed:\n{}\n{}\nchief:\n{log}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let seen = katib_observations(&log, &["loss", "accuracy"]);
    let of = |name: &str| -> Vec<&Observation> { seen.iter().filter(|o| o.name == name).collect() };
    // 1,500 steps logged every 250 local steps by the chief, and once at the end.
    ensure!(of("loss").len() >= 2 && of("accuracy").len() == 1, "Katib would see {seen:#?} in:\n{log}");
    for o in &seen {
        let v: f64 = o.value.parse().with_context(|| format!("{o:?} is not a number"))?;
        ensure!(v.is_finite() && o.at.is_some(), "{o:?}: Katib stores it with no timestamp or as no number");
    }
    let report = final_report(&log, "chief-0")?;
    let last = |name: &str| -> Result<f64> { Ok(of(name).last().ok_or_else(|| anyhow!("no {name}"))?.value.parse()?) };
    for name in ["loss", "accuracy"] {
        let want = report[name].as_f64().ok_or_else(|| anyhow!("the report has no {name}: {report}"))?;
        ensure!((last(name)? - want).abs() < 1e-4, "the last {name} Katib reads is {}, the job's final {want}", last(name)?);
    }
    Ok(())
}

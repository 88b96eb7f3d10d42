//! The Keras example (`examples/keras/mnist-cnn.yaml`, a model given by the JSON of Keras's
//! `model.to_json()`) trains under `tfjob run` from the repository root, as `examples/README.md`
//! says. It lives beside the top-level examples rather than among them because on a cluster it
//! needs a ConfigMap (see the manifest).

use std::process::{Command, Stdio};

use anyhow::{Result, ensure};

use tfjob_tests::operator::{repo_root, tfjob_binary};
use tfjob_tests::report::final_report;

#[test]
fn keras_example_trains_under_tfjob_run() -> Result<()> {
    let run_dir = tempfile::tempdir()?;
    let out = Command::new(tfjob_binary()?)
        .current_dir(repo_root())
        .args(["run", "examples/keras/mnist-cnn.yaml", "--quiet", "--run-dir"])
        .arg(run_dir.path())
        .stdin(Stdio::null())
        .output()?;
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "tfjob run examples/keras/mnist-cnn.yaml failed:\n{text}");
    let log = std::fs::read_to_string(run_dir.path().join("worker-0.log"))?;
    ensure!(log.contains("Keras model \"mnist_cnn\""), "the worker read the Keras model:\n{log}");
    ensure!(log.contains("no --data_dir given: using synthetic data shaped for the model"), "says it uses synthetic data:\n{log}");
    let report = final_report(&log, "worker-0")?;
    ensure!(report["global_step"].as_i64() == Some(600), "{report}");
    // 10 classes: chance is 0.1; the example's README says about 0.7.
    let accuracy = report["accuracy"].as_f64().unwrap_or(0.0);
    ensure!(accuracy > 0.5, "held-out accuracy {accuracy}: {report}");
    // Every replica's log ends with its JSON line, worker-1's too when the job's end stops it.
    for replica in ["worker-1", "ps-0", "ps-1"] {
        final_report(&std::fs::read_to_string(run_dir.path().join(format!("{replica}.log")))?, replica)?;
    }
    Ok(())
}

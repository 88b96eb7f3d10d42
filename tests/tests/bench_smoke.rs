//! Smoke test of `tfjob-bench --quick`: keeps the benchmark command from rotting. It checks that
//! every section runs and writes its figures, the JSON and the plot; it asserts nothing about
//! speed (speed is what `tfjob-bench` itself reports, see BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A `tfjob-runtime` binary for the bench to start: `$TFJOB_RUNTIME_BIN`, else one already built
/// in this target directory (release first), else a debug build into `<target>/bench-smoke-cargo`
/// (a separate target directory: the running `cargo test` holds the lock of its own).
fn runtime_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TFJOB_RUNTIME_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/<test binary>
    let target = exe.parent().and_then(Path::parent).and_then(Path::parent).expect("<target>/<profile>/deps");
    for profile in ["release", "debug"] {
        let bin = target.join(profile).join("tfjob-runtime");
        if bin.is_file() {
            return bin;
        }
    }
    let own = target.join("bench-smoke-cargo");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "-p", "tfjob-runtime", "--bin", "tfjob-runtime"])
        .env("CARGO_TARGET_DIR", &own)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building tfjob-runtime for the bench smoke test failed");
    own.join("debug").join("tfjob-runtime")
}

#[test]
fn quick_bench_runs_every_section_and_writes_json_and_plot() {
    let runtime = runtime_binary();
    let out = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let result = Command::new(env!("CARGO_BIN_EXE_tfjob-bench"))
        .args(["--quick", "--out"])
        .arg(out.path())
        .env("TFJOB_RUNTIME_BIN", &runtime)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "tfjob-bench --quick failed:\n{stdout}\n{}", String::from_utf8_lossy(&result.stderr));
    eprintln!("{stdout}\n(--quick took {:.1} s)", started.elapsed().as_secs_f64());

    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("bench.json")).unwrap()).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    for section in ["raw", "ps", "linear", "mlp", "startup", "elastic", "elastic-ps", "operator", "sparse", "autoscale mlp gain 50%"] {
        let of: Vec<_> = rows.iter().filter(|r| r["section"] == section).collect();
        assert!(!of.is_empty(), "no {section} figures in bench.json");
        for r in of {
            let ours = r["ours"].as_f64().unwrap_or(f64::NAN);
            assert!(ours.is_finite() && ours >= 0.0, "{section}: {} is {ours}", r["metric"]);
        }
    }
    // Every distributed figure comes with the baseline measured in the same run.
    for r in rows.iter().filter(|r| r["target"].as_str().is_some_and(|t| t.contains("loopback") || t.contains("2 x TF"))) {
        assert!(r["baseline"].as_f64().is_some_and(f64::is_finite), "{} has no baseline", r["metric"]);
    }
    // Sparse figures are each against the dense embedding measured beside them.
    for r in rows.iter().filter(|r| r["section"] == "sparse") {
        assert!(r["baseline"].as_f64().is_some_and(f64::is_finite), "{} has no baseline", r["metric"]);
    }
    let png = std::fs::read(out.path().join("scaling.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "scaling.png is not a PNG");

    // A bad argument is a clear error, not a run.
    let bad = Command::new(env!("CARGO_BIN_EXE_tfjob-bench")).args(["--only", "nope"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown section \"nope\""));
}

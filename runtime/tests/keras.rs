//! Keras models trained by separate `tfjob-runtime` processes (2 ps + 2
//! workers) on data the tests write (IDX images, CSV), then exported,
//! predicted and evaluated with the subcommands, and checked against a
//! NumPy forward pass of the exported weights (python3 with numpy; the test
//! fails, saying so, when numpy is missing: `tests/run.sh` installs it).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

mod common;

use common::*;

/// Side of the test images.
const SIDE: usize = 12;

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/keras").join(name).display().to_string()
}

/// A small deterministic generator (the tests' data must not depend on a crate's RNG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` 12x12 images of 4 classes: a bright 3x3 blob somewhere in quadrant
/// `class` over dim noise. Returns (pixels, labels).
fn blob_images(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Lcg(seed);
    let mut pixels = Vec::with_capacity(n * SIDE * SIDE);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        let class = rng.below(4) as usize;
        let mut img: Vec<u8> = (0..SIDE * SIDE).map(|_| rng.below(60) as u8).collect();
        let (r0, c0) = (rng.below(4) as usize + 6 * (class / 2), rng.below(4) as usize + 6 * (class % 2));
        for r in r0..(r0 + 3).min(SIDE) {
            for c in c0..(c0 + 3).min(SIDE) {
                img[r * SIDE + c] = 200 + rng.below(56) as u8;
            }
        }
        pixels.extend(img);
        labels.push(class as u8);
    }
    (pixels, labels)
}

fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    dims.iter().for_each(|d| out.extend_from_slice(&d.to_be_bytes()));
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// The four MNIST-named files of 12x12 blob images: 2,000 to train (gzipped), 300 held out (plain).
fn write_blob_idx(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let side = SIDE as u32;
    let (train, train_labels) = blob_images(2000, 7);
    let (test, test_labels) = blob_images(300, 8);
    std::fs::write(dir.join("train-images-idx3-ubyte.gz"), gzip(&idx(&[2000, side, side], &train))).unwrap();
    std::fs::write(dir.join("train-labels-idx1-ubyte.gz"), gzip(&idx(&[2000], &train_labels))).unwrap();
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), idx(&[300, side, side], &test)).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte"), idx(&[300], &test_labels)).unwrap();
}

/// Starts `num_ps` ps and `workers` workers with the classic flags and `args`; waits for all.
fn train(num_ps: usize, workers: usize, args: &[String], limit: Duration) -> Vec<Finished> {
    let ports = free_ports(num_ps + workers);
    let (ps_hosts, worker_hosts) = (hosts(&ports[..num_ps]), hosts(&ports[num_ps..]));
    let mut job = Job::new();
    for (job_name, count) in [("ps", num_ps), ("worker", workers)] {
        for i in 0..count {
            let mut a = vec![
                format!("--ps_hosts={ps_hosts}"),
                format!("--worker_hosts={worker_hosts}"),
                format!("--job_name={job_name}"),
                format!("--task_index={i}"),
                "--bind=127.0.0.1".into(),
            ];
            a.extend_from_slice(args);
            job.spawn(&format!("{job_name}{i}"), &a, &[]);
        }
    }
    let results = job.wait_all(limit);
    assert_all_ok(&results);
    results
}

fn report_of(results: &[Finished], name: &str) -> Value {
    results.iter().find(|r| r.name == name).unwrap().report()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("TF_CONFIG").env_remove("TFJOB_TOKEN").output().unwrap()
}

fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "{args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The numbers of a CSV's data lines (after the header), column by column from `skip`.
fn csv_rows(text: &str, skip: usize) -> Vec<Vec<f64>> {
    text.lines().skip(1).map(|l| l.split(',').skip(skip).map(|v| v.parse().unwrap()).collect()).collect()
}

/// Runs `script` with python3 and numpy; fails the test, saying why, when they are missing.
fn python_numpy(script: &str, args: &[&str]) -> String {
    let probe = Command::new("python3").args(["-c", "import numpy"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "this test needs numpy for python3 (`python3 -m pip install --user numpy`; tests/run.sh installs it): {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("this test needs python3 with numpy: {e}"),
    }
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "python3 failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A forward pass of the CNN fixture (Conv2D 3x3 relu, MaxPooling2D 2,
/// Flatten, Dense softmax) in NumPy from the exported weights, on the
/// images of an IDX file: prints the shapes of the arrays as JSON, then the
/// probabilities as CSV.
const NUMPY_CNN: &str = r#"
import json, sys
import numpy as np
w = np.load(sys.argv[1])
print(json.dumps({k: list(w[k].shape) for k in w.files}))
raw = open(sys.argv[2], "rb").read()
n, h, wd = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
x = np.frombuffer(raw, np.uint8, offset=16).reshape(n, h, wd, 1).astype(np.float32) / 255.0
k, b = w["conv2d/kernel"], w["conv2d/bias"]
oh, ow = h - 2, wd - 2
conv = np.zeros((n, oh, ow, k.shape[3]), np.float32)
for i in range(3):
    for j in range(3):
        conv += np.einsum("nhwc,cf->nhwf", x[:, i:i + oh, j:j + ow, :], k[i, j])
conv = np.maximum(conv + b, 0.0)
pooled = conv[:, :oh // 2 * 2, :ow // 2 * 2, :].reshape(n, oh // 2, 2, ow // 2, 2, -1).max(axis=(2, 4))
z = pooled.reshape(n, -1) @ w["dense/kernel"] + w["dense/bias"]
p = np.exp(z - z.max(axis=1, keepdims=True))
p /= p.sum(axis=1, keepdims=True)
np.savetxt(sys.stdout, p, delimiter=",", fmt="%.8g")
"#;

#[test]
fn keras_cnn_over_two_ps_and_two_workers_then_export_predict_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("blobs");
    write_blob_idx(&data);
    let ckpt = dir.path().join("ckpt");
    let model = fixture("cnn.keras3.json");
    let args: Vec<String> = vec![
        format!("--keras_model={model}"),
        format!("--data_dir={}", data.display()),
        format!("--checkpoint_dir={}", ckpt.display()),
        "--save_checkpoint_steps=100".into(),
        "--sync_replicas".into(),
        "--learning_rate=0.1".into(),
        "--train_steps=250".into(),
        "--log_every_steps=50".into(),
        // dense/kernel (3,200 bytes) is cut over both ps: export joins it again.
        "--partition_threshold_bytes=1000".into(),
    ];
    let results = train(2, 2, &args, Duration::from_secs(180));
    let chief = report_of(&results, "worker0");
    let accuracy = chief["accuracy"].as_f64().unwrap();
    // 4 classes: chance is 0.25.
    assert!(accuracy > 0.9, "held-out accuracy {accuracy}: {chief}");
    let mut stored: Vec<String> = ["ps0", "ps1"]
        .iter()
        .flat_map(|ps| {
            let rep = report_of(&results, ps);
            rep["variables"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect::<Vec<_>>()
        })
        .collect();
    stored.sort();
    assert_eq!(stored, ["conv2d/bias", "conv2d/kernel", "dense/bias", "dense/kernel/part_0", "dense/kernel/part_1"]);

    // Export: one array per variable, in Keras's shapes.
    let npz = dir.path().join("weights.npz");
    let exported: Value = serde_json::from_str(run_ok(&["export", "--checkpoint_dir", ckpt.to_str().unwrap(), "--out", npz.to_str().unwrap()]).trim()).unwrap();
    let want_shapes = serde_json::json!({"conv2d/kernel": [3, 3, 1, 8], "conv2d/bias": [8], "dense/kernel": [200, 4], "dense/bias": [4]});
    assert_eq!(exported["arrays"], want_shapes, "{exported}");
    assert_eq!(exported["global_step"], 250);

    // Predict on the held-out IDX images, evaluate with their labels.
    let images = data.join("t10k-images-idx3-ubyte");
    let labels = data.join("t10k-labels-idx1-ubyte");
    let common = ["--checkpoint_dir", ckpt.to_str().unwrap(), "--keras_model", &model, "--input", images.to_str().unwrap()];
    let predictions = run_ok(&[&["predict"], &common[..]].concat());
    assert!(predictions.starts_with("class,p_0,p_1,p_2,p_3\n"), "{}", &predictions[..100.min(predictions.len())]);
    let rows = csv_rows(&predictions, 0);
    assert_eq!(rows.len(), 300);
    let evaluation: Value = serde_json::from_str(run_ok(&[&["evaluate"], &common[..], &["--labels", labels.to_str().unwrap()]].concat()).trim()).unwrap();
    assert_eq!(evaluation["examples"], 300);
    assert!(evaluation["accuracy"].as_f64().unwrap() > 0.9, "{evaluation}");
    let label_bytes = std::fs::read(&labels).unwrap();
    let correct = rows.iter().zip(&label_bytes[8..]).filter(|(r, l)| r[0] as u8 == **l).count();
    assert_eq!(correct as f64 / 300.0, evaluation["accuracy"].as_f64().unwrap(), "predict's classes and evaluate's accuracy agree");

    // NumPy, from the exported arrays alone, computes the same probabilities.
    let numpy = python_numpy(NUMPY_CNN, &[npz.to_str().unwrap(), images.to_str().unwrap()]);
    let (shapes, probs) = numpy.split_once('\n').unwrap();
    assert_eq!(serde_json::from_str::<Value>(shapes).unwrap(), want_shapes);
    let numpy_rows: Vec<Vec<f64>> = probs.lines().map(|l| l.split(',').map(|v| v.parse().unwrap()).collect()).collect();
    assert_eq!(numpy_rows.len(), 300);
    for (i, (ours, theirs)) in rows.iter().zip(&numpy_rows).enumerate() {
        for (a, b) in ours[1..].iter().zip(theirs) {
            assert!((a - b).abs() < 1e-5, "example {i}: runtime {ours:?}, numpy {theirs:?}");
        }
    }
}

#[test]
fn keras_mlp_with_dropout_over_two_ps_and_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("blobs");
    write_blob_idx(&data);
    let args: Vec<String> = vec![
        format!("--keras_model={}", fixture("mlp.keras2.json")),
        format!("--data_dir={}", data.display()),
        "--optimizer=adam".into(),
        "--learning_rate=0.003".into(),
        "--train_steps=300".into(),
        "--log_every_steps=100".into(),
    ];
    let results = train(2, 2, &args, Duration::from_secs(180));
    let chief = report_of(&results, "worker0");
    assert!(chief["accuracy"].as_f64().unwrap() > 0.9, "{chief}");
    assert!(chief["global_step"].as_i64().unwrap() >= 300, "{chief}");
    for ps in ["ps0", "ps1"] {
        let rep = report_of(&results, ps);
        assert!(!rep["variables"].as_array().unwrap().is_empty(), "{ps} holds variables: {rep}");
    }
    let log = &results.iter().find(|r| r.name == "worker0").unwrap().stderr;
    assert!(log.contains("hidden (Dense) -> [32] hidden/kernel [144, 32]"), "the model is described in the log:\n{}", tail(log, 3000));
}

/// `n` rows of 4 features in 3 classes (the arg-max of 3 linear scores), plus an id column.
fn tabular_csv(n: usize, seed: u64, with_labels: bool) -> String {
    let mut rng = Lcg(seed);
    let mut out = String::from(if with_labels { "id,f0,f1,species,f2,f3\n" } else { "id,f0,f1,f2,f3\n" });
    let t = [[1.0, -1.0, 0.5], [0.5, 1.0, -1.0], [-1.0, 0.5, 1.0], [0.3, -0.2, 0.1]];
    for i in 0..n {
        let f: Vec<f64> = (0..4).map(|_| rng.below(2000) as f64 / 1000.0 - 1.0).collect();
        let score = |c: usize| (0..4).map(|j| f[j] * t[j][c]).sum::<f64>();
        let class = (0..3).fold(0, |b, c| if score(c) > score(b) { c } else { b });
        if with_labels {
            out += &format!("{i},{:.3},{:.3},{class},{:.3},{:.3}\n", f[0], f[1], f[2], f[3]);
        } else {
            out += &format!("{i},{:.3},{:.3},{:.3},{:.3}\n", f[0], f[1], f[2], f[3]);
        }
    }
    out
}

#[test]
fn csv_with_three_classes_trains_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tabular");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("train.csv.gz"), gzip(tabular_csv(3000, 1, true).as_bytes())).unwrap();
    std::fs::write(data.join("test.csv"), tabular_csv(500, 2, true)).unwrap();
    let ckpt = dir.path().join("ckpt");
    let model = fixture("tabular.keras2.json");
    let data_flags = ["--data_format=csv", "--label_column=species", "--feature_columns=f0,f1,f2,f3"];
    let mut args: Vec<String> = vec![
        format!("--keras_model={model}"),
        format!("--data_dir={}", data.display()),
        format!("--checkpoint_dir={}", ckpt.display()),
        "--optimizer=adam".into(),
        "--learning_rate=0.01".into(),
        "--train_steps=400".into(),
    ];
    args.extend(data_flags.iter().map(|s| s.to_string()));
    let results = train(2, 2, &args, Duration::from_secs(180));
    let chief = report_of(&results, "worker0");
    assert!(chief["accuracy"].as_f64().unwrap() > 0.9, "{chief}");

    let test = data.join("test.csv");
    let common = ["--checkpoint_dir", ckpt.to_str().unwrap(), "--keras_model", &model];
    let evaluation: Value =
        serde_json::from_str(run_ok(&[&["evaluate"], &common[..], &["--input", test.to_str().unwrap()], &data_flags[..]].concat()).trim()).unwrap();
    assert_eq!(evaluation["examples"], 500);
    assert!(evaluation["accuracy"].as_f64().unwrap() > 0.9, "{evaluation}");
    // Predict on a file without labels: the same classes as the labelled copy.
    let unlabelled = dir.path().join("new.csv");
    std::fs::write(&unlabelled, tabular_csv(500, 2, false)).unwrap();
    let predictions =
        run_ok(&[&["predict"], &common[..], &["--input", unlabelled.to_str().unwrap(), "--label_column=species", "--feature_columns=f0,f1,f2,f3"]].concat());
    assert!(predictions.starts_with("class,p_0,p_1,p_2\n"));
    let classes: Vec<usize> = csv_rows(&predictions, 0).iter().map(|r| r[0] as usize).collect();
    let truth: Vec<usize> = tabular_csv(500, 2, true).lines().skip(1).map(|l| l.split(',').nth(3).unwrap().parse().unwrap()).collect();
    let agree = classes.iter().zip(&truth).filter(|(a, b)| a == b).count() as f64 / 500.0;
    assert!((agree - evaluation["accuracy"].as_f64().unwrap()).abs() < 1e-9, "{agree} vs {evaluation}");
}

/// A built-in model is a preset usable after training: an mlp trained on a CSV with 3 classes
/// (the class count from the data, not MNIST's 10) exports Keras's names and shapes, and
/// `predict`/`evaluate` run it from `--model mlp --hidden_units ...`.
#[test]
fn built_in_mlp_on_three_classes_then_export_predict_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tabular");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("train.csv"), tabular_csv(3000, 3, true)).unwrap();
    std::fs::write(data.join("test.csv"), tabular_csv(500, 4, true)).unwrap();
    let ckpt = dir.path().join("ckpt");
    let data_flags = ["--data_format=csv", "--label_column=species", "--feature_columns=f0,f1,f2,f3"];
    let mlp = ["--model=mlp", "--hidden_units=16", "--activation=tanh"];
    let mut args: Vec<String> = vec![
        format!("--data_dir={}", data.display()),
        format!("--checkpoint_dir={}", ckpt.display()),
        "--optimizer=adam".into(),
        "--learning_rate=0.02".into(),
        "--train_steps=300".into(),
    ];
    args.extend(mlp.iter().chain(&data_flags).map(|s| s.to_string()));
    let results = train(1, 2, &args, Duration::from_secs(180));
    let chief = results.iter().find(|r| r.name == "worker0").unwrap();
    assert!(chief.stderr.contains("4 features, 3 classes, from"), "the classes come from the data: {}", chief.stderr);
    let accuracy = chief.report()["accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.85, "{}", chief.report());

    let out = dir.path().join("weights.npz");
    let export: Value = serde_json::from_str(run_ok(&["export", "--checkpoint_dir", ckpt.to_str().unwrap(), "--out", out.to_str().unwrap()]).trim()).unwrap();
    let shapes: Vec<(String, Value)> = export["arrays"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let want = [("dense/bias", json!([16])), ("dense/kernel", json!([4, 16])), ("dense_1/bias", json!([3])), ("dense_1/kernel", json!([16, 3]))];
    assert_eq!(shapes, want.map(|(k, v)| (k.to_string(), v)).to_vec(), "{export}");

    let test = data.join("test.csv");
    let common = [&["--checkpoint_dir", ckpt.to_str().unwrap(), "--input", test.to_str().unwrap()][..], &mlp[..], &data_flags[..]].concat();
    let evaluation: Value = serde_json::from_str(run_ok(&[&["evaluate"], &common[..]].concat()).trim()).unwrap();
    assert_eq!(evaluation["examples"], 500);
    assert!((evaluation["accuracy"].as_f64().unwrap() - accuracy).abs() < 0.05, "{evaluation} vs the chief's {accuracy}");
    let predictions = run_ok(&[&["predict"], &common[..]].concat());
    assert!(predictions.starts_with("class,p_0,p_1,p_2\n"), "{predictions}");
    let classes: Vec<usize> = csv_rows(&predictions, 0).iter().map(|r| r[0] as usize).collect();
    let truth: Vec<usize> = tabular_csv(500, 4, true).lines().skip(1).map(|l| l.split(',').nth(3).unwrap().parse().unwrap()).collect();
    let agree = classes.iter().zip(&truth).filter(|(a, b)| a == b).count() as f64 / 500.0;
    assert!((agree - evaluation["accuracy"].as_f64().unwrap()).abs() < 1e-9, "{agree} vs {evaluation}");
    // The model flags must be those of training: the checkpoint says when they are not.
    let out = run(&[&["predict"], &common[..]].concat().iter().map(|a| if *a == "--hidden_units=16" { "--hidden_units=32" } else { a }).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && stderr.contains("dense/kernel has shape [4, 16] but the model's is [4, 32]"), "{stderr}");
    let out = run(&[&["evaluate"], &common[..], &["--num_classes=5"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && stderr.contains("--num_classes: 5, but the model's output has 3 unit(s)"), "{stderr}");
}

/// Flags a model cannot use, models it cannot compute and data that does
/// not fit: exit 2 with a message naming what is wrong.
#[test]
fn unusable_flags_models_and_data_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("blobs");
    write_blob_idx(&data);
    let d = format!("--data_dir={}", data.display());
    let k = |name: &str| format!("--keras_model={}", fixture(name));
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (vec!["--model=linear".into(), d.clone()], vec!["--data_dir", "linear model"]),
        (vec!["--model=mlp".into(), "--label_column=y".into()], vec!["--label_column", "needs --data_dir"]),
        (vec!["--model=mlp".into(), d.clone(), "--label_column=y".into()], vec!["--label_column", "--data_format=csv"]),
        (vec!["--model=mlp".into(), "--loss=mse".into()], vec!["--loss", "goes with --keras_model"]),
        (vec!["--model=mlp".into(), d.clone(), "--data_format=parquet".into()], vec!["--data_format", "parquet"]),
        (vec![k("unsupported_layer.keras3.json"), d.clone()], vec!["unsupported_layer.keras3.json", "batch_norm", "BatchNormalization"]),
        (vec![k("unsupported_option.keras2.json"), d.clone()], vec!["dilated", "dilation_rate"]),
        (vec![k("tabular.keras3.json"), d.clone()], vec!["train-images-idx3-ubyte.gz", "144 features"]),
        (vec![k("all_layers.keras3.json"), d.clone()], vec!["train-images-idx3-ubyte", "12x12", "9x8x2"]),
        (vec![k("cnn.keras3.json"), d.clone(), "--loss=binary_crossentropy".into()], vec!["must end in sigmoid"]),
        (vec![k("cnn.keras3.json"), d.clone(), "--loss=hinge".into()], vec!["--loss", "hinge"]),
        (vec![k("embedding.keras3.json")], vec!["--data_dir", "needs data"]),
        (vec![format!("--keras_model={}", dir.path().join("nowhere.json").display())], vec!["nowhere.json", "cannot read"]),
        // Flags of the mlp's hidden layers, with a model that has none or its own.
        (vec![k("cnn.keras3.json"), d.clone(), "--hidden_units=32".into()], vec!["--hidden_units", "Keras model"]),
        (vec![k("cnn.keras3.json"), d.clone(), "--activation=relu".into()], vec!["--activation", "Keras model"]),
        (vec!["--model=softmax".into(), "--activation=relu".into()], vec!["--activation", "softmax model has no hidden layers"]),
        (vec!["--model=linear".into(), "--weight_init=normal".into()], vec!["--weight_init", "linear model"]),
        (vec!["--hidden_units=8".into()], vec!["--hidden_units", "linear model"]),
        // --num_classes against the Keras model's output units.
        (vec![k("cnn.keras3.json"), d.clone(), "--num_classes=10".into()], vec!["--num_classes: 10, but the model's output has 4 unit(s)"]),
    ];
    for (args, wants) in cases {
        let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for want in wants {
            assert!(stderr.contains(want), "{args:?}: {stderr:?} lacks {want:?}");
        }
    }
    // Subcommands: a checkpoint directory without checkpoints, a model whose variables it lacks.
    let empty = dir.path().join("empty");
    let out = run(&["export", "--checkpoint_dir", empty.to_str().unwrap(), "--out", dir.path().join("w.npz").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no complete checkpoint"), "{out:?}");
    let images = data.join("t10k-images-idx3-ubyte");
    let out =
        run(&["evaluate", "--checkpoint_dir", empty.to_str().unwrap(), "--keras_model", &fixture("cnn.keras3.json"), "--input", images.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("without labels"), "{out:?}");
    // predict and evaluate: flags their input or model cannot use.
    let csv = dir.path().join("in.csv");
    std::fs::write(&csv, "a,b,label\n1,2,0\n").unwrap();
    let (images, labels, csv) = (images.to_str().unwrap(), data.join("t10k-labels-idx1-ubyte"), csv.to_str().unwrap());
    let labels = labels.to_str().unwrap();
    let cnn = fixture("cnn.keras3.json");
    let ckpt = ["--checkpoint_dir", empty.to_str().unwrap()];
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["evaluate", "--keras_model", &cnn, "--input", csv, "--labels", labels], vec!["--labels", "is CSV", "--label_column"]),
        (vec!["predict", "--keras_model", &cnn, "--input", images, "--labels", labels], vec!["--labels", "goes with evaluate"]),
        (vec!["evaluate", "--keras_model", &cnn, "--input", images, "--labels", labels, "--label_column=y"], vec!["--label_column", "is IDX"]),
        (vec!["predict", "--keras_model", &cnn, "--input", images, "--feature_columns=a,b"], vec!["--feature_columns", "is IDX"]),
        (vec!["predict", "--keras_model", &cnn, "--model=mlp", "--input", images], vec!["--model", "both name a model"]),
        (vec!["predict", "--input", images], vec!["--keras_model: missing", "--model linear|softmax|mlp"]),
        (vec!["predict", "--keras_model", &cnn, "--hidden_units=8", "--input", images], vec!["--hidden_units", "Keras model"]),
        (vec!["predict", "--model=softmax", "--activation=relu", "--input", images], vec!["--activation", "softmax model"]),
        (vec!["predict", "--model=mlp", "--loss=mse", "--input", images], vec!["--loss", "goes with --keras_model"]),
        (vec!["evaluate", "--model=linear", "--num_classes=3", "--input", csv], vec!["--num_classes", "linear"]),
        (vec!["evaluate", "--keras_model", &cnn, "--num_classes=3", "--input", images, "--labels", labels], vec!["--num_classes: 3", "unit(s)"]),
    ];
    for (args, wants) in cases {
        let out = run(&[&args[..1], &ckpt[..], &args[1..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for want in wants {
            assert!(stderr.contains(want), "{args:?}: {stderr:?} lacks {want:?}");
        }
    }
}

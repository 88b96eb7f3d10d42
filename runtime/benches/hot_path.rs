//! Hot-path micro-benchmarks of the runtime: gradient accumulation straight from received bytes
//! (aligned and unaligned buffers), tensor encode/decode per MiB, placement of 10,000 variables,
//! the TLS record layer's sealing and opening per MiB, and one training step (forward +
//! backward) of a small Keras CNN.
//!
//! `cargo bench -p tfjob-runtime --bench hot_path` (numbers in BENCHMARKS.md).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tfjob_runtime::placement::{self, PlacementInput};
use tfjob_runtime::sync::SyncAccumulator;
use tfjob_runtime::tensor;

const MIB: usize = 1 << 20;
const FLOATS_PER_MIB: usize = MIB / 4;

/// 1 MiB of little-endian f32 bytes starting at a 4-byte aligned address (`offset` 0) or one
/// byte past it (`offset` 1), as a received buffer can be.
fn received(offset: usize) -> Vec<u8> {
    let values: Vec<f32> = (0..FLOATS_PER_MIB).map(|i| (i % 97) as f32 * 0.25).collect();
    let mut buf = vec![0u8; MIB + offset];
    buf[offset..].copy_from_slice(bytemuck::cast_slice(&values));
    buf
}

fn accumulate(c: &mut Criterion) {
    let mut g = c.benchmark_group("accumulate_1MiB");
    g.throughput(Throughput::Bytes(MIB as u64));
    for (name, offset) in [("aligned", 0usize), ("unaligned", 1)] {
        let buf = received(offset);
        // Vec<u8> from the global allocator is at least 8-byte aligned, so offset 0 is aligned.
        let bytes = &buf[offset..];
        assert_eq!((bytes.as_ptr() as usize).is_multiple_of(4), offset == 0);
        let mut dst = vec![0.0f32; FLOATS_PER_MIB];
        g.bench_function(format!("add_f32_from_le/{name}"), |b| b.iter(|| tensor::add_f32_from_le(black_box(&mut dst), black_box(bytes))));
        // The sync accumulator's path: one worker's gradient (two parts) into a fresh step.
        let half = FLOATS_PER_MIB / 2;
        g.bench_function(format!("sync_accumulator_add/{name}"), |b| {
            b.iter_batched_ref(
                || SyncAccumulator::new(&[FLOATS_PER_MIB], 2, 0),
                |acc| {
                    let parts = [(0..half, &bytes[..half * 4]), (half..FLOATS_PER_MIB, &bytes[half * 4..])];
                    black_box(acc.add(0, "worker:0", &parts))
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn encode_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("tensor_1MiB");
    g.throughput(Throughput::Bytes(MIB as u64));
    let a = ndarray::ArrayD::from_shape_vec(vec![256, 1024], (0..FLOATS_PER_MIB).map(|i| i as f32).collect()).unwrap();
    g.bench_function("encode/tensor_from_array", |b| b.iter(|| black_box(tensor::tensor_from_array(black_box(&a)))));
    let t = tensor::tensor_from_array(&a);
    g.bench_function("decode/array_from_tensor", |b| b.iter(|| black_box(tensor::array_from_tensor(black_box(&t)).unwrap())));
    g.bench_function("encode/split_into_parts_64KiB", |b| {
        b.iter(|| {
            let content = tensor::f32_to_bytes(a.as_slice().unwrap());
            black_box(tensor::split_into_parts("w", &[256, 1024], content, 64 << 10).count())
        })
    });
    g.finish();
}

/// The TLS record layer on 1 MiB (64 records of 16 KiB): sealing (one copy into the records,
/// then AES-128-GCM in place) and opening (AES-128-GCM in place, then the copy out), against a
/// plain copy of the same bytes.
/// Each library's AES-128-GCM at each direction, against a plain copy: what
/// `Cipher::fastest` picks from (sealing copies the bytes into the records;
/// opening copies them out).
fn tls_records(c: &mut Criterion) {
    use tfjob_runtime::tls_records::{self as records, Cipher, RecordKey, Suite};
    let key = |cipher| RecordKey::from_raw(Suite::Aes128Gcm, cipher, &[7; 16], [9; 12], 0).unwrap();
    let plaintext = received(0);
    let mut g = c.benchmark_group("tls_records_1MiB");
    g.throughput(Throughput::Bytes(MIB as u64));
    let mut dst = vec![0u8; MIB];
    g.bench_function("baseline/memcpy", |b| b.iter(|| dst.copy_from_slice(black_box(&plaintext))));
    for (name, cipher) in [("ring", Cipher::Ring), ("aws-lc", Cipher::AwsLc)] {
        let mut sealer = key(cipher);
        let mut wire = Vec::with_capacity(MIB + 64 * 64);
        g.bench_function(format!("seal_all/aes128gcm/{name}"), |b| {
            b.iter(|| {
                wire.clear();
                records::seal_all(&mut sealer, records::APPLICATION_DATA, black_box(&plaintext), &mut wire).unwrap();
            })
        });
        let mut sealed = Vec::new();
        records::seal_all(&mut key(cipher), records::APPLICATION_DATA, &plaintext, &mut sealed).unwrap();
        g.bench_function(format!("open_and_copy_out/aes128gcm/{name}"), |b| {
            b.iter_batched_ref(
                || (sealed.clone(), key(cipher)),
                |(wire, opener)| {
                    let (mut at, mut out) = (0, 0);
                    while at < wire.len() {
                        let len = records::whole_record(&wire[at..]).unwrap().unwrap();
                        let (_, range) = records::open(opener, &mut wire[at..at + len]).unwrap();
                        dst[out..out + range.len()].copy_from_slice(&wire[at..][range.clone()]);
                        (at, out) = (at + len, out + range.len());
                    }
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn placement_10k(c: &mut Criterion) {
    let inputs: Vec<PlacementInput> =
        (0..10_000).map(|i| PlacementInput::dense(format!("layer_{:05}/kernel", i), vec![1 + i % 300, 1 + (i * 7) % 128])).collect();
    let mut g = c.benchmark_group("placement");
    g.throughput(Throughput::Elements(inputs.len() as u64));
    for num_ps in [1usize, 4, 16] {
        g.bench_function(format!("place_10000_vars/{num_ps}ps"), |b| {
            b.iter(|| black_box(placement::place(black_box(&inputs), num_ps, placement::DEFAULT_PARTITION_THRESHOLD_BYTES).unwrap()))
        });
    }
    g.finish();
}

/// Loss and gradients of one batch of 32 MNIST-sized images through Conv2D(32, 3x3, relu) ->
/// MaxPooling2D(2) -> Flatten -> Dense(10, softmax): im2col and one matrix product per conv.
fn keras_cnn_step(c: &mut Criterion) {
    use tfjob_runtime::data::{Batch, Targets};
    use tfjob_runtime::model::keras::{KerasModel, Loss, parse_model_json};
    use tfjob_runtime::model::{Model, init_values};
    let json = r#"{"class_name": "Sequential", "config": {"name": "cnn", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28, 1], "name": "in"}},
        {"class_name": "Conv2D", "config": {"name": "conv2d", "filters": 32, "kernel_size": [3, 3], "activation": "relu"}},
        {"class_name": "MaxPooling2D", "config": {"name": "pool", "pool_size": [2, 2]}},
        {"class_name": "Flatten", "config": {"name": "flatten"}},
        {"class_name": "Dense", "config": {"name": "dense", "units": 10, "activation": "softmax"}}]}}"#;
    let model = KerasModel::new(&parse_model_json(json).unwrap(), Loss::SparseCategoricalCrossentropy, false, 1).unwrap();
    let params = init_values(&model.variables(), 1);
    let x = ndarray::Array2::from_shape_fn((32, 784), |(i, j)| ((i * 31 + j * 7) % 255) as f32 / 255.0);
    let batch = Batch { x, targets: Targets::Labels((0..32).map(|i| i % 10).collect()), sparse: None };
    let mut g = c.benchmark_group("keras");
    g.throughput(Throughput::Elements(32));
    g.bench_function("cnn_step/conv2d_32x3x3_28x28_batch32", |b| b.iter(|| black_box(model.loss_and_gradients(black_box(&params), black_box(&batch)))));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = accumulate, encode_decode, tls_records, placement_10k, keras_cnn_step
}
criterion_main!(benches);

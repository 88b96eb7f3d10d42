//! What a reconcile pays to read its job's pods from the watch cache, against the number of
//! pods the operator watches: looked up by job (`Caches::pods_of`, the index kept beside the
//! store) against a walk over every cached pod (what `pods_of` did before the index, measured
//! here in the same run as the baseline).
//!
//! `cargo bench -p tfjob-operator --bench pods_of` (numbers in BENCHMARKS.md).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use tfjob_api::api::TFJob;
use tfjob_api::plan;
use tfjob_operator::controller::cache::Caches;
use tfjob_operator::controller::pod_index::pod_cache;

const PODS_PER_JOB: usize = 5;

fn job(i: usize) -> TFJob {
    let mut job = TFJob::new(&format!("job-{i}"), Default::default());
    job.metadata.namespace = Some("default".into());
    job.metadata.uid = Some(format!("uid-{i}"));
    job
}

fn pod_of(job: &TFJob, index: usize) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.namespace = job.metadata.namespace.clone();
    pod.metadata.name = Some(format!("{}-worker-{index}", job.name_any()));
    pod.labels_mut().insert(plan::LABEL_JOB_NAME.into(), job.name_any());
    pod.labels_mut().insert(plan::LABEL_OPERATOR_NAME.into(), plan::OPERATOR_NAME.into());
    pod.metadata.owner_references = Some(vec![OwnerReference { uid: job.metadata.uid.clone().unwrap(), ..Default::default() }]);
    pod
}

/// The caches filled with the pods of `jobs` jobs, and the store they are in.
fn caches(jobs: usize) -> (Caches, Store<Pod>) {
    let (pods, mut writer) = pod_cache();
    let (services, mut service_writer) = reflector::store::<Service>();
    writer.apply_watcher_event(&Event::Init);
    for i in 0..jobs {
        let job = job(i);
        for index in 0..PODS_PER_JOB {
            writer.apply_watcher_event(&Event::InitApply(pod_of(&job, index)));
        }
    }
    writer.apply_watcher_event(&Event::InitDone);
    service_writer.apply_watcher_event(&Event::InitDone);
    let store = pods.store.clone();
    (Caches::new(pods, services), store)
}

/// The baseline: every cached pod walked and filtered, as `pods_of` did before the index.
fn walk(store: &Store<Pod>, job: &TFJob) -> Vec<Arc<Pod>> {
    let ns = job.namespace();
    let uid = job.metadata.uid.as_deref();
    store
        .state()
        .into_iter()
        .filter(|p| p.namespace() == ns)
        .filter(|p| p.labels().get(plan::LABEL_JOB_NAME).map(String::as_str) == Some(job.name_any().as_str()))
        .filter(|p| uid.is_none() || p.owner_references().iter().any(|o| Some(o.uid.as_str()) == uid))
        .collect()
}

/// Time of one call of `f`, the median of `rounds` rounds of `per_round` calls.
fn median_per_call(rounds: usize, per_round: usize, mut f: impl FnMut(usize) -> usize) -> Duration {
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for i in 0..per_round {
                black_box(f(i));
            }
            start.elapsed() / per_round as u32
        })
        .collect();
    times.sort();
    times[rounds / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: then one quick size.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if quick { &[100] } else { &[100, 1_000, 10_000] };
    println!("pods_of: one job's pods ({PODS_PER_JOB}) read from the pod cache, medians of 7 rounds");
    println!("{:>13} {:>15} {:>15} {:>8} {:>26}", "pods cached", "walk (before)", "by job (now)", "ratio", "each job once: walk / now");
    for &jobs in sizes {
        let (caches, store) = caches(jobs);
        let targets: Vec<TFJob> = (0..jobs).map(job).collect();
        for target in targets.iter().step_by((jobs / 10).max(1)) {
            let (mut a, mut b) = (walk(&store, target), caches.pods_of(target));
            a.sort_by_key(|p| p.name_any());
            b.sort_by_key(|p| p.name_any());
            assert_eq!(a, b, "the two ways disagree on {}", target.name_any());
            assert_eq!(b.len(), PODS_PER_JOB);
        }
        let per_round = (200_000 / jobs).clamp(10, 2_000);
        let walked = median_per_call(7, per_round, |i| walk(&store, &targets[i % jobs]).len());
        let indexed = median_per_call(7, per_round, |i| caches.pods_of(&targets[i % jobs]).len());
        let every_job = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3 * jobs as f64);
        println!(
            "{:>13} {:>12.1} µs {:>12.1} µs {:>7.0}x {:>26}",
            jobs * PODS_PER_JOB,
            walked.as_secs_f64() * 1e6,
            indexed.as_secs_f64() * 1e6,
            walked.as_secs_f64() / indexed.as_secs_f64(),
            format!("{} / {}", every_job(walked), every_job(indexed)),
        );
    }
}

//! The kube-rs `Controller` over TFJobs and the watches that trigger it and fill its caches.

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tfjob_api::api::TFJob;
use tfjob_api::{plan, status};

use super::cache::Caches;
use super::pod_index::pod_cache;

/// The API of namespaced resources `K` in `namespace`, or in all namespaces.
pub fn api_in<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The kube-rs `Controller` over TFJobs (in `namespace`, or all namespaces), triggered also by
/// the pods and Services they own (selected by the operator-name label), whose watches fill the
/// returned [`Caches`]: give them to the [`super::Context`] of the reconciler. Secrets are not
/// watched.
pub fn build_controller(client: Client, namespace: Option<&str>, concurrency: u16) -> (Controller<TFJob>, Caches) {
    let owned = watcher::Config::default().labels(&format!("{}={}", plan::LABEL_OPERATOR_NAME, plan::OPERATOR_NAME));
    let (pods, mut pod_writer) = pod_cache();
    let (services, service_writer) = reflector::store::<Service>();
    // The caches keep what a reconcile reads, not the managed fields of every object.
    let pod_events = watcher(api_in::<Pod>(&client, namespace), owned.clone())
        .default_backoff()
        .modify(|p| p.managed_fields_mut().clear())
        .inspect_ok(move |event| pod_writer.apply_watcher_event(event))
        .touched_objects();
    let service_events = watcher(api_in::<Service>(&client, namespace), owned)
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(service_writer)
        .touched_objects();
    // The TFJob cache too: no managed fields, no `kubectl apply` copy of the manifest (the
    // operator reads neither, and writes a job only by patches, never from this copy). With
    // the pod templates of finished jobs dropped (see `slim_job`), 10,000 finished jobs went from
    // 341 to 80 MiB of the operator's memory (BENCHMARKS.md, "The operator against its limit").
    let (jobs, job_writer) = reflector::store::<TFJob>();
    let job_events =
        watcher(api_in::<TFJob>(&client, namespace), watcher::Config::default()).default_backoff().modify(slim_job).reflect(job_writer).applied_objects();
    let controller =
        Controller::for_stream(job_events, jobs).owns_stream(pod_events).owns_stream(service_events).with_config(Config::default().concurrency(concurrency));
    (controller, Caches::new(pods, services))
}

/// What the TFJob cache leaves out of a job: its managed fields, `kubectl apply`'s copy of
/// the manifest it was applied from and, once the job has finished, its pod templates (nothing
/// is created from them any more; a finished job's reconcile reads only its run policy, status
/// and pods). Most jobs in a long-lived cluster are finished: their templates were half of what
/// the cache kept.
fn slim_job(job: &mut TFJob) {
    job.managed_fields_mut().clear();
    if let Some(annotations) = job.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if job.status.as_ref().is_some_and(status::is_finished) {
        for spec in job.spec.tf_replica_specs.values_mut() {
            spec.template = Default::default();
        }
    }
}

/// The annotation `kubectl apply` keeps the applied manifest in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_no_managed_fields_and_no_applied_manifest_but_every_other_annotation() {
        let mut job: TFJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": { "name": "j", "annotations": { LAST_APPLIED: "{...}", "tfjob-rs.io/tls": "false" },
                          "managedFields": [{ "manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": {} } }] },
            "spec": { "tfReplicaSpecs": {} }
        }))
        .unwrap();
        slim_job(&mut job);
        assert!(job.metadata.managed_fields.as_ref().is_none_or(|m| m.is_empty()));
        let annotations = job.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["tfjob-rs.io/tls"]);
    }

    #[test]
    fn the_cache_keeps_the_pod_templates_of_unfinished_jobs_only() {
        let job = |conditions: serde_json::Value| -> TFJob {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": { "name": "j" },
                "spec": { "runPolicy": { "ttlSecondsAfterFinished": 60 }, "tfReplicaSpecs": { "Worker": { "replicas": 2, "template": { "spec": {
                    "containers": [{ "name": "tensorflow", "image": "tfjob-runtime:dev", "args": ["--model=mlp"] }] } } } } },
                "status": { "conditions": conditions }
            }))
            .unwrap()
        };
        let cond = |type_: &str, status: &str| serde_json::json!({ "type": type_, "status": status });
        let cases = [
            ("no condition yet", serde_json::json!([]), true),
            ("running", serde_json::json!([cond("Created", "True"), cond("Running", "True")]), true),
            ("succeeded", serde_json::json!([cond("Created", "True"), cond("Succeeded", "True")]), false),
            ("failed", serde_json::json!([cond("Created", "True"), cond("Failed", "True")]), false),
        ];
        for (case, conditions, keeps_template) in cases {
            let mut slimmed = job(conditions);
            let before = slimmed.clone();
            slim_job(&mut slimmed);
            let worker = &slimmed.spec.tf_replica_specs["Worker"];
            assert_eq!(worker.template.spec.is_some(), keeps_template, "{case}");
            // Nothing else of the spec goes: counts, run policy, status.
            assert_eq!(worker.replicas, 2, "{case}");
            assert_eq!(slimmed.spec.run_policy, before.spec.run_policy, "{case}");
            assert_eq!(slimmed.status, before.status, "{case}");
        }
    }
}

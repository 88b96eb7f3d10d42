//! The kube-rs `Controller` over TFJobs and the watches that trigger it and fill its caches.

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tfjob_api::api::TFJob;
use tfjob_api::plan;

use super::cache::Caches;

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
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (services, service_writer) = reflector::store::<Service>();
    // The caches keep what a reconcile reads, not the managed fields of every object.
    let pod_events = watcher(api_in::<Pod>(&client, namespace), owned.clone())
        .default_backoff()
        .modify(|p| p.managed_fields_mut().clear())
        .reflect(pod_writer)
        .touched_objects();
    let service_events = watcher(api_in::<Service>(&client, namespace), owned)
        .default_backoff()
        .modify(|s| s.managed_fields_mut().clear())
        .reflect(service_writer)
        .touched_objects();
    let controller = Controller::new(api_in::<TFJob>(&client, namespace), watcher::Config::default())
        .owns_stream(pod_events)
        .owns_stream(service_events)
        .with_config(Config::default().concurrency(concurrency));
    (controller, Caches { pods, services })
}

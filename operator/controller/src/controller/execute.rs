//! The execute step of a reconcile: one function per kind of write. The once-per-job objects
//! (the job's Secret, the Service and its NetworkPolicy, the PodGroup) are written when missing
//! or different; pods are created and deleted as the status machine says, each write remembered
//! as an expectation ([`super::cache::Expectations`]) and announced as an Event (the pods a
//! reconcile creates, by one Event).

use std::time::Instant;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tfjob_api::api::TFJob;
use tfjob_api::pki::{CaPem, JobCa, PkiError};
use tfjob_api::plan::{self, PlannedPod};
use tfjob_api::status::{Action, PodRefusal};

use super::admission::pod_group_api;
use super::cache;
use super::context::{Context, FIELD_MANAGER, post_params};
use super::error::{Error, kerr};
use super::target::Target;
use crate::api_errors::{CONFLICT, NOT_FOUND, is_status, tolerate};
use crate::metrics::JobEvent;

/// What executing a reconcile's actions did, for its commit.
#[derive(Default)]
pub struct Executed {
    /// The status machine's events, published once the status they come with is written.
    pub job_events: Vec<Action>,
    /// Pods the API server refused.
    pub refused: Vec<PodRefusal>,
    /// Pods created, in order: announced by one Event ([`super::events::pods_changed`]).
    pub created: Vec<String>,
    /// Pods deleted, in order: announced by one Event.
    pub deleted: Vec<String>,
    /// The job itself was deleted (`ttlSecondsAfterFinished`): its status is not written.
    pub job_deleted: bool,
    /// Creations were held back ([`super::admission`]): look again soon.
    pub held: bool,
}

/// Creates the job's Secret, once: its token and, when its replicas talk over `tls`, its CA
/// (derived from the operator's seed and the job's uid, [`tfjob_api::pki::JobCa::derive`]), with
/// which each replica makes its own certificate. The controller never reads Secrets (it may
/// not), so a Secret that exists already (`AlreadyExists`: created by an earlier run of the
/// operator) is the job's and is kept, token and all: its CA is the same.
pub async fn ensure_secret(ctx: &Context, target: &Target<'_>, job: &TFJob, tls: bool) -> Result<(), Error> {
    if ctx.secrets.contains(&target.uid) {
        return Ok(());
    }
    let ca = match tls {
        true => Some(job_ca(ctx, target).map_err(|e| Error::Certificate(format!("the CA of job {}: {e}", target.name)))?),
        false => None,
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &target.ns);
    let secret = plan::build_secret(job, &plan::random_token(), ca.as_ref());
    tolerate(api.create(&post_params(), &secret).await, &[CONFLICT]).map_err(kerr("create secret"))?;
    ctx.secrets.insert(&target.uid);
    Ok(())
}

fn job_ca(ctx: &Context, target: &Target<'_>) -> Result<CaPem, PkiError> {
    JobCa::derive(&ctx.tls_seed, &target.uid, &target.name)?.pem()
}

/// Applies the job's Service (and, when configured, its NetworkPolicy) when the cache shows it
/// missing or different; otherwise writes nothing.
pub async fn ensure_service(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let desired = plan::build_service(job);
    if let Some(existing) = ctx.caches.service_of(job)
        && cache::service_is_current(&existing, &desired)
    {
        return Ok(());
    }
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    svc_api.patch(job.name(), &apply, &Patch::Apply(&desired)).await.map_err(kerr("apply service"))?;
    if ctx.opts.network_policy {
        let np_api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        let np = plan::build_network_policy(job);
        np_api.patch(job.name(), &apply, &Patch::Apply(&np)).await.map_err(kerr("apply networkpolicy"))?;
    }
    Ok(())
}

/// Applies the Service of replica (`rtype`, `index`) of a job in Kubeflow's layout
/// ([`plan::AddressLayout::Kubeflow`]) when the cache does not show it: the name its peers'
/// `TF_CONFIG` gives it. Kubeflow's own are kept as they are.
pub async fn ensure_replica_service(ctx: &Context, ns: &str, job: &TFJob, rtype: tfjob_api::api::ReplicaType, index: i32) -> Result<(), Error> {
    let name = plan::pod_name(job.name(), rtype, index);
    if ctx.caches.services.get(&kube::runtime::reflector::ObjectRef::new(&name).within(ns)).is_some() {
        return Ok(());
    }
    let Some(desired) = plan::build_replica_service(job, rtype, index) else {
        return Ok(());
    };
    let svc_api: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    svc_api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&desired)).await.map_err(kerr("apply replica service"))?;
    Ok(())
}

/// Applies the job's PodGroup once per version of its spec (and process): a scale re-applies it
/// (a fixed job's gang is all its replicas; an elastic job's stays its smallest viable size).
pub async fn ensure_pod_group(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let Some(gang) = &ctx.opts.gang_scheduler else {
        return Ok(());
    };
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let key = format!("{uid}/{}", job.metadata.generation.unwrap_or_default());
    if ctx.pod_groups.contains(&key) {
        return Ok(());
    }
    let pg = plan::build_pod_group(job, gang);
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    pod_group_api(ctx, ns, gang).patch(job.name(), &apply, &Patch::Apply(&pg)).await.map_err(kerr("apply podgroup"))?;
    ctx.pod_groups.insert(&key);
    ctx.released_pod_groups.forget(uid);
    Ok(())
}

/// A suspended job gives its gang back: its PodGroup is deleted (once per suspension and
/// process), and applied again when the job resumes.
pub async fn release_pod_group(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    if ctx.opts.gang_scheduler.is_none() || ctx.released_pod_groups.contains(uid) {
        return Ok(());
    }
    delete_pod_group(ctx, ns, job.name()).await?;
    ctx.pod_groups.forget_prefix(&format!("{uid}/"));
    ctx.released_pod_groups.insert(uid);
    Ok(())
}

/// Applies the job's HorizontalPodAutoscaler (`elasticPolicy.metrics`) once per version of its
/// spec (and process); the autoscaler is owned by the job and goes with it.
pub async fn ensure_autoscaler(ctx: &Context, ns: &str, job: &TFJob) -> Result<(), Error> {
    let Some(hpa) = plan::build_autoscaler(job) else {
        return Ok(());
    };
    let key = format!("{}/{}", job.metadata.uid.as_deref().unwrap_or_default(), job.metadata.generation.unwrap_or_default());
    if ctx.autoscalers.contains(&key) {
        return Ok(());
    }
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), ns);
    api.patch(job.name(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&hpa)).await.map_err(kerr("apply horizontalpodautoscaler"))?;
    ctx.autoscalers.insert(&key);
    Ok(())
}

/// A finished job releases its gang: deletes its PodGroup (when gang scheduling is on).
pub async fn delete_pod_group(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    let Some(gang) = &ctx.opts.gang_scheduler else {
        return Ok(());
    };
    tolerate(pod_group_api(ctx, ns, gang).delete(name, &DeleteParams::default()).await, &[NOT_FOUND]).map_err(kerr("delete podgroup"))?;
    Ok(())
}

/// What the API server's refusal to create a pod means for the job, or `None` when the call
/// failed for another reason (connection, timeout, overload: the reconcile is retried).
fn pod_refusal(pod: &str, e: &kube::Error) -> Option<PodRefusal> {
    match e {
        // Invalid (422) or malformed (400): the same pod would be refused again.
        // Forbidden (403): admission (quota, pod security) may let a later attempt through.
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => {
            Some(PodRefusal { pod: pod.to_string(), message: s.message.clone(), permanent: s.code != 403 })
        }
        _ => None,
    }
}

/// What became of a pod the reconcile sent.
pub enum PodCreation {
    /// Created now (its name).
    Created(String),
    /// There already (the cache was behind).
    Existed,
    /// Refused for a reason that concerns the job (an invalid pod, admission).
    Refused(PodRefusal),
}

/// Creates a planned pod of the job.
pub async fn create_pod(ctx: &Context, target: &Target<'_>, planned: PlannedPod) -> Result<PodCreation, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &target.ns);
    let pod_name = planned.name().to_string();
    match pods.create(&post_params(), &planned.into_pod()).await {
        Ok(created) => {
            let new_uid = created.metadata.uid.unwrap_or_default();
            ctx.expectations.created(&target.key, &pod_name, &new_uid, Instant::now());
            Ok(PodCreation::Created(pod_name))
        }
        // The cache was behind: the pod is there.
        Err(e) if is_status(&e, CONFLICT) => Ok(PodCreation::Existed),
        Err(e) => match pod_refusal(&pod_name, &e) {
            Some(r) => {
                tracing::warn!(job = %target.name, pod = %pod_name, error = %e, "pod refused");
                Ok(PodCreation::Refused(r))
            }
            None => Err(kerr(format!("create pod {pod_name}"))(e)),
        },
    }
}

/// Deletes the job's pod `pod`: exactly the pod observed, never a newer pod of the same name;
/// noted in `deleted` (for the Event) when this call deleted it.
pub async fn delete_pod(ctx: &Context, target: &Target<'_>, pod: &str, deleted: &mut Vec<String>) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &target.ns);
    let pod_uid = target.uid_of(pod);
    let params = DeleteParams { preconditions: pod_uid.clone().map(|uid| Preconditions { uid: Some(uid), resource_version: None }), ..Default::default() };
    // Gone already, or another pod by now: nothing was deleted.
    if tolerate(pods.delete(pod, &params).await, &[NOT_FOUND, CONFLICT]).map_err(kerr(format!("delete pod {pod}")))?.is_none() {
        return Ok(());
    }
    if let Some(u) = &pod_uid {
        ctx.expectations.deleted(&target.key, pod, u, Instant::now());
    }
    deleted.push(pod.to_string());
    Ok(())
}

/// Deletes the job itself (`ttlSecondsAfterFinished`); its children go with it (owner
/// references), and the controller forgets it.
pub async fn delete_job(ctx: &Context, target: &Target<'_>) -> Result<(), Error> {
    let jobs: Api<TFJob> = Api::namespaced(ctx.client.clone(), &target.ns);
    tolerate(jobs.delete(&target.name, &DeleteParams::background()).await, &[NOT_FOUND]).map_err(kerr("delete job"))?;
    ctx.metrics.job(&target.ns, JobEvent::Deleted);
    ctx.forget(&target.key, &target.uid);
    Ok(())
}

//! Part of `--only operator-load`: what one request of each kind the operator makes costs the
//! API server and etcd, in CPU milliseconds per request. Each kind is timed alone, `n` requests
//! [`super::operator_load::CONCURRENCY`] at a time, by the bench as a bare client, in a namespace
//! the operator does not watch. It itemises the operator's requests beyond a bare client's
//! writes (its status write, its Events, its Service written by server-side apply, the watch
//! that brings every pod it creates back to it), so the creation rate's gap can be read as a sum.

use std::collections::BTreeMap;
use std::future::Future;

use anyhow::{Result, anyhow};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tfjob_api::api::TFJob;
use tfjob_tests::controlplane::ControlPlane;

use super::operator_load::{CONCURRENCY, CpuMeter, JobObjects, job_objects};

pub const TFJOBS_CREATED: &str = "create tfjobs";
pub const STATUS_APPLIED: &str = "patch tfjobs/status, server-side apply (the operator's)";
pub const SECRETS_CREATED: &str = "create secrets";
pub const SERVICES_CREATED: &str = "create services";
pub const SERVICES_APPLIED: &str = "apply services (the operator's)";
pub const EVENTS_CREATED: &str = "create events";
pub const PODS_UNWATCHED: &str = "create pods, nobody watching them";
pub const PODS_WATCHED: &str = "create pods, one watch of them open (the operator's)";

/// Which price each of the operator's requests (as the audit log names them) pays.
pub const OPERATOR_REQUESTS: [(&str, &str); 6] = [
    ("create pods", PODS_WATCHED),
    ("create secrets", SECRETS_CREATED),
    ("create services", SERVICES_CREATED),
    ("patch services", SERVICES_APPLIED),
    ("patch tfjobs/status", STATUS_APPLIED),
    ("create events", EVENTS_CREATED),
];

/// The price of one kind of request: CPU milliseconds per request of each process.
pub struct Price {
    pub what: &'static str,
    pub per_request_ms: BTreeMap<String, f64>,
}

/// Prices measured `passes` times (each pass in a namespace of its own), printed with their
/// medians: the API server's garbage collection falls on whichever window it likes, so one pass
/// alone can be off by half.
///
/// Returns each kind's median (kube-apiserver and etcd together, ms per request) and the
/// details for the report.
pub fn print_request_prices(
    cp: &ControlPlane,
    rt: &tokio::runtime::Runtime,
    client: &Client,
    cpu: &CpuMeter,
    n: usize,
    passes: usize,
) -> Result<(BTreeMap<&'static str, f64>, serde_json::Value)> {
    let runs = (0..passes).map(|pass| request_prices(cp, rt, client, cpu, n, pass)).collect::<Result<Vec<_>>>()?;
    // A process's CPU time is counted in clock ticks: a price is known to one tick over the
    // requests timed, the fewest being half of `n` (0.1 ms in a full run, 1 ms with `--quick`).
    let tick_ms = 1e3 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    println!(
        "          what one request costs ({n} of each kind, {CONCURRENCY} at a time, passes: {passes}; CPU ms per request, median and each pass; to within {:.2} ms):",
        tick_ms / (n / 2) as f64
    );
    let mut details = serde_json::Map::new();
    let mut medians = BTreeMap::new();
    for (k, first) in runs[0].iter().enumerate() {
        let both: Vec<f64> = runs
            .iter()
            .map(|r| r[k].per_request_ms.get("kube-apiserver").copied().unwrap_or(0.0) + r[k].per_request_ms.get("etcd").copied().unwrap_or(0.0))
            .collect();
        medians.insert(first.what, super::median(both));
        let mut line = vec![];
        for process in ["kube-apiserver", "etcd"] {
            let each: Vec<f64> = runs.iter().map(|r| r[k].per_request_ms.get(process).copied().unwrap_or(f64::NAN)).collect();
            let shown: Vec<String> = each.iter().map(|ms| format!("{ms:.2}")).collect();
            line.push(format!("{process} {:.2} ({})", super::median(each.clone()), shown.join(" / ")));
            details.insert(format!("{} / {process}", first.what), json!(each));
        }
        println!("            {:<55} {}", first.what, line.join(", "));
    }
    Ok((medians, details.into()))
}

/// Times `n` requests of each kind the operator makes and returns their prices, in the order
/// the operator makes them for a job.
fn request_prices(cp: &ControlPlane, rt: &tokio::runtime::Runtime, client: &Client, cpu: &CpuMeter, n: usize, pass: usize) -> Result<Vec<Price>> {
    let ns = cp.create_namespace(&format!("prices-{pass}"))?;
    let objects: Vec<_> = (0..n).map(|i| job_objects(&ns, &format!("price-{i}"))).collect::<Result<_>>()?;
    let mut pricer = Pricer { rt, client: client.clone(), ns, cpu, pp: PostParams::default(), prices: vec![] };
    let jobs = pricer.tfjobs(&objects)?;
    pricer.objects(&objects, &jobs)?;
    pricer.status_without_cel(cp, &objects)?;
    pricer.pods(&objects)?;
    Ok(pricer.prices)
}

/// Times requests in one namespace and keeps their prices.
struct Pricer<'a> {
    rt: &'a tokio::runtime::Runtime,
    client: Client,
    ns: String,
    cpu: &'a CpuMeter,
    pp: PostParams,
    prices: Vec<Price>,
}

impl Pricer<'_> {
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Runs `requests` (`per` of them) and keeps its CPU per request as the price of `what`.
    fn time<T>(&mut self, what: &'static str, per: usize, requests: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let (out, _, used) = self.cpu.timed(|| self.rt.block_on(requests))?;
        let per_request_ms = used.into_iter().map(|(name, s)| (name, s * 1e3 / per as f64)).collect();
        self.prices.push(Price { what, per_request_ms });
        Ok(out)
    }

    /// Creates the jobs, then writes each one's status twice: as the operator does (server-side
    /// apply) and as a merge patch. Returns the jobs as created.
    fn tfjobs(&mut self, objects: &[JobObjects]) -> Result<Vec<TFJob>> {
        let (jobs, pp) = (self.api::<TFJob>(), self.pp.clone());
        let created = self.time(TFJOBS_CREATED, objects.len(), each(objects, |o| jobs.create(&pp, &o.job)))?;
        let apply = PatchParams::apply("price").force();
        let statuses = created.iter().map(|job| (job_name(job), Patch::Apply(status_apply(job)))).collect::<Vec<_>>();
        self.time(STATUS_APPLIED, created.len(), each(&statuses, |(name, patch)| jobs.patch_status(name, &apply, patch)))?;
        let merge = PatchParams::default();
        let statuses = created.iter().map(|job| (job_name(job), Patch::Merge(status_merge()))).collect::<Vec<_>>();
        self.time("patch tfjobs/status, merge patch", created.len(), each(&statuses, |(name, patch)| jobs.patch_status(name, &merge, patch)))?;
        Ok(created)
    }

    /// The job's other objects: its Secret, its Service (created, and applied as the operator
    /// does: half the jobs each), an Event about each job.
    fn objects(&mut self, objects: &[JobObjects], jobs: &[TFJob]) -> Result<()> {
        let (secrets, services, events, pp) = (self.api::<Secret>(), self.api::<Service>(), self.api::<Event>(), self.pp.clone());
        self.time(SECRETS_CREATED, objects.len(), each(objects, |o| secrets.create(&pp, &o.token)))?;
        let (created, applied) = objects.split_at(objects.len() / 2);
        self.time(SERVICES_CREATED, created.len(), each(created, |o| services.create(&pp, &o.service)))?;
        let apply = PatchParams::apply("price").force();
        let applies: Vec<(&str, Patch<&Service>)> =
            applied.iter().map(|o| (o.service.metadata.name.as_deref().unwrap_or_default(), Patch::Apply(&o.service))).collect();
        self.time(SERVICES_APPLIED, applies.len(), each(&applies, |(name, patch)| services.patch(name, &apply, patch)))?;
        let bodies: Vec<Event> = jobs.iter().map(pods_event).collect();
        self.time(EVENTS_CREATED, bodies.len(), each(&bodies, |e| events.create(&pp, e)))?;
        Ok(())
    }

    /// The operator's status write against a copy of the CRD without its CEL rules: what the
    /// rules cost a status write.
    fn status_without_cel(&mut self, cp: &ControlPlane, objects: &[JobObjects]) -> Result<()> {
        let resource = crd_copy(cp, "nocel.tfjob-rs.dev")?;
        let copies = Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource);
        let bodies = objects.iter().map(|o| as_copy(&o.job, &resource)).collect::<Result<Vec<_>>>()?;
        let pp = self.pp.clone();
        let made = self.rt.block_on(each(&bodies, |obj| copies.create(&pp, obj)))?;
        let statuses: Vec<(String, Patch<serde_json::Value>)> = made
            .iter()
            .map(|obj| {
                let name = obj.metadata.name.clone().unwrap_or_default();
                let mut body = status_apply_of(&name, obj.metadata.resource_version.clone());
                body["apiVersion"] = resource.api_version.clone().into();
                (name, Patch::Apply(body))
            })
            .collect();
        let apply = PatchParams::apply("price").force();
        self.time("patch status, a copy of the CRD without CEL rules", made.len(), each(&statuses, |(name, patch)| copies.patch_status(name, &apply, patch)))?;
        Ok(())
    }

    /// The jobs' pods, half of them created with nobody watching, half with a watch open.
    fn pods(&mut self, objects: &[JobObjects]) -> Result<()> {
        let (half_a, half_b) = objects.split_at(objects.len() / 2);
        let all_pods = |half: &[JobObjects]| half.iter().flat_map(|o| o.pods.iter().cloned()).collect::<Vec<_>>();
        let (pods_a, pods_b) = (all_pods(half_a), all_pods(half_b));
        let (pods, pp) = (self.api::<Pod>(), self.pp.clone());
        self.time(PODS_UNWATCHED, pods_a.len(), each(&pods_a, |p| pods.create(&pp, p)))?;
        self.time(PODS_WATCHED, pods_b.len(), create_watched(&pods, &pods_b, &pp))?;
        Ok(())
    }
}

/// Sends `request` for every item, [`CONCURRENCY`] at a time; their answers in any order.
async fn each<'a, T, O, F>(items: &'a [T], request: impl FnMut(&'a T) -> F) -> Result<Vec<O>>
where
    F: Future<Output = kube::Result<O>> + 'a,
{
    Ok(stream::iter(items).map(request).buffer_unordered(CONCURRENCY).try_collect().await?)
}

/// Creates `batch` while a watch of the namespace's pods is open and read: each pod created is
/// also delivered to one watcher, as the operator's are.
async fn create_watched(pods: &Api<Pod>, batch: &[Pod], pp: &PostParams) -> Result<()> {
    let version = pods.list_metadata(&Default::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut watch = pods.watch(&WatchParams::default().timeout(120), &version).await?.boxed();
    let expected = batch.len();
    let reader = async move {
        let mut added = 0;
        while added < expected {
            match watch.try_next().await? {
                Some(WatchEvent::Added(_)) => added += 1,
                Some(_) => {}
                None => return Err(anyhow!("the watch ended after {added} of {expected} pods")),
            }
        }
        Ok(())
    };
    let (created, read) = futures::join!(each(batch, |p| pods.create(pp, p)), reader);
    created?;
    read
}

fn job_name(job: &TFJob) -> &str {
    job.metadata.name.as_deref().unwrap_or_default()
}

/// A status like the operator's first one (Created, the replica counts, the start time), as a
/// server-side apply conditional on the job's version, as the operator writes it.
fn status_apply(job: &TFJob) -> serde_json::Value {
    status_apply_of(job_name(job), job.meta().resource_version.clone())
}

fn status_apply_of(name: &str, version: Option<String>) -> serde_json::Value {
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": { "resourceVersion": version },
        "status": {
            "conditions": [{"type": "Created", "status": "True", "reason": "TFJobCreated", "message": format!("TFJob {name} is created."),
                            "lastUpdateTime": "2026-12-06T10:00:00Z", "lastTransitionTime": "2026-12-06T10:00:00Z"}],
            "replicaStatuses": {"PS": {"active": 0}, "Worker": {"active": 0}},
            "startTime": "2026-12-06T10:00:00Z",
        },
    })
}

/// The next status (Running added), as a merge patch.
fn status_merge() -> serde_json::Value {
    json!({
        "status": {
            "conditions": [
                {"type": "Created", "status": "True", "reason": "TFJobCreated", "message": "created", "lastUpdateTime": "2026-12-06T10:00:00Z", "lastTransitionTime": "2026-12-06T10:00:00Z"},
                {"type": "Running", "status": "True", "reason": "TFJobRunning", "message": "running", "lastUpdateTime": "2026-12-06T10:00:01Z", "lastTransitionTime": "2026-12-06T10:00:01Z"},
            ],
            "replicaStatuses": {"PS": {"active": 1}, "Worker": {"active": 4}},
        },
    })
}

/// An Event like the operator's `SuccessfulCreatePod` about a job.
fn pods_event(job: &TFJob) -> Event {
    let name = job_name(job);
    Event {
        metadata: ObjectMeta { name: Some(format!("{name}.pods")), ..Default::default() },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some("Create".into()),
        reason: Some("SuccessfulCreatePod".into()),
        note: Some(format!("Created 5 pods: {name}-ps-0, {name}-worker-0, {name}-worker-1, {name}-worker-2, {name}-worker-3")),
        type_: Some("Normal".into()),
        reporting_controller: Some("tfjob-operator".into()),
        reporting_instance: Some("tfjob-operator-0".into()),
        regarding: Some(ObjectReference {
            api_version: Some("kubeflow.org/v1".into()),
            kind: Some("TFJob".into()),
            name: Some(name.into()),
            namespace: job.metadata.namespace.clone(),
            uid: job.metadata.uid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A copy of the installed TFJob CRD in API group `group`, without its CEL rules
/// (`x-kubernetes-validations`), installed and established.
fn crd_copy(cp: &ControlPlane, group: &str) -> Result<ApiResource> {
    let mut crd: serde_json::Value = serde_json::from_str(&cp.kubectl_ok(["get", "crd", "tfjobs.kubeflow.org", "-o", "json"])?)?;
    let name = format!("tfjobs.{group}");
    crd["metadata"] = json!({ "name": name });
    crd["spec"]["group"] = group.into();
    if let Some(o) = crd.as_object_mut() {
        o.remove("status");
    }
    strip_cel(&mut crd);
    cp.kubectl_stdin(["apply", "-f", "-"], &crd.to_string())?;
    cp.kubectl_ok(["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{name}")])?;
    Ok(ApiResource { group: group.into(), version: "v1".into(), api_version: format!("{group}/v1"), kind: "TFJob".into(), plural: "tfjobs".into() })
}

fn strip_cel(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            o.remove("x-kubernetes-validations");
            o.values_mut().for_each(strip_cel);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_cel),
        _ => {}
    }
}

fn as_copy(job: &TFJob, resource: &ApiResource) -> Result<DynamicObject> {
    let mut v = serde_json::to_value(job)?;
    v["apiVersion"] = resource.api_version.clone().into();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("uid");
        m.remove("resourceVersion");
    }
    Ok(serde_json::from_value(v)?)
}

//! The reconcile function against an in-memory fake API server: every test goes through the
//! real kube client calls (create, server-side apply, status patch, delete, events). The watch
//! caches a reconcile reads are filled from the fake's objects before each reconcile
//! ([`Harness::sync`]), or left stale on purpose.

mod fake;

use std::sync::{Arc, Mutex};

use fake::FakeApi;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tfjob_api::api::{Claim, TFJob};
use tfjob_api::plan::{GangScheduler, PlanOptions};
use tfjob_operator::controller::cache::Caches;
use tfjob_operator::controller::pod_index::{PodCacheWriter, pod_cache};
use tfjob_operator::controller::{Context, reconcile};

const JOBS: &str = "/apis/kubeflow.org/v1/namespaces/ns/tfjobs";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const SVCS: &str = "/api/v1/namespaces/ns/services";
const SECRETS: &str = "/api/v1/namespaces/ns/secrets";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

fn job(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    })
}

fn replica(n: i32, policy: &str) -> Value {
    json!({
        "replicas": n,
        "restartPolicy": policy,
        "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tfjob-runtime:latest", "command": ["tfjob-runtime"]}]}}
    })
}

struct Harness {
    api: FakeApi,
    ctx: Arc<Context>,
    writers: Mutex<(PodCacheWriter, Writer<Service>)>,
}

/// Replaces what a cache holds with `objects` (a watch's initial list), one event at a time
/// through `apply`.
fn relist<K>(mut apply: impl FnMut(&watcher::Event<K>), objects: Vec<K>) {
    apply(&watcher::Event::Init);
    for o in objects {
        apply(&watcher::Event::InitApply(o));
    }
    apply(&watcher::Event::InitDone);
}

impl Harness {
    fn new() -> Self {
        Self::with_opts(PlanOptions::default())
    }

    fn with_opts(opts: PlanOptions) -> Self {
        Self::build(opts, Claim::default())
    }

    /// An operator beside Kubeflow's training-operator (`--beside-kubeflow`).
    fn beside_kubeflow() -> Self {
        Self::build(PlanOptions::default(), Claim::OwnOnly)
    }

    fn build(opts: PlanOptions, claim: Claim) -> Self {
        Self::build_with(opts, |ctx| ctx.claim = claim)
    }

    /// A harness whose context `change` sets up.
    fn with_context(change: impl FnOnce(&mut Context)) -> Self {
        Self::build_with(PlanOptions::default(), change)
    }

    fn build_with(opts: PlanOptions, change: impl FnOnce(&mut Context)) -> Self {
        let api = FakeApi::default();
        let (pods, pod_writer) = pod_cache();
        let (services, service_writer) = reflector::store();
        let mut ctx = Context::new(api.client(), opts, Caches::new(pods, services));
        change(&mut ctx);
        let h = Harness { api, ctx: Arc::new(ctx), writers: Mutex::new((pod_writer, service_writer)) };
        h.sync();
        h
    }

    /// The watch caches catch up with the fake's pods and Services.
    fn sync(&self) {
        let objects = |prefix: &str| -> Vec<Value> {
            let st = self.api.state.lock().unwrap();
            st.objects.iter().filter(|(k, _)| k.starts_with(&format!("{prefix}/"))).map(|(_, v)| v.clone()).collect()
        };
        let pods = objects(PODS).into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
        let services = objects(SVCS).into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
        let mut w = self.writers.lock().unwrap();
        relist(|e| w.0.apply_watcher_event(e), pods);
        relist(|e| w.1.apply_watcher_event(e), services);
    }

    fn job(&self, name: &str) -> Option<TFJob> {
        self.api.get(&format!("{JOBS}/{name}")).map(|v| serde_json::from_value(v).unwrap())
    }

    /// Reconciles the job with caches that have caught up.
    async fn reconcile(&self, name: &str) -> kube::runtime::controller::Action {
        self.sync();
        self.reconcile_stale(name).await
    }

    /// Reconciles the job with the caches as they are (maybe behind); returns once the events
    /// it queued are written.
    async fn reconcile_stale(&self, name: &str) -> kube::runtime::controller::Action {
        self.reconcile_copy(self.job(name).expect("job exists")).await
    }

    /// Reconciles this copy of a job (maybe older than the API's); returns once the events it
    /// queued are written.
    async fn reconcile_copy(&self, job: TFJob) -> kube::runtime::controller::Action {
        let action = reconcile(Arc::new(job), self.ctx.clone()).await.expect("reconcile succeeds");
        self.ctx.events.flush(std::time::Duration::from_secs(5)).await;
        action
    }

    fn pods(&self) -> Vec<String> {
        self.api.names(PODS)
    }

    fn set_pod(&self, name: &str, phase: &str, exit_code: Option<i32>, restarts: i32) {
        self.api.update(&format!("{PODS}/{name}"), |p| {
            let state = match exit_code {
                Some(code) => json!({"terminated": {"exitCode": code}}),
                None => json!({"running": {}}),
            };
            p["status"] = json!({
                "phase": phase,
                "containerStatuses": [{
                    "name": "tensorflow", "image": "img", "imageID": "", "ready": phase == "Running",
                    "restartCount": restarts, "state": state
                }]
            });
        });
    }

    fn conditions(&self, name: &str) -> Vec<(String, String, String)> {
        self.job(name)
            .unwrap()
            .status
            .unwrap_or_default()
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone().unwrap_or_default()))
            .collect()
    }

    /// (type, status, reason, message) of the job's last condition: its state.
    fn last_condition(&self, name: &str) -> (String, String, String, String) {
        let st = self.job(name).unwrap().status.unwrap_or_default();
        let c = st.conditions.last().cloned().unwrap_or_default();
        (c.type_, c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default())
    }

    fn event_reasons(&self) -> Vec<(String, String)> {
        let st = self.api.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|(k, _)| k.starts_with(EVENTS))
            .map(|(_, e)| (e["type"].as_str().unwrap_or("").to_string(), e["reason"].as_str().unwrap_or("").to_string()))
            .collect()
    }
}

fn env_of(pod: &Value, name: &str) -> Option<String> {
    pod["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().map(str::to_string).unwrap_or_else(|| e["valueFrom"].to_string()))
}

fn c(t: &str, s: &str, r: &str) -> (String, String, String) {
    (t.into(), s.into(), r.into())
}

#[tokio::test]
async fn new_job_gets_its_objects_and_status() {
    let h = Harness::new();
    h.api.put(JOBS, job("mnist", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}})));
    h.reconcile("mnist").await;

    assert_eq!(h.pods(), vec!["mnist-ps-0", "mnist-worker-0", "mnist-worker-1"]);
    let w1 = h.api.get(&format!("{PODS}/mnist-worker-1")).unwrap();
    assert_eq!(
        env_of(&w1, "TF_CONFIG").as_deref(),
        Some(
            r#"{"cluster":{"ps":["mnist-ps-0.mnist.ns.svc:2222"],"worker":["mnist-worker-0.mnist.ns.svc:2222","mnist-worker-1.mnist.ns.svc:2222"]},"environment":"cloud","task":{"index":1,"type":"worker"}}"#
        )
    );
    assert!(env_of(&w1, "TFJOB_TOKEN").unwrap().contains("mnist-token"));
    let uid = h.job("mnist").unwrap().metadata.uid.unwrap();
    assert_eq!(w1["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(w1["spec"]["subdomain"], "mnist");

    let svc = h.api.get(&format!("{SVCS}/mnist")).unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    let secret = h.api.get(&format!("{SECRETS}/mnist-token")).unwrap();
    let token = secret["data"]["token"].clone();
    assert!(token.as_str().unwrap().len() >= 64);

    assert_eq!(h.conditions("mnist"), vec![c("Created", "True", "TFJobCreated")]);
    let st = h.job("mnist").unwrap().status.unwrap();
    assert!(st.start_time.is_some());
    assert_eq!(st.replica_statuses["Worker"].active, 0);
    // The pods one reconcile creates are named in one Event.
    assert_eq!(pod_events(&h, "SuccessfulCreatePod"), vec!["Created 3 pods: mnist-ps-0, mnist-worker-0, mnist-worker-1 (about the job)"]);
    let mut reasons = h.event_reasons();
    reasons.sort();
    reasons.dedup();
    assert_eq!(reasons, vec![("Normal".into(), "SuccessfulCreatePod".into()), ("Normal".into(), "TFJobCreated".into())]);

    // A second pass changes nothing and asks nothing: the pods and the Service come from the
    // caches, the Secret is known to exist, the status is the same.
    h.api.take_log();
    h.reconcile("mnist").await;
    let log = h.api.take_log();
    assert_eq!(log, Vec::<String>::new());
    assert_eq!(h.api.get(&format!("{SECRETS}/mnist-token")).unwrap()["data"]["token"], token);
}

#[tokio::test]
async fn pod_phases_drive_the_status() {
    let h = Harness::new();
    h.api.put(JOBS, job("mnist", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}})));
    h.reconcile("mnist").await;
    for p in ["mnist-ps-0", "mnist-worker-0", "mnist-worker-1"] {
        h.set_pod(p, "Running", None, 0);
    }
    h.reconcile("mnist").await;
    assert_eq!(h.conditions("mnist"), vec![c("Created", "True", "TFJobCreated"), c("Running", "True", "TFJobRunning")]);
    let st = h.job("mnist").unwrap().status.unwrap();
    assert_eq!((st.replica_statuses["Worker"].active, st.replica_statuses["PS"].active), (2, 1));

    h.set_pod("mnist-worker-0", "Succeeded", Some(0), 0);
    h.reconcile("mnist").await;
    assert_eq!(
        h.conditions("mnist"),
        vec![c("Running", "False", "TFJobRunning"), c("Created", "True", "TFJobCreated"), c("Succeeded", "True", "TFJobSucceeded")]
    );
    assert!(h.job("mnist").unwrap().status.unwrap().completion_time.is_some());
    // Default cleanPodPolicy Running: the ps and the running worker are gone, the finished pod stays.
    assert_eq!(h.pods(), vec!["mnist-worker-0"]);
    let reasons: Vec<_> = h.event_reasons().into_iter().map(|(_, r)| r).collect();
    for r in ["TFJobCreated", "TFJobRunning", "TFJobSucceeded"] {
        assert!(reasons.contains(&r.to_string()), "{reasons:?}");
    }
    // Terminal means terminal: a later failure report changes nothing.
    h.api.put(PODS, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "labels": {}}}));
    h.reconcile("mnist").await;
    assert!(h.conditions("mnist").iter().all(|(t, _, _)| t != "Failed"));
}

#[tokio::test]
async fn failures_under_each_restart_policy() {
    // (policy, exit code, expect job failed, expect pod recreated)
    for (policy, code, fails, recreated) in
        [("Never", 1, true, false), ("OnFailure", 1, false, true), ("Always", 2, false, true), ("ExitCode", 137, false, true), ("ExitCode", 3, true, false)]
    {
        let h = Harness::new();
        h.api.put(JOBS, job("j", json!({"runPolicy": {"cleanPodPolicy": "All"}, "tfReplicaSpecs": {"Worker": replica(2, policy)}})));
        h.reconcile("j").await;
        h.set_pod("j-worker-0", "Running", None, 0);
        h.set_pod("j-worker-1", "Failed", Some(code), 0);
        h.reconcile("j").await;
        let conds = h.conditions("j");
        let last = conds.last().unwrap().clone();
        if fails {
            assert_eq!(last, c("Failed", "True", "TFJobFailed"), "{policy} {code}");
            assert!(h.pods().is_empty(), "{policy}: cleanPodPolicy All deletes every pod");
            assert!(h.event_reasons().contains(&("Warning".into(), "TFJobFailed".into())));
        } else {
            assert_eq!(last, c("Restarting", "True", "TFJobRestarting"), "{policy} {code}");
            assert_eq!(h.pods(), vec!["j-worker-0"], "{policy}: failed pod deleted");
        }
        if fails {
            // In the order deleted: the failed pod may go before the cleanup.
            let deleted = pod_events(&h, "SuccessfulDeletePod");
            let either = ["Deleted 2 pods: j-worker-0, j-worker-1 (about the job)", "Deleted 2 pods: j-worker-1, j-worker-0 (about the job)"];
            assert!(deleted.len() == 1 && either.contains(&deleted[0].as_str()), "{policy} {code}: {deleted:?}");
        } else {
            // One pod: Kubeflow's Event, about that pod.
            assert_eq!(pod_events(&h, "SuccessfulDeletePod"), vec!["Deleted pod: j-worker-1 (about j-worker-1)"], "{policy} {code}");
        }
        if recreated {
            h.reconcile("j").await;
            assert_eq!(h.pods(), vec!["j-worker-0", "j-worker-1"], "{policy}: pod recreated");
            let st = h.job("j").unwrap().status.unwrap();
            assert_eq!(st.replica_statuses["Worker"].recreated, 1);
            let created = pod_events(&h, "SuccessfulCreatePod");
            assert_eq!(created, vec!["Created 2 pods: j-worker-0, j-worker-1 (about the job)", "Created pod: j-worker-1 (about j-worker-1)"], "{policy}");
        }
    }
}

/// The events with this reason, each as `line` writes it, sorted.
fn event_lines(h: &Harness, reason: &str, line: impl Fn(&Value) -> String) -> Vec<String> {
    let st = h.api.state.lock().unwrap();
    let mut lines: Vec<String> = st.objects.iter().filter(|(k, e)| k.starts_with(EVENTS) && e["reason"] == reason).map(|(_, e)| line(e)).collect();
    lines.sort();
    lines
}

/// The `note`s of the events with this reason, sorted, each with the pod it is about (`related`),
/// or `the job`.
fn pod_events(h: &Harness, reason: &str) -> Vec<String> {
    event_lines(h, reason, |e| format!("{} (about {})", e["note"].as_str().unwrap_or_default(), e["related"]["name"].as_str().unwrap_or("the job")))
}

/// The `note`s of the events with this reason, sorted, each with how often it was sent (a
/// recorder folds a repeated event into a `series`).
fn notes_of(h: &Harness, reason: &str) -> Vec<String> {
    event_lines(h, reason, |e| format!("{} x{}", e["note"].as_str().unwrap_or_default(), e["series"]["count"].as_i64().unwrap_or(1)))
}

/// Scaling creates the missing replicas (with the new cluster) and deletes the highest ones;
/// each change is announced once, even when a reconcile of a stale copy of the job runs after it
/// (what a watch cache that has not caught up hands out): its status write is refused, and so
/// are its events.
#[tokio::test]
async fn scaling_creates_and_deletes_replicas_and_announces_each_change_once() {
    let h = Harness::new();
    h.api.put(JOBS, job("s", json!({"tfReplicaSpecs": {"Worker": replica(2, "Never")}})));
    let new = h.job("s").unwrap();
    h.reconcile("s").await;
    h.reconcile_copy(new).await;
    assert_eq!(notes_of(&h, "TFJobCreated"), vec!["TFJob s is created. x1"]);

    let scale_to = |n: i32| {
        h.api.update(&format!("{JOBS}/s"), |j| j["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = json!(n));
        h.job("s").unwrap()
    };
    let before_up = scale_to(3);
    h.reconcile("s").await;
    assert_eq!(h.pods(), vec!["s-worker-0", "s-worker-1", "s-worker-2"]);
    let w2 = h.api.get(&format!("{PODS}/s-worker-2")).unwrap();
    let cfg = env_of(&w2, "TF_CONFIG").unwrap();
    assert!(cfg.contains("s-worker-2.s.ns.svc:2222"), "{cfg}");
    h.reconcile_copy(before_up).await;
    h.reconcile("s").await;
    assert_eq!(notes_of(&h, "Scaled"), vec!["Worker 2 \u{2192} 3 x1"]);

    scale_to(1);
    h.reconcile("s").await;
    assert_eq!(h.pods(), vec!["s-worker-0"]);
    let status = h.job("s").unwrap().status.unwrap();
    assert_eq!(status.replica_statuses["Worker"].replicas, Some(1));
    assert_eq!(notes_of(&h, "Scaled"), vec!["Worker 2 \u{2192} 3 x1", "Worker 3 \u{2192} 1 x1"]);
}

#[tokio::test]
async fn invalid_job_fails_and_others_are_served() {
    let h = Harness::new();
    h.api.put(JOBS, job("bad", json!({"tfReplicaSpecs": {"PS": replica(1, "Never")}})));
    h.api.put(JOBS, job("good", json!({"tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    h.reconcile("bad").await;
    h.reconcile("good").await;
    let bad = h.job("bad").unwrap().status.unwrap();
    let last = bad.conditions.last().unwrap();
    assert_eq!((last.type_.as_str(), last.reason.as_deref()), ("Failed", Some("TFJobFailedValidation")));
    assert!(last.message.as_deref().unwrap().contains("spec.tfReplicaSpecs: must contain a Chief, a Master or a Worker"));
    assert!(h.event_reasons().contains(&("Warning".into(), "TFJobFailedValidation".into())));
    assert_eq!(h.pods(), vec!["good-worker-0"]);
    assert!(h.api.get(&format!("{SVCS}/bad")).is_none());
}

#[tokio::test]
async fn deleting_the_job_leaves_nothing_behind() {
    let h = Harness::with_opts(PlanOptions { cluster_domain: None, gang_scheduler: Some(GangScheduler::Volcano), ..Default::default() });
    h.api.put(JOBS, job("d", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}})));
    h.reconcile("d").await;
    let pg = "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/d";
    assert_eq!(h.api.get(pg).unwrap()["spec"], json!({"minMember": 3, "queue": "default"}));
    // No pod before Volcano takes the gang in (and the job says why, once).
    assert!(h.api.names(PODS).is_empty(), "{:?}", h.api.names(PODS));
    h.reconcile("d").await;
    assert!(h.api.names(PODS).is_empty());
    let waiting: Vec<Value> =
        h.api.all_keys().into_iter().filter(|k| k.starts_with(EVENTS)).filter_map(|k| h.api.get(&k)).filter(|e| e["reason"] == "GangPending").collect();
    assert_eq!(waiting.len(), 1, "{waiting:#?}");
    // Inqueue (Volcano writes the phase in the object: a PodGroup has no status subresource).
    h.api.update(pg, |o| o["status"] = json!({"phase": "Inqueue"}));
    h.reconcile("d").await;
    assert_eq!(h.api.names(PODS).len(), 3);
    let uid = h.job("d").unwrap().metadata.uid.unwrap();
    // Everything the controller made is owned by the job, so the garbage collector removes it.
    for key in h.api.all_keys() {
        if key.starts_with(JOBS) || key.starts_with(EVENTS) {
            continue;
        }
        let obj = h.api.get(&key).unwrap();
        assert_eq!(obj["metadata"]["ownerReferences"][0]["uid"], uid.as_str(), "{key}");
        assert_eq!(obj["metadata"]["ownerReferences"][0]["controller"], true, "{key}");
    }
    // Finishing the job releases the gang.
    h.set_pod("d-worker-0", "Succeeded", Some(0), 0);
    h.reconcile("d").await;
    assert!(h.api.get("/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/d").is_none());
    // A job being deleted is left to the garbage collector: no writes.
    let mut deleting = h.job("d").unwrap();
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.api.take_log();
    h.reconcile_copy(deleting).await;
    assert!(h.api.take_log().is_empty());
    let jobs: kube::Api<TFJob> = kube::Api::namespaced(h.api.client(), "ns");
    jobs.delete("d", &Default::default()).await.unwrap();
    let left: Vec<_> = h.api.all_keys().into_iter().filter(|k| !k.starts_with(EVENTS)).collect();
    assert!(left.is_empty(), "{left:#?}");
}

#[tokio::test]
async fn ttl_deletes_the_finished_job() {
    let h = Harness::new();
    h.api.put(JOBS, job("t", json!({"runPolicy": {"ttlSecondsAfterFinished": 0}, "tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    h.reconcile("t").await;
    h.set_pod("t-worker-0", "Succeeded", Some(0), 0);
    h.reconcile("t").await;
    assert!(h.job("t").is_none(), "job deleted after its TTL");
    assert!(h.pods().is_empty());
}

#[tokio::test]
async fn active_deadline_requeues_at_the_deadline() {
    let h = Harness::new();
    h.api.put(JOBS, job("a", json!({"runPolicy": {"activeDeadlineSeconds": 3600}, "tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    let action = h.reconcile("a").await;
    let text = format!("{action:?}");
    assert!(text.contains("3599") || text.contains("3600"), "{text}");
}

#[tokio::test]
async fn suspend_deletes_pods_and_resume_recreates_them() {
    let h = Harness::new();
    h.api.put(JOBS, job("p", json!({"tfReplicaSpecs": {"Worker": replica(2, "Never")}})));
    h.reconcile("p").await;
    h.api.update(&format!("{JOBS}/p"), |j| j["spec"]["runPolicy"] = json!({"suspend": true}));
    h.reconcile("p").await;
    assert!(h.pods().is_empty());
    assert_eq!(h.conditions("p").last().unwrap(), &c("Suspended", "True", "TFJobSuspended"));
    h.api.update(&format!("{JOBS}/p"), |j| j["spec"]["runPolicy"] = json!({"suspend": false}));
    h.reconcile("p").await;
    assert_eq!(h.pods(), vec!["p-worker-0", "p-worker-1"]);
    assert!(h.conditions("p").contains(&c("Suspended", "False", "TFJobResumed")));
}

#[tokio::test]
async fn jobs_managed_elsewhere_are_skipped() {
    let h = Harness::new();
    h.api.put(JOBS, job("m", json!({"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}, "tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    h.api.take_log();
    h.reconcile("m").await;
    assert!(h.api.take_log().is_empty());
    assert!(h.pods().is_empty());
}

/// Beside Kubeflow's training-operator (`--beside-kubeflow`): a job without `managedBy` (or
/// with Kubeflow's value) is Kubeflow's and left alone; one with `tfjob-rs.io/operator` runs.
#[tokio::test]
async fn beside_kubeflow_only_jobs_managed_by_this_operator_run() {
    let h = Harness::beside_kubeflow();
    for (name, run_policy) in [("plain", json!({})), ("kubeflows", json!({"managedBy": "kubeflow.org/training-operator"}))] {
        h.api.put(JOBS, job(name, json!({"runPolicy": run_policy, "tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
        h.api.take_log();
        h.reconcile(name).await;
        assert!(h.api.take_log().is_empty(), "{name} was touched");
    }
    h.api.put(JOBS, job("ours", json!({"runPolicy": {"managedBy": "tfjob-rs.io/operator"}, "tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    h.reconcile("ours").await;
    assert_eq!(h.pods(), ["ours-worker-0"]);
}

#[tokio::test]
async fn metrics_and_health() {
    let h = Harness::new();
    h.api.put(JOBS, job("x", json!({"tfReplicaSpecs": {"Worker": replica(1, "OnFailure")}})));
    h.reconcile("x").await;
    h.set_pod("x-worker-0", "Failed", Some(1), 0);
    h.reconcile("x").await;
    let text = h.ctx.metrics.render();
    let samples = exposition(&text);
    let sample = |name: &str, labels: &str| {
        samples.iter().find(|(n, l, _)| n == name && l == labels).map(|(_, _, v)| *v).unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in\n{text}"))
    };
    assert_eq!(sample("tfjob_reconcile_duration_seconds_count", ""), 2.0);
    assert_eq!(sample("tfjob_restarts_total", ""), 1.0);
    assert_eq!(sample("tfjob_jobs", r#"phase="Running""#), 0.0);
    // Kubeflow's counters: the job was created, then restarted its worker.
    let kubeflow = r#"job_namespace="ns",framework="tensorflow""#;
    assert_eq!(sample("training_operator_jobs_created_total", kubeflow), 1.0);
    assert_eq!(sample("training_operator_jobs_restarted_total", kubeflow), 1.0);
    // Reconciling again from the same observation counts nothing twice.
    h.reconcile("x").await;
    let text = h.ctx.metrics.render();
    assert!(text.contains(&format!("training_operator_jobs_created_total{{{kubeflow}}} 1\n")), "{text}");
}

/// The samples of an OpenMetrics text exposition: (name, labels as written, value). Checks the
/// format on the way: every sample's family has a TYPE line before it, values are numbers, and
/// the text ends with `# EOF`.
fn exposition(text: &str) -> Vec<(String, String, f64)> {
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end:\n{text}");
    let mut families: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            families.push(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample without a value");
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect("unclosed labels")),
            None => (series, ""),
        };
        assert!(families.iter().any(|f| name.starts_with(f.as_str())), "{name} has no TYPE line before it");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
        samples.push((name.to_string(), labels.to_string(), value));
    }
    samples
}

#[tokio::test]
async fn missing_crd_is_reported_clearly() {
    let api = FakeApi::default();
    let client = api.client();
    assert!(tfjob_operator::startup::check_crd(&client, Some("ns")).await.is_ok());
    api.state.lock().unwrap().unserved.push("/apis/kubeflow.org/".into());
    let err = tfjob_operator::startup::check_crd(&client, Some("ns")).await.unwrap_err().to_string();
    assert!(err.contains("CustomResourceDefinition (tfjobs.kubeflow.org) is not installed"), "{err}");
}

#[tokio::test]
async fn leader_election_on_a_lease() {
    use tfjob_operator::leader::LeaderElector;
    let api = FakeApi::default();
    let elector = |id: &str| LeaderElector {
        api: kube::Api::namespaced(api.client(), "ns"),
        name: "tfjob-operator".into(),
        identity: id.into(),
        lease_duration: std::time::Duration::from_secs(15),
    };
    let (a, b) = (elector("a"), elector("b"));
    assert!(a.try_acquire().await.unwrap(), "first comer takes the free lease");
    assert!(!b.try_acquire().await.unwrap(), "a live lease is respected");
    assert!(a.try_acquire().await.unwrap(), "the holder renews");
    let key = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/tfjob-operator";
    assert_eq!(api.get(key).unwrap()["spec"]["holderIdentity"], "a");
    // The holder stops renewing: once the lease has expired another instance takes over.
    api.update(key, |l| l["spec"]["renewTime"] = json!("2020-01-01T00:00:00.000000Z"));
    assert!(b.try_acquire().await.unwrap());
    let lease = api.get(key).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert!(!a.try_acquire().await.unwrap(), "the old holder has lost it");
}

/// A leader whose renewals the API server never answers gives the lease up within its renew
/// deadline (two thirds of the lease), before another instance may take the lease over: it never
/// leads beside the next leader.
#[tokio::test]
async fn a_leader_whose_renewals_are_never_answered_steps_down_before_its_lease_expires() {
    use std::time::{Duration, Instant};
    use tfjob_operator::leader::LeaderElector;
    let hangs = tower::service_fn(|_: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    let lease_duration = Duration::from_secs(3);
    let elector =
        LeaderElector { api: kube::Api::namespaced(kube::Client::new(hangs, "ns"), "ns"), name: "tfjob-operator".into(), identity: "a".into(), lease_duration };
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), elector.keep()).await.expect("the leader kept leading with no renewal answered");
    let took = started.elapsed();
    assert!(took >= lease_duration * 2 / 3 && took < lease_duration, "stepped down after {took:?}");
}

/// A leader keeps its lease through an API server that stops answering for half the lease: the
/// renewal that meets the stall has most of the renew deadline left (renewals every retry
/// period), and the ones after it renew again.
#[tokio::test]
async fn a_leader_keeps_its_lease_through_a_stall_shorter_than_its_renew_deadline() {
    use std::time::Duration;
    use tfjob_operator::leader::LeaderElector;
    let api = FakeApi::default();
    // Renewals every 0.4 s, given up after 2 s without one.
    let lease_duration = Duration::from_secs(3);
    let elector = LeaderElector { api: kube::Api::namespaced(api.client(), "ns"), name: "tfjob-operator".into(), identity: "a".into(), lease_duration };
    assert_eq!((elector.retry_period(), elector.renew_deadline()), (Duration::from_millis(400), Duration::from_secs(2)));
    assert!(elector.try_acquire().await.unwrap());
    let start = tokio::time::Instant::now();
    // From 0.9 s to 2.4 s nothing is answered: 1.5 s, more than the 1 s a renewal once a third
    // of the lease would have had left (its deadline at 2 s), less than the 2 s deadline.
    let state = api.state.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_millis(900)).await;
        state.lock().unwrap().stalled_until = Some(start + Duration::from_millis(2400));
    });
    let kept = tokio::time::timeout(Duration::from_secs(4), elector.keep()).await;
    assert!(kept.is_err(), "the leader stepped down after {:?}", start.elapsed());
    let lease = api.get("/apis/coordination.k8s.io/v1/namespaces/ns/leases/tfjob-operator").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
    let renewed: k8s_openapi::jiff::Timestamp = lease["spec"]["renewTime"].as_str().unwrap().parse().unwrap();
    let since = k8s_openapi::jiff::Timestamp::now().duration_since(renewed);
    assert!(since.as_secs_f64() < 1.0, "last renewed {since:?} ago");
}

#[tokio::test]
async fn health_and_metrics_over_http() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let metrics = Arc::new(tfjob_operator::metrics::Metrics::default());
    metrics.job("team", tfjob_operator::metrics::JobEvent::Succeeded);
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(tfjob_operator::metrics::serve(listener, metrics, ready.clone()));
    // One keep-alive connection for every request; the first one arrives in two pieces (a
    // server that answers after one read would see half a request).
    let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (read, mut write) = sock.into_split();
    let mut read = BufReader::new(read);
    write.write_all(b"GET /readyz HTTP/1.1\r\nHo").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut steps = vec![("", "/readyz", 503, "not ready")];
    steps.extend([
        ("GET /readyz", "/readyz", 200, "ok"),
        ("GET /healthz", "/healthz", 200, "ok"),
        ("GET /metrics", "/metrics", 200, "training_operator_jobs_successful_total"),
        ("GET /nope", "/nope", 404, ""),
    ]);
    for (i, (request, path, status, needle)) in steps.into_iter().enumerate() {
        if i == 0 {
            write.write_all(b"st: x\r\n\r\n").await.unwrap();
        } else {
            ready.store(true, Ordering::SeqCst);
            write.write_all(format!("{request} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        }
        let mut status_line = String::new();
        read.read_line(&mut status_line).await.unwrap();
        assert!(status_line.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {status_line}");
        let mut length = 0;
        let mut content_type = String::new();
        loop {
            let mut header = String::new();
            read.read_line(&mut header).await.unwrap();
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(": ").unwrap();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap(),
                "content-type" => content_type = value.to_string(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await.unwrap();
        let body = String::from_utf8(body).unwrap();
        assert!(body.contains(needle), "{path}: {body}");
        if path == "/metrics" {
            assert_eq!(content_type, tfjob_operator::metrics::CONTENT_TYPE);
            let samples = exposition(&body);
            assert!(
                samples
                    .iter()
                    .any(|(n, l, v)| n == "training_operator_jobs_successful_total" && l == r#"job_namespace="team",framework="tensorflow""# && *v == 1.0)
            );
        }
    }
    server.abort();
}

/// Polls `cond` until it holds (the controller works asynchronously); fails after 20 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// The whole controller (watches, owner mapping, reconcile, status, GC) against the fake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_follows_watch_events() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use tfjob_operator::controller::{build_controller, error_policy};

    let api = FakeApi::default();
    let client = api.client();
    let (controller, caches) = build_controller(client.clone(), None, 4);
    let ctx = Arc::new(Context::new(client.clone(), PlanOptions::default(), caches));
    let run = controller.run(reconcile, error_policy, ctx).for_each(|_| async {});
    let controller = tokio::spawn(run);

    let jobs: Api<TFJob> = Api::namespaced(client.clone(), "ns");
    let manifest = job("w", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "OnFailure")}}));
    jobs.create(&PostParams::default(), &serde_json::from_value(manifest).unwrap()).await.unwrap();
    eventually("3 pods, a service and the job's Secret (token and CA)", || {
        api.names(PODS).len() == 3 && api.names(SVCS) == ["w"] && api.names(SECRETS) == ["w-token"]
    })
    .await;
    let secret = api.get(&format!("{SECRETS}/w-token")).unwrap();
    let keys: Vec<&String> = secret["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "ca.key", "token"]);

    // The kubelet reports the pods running: the status follows through the pod watch.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    for p in ["w-ps-0", "w-worker-0", "w-worker-1"] {
        let st = json!({"status": {"phase": "Running"}});
        pods.patch_status(p, &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
    }
    let running = || {
        api.get(&format!("{JOBS}/w"))
            .is_some_and(|j| j["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Running" && c["status"] == "True")))
    };
    eventually("Running condition", running).await;

    // A worker pod disappears (node lost): the controller recreates it.
    pods.delete("w-worker-1", &Default::default()).await.unwrap();
    eventually("w-worker-1 recreated", || api.names(PODS).contains(&"w-worker-1".to_string())).await;

    // Scaling the job through the API adds a replica.
    let scale = json!({"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 3}}}});
    jobs.patch("w", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    eventually("w-worker-2 created", || api.names(PODS).contains(&"w-worker-2".to_string())).await;

    // Deleting the job leaves nothing behind.
    jobs.delete("w", &Default::default()).await.unwrap();
    eventually("everything gone", || api.all_keys().iter().all(|k| k.starts_with(EVENTS) || k.contains("/leases/"))).await;
    controller.abort();
}

/// The requests of a log that touch `collection` (e.g. `POST /api/v1/namespaces/ns/pods`).
fn requests_to<'l>(log: &'l [String], method: &str, collection: &str) -> Vec<&'l String> {
    log.iter().filter(|l| l.starts_with(&format!("{method} {collection}"))).collect()
}

#[tokio::test]
async fn a_stale_cache_neither_creates_nor_recreates_twice() {
    let h = Harness::new();
    h.api.put(JOBS, job("s", json!({"tfReplicaSpecs": {"Worker": replica(2, "ExitCode")}})));
    h.reconcile("s").await;
    assert_eq!(h.pods(), vec!["s-worker-0", "s-worker-1"]);
    // The pod cache has not seen the new pods yet: the job waits for it instead of creating
    // them again.
    h.api.take_log();
    let action = h.reconcile_stale("s").await;
    assert_eq!(h.api.take_log(), Vec::<String>::new());
    assert!(format!("{action:?}").contains("requeue_after: Some"), "{action:?}");

    // A retryable failure: the pod is deleted once and created again once, even when reconciles
    // run before the cache shows the deletion.
    h.reconcile("s").await;
    h.set_pod("s-worker-1", "Failed", Some(137), 0);
    h.reconcile("s").await;
    let stale_failed_pod = h.api.take_log();
    assert_eq!(requests_to(&stale_failed_pod, "DELETE", PODS), vec!["DELETE /api/v1/namespaces/ns/pods/s-worker-1"]);
    h.reconcile_stale("s").await;
    assert_eq!(h.api.take_log(), Vec::<String>::new(), "the deletion is not seen yet");
    h.reconcile("s").await;
    let log = h.api.take_log();
    assert_eq!(requests_to(&log, "POST", PODS).len(), 1, "{log:#?}");
    assert_eq!(requests_to(&log, "DELETE", PODS).len(), 0, "{log:#?}");
    h.reconcile_stale("s").await;
    assert_eq!(h.api.take_log(), Vec::<String>::new(), "the new pod is not seen yet");
    h.reconcile("s").await;
    assert_eq!(h.pods(), vec!["s-worker-0", "s-worker-1"]);
    let st = h.job("s").unwrap().status.unwrap();
    assert_eq!(st.replica_statuses["Worker"].recreated, 1);
    assert_eq!(notes_of(&h, "ExitedWithCode"), vec!["Pod: ns.s-worker-1 exited with code 137 x1"]);
}

/// The job's Secret once per job (a recreated pod needs no write), never read.
#[tokio::test]
async fn the_token_secret_is_created_once_and_never_read() {
    let h = Harness::new();
    // A Secret left by an earlier run of the operator: kept, not replaced.
    let existing = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "t-token", "namespace": "ns"}, "data": {"token": "b2xk"}});
    h.api.put(SECRETS, existing);
    h.api.put(JOBS, job("t", json!({"tfReplicaSpecs": {"Worker": replica(2, "OnFailure")}})));
    h.api.take_log();
    h.reconcile("t").await;
    assert_eq!(h.pods(), vec!["t-worker-0", "t-worker-1"]);
    assert_eq!(h.api.get(&format!("{SECRETS}/t-token")).unwrap()["data"]["token"], "b2xk");
    // A pod recreated later needs no Secret write.
    h.set_pod("t-worker-1", "Failed", Some(1), 0);
    h.reconcile("t").await;
    h.reconcile("t").await;
    assert_eq!(h.pods(), vec!["t-worker-0", "t-worker-1"]);
    let log = h.api.take_log();
    assert_eq!(
        requests_to(&log, "POST", SECRETS),
        vec!["POST /api/v1/namespaces/ns/secrets"; 1],
        "the job's Secret (answered AlreadyExists), once: no Secret per replica"
    );
    assert_eq!(h.api.names(SECRETS), ["t-token"]);
    assert!(!log.iter().any(|l| l.contains("/secrets") && !l.starts_with("POST")), "the Secret is never read, listed or changed: {log:#?}");
    // No list of pods or Services either: they come from the caches.
    assert!(!log.iter().any(|l| l.starts_with("GET")), "{log:#?}");
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_fails_the_job_with_the_reason() {
    let h = Harness::new();
    let msg = "Pod \"r-worker-1\" is invalid: spec.dnsConfig.nameservers[0]: Invalid value: \"x\": must be valid IP address";
    h.api.state.lock().unwrap().refusals.push((format!("{PODS}/r-worker-1"), 422, "Invalid".into(), msg.into()));
    h.api.put(JOBS, job("r", json!({"tfReplicaSpecs": {"Worker": replica(2, "Never")}})));
    h.reconcile("r").await;
    let refused = format!("TFJob ns/r has failed because the API server refused pod r-worker-1: {msg}");
    assert_eq!(h.last_condition("r"), ("Failed".into(), "True".into(), "TFJobFailedValidation".into(), refused));
    assert_eq!(notes_of(&h, "FailedCreatePod"), vec![format!("Error creating: {msg} x1")]);
    assert!(h.event_reasons().contains(&("Warning".into(), "FailedCreatePod".into())));
    // The next reconcile cleans up (cleanPodPolicy Running) and tries nothing again.
    h.api.take_log();
    h.reconcile("r").await;
    let log = h.api.take_log();
    assert!(requests_to(&log, "POST", PODS).is_empty(), "{log:#?}");
    assert!(h.pods().is_empty(), "{:?}", h.pods());
}

#[tokio::test]
async fn a_pod_refused_for_now_is_retried_and_shows_on_the_job_meanwhile() {
    let h = Harness::new();
    let msg = "pods \"q-worker-1\" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=10, limited: pods=10";
    for pod in ["q-worker-1", "q-worker-2"] {
        h.api.state.lock().unwrap().refusals.push((format!("{PODS}/{pod}"), 403, "Forbidden".into(), msg.into()));
    }
    h.api.put(JOBS, job("q", json!({"tfReplicaSpecs": {"Worker": replica(3, "Never")}})));
    h.api.take_log();
    let action = h.reconcile("q").await;
    assert!(format!("{action:?}").contains("10s"), "retried later: {action:?}");
    let retrying = format!("TFJob ns/q cannot create pod q-worker-1 (retrying): {msg}");
    assert_eq!(h.last_condition("q"), ("ReplicaFailure".into(), "True".into(), "FailedCreatePod".into(), retrying));
    // Once the quota refused worker-1, worker-2 was not sent (it would be refused too): one
    // refused request and one Warning per attempt, not one per pod left.
    assert_eq!(h.pods(), vec!["q-worker-0"]);
    assert_eq!(requests_to(&h.api.take_log(), "POST", PODS).len(), 2);
    assert_eq!(notes_of(&h, "FailedCreatePod"), vec![format!("Error creating: {msg} x1")]);
    // Quota freed: the pods are created and the condition clears.
    h.api.state.lock().unwrap().refusals.clear();
    h.reconcile("q").await;
    assert_eq!(h.pods(), vec!["q-worker-0", "q-worker-1", "q-worker-2"]);
    assert!(h.conditions("q").contains(&c("ReplicaFailure", "False", "PodsCreated")));
    assert_eq!(h.conditions("q").last().unwrap().0, "Created");
}

#[tokio::test]
async fn failures_name_the_pod_its_exit_code_and_reason() {
    let h = Harness::new();
    h.api.put(JOBS, job("f", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}})));
    h.reconcile("f").await;
    h.api.update(&format!("{PODS}/f-worker-1"), |p| {
        p["status"] = json!({"phase": "Failed", "containerStatuses": [{
            "name": "tensorflow", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]});
    });
    h.reconcile("f").await;
    let failed = h.last_condition("f");
    assert_eq!(failed.0, "Failed");
    assert_eq!(
        failed.3,
        "TFJob ns/f has failed because 1 Worker replica(s) failed: pod f-worker-1 exited with \
         code 137 (OOMKilled)."
    );
    assert_eq!(notes_of(&h, "ExitedWithCode"), vec!["Pod: ns.f-worker-1 exited with code 137 (OOMKilled) x1"]);
    let related: Vec<String> = {
        let st = h.api.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|(k, e)| k.starts_with(EVENTS) && e["reason"] == "ExitedWithCode")
            .map(|(_, e)| format!("{} {}", e["type"], e["related"]["name"]))
            .collect()
    };
    assert_eq!(related, vec!["\"Warning\" \"f-worker-1\""]);
}

#[tokio::test]
async fn an_unschedulable_pod_shows_on_the_job() {
    let h = Harness::new();
    h.api.put(JOBS, job("u", json!({"tfReplicaSpecs": {"Worker": replica(2, "Never")}})));
    h.reconcile("u").await;
    let why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.";
    h.api.update(&format!("{PODS}/u-worker-1"), |p| {
        p["status"] = json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}]});
    });
    h.reconcile("u").await;
    let want = format!("1 pod(s) of TFJob ns/u cannot be scheduled (u-worker-1): {why}");
    assert_eq!(h.last_condition("u"), ("Unschedulable".into(), "True".into(), "Unschedulable".into(), want.clone()));
    assert_eq!(notes_of(&h, "Unschedulable"), vec![format!("{want} x1")]);
    // Still unschedulable: no new event. Then scheduled and running: the condition clears.
    h.reconcile("u").await;
    assert_eq!(notes_of(&h, "Unschedulable"), vec![format!("{want} x1")]);
    for p in ["u-worker-0", "u-worker-1"] {
        h.set_pod(p, "Running", None, 0);
    }
    h.reconcile("u").await;
    let conds = h.conditions("u");
    assert!(conds.contains(&c("Unschedulable", "False", "Scheduled")), "{conds:?}");
    assert_eq!(conds.last().unwrap(), &c("Running", "True", "TFJobRunning"));
}

/// A Kueue Workload of job `uid` (as Kueue writes it), admitted for `workers` workers or not.
fn workload(uid: &str, admitted_workers: Option<i32>) -> Value {
    let sets = json!([{"name": "ps", "count": 1}, {"name": "worker", "count": 2}]);
    let status = match admitted_workers {
        Some(n) => json!({
            "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "ps", "count": 1}, {"name": "worker", "count": n}]},
        }),
        None => json!({"conditions": [{"type": "QuotaReserved", "status": "False"}]}),
    };
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "tfjob-q-1a2b3", "namespace": "ns", "labels": {"kueue.x-k8s.io/job-uid": uid}},
        "spec": {"queueName": "team", "podSets": sets},
        "status": status,
    })
}

fn event_reasons(h: &Harness) -> Vec<String> {
    let mut r: Vec<String> = h
        .api
        .all_keys()
        .into_iter()
        .filter(|k| k.starts_with(EVENTS))
        .filter_map(|k| h.api.get(&k))
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect();
    r.sort();
    r
}

#[tokio::test]
async fn a_job_queued_in_kueue_runs_only_what_its_workload_admitted() {
    const WORKLOADS: &str = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads";
    let h = Harness::new();
    let mut j = job("q", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}}));
    j["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    h.api.put(JOBS, j);
    let uid = h.job("q").unwrap().metadata.uid.unwrap();
    // Not suspended (no Kueue webhook) but not admitted: no pod; nor while the quota is not reserved.
    h.reconcile("q").await;
    h.api.put(WORKLOADS, workload(&uid, None));
    h.reconcile("q").await;
    assert!(h.api.names(PODS).is_empty(), "{:?}", h.api.names(PODS));
    // Admitted for 1 worker of 2 (the job was scaled after its admission): ps-0 and worker-0.
    h.api.update(&format!("{WORKLOADS}/tfjob-q-1a2b3"), |w| *w = workload(&uid, Some(1)));
    h.reconcile("q").await;
    let mut pods = h.api.names(PODS);
    pods.sort();
    assert_eq!(pods, ["q-ps-0", "q-worker-0"]);
    let reasons = event_reasons(&h);
    // Said once before Kueue made the Workload, once naming it; not at every reconcile.
    assert_eq!(reasons.iter().filter(|r| *r == "WaitingForAdmission").count(), 2, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| *r == "ExceedsAdmission").count(), 1, "{reasons:?}");
    // Admitted for both: worker-1 too.
    h.api.update(&format!("{WORKLOADS}/tfjob-q-1a2b3"), |w| *w = workload(&uid, Some(2)));
    h.reconcile("q").await;
    assert_eq!(h.api.names(PODS).len(), 3);

    // Where Kueue is not installed its label means nothing: every pod at once.
    let h = Harness::new();
    h.api.state.lock().unwrap().unserved.push("/apis/kueue.x-k8s.io".into());
    let mut j = job("q", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}}));
    j["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": "team"});
    h.api.put(JOBS, j);
    h.reconcile("q").await;
    assert_eq!(h.api.names(PODS).len(), 3);
}

/// At shutdown the queue is flushed within its deadline even when the API server stops
/// answering and the queue is full (the flush marker itself waits for a slot then).
#[tokio::test]
async fn a_flush_returns_within_its_deadline_when_the_api_server_hangs_and_the_queue_is_full() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::Reporter;
    use tfjob_api::status::EventKind;
    use tfjob_operator::controller::event_queue::{EventQueue, Pending};
    use tfjob_operator::metrics::Metrics;
    let hangs = tower::service_fn(|_: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    let client = kube::Client::new(hangs, "default");
    let reporter = Reporter { controller: "tfjob-operator".into(), instance: None };
    let metrics = Arc::new(Metrics::default());
    let queue = EventQueue::with_capacity(client, reporter, metrics.clone(), 1);
    let probe = |i: usize| Pending {
        regarding: ObjectReference { kind: Some("TFJob".into()), name: Some("q".into()), namespace: Some("default".into()), ..Default::default() },
        kind: EventKind::Normal,
        reason: "Probe".into(),
        note: format!("probe {i}"),
        related: None,
    };
    // The writer takes the first and hangs on the API server; the second fills the queue.
    queue.push(probe(0));
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    queue.push(probe(1));
    let started = std::time::Instant::now();
    tokio::time::timeout(std::time::Duration::from_secs(10), queue.flush(std::time::Duration::from_millis(200)))
        .await
        .expect("the flush did not keep its deadline");
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}

/// A reconcile whose request the API server never answers is abandoned at its deadline with an
/// error (counted as `timeout`, retried by the error policy); it does not hold the job's
/// reconciles for ever (kube's scheduler runs no other reconcile of a job while one runs).
#[tokio::test]
async fn a_reconcile_the_api_server_never_answers_is_abandoned_at_its_deadline() {
    use std::time::{Duration, Instant};
    use tfjob_operator::controller::{Error, error_policy};
    let hangs = tower::service_fn(|_: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    let (pods, mut pod_writer) = pod_cache();
    let (services, mut service_writer) = reflector::store();
    relist(|e| pod_writer.apply_watcher_event(e), vec![]);
    relist(|e| service_writer.apply_watcher_event(e), vec![]);
    let mut ctx = Context::new(kube::Client::new(hangs, "default"), PlanOptions::default(), Caches::new(pods, services));
    let deadline = Duration::from_millis(200);
    ctx.reconcile_timeout = deadline;
    let ctx = Arc::new(ctx);
    let job: Arc<TFJob> = Arc::new(serde_json::from_value(job("hangs", json!({"tfReplicaSpecs": {"Worker": replica(1, "Never")}}))).unwrap());
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), reconcile(job.clone(), ctx.clone())).await.expect("the reconcile did not keep its deadline");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let err = result.expect_err("nothing answered, yet the reconcile succeeded");
    assert!(matches!(err, Error::Timeout(d) if d == deadline), "{err}");
    error_policy(job, &err, ctx.clone());
    let text = ctx.metrics.render();
    for line in ["tfjob_reconciles_in_flight 0", r#"tfjob_reconcile_errors_total{category="timeout"} 1"#] {
        assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
    }
}

/// An Event the API server never answers is given up (counted) and the ones queued after it are
/// tried: one lost request does not stop the operator's Events for ever.
#[tokio::test]
async fn an_event_the_api_server_never_answers_is_given_up_and_the_next_is_tried() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::Reporter;
    use std::time::{Duration, Instant};
    use tfjob_api::status::EventKind;
    use tfjob_operator::controller::event_queue::{EventQueue, Pending};
    use tfjob_operator::metrics::Metrics;
    let hangs = tower::service_fn(|_: http::Request<kube::client::Body>| {
        std::future::pending::<Result<http::Response<kube::client::Body>, std::convert::Infallible>>()
    });
    let metrics = Arc::new(Metrics::default());
    let reporter = Reporter { controller: "tfjob-operator".into(), instance: None };
    let queue = EventQueue::with_limits(kube::Client::new(hangs, "default"), reporter, metrics.clone(), 8, Duration::from_millis(100));
    for i in 0..2 {
        queue.push(Pending {
            regarding: ObjectReference { kind: Some("TFJob".into()), name: Some("q".into()), namespace: Some("default".into()), ..Default::default() },
            kind: EventKind::Normal,
            reason: "Probe".into(),
            note: format!("probe {i}"),
            related: None,
        });
    }
    let started = Instant::now();
    queue.flush(Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "the flush waited {:?}", started.elapsed());
    let line = r#"tfjob_reconcile_errors_total{category="event"} 2"#;
    let text = metrics.render();
    assert!(text.lines().any(|l| l == line), "no line {line:?} in\n{text}");
}

/// A reconcile does not wait for its Events: one task writes them in the order they were
/// queued. When the queue is full, the newest are dropped and counted; queuing never blocks.
#[tokio::test]
async fn events_are_written_in_order_and_a_full_queue_drops_the_newest_and_counts_them() {
    use kube::runtime::events::Reporter;
    use tfjob_api::status::EventKind;
    use tfjob_operator::controller::event_queue::EventQueue;
    use tfjob_operator::controller::events::job_event;
    const QUEUE_CAPACITY: usize = 64;
    let h = Harness::with_context(|ctx| {
        let reporter = Reporter { controller: "tfjob-operator".into(), instance: None };
        ctx.events = EventQueue::with_capacity(ctx.client.clone(), reporter, ctx.metrics.clone(), QUEUE_CAPACITY);
    });
    h.api.put(JOBS, job("q", json!({"tfReplicaSpecs": {"Worker": replica(1, "Never")}})));
    let job = h.job("q").unwrap();
    // On this test's one-thread runtime the writer runs only once the test awaits: every event
    // is queued before the first is written.
    let extra = 10;
    for i in 0..QUEUE_CAPACITY + extra {
        job_event(&h.ctx, &job, EventKind::Normal, "Probe", &format!("probe {i:05}"));
    }
    h.ctx.events.flush(std::time::Duration::from_secs(60)).await;
    let mut written: Vec<(u64, String)> = {
        let st = h.api.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|(k, e)| k.starts_with(EVENTS) && e["reason"] == "Probe")
            .map(|(_, e)| (e["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap(), e["note"].as_str().unwrap().to_string()))
            .collect()
    };
    written.sort();
    let notes: Vec<String> = written.into_iter().map(|(_, note)| note).collect();
    let queued: Vec<String> = (0..QUEUE_CAPACITY).map(|i| format!("probe {i:05}")).collect();
    assert!(notes == queued, "{} written; first {:?}, last {:?}", notes.len(), notes.first(), notes.last());
    let text = h.ctx.metrics.render();
    assert!(text.contains(&format!("tfjob_reconcile_errors_total{{category=\"event_dropped\"}} {extra}\n")), "{text}");
}

/// A job whose pods keep Kubeflow's layout (taken over from its training-operator: no TLS) gets
/// the job's CA in its Secret all the same: once those pods are gone, pods of this operator's
/// layout mount it from there.
#[tokio::test]
async fn a_job_in_kubeflows_layout_gets_its_ca_in_its_secret_all_the_same() {
    let h = Harness::new();
    h.api.put(JOBS, job("k", json!({"tfReplicaSpecs": {"Worker": replica(2, "OnFailure")}})));
    let uid = h.job("k").unwrap().metadata.uid.unwrap_or_default();
    let labels = json!({
        "training.kubeflow.org/job-name": "k",
        "training.kubeflow.org/operator-name": "tfjob-controller",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
    });
    let owner = json!([{"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "k", "uid": uid, "controller": true}]);
    let containers = json!([{"name": "tensorflow", "image": "tfjob-runtime:latest", "command": ["tfjob-runtime"]}]);
    // Kubeflow's pod: no hostname, no subdomain.
    h.api.put(PODS, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "k-worker-0", "namespace": "ns", "labels": labels, "ownerReferences": owner}, "spec": {"containers": containers}}));
    h.reconcile("k").await;
    let worker_1 = h.api.get(&format!("{PODS}/k-worker-1")).expect("worker 1 created");
    assert!(worker_1["spec"]["subdomain"].is_null(), "Kubeflow's layout kept: {worker_1:#}");
    assert!(worker_1["spec"]["volumes"].as_array().is_none_or(|v| v.is_empty()), "no TLS beside Kubeflow's pods: {worker_1:#}");
    let secret = h.api.get(&format!("{SECRETS}/k-token")).unwrap();
    let keys: Vec<&String> = secret["data"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "ca.key", "token"]);
}

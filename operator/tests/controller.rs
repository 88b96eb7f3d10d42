//! The reconcile function against an in-memory fake API server: every test goes through the
//! real kube client calls (list, get, create, server-side apply, status patch, delete, events).

mod fake;

use std::sync::Arc;

use fake::FakeApi;
use serde_json::{Value, json};
use tfjob_operator::api::TFJob;
use tfjob_operator::kube::{Context, reconcile};
use tfjob_operator::plan::{GangScheduler, PlanOptions};

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
}

impl Harness {
    fn new() -> Self {
        Self::with_opts(PlanOptions::default())
    }

    fn with_opts(opts: PlanOptions) -> Self {
        let api = FakeApi::default();
        let ctx = Arc::new(Context::new(api.client(), opts));
        Harness { api, ctx }
    }

    fn job(&self, name: &str) -> Option<TFJob> {
        self.api.get(&format!("{JOBS}/{name}")).map(|v| serde_json::from_value(v).unwrap())
    }

    async fn reconcile(&self, name: &str) -> kube::runtime::controller::Action {
        let job = self.job(name).expect("job exists");
        reconcile(Arc::new(job), self.ctx.clone()).await.expect("reconcile succeeds")
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
    let mut notes: Vec<String> = {
        let st = h.api.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|(k, e)| k.starts_with(EVENTS) && e["reason"] == "SuccessfulCreatePod")
            .map(|(_, e)| format!("{} -> {}", e["note"].as_str().unwrap(), e["related"]["name"].as_str().unwrap()))
            .collect()
    };
    notes.sort();
    assert_eq!(
        notes,
        vec!["Created pod: mnist-ps-0 -> mnist-ps-0", "Created pod: mnist-worker-0 -> mnist-worker-0", "Created pod: mnist-worker-1 -> mnist-worker-1"]
    );
    let mut reasons = h.event_reasons();
    reasons.sort();
    reasons.dedup();
    assert_eq!(reasons, vec![("Normal".into(), "SuccessfulCreatePod".into()), ("Normal".into(), "TFJobCreated".into())]);

    // A second pass changes nothing: same token, no pod writes, no status write.
    h.api.take_log();
    h.reconcile("mnist").await;
    let log = h.api.take_log();
    assert!(!log.iter().any(|l| l.starts_with("PATCH /api/v1/namespaces/ns/pods") || l.starts_with("DELETE")), "{log:#?}");
    assert!(!log.iter().any(|l| l.ends_with("/status")), "{log:#?}");
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
        vec![c("Created", "True", "TFJobCreated"), c("Running", "False", "TFJobRunning"), c("Succeeded", "True", "TFJobSucceeded")]
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
        if recreated {
            h.reconcile("j").await;
            assert_eq!(h.pods(), vec!["j-worker-0", "j-worker-1"], "{policy}: pod recreated");
            let st = h.job("j").unwrap().status.unwrap();
            assert_eq!(st.replica_statuses["Worker"].recreated, 1);
        }
    }
}

/// The `note`s of the events with this reason, sorted, each with how often it was sent (a
/// recorder folds a repeated event into a `series`).
fn notes_of(h: &Harness, reason: &str) -> Vec<String> {
    let st = h.api.state.lock().unwrap();
    let mut notes: Vec<String> = st
        .objects
        .iter()
        .filter(|(k, e)| k.starts_with(EVENTS) && e["reason"] == reason)
        .map(|(_, e)| {
            let repeats = e["series"]["count"].as_i64().unwrap_or(1);
            format!("{} x{repeats}", e["note"].as_str().unwrap_or_default())
        })
        .collect();
    notes.sort();
    notes
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
    reconcile(Arc::new(new), h.ctx.clone()).await.unwrap();
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
    reconcile(Arc::new(before_up), h.ctx.clone()).await.unwrap();
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
    let h = Harness::with_opts(PlanOptions { cluster_domain: None, gang_scheduler: Some(GangScheduler::Volcano) });
    h.api.put(JOBS, job("d", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "Never")}})));
    h.reconcile("d").await;
    assert!(h.api.get("/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/d").is_some());
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
    reconcile(Arc::new(deleting), h.ctx.clone()).await.unwrap();
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

#[tokio::test]
async fn metrics_and_health() {
    let h = Harness::new();
    h.api.put(JOBS, job("x", json!({"tfReplicaSpecs": {"Worker": replica(1, "OnFailure")}})));
    h.reconcile("x").await;
    h.set_pod("x-worker-0", "Failed", Some(1), 0);
    h.reconcile("x").await;
    let text = h.ctx.metrics.render();
    assert!(text.contains("tfjob_reconcile_duration_seconds_count 2"), "{text}");
    assert!(text.contains("tfjob_restarts_total 1"), "{text}");
    assert!(text.contains("tfjob_jobs{phase=\"Running\"} 0"), "{text}");
    let (code, _, _) = tfjob_operator::kube::http_response("/readyz", &h.ctx.metrics, false);
    assert_eq!(code, "503 Service Unavailable");
    let (code, body, _) = tfjob_operator::kube::http_response("/healthz", &h.ctx.metrics, false);
    assert_eq!((code, body.as_str()), ("200 OK", "ok\n"));
}

#[tokio::test]
async fn missing_crd_is_reported_clearly() {
    let api = FakeApi::default();
    let client = api.client();
    assert!(tfjob_operator::kube::check_crd(&client, Some("ns")).await.is_ok());
    api.state.lock().unwrap().unserved.push("/apis/kubeflow.org/".into());
    let err = tfjob_operator::kube::check_crd(&client, Some("ns")).await.unwrap_err().to_string();
    assert!(err.contains("CustomResourceDefinition (tfjobs.kubeflow.org) is not installed"), "{err}");
}

#[tokio::test]
async fn leader_election_on_a_lease() {
    use tfjob_operator::kube::LeaderElector;
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

#[tokio::test]
async fn health_and_metrics_over_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let metrics = Arc::new(tfjob_operator::kube::Metrics::default());
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(tfjob_operator::kube::serve_http(listener, metrics, ready));
    for (path, status, needle) in [
        ("/healthz", "200 OK", "ok"),
        ("/readyz", "200 OK", "ok"),
        ("/metrics", "200 OK", "tfjob_reconcile_errors_total"),
        ("/nope", "404 Not Found", "not found"),
    ] {
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut resp = String::new();
        sock.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {resp}");
        assert!(resp.contains(needle), "{path}: {resp}");
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
    use tfjob_operator::kube::{build_controller, error_policy};

    let api = FakeApi::default();
    let client = api.client();
    let ctx = Arc::new(Context::new(client.clone(), PlanOptions::default()));
    let run = build_controller(client.clone(), None, 4).run(reconcile, error_policy, ctx).for_each(|_| async {});
    let controller = tokio::spawn(run);

    let jobs: Api<TFJob> = Api::namespaced(client.clone(), "ns");
    let manifest = job("w", json!({"tfReplicaSpecs": {"PS": replica(1, "Never"), "Worker": replica(2, "OnFailure")}}));
    jobs.create(&PostParams::default(), &serde_json::from_value(manifest).unwrap()).await.unwrap();
    eventually("3 pods, a service and a secret", || api.names(PODS).len() == 3 && api.names(SVCS) == ["w"] && api.names(SECRETS) == ["w-token"]).await;

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

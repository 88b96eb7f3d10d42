//! What the controller knows without asking the API server: the watch caches of the pods and
//! Services it owns, what it is still waiting to see in them after its own writes
//! ([`Expectations`], and [`StatusWrites`] for its status writes), and which once-per-job
//! objects it has already written ([`Once`]).
//!
//! A reconcile reads the job's pods and Service from reflector stores fed by the watches that
//! also trigger reconciles, instead of listing them. A cache lags behind the API server: right
//! after the controller created or deleted a pod, the cache may not show it yet, and acting on
//! that stale picture would create the pod again or recreate it twice. So every write is
//! remembered as an expectation (Kubeflow's controllers do the same) and the job is not
//! reconciled again until the cache shows every expected change, or [`EXPECTATION_TTL`] has
//! passed (a lost watch event must not stall a job for ever).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::pod_index::PodCache;
use tfjob_api::api::TFJob;

/// How long the controller waits for its cache to show its own writes before acting anyway.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// The watch caches a reconcile reads.
#[derive(Clone)]
pub struct Caches {
    /// Pods with the operator's label.
    pub pods: Store<Pod>,
    /// The same pods, by job.
    pods_by_job: PodCache,
    /// Services with the operator's label.
    pub services: Store<Service>,
    /// Both caches hold their first full list; every clone wakes its waiter.
    ready: Shared<BoxFuture<'static, bool>>,
}

impl Caches {
    /// The caches of these stores.
    pub fn new(pods: PodCache, services: Store<Service>) -> Self {
        // kube-runtime's `Store::wait_until_ready` keeps the waker of only the last of several
        // concurrent waiters (its `DelayedInit` polls a oneshot receiver, which holds one
        // waker): the other reconciles waiting at startup slept until their timeout. So one
        // shared future waits on the stores and wakes every clone of it.
        let (p, s) = (pods.store.clone(), services.clone());
        let ready = async move { p.wait_until_ready().await.is_ok() && s.wait_until_ready().await.is_ok() }.boxed().shared();
        Caches { pods: pods.store.clone(), pods_by_job: pods, services, ready }
    }

    /// The pods of `job` in the cache: in its namespace, with its job-name label and, when the
    /// job has a uid, owned by it; in name order. Looked up by job ([`PodCache`]), not by a walk
    /// over every cached pod.
    pub fn pods_of(&self, job: &TFJob) -> Vec<std::sync::Arc<Pod>> {
        let Some(ns) = job.metadata.namespace.as_deref() else {
            return Vec::new();
        };
        let uid = job.metadata.uid.as_deref();
        let mut pods = self.pods_by_job.with_job_label(ns, job.name());
        pods.retain(|p| uid.is_none() || p.owner_references().iter().any(|o| Some(o.uid.as_str()) == uid));
        pods
    }

    /// The job's Service in the cache.
    pub fn service_of(&self, job: &TFJob) -> Option<std::sync::Arc<Service>> {
        let ns = job.namespace()?;
        self.services.get(&ObjectRef::new(job.name()).within(&ns))
    }

    /// Waits until both caches hold their first full list (at most `timeout`).
    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.ready.clone()).await.unwrap_or(false)
    }
}

/// A pod as the expectations see it in the cache: name, uid, being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPod<'a> {
    /// Name.
    pub name: &'a str,
    /// Uid.
    pub uid: &'a str,
    /// Has a deletion timestamp.
    pub terminating: bool,
}

impl<'a> CachedPod<'a> {
    /// The view of a pod.
    pub fn of(pod: &'a Pod) -> CachedPod<'a> {
        CachedPod {
            name: pod.metadata.name.as_deref().unwrap_or_default(),
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The writes of one job that the cache does not show yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Pending {
    /// Pods created, by name, with the uid the API server gave them.
    created: BTreeMap<String, String>,
    /// Pods deleted, by name, with the uid that was deleted.
    deleted: BTreeMap<String, String>,
    /// When the oldest of these writes was made.
    since: Option<Instant>,
}

impl Pending {
    /// Drops what `pods` already show: a created pod is in the cache with its uid; a deleted
    /// one is gone, replaced by another, or being deleted.
    fn observe(&mut self, pods: &[CachedPod<'_>]) {
        self.created.retain(|name, uid| !pods.iter().any(|p| p.name == name && p.uid == uid));
        self.deleted.retain(|name, uid| pods.iter().any(|p| p.name == name && p.uid == uid && !p.terminating));
    }

    fn is_empty(&self) -> bool {
        self.created.is_empty() && self.deleted.is_empty()
    }
}

/// Per job (its uid), the pod writes the cache has yet to show.
#[derive(Default)]
pub struct Expectations {
    jobs: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    fn with<T>(&self, job: &str, f: impl FnOnce(&mut Pending) -> T) -> T {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let pending = jobs.entry(job.to_string()).or_default();
        let out = f(pending);
        if pending.is_empty() {
            jobs.remove(job);
        }
        out
    }

    /// The controller created pod `name` (uid `uid`) of `job` at `now`.
    pub fn created(&self, job: &str, name: &str, uid: &str, now: Instant) {
        self.with(job, |p| {
            p.created.insert(name.to_string(), uid.to_string());
            p.since.get_or_insert(now);
        });
    }

    /// The controller deleted pod `name` (uid `uid`) of `job` at `now`.
    pub fn deleted(&self, job: &str, name: &str, uid: &str, now: Instant) {
        self.with(job, |p| {
            p.deleted.insert(name.to_string(), uid.to_string());
            p.since.get_or_insert(now);
        });
    }

    /// How long to wait before reconciling `job`: `None` once `pods` (the cache) show every
    /// write, or once the oldest unseen write is older than `ttl` (its expectations are then
    /// dropped).
    pub fn wait(&self, job: &str, pods: &[CachedPod<'_>], now: Instant, ttl: Duration) -> Option<Duration> {
        self.with(job, |p| {
            p.observe(pods);
            if p.is_empty() {
                return None;
            }
            let age = now.saturating_duration_since(p.since.unwrap_or(now));
            if age >= ttl {
                tracing::warn!(
                    job_uid = job,
                    pending = ?p,
                    "the pod cache did not show the controller's writes in time; acting anyway"
                );
                *p = Pending::default();
                return None;
            }
            Some(ttl - age)
        })
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, job: &str) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }
}

/// Per job (its uid), the version of the job that the controller's last status write was
/// computed from, until the TFJob cache shows another version. A reconcile of that same version
/// would start from a status older than the one just written, and its own write would be
/// refused as stale (409 Conflict, a request for nothing): it waits for the watch instead, which
/// triggers a reconcile once it delivers the write. As with the pod [`Expectations`], at most
/// for [`EXPECTATION_TTL`]. A write the API server answered with the version it was computed
/// from (it changed nothing) is not remembered: no other version would come to end the wait.
#[derive(Default)]
pub struct StatusWrites {
    jobs: Mutex<HashMap<String, (String, Instant)>>,
}

impl StatusWrites {
    /// The controller wrote `job`'s status at `now`, computed from the job's version `from`;
    /// the API server answered with the version `written`.
    pub fn wrote(&self, job: &str, from: &str, written: Option<&str>, now: Instant) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if written == Some(from) {
            jobs.remove(job);
        } else {
            jobs.insert(job.to_string(), (from.to_string(), now));
        }
    }

    /// How long to wait before reconciling `job` as the cache shows it now (`version`): `None`
    /// once the cache shows another version than the last write's (what was remembered goes),
    /// or once the write is `ttl` old.
    pub fn wait(&self, job: &str, version: Option<&str>, now: Instant, ttl: Duration) -> Option<Duration> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let (from, at) = jobs.get(job)?;
        let age = now.saturating_duration_since(*at);
        if version == Some(from.as_str()) && age < ttl {
            return Some(ttl - age);
        }
        jobs.remove(job);
        None
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, job: &str) {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }

    /// Forgets every job whose uid is not in `live`; returns how many went.
    pub fn retain_jobs(&self, live: &HashSet<String>) -> usize {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let before = jobs.len();
        jobs.retain(|k, _| live.contains(k));
        before - jobs.len()
    }
}

/// The jobs (by uid) for which this process has written an object that is written once per
/// job (the token Secret, the PodGroup): without reading it back, the controller knows it
/// exists. After a restart each active job gets one more create, answered `AlreadyExists`.
#[derive(Default)]
pub struct Once {
    done: Mutex<HashSet<String>>,
}

impl Once {
    /// Whether it was written for `uid`.
    pub fn contains(&self, uid: &str) -> bool {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).contains(uid)
    }

    /// It was written (or found to exist) for `uid`.
    pub fn insert(&self, uid: &str) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).insert(uid.to_string());
    }

    /// The job is finished or gone: nothing more is written for it.
    pub fn forget(&self, uid: &str) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
    }

    /// Forgets every key that starts with `prefix` (`<uid>/`: every version of a job).
    pub fn forget_prefix(&self, prefix: &str) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).retain(|k| !k.starts_with(prefix));
    }

    /// Keeps only the keys of jobs in `live` (a key is `<uid>` or `<uid>/...`); returns how many
    /// it forgot.
    pub fn retain_jobs(&self, live: &HashSet<String>) -> usize {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let before = done.len();
        done.retain(|k| live.contains(k.split('/').next().unwrap_or_default()));
        before - done.len()
    }
}

/// Whether an existing Service already is what the controller would apply: the same selector,
/// headless, publishing not-ready addresses, with the same named ports. Then nothing is written.
pub fn service_is_current(existing: &Service, desired: &Service) -> bool {
    let (Some(have), Some(want)) = (&existing.spec, &desired.spec) else {
        return false;
    };
    let ports = |s: &k8s_openapi::api::core::v1::ServiceSpec| {
        let mut p: Vec<(Option<String>, i32)> = s.ports.iter().flatten().map(|p| (p.name.clone(), p.port)).collect();
        p.sort();
        p
    };
    have.selector == want.selector
        && have.cluster_ip == want.cluster_ip
        && have.publish_not_ready_addresses == want.publish_not_ready_addresses
        && ports(have) == ports(want)
        && existing.labels() == desired.labels()
        && existing.owner_references() == desired.owner_references()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reconcile waits for the caches when it starts before their first lists are in; with
    /// several waiting, each goes on as soon as the lists are in (kube-runtime's
    /// `Store::wait_until_ready` wakes only the last of several waiters: the others waited for
    /// their 30 s timeout and held their jobs' reconciles meanwhile).
    #[tokio::test]
    async fn every_reconcile_waiting_for_the_caches_goes_on_when_their_lists_are_in() {
        use kube::runtime::{reflector, watcher};
        let (pods, mut pod_writer) = crate::controller::pod_index::pod_cache();
        let (services, mut service_writer) = reflector::store::<Service>();
        let caches = Caches::new(pods, services);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.wait_until_ready(Duration::from_secs(10)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        for event in [watcher::Event::Init, watcher::Event::InitDone] {
            pod_writer.apply_watcher_event(&event);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for event in [watcher::Event::Init, watcher::Event::InitDone] {
            service_writer.apply_watcher_event(&event);
        }
        for (i, waiter) in waiters.into_iter().enumerate() {
            let ready = tokio::time::timeout(Duration::from_secs(2), waiter).await;
            assert!(matches!(ready, Ok(Ok(true))), "waiter {i}: {ready:?}");
        }
    }

    fn pod<'a>(name: &'a str, uid: &'a str, terminating: bool) -> CachedPod<'a> {
        CachedPod { name, uid, terminating }
    }

    #[test]
    fn a_status_write_holds_reconciles_of_the_version_it_was_computed_from() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(30);
        // (the write (computed from, answered), the cache's version, seconds later, wait?, remembered after?)
        type Case = (&'static str, Option<(&'static str, Option<&'static str>)>, Option<&'static str>, u64, Option<u64>, bool);
        let cases: Vec<Case> = vec![
            ("no write", None, Some("7"), 0, None, false),
            ("the cache shows the version written from", Some(("7", Some("9"))), Some("7"), 1, Some(29), true),
            ("an answer without a version", Some(("7", None)), Some("7"), 1, Some(29), true),
            ("the cache shows the write", Some(("7", Some("9"))), Some("9"), 1, None, false),
            ("a job without a version", Some(("7", Some("9"))), None, 1, None, false),
            ("the write never showed: given up after the TTL", Some(("7", Some("9"))), Some("7"), 30, None, false),
            ("the write changed nothing: no newer version will come", Some(("7", Some("7"))), Some("7"), 1, None, false),
        ];
        for (what, wrote, version, later, want, kept) in cases {
            let writes = StatusWrites::default();
            if let Some((from, written)) = wrote {
                writes.wrote("uid", from, written, t0);
            }
            let wait = writes.wait("uid", version, t0 + Duration::from_secs(later), ttl);
            assert_eq!(wait, want.map(Duration::from_secs), "{what}");
            assert_eq!(writes.jobs.lock().unwrap().contains_key("uid"), kept, "{what}: remembered");
        }
        // Deleted or gone jobs are forgotten.
        let writes = StatusWrites::default();
        writes.wrote("a", "1", Some("2"), t0);
        writes.wrote("b", "1", Some("2"), t0);
        writes.forget("a");
        assert_eq!(writes.retain_jobs(&HashSet::new()), 1);
        assert!(writes.jobs.lock().unwrap().is_empty());
    }

    #[test]
    fn expectations_hold_the_job_until_the_cache_shows_the_writes() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(30);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // (writes: (created?, name, uid), cache, seconds later, wait?)
        type Case = (&'static str, Vec<(bool, &'static str, &'static str)>, Vec<CachedPod<'static>>, u64, Option<u64>);
        let cases: Vec<Case> = vec![
            ("nothing written", vec![], vec![], 0, None),
            ("created, not in the cache yet", vec![(true, "w0", "u1")], vec![], 1, Some(29)),
            ("created and cached", vec![(true, "w0", "u1")], vec![pod("w0", "u1", false)], 1, None),
            ("created again: the old pod in the cache does not count", vec![(true, "w0", "u2")], vec![pod("w0", "u1", true)], 2, Some(28)),
            ("deleted, still in the cache", vec![(false, "w0", "u1")], vec![pod("w0", "u1", false)], 3, Some(27)),
            ("deleted, cached as terminating", vec![(false, "w0", "u1")], vec![pod("w0", "u1", true)], 3, None),
            ("deleted, gone from the cache", vec![(false, "w0", "u1")], vec![], 3, None),
            ("one of two seen", vec![(true, "w0", "u1"), (true, "w1", "u2")], vec![pod("w0", "u1", false)], 5, Some(25)),
            ("never seen: given up after the TTL", vec![(true, "w0", "u1")], vec![], 30, None),
        ];
        for (what, writes, cache, later, want) in cases {
            let e = Expectations::default();
            for (created, name, uid) in &writes {
                if *created {
                    e.created("ns/j", name, uid, t0);
                } else {
                    e.deleted("ns/j", name, uid, t0);
                }
            }
            let got = e.wait("ns/j", &cache, at(later), ttl);
            assert_eq!(got, want.map(Duration::from_secs), "{what}");
            // Other jobs are not held.
            assert_eq!(e.wait("ns/other", &[], at(later), ttl), None, "{what}");
        }
    }

    #[test]
    fn a_satisfied_or_forgotten_job_is_not_held_again() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(30);
        let e = Expectations::default();
        e.created("ns/j", "w0", "u1", t0);
        assert!(e.wait("ns/j", &[], t0, ttl).is_some());
        assert_eq!(e.wait("ns/j", &[pod("w0", "u1", false)], t0, ttl), None);
        // Seen once is enough: the pod may go away later (a failure) without holding the job.
        assert_eq!(e.wait("ns/j", &[], t0, ttl), None);
        e.deleted("ns/j", "w0", "u1", t0);
        e.forget("ns/j");
        assert_eq!(e.wait("ns/j", &[pod("w0", "u1", false)], t0, ttl), None);
    }

    #[test]
    fn once_keeps_only_the_jobs_still_there() {
        let once = Once::default();
        for key in ["u1", "u1/j-worker-0-tls", "u2/j-worker-0-tls", "u2/3", "u3"] {
            once.insert(key);
        }
        let live: HashSet<String> = ["u2".to_string()].into();
        assert_eq!(once.retain_jobs(&live), 3);
        assert!(once.contains("u2/j-worker-0-tls") && once.contains("u2/3"));
        assert!(!once.contains("u1") && !once.contains("u1/j-worker-0-tls") && !once.contains("u3"));
    }

    #[test]
    fn once_remembers_jobs_by_uid() {
        let once = Once::default();
        assert!(!once.contains("u1"));
        once.insert("u1");
        assert!(once.contains("u1") && !once.contains("u2"));
        once.forget("u1");
        assert!(!once.contains("u1"));
    }

    #[test]
    fn a_service_is_rewritten_only_when_it_differs() {
        use k8s_openapi::api::core::v1::ServicePort;
        let job: TFJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [
                {"name": "tensorflow", "image": "i"}]}}}}},
        }))
        .unwrap();
        let desired = tfjob_api::plan::build_service(&job);
        // What the API server returns: defaults filled in (clusterIPs, protocol, targetPort).
        let mut stored = desired.clone();
        stored.metadata.resource_version = Some("7".into());
        let spec = stored.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["None".into()]);
        spec.type_ = Some("ClusterIP".into());
        for p in spec.ports.iter_mut().flatten() {
            p.protocol = Some("TCP".into());
            p.target_port = Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p.port));
        }
        assert!(service_is_current(&stored, &desired));
        let mut other_port = stored.clone();
        other_port.spec.as_mut().unwrap().ports = Some(vec![ServicePort { name: Some("tfjob-port".into()), port: 3333, ..Default::default() }]);
        assert!(!service_is_current(&other_port, &desired));
        let mut not_headless = stored.clone();
        not_headless.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.7".into());
        assert!(!service_is_current(&not_headless, &desired));
        let mut relabelled = stored.clone();
        relabelled.metadata.labels = None;
        assert!(!service_is_current(&relabelled, &desired));
    }
}

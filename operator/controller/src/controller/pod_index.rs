//! The pod cache, indexed by job: the reflector store of the operator's pods and, beside it, the
//! names of each job's pods (by namespace and job-name label), both kept by the same watch
//! events ([`PodCacheWriter`]).
//!
//! A reconcile reads its job's pods. Read from the store alone, that was a walk over every pod
//! the operator watches: on a cluster that keeps the pods of thousands of finished jobs
//! (`cleanPodPolicy: None`, Kubeflow's default), every reconcile paid for all of them, and a
//! restart that reconciles every job paid for them once per job. kube-runtime's store has no
//! secondary index (its `Store::find` walks too), hence this one.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use tfjob_api::plan;

/// The names of each job's pods: namespace → job-name label → pod names, and the way back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobPodIndex {
    /// (namespace, job name) → the names of its pods.
    by_job: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, pod name) → the job name the pod was filed under.
    job_of: HashMap<(String, String), String>,
}

impl JobPodIndex {
    /// Files `pod` under its job-name label (moved if the label changed; dropped from the index
    /// when it has none).
    pub fn insert(&mut self, pod: &Pod) {
        let key = pod_key(pod);
        let job = pod.labels().get(plan::LABEL_JOB_NAME).cloned();
        if self.job_of.get(&key) == job.as_ref() {
            return;
        }
        self.remove_key(&key);
        if let Some(job) = job {
            self.by_job.entry((key.0.clone(), job.clone())).or_default().insert(key.1.clone());
            self.job_of.insert(key, job);
        }
    }

    /// Forgets `pod`.
    pub fn remove(&mut self, pod: &Pod) {
        self.remove_key(&pod_key(pod));
    }

    fn remove_key(&mut self, key: &(String, String)) {
        let Some(job) = self.job_of.remove(key) else {
            return;
        };
        let job_key = (key.0.clone(), job);
        if let Some(names) = self.by_job.get_mut(&job_key) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_job.remove(&job_key);
            }
        }
    }

    /// The names of the pods filed under job `job` of namespace `ns`, in order.
    pub fn pods_of(&self, ns: &str, job: &str) -> Vec<String> {
        self.by_job.get(&(ns.to_string(), job.to_string())).map(|names| names.iter().cloned().collect()).unwrap_or_default()
    }

    /// How many pods are filed.
    pub fn len(&self) -> usize {
        self.job_of.len()
    }

    /// No pod is filed.
    pub fn is_empty(&self) -> bool {
        self.job_of.is_empty()
    }
}

fn pod_key(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.name_any())
}

/// The read side: the reflector store of the pods and the index beside it.
#[derive(Clone)]
pub struct PodCache {
    /// Every pod the operator watches.
    pub store: Store<Pod>,
    index: Arc<RwLock<JobPodIndex>>,
}

impl PodCache {
    /// The pods in namespace `ns` with job-name label `job`, in name order.
    pub fn with_job_label(&self, ns: &str, job: &str) -> Vec<Arc<Pod>> {
        // The index stays locked while its names are looked up: the writer changes the store
        // under the same lock, so the two are read as of the same watch event.
        let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
        // The store is the truth: a name the index files and the store no longer (or not yet)
        // has is left out, and so is a pod whose label the store shows changed.
        index
            .pods_of(ns, job)
            .iter()
            .filter_map(|name| self.store.get(&ObjectRef::new(name).within(ns)))
            .filter(|p| p.labels().get(plan::LABEL_JOB_NAME).map(String::as_str) == Some(job))
            .collect()
    }

    /// A copy of the index (for tests).
    pub fn index(&self) -> JobPodIndex {
        self.index.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The write side: applies each watch event to the store and to the index, as kube-runtime's
/// `Writer` does to the store alone (a relist is buffered and swapped in at its end, so the
/// index shows the old list until the store does too).
pub struct PodCacheWriter {
    store: Writer<Pod>,
    index: Arc<RwLock<JobPodIndex>>,
    relisted: JobPodIndex,
}

impl PodCacheWriter {
    /// Applies one watch event.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<Pod>) {
        // The index first, and locked until the store has the event too. The store's first
        // `InitDone` marks it ready and wakes the reconciles waiting for the caches: applied
        // before the index (as it once was), a reconcile could run in between, find no pod of
        // its job in the still empty index, and create every pod again (409s; seen once, taking
        // over Kubeflow's running jobs on a loaded machine).
        let mut index = self.index.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(pod) => index.insert(pod),
            watcher::Event::Delete(pod) => index.remove(pod),
            watcher::Event::Init => self.relisted = JobPodIndex::default(),
            watcher::Event::InitApply(pod) => self.relisted.insert(pod),
            watcher::Event::InitDone => *index = std::mem::take(&mut self.relisted),
        }
        self.store.apply_watcher_event(event);
    }
}

/// An empty pod cache and its writer.
pub fn pod_cache() -> (PodCache, PodCacheWriter) {
    let (store, writer) = reflector::store::<Pod>();
    let index = Arc::new(RwLock::new(JobPodIndex::default()));
    (PodCache { store, index: index.clone() }, PodCacheWriter { store: writer, index, relisted: JobPodIndex::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn pod(ns: &str, name: &str, job: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        if let Some(job) = job {
            p.labels_mut().insert(plan::LABEL_JOB_NAME.into(), job.into());
        }
        p
    }

    /// The pods a walk over the whole store finds: what the index must give.
    fn by_walk(cache: &PodCache, ns: &str, job: &str) -> Vec<String> {
        let mut names: Vec<String> = cache
            .store
            .state()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .filter(|p| p.labels().get(plan::LABEL_JOB_NAME).map(String::as_str) == Some(job))
            .map(|p| p.name_any())
            .collect();
        names.sort();
        names
    }

    fn indexed(cache: &PodCache, ns: &str, job: &str) -> Vec<String> {
        cache.with_job_label(ns, job).iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn the_index_gives_what_a_walk_over_the_store_gives_after_every_kind_of_event() {
        let a0 = pod("ns", "a-worker-0", Some("a"));
        let a1 = pod("ns", "a-worker-1", Some("a"));
        let b0 = pod("ns", "b-worker-0", Some("b"));
        let other_ns = pod("other", "a-worker-0", Some("a"));
        let unlabelled = pod("ns", "stray", None);
        let a1_relabelled = pod("ns", "a-worker-1", Some("b"));
        // (what happens, then the pods of (ns, a), (ns, b), (other, a))
        type Case = (&'static str, Vec<Event<Pod>>, [&'static [&'static str]; 3]);
        let cases: Vec<Case> = vec![
            ("nothing listed yet", vec![], [&[], &[], &[]]),
            (
                "first list",
                vec![Event::Init, Event::InitApply(a0.clone()), Event::InitApply(b0.clone()), Event::InitApply(other_ns.clone()), Event::InitDone],
                [&["a-worker-0"], &["b-worker-0"], &["a-worker-0"]],
            ),
            ("a pod created", vec![Event::Apply(a1.clone())], [&["a-worker-0", "a-worker-1"], &["b-worker-0"], &["a-worker-0"]]),
            ("a pod without the label", vec![Event::Apply(unlabelled.clone())], [&["a-worker-0", "a-worker-1"], &["b-worker-0"], &["a-worker-0"]]),
            ("a pod modified", vec![Event::Apply(a1.clone())], [&["a-worker-0", "a-worker-1"], &["b-worker-0"], &["a-worker-0"]]),
            ("a pod relabelled to another job", vec![Event::Apply(a1_relabelled.clone())], [&["a-worker-0"], &["a-worker-1", "b-worker-0"], &["a-worker-0"]]),
            ("a pod deleted", vec![Event::Delete(a1_relabelled)], [&["a-worker-0"], &["b-worker-0"], &["a-worker-0"]]),
            ("the same name in another namespace deleted", vec![Event::Delete(other_ns)], [&["a-worker-0"], &["b-worker-0"], &[]]),
            ("a relist under way shows the old list", vec![Event::Init, Event::InitApply(a1.clone())], [&["a-worker-0"], &["b-worker-0"], &[]]),
            ("the relist done replaces it", vec![Event::InitApply(b0), Event::InitDone], [&["a-worker-1"], &["b-worker-0"], &[]]),
            ("an empty relist", vec![Event::Init, Event::InitDone], [&[], &[], &[]]),
        ];
        let (cache, mut writer) = pod_cache();
        for (what, events, want) in cases {
            for event in &events {
                writer.apply_watcher_event(event);
            }
            for ((ns, job), want) in [("ns", "a"), ("ns", "b"), ("other", "a")].into_iter().zip(want) {
                assert_eq!(indexed(&cache, ns, job), want, "{what}: pods of {ns}/{job}");
                assert_eq!(indexed(&cache, ns, job), by_walk(&cache, ns, job), "{what}: index and store disagree on {ns}/{job}");
            }
        }
        assert!(cache.index().is_empty(), "an empty relist leaves nothing filed: {:?}", cache.index());
    }

    #[test]
    fn random_events_leave_the_index_equal_to_a_walk_over_the_store() {
        // A small linear congruential generator: the same sequence every run.
        let mut state = 0x2545_f491_u64;
        let mut next = |n: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        let (namespaces, jobs) = (["ns", "other"], ["a", "b", "c"]);
        let (cache, mut writer) = pod_cache();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        for step in 0..5_000 {
            let ns = namespaces[next(2) as usize];
            let name = format!("p{}", next(12));
            let job = match next(7) {
                6 => None,
                j => Some(jobs[(j % 3) as usize]),
            };
            let event = match next(20) {
                0 => Event::Init,
                1 => Event::InitDone,
                2..=4 => Event::InitApply(pod(ns, &name, job)),
                5..=9 => Event::Delete(pod(ns, &name, job)),
                _ => Event::Apply(pod(ns, &name, job)),
            };
            writer.apply_watcher_event(&event);
            for ns in namespaces {
                for job in jobs {
                    assert_eq!(indexed(&cache, ns, job), by_walk(&cache, ns, job), "step {step} ({event:?}): {ns}/{job}");
                }
            }
        }
        assert_eq!(cache.index().len(), cache.store.state().iter().filter(|p| p.labels().contains_key(plan::LABEL_JOB_NAME)).count());
    }

    /// A reader that finds the store ready (as a reconcile woken by the first list does) finds
    /// the listed pods in the index too. A reader spins on another thread while each of many
    /// fresh caches gets its first list; applied to the store before the index, the pods were
    /// missed in some of these rounds.
    #[test]
    fn a_reader_that_finds_the_store_ready_finds_the_first_list_indexed() {
        use futures::FutureExt;
        use std::sync::Barrier;
        let listed = pod("ns", "a-worker-0", Some("a"));
        let mut missed = 0;
        for _ in 0..2_000 {
            let (cache, mut writer) = pod_cache();
            let both = Arc::new(Barrier::new(2));
            let reader = {
                let (cache, both) = (cache.clone(), both.clone());
                std::thread::spawn(move || {
                    both.wait();
                    loop {
                        let ready = cache.store.wait_until_ready().now_or_never().is_some();
                        if ready {
                            return cache.with_job_label("ns", "a").len();
                        }
                        std::hint::spin_loop();
                    }
                })
            };
            both.wait();
            for event in [Event::Init, Event::InitApply(listed.clone()), Event::InitDone] {
                writer.apply_watcher_event(&event);
            }
            if reader.join().unwrap() != 1 {
                missed += 1;
            }
        }
        assert_eq!(missed, 0, "rounds in which a reader found the store ready and the index without the pod");
    }
}

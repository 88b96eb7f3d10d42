use serde_json::json;

use super::*;
use crate::api::TFJob;

/// Replica types of a case: (type, replicas, resources in YAML flow style).
type Types<'a> = &'a [(&'a str, i32, &'a str)];

/// Expected minimum resources: name to quantity.
type Resources = BTreeMap<&'static str, &'static str>;

/// A job from its `spec` in YAML flow style, each replica type given as `(type, replicas,
/// resources)`.
fn spec(run_policy: &str, elastic: &str, types: &[(&str, i32, &str)]) -> TFJobSpec {
    let mut y = String::from("apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: j, namespace: ns}\nspec:\n");
    if !run_policy.is_empty() {
        y.push_str(&format!("  runPolicy: {run_policy}\n"));
    }
    if !elastic.is_empty() {
        y.push_str(&format!("  elasticPolicy: {elastic}\n"));
    }
    y.push_str("  tfReplicaSpecs:\n");
    for (t, n, resources) in types {
        let resources = if resources.is_empty() { String::new() } else { format!(", resources: {resources}") };
        y.push_str(&format!("    {t}:\n      replicas: {n}\n      template: {{spec: {{containers: [{{name: tensorflow, image: i{resources}}}]}}}}\n"));
    }
    let job: TFJob = serde_saphyr::from_str(&y).unwrap();
    job.spec
}

#[test]
fn the_gang_is_the_smallest_viable_job() {
    let cases: &[(&str, &str, &str, Types, i32)] = &[
        ("every replica of a fixed job", "", "", &[("PS", 2), ("Worker", 3)].map(|(t, n)| (t, n, "")), 5),
        ("minAvailable wins", "{schedulingPolicy: {minAvailable: 2}}", "{minReplicas: 2}", &[("PS", 1, ""), ("Worker", 4, "")], 2),
        ("an elastic job: ps, chief and the fewest workers", "", "{minReplicas: 2, maxReplicas: 8}", &[("Chief", 1, ""), ("PS", 1, ""), ("Worker", 6, "")], 4),
        ("an elastic job without minReplicas: one worker", "", "{maxReplicas: 8}", &[("PS", 2, ""), ("Worker", 6, "")], 3),
        ("fewer workers than the minimum: those there are", "", "{minReplicas: 3}", &[("PS", 1, ""), ("Worker", 2, "")], 3),
        ("the evaluator is a member", "", "{minReplicas: 1}", &[("PS", 1, ""), ("Worker", 4, ""), ("Evaluator", 1, "")], 3),
    ];
    for (what, rp, elastic, types, want) in cases {
        assert_eq!(min_member(&spec(rp, elastic, types)), *want, "{what}");
    }
}

#[test]
fn minimum_resources_are_the_requests_of_the_first_members() {
    let ps = "{requests: {cpu: 500m, memory: 1Gi}}";
    let worker = "{requests: {cpu: \"1\"}, limits: {cpu: \"2\", memory: 512Mi, nvidia.com/gpu: 1}}";
    let cases: &[(&str, &str, &str, Types, Resources)] = &[
        ("all members", "", "", &[("PS", 2, ps), ("Worker", 2, worker)], BTreeMap::from([("cpu", "3"), ("memory", "3221225472"), ("nvidia.com/gpu", "2")])),
        // ps first (1 cpu, 2Gi), then one worker: its limit stands for the memory and gpu it
        // does not request.
        (
            "elastic: ps and one worker",
            "",
            "{minReplicas: 1}",
            &[("PS", 2, ps), ("Worker", 3, worker)],
            BTreeMap::from([("cpu", "2"), ("memory", "2684354560"), ("nvidia.com/gpu", "1")]),
        ),
        (
            "minAvailable cuts into the ps",
            "{schedulingPolicy: {minAvailable: 1}}",
            "",
            &[("PS", 2, ps), ("Worker", 3, worker)],
            BTreeMap::from([("cpu", "500m"), ("memory", "1073741824")]),
        ),
        ("the manifest's minResources win", "{schedulingPolicy: {minResources: {cpu: 7}}}", "", &[("PS", 2, ps)], BTreeMap::from([("cpu", "7")])),
        ("no requests: none", "", "", &[("PS", 1, ""), ("Worker", 2, "")], BTreeMap::new()),
    ];
    for (what, rp, elastic, types, want) in cases {
        let s = spec(rp, elastic, types);
        let got: BTreeMap<String, String> = min_resources(&s, min_member(&s)).into_iter().map(|(k, q)| (k, q.0)).collect();
        let want: BTreeMap<String, String> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn pod_groups_for_each_scheduler() {
    let s =
        spec("{schedulingPolicy: {queue: q1, priorityClass: high, scheduleTimeoutSeconds: 30}}", "", &[("PS", 1, "{requests: {cpu: 1}}"), ("Worker", 2, "")]);
    assert_eq!(pod_group_spec(&s, &GangScheduler::Volcano), json!({"minMember": 3, "minResources": {"cpu": "1"}, "queue": "q1", "priorityClassName": "high"}));
    let plugins = GangScheduler::from_setting("scheduler-plugins-scheduler").unwrap();
    assert_eq!(pod_group_spec(&s, &plugins), json!({"minMember": 3, "minResources": {"cpu": "1"}, "scheduleTimeoutSeconds": 30}));
    // Volcano's queue when the job names none.
    let s = spec("", "", &[("Worker", 2, "")]);
    assert_eq!(pod_group_spec(&s, &GangScheduler::Volcano), json!({"minMember": 2, "queue": "default"}));
    // How each scheduler finds a pod's gang.
    assert_eq!(
        GangScheduler::Volcano.pod_marks("j", ReplicaType::PS),
        (vec![], vec![("scheduling.k8s.io/group-name", "j".to_string()), ("volcano.sh/task-spec", "ps".to_string())])
    );
    assert_eq!(plugins.pod_marks("j", ReplicaType::Worker), (vec![("scheduling.x-k8s.io/pod-group", "j".to_string())], vec![]));
    // Kubernetes' own: a gang's minimum count only; the pods keep their scheduler.
    let native = GangScheduler::from_setting("kubernetes").unwrap();
    let s = spec("", "{minReplicas: 1}", &[("PS", 1, "{requests: {cpu: 1}}"), ("Worker", 4, "")]);
    assert_eq!(pod_group_spec(&s, &native), json!({"schedulingPolicy": {"gang": {"minCount": 2}}}));
    assert_eq!((native.api_version(), native.scheduler_name(), native.pod_marks("j", ReplicaType::PS)), ("scheduling.k8s.io/v1beta1", None, (vec![], vec![])));
}

#[test]
fn a_volcano_gang_holds_every_pod_until_it_is_inqueue() {
    for (phase, open) in [(None, false), (Some(""), false), (Some("Pending"), false), (Some("Inqueue"), true), (Some("Running"), true), (Some("Unknown"), true)]
    {
        let a = volcano_admission("j", phase);
        assert_eq!(a.allows(ReplicaType::PS, 0), open, "{phase:?}");
        assert_eq!(a.allows(ReplicaType::Worker, 7), open, "{phase:?}");
        if let Admission::Limited { reason, message, .. } = a {
            assert_eq!(reason, "GangPending");
            assert!(message.contains("PodGroup j") && message.contains("Inqueue"), "{message}");
        }
    }
}

fn workload(name: &str, conditions: &[(&str, &str)], assignments: serde_json::Value) -> serde_json::Value {
    let conditions: Vec<_> = conditions.iter().map(|(t, s)| json!({"type": t, "status": s})).collect();
    json!({
        "metadata": {"name": name},
        "spec": {"podSets": [{"name": "ps", "count": 1}, {"name": "worker", "count": 3}]},
        "status": {"conditions": conditions, "admission": {"clusterQueue": "cq", "podSetAssignments": assignments}},
    })
}

#[test]
fn a_queued_job_runs_only_what_kueue_admitted() {
    let two_workers = json!([{"name": "ps", "count": 1}, {"name": "worker", "count": 2}]);
    // (what, workloads, replicas allowed [ps 0, worker 0, worker 1, worker 2, chief 0])
    let cases: Vec<(&str, Vec<serde_json::Value>, [bool; 5])> = vec![
        ("no workload yet", vec![], [false; 5]),
        ("quota reserved, not admitted", vec![workload("tfjob-j-1", &[("QuotaReserved", "True"), ("Admitted", "False")], json!([]))], [false; 5]),
        (
            "admitted: its counts",
            vec![workload("tfjob-j-1", &[("QuotaReserved", "True"), ("Admitted", "True")], two_workers.clone())],
            [true, true, true, false, false],
        ),
        (
            "a count missing: the pod set's",
            vec![workload("tfjob-j-1", &[("Admitted", "True")], json!([{"name": "ps"}, {"name": "worker"}]))],
            [true, true, true, true, false],
        ),
        ("finished: nothing", vec![workload("tfjob-j-1", &[("Admitted", "True"), ("Finished", "True")], two_workers.clone())], [false; 5]),
        (
            "the admitted one of two",
            vec![workload("tfjob-j-2", &[("Admitted", "False")], json!([])), workload("tfjob-j-1", &[("Admitted", "True")], two_workers)],
            [true, true, true, false, false],
        ),
    ];
    for (what, workloads, want) in cases {
        let a = kueue_admission("team", &workloads);
        let got = [(ReplicaType::PS, 0), (ReplicaType::Worker, 0), (ReplicaType::Worker, 1), (ReplicaType::Worker, 2), (ReplicaType::Chief, 0)]
            .map(|(t, i)| a.allows(t, i));
        assert_eq!(got, want, "{what}");
    }
    let Admission::Limited { reason, message, .. } = kueue_admission("team", &[]) else { panic!() };
    assert_eq!((reason, message.as_str()), ("WaitingForAdmission", "waiting for Kueue to admit the job in queue team (workload (none yet))"));
    let w = workload("tfjob-j-1", &[("Admitted", "True")], json!([{"name": "ps", "count": 1}, {"name": "worker", "count": 2}]));
    let Admission::Limited { reason, message, .. } = kueue_admission("team", &[w]) else { panic!() };
    assert_eq!(reason, "ExceedsAdmission");
    assert!(message.starts_with("Kueue admitted PS 1, Worker 2 (workload tfjob-j-1, queue team)"), "{message}");
}

#[test]
fn the_queue_label() {
    let labels = BTreeMap::from([(KUEUE_QUEUE_LABEL.to_string(), "team".to_string())]);
    assert_eq!(kueue_queue(Some(&labels)), Some("team"));
    assert_eq!(kueue_queue(Some(&BTreeMap::from([(KUEUE_QUEUE_LABEL.to_string(), String::new())]))), None);
    assert_eq!(kueue_queue(None), None);
}

#[test]
fn a_queued_jobs_pods_form_one_kueue_pod_group_per_size() {
    let labels = BTreeMap::from([(KUEUE_QUEUE_LABEL.to_string(), "team".to_string())]);
    let member = |name: &str, group: Option<&str>, total: Option<i32>, terminating: bool| GroupMember {
        name: name.into(),
        group: group.map(str::to_string),
        total,
        terminating,
    };
    let g1 = kueue_group_name("j", "0123abcd-ffff", 1);
    assert_eq!(g1, "j-0123abcd-g1");
    // (case, generation, total, members) -> (group, stale, leaving)
    type Case<'a> = (&'a str, i64, i32, Vec<GroupMember>, &'a str, Vec<&'a str>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        ("no pod yet: a group of this generation", 1, 3, vec![], "j-0123abcd-g1", vec![], vec![]),
        (
            "a pod created again joins its group, whatever the generation now",
            4,
            3,
            vec![member("j-ps-0", Some(&g1), Some(3), false), member("j-worker-0", Some(&g1), Some(3), false)],
            "j-0123abcd-g1",
            vec![],
            vec![],
        ),
        (
            "all pods being deleted (preempted): the pods created again join their group",
            4,
            3,
            vec![member("j-ps-0", Some(&g1), Some(3), true), member("j-worker-0", Some(&g1), Some(3), true)],
            "j-0123abcd-g1",
            vec![],
            vec![],
        ),
        (
            "scaled: a new group once the old size's pods are gone",
            4,
            4,
            vec![member("j-ps-0", Some(&g1), Some(3), false), member("j-worker-0", Some(&g1), Some(3), false)],
            "j-0123abcd-g4",
            vec!["j-ps-0", "j-worker-0"],
            vec![],
        ),
        (
            "scaled while the old size's pods are being deleted already: they are leaving",
            4,
            4,
            vec![member("j-ps-0", Some(&g1), Some(3), true), member("j-worker-0", Some(&g1), Some(3), false)],
            "j-0123abcd-g4",
            vec!["j-worker-0"],
            vec!["j-ps-0"],
        ),
        (
            "scaled after every pod of the old size was deleted: all leaving, none to delete",
            4,
            4,
            vec![member("j-ps-0", Some(&g1), Some(3), true), member("j-worker-0", Some(&g1), Some(3), true)],
            "j-0123abcd-g4",
            vec![],
            vec!["j-ps-0", "j-worker-0"],
        ),
        (
            "a live pod of no group is stale",
            4,
            3,
            vec![member("j-ps-0", Some(&g1), Some(3), true), member("j-worker-0", None, None, false)],
            "j-0123abcd-g1",
            vec!["j-worker-0"],
            vec![],
        ),
    ];
    let names = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(",");
    for (case, generation, total, members, group, stale, leaving) in cases {
        let plan = kueue_pod_group("j", "0123abcd-ffff", generation, Some(&labels), total, &members).unwrap();
        let got = (plan.group.name.as_str(), names(&plan.stale), names(&plan.leaving));
        assert_eq!(got, (group, stale.join(","), leaving.join(",")), "{case}");
        assert_eq!(plan.regrouping(), !stale.is_empty() || !leaving.is_empty(), "{case}");
        assert_eq!((plan.group.queue.as_str(), plan.group.total), ("team", total), "{case}");
    }
    assert_eq!(kueue_pod_group("j", "u", 1, None, 3, &[]), None, "a job not queued has no group");
    // A long job name is cut: the name stays a label value.
    let long = kueue_group_name(&"a".repeat(80), "0123abcd", 12);
    assert_eq!((long.len(), long.ends_with("-0123abcd-g12")), (63, true));
}

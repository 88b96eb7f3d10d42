use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::checkpoint;
use crate::cluster::TaskId;
use crate::embedding::EmbeddingPart;
use crate::optimizer::Optimizer;
use crate::proto::{self, DataType, RowsPart, TensorPart, UpdateMode};
use crate::tensor::f32_to_bytes;

fn tid(job: &str, i: u32) -> Option<proto::TaskId> {
    Some(proto::TaskId { job: job.into(), index: i })
}

fn config(mode: UpdateMode, required: u32) -> proto::TrainingConfig {
    proto::TrainingConfig {
        mode: mode as i32,
        optimizer: Some(Optimizer::sgd(0.5).to_proto()),
        replicas_to_aggregate: required,
        total_num_replicas: 3,
        elastic: false,
        follow_chief_aggregation: false,
    }
}

fn part(name: &str, shape: &[i64], offset: u64, values: &[f32]) -> TensorPart {
    TensorPart { name: name.into(), dtype: DataType::DtFloat as i32, shape: shape.to_vec(), offset, content: f32_to_bytes(values) }
}

/// A store holding `w` = [1, 2, 3] (shape [3]) and `b` = [0] (shape [1]).
fn store(mode: UpdateMode, required: u32) -> ParameterStore {
    let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
    let msgs = vec![
        proto::InitVariablesRequest {
            task: tid("worker", 0),
            config: Some(config(mode, required)),
            placement_fingerprint: 7,
            part: Some(part("w", &[3], 0, &[1.0, 2.0])),
            step: 0,
            embeddings: vec![],
        },
        proto::InitVariablesRequest { part: Some(part("w", &[3], 2, &[3.0])), ..Default::default() },
        proto::InitVariablesRequest { part: Some(part("b", &[1], 0, &[0.0])), ..Default::default() },
    ];
    assert!(!s.init(&msgs).unwrap().already_initialized);
    s
}

#[test]
fn first_initialisation_wins() {
    let s = store(UpdateMode::Async, 1);
    let again = vec![proto::InitVariablesRequest {
        task: tid("worker", 0),
        config: Some(config(UpdateMode::Async, 1)),
        placement_fingerprint: 7,
        part: Some(part("w", &[3], 0, &[9.0, 9.0, 9.0])),
        step: 0,
        embeddings: vec![],
    }];
    assert!(s.init(&again).unwrap().already_initialized);
    assert_eq!(s.values("w").unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn only_the_chief_initialises() {
    let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("chief", 0))));
    let msgs = vec![proto::InitVariablesRequest {
        task: tid("worker", 1),
        config: Some(config(UpdateMode::Async, 1)),
        part: Some(part("w", &[1], 0, &[1.0])),
        ..Default::default()
    }];
    assert!(matches!(s.init(&msgs), Err(StoreError::PermissionDenied(_))));
    assert!(!s.progress().initialized);
}

#[test]
fn async_push_applies_at_once() {
    let s = store(UpdateMode::Async, 1);
    let r = s.push(&TaskId::new("worker", 1), 0, 0, &[part("w", &[3], 0, &[2.0, 2.0, 2.0]), part("b", &[1], 0, &[-2.0])]).unwrap();
    assert!(r.accepted);
    assert_eq!(r.step, 1);
    assert_eq!(s.values("w").unwrap(), vec![0.0, 1.0, 2.0]);
    assert_eq!(s.values("b").unwrap(), vec![1.0]);
    // Stale gradients are applied in async training (as in TensorFlow).
    let r = s.push(&TaskId::new("worker", 0), 0, 0, &[part("b", &[1], 0, &[2.0])]).unwrap();
    assert!(r.accepted && !r.stale);
    assert_eq!(s.values("b").unwrap(), vec![0.0]);
}

#[test]
fn sync_push_waits_for_enough_replicas() {
    let s = store(UpdateMode::Sync, 2);
    let w = |g: f32| vec![part("w", &[3], 0, &[g, g, g]), part("b", &[1], 0, &[g])];
    let r = s.push(&TaskId::new("worker", 0), 0, 0, &w(1.0)).unwrap();
    assert!(r.accepted && r.step == 0);
    assert_eq!(s.values("b").unwrap(), vec![0.0], "nothing applied with one of two");
    // A retry from the same worker does not count.
    s.push(&TaskId::new("worker", 0), 0, 0, &w(100.0)).unwrap();
    assert_eq!(s.progress().step, 0);
    let r = s.push(&TaskId::new("worker", 1), 0, 0, &w(3.0)).unwrap();
    assert_eq!(r.step, 1);
    // average 2, lr 0.5 → -1
    assert_eq!(s.values("b").unwrap(), vec![-1.0]);
    // The backup worker's gradient for step 0 is stale now.
    let r = s.push(&TaskId::new("worker", 2), 0, 0, &w(5.0)).unwrap();
    assert!(r.stale && !r.accepted);
    let st = s.stats();
    assert_eq!((st.stale_gradients_dropped, st.duplicate_gradients_dropped), (1, 2));
    assert_eq!(s.values("b").unwrap(), vec![-1.0]);
}

/// Every bad push is refused with the right code and changes nothing.
#[test]
fn bad_pushes_change_nothing() {
    for mode in [UpdateMode::Async, UpdateMode::Sync] {
        let s = store(mode, 1);
        let good_b = part("b", &[1], 0, &[1.0]);
        type Case = (&'static str, i64, Vec<TensorPart>, fn(&StoreError) -> bool);
        let cases: Vec<Case> = vec![
            ("unknown variable", 0, vec![part("nope", &[1], 0, &[1.0])], |e| matches!(e, StoreError::NotFound(_))),
            ("wrong shape", 0, vec![part("w", &[1, 3], 0, &[1.0, 1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
            ("wrong dtype", 0, vec![TensorPart { dtype: DataType::DtDouble as i32, ..part("b", &[1], 0, &[1.0]) }], |e| {
                matches!(e, StoreError::InvalidArgument(_))
            }),
            ("wrong byte length", 0, vec![TensorPart { content: Bytes::from_static(&[1, 2, 3, 4, 5]), ..part("b", &[1], 0, &[1.0]) }], |e| {
                matches!(e, StoreError::InvalidArgument(_))
            }),
            ("part past the end", 0, vec![part("w", &[3], 2, &[1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
            ("variable not fully covered", 0, vec![part("w", &[3], 0, &[1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
            ("overlapping parts", 0, vec![part("w", &[3], 0, &[1.0, 1.0]), part("w", &[3], 1, &[1.0, 1.0])], |e| matches!(e, StoreError::InvalidArgument(_))),
            ("step from the future", 5, vec![good_b.clone()], |e| matches!(e, StoreError::FailedPrecondition(_))),
            ("negative step", -1, vec![good_b.clone()], |e| matches!(e, StoreError::InvalidArgument(_))),
            ("a bad part poisons the whole push", 0, vec![good_b.clone(), part("nope", &[1], 0, &[1.0])], |e| matches!(e, StoreError::NotFound(_))),
        ];
        for (name, step, parts, code) in cases {
            let err = s.push(&TaskId::new("worker", 1), step, 0, &parts).expect_err(name);
            assert!(code(&err), "{mode:?} {name}: {err:?}");
            assert_eq!(s.values("w").unwrap(), vec![1.0, 2.0, 3.0], "{mode:?} {name}");
            assert_eq!(s.values("b").unwrap(), vec![0.0], "{mode:?} {name}");
            assert_eq!(s.progress().step, 0, "{mode:?} {name}");
        }
    }
}

#[test]
fn listed_tasks_are_waited_for_even_before_they_join() {
    let s = store(UpdateMode::Async, 1);
    s.expect(&[TaskId::new("worker", 0), TaskId::new("worker", 1)]);
    // The chief (worker:0 here) is not waited for; worker:1 is, until it is told.
    assert_eq!(s.pending(), vec!["worker:1".to_string()]);
    s.told_training_is_over(&TaskId::new("worker", 1));
    assert!(s.pending().is_empty());
}

/// A task is told that training is over by a reply: the ps, which exits once it waits for no
/// task, waits too while that reply is being written (its exit would cut it off).
#[test]
fn a_reply_on_its_way_keeps_the_ps_until_it_is_written() {
    let s = store(UpdateMode::Async, 1);
    let worker = TaskId::new("worker", 1);
    s.expect(std::slice::from_ref(&worker));
    assert!(s.still_telling());
    let reply = s.reply_on_its_way();
    s.told_training_is_over(&worker);
    assert!(s.pending().is_empty());
    assert!(s.still_telling(), "the reply telling worker:1 is not written yet");
    let other = s.reply_on_its_way();
    drop(reply);
    assert!(s.still_telling(), "another reply is on its way");
    drop(other);
    assert!(!s.still_telling());
}

/// An evaluator told that training is over makes its final evaluation
/// then: the ps (and so the chief, which ends the job) waits for it until
/// it leaves, not until it hears the news.
#[test]
fn an_evaluator_is_waited_for_until_it_leaves_not_until_it_is_told() {
    let s = store(UpdateMode::Async, 1);
    let (worker, evaluator) = (TaskId::new("worker", 1), TaskId::new("evaluator", 0));
    s.expect(&[worker.clone(), evaluator.clone()]);
    s.told_training_is_over(&worker);
    s.told_training_is_over(&evaluator);
    assert_eq!(s.pending(), vec!["evaluator:0".to_string()]);
    s.leave(&evaluator);
    assert!(s.pending().is_empty());
}

/// A tensor channel pull keeps the values of its step while it sends
/// them: an update meanwhile works on a copy; with no pull holding
/// them, the update is in place.
#[test]
fn shared_pulls_keep_the_values_of_their_step() {
    let s = store(UpdateMode::Async, 1);
    let worker = TaskId::new("worker", 0);
    let grads = || vec![part("w", &[3], 0, &[1.0, 1.0, 1.0]), part("b", &[1], 0, &[1.0])];
    let (p, shared) = s.shared_snapshot(&[]).unwrap();
    assert_eq!(p.step, 0);
    assert_eq!(shared.iter().map(|v| (v.name.as_str(), v.shape.clone())).collect::<Vec<_>>(), vec![("b", vec![1]), ("w", vec![3])]);
    assert_eq!(*shared[1].values, vec![1.0, 2.0, 3.0]);
    s.push(&worker, 0, 0, &grads()).unwrap();
    assert_eq!(*shared[1].values, vec![1.0, 2.0, 3.0], "the pull in flight still sends step 0");
    let now = s.values("w").unwrap();
    assert_ne!(now, vec![1.0, 2.0, 3.0]);
    let (p, again) = s.shared_snapshot(&["w".into()]).unwrap();
    assert_eq!((p.step, again[0].values.to_vec()), (1, now));
    let address = again[0].values.as_ptr();
    drop((shared, again));
    s.push(&worker, 1, 0, &grads()).unwrap();
    let (_, last) = s.shared_snapshot(&["w".into()]).unwrap();
    assert_eq!(last[0].values.as_ptr(), address, "nobody held it: updated in place");
    assert!(matches!(s.shared_snapshot(&["nope".into()]), Err(StoreError::NotFound(_))));
}

#[test]
fn pulls() {
    let s = store(UpdateMode::Async, 1);
    let (p, t) = s.snapshot(&[], 8).unwrap();
    assert_eq!(p.step, 0);
    // w = [1, 2, 3] in parts of 2 elements.
    assert_eq!(t.iter().map(|p| (p.name.as_str(), p.offset)).collect::<Vec<_>>(), vec![("b", 0), ("w", 0), ("w", 2)]);
    assert_eq!(t[2].content, f32_to_bytes(&[3.0]));
    // Same step: the same bytes are shared, not re-encoded.
    let (_, t2) = s.snapshot(&["w".into()], 8).unwrap();
    assert_eq!(t[1].content.as_ptr(), t2[0].content.as_ptr());
    assert!(matches!(s.snapshot(&["nope".into()], 8), Err(StoreError::NotFound(_))));
    let fresh = ParameterStore::new(PsConfig::new(0, 1, None));
    assert!(matches!(fresh.snapshot(&[], 8), Err(StoreError::FailedPrecondition(_))));
    assert!(matches!(fresh.shared_snapshot(&[]), Err(StoreError::FailedPrecondition(_))));
    assert!(matches!(fresh.push(&TaskId::new("worker", 0), 0, 0, &[]), Err(StoreError::FailedPrecondition(_))));
}

#[test]
fn handshake_checks_the_view() {
    let s = store(UpdateMode::Sync, 2);
    let spec = |name: &str, shape: &[i64]| proto::VariableSpec { name: name.into(), dtype: DataType::DtFloat as i32, shape: shape.to_vec(), embedding: None };
    let good = proto::HandshakeRequest {
        task: tid("worker", 1),
        config: Some(config(UpdateMode::Sync, 2)),
        variables: vec![spec("w", &[3]), spec("b", &[1])],
        placement_fingerprint: 7,
        num_ps: 1,
        observer: false,
        dense_pieces: vec![],
    };
    let r = s.handshake(&good).unwrap();
    assert!(r.initialized);
    let cases: Vec<(&str, proto::HandshakeRequest, &str)> = vec![
        ("shape", proto::HandshakeRequest { variables: vec![spec("w", &[4]), spec("b", &[1])], ..good.clone() }, "variable \"w\": this ps holds shape [3]"),
        ("missing", proto::HandshakeRequest { variables: vec![spec("w", &[3])], ..good.clone() }, "variable \"b\" of this ps is missing"),
        (
            "extra",
            proto::HandshakeRequest { variables: vec![spec("w", &[3]), spec("b", &[1]), spec("c", &[1])], ..good.clone() },
            "\"c\" is not placed on this ps",
        ),
        ("fingerprint", proto::HandshakeRequest { placement_fingerprint: 8, ..good.clone() }, "fingerprints differ"),
        ("config", proto::HandshakeRequest { config: Some(config(UpdateMode::Async, 2)), ..good.clone() }, "training configuration mismatch"),
        ("num_ps", proto::HandshakeRequest { num_ps: 2, ..good.clone() }, "num_ps"),
        ("too many to aggregate", proto::HandshakeRequest { config: Some(config(UpdateMode::Sync, 4)), ..good.clone() }, "exceeds total_num_replicas"),
        ("no task", proto::HandshakeRequest { task: None, ..good.clone() }, "task: missing"),
    ];
    for (name, req, want) in cases {
        let err = s.handshake(&req).expect_err(name).to_string();
        assert!(err.contains(want), "{name}: {err}");
    }
    // An evaluator's configuration is not compared.
    let obs = proto::HandshakeRequest { observer: true, config: None, task: tid("evaluator", 0), ..good };
    assert!(s.handshake(&obs).is_ok());
}

#[test]
fn shutdown_is_for_the_chief() {
    let s = store(UpdateMode::Async, 1);
    let req = |t| proto::ShutdownRequest { task: t, reason: "done".into(), final_step: 0 };
    assert!(matches!(s.shutdown(&req(tid("worker", 1))), Err(StoreError::PermissionDenied(_))));
    assert!(!s.progress().done);
    s.shutdown(&req(tid("worker", 0))).unwrap();
    assert!(s.progress().done);
    let r = s.push(&TaskId::new("worker", 1), 0, 0, &[part("b", &[1], 0, &[1.0])]).unwrap();
    assert!(r.done && !r.accepted);
    assert_eq!(s.values("b").unwrap(), vec![0.0]);
}

#[test]
fn a_retried_push_is_applied_once() {
    let s = store(UpdateMode::Async, 1);
    let g = [part("b", &[1], 0, &[2.0])];
    let w = TaskId::new("worker", 1);
    assert!(s.push(&w, 0, 1, &g).unwrap().accepted);
    let again = s.push(&w, 0, 1, &g).unwrap();
    assert!(!again.accepted);
    assert_eq!(s.values("b").unwrap(), vec![-1.0]);
    assert!(s.push(&w, 1, 2, &g).unwrap().accepted);
    assert_eq!(s.values("b").unwrap(), vec![-2.0]);
    assert_eq!(s.stats().duplicate_gradients_dropped, 1);
}

/// Elastic sync: the step aggregates over the live leases; a worker that
/// leaves or whose lease expires no longer holds the step back.
#[test]
fn elastic_sync_follows_live_workers() {
    let s = ParameterStore::new(PsConfig { lease: Duration::from_millis(50), ..PsConfig::new(0, 1, Some(TaskId::new("worker", 0))) });
    let mut cfg = config(UpdateMode::Sync, 0);
    cfg.elastic = true;
    cfg.total_num_replicas = 0;
    let hs = |i: u32| proto::HandshakeRequest {
        task: tid("worker", i),
        config: Some(cfg),
        variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }],
        placement_fingerprint: 7,
        num_ps: 1,
        observer: false,
        dense_pieces: vec![],
    };
    for i in 0..3 {
        s.handshake(&hs(i)).unwrap();
    }
    let init = vec![proto::InitVariablesRequest {
        task: tid("worker", 0),
        config: Some(cfg),
        placement_fingerprint: 7,
        part: Some(part("b", &[1], 0, &[0.0])),
        step: 0,
        embeddings: vec![],
    }];
    s.init(&init).unwrap();
    assert_eq!(s.stats().replicas_to_aggregate, 3);
    let g = [part("b", &[1], 0, &[1.0])];
    s.push(&TaskId::new("worker", 0), 0, 0, &g).unwrap();
    s.push(&TaskId::new("worker", 1), 0, 0, &g).unwrap();
    assert_eq!(s.progress().step, 0, "3 live workers: 2 gradients are not enough");
    // worker 2 leaves (scale-down): the step completes with the two it has.
    s.leave(&TaskId::new("worker", 2));
    assert_eq!(s.progress().step, 1);
    // A new worker joins (scale-up): the next step needs 3 again.
    s.handshake(&hs(3)).unwrap();
    s.push(&TaskId::new("worker", 0), 1, 0, &g).unwrap();
    s.push(&TaskId::new("worker", 3), 1, 0, &g).unwrap();
    assert_eq!(s.progress().step, 1);
    s.push(&TaskId::new("worker", 1), 1, 0, &g).unwrap();
    assert_eq!(s.progress().step, 2);
    // Leases run out for workers 1 and 3; worker 0 alone completes steps.
    std::thread::sleep(Duration::from_millis(60));
    s.heartbeat(&TaskId::new("worker", 0), &Default::default());
    let expired = s.expire_leases(Instant::now());
    assert_eq!(expired, vec!["worker:1".to_string(), "worker:3".to_string()]);
    s.push(&TaskId::new("worker", 0), 2, 0, &g).unwrap();
    assert_eq!(s.progress().step, 3);
    assert_eq!(s.live_tasks(), vec!["worker:0".to_string()]);
}

/// A training task's heartbeat: its latest loss and its `--train_steps`.
fn trained(loss: Option<f32>, train_steps: i64) -> (TaskId, proto::HeartbeatRequest) {
    (TaskId::new("worker", 1), proto::HeartbeatRequest { task: tid("worker", 1), loss, train_steps, evaluation: None })
}

/// The evaluator's heartbeat after an evaluation at `step`.
fn evaluated(step: i64, loss: f32, accuracy: Option<f32>) -> (TaskId, proto::HeartbeatRequest) {
    let evaluation = proto::Evaluation { step, loss, accuracy, auc: None };
    (TaskId::new("evaluator", 0), proto::HeartbeatRequest { task: tid("evaluator", 0), evaluation: Some(evaluation), ..Default::default() })
}

/// What the store keeps of the figures heartbeats report: the latest
/// training loss, the largest `--train_steps`, the evaluation of the
/// highest step; an evaluator's heartbeat reports but holds no lease.
/// (case, heartbeats in order, loss, train_steps, evaluation kept as (step, loss, accuracy), live tasks)
#[test]
fn heartbeats_report_the_training_figures() {
    type Case = (&'static str, Vec<(TaskId, proto::HeartbeatRequest)>, Option<f32>, i64, Option<(i64, f32, Option<f32>)>, &'static [&'static str]);
    let cases: Vec<Case> = vec![
        ("nothing reported", vec![], None, 0, None, &[]),
        ("before the first step", vec![trained(None, 100)], None, 100, None, &["worker:1"]),
        ("the latest loss", vec![trained(Some(2.0), 100), trained(Some(3.0), 100)], Some(3.0), 100, None, &["worker:1"]),
        ("a heartbeat without a loss keeps it", vec![trained(Some(2.0), 0), trained(None, 0)], Some(2.0), 0, None, &["worker:1"]),
        ("the largest bound", vec![trained(None, 300), trained(None, 100), trained(None, 0)], None, 300, None, &["worker:1"]),
        ("an evaluation, without a lease", vec![evaluated(5, 1.0, Some(0.5))], None, 0, Some((5, 1.0, Some(0.5))), &[]),
        (
            "the evaluation of the highest step (the last of equals)",
            vec![evaluated(5, 1.0, None), evaluated(9, 0.5, None), evaluated(7, 0.7, Some(0.9)), evaluated(9, 0.4, Some(0.8))],
            None,
            0,
            Some((9, 0.4, Some(0.8))),
            &[],
        ),
        ("both kinds", vec![trained(Some(1.5), 50), evaluated(3, 2.0, None)], Some(1.5), 50, Some((3, 2.0, None)), &["worker:1"]),
    ];
    for (case, heartbeats, loss, train_steps, evaluation, live) in cases {
        let s = ParameterStore::new(PsConfig::new(0, 1, None));
        for (task, report) in &heartbeats {
            s.heartbeat(task, report);
        }
        let stats = s.stats();
        assert_eq!(stats.loss, loss, "{case}");
        assert_eq!(stats.train_steps, train_steps, "{case}");
        assert_eq!(stats.evaluation.map(|e| (e.step, e.loss, e.accuracy)), evaluation, "{case}");
        assert_eq!(stats.live_tasks, live.iter().map(|t| t.to_string()).collect::<Vec<_>>(), "{case}");
    }
}

fn shard_request(task: u32, finished: Option<(u64, u64, u64)>, want: bool) -> proto::NextShardRequest {
    proto::NextShardRequest {
        task: tid("worker", task),
        plan: Some(proto::DatasetPlan { examples: 25, shard_size: 10, seed: 3, num_epochs: 1 }),
        finished: finished.map(|(epoch, index, _)| proto::ShardRef { epoch, index }),
        want,
        generation: finished.map_or(0, |(_, _, g)| g),
        keep: None,
    }
}

fn assigned(r: &proto::NextShardReply) -> (u64, u64, u64) {
    assert_eq!(r.outcome, proto::next_shard_reply::Outcome::Assigned as i32, "{r:?}");
    let s = r.shard.unwrap();
    (s.epoch, s.index, r.generation)
}

/// `keep` reaches the dispatcher: a worker that asks for its next shard
/// ahead keeps the one it trains, and reports it while it keeps the next.
#[test]
fn ps_0_keeps_the_shard_a_worker_trains_while_it_asks_ahead() {
    let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
    let shard = |(epoch, index, _): (u64, u64, u64)| Some(proto::ShardRef { epoch, index });
    let a = assigned(&s.next_shard(&shard_request(0, None, true)).unwrap());
    let b = assigned(&s.next_shard(&proto::NextShardRequest { keep: shard(a), ..shard_request(0, None, true) }).unwrap());
    assert_ne!((a.0, a.1), (b.0, b.1));
    let r = s.next_shard(&proto::NextShardRequest { keep: shard(b), ..shard_request(0, Some(a), false) }).unwrap();
    assert_eq!(r.progress.unwrap().shards_done, 1);
    let p = s.next_shard(&shard_request(0, Some(b), false)).unwrap().progress.unwrap();
    // 25 examples in shards of 10: shard 2 holds the last 5.
    let examples = |(_, index, _): (u64, u64, u64)| if index == 2 { 5 } else { 10 };
    assert_eq!((p.shards_done, p.shards_redone, p.examples_trained), (2, 0, examples(a) + examples(b)));
}

/// The dispatcher on ps 0: shards handed out and reported; a worker that
/// leaves or whose lease expires gives its shard back; a report from
/// before a restart (another generation) does not count.
#[test]
fn ps_0_dispatches_shards() {
    let s = ParameterStore::new(PsConfig { lease: Duration::from_millis(50), ..PsConfig::new(0, 1, Some(TaskId::new("worker", 0))) });
    let a = assigned(&s.next_shard(&shard_request(0, None, true)).unwrap());
    let b = assigned(&s.next_shard(&shard_request(1, None, true)).unwrap());
    let c = assigned(&s.next_shard(&shard_request(2, None, true)).unwrap());
    // 25 examples in shards of 10: three shards, all handed out.
    let wait = s.next_shard(&shard_request(3, None, true)).unwrap();
    assert_eq!(wait.outcome, proto::next_shard_reply::Outcome::Wait as i32);
    // worker 1 leaves (scale-down): its shard goes to worker 3.
    s.leave(&TaskId::new("worker", 1));
    let again = assigned(&s.next_shard(&shard_request(3, None, true)).unwrap());
    assert_eq!((again.0, again.1), (b.0, b.1));
    // worker 2's lease expires: its shard waits for the next asker.
    std::thread::sleep(Duration::from_millis(60));
    for w in [0, 3] {
        s.heartbeat(&TaskId::new("worker", w), &Default::default());
    }
    s.expire_leases(Instant::now());
    // A report from another generation (before a restart) does not
    // count: worker 0's shard is given back like any abandoned one.
    let p = s.next_shard(&shard_request(0, Some((a.0, a.1, a.2 + 2)), false)).unwrap().progress.unwrap();
    assert_eq!(p.shards_done, 0);
    let x = assigned(&s.next_shard(&shard_request(0, None, true)).unwrap());
    let y = assigned(&s.next_shard(&shard_request(3, Some(again), true)).unwrap());
    let mut redone = vec![(x.0, x.1), (y.0, y.1)];
    redone.sort();
    let mut lost = vec![(a.0, a.1), (c.0, c.1)];
    lost.sort();
    assert_eq!(redone, lost, "worker 2's and worker 0's shards are trained again");
    s.next_shard(&shard_request(0, Some(x), false)).unwrap();
    let done = s.next_shard(&shard_request(3, Some(y), true)).unwrap();
    assert_eq!(done.outcome, proto::next_shard_reply::Outcome::Finished as i32);
    let p = done.progress.unwrap();
    assert_eq!((p.epochs_completed, p.examples_trained, p.shards_redone, p.finished), (1, 25, 3, true));
    assert_eq!(s.stats().dispatch.unwrap().examples_trained, 25);
    // Bad requests change nothing.
    let other_plan = proto::NextShardRequest {
        plan: Some(proto::DatasetPlan { examples: 26, ..shard_request(0, None, true).plan.unwrap() }),
        ..shard_request(0, None, true)
    };
    let cases = vec![
        (other_plan, "dataset plan mismatch: examples in the training set: the job's is 25, the caller's is 26"),
        (proto::NextShardRequest { plan: None, ..shard_request(0, None, true) }, "plan: missing"),
        (shard_request(0, Some((0, 7, y.2)), true), "shard 7 of epoch 0 does not exist"),
    ];
    for (req, want) in cases {
        let err = s.next_shard(&req).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
    assert_eq!(s.stats().dispatch.unwrap().examples_trained, 25);
    let ps1 = ParameterStore::new(PsConfig::new(1, 2, None));
    assert!(ps1.next_shard(&shard_request(0, None, true)).unwrap_err().to_string().contains("runs on ps 0; this is ps 1"));
}

/// Sync: a task with nothing to train abstains; the step completes with
/// the gradients of the others, never with abstentions alone.
#[test]
fn idle_workers_abstain() {
    let s = store(UpdateMode::Sync, 3);
    let g = |v: f32| [part("b", &[1], 0, &[v]), part("w", &[3], 0, &[0.0, 0.0, 0.0])];
    assert!(s.abstain(&TaskId::new("worker", 2), 0).unwrap().accepted);
    assert!(!s.abstain(&TaskId::new("worker", 2), 0).unwrap().accepted, "once per step");
    s.push(&TaskId::new("worker", 0), 0, 0, &g(1.0)).unwrap();
    assert_eq!(s.progress().step, 0);
    s.push(&TaskId::new("worker", 1), 0, 0, &g(3.0)).unwrap();
    assert_eq!(s.progress().step, 1);
    // b = 0 - 0.5 * mean(1, 3)
    assert_eq!(s.values("b").unwrap(), vec![-1.0]);
    for w in 0..3 {
        s.abstain(&TaskId::new("worker", w), 1).unwrap();
    }
    assert_eq!(s.progress().step, 1, "no gradient, no step");
    let late = s.abstain(&TaskId::new("worker", 0), 0).unwrap();
    assert!(!late.accepted && late.step == 1);
    assert!(s.abstain(&TaskId::new("worker", 0), 9).unwrap_err().to_string().contains("step: 9 is not a step of this ps"));
    // Async: nothing to count.
    let a = store(UpdateMode::Async, 1);
    assert!(!a.abstain(&TaskId::new("worker", 1), 0).unwrap().accepted);
    assert_eq!(a.progress().step, 0);
}

/// Without --replicas_to_aggregate a task takes the chief's aggregation:
/// a worker that sees another number of training tasks joins.
#[test]
fn followers_take_the_chief_s_aggregation() {
    let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
    let follow = |n: u32| proto::TrainingConfig { follow_chief_aggregation: true, total_num_replicas: n, ..config(UpdateMode::Sync, n) };
    let hs = |i: u32, c: proto::TrainingConfig| proto::HandshakeRequest {
        task: tid("worker", i),
        config: Some(c),
        variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }],
        placement_fingerprint: 7,
        num_ps: 1,
        observer: false,
        dense_pieces: vec![],
    };
    // A worker with a view of 4 shakes hands before the chief (view: 2) initialises.
    s.handshake(&hs(3, follow(4))).unwrap();
    let init = vec![proto::InitVariablesRequest {
        task: tid("worker", 0),
        config: Some(follow(2)),
        placement_fingerprint: 7,
        part: Some(part("b", &[1], 0, &[0.0])),
        step: 0,
        embeddings: vec![],
    }];
    s.init(&init).unwrap();
    assert_eq!(s.stats().replicas_to_aggregate, 2, "the chief decides");
    let r = s.handshake(&hs(1, follow(1))).unwrap();
    assert_eq!(r.agreed.unwrap().replicas_to_aggregate, 2);
    assert_eq!(r.chief, tid("worker", 0));
    // Given explicitly and differently, the counts must agree.
    let err = s.handshake(&hs(2, config(UpdateMode::Sync, 3))).unwrap_err().to_string();
    assert!(err.contains("training configuration mismatch"), "{err}");
    assert!(err.contains("give every task the same --replicas_to_aggregate"), "{err}");
    s.handshake(&hs(2, config(UpdateMode::Sync, 2))).expect("the same count, given explicitly, with another view of the cluster");
    let err = s.handshake(&hs(2, follow(2))).and(s.handshake(&hs(2, proto::TrainingConfig { optimizer: Some(Optimizer::sgd(0.1).to_proto()), ..follow(2) })));
    assert!(err.unwrap_err().to_string().contains("training configuration mismatch"), "the optimizer is still compared");
}

#[test]
fn a_ps_that_does_not_know_the_ps_count_learns_it() {
    let s = ParameterStore::new(PsConfig::new(1, 0, None));
    let hs = |n: u32| proto::HandshakeRequest { task: tid("worker", 0), config: Some(config(UpdateMode::Async, 0)), num_ps: n, ..Default::default() };
    assert!(s.handshake(&hs(1)).is_err(), "ps 1 cannot be one of 1");
    assert_eq!(s.num_ps(), 0);
    s.handshake(&hs(3)).unwrap();
    assert_eq!(s.num_ps(), 3);
    assert!(s.handshake(&hs(2)).unwrap_err().to_string().contains("the caller sees 2 ps task(s), this ps is one of 3"));
}

/// The dispatcher's state travels in ps 0's checkpoint shard: restored,
/// the shards in flight come back as todo.
#[test]
fn the_dispatcher_is_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(UpdateMode::Async, 1);
    let a = assigned(&s.next_shard(&shard_request(1, None, true)).unwrap());
    let b = assigned(&s.next_shard(&shard_request(2, None, true)).unwrap());
    s.next_shard(&shard_request(1, Some(a), false)).unwrap();
    let req = proto::SaveCheckpointRequest { task: tid("worker", 0), directory: dir.path().display().to_string(), step: 0 };
    let info: checkpoint::ShardInfo = serde_json::from_str(&s.save_checkpoint(&TaskId::new("worker", 0), &req).unwrap().shard_info_json).unwrap();
    let location = crate::storage::Location::local(dir.path()).unwrap();
    checkpoint::write_index(&location, 0, 1, &[info]).unwrap();
    let ckpt = checkpoint::latest_complete(&location).unwrap().unwrap();
    let restored = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
    restored.restore(checkpoint::read_shard(&ckpt, 0).unwrap(), 0, 1).unwrap();
    let p = restored.stats().dispatch.unwrap();
    assert_eq!((p.shards_done, p.examples_trained), (1, 10));
    let redo = assigned(&restored.next_shard(&shard_request(3, None, true)).unwrap());
    assert_eq!((redo.0, redo.1), (b.0, b.1), "the shard in flight at the checkpoint is trained again");
    assert_eq!(restored.stats().dispatch.unwrap().shards_redone, 1);
    assert_ne!(redo.2, b.2, "a new generation");
}

// ------------------------------------------------------------ embeddings

/// Partition 1 of 2 (mod) of a 10 × 2 embedding `emb`, uniform(-0.5, 0.5)
/// rows from seed 7, beside the dense `b`.
fn emb_spec() -> proto::VariableSpec {
    let part = EmbeddingPart {
        variable: "emb".into(),
        rows: 10,
        dim: 2,
        strategy: crate::placement::PartitionStrategy::Mod,
        partition: 1,
        num_partitions: 2,
        init: crate::init::RowInit::new("emb", crate::init::Init::Uniform { limit: 0.5 }, 7),
    };
    proto::VariableSpec { name: "emb/part_1".into(), dtype: DataType::DtFloat as i32, shape: vec![5, 2], embedding: Some(part.to_proto()) }
}

fn sparse_store(mode: UpdateMode, required: u32, optimizer: Optimizer) -> ParameterStore {
    let s = ParameterStore::new(PsConfig::new(1, 2, Some(TaskId::new("worker", 0))));
    let msgs = vec![proto::InitVariablesRequest {
        task: tid("worker", 0),
        config: Some(proto::TrainingConfig { optimizer: Some(optimizer.to_proto()), ..config(mode, required) }),
        placement_fingerprint: 7,
        part: Some(part("b", &[1], 0, &[0.0])),
        step: 0,
        embeddings: vec![emb_spec()],
    }];
    s.init(&msgs).unwrap();
    s
}

fn rows_part(ids: &[i64], values: &[f32]) -> RowsPart {
    let mut content = crate::le::i64_bytes(ids);
    content.extend_from_slice(&f32_to_bytes(values));
    RowsPart { name: "emb/part_1".into(), count: ids.len() as u64, content: content.into() }
}

fn initial_rows(ids: &[i64]) -> Vec<f32> {
    let init = crate::init::RowInit::new("emb", crate::init::Init::Uniform { limit: 0.5 }, 7);
    let mut out = vec![0.0; ids.len() * 2];
    for (k, &id) in ids.iter().enumerate() {
        init.fill(id, &mut out[k * 2..k * 2 + 2]);
    }
    out
}

/// Rows are pulled by id (their initial value until updated), pushed
/// row-sparse and updated on their own; the ps holds only the rows it
/// updated; the dense variables keep their path.
#[test]
fn embedding_rows_are_pulled_and_pushed_by_id() {
    let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
    let ask = |ids: &[i64]| proto::RowsRequest { name: "emb/part_1".into(), ids: crate::le::i64_bytes(ids).into() };
    let (_, (parts, rows)) = s.pull_snapshot(&[], &[ask(&[9, 1, 5])], 1 << 20).unwrap();
    assert_eq!(parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["b"], "the dense variables only");
    assert_eq!(rows, vec![PulledRows { name: "emb/part_1".into(), dim: 2, ids: vec![9, 1, 5], values: initial_rows(&[9, 1, 5]) }]);
    assert_eq!(s.rows("emb/part_1", &[]).unwrap().1, 0, "a pull materialises nothing");
    let r = s.push_with_rows(&TaskId::new("worker", 1), 0, 0, &[part("b", &[1], 0, &[1.0])], &[rows_part(&[5], &[2.0, -2.0])]).unwrap();
    assert!(r.accepted && r.step == 1);
    let (got, held) = s.rows("emb/part_1", &[1, 5]).unwrap();
    let before = initial_rows(&[1, 5]);
    assert_eq!(got, vec![before[0], before[1], before[2] - 1.0, before[3] + 1.0]);
    assert_eq!(held, 1, "only row 5 was updated");
    assert_eq!(s.values("b").unwrap(), vec![-0.5]);
    let stats = s.stats();
    let v = stats.variables.iter().find(|v| v.name == "emb/part_1").unwrap();
    assert_eq!((v.rows, v.bytes), (1, 2 * 4 + 8));
    // Over the tensor channel's path, the same rows.
    let (_, (shared, rows)) = s.shared_pull(&[], &[ask(&[5])]).unwrap();
    assert_eq!((shared.len(), rows[0].values.clone()), (1, vec![before[2] - 1.0, before[3] + 1.0]));
    // Encoded for gRPC: pieces of whole rows.
    let pieces = PulledRows { name: "e".into(), dim: 2, ids: vec![1, 3, 5], values: vec![0.0; 6] }.encode(32);
    assert_eq!(pieces.iter().map(|p| (p.count, p.content.len())).collect::<Vec<_>>(), vec![(2, 32), (1, 16)]);
}

/// Every malformed sparse request is refused with an error naming what
/// is wrong, and changes nothing.
#[test]
fn bad_rows_are_refused_and_change_nothing() {
    let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
    let w = TaskId::new("worker", 1);
    let b = || part("b", &[1], 0, &[1.0]);
    let named = |name: &str, p: RowsPart| RowsPart { name: name.into(), ..p };
    let cases: Vec<(&str, Vec<RowsPart>, &str)> = vec![
        ("id outside the table", vec![rows_part(&[11], &[1.0, 1.0])], "id 11 is outside the table (0..10)"),
        ("negative id", vec![rows_part(&[-1], &[1.0, 1.0])], "id -1 is outside the table"),
        ("id of another partition", vec![rows_part(&[4], &[1.0, 1.0])], "id 4 belongs to partition 0 (mod), not 1"),
        ("duplicate id", vec![rows_part(&[3, 3], &[1.0; 4])], "id 3 appears twice in one request"),
        ("duplicate id across pieces", vec![rows_part(&[3], &[1.0; 2]), rows_part(&[1, 3], &[1.0; 4])], "id 3 appears twice"),
        ("values that do not match dim", vec![rows_part(&[3], &[1.0; 3])], "1 ids need 16 bytes of ids and values (dim 2), the request carries 20"),
        ("count that does not match", vec![RowsPart { count: 2, ..rows_part(&[3], &[1.0; 2]) }], "2 ids need 32 bytes"),
        ("unknown partition", vec![named("nope", rows_part(&[3], &[1.0; 2]))], "variable \"nope\" is not on this ps"),
        ("rows of a dense variable", vec![named("b", rows_part(&[0], &[1.0; 2]))], "variable \"b\" is not an embedding"),
    ];
    for (name, rows, want) in cases {
        let err = s.push_with_rows(&w, 0, 0, &[b()], &rows).expect_err(name).to_string();
        assert!(err.contains(want), "{name}: {err}");
    }
    let err = s.push_with_rows(&w, 0, 0, &[part("emb/part_1", &[5, 2], 0, &[0.0; 10])], &[]).unwrap_err().to_string();
    assert!(err.contains("is an embedding partition: push its rows by id"), "{err}");
    let ask = |ids: &[i64]| proto::RowsRequest { name: "emb/part_1".into(), ids: crate::le::i64_bytes(ids).into() };
    assert!(s.pull_snapshot(&[], &[ask(&[2])], 1024).unwrap_err().to_string().contains("id 2 belongs to partition 0"));
    assert!(s.pull_snapshot(&["emb/part_1".into()], &[], 1024).unwrap_err().to_string().contains("pull its rows by id"));
    let ragged = proto::RowsRequest { name: "emb/part_1".into(), ids: vec![0u8; 7].into() };
    assert!(s.pull_snapshot(&[], &[ragged], 1024).unwrap_err().to_string().contains("7 bytes of ids"));
    assert_eq!(s.progress().step, 0);
    assert_eq!(s.values("b").unwrap(), vec![0.0]);
    assert_eq!(s.rows("emb/part_1", &[1, 3]).unwrap(), (initial_rows(&[1, 3]), 0), "no row changed or appeared");
    // A bad embedding spec at handshake is named too.
    let mut spec = emb_spec();
    spec.embedding.as_mut().unwrap().partition = 2;
    let hs = proto::HandshakeRequest {
        task: tid("worker", 1),
        config: Some(config(UpdateMode::Async, 1)),
        variables: vec![spec],
        placement_fingerprint: 7,
        num_ps: 2,
        observer: false,
        dense_pieces: vec![],
    };
    assert!(s.handshake(&hs).unwrap_err().to_string().contains("partition: 2 is not in 0..2"));
}

/// Sync: rows pushed by several workers are averaged per row over the
/// gradients that held them, then applied with row-wise Adagrad state.
#[test]
fn sync_rows_of_several_workers_are_aggregated_per_row() {
    let opt = Optimizer::from_name("adagrad", 0.1, 0.0).unwrap();
    let s = sparse_store(UpdateMode::Sync, 3, opt);
    let push = |w: u32, ids: &[i64], values: &[f32]| {
        s.push_with_rows(&TaskId::new("worker", w), 0, 0, &[part("b", &[1], 0, &[0.0])], &[rows_part(ids, values)]).unwrap()
    };
    push(0, &[1, 3], &[1.0, 1.0, 2.0, 2.0]);
    push(1, &[3], &[4.0, 4.0]);
    assert_eq!(s.progress().step, 0);
    assert_eq!(s.rows("emb/part_1", &[]).unwrap().1, 0, "nothing applied before the step completes");
    push(2, &[], &[]);
    assert_eq!(s.progress().step, 1);
    // Row 1: one gradient (1, 1); row 3: (2 + 4) / 2 = 3. Adagrad from 0.1.
    let init = initial_rows(&[1, 3, 7]);
    let adagrad = |w: f32, g: f32| w - 0.1 * g / (0.1 + g * g).sqrt();
    let (got, held) = s.rows("emb/part_1", &[1, 3, 7]).unwrap();
    let want = [adagrad(init[0], 1.0), adagrad(init[1], 1.0), adagrad(init[2], 3.0), adagrad(init[3], 3.0), init[4], init[5]];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
    assert_eq!(held, 2);
    // A stale sparse push changes nothing.
    let r = push(0, &[7], &[5.0, 5.0]);
    assert!(r.stale && !r.accepted);
    assert_eq!(s.rows("emb/part_1", &[7]).unwrap().0, init[4..].to_vec());
}

/// The materialised rows (ids, values, slots) travel in the checkpoint
/// shard; restored, the ps answers the same rows, the others still from
/// their initial value, and the row-wise slots go on.
#[test]
fn embedding_rows_are_checkpointed_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let opt = Optimizer::from_name("ftrl", 0.1, 0.0).unwrap();
    let s = sparse_store(UpdateMode::Async, 1, opt);
    let w = TaskId::new("worker", 1);
    s.push_with_rows(&w, 0, 0, &[], &[rows_part(&[3, 9], &[1.0, -1.0, 0.5, 0.5])]).unwrap();
    let req = proto::SaveCheckpointRequest { task: tid("worker", 0), directory: dir.path().display().to_string(), step: 1 };
    let info: checkpoint::ShardInfo = serde_json::from_str(&s.save_checkpoint(&TaskId::new("worker", 0), &req).unwrap().shard_info_json).unwrap();
    assert_eq!(info.row_ids, vec![checkpoint::TensorEntry { name: "emb/part_1:ids".into(), shape: vec![2] }]);
    // ps 0's shard: an empty one is enough for the index here.
    let at = crate::storage::Location::local(dir.path()).unwrap();
    let empty = checkpoint::write_shard(&at, 1, 0, 2, &checkpoint::ShardData::default()).unwrap();
    checkpoint::write_index(&at, 1, 2, &[empty, info]).unwrap();
    let ckpt = checkpoint::latest_complete(&at).unwrap().unwrap();
    let text = checkpoint::inspect(&at).unwrap();
    assert!(text.contains("row ids   emb/part_1:ids  2 row(s) materialised"), "{text}");
    let restored = ParameterStore::new(PsConfig::new(1, 2, Some(TaskId::new("worker", 0))));
    restored.restore(checkpoint::read_shard(&ckpt, 1).unwrap(), 1, 2).unwrap();
    assert_eq!(restored.rows("emb/part_1", &[1, 3, 9]), s.rows("emb/part_1", &[1, 3, 9]));
    // The first handshake brings the configuration; the specs match the restored ones.
    let hs = proto::HandshakeRequest {
        task: tid("worker", 1),
        config: Some(proto::TrainingConfig { optimizer: Some(opt.to_proto()), ..config(UpdateMode::Async, 1) }),
        variables: vec![proto::VariableSpec { name: "b".into(), dtype: DataType::DtFloat as i32, shape: vec![1], embedding: None }, emb_spec()],
        placement_fingerprint: 7,
        num_ps: 2,
        observer: false,
        dense_pieces: vec![],
    };
    restored.handshake(&hs).unwrap();
    // Both go on identically (FTRL's row-wise n and z came back).
    for st in [&s, &restored] {
        st.push_with_rows(&w, 1, 0, &[part("b", &[1], 0, &[0.0])], &[rows_part(&[3, 7], &[0.25, 0.25, 1.0, 1.0])]).unwrap();
    }
    assert_eq!(restored.rows("emb/part_1", &[1, 3, 7, 9]), s.rows("emb/part_1", &[1, 3, 7, 9]));
}

proptest::proptest! {
    /// Malformed sparse pushes (any ids, any count, any bytes) never
    /// panic the ps and never change a row: either the whole push is
    /// valid and applied, or nothing changes.
    #[test]
    fn malformed_sparse_pushes_never_change_a_row(
        ids in proptest::collection::vec(-3i64..14, 0..6),
        count_delta in -1i64..2,
        extra_bytes in 0usize..9,
        value in -4.0f32..4.0,
    ) {
        let s = sparse_store(UpdateMode::Async, 1, Optimizer::sgd(0.5));
        let all: Vec<i64> = (0..10).filter(|i| i % 2 == 1).collect();
        let before = s.rows("emb/part_1", &all).unwrap();
        let mut content = crate::le::i64_bytes(&ids);
        content.extend(std::iter::repeat_n(value.to_le_bytes(), ids.len() * 2).flatten());
        content.extend(std::iter::repeat_n(0u8, extra_bytes));
        let count = (ids.len() as i64 + count_delta).max(0) as u64;
        let rows = RowsPart { name: "emb/part_1".into(), count, content: content.into() };
        let valid = count == ids.len() as u64
            && extra_bytes == 0
            && ids.iter().all(|&id| (0..10).contains(&id) && id % 2 == 1)
            && ids.iter().collect::<BTreeSet<_>>().len() == ids.len();
        let result = s.push_with_rows(&TaskId::new("worker", 1), 0, 0, &[], &[rows]);
        proptest::prop_assert_eq!(result.is_ok(), valid, "{:?}", result);
        if !valid {
            proptest::prop_assert_eq!(s.rows("emb/part_1", &all).unwrap(), before);
            proptest::prop_assert_eq!(s.progress().step, 0);
        }
    }
}

/// A checkpoint of another ps count waits for the first handshake: a view
/// that does not fit it (or does not say where its dense pieces sit) is
/// refused and the checkpoint kept; a fitting one restores this ps's part.
#[test]
fn a_checkpoint_of_another_ps_count_is_cut_at_the_first_fitting_handshake() {
    let mut merged = checkpoint::ShardData::default();
    // Written by 2 ps: `w` cut in two parts of 2 rows.
    merged.push_dense("w/part_0", &[2, 2], &[1.0, 2.0, 3.0, 4.0], [&[], &[]], 0);
    merged.push_dense("w/part_1", &[2, 2], &[5.0, 6.0, 7.0, 8.0], [&[], &[]], 0);
    let s = ParameterStore::new(PsConfig::new(0, 1, Some(TaskId::new("worker", 0))));
    let pending = super::recut::PendingRecut { merged, step: 40, written_by: 2, path: "ckpt-40".into() };
    s.restore_recut(pending).unwrap();
    assert!(!s.progress().initialized, "nothing trains on a half-restored ps");
    let spec = proto::VariableSpec { name: "w".into(), dtype: DataType::DtFloat as i32, shape: vec![4, 2], embedding: None };
    let piece = |rows| proto::DensePiece { name: "w".into(), variable: "w".into(), row_offset: 0, variable_rows: rows };
    let hs = |pieces: Vec<proto::DensePiece>| proto::HandshakeRequest {
        task: tid("worker", 0),
        config: Some(config(UpdateMode::Sync, 1)),
        variables: vec![spec.clone()],
        placement_fingerprint: 9,
        num_ps: 1,
        observer: false,
        dense_pieces: pieces,
    };
    let err = s.handshake(&hs(vec![])).unwrap_err().to_string();
    assert!(err.contains("does not say where \"w\" sits"), "{err}");
    let err = s.handshake(&hs(vec![piece(5)])).unwrap_err().to_string();
    assert!(err.contains("ckpt-40 (written by 2 ps task(s))") && err.contains("4 rows stored, 5 in the model"), "{err}");
    assert!(!s.progress().initialized);
    let r = s.handshake(&hs(vec![piece(4)])).unwrap();
    assert!(r.initialized && r.step == 40, "{r:?}");
    assert_eq!(s.lock().vars.values("w").unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
}

/// A move's fragments cut into stream messages of at most `max` bytes (a
/// fragment over several) come back whole, an empty one included (its
/// source still says it has nothing).
#[test]
fn fragments_come_back_whole_from_their_messages() {
    use super::moving::{add_message, to_messages};
    use super::recut::{DenseFragment, Fragments, RowsFragment};
    let floats = |n: usize, k: f32| (0..n).map(|i| i as f32 * k).collect::<Vec<f32>>();
    let dense = DenseFragment { piece: "w/part_1".into(), row_offset: 3, rows: 5, values: floats(20, 1.0), slots: [floats(20, -1.0), vec![]], updates: 7 };
    let rows = RowsFragment {
        piece: "e/part_0".into(),
        source: (1, 2),
        ids: (0..9).map(|i| i * 3).collect(),
        values: floats(18, 0.5),
        slots: [vec![], floats(18, 2.0)],
        updates: 2,
    };
    let empty = RowsFragment { piece: "e/part_0".into(), source: (0, 2), ids: vec![], values: vec![], slots: Default::default(), updates: 2 };
    let f = Fragments { dense: vec![dense], rows: vec![rows, empty] };
    // Dense rows by (piece, row): what a target assembles.
    type DenseRow = (String, usize, Vec<f32>, Vec<f32>, u64);
    let dense_rows = |f: &Fragments| -> Vec<DenseRow> {
        let mut out = Vec::new();
        for d in &f.dense {
            let len = d.values.len() / d.rows;
            for r in 0..d.rows {
                let slot = if d.slots[0].is_empty() { vec![] } else { d.slots[0][r * len..(r + 1) * len].to_vec() };
                out.push((d.piece.clone(), d.row_offset + r, d.values[r * len..(r + 1) * len].to_vec(), slot, d.updates));
            }
        }
        out
    };
    // (max bytes, messages at least)
    for (max, at_least) in [(1, 8), (100, 3), (1 << 20, 1)] {
        let messages: Vec<_> = to_messages(f.clone(), max).collect();
        assert!(messages.len() >= at_least, "max {max}: {} messages", messages.len());
        let mut back = Fragments::default();
        messages.into_iter().for_each(|m| add_message(&mut back, m));
        assert_eq!(back.rows, f.rows, "max {max}");
        assert_eq!(dense_rows(&back), dense_rows(&f), "max {max}");
    }
}

/// The rest of a push a move cut in two (async): its parts may cover part
/// of a variable (only those elements change), it is applied, not counted
/// as a step; overlapping parts and a sync ps refuse it.
#[test]
fn a_remainder_updates_only_what_it_covers_and_is_not_a_step() {
    let s = store(UpdateMode::Async, 1);
    let rest = proto::PushGradientsRequest { push_id: 9, remainder: true, ..Default::default() };
    let worker = TaskId::new("worker", 1);
    let r = s.push_for_layout(&rest, &worker, &[part("w", &[3], 1, &[2.0])], &[]).unwrap();
    assert!(r.accepted);
    assert_eq!(s.values("w").unwrap(), vec![1.0, 1.0, 3.0], "only element 1 of w moves (sgd 0.5 x 2)");
    assert_eq!(s.values("b").unwrap(), vec![0.0], "b is not in the remainder");
    assert_eq!(s.progress().step, 0, "a remainder is not a step");
    let overlapping = [part("w", &[3], 0, &[1.0, 1.0]), part("w", &[3], 1, &[1.0])];
    let err = s.push_for_layout(&proto::PushGradientsRequest { push_id: 10, ..rest.clone() }, &worker, &overlapping, &[]).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    let whole = s.push_for_layout(&proto::PushGradientsRequest { push_id: 11, remainder: false, ..rest.clone() }, &worker, &[part("w", &[3], 1, &[2.0])], &[]);
    assert!(whole.unwrap_err().to_string().contains("exactly once"), "a push that is not a remainder still covers every element");
    let sync = store(UpdateMode::Sync, 1);
    let err = sync.push_for_layout(&rest, &worker, &[part("w", &[3], 1, &[2.0])], &[]).unwrap_err();
    assert!(err.to_string().contains("only async"), "{err}");
}

/// Which proposals ps 0 keeps, on a job trained by 2 ps tasks: a ps started
/// into the job (index past the layout) proposes its set; a ps of the layout
/// started again with an older, larger cluster spec (a ps scaled away since)
/// proposes nothing.
#[test]
fn only_a_ps_started_into_the_job_proposes_a_larger_set() {
    let addresses = |n: usize| (0..n).map(|i| format!("ps{i}:2222")).collect::<Vec<_>>();
    // (proposing ps, its cluster spec's ps count, the proposal ps 0 keeps)
    let cases = [(2, 3, Some(3)), (3, 4, Some(4)), (1, 3, None), (1, 2, None), (0, 3, None)];
    for (index, names, kept) in cases {
        let mut config = PsConfig::new(0, 2, Some(TaskId::new("worker", 0)));
        config.ps_addresses = addresses(2);
        let s = ParameterStore::new(config);
        let req = proto::ProposeLayoutRequest { task: tid("ps", index), ps_addresses: addresses(names), leave: false };
        let reply = s.propose_layout(&req).unwrap();
        assert_eq!(reply.ps_addresses, addresses(2), "ps {index} naming {names}");
        let want = kept.map(addresses).unwrap_or_default();
        assert_eq!(reply.proposed, want, "ps {index} naming {names}");
    }
}

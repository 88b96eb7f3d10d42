use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn plan(examples: u64, shard_size: u64, epochs: Option<u64>) -> ShardPlan {
    ShardPlan::new(examples, shard_size, 7, epochs).unwrap()
}

fn assigned(r: Reply) -> ShardId {
    match r.handout {
        Some(Handout::Assigned(s, _)) => s,
        other => panic!("expected a shard, got {other:?}"),
    }
}

#[test]
fn shards_per_epoch_and_their_sizes() {
    // (examples, shard_size) -> sizes of shards 0..
    let cases: Vec<(u64, u64, Vec<u64>)> = vec![
        (10, 3, vec![3, 3, 3, 1]),
        (9, 3, vec![3, 3, 3]),
        (1, 5, vec![1]),
        (101, 10, vec![10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 1]),
        (5, 1, vec![1, 1, 1, 1, 1]),
    ];
    for (examples, size, sizes) in cases {
        let p = plan(examples, size, None);
        assert_eq!(p.shards_per_epoch(), sizes.len() as u64, "{examples}/{size}");
        let got: Vec<u64> = (0..p.shards_per_epoch()).map(|i| p.shard_examples(i)).collect();
        assert_eq!(got, sizes, "{examples}/{size}");
        let positions: Vec<u64> = (0..p.shards_per_epoch()).flat_map(|i| p.shard_positions(i)).collect();
        assert_eq!(positions, (0..examples).collect::<Vec<_>>(), "shards cover every position once");
    }
}

#[test]
fn bad_plans_name_the_flag() {
    let cases = [
        (ShardPlan::new(0, 10, 1, None), "examples: the training set is empty"),
        (ShardPlan::new(10, 0, 1, None), "--shard_size: must be at least 1"),
        (ShardPlan::new(10, 5, 1, Some(0)), "--num_epochs: must be at least 1"),
    ];
    for (got, want) in cases {
        assert_eq!(got.unwrap_err().to_string(), want);
    }
    let d = ShardDispatcher::new(plan(100, 10, Some(2)));
    let other = ShardPlan { shard_size: 20, ..*d.plan() };
    assert_eq!(d.check_plan(&other).unwrap_err().to_string(), "dataset plan mismatch: --shard_size: the job's is 10, the caller's is 20");
    assert_eq!(d.check_plan(d.plan()), Ok(()));
}

#[test]
fn orders_are_permutations_fixed_by_the_seed() {
    let p = plan(1000, 10, None);
    for epoch in 0..3 {
        let mut order = p.epoch_order(epoch);
        assert_eq!(order, p.epoch_order(epoch), "same seed, same order");
        order.sort();
        assert_eq!(order, (0..100).collect::<Vec<_>>());
        let mut examples = p.example_order(epoch);
        assert_eq!(examples, p.example_order(epoch));
        examples.sort();
        assert_eq!(examples, (0..1000).collect::<Vec<_>>());
    }
    assert_ne!(p.epoch_order(0), p.epoch_order(1), "every epoch is shuffled anew");
    assert_ne!(p.example_order(0), p.example_order(1));
    let other_seed = ShardPlan { seed: 8, ..p };
    assert_ne!(p.epoch_order(0), other_seed.epoch_order(0));
    assert_ne!(p.epoch_order(0), (0..100).collect::<Vec<_>>(), "not the identity");
}

/// Two workers taking turns, N epochs: every shard of every epoch is done
/// exactly once, in each epoch's shuffled order, and then it is finished.
#[test]
fn workers_take_turns_until_every_epoch_is_done() {
    for (examples, size, epochs) in [(10u64, 3u64, 2u64), (101, 10, 3), (7, 7, 1), (6, 1, 4)] {
        let p = plan(examples, size, Some(epochs));
        let mut d = ShardDispatcher::new(p);
        let mut done: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut held: [Option<ShardId>; 2] = [None, None];
        let mut finished = [false, false];
        let mut turn = 0;
        while !(finished[0] && finished[1]) {
            let w = turn % 2;
            turn += 1;
            if finished[w] {
                continue;
            }
            let r = d.next(&format!("worker:{w}"), held[w].take(), true).unwrap();
            match r.handout.unwrap() {
                Handout::Assigned(s, n) => {
                    assert_eq!(n, p.shard_examples(s.index));
                    done.entry(s.epoch).or_default().push(s.index);
                    held[w] = Some(s);
                }
                Handout::Wait => {}
                Handout::Finished => finished[w] = true,
            }
            assert!(turn < 10_000, "never finished");
        }
        assert_eq!(done.len() as u64, epochs);
        for (epoch, list) in &done {
            assert_eq!(list, &p.epoch_order(*epoch), "epoch {epoch}: handed out once each, in order");
        }
        let progress = d.progress();
        assert_eq!(
            progress,
            DispatchProgress {
                epochs_completed: epochs,
                examples_trained: epochs * examples,
                shards_redone: 0,
                shards_done: epochs * p.shards_per_epoch(),
                shards_per_epoch: p.shards_per_epoch(),
                finished: true,
                num_epochs: epochs,
                examples_per_epoch: examples,
            },
            "{examples}/{size}/{epochs}"
        );
    }
}

#[test]
fn a_lost_worker_s_shard_is_redone_first() {
    let mut d = ShardDispatcher::new(plan(40, 10, Some(1)));
    let a = assigned(d.next("worker:0", None, true).unwrap());
    let b = assigned(d.next("worker:1", None, true).unwrap());
    assert_eq!(d.release("worker:0"), 1, "the lease of worker 0 expired");
    assert_eq!(d.release("worker:0"), 0);
    // Worker 1 finishes and is handed worker 0's shard before any fresh one.
    let again = assigned(d.next("worker:1", Some(b), true).unwrap());
    assert_eq!(again, a);
    let p = d.progress();
    assert_eq!((p.shards_redone, p.shards_done, p.examples_trained), (1, 1, 10));
    // Worker 0 was only slow: its report counts, worker 1's later one does not.
    assert!(d.next("worker:0", Some(a), false).unwrap().counted);
    let r = d.next("worker:1", Some(a), true).unwrap();
    assert!(!r.counted, "a shard is done once");
    assert_eq!(d.progress().shards_done, 2);
    assert!(matches!(r.handout, Some(Handout::Assigned(_, 10))));
}

#[test]
fn asking_again_abandons_the_shard_held() {
    // A worker restarted in place asks for a shard without reporting the
    // one its previous process held: that one is trained again, first.
    let mut d = ShardDispatcher::new(plan(30, 10, None));
    let first = assigned(d.next("worker:1", None, true).unwrap());
    let again = assigned(d.next("worker:1", None, true).unwrap());
    assert_eq!(again, first);
    assert_eq!(d.progress().shards_redone, 1);
    let second = assigned(d.next("worker:2", None, true).unwrap());
    assert_ne!(second, first);
    // Reporting without asking keeps nothing.
    d.next("worker:1", Some(first), false).unwrap();
    assert_eq!(d.state().not_done, vec![second]);
    // Asking again without reporting gives the shard back for someone else.
    d.next("worker:2", None, false).unwrap();
    assert_eq!(assigned(d.next("worker:3", None, true).unwrap()), second);
    assert_eq!(d.progress().shards_redone, 2);
}

#[test]
fn a_task_asking_ahead_keeps_the_shard_it_trains() {
    // (what the task keeps when it asks ahead, shards of the task's left
    // doing after the call, shards redone so far)
    struct Case {
        name: &'static str,
        keep: fn(ShardId, ShardId) -> Option<ShardId>,
        still_doing: fn(ShardId, ShardId) -> Vec<ShardId>,
    }
    let cases = [
        Case { name: "keeps the shard in hand", keep: |held, _| Some(held), still_doing: |held, _| vec![held] },
        Case { name: "keeping nothing gives the shard in hand back", keep: |_, _| None, still_doing: |_, _| vec![] },
        Case { name: "keeping another task's shard keeps nothing of its own", keep: |_, other| Some(other), still_doing: |_, _| vec![] },
    ];
    for case in cases {
        let mut d = ShardDispatcher::new(plan(50, 10, Some(1)));
        let held = assigned(d.next("worker:0", None, true).unwrap());
        let other = assigned(d.next("worker:1", None, true).unwrap());
        let r = d.next_keeping("worker:0", None, (case.keep)(held, other), true).unwrap();
        let ahead = assigned(r);
        let mut doing: Vec<ShardId> = d.doing.iter().filter(|(_, t)| *t == "worker:0").map(|(s, _)| *s).filter(|s| *s != ahead).collect();
        doing.sort();
        assert_eq!(doing, (case.still_doing)(held, other), "{}", case.name);
        assert_eq!(d.doing.get(&other).map(String::as_str), Some("worker:1"), "{}: the other task's shard is untouched", case.name);
    }
}

#[test]
fn a_shard_asked_for_ahead_is_reported_with_the_next_keep_and_counted_once() {
    let mut d = ShardDispatcher::new(plan(30, 10, Some(1)));
    let first = assigned(d.next("worker:0", None, true).unwrap());
    // Its last batch in training, the task asks ahead...
    let second = assigned(d.next_keeping("worker:0", None, Some(first), true).unwrap());
    assert_ne!(second, first);
    // ...then reports the first while it trains the second.
    let r = d.next_keeping("worker:0", Some(first), Some(second), false).unwrap();
    assert!(r.counted && r.abandoned == 0 && r.handout.is_none());
    let third = assigned(d.next_keeping("worker:0", None, Some(second), true).unwrap());
    // No fresh shard left while it trains the third: the ask ahead waits.
    assert_eq!(d.next_keeping("worker:0", Some(second), Some(third), true).unwrap().handout, Some(Handout::Wait));
    assert_eq!(d.next("worker:0", Some(third), true).unwrap().handout, Some(Handout::Finished));
    let p = d.progress();
    assert_eq!((p.shards_done, p.shards_redone, p.examples_trained, p.finished), (3, 0, 30, true));
}

#[test]
fn a_lost_task_gives_back_the_shard_it_trains_and_the_one_asked_ahead() {
    let mut d = ShardDispatcher::new(plan(40, 10, Some(1)));
    let held = assigned(d.next("worker:0", None, true).unwrap());
    let ahead = assigned(d.next_keeping("worker:0", None, Some(held), true).unwrap());
    assert_eq!(d.release("worker:0"), 2);
    let redone = [assigned(d.next("worker:1", None, true).unwrap()), assigned(d.next("worker:2", None, true).unwrap())];
    let mut want = [held, ahead];
    want.sort();
    assert_eq!(redone, want, "both are handed out again, before any fresh shard");
    assert_eq!(d.progress().shards_redone, 2);
}

#[test]
fn the_last_shards_make_others_wait_then_finish() {
    let mut d = ShardDispatcher::new(plan(20, 10, Some(1)));
    let a = assigned(d.next("worker:0", None, true).unwrap());
    let b = assigned(d.next("worker:1", None, true).unwrap());
    assert_eq!(d.next("worker:2", None, true).unwrap().handout, Some(Handout::Wait));
    assert_eq!(d.next("worker:0", Some(a), true).unwrap().handout, Some(Handout::Wait));
    assert!(!d.progress().finished);
    // Worker 1 dies: worker 2 picks its shard up and finishes the job.
    d.release("worker:1");
    let redo = assigned(d.next("worker:2", None, true).unwrap());
    assert_eq!(redo, b);
    assert_eq!(d.next("worker:2", Some(b), true).unwrap().handout, Some(Handout::Finished));
    assert_eq!(d.next("worker:0", None, true).unwrap().handout, Some(Handout::Finished));
    let p = d.progress();
    assert_eq!((p.epochs_completed, p.examples_trained, p.shards_redone, p.finished), (1, 20, 1, true));
}

#[test]
fn unbounded_epochs_never_finish_and_roll_over() {
    let mut d = ShardDispatcher::new(plan(3, 2, None));
    let mut seen = Vec::new();
    let mut held = None;
    for _ in 0..7 {
        let s = assigned(d.next("worker:0", held, true).unwrap());
        seen.push(s);
        held = Some(s);
    }
    let epochs: Vec<u64> = seen.iter().map(|s| s.epoch).collect();
    assert_eq!(epochs, vec![0, 0, 1, 1, 2, 2, 3]);
    let p = d.progress();
    assert_eq!((p.epochs_completed, p.shards_done, p.examples_trained, p.finished), (3, 6, 9, false));
}

#[test]
fn reports_of_unknown_shards() {
    let mut d = ShardDispatcher::new(plan(30, 10, None));
    let err = d.next("worker:0", Some(ShardId { epoch: 0, index: 3 }), true).unwrap_err();
    assert_eq!(err.to_string(), "shard 3 of epoch 0 does not exist: the training set has 3 shards per epoch");
    // Not handed out yet (trained before the dispatcher went back to a
    // checkpoint): nothing counted, nothing skipped.
    let r = d.next("worker:0", Some(ShardId { epoch: 5, index: 1 }), true).unwrap();
    assert!(!r.counted);
    assert_eq!(d.progress().shards_done, 0);
}

/// A ps 0 restart: the dispatcher comes back from its last checkpoint; the
/// shards done before it stay done, those in flight (or done after it) are
/// trained again, and the run still ends with every example of every epoch
/// trained exactly as often as without the restart.
#[test]
fn restore_resumes_mid_epoch() {
    let p = plan(101, 10, Some(2));
    let mut d = ShardDispatcher::new(p);
    let a = assigned(d.next("worker:0", None, true).unwrap());
    let b = assigned(d.next("worker:1", None, true).unwrap());
    let c = assigned(d.next("worker:0", Some(a), true).unwrap());
    let saved = d.state();
    assert_eq!(saved.not_done.len(), 2, "b and c in flight at the checkpoint");
    let json = serde_json::to_string(&saved).unwrap();
    // After the checkpoint: more progress, then the ps dies.
    d.next("worker:1", Some(b), true).unwrap();
    let mut r = ShardDispatcher::restore(&serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(r.progress().shards_done, 1, "a was done before the checkpoint");
    assert_eq!(r.progress().examples_trained, p.shard_examples(a.index));
    // The workers abandon what they held; b and c come back first.
    let redo1 = assigned(r.next("worker:1", None, true).unwrap());
    let redo2 = assigned(r.next("worker:0", None, true).unwrap());
    assert_eq!(BTreeSet::from([redo1, redo2]), BTreeSet::from([b, c]));
    let mut held = [Some(redo2), Some(redo1)];
    let mut finished = [false, false];
    while !(finished[0] && finished[1]) {
        for w in [1usize, 0] {
            if finished[w] {
                continue;
            }
            match r.next(&format!("worker:{w}"), held[w].take(), true).unwrap().handout.unwrap() {
                Handout::Assigned(s, _) => held[w] = Some(s),
                Handout::Wait => {}
                Handout::Finished => finished[w] = true,
            }
        }
    }
    let progress = r.progress();
    assert_eq!((progress.epochs_completed, progress.examples_trained, progress.shards_redone), (2, 202, 2));
}

#[test]
fn restore_refuses_states_outside_the_plan() {
    let p = plan(30, 10, Some(1));
    let cases = [
        (DispatcherState { plan: p, next: (0, 3), not_done: vec![], shards_redone: 0 }, "next: (0, 3) is outside the plan"),
        (DispatcherState { plan: p, next: (2, 0), not_done: vec![], shards_redone: 0 }, "next: (2, 0) is outside the plan"),
        (DispatcherState { plan: p, next: (0, 1), not_done: vec![ShardId { epoch: 0, index: 4 }], shards_redone: 0 }, "shard 4 of epoch 0 does not exist"),
        (DispatcherState { plan: ShardPlan { shard_size: 0, ..p }, next: (0, 0), not_done: vec![], shards_redone: 0 }, "--shard_size: must be at least 1"),
    ];
    for (state, want) in cases {
        let err = ShardDispatcher::restore(&state).unwrap_err().to_string();
        assert!(err.contains(want), "{err} / {want}");
    }
    // The shard at the cursor's position was not handed out.
    let first = p.epoch_order(0)[0];
    let state = DispatcherState { plan: p, next: (0, 0), not_done: vec![ShardId { epoch: 0, index: first }], shards_redone: 0 };
    assert!(ShardDispatcher::restore(&state).unwrap_err().to_string().contains("never handed out"));
}

/// Random interleavings of workers asking, finishing, dying and a dispatcher
/// going back to a checkpoint: the counts always add up, and every shard of
/// every epoch ends up done.
#[test]
fn random_schedules_keep_the_books_exact() {
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let examples = rng.random_range(1..60);
        let size = rng.random_range(1..12);
        let epochs = rng.random_range(1..4);
        let p = ShardPlan::new(examples, size, seed, Some(epochs)).unwrap();
        let mut d = ShardDispatcher::new(p);
        let workers = rng.random_range(1..5usize);
        let mut held: Vec<Option<ShardId>> = vec![None; workers];
        let mut saved = d.state();
        let mut steps = 0;
        while !d.is_finished() {
            steps += 1;
            assert!(steps < 100_000, "seed {seed}: no end");
            let w = rng.random_range(0..workers);
            let task = format!("worker:{w}");
            match rng.random_range(0..20) {
                0 => {
                    d.release(&task);
                    held[w] = None;
                }
                1 => saved = d.state(),
                2 => {
                    d = ShardDispatcher::restore(&saved).unwrap();
                    held.iter_mut().for_each(|h| *h = None);
                }
                _ => {
                    let r = d.next(&task, held[w].take(), true).unwrap();
                    if let Some(Handout::Assigned(s, _)) = r.handout {
                        held[w] = Some(s);
                    }
                }
            }
            let pr = d.progress();
            assert!(pr.shards_done <= epochs * p.shards_per_epoch(), "seed {seed}");
            assert!(pr.examples_trained <= epochs * examples, "seed {seed}");
        }
        let pr = d.progress();
        assert_eq!((pr.epochs_completed, pr.examples_trained, pr.shards_done), (epochs, epochs * examples, epochs * p.shards_per_epoch()), "seed {seed}");
    }
}

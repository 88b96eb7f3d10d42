use super::*;
use crate::progress::ProgressSample;

/// A job under the policy: workers train at `curve(workers)` examples/s once they have run
/// `warmup` seconds; the controller reads ps 0 every `tick` seconds and applies each decision
/// at once. Returns the worker count over time and the decisions.
struct Sim {
    bounds: Bounds,
    curve: Box<dyn Fn(i32, f64) -> f64>,
    warmup: f64,
    tick: f64,
    /// Seconds the job has left, if bounded (counted down).
    remaining: Option<f64>,
}

struct Run {
    /// (time, workers) after each tick.
    counts: Vec<(f64, i32)>,
    decisions: Vec<(f64, Decision)>,
}

impl Sim {
    fn new(bounds: Bounds, curve: impl Fn(i32, f64) -> f64 + 'static) -> Sim {
        Sim { bounds, curve: Box::new(curve), warmup: 5.0, tick: 5.0, remaining: None }
    }

    fn run(&self, start: i32, seconds: f64) -> Run {
        let mut workers = start;
        let mut changed_at = 0.0;
        let mut examples = 0.0;
        let mut readings: Vec<Reading> = Vec::new();
        let mut state: Option<AutoscalerState> = None;
        let mut run = Run { counts: vec![], decisions: vec![] };
        let mut t = 0.0;
        while t < seconds {
            t += self.tick;
            // The new workers add their share only after their warm-up.
            let rate = (self.curve)(workers, t) * if t - changed_at < self.warmup { 0.5 } else { 1.0 };
            examples += rate * self.tick;
            readings.push(Reading { at: t, sample: ProgressSample { examples_trained: Some(examples), ..Default::default() } });
            let remaining = self.remaining.map(|r| (r - t).max(0.0));
            let look = Look { bounds: self.bounds, replicas: workers, readings: &readings, now: t, remaining };
            let (next, decision) = decide(state.as_ref(), look);
            assert!(next.replicas >= self.bounds.min && next.replicas <= self.bounds.max, "{next:?} out of bounds");
            if let Decision::Scale { from, to, .. } = &decision {
                assert_eq!(*from, workers);
                assert!(*to >= self.bounds.min && *to <= self.bounds.max, "{decision:?}");
                workers = *to;
                changed_at = t;
            }
            if decision != Decision::Hold {
                run.decisions.push((t, decision));
            }
            state = Some(next);
            run.counts.push((t, workers));
        }
        run
    }
}

impl Run {
    fn last(&self) -> i32 {
        self.counts.last().unwrap().1
    }

    /// The time the count last changed.
    fn settled_at(&self) -> f64 {
        self.decisions.iter().filter(|(_, d)| matches!(d, Decision::Scale { .. })).map(|(t, _)| *t).next_back().unwrap_or(0.0)
    }

    fn changes_between(&self, from: f64, to: f64) -> usize {
        self.decisions.iter().filter(|(t, d)| *t > from && *t <= to && matches!(d, Decision::Scale { .. })).count()
    }

    fn path(&self) -> Vec<i32> {
        let mut p = vec![];
        for (_, n) in &self.counts {
            if p.last() != Some(n) {
                p.push(*n);
            }
        }
        p
    }
}

fn bounds(min: i32, max: i32) -> Bounds {
    Bounds { min, max, min_gain: 0.5, settle: 10.0, measure: 10.0, cooldown: 300.0 }
}

/// Deterministic noise in [-share, share] from the time.
fn noise(t: f64, share: f64) -> f64 {
    let x = ((t * 12.9898).sin() * 43758.5453).fract();
    (x * 2.0 - 1.0).abs().mul_add(2.0, -1.0) * share
}

#[test]
fn it_climbs_to_the_knee_and_stays_there() {
    /// (name, curve, start, max, where it must settle, the counts it passes through)
    type Case = (&'static str, fn(i32, f64) -> f64, i32, i32, i32, &'static [i32]);
    let cases: [Case; 7] = [
        ("linear: to the maximum", |n, _| 1000.0 * f64::from(n), 1, 8, 8, &[1, 2, 3, 4, 6, 8]),
        ("saturating at 3", |n, _| 1000.0 * f64::from(n.min(3)), 1, 8, 3, &[1, 2, 3, 4, 3]),
        ("smooth saturation: 2 → 3 adds under half of perfect", |n, _| 4000.0 * (1.0 - (-f64::from(n) / 2.0).exp()), 1, 8, 2, &[1, 2, 3, 2]),
        ("dropping past 2 (ps-bound, contention)", |n, _| if n <= 2 { 1000.0 * f64::from(n) } else { 1500.0 }, 1, 8, 2, &[1, 2, 3, 2]),
        ("noisy ±5%, saturating at 3", |n, t| 1000.0 * f64::from(n.min(3)) * (1.0 + noise(t, 0.05)), 1, 8, 3, &[1, 2, 3, 4, 3]),
        ("no gain at all: back to 1", |_, _| 1000.0, 1, 8, 1, &[1, 2, 1]),
        ("started at 4 on a linear curve", |n, _| 500.0 * f64::from(n), 4, 12, 12, &[4, 6, 9, 12]),
    ];
    for (name, curve, start, max, knee, path) in cases {
        let run = Sim::new(bounds(1, max), curve).run(start, 290.0);
        assert_eq!(run.last(), knee, "{name}: {:?}", run.decisions);
        assert_eq!(run.path(), path, "{name}: {:?}", run.decisions);
        // Each step: settle 10 s + measure 10 s, on 5 s ticks.
        assert!(run.settled_at() <= 25.0 * path.len() as f64, "{name}: settled at {} s", run.settled_at());
    }
}

/// The MLP of `tfjob-bench --only autoscale` on this 2-core machine (1 ps, async; examples/s of
/// the static runs with 1 to 4 workers, 2026-11-27): 50% stops at 2 workers (a third adds 13% of
/// what perfect scaling would), the default 10% goes on to 4 and steps back from 6. (The bench's
/// own measurements are noisier: a third worker's 13% is near the 10% line; the synthetic noisy
/// cases above test noise.)
#[test]
fn a_recorded_curve_settles_where_its_share_says() {
    fn recorded(n: i32, _: f64) -> f64 {
        match n {
            1 => 65_963.0,
            2 => 114_872.0,
            3 => 122_291.0,
            4 => 128_948.0,
            _ => 126_000.0,
        }
    }
    let run = Sim::new(bounds(1, 6), recorded).run(1, 200.0);
    assert_eq!((run.path(), run.last()), (vec![1, 2, 3, 2], 2), "{:?}", run.decisions);
    let throughput_first = Bounds { min_gain: 0.1, ..bounds(1, 6) };
    let run = Sim::new(throughput_first, recorded).run(1, 200.0);
    assert_eq!((run.path(), run.last()), (vec![1, 2, 3, 4, 6, 4], 4), "{:?}", run.decisions);
}

#[test]
fn after_stepping_back_it_waits_the_cooldown_then_probes_once() {
    let run = Sim::new(bounds(1, 8), |n, _| 1000.0 * f64::from(n.min(3))).run(3, 980.0);
    // 3 → 4 does not pay, back to 3, then one probe (and one step back) per cooldown.
    let first_back = run.decisions.iter().find(|(_, d)| matches!(d, Decision::Scale { to: 3, .. })).unwrap().0;
    assert_eq!(run.changes_between(first_back, first_back + 300.0 - 1.0), 0, "{:?}", run.decisions);
    assert!(run.changes_between(first_back, first_back + 360.0) >= 1, "{:?}", run.decisions);
    assert!(run.changes_between(0.0, 980.0) <= 6, "{:?}", run.decisions);
    assert_eq!(run.last(), 3);
    // Most of the time is spent at the knee.
    let at_knee = run.counts.iter().filter(|(_, n)| *n == 3).count();
    assert!(at_knee as f64 > 0.85 * run.counts.len() as f64, "{at_knee} of {}", run.counts.len());
}

#[test]
fn it_never_leaves_the_bounds() {
    // Below the minimum at the start: up to it first; above the maximum: down to it.
    for (start, min, max, first) in [(1, 2, 6, 2), (9, 1, 4, 4), (3, 3, 3, 3)] {
        let run = Sim::new(bounds(min, max), |n, _| 1000.0 * f64::from(n)).run(start, 200.0);
        assert_eq!(run.counts[0].1, first, "{start} in [{min}, {max}]");
        assert!(run.counts.iter().all(|(_, n)| (min..=max).contains(n)), "{:?}", run.counts);
    }
    // min = max: nothing to decide, ever.
    let run = Sim::new(bounds(3, 3), |n, _| 1000.0 * f64::from(n)).run(3, 200.0);
    assert!(run.decisions.iter().all(|(_, d)| !matches!(d, Decision::Scale { .. })), "{:?}", run.decisions);
}

#[test]
fn no_change_when_the_job_ends_before_it_could_be_measured() {
    let mut sim = Sim::new(bounds(1, 8), |n, _| 1000.0 * f64::from(n));
    sim.remaining = Some(25.0);
    let run = sim.run(1, 60.0);
    assert_eq!(run.path(), [1]);
    assert!(matches!(run.decisions.as_slice(), [(_, Decision::Settle { message })] if message.contains("ends")), "{:?}", run.decisions);
}

#[test]
fn a_count_set_by_hand_is_where_it_starts_again() {
    let b = bounds(1, 8);
    let readings: Vec<Reading> = (0..=10)
        .map(|i| Reading { at: f64::from(i) * 5.0, sample: ProgressSample { examples_trained: Some(f64::from(i) * 5000.0), ..Default::default() } })
        .collect();
    let state = AutoscalerState { replicas: 4, since: 0.0, stepped_from: Some(Measured { replicas: 3, rate: 900.0 }), ..Default::default() };
    // The spec says 6 now (a `kubectl scale`): the step from 3 is forgotten, measuring starts over.
    let (st, d) = decide(Some(&state), Look { bounds: b, replicas: 6, readings: &readings, now: 50.0, remaining: None });
    assert_eq!(d, Decision::Hold);
    assert_eq!((st.replicas, st.since, st.stepped_from), (6, 50.0, None));
}

#[test]
fn events_carry_the_numbers() {
    let b = bounds(1, 12);
    let readings: Vec<Reading> = (0..=6)
        .map(|i| Reading { at: f64::from(i) * 5.0, sample: ProgressSample { examples_trained: Some(f64::from(i) * 5.0 * 14_900.0), ..Default::default() } })
        .collect();
    let state = AutoscalerState { replicas: 6, since: 0.0, stepped_from: Some(Measured { replicas: 4, rate: 10_200.0 }), ..Default::default() };
    let (_, d) = decide(Some(&state), Look { bounds: b, replicas: 6, readings: &readings, now: 30.0, remaining: None });
    let Decision::Scale { from: 6, to: 9, message } = d else { panic!("{d:?}") };
    assert_eq!(message, "Worker 6 → 9: 10.2k → 14.9k examples/s at 4 → 6 workers (+4.7k, perfect scaling +5.1k)");
    // From 14.0k examples/s at 4 workers, the same 14.9k at 6 did not pay.
    let state = AutoscalerState { stepped_from: Some(Measured { replicas: 4, rate: 14_000.0 }), ..state };
    let (st, d) = decide(Some(&state), Look { bounds: b, replicas: 6, readings: &readings, now: 30.0, remaining: None });
    let Decision::Scale { from: 6, to: 4, message } = d else { panic!("{d:?}") };
    assert!(message.ends_with("the step up did not pay"), "{message}");
    assert_eq!(st.settled_until, Some(330.0));
}

#[test]
fn a_measurement_waits_for_the_rate_to_settle() {
    let b = bounds(1, 8);
    let r = |at: f64, ex: f64| Reading { at, sample: ProgressSample { examples_trained: Some(ex), ..Default::default() } };
    // Changed at 100: readings before 110 are not used, and 10 s must be spanned after.
    let readings = [r(100.0, 0.0), r(105.0, 100.0), r(110.0, 1000.0), r(115.0, 2000.0)];
    assert_eq!(measure(&b, 100.0, &readings), None);
    let readings = [r(100.0, 0.0), r(105.0, 100.0), r(110.0, 1000.0), r(115.0, 2000.0), r(120.0, 3000.0)];
    assert_eq!(measure(&b, 100.0, &readings), Some(200.0));
    // A job without dispatched data: steps instead.
    let s = |at: f64, step: f64| Reading { at, sample: ProgressSample { global_step: Some(step), ..Default::default() } };
    assert_eq!(measure(&b, 0.0, &[s(10.0, 0.0), s(20.0, 50.0)]), Some(5.0));
}

#[test]
fn the_policy_is_checked_against_the_job() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let policy = |min: Option<i32>, max: Option<i32>| ElasticPolicy {
        min_replicas: min,
        max_replicas: max,
        autoscale: Some(Autoscale::Throughput),
        ..Default::default()
    };
    /// (policy, Worker replicas and args, the errors' beginnings)
    type Case = (ElasticPolicy, Option<(i32, Vec<String>)>, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        (policy(Some(1), Some(4)), Some((2, args(&["--model=mlp"]))), vec![]),
        (policy(None, None), Some((2, vec![])), vec![]),
        (policy(Some(0), Some(4)), Some((2, vec![])), vec!["spec.elasticPolicy.minReplicas: must be at least 1, got 0"]),
        (policy(Some(3), Some(2)), Some((2, vec![])), vec!["spec.elasticPolicy: minReplicas 3 is more than maxReplicas 2"]),
        (policy(Some(1), Some(4)), Some((6, vec![])), vec!["spec.elasticPolicy: the Worker replicas 6 are outside [minReplicas 1, maxReplicas 4]"]),
        (policy(Some(1), Some(4)), None, vec!["spec.elasticPolicy: needs a Worker replica set: it scales the job's workers"]),
        (
            policy(Some(1), Some(4)),
            Some((2, args(&["--sync_replicas", "--replicas_to_aggregate=2"]))),
            vec!["spec.elasticPolicy: the workers train in sync mode"],
        ),
        (policy(Some(1), Some(4)), Some((2, args(&["--sync_replicas=true"]))), vec!["spec.elasticPolicy: the workers train in sync mode"]),
        (policy(Some(1), Some(4)), Some((2, args(&["--sync-replicas", "--replicas-to-aggregate", "auto"]))), vec![]),
        (policy(Some(1), Some(4)), Some((2, args(&["--sync_replicas=false", "--replicas_to_aggregate=2"]))), vec![]),
    ];
    for (p, workers, want) in cases {
        let mut errs = vec![];
        check_policy(&p, workers.as_ref().map(|(n, a)| (*n, a.as_slice())), &mut errs);
        let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(got.len(), want.len(), "{p:?} {workers:?}: {got:?}");
        for (g, w) in got.iter().zip(&want) {
            assert!(g.starts_with(w), "{g:?} does not start with {w:?}");
        }
    }
}

#[test]
fn defaults_and_steps() {
    let b = Bounds::of(&ElasticPolicy::default(), 5);
    assert_eq!((b.min, b.max, b.min_gain, b.settle, b.measure, b.cooldown), (1, 5, 0.1, 15.0, 15.0, 600.0));
    let steps: Vec<i32> = std::iter::successors(Some(1), |n| Some(bounds(1, 20).step_up(*n)).filter(|m| m != n)).collect();
    assert_eq!(steps, [1, 2, 3, 4, 6, 9, 13, 19, 20]);
}

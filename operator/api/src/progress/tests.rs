use super::*;

/// ps 0's page as `tfjob-runtime` writes it (OpenMetrics text, every figure labelled).
const PAGE: &str = r#"# HELP tfjob_ps_step Step of this ps.
# TYPE tfjob_ps_step gauge
tfjob_ps_step{task="ps:0"} 1200
# TYPE tfjob_ps_updates counter
tfjob_ps_updates_total{task="ps:0"} 1200
tfjob_ps_workers_live{task="ps:0"} 3
tfjob_ps_epochs_completed{task="ps:0"} 2
tfjob_ps_num_epochs{task="ps:0"} 5
tfjob_ps_examples_per_epoch{task="ps:0"} 60000.0
tfjob_ps_examples_trained_total{task="ps:0"} 150000.0
tfjob_ps_train_steps{task="ps:0"} 0
tfjob_ps_loss{task="ps:0"} 0.25
tfjob_ps_eval_accuracy{task="ps:0",note="a } in a label"} 0.9125
# EOF
"#;

#[test]
fn a_page_gives_the_figures_it_has_and_skips_the_rest() {
    let s = ProgressSample::parse(PAGE);
    assert_eq!(s.global_step, Some(1200.0));
    assert_eq!(s.workers_live, Some(3.0));
    assert_eq!(s.epochs_completed, Some(2.0));
    assert_eq!(s.num_epochs, Some(5.0));
    assert_eq!(s.examples_per_epoch, Some(60000.0));
    assert_eq!(s.examples_trained, Some(150000.0));
    assert_eq!(s.train_steps, Some(0.0));
    assert_eq!(s.figures, BTreeMap::from([("loss", 0.25), ("eval_accuracy", 0.9125)]));
    assert!(!s.is_empty());
}

#[test]
fn lines_that_are_not_samples_are_skipped() {
    for (page, step) in [
        ("", None),
        ("# EOF", None),
        ("tfjob_ps_step", None),
        ("tfjob_ps_step{task=\"ps:0\"}", None),
        ("tfjob_ps_step{task=\"ps:0\"} NaN", None),
        ("tfjob_ps_step{task=\"ps:0\"} seven", None),
        ("tfjob_ps_step 7", Some(7.0)),
        ("tfjob_ps_step{task=\"ps:0\"} 7 1700000000", Some(7.0)),
        ("  tfjob_ps_step{task=\"ps 0\"}   8.0  ", Some(8.0)),
        ("tfjob_ps_steps 9", None),
        ("tfjob_local_steps_total{task=\"worker:0\"} 10", None),
    ] {
        assert_eq!(ProgressSample::parse(page).global_step, step, "{page:?}");
    }
    assert!(ProgressSample::parse("tfjob_local_steps_total{task=\"worker:0\"} 10\n# EOF\n").is_empty());
}

fn sample(step: f64, examples: f64) -> ProgressSample {
    ProgressSample {
        global_step: Some(step),
        examples_trained: Some(examples),
        num_epochs: Some(5.0),
        examples_per_epoch: Some(1000.0),
        epochs_completed: Some((examples / 1000.0).floor()),
        ..Default::default()
    }
}

#[test]
fn rates_are_over_the_last_minute_and_the_estimate_follows_them() {
    let mut t = ProgressTracker::default();
    assert_eq!(t.progress(), None);
    // 10 examples/s for two minutes, then 20/s for the last one.
    let mut examples = 0.0;
    for at in (0..=180).step_by(10) {
        t.record(1000.0 + at as f64, sample(examples / 10.0, examples));
        examples += if at < 120 { 100.0 } else { 200.0 };
    }
    // The reading at 180 s says 1400 + ... : compute from the readings themselves.
    let last = t.latest().unwrap().sample.examples_trained.unwrap();
    let minute_ago = t.readings().find(|r| r.at >= 1120.0).unwrap().sample.examples_trained.unwrap();
    let p = t.progress().unwrap();
    assert_eq!(p.examples_per_second, Some(((last - minute_ago) / 60.0).round() as i64));
    assert_eq!(p.examples_per_second, Some(20));
    assert_eq!(p.num_epochs, Some(5));
    assert_eq!(p.epochs_completed, Some(2));
    assert_eq!(p.progress_percentage, Some((last / 5000.0 * 100.0) as i32));
    let left = (5000.0 - last) / 20.0;
    assert_eq!(p.estimated_remaining_seconds, Some(left.round() as i64));
    assert_eq!(p.estimated_remaining_time_summary.as_deref(), Some(duration_summary(left).as_str()));
    assert_eq!(p.last_updated_time.unwrap().0.as_second(), 1180);
}

#[test]
fn the_estimate_needs_a_bound_and_a_rate() {
    let mut t = ProgressTracker::default();
    // One reading: no rate, so no time left, but how much is done is known.
    t.record(0.0, sample(10.0, 2500.0));
    let p = t.progress().unwrap();
    assert_eq!((p.progress_percentage, p.estimated_remaining_seconds, p.examples_per_second), (Some(50), None, None));
    // Unbounded epochs, bounded steps: the estimate goes by steps.
    let steps = |step: f64| ProgressSample { global_step: Some(step), train_steps: Some(1000.0), num_epochs: Some(0.0), ..Default::default() };
    let mut t = ProgressTracker::default();
    t.record(0.0, steps(100.0));
    t.record(30.0, steps(400.0));
    let p = t.progress().unwrap();
    assert_eq!((p.progress_percentage, p.estimated_remaining_seconds, p.num_epochs, p.train_steps), (Some(40), Some(60), None, Some(1000)));
    assert_eq!(p.steps_per_second.as_deref(), Some("10.00"));
    // Neither bound: no estimate at all.
    let mut t = ProgressTracker::default();
    t.record(0.0, ProgressSample { global_step: Some(5.0), ..Default::default() });
    t.record(10.0, ProgressSample { global_step: Some(50.0), ..Default::default() });
    let p = t.progress().unwrap();
    assert_eq!((p.progress_percentage, p.estimated_remaining_seconds), (None, None));
    // Done: nothing left, whatever the rate.
    let mut t = ProgressTracker::default();
    t.record(0.0, sample(500.0, 5000.0));
    assert_eq!(t.progress().unwrap().estimated_remaining_seconds, Some(0));
}

#[test]
fn a_counter_that_goes_back_starts_the_history_again() {
    let mut t = ProgressTracker::default();
    t.record(0.0, sample(100.0, 1000.0));
    t.record(10.0, sample(200.0, 2000.0));
    assert_eq!(t.examples_per_second(), Some(100.0));
    // ps 0 restarted from a checkpoint at 1500 examples.
    t.record(20.0, sample(150.0, 1500.0));
    assert_eq!(t.readings().count(), 1);
    assert_eq!(t.examples_per_second(), None);
    t.record(30.0, sample(160.0, 1600.0));
    assert_eq!(t.examples_per_second(), Some(10.0));
}

#[test]
fn old_readings_are_dropped() {
    let mut t = ProgressTracker::default();
    for at in 0..=100 {
        t.record(at as f64 * 10.0, sample(at as f64, at as f64));
    }
    assert!(t.readings().next().unwrap().at >= 1000.0 - HISTORY_SECS);
}

#[test]
fn summaries_and_short_numbers() {
    for (secs, text) in [(0.0, "0s"), (40.4, "40s"), (200.0, "3m20s"), (3599.0, "59m59s"), (3900.0, "1h05m"), (-5.0, "0s")] {
        assert_eq!(duration_summary(secs), text);
    }
    for (v, text) in [(870.0, "870"), (10_200.0, "10.2k"), (14_940.0, "14.9k"), (4_500_000.0, "4.5M")] {
        assert_eq!(short_number(v), text);
    }
}

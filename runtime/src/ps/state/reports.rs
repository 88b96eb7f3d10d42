//! What the tasks report of their training by heartbeat, kept so that ps
//! 0's metrics show the whole job's progress from one endpoint: the latest
//! training loss, the largest `--train_steps`, the latest evaluation. Not
//! checkpointed: a restarted ps learns them again from the next heartbeats.

use crate::proto;

#[derive(Debug, Default)]
pub(in crate::ps) struct Reports {
    /// The latest training loss a task reported (any task: they train one
    /// model, so the latest is the freshest view of it).
    pub(in crate::ps) loss: Option<f32>,
    /// The largest `--train_steps` reported (0: none): the tasks of a job
    /// normally agree, and the largest is the step training goes on to.
    pub(in crate::ps) train_steps: i64,
    /// The evaluation of the highest step: one of an older step arriving
    /// late (a slow call, a second evaluator) does not replace it.
    pub(in crate::ps) evaluation: Option<proto::Evaluation>,
}

impl Reports {
    /// Keeps what `report` says that is newer than what is kept.
    pub(in crate::ps) fn note(&mut self, report: &proto::HeartbeatRequest) {
        if report.loss.is_some() {
            self.loss = report.loss;
        }
        self.train_steps = self.train_steps.max(report.train_steps);
        if let Some(e) = &report.evaluation
            && self.evaluation.as_ref().is_none_or(|kept| e.step >= kept.step)
        {
            self.evaluation = Some(*e);
        }
    }
}

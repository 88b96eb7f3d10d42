//! What a task is doing, shared between its loop and its Worker service.

use std::sync::Mutex;

use crate::cluster::TaskId;
use crate::proto::{self, TaskState};

pub struct TaskStatus {
    task: TaskId,
    inner: Mutex<proto::WorkerStatus>,
}

impl TaskStatus {
    pub fn new(task: TaskId) -> Self {
        let inner = proto::WorkerStatus { task: Some((&task).into()), state: TaskState::Starting as i32, ..Default::default() };
        TaskStatus { task, inner: Mutex::new(inner) }
    }

    pub fn task(&self) -> &TaskId {
        &self.task
    }

    pub fn set(&self, state: TaskState, local_step: u64, global_step: i64, message: &str) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.state = state as i32;
        s.local_step = local_step as i64;
        s.global_step = global_step;
        if s.message != message {
            s.message = message.to_string();
        }
    }

    pub fn get(&self) -> proto::WorkerStatus {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

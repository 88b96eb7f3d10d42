//! The layout calls of a task (ps 0 is asked which ps tasks are the job's
//! now) and the chief's side of a move: freeze the ps tasks of the current
//! layout at a step boundary, have every ps of the next one stage its pieces
//! (each fetches them, streamed, from the current ones), commit on all of
//! them, ps 0 last; abort on every one if any step fails.

use std::time::{Duration, Instant};

use futures::future::{join_all, try_join_all};
use tonic::Status;

use super::{CALL_DEADLINE, ClientError, PsGrpc, PsSet, deadline, ps_client, with_retry, without_retry};
use crate::auth::Credentials;
use crate::proto;

/// How long a stage may take: its ps fetches its pieces from every other.
const STAGE_DEADLINE: Duration = Duration::from_secs(300);

/// What a move did.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    pub version: u64,
    pub from_ps: usize,
    pub to_ps: usize,
    pub step: i64,
    pub rows: u64,
    pub bytes: u64,
    /// Bytes that changed ps (the rest stayed where it was).
    pub moved_bytes: u64,
    pub seconds: f64,
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "moved the job's state from {} to {} ps task(s) (layout version {}) at global_step={}: {} embedding rows, {} with slots, {} of it between ps tasks, {:.2}s",
            self.from_ps,
            self.to_ps,
            self.version,
            self.step,
            self.rows,
            crate::ps::recut::bytes_text(self.bytes),
            crate::ps::recut::bytes_text(self.moved_bytes),
            self.seconds
        )
    }
}

impl PsSet {
    /// The job's layout as ps 0 knows it.
    pub async fn layout(&self) -> Result<proto::LayoutReply, ClientError> {
        let client = self.clients[0].clone();
        let req = proto::GetLayoutRequest { task: self.task_proto() };
        with_retry(0, &self.addresses[0], "ask the layout of", self.patience, move || {
            let (mut c, req) = (client.clone(), req.clone());
            async move { c.get_layout(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
        })
        .await
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Moves the job's state from `old` (the ps tasks of the current layout)
    /// to this set, as layout `version`. Sync: `at_step` is the step every
    /// ps of `old` is at (this is a step boundary); -1 in async training.
    pub async fn take_over(&self, old: &PsSet, version: u64, at_step: i64) -> Result<Moved, ClientError> {
        let start = Instant::now();
        let (step, live_tasks) = match old.freeze(version, at_step).await {
            Ok(frozen) => frozen,
            Err(e) => {
                old.commit_everywhere(&[], version, true).await;
                return Err(e);
            }
        };
        let staged = match self.stage_everywhere(old, version, step, &live_tasks).await {
            Ok(r) => r,
            Err(e) => {
                self.commit_everywhere(&old.addresses, version, true).await;
                return Err(e);
            }
        };
        self.commit_everywhere(&old.addresses, version, false).await;
        Ok(Moved {
            version,
            from_ps: old.num_ps(),
            to_ps: self.num_ps(),
            step,
            rows: staged.iter().map(|r| r.rows).sum(),
            bytes: staged.iter().map(|r| r.bytes).sum(),
            moved_bytes: staged.iter().map(|r| r.moved_bytes).sum(),
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Freezes every ps of this set for the move to `version`; the step the
    /// state is taken at (ps 0's) and the live training tasks (any ps's).
    async fn freeze(&self, version: u64, at_step: i64) -> Result<(i64, Vec<String>), ClientError> {
        let calls =
            self.clients.iter().enumerate().map(|(ps, client)| {
                let req = proto::FreezeRequest { task: self.task_proto(), version, at_step };
                let mut c = client.clone();
                without_retry(ps, &self.addresses[ps], "freeze", move || async move {
                    c.freeze_for_move(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner())
                })
            });
        let replies = try_join_all(calls).await?;
        let mut live: Vec<String> = replies.iter().flat_map(|r| r.live_tasks.iter().cloned()).collect();
        live.sort();
        live.dedup();
        Ok((replies[0].step, live))
    }

    /// Every ps of this set fetches and stages its pieces from `old`.
    async fn stage_everywhere(&self, old: &PsSet, version: u64, step: i64, live_tasks: &[String]) -> Result<Vec<proto::StageMoveReply>, ClientError> {
        let calls = (0..self.num_ps()).map(|ps| {
            let (mut variables, tables) = self.specs_on(ps);
            variables.extend(tables);
            let req = proto::StageMoveRequest {
                task: self.task_proto(),
                version,
                variables,
                dense_pieces: self.dense_pieces_on(ps),
                sources: old.addresses.clone(),
                step,
                placement_fingerprint: self.placement.fingerprint(),
                num_ps: self.num_ps() as u32,
                live_tasks: live_tasks.to_vec(),
            };
            let client = self.clients[ps].clone();
            with_retry(ps, &self.addresses[ps], "stage the move on", self.patience, move || {
                let (mut c, req) = (client.clone(), req.clone());
                async move { c.stage_move(deadline(req, STAGE_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await
    }

    /// Commits (or aborts) the move on every ps of this set and of
    /// `others`, ps 0 last: once ps 0 says the new version, every ps serves
    /// it. Errors are logged (a ps that did not hear it refuses the next
    /// request of the old layout anyway).
    async fn commit_everywhere(&self, others: &[String], version: u64, abort: bool) {
        let mut targets: Vec<String> = self.addresses.iter().skip(1).cloned().collect();
        targets.extend(others.iter().skip(1).filter(|a| !self.addresses.contains(a)).cloned());
        let req = proto::CommitMoveRequest { task: self.task_proto(), version, ps_addresses: self.addresses.clone(), abort };
        let commit = |address: String| {
            let req = req.clone();
            let client = self.client_for(&address);
            async move {
                let result = match client {
                    Ok(mut c) => c.commit_move(deadline(req, CALL_DEADLINE)).await.map(drop),
                    Err(e) => Err(Status::unavailable(e.to_string())),
                };
                if let Err(e) = result {
                    tracing::warn!("{} the move on {address}: {e}", if abort { "could not abort" } else { "could not commit" });
                }
            }
        };
        join_all(targets.into_iter().map(commit)).await;
        commit(self.addresses[0].clone()).await;
    }

    /// Tells the ps tasks proposed to ps 0 and never moved to (the job ended
    /// first) that training is over. Errors are ignored.
    pub async fn shutdown_proposed(&self, reason: &str, final_step: i64) {
        // Once: ps 0 may be gone already (it exits when training is over).
        let mut c = self.clients[0].clone();
        let ask = c.get_layout(deadline(proto::GetLayoutRequest { task: self.task_proto() }, super::LEAVE_DEADLINE));
        let Ok(Ok(layout)) = tokio::time::timeout(super::LEAVE_DEADLINE, ask).await.map(|r| r.map(|r| r.into_inner())) else {
            return;
        };
        let extra = layout.proposed.iter().filter(|a| !self.addresses.contains(a));
        let calls = extra.map(|address| {
            let req = proto::ShutdownRequest { task: self.task_proto(), reason: reason.into(), final_step };
            let client = self.client_for(address);
            async move {
                if let Ok(mut c) = client {
                    let _ = c.shutdown(deadline(req, CALL_DEADLINE)).await;
                }
            }
        });
        join_all(calls).await;
    }

    fn client_for(&self, address: &str) -> Result<PsGrpc, ClientError> {
        match self.addresses.iter().position(|a| a == address) {
            Some(i) => Ok(self.clients[i].clone()),
            None => ps_client(address, &self.credentials, Duration::from_secs(5)),
        }
    }
}

/// Proposes the ps set `ps_addresses` (this task's `TF_CONFIG`) to ps 0
/// when the job trains under another one: a ps started into a running job.
/// A job not training yet is waited for (its variables are initialised
/// once; a move needs them). Returns the layout ps 0 answered.
pub async fn propose_if_new(
    task: &crate::cluster::TaskId,
    ps_addresses: &[String],
    credentials: &Credentials,
    patience: Duration,
) -> Result<proto::LayoutReply, ClientError> {
    let client = ps_client(&ps_addresses[0], credentials, Duration::from_secs(5))?;
    let who = Some(proto::TaskId::from(task));
    loop {
        let (c, ask) = (client.clone(), proto::GetLayoutRequest { task: who.clone() });
        let layout = with_retry(0, &ps_addresses[0], "ask the layout of", patience, move || {
            let (mut c, req) = (c.clone(), ask.clone());
            async move { c.get_layout(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
        })
        .await?;
        if layout.ps_addresses == ps_addresses || layout.proposed == ps_addresses {
            return Ok(layout);
        }
        if layout.initialized {
            let req = proto::ProposeLayoutRequest { task: who.clone(), ps_addresses: ps_addresses.to_vec(), leave: false };
            return propose(client.clone(), &ps_addresses[0], req, "propose a layout to", patience).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ps stopped on purpose asks ps 0 (at `ps0_address`) to let it leave
/// the job; the layout ps 0 answered (its proposal without this ps when the
/// ps tasks above it leave too).
pub async fn ask_to_leave(
    task: &crate::cluster::TaskId,
    ps0_address: &str,
    credentials: &Credentials,
    patience: Duration,
) -> Result<proto::LayoutReply, ClientError> {
    let client = ps_client(ps0_address, credentials, Duration::from_secs(5))?;
    let req = proto::ProposeLayoutRequest { task: Some(proto::TaskId::from(task)), ps_addresses: Vec::new(), leave: true };
    propose(client, ps0_address, req, "ask to leave", patience).await
}

/// One `ProposeLayout` call to ps 0, retried while it is unreachable.
async fn propose(
    client: PsGrpc,
    ps0_address: &str,
    req: proto::ProposeLayoutRequest,
    what: &'static str,
    patience: Duration,
) -> Result<proto::LayoutReply, ClientError> {
    with_retry(0, ps0_address, what, patience, move || {
        let (mut c, req) = (client.clone(), req.clone());
        async move { c.propose_layout(deadline(req, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
    })
    .await
}

/// Fetches a source's fragments for a ps staging a move, over gRPC.
pub struct GrpcFragmentSource {
    pub credentials: Credentials,
    pub patience: Duration,
}

#[tonic::async_trait]
impl crate::ps::FragmentSource for GrpcFragmentSource {
    async fn fetch(&self, address: &str, req: proto::FetchFragmentsRequest) -> Result<crate::ps::recut::Fragments, Status> {
        let client = ps_client(address, &self.credentials, Duration::from_secs(5)).map_err(|e| Status::unavailable(e.to_string()))?;
        let result = with_retry(0, address, "fetch fragments from", self.patience, move || {
            let (mut c, req) = (client.clone(), req.clone());
            async move {
                let mut stream = c.fetch_fragments(deadline(req, STAGE_DEADLINE)).await?.into_inner();
                let mut fragments = crate::ps::recut::Fragments::default();
                while let Some(m) = stream.message().await? {
                    crate::ps::add_message(&mut fragments, m);
                }
                Ok(fragments)
            }
        })
        .await;
        result.map_err(|e| match e {
            ClientError::Rpc { status, .. } | ClientError::Unreachable { status, .. } | ClientError::Interrupted { status, .. } => status,
            other => Status::unavailable(other.to_string()),
        })
    }
}

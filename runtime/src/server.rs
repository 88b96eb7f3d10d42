//! Serving: every task binds its own port and serves the Worker service
//! (status and sessions); ps tasks also serve the ParameterServer service.
//! Both are behind the job-token check and have explicit message limits.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::InterceptedService;
use tonic::{Request, Response, Status};

use crate::auth::{self, Credentials, TokenCheck};
use crate::channel;
use crate::client::{H2_CONNECTION_WINDOW_BYTES, H2_MAX_FRAME_BYTES, H2_STREAM_WINDOW_BYTES};
use crate::connection::Connection;
use crate::proto::{
    self,
    parameter_server_server::ParameterServerServer,
    run_session_request::Fetch,
    session_event::Event,
    worker_server::{Worker, WorkerServer},
};
use crate::ps::PsService;
use crate::status::TaskStatus;
use crate::tensor::MAX_MESSAGE_BYTES;
use crate::train::{self, TrainSettings, Workload};

/// Builds a model and its data for a training run submitted to a task.
pub type WorkloadFactory = Arc<dyn Fn(&proto::TrainRun) -> Result<(Workload, TrainSettings), String> + Send + Sync>;

#[derive(Clone)]
pub struct WorkerService {
    status: Arc<TaskStatus>,
    factory: Option<WorkloadFactory>,
}

impl WorkerService {
    pub fn new(status: Arc<TaskStatus>, factory: Option<WorkloadFactory>) -> Self {
        WorkerService { status, factory }
    }
}

type SessionStream = ReceiverStream<Result<proto::SessionEvent, Status>>;

#[tonic::async_trait]
impl Worker for WorkerService {
    async fn get_status(&self, _: Request<proto::GetStatusRequest>) -> Result<Response<proto::WorkerStatus>, Status> {
        Ok(Response::new(self.status.get()))
    }

    type RunSessionStream = SessionStream;

    async fn run_session(&self, request: Request<proto::RunSessionRequest>) -> Result<Response<SessionStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        match request.into_inner().fetch {
            None => return Err(Status::invalid_argument("fetch: nothing to run")),
            Some(Fetch::Constant(t)) => {
                // Evaluating a constant gives the constant back.
                let _ = tx.send(Ok(proto::SessionEvent { event: Some(Event::Value(t)) })).await;
            }
            Some(Fetch::Train(run)) => {
                let factory = self.factory.clone().ok_or_else(|| Status::unimplemented("this task does not accept training runs"))?;
                let (mut workload, settings) = factory(&run).map_err(Status::invalid_argument)?;
                tokio::task::spawn_blocking(move || {
                    let progress_tx = tx.clone();
                    let report = train::train_single_process(&mut workload, &settings, |step, loss, model, params| {
                        let metrics = model.summary(params).into_iter().collect();
                        let _ =
                            progress_tx.blocking_send(Ok(proto::SessionEvent { event: Some(Event::Progress(proto::TrainProgress { step, loss, metrics })) }));
                    });
                    let report = match report {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(Status::invalid_argument(e.to_string())));
                            return;
                        }
                    };
                    let mut metrics: std::collections::HashMap<String, f64> = report.summary.clone().into_iter().collect();
                    if let Some(a) = report.accuracy {
                        metrics.insert("accuracy".into(), a as f64);
                    }
                    metrics.insert("steps_per_sec".into(), report.steps_per_sec);
                    let _ = tx.blocking_send(Ok(proto::SessionEvent {
                        event: Some(Event::Finished(proto::TrainProgress { step: report.local_steps, loss: report.loss.unwrap_or(f32::NAN), metrics })),
                    }));
                });
            }
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Binds `addr` (failing clearly when the port is taken) and serves the
/// given services until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    ps: Option<PsService>,
    worker: WorkerService,
    credentials: &Credentials,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, std::io::Error> {
    let token = credentials.token.as_deref();
    let listener = TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let check = TokenCheck::new(token);
    let worker = InterceptedService::new(
        WorkerServer::new(worker).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES),
        check.clone(),
    );
    // The ps's port also serves the tensor channel.
    let channel_ps = ps.clone();
    let tls = match &credentials.tls {
        Some(files) => Some(files.server_config().map_err(std::io::Error::other)?),
        None => None,
    };
    let ps = ps.map(|svc| {
        InterceptedService::new(
            ParameterServerServer::new(svc).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES),
            check.clone(),
        )
    });
    // TLS is done here (accept_loop), not by tonic: the tensor channel shares the port.
    let mut builder = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(H2_STREAM_WINDOW_BYTES))
        .initial_connection_window_size(Some(H2_CONNECTION_WINDOW_BYTES))
        .max_frame_size(Some(H2_MAX_FRAME_BYTES));
    // The standard gRPC health service, for readiness and liveness probes:
    // not behind the token (a kubelet probe carries none), and it says
    // nothing but SERVING.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    reporter.set_service_status("tfjob.runtime.v1.Worker", tonic_health::ServingStatus::Serving).await;
    if ps.is_some() {
        reporter.set_service_status("tfjob.runtime.v1.ParameterServer", tonic_health::ServingStatus::Serving).await;
    }
    let router = builder.add_service(health).add_service(worker).add_optional_service(ps);
    let (stop_tx, stop) = watch::channel(false);
    let (to_grpc, incoming) = mpsc::channel(64);
    tokio::spawn(accept_loop(listener, to_grpc, tls, channel_ps.map(|svc| (svc, check)), stop));
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    Ok(tokio::spawn(async move { router.serve_with_incoming_shutdown(ReceiverStream::new(incoming), shutdown).await }))
}

/// Accepts connections until the server stops: tensor channel connections
/// (when `channel` is given) are served here, every other one goes to the
/// gRPC server. With `tls` every connection is TLS, and the handshake's
/// ALPN tells the two apart; without, the first bytes do.
async fn accept_loop(
    listener: TcpListener,
    to_grpc: mpsc::Sender<std::io::Result<Connection>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    channel: Option<(PsService, TokenCheck)>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
            _ = to_grpc.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        // tonic ignores the builder's `tcp_nodelay` for connections it did
        // not accept itself: set it here, or Nagle's algorithm holds back
        // small replies (up to a delayed ACK, 40 ms) and every step pays.
        let _ = stream.set_nodelay(true);
        if tls.is_none() && channel.is_none() {
            if to_grpc.send(Ok(Connection::Plain(stream))).await.is_err() {
                return;
            }
            continue;
        }
        let (tls, channel, to_grpc, stop) = (tls.clone(), channel.clone(), to_grpc.clone(), stop.clone());
        tokio::spawn(async move {
            let Some(connection) = open(stream, peer, tls.as_ref(), channel.is_some()).await else { return };
            match (connection, channel) {
                (Opened::Channel(c), Some((service, check))) => channel::serve_connection(c, service, check, stop).await,
                (Opened::Channel(c) | Opened::Grpc(c), _) => {
                    let _ = to_grpc.send(Ok(c)).await;
                }
            }
        });
    }
}

enum Opened {
    Channel(Connection),
    Grpc(Connection),
}

/// What an accepted connection is: its TLS handshake done (with `tls`),
/// then a tensor channel or gRPC. None when it failed the handshake (logged)
/// or said nothing in time (a TCP probe).
async fn open(stream: TcpStream, peer: std::net::SocketAddr, tls: Option<&Arc<rustls::ServerConfig>>, serves_channel: bool) -> Option<Opened> {
    let opening = async {
        match tls {
            Some(config) => match crate::tls_stream::accept(stream, config.clone()).await {
                Ok(s) => {
                    let c = Connection::from(s);
                    Some(if c.alpn() == Some(auth::CHANNEL_ALPN) { Opened::Channel(c) } else { Opened::Grpc(c) })
                }
                Err(e) => {
                    auth::TLS_REFUSED.note(&format!("from {peer}: {e}"));
                    None
                }
            },
            None if !serves_channel => Some(Opened::Grpc(Connection::Plain(stream))),
            None => match channel::is_tensor_channel(&stream).await {
                Ok(true) => Some(Opened::Channel(Connection::Plain(stream))),
                Ok(false) => Some(Opened::Grpc(Connection::Plain(stream))),
                Err(_) => None,
            },
        }
    };
    tokio::time::timeout(channel::OPENING_TIMEOUT, opening).await.ok().flatten()
}

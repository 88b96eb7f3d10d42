//! The kubelet's container-log endpoint for the node agent's pods, so that pod logs read through
//! the API server (`kubectl logs`, client libraries' `read_namespaced_pod_log`, Kubeflow's SDK)
//! work on the test control plane: the API server finds a pod's node, connects to the node's
//! address and kubelet port (`status.daemonEndpoints.kubeletEndpoint`) over TLS (it does not
//! verify a kubelet's certificate unless told a CA) and asks
//! `GET /containerLogs/<namespace>/<pod>/<container>`. The answer is the pod's whole log as the
//! agent saved it (every run of its container; `follow`, `tailLines` and `previous` are not
//! honoured).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::controlplane::ControlPlane;

/// A running log endpoint; stops with its runtime when dropped.
pub struct KubeletLogs {
    _runtime: tokio::runtime::Runtime,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
}

/// Where the log of `<namespace>/<pod>` is.
pub type LogPath = Arc<dyn Fn(&str, &str) -> PathBuf + Send + Sync>;

/// Serves the logs `log_path` finds on 127.0.0.1, and makes `node` (the agent's Node object,
/// created when missing) point the API server at it.
pub fn serve(cp: &ControlPlane, node: &str, log_path: LogPath) -> Result<KubeletLogs> {
    let key = rcgen::KeyPair::generate().context("kubelet key")?;
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?.self_signed(&key)?;
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(cert.der().to_vec())], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("kubelet-logs").enable_all().build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0))).context("binding the kubelet's log endpoint")?;
    let port = listener.local_addr()?.port();
    runtime.spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else { continue };
            let Ok(stream) = acceptor.accept(socket).await else { continue };
            let log_path = log_path.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let log_path = log_path.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(req.uri().path(), &log_path)) }
            });
            let conn = http.serve_connection(TokioIo::new(stream), service).into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    cp.kubectl_stdin(["apply", "-f", "-"], &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"))?;
    let status = serde_json::json!({ "status": {
        "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }],
        "daemonEndpoints": { "kubeletEndpoint": { "Port": port } },
    }});
    cp.kubectl_ok(["patch", "node", node, "--subresource=status", "--type=merge", "-p", &status.to_string()])?;
    Ok(KubeletLogs { _runtime: runtime, port })
}

/// `GET /containerLogs/<namespace>/<pod>/<container>`: the pod's log (404 when there is none).
fn answer(path: &str, log_path: &LogPath) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let log = match parts.as_slice() {
        ["containerLogs", ns, pod, _container] => std::fs::read(log_path(ns, pod)).ok(),
        _ => None,
    };
    let (status, body) = match log {
        Some(bytes) => (StatusCode::OK, bytes),
        None => (StatusCode::NOT_FOUND, format!("no log for {path}\n").into_bytes()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

//! A real S3-compatible server for the tests and for trying the S3 example
//! by hand: the `s3s` crate's S3 protocol (SigV4 authentication, path-style
//! requests, ListObjectsV2, multipart, ...) over its file-system backend
//! `s3s-fs`, on 127.0.0.1. Each bucket is a directory of the server's root.
//!
//! The runtime reaches it as it reaches any S3-compatible endpoint:
//! `AWS_ENDPOINT_URL=http://127.0.0.1:PORT`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` ([`S3Server::env`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

/// The access key of the test server.
pub const ACCESS_KEY: &str = "tfjob-test";
/// Its secret key.
pub const SECRET_KEY: &str = "tfjob-test-secret";

/// A running server; stopped when dropped.
pub struct S3Server {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    root: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl S3Server {
    /// Starts a server on a free port of 127.0.0.1 over a new temporary
    /// directory, with `buckets` created.
    pub fn start(buckets: &[&str]) -> Result<S3Server> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().to_path_buf();
        let mut server = S3Server::serve(&root, 0)?;
        server._tmp = Some(tmp);
        for b in buckets {
            server.create_bucket(b)?;
        }
        Ok(server)
    }

    /// Serves the directory `root` on 127.0.0.1:`port` (0: a free port).
    pub fn serve(root: &Path, port: u16) -> Result<S3Server> {
        std::fs::create_dir_all(root)?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("s3-server").enable_all().build()?;
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| anyhow::anyhow!("s3s-fs over {}: {e:?}", root.display()))?;
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port))).context("binding the S3 server")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    continue;
                };
                let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        Ok(S3Server { endpoint, root: root.to_path_buf(), _tmp: None, runtime: Some(runtime) })
    }

    /// Creates a bucket (a directory of the root).
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        Ok(std::fs::create_dir_all(self.root.join(name))?)
    }

    /// Where the server keeps `bucket/key` on disk (to damage an object in a test).
    pub fn object_path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }

    /// The environment that points an S3 client here.
    pub fn env(&self) -> Vec<(String, String)> {
        [("AWS_ENDPOINT_URL", self.endpoint.as_str()), ("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY), ("AWS_REGION", "us-east-1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

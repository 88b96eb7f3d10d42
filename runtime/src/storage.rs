//! Where checkpoints, TensorBoard events and data live: a local path or an
//! object-store URL, through one library ([`object_store`]).
//!
//! | written as | store | configured by |
//! |---|---|---|
//! | `/a/b`, `a/b`, `file:///a/b` | the local file system (writes synced to disk, then renamed) | — |
//! | `s3://bucket/prefix` | Amazon S3 or any S3-compatible server | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL` (a non-AWS endpoint; `http://` is allowed for it), every other `AWS_*` key of the `object_store` crate |
//! | `gs://bucket/prefix` | Google Cloud Storage | `GOOGLE_APPLICATION_CREDENTIALS`, `GOOGLE_SERVICE_ACCOUNT`, other `GOOGLE_*` keys |
//! | `az://container/prefix` (also `abfs://`, `adl://`, `azure://`) | Azure Blob Storage | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, other `AZURE_*` keys |
//!
//! Two ways in:
//! - [`open`] gives the store and the object path of a URL or path, for
//!   async code that wants the whole `object_store` API.
//! - [`Location`] names one object or "directory" (a key prefix) and has
//!   the few blocking operations the checkpoint, event and data code needs:
//!   [`Location::read`], [`Location::write`] (atomic: readers see all of it
//!   or nothing, on every store), [`Location::size`], [`Location::list`],
//!   [`Location::delete`]. They run on one small runtime of their own, so
//!   they may be called from anywhere, async code included (they block the
//!   calling thread like file I/O does).
//!
//! A directory on an object store exists as soon as an object is under it;
//! nothing needs creating. Locally, directories are created as needed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Errors of [`open`] and of the operations of [`Location`].
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{location}: {reason}")]
    InvalidLocation { location: String, reason: String },
    #[error("{location}: not found")]
    NotFound { location: String },
    #[error("{location}: {source}")]
    Store { location: String, source: object_store::Error },
    #[error("{location}: {source}")]
    Io { location: String, source: std::io::Error },
    /// No credentials in the environment, and none from the cloud's
    /// instance metadata service either.
    #[error(
        "{location}: no credentials: none in the environment, and the instance metadata service gave none ({source}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3:// (GOOGLE_APPLICATION_CREDENTIALS for gs://, AZURE_STORAGE_ACCOUNT_KEY for az://), or run with a role that the metadata service serves"
    )]
    Credentials { location: String, source: object_store::Error },
}

impl StorageError {
    /// Whether the object (or file) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound { .. })
    }

    /// Whether trying again later may succeed: the store could not be
    /// reached, timed out or answered with a server error. A bad location,
    /// a missing object, missing credentials or a refused request are
    /// permanent: a restart would meet them again.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::InvalidLocation { .. } | StorageError::NotFound { .. } | StorageError::Credentials { .. } => false,
            StorageError::Store { source, .. } => store_error_is_transient(source),
            StorageError::Io { source, .. } => io_error_is_transient(source.kind()),
        }
    }

    /// The error of `source` at `location`; failures of the instance
    /// metadata service (where the stores look for credentials last) say so.
    fn of_store(location: &str, source: object_store::Error) -> StorageError {
        let location = location.to_string();
        match source {
            object_store::Error::NotFound { .. } => StorageError::NotFound { location },
            source if names_metadata_service(&source.to_string()) => StorageError::Credentials { location, source },
            source => StorageError::Store { location, source },
        }
    }
}

/// Whether an error message is about a request to a cloud's instance
/// metadata service (AWS IMDS, GCP's metadata server, Azure IMDS), by the
/// paths those services serve credentials at.
fn names_metadata_service(message: &str) -> bool {
    ["/latest/api/token", "/latest/meta-data/", "/computeMetadata/", "/metadata/identity/oauth2/token"].iter().any(|p| message.contains(p))
}

/// The `object_store` errors worth a retry: only its generic ones (HTTP and
/// connection failures) can be, decided by the HTTP status they report.
fn store_error_is_transient(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { .. } | object_store::Error::JoinError { .. } => message_is_transient(&e.to_string()),
        _ => false,
    }
}

/// A generic store error by its text (the status is not reachable through
/// `object_store`'s public types): a 4xx status other than 408 (timeout) and
/// 429 (throttled) is permanent; a 5xx status, or no status at all (refused,
/// reset, timed out, no DNS answer), is transient.
fn message_is_transient(message: &str) -> bool {
    match http_status(message) {
        Some(status) => status == 408 || status == 429 || status >= 500,
        None => true,
    }
}

/// The HTTP status in `object_store`'s "status code: 403 Forbidden".
fn http_status(message: &str) -> Option<u16> {
    let (_, rest) = message.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// Local I/O errors worth a retry: the network file systems' and the
/// interrupted ones. A missing file, a denied permission, a full disk are not.
pub(crate) fn io_error_is_transient(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        TimedOut
            | ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | Interrupted
            | WouldBlock
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
            | StaleNetworkFileHandle
            | ResourceBusy
    )
}

/// URL schemes of object stores, and the store each names.
const SCHEMES: [(&str, Kind); 8] = [
    ("s3", Kind::S3),
    ("s3a", Kind::S3),
    ("gs", Kind::Gcs),
    ("az", Kind::Azure),
    ("azure", Kind::Azure),
    ("abfs", Kind::Azure),
    ("abfss", Kind::Azure),
    ("adl", Kind::Azure),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    S3,
    Gcs,
    Azure,
}

/// Whether `s` is an object-store URL (`scheme://...`) rather than a path.
pub fn is_url(s: &str) -> bool {
    s.split_once("://").is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '+'))
}

/// What a location string names: the store kind, and for URLs the parsed
/// URL; for paths the absolute local path. Pure: reads no environment.
fn classify(location: &str) -> Result<(Kind, Option<url::Url>, Option<PathBuf>), StorageError> {
    let invalid = |reason: String| StorageError::InvalidLocation { location: location.to_string(), reason };
    if location.is_empty() {
        return Err(invalid("empty".into()));
    }
    if !is_url(location) {
        let path = std::path::absolute(location).map_err(|e| invalid(e.to_string()))?;
        return Ok((Kind::Local, None, Some(path)));
    }
    let url = url::Url::parse(location).map_err(|e| invalid(format!("not a valid URL: {e}")))?;
    if url.scheme() == "file" {
        let path = url.to_file_path().map_err(|()| invalid("not a local file URL".into()))?;
        return Ok((Kind::Local, None, Some(path)));
    }
    let kind = SCHEMES
        .iter()
        .find(|(s, _)| *s == url.scheme())
        .map(|(_, k)| *k)
        .ok_or_else(|| invalid(format!("unsupported scheme {:?} (a path, or s3://, gs://, az://, file://)", url.scheme())))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("names no bucket or container".into()));
    }
    Ok((kind, Some(url), None))
}

/// The endpoint of an S3-compatible server (`AWS_ENDPOINT_URL`, else `AWS_ENDPOINT`).
fn s3_endpoint() -> Option<String> {
    ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
}

/// TLS for the object stores' HTTP client: rustls with ring (tonic uses the
/// same), installed once per process.
fn install_tls_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The store and the object path of `location` (a path or a URL): the
/// entry point for code that wants the async `object_store` API. Credentials
/// and endpoints come from the environment (see the module's table).
pub fn open(location: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StorageError> {
    let (kind, url, path) = classify(location)?;
    let config = |source: object_store::Error| StorageError::of_store(location, source);
    let store: Arc<dyn ObjectStore> = match kind {
        Kind::Local => {
            let path = path.expect("local paths are absolute");
            let key = ObjectPath::from_absolute_path(&path).map_err(|e| config(e.into()))?;
            let fs = object_store::local::LocalFileSystem::new().with_fsync(true).with_automatic_cleanup(true);
            return Ok((Arc::new(fs), key));
        }
        Kind::S3 => {
            install_tls_provider();
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(url.clone().expect("URL").as_str());
            if let Some(endpoint) = s3_endpoint() {
                b = b.with_allow_http(endpoint.starts_with("http://")).with_endpoint(endpoint);
            }
            Arc::new(b.build().map_err(config)?)
        }
        Kind::Gcs => {
            install_tls_provider();
            Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url.clone().expect("URL").as_str()).build().map_err(config)?)
        }
        Kind::Azure => {
            install_tls_provider();
            Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url.clone().expect("URL").as_str()).build().map_err(config)?)
        }
    };
    let url = url.expect("URL");
    let key = ObjectPath::from_url_path(url.path()).map_err(|e| config(e.into()))?;
    Ok((store, key))
}

/// The whole file or object at `location` (a path or a URL): for data
/// files (`--data_dir`, `--train_files`).
pub fn read(location: &str) -> Result<Bytes, StorageError> {
    Location::parse(location)?.read()
}

/// The files or objects directly in the directory `location` (a path or a
/// URL), as locations (`dir/name`), sorted by name; with `suffix`, only the
/// names ending in it. A missing directory has none.
pub fn list_files(location: &str, suffix: &str) -> Result<Vec<Location>, StorageError> {
    let dir = Location::parse(location)?;
    Ok(dir.list()?.files.into_iter().filter(|(name, _)| name.ends_with(suffix)).map(|(name, _)| dir.child(&name)).collect())
}

/// The runtime every blocking operation runs on: one worker thread, for
/// the life of the process.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("storage").enable_all().build().expect("the storage runtime starts")
    })
}

/// Runs `future` on the storage runtime and waits for it; callable from
/// any thread, async code included.
pub fn block_on<F>(future: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv().expect("the storage runtime runs every task it is given")
}

/// One object or directory: a local path or a URL, with its store.
#[derive(Clone)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    /// As the user wrote it (paths made absolute), for messages.
    shown: String,
    /// The file system path, for local locations.
    local: Option<PathBuf>,
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Location({})", self.shown)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl PartialEq for Location {
    fn eq(&self, other: &Self) -> bool {
        self.shown == other.shown
    }
}

impl Eq for Location {}

/// What is directly inside a directory: sub-directories and objects, by name, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub dirs: Vec<String>,
    /// Name and size in bytes.
    pub files: Vec<(String, u64)>,
}

impl Location {
    /// A local path or an object-store URL (see the module's table).
    pub fn parse(location: &str) -> Result<Location, StorageError> {
        let (store, key) = open(location)?;
        let (_, _, local) = classify(location)?;
        let shown = match &local {
            Some(p) => p.display().to_string(),
            None => location.trim_end_matches('/').to_string(),
        };
        Ok(Location { store, key, shown, local })
    }

    /// A local path.
    pub fn local(path: &Path) -> Result<Location, StorageError> {
        let shown = path.to_str().ok_or_else(|| StorageError::InvalidLocation { location: path.display().to_string(), reason: "is not valid UTF-8".into() })?;
        if is_url(shown) {
            return Err(StorageError::InvalidLocation { location: shown.into(), reason: "is a URL, not a path".into() });
        }
        Location::parse(shown)
    }

    /// `self/name`: `name` is one path segment (no `/`).
    pub fn child(&self, name: &str) -> Location {
        Location {
            store: self.store.clone(),
            key: self.key.clone().join(name),
            shown: format!("{}/{name}", self.shown.trim_end_matches('/')),
            local: self.local.as_ref().map(|p| p.join(name)),
        }
    }

    /// The last segment of the location.
    pub fn name(&self) -> &str {
        self.shown.rsplit('/').next().unwrap_or_default()
    }

    /// The file system path of a local location; `None` for object stores.
    pub fn local_path(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    /// The store and the object path, for the async `object_store` API.
    pub fn store(&self) -> (&Arc<dyn ObjectStore>, &ObjectPath) {
        (&self.store, &self.key)
    }

    fn err(&self, source: object_store::Error) -> StorageError {
        StorageError::of_store(&self.shown, source)
    }

    /// The whole object.
    pub fn read(&self) -> Result<Bytes, StorageError> {
        let (store, key) = (self.store.clone(), self.key.clone());
        block_on(async move { store.get(&key).await?.bytes().await }).map_err(|e| self.err(e))
    }

    /// The whole object, or `None` when there is none.
    pub fn read_if_exists(&self) -> Result<Option<Bytes>, StorageError> {
        match self.read() {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The size of the object, or `None` when there is none.
    pub fn size(&self) -> Result<Option<u64>, StorageError> {
        let (store, key) = (self.store.clone(), self.key.clone());
        match block_on(async move { store.head(&key).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Writes the whole object: readers see either the old object (or none)
    /// or all of `bytes`. Locally: written to a temporary file, synced,
    /// renamed, the directory synced; parent directories created.
    pub fn write(&self, bytes: impl Into<Bytes>) -> Result<(), StorageError> {
        let (store, key) = (self.store.clone(), self.key.clone());
        let payload = PutPayload::from_bytes(bytes.into());
        block_on(async move { store.put(&key, payload).await.map(|_| ()) }).map_err(|e| self.err(e))
    }

    /// Deletes the object; one that is not there is no error.
    pub fn delete(&self) -> Result<(), StorageError> {
        let (store, key) = (self.store.clone(), self.key.clone());
        match block_on(async move { store.delete(&key).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// What is directly inside this directory. A directory that does not
    /// exist is empty.
    pub fn list(&self) -> Result<Listing, StorageError> {
        if let Some(dir) = &self.local
            && !dir.is_dir()
        {
            // The local store refuses to list a missing directory.
            return Ok(Listing::default());
        }
        let (store, key) = (self.store.clone(), self.key.clone());
        let result = block_on(async move { store.list_with_delimiter(Some(&key)).await }).map_err(|e| self.err(e))?;
        let mut listing = Listing {
            dirs: result.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect(),
            files: result.objects.iter().filter_map(|o| Some((o.location.filename()?.to_string(), o.size))).collect(),
        };
        listing.dirs.sort();
        listing.files.sort();
        Ok(listing)
    }

    /// Deletes every object under this directory (and, locally, the
    /// directories left empty).
    pub fn delete_all(&self) -> Result<(), StorageError> {
        if let Some(dir) = &self.local {
            return match std::fs::remove_dir_all(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(source) => Err(StorageError::Io { location: self.shown.clone(), source }),
            };
        }
        let (store, key) = (self.store.clone(), self.key.clone());
        block_on(async move {
            let objects: Vec<_> = store.list(Some(&key)).map_ok(|m| m.location).try_collect().await?;
            for o in objects {
                match store.delete(&o).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
        .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_paths_or_urls() {
        let cases: [(&str, Result<Kind, &str>); 11] = [
            ("/tmp/ckpt", Ok(Kind::Local)),
            ("relative/dir", Ok(Kind::Local)),
            ("file:///tmp/x", Ok(Kind::Local)),
            ("s3://bucket/prefix", Ok(Kind::S3)),
            ("s3a://bucket", Ok(Kind::S3)),
            ("gs://bucket/a/b", Ok(Kind::Gcs)),
            ("az://container/a", Ok(Kind::Azure)),
            ("abfss://fs@account.dfs.core.windows.net/x", Ok(Kind::Azure)),
            ("hdfs://namenode/x", Err("unsupported scheme \"hdfs\"")),
            ("s3:///no-bucket", Err("names no bucket")),
            ("", Err("empty")),
        ];
        for (location, want) in cases {
            let got = classify(location).map(|(k, _, _)| k);
            match (got, want) {
                (Ok(k), Ok(w)) => assert_eq!(k, w, "{location}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{location}: {e}"),
                (got, want) => panic!("{location}: {got:?}, want {want:?}"),
            }
        }
        assert!(is_url("s3://b") && !is_url("/a/b") && !is_url("a=s3://b/c") && !is_url("://x"));
    }

    /// A restart may cure a store that could not be reached or failed on
    /// its side; not a refusal, a missing object, missing credentials.
    #[test]
    fn store_errors_are_transient_or_permanent() {
        let generic = |m: &str| object_store::Error::Generic { store: "S3", source: m.to_string().into() };
        let boxed = |m: &str| -> Box<dyn std::error::Error + Send + Sync> { m.to_string().into() };
        let imds = "Error performing PUT http://169.254.169.254/latest/api/token in 1ms - Server returned non-2xx status code: 403 Forbidden: denied";
        let cases: [(&str, object_store::Error, bool); 9] = [
            (
                "503 from the store",
                generic("Error performing GET http://s3/b/k in 2s - Server returned non-2xx status code: 503 Service Unavailable: slow down"),
                true,
            ),
            ("429 throttled", generic("Server returned non-2xx status code: 429 Too Many Requests: "), true),
            ("connection refused", generic("Error performing GET http://127.0.0.1:1/b in 3s - error sending request: Connection refused"), true),
            ("403 on a bucket", generic("Error performing PUT http://s3/b/k in 2ms - Server returned non-2xx status code: 403 Forbidden: AccessDenied"), false),
            ("400 bad request", generic("Server returned non-2xx status code: 400 Bad Request: "), false),
            ("instance metadata", generic(imds), false),
            ("permission denied", object_store::Error::PermissionDenied { path: "k".into(), source: boxed("no") }, false),
            ("unauthenticated", object_store::Error::Unauthenticated { path: "k".into(), source: boxed("no") }, false),
            ("not found", object_store::Error::NotFound { path: "k".into(), source: boxed("no") }, false),
        ];
        for (what, source, transient) in cases {
            let e = StorageError::of_store("s3://b/k", source);
            assert_eq!(e.is_transient(), transient, "{what}: {e}");
        }
        let e = StorageError::of_store("s3://b/k", generic(imds));
        assert!(matches!(e, StorageError::Credentials { .. }) && e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
        let io = |kind| StorageError::Io { location: "/ckpt".into(), source: std::io::Error::from(kind) };
        assert!(io(std::io::ErrorKind::TimedOut).is_transient() && io(std::io::ErrorKind::StaleNetworkFileHandle).is_transient());
        assert!(!io(std::io::ErrorKind::PermissionDenied).is_transient() && !io(std::io::ErrorKind::StorageFull).is_transient());
        assert!(!StorageError::InvalidLocation { location: "x".into(), reason: "bad".into() }.is_transient());
    }

    #[test]
    fn local_locations_read_write_list_delete() {
        let dir = tempfile::tempdir().unwrap();
        let root = Location::local(dir.path()).unwrap();
        let sub = root.child("ckpt-1");
        assert_eq!(root.list().unwrap(), Listing::default());
        assert_eq!(root.child("missing").list().unwrap(), Listing::default(), "a missing directory is empty");
        assert!(sub.child("a").read().unwrap_err().is_not_found());
        assert_eq!(sub.child("a").read_if_exists().unwrap(), None);
        sub.child("a").write(&b"hello"[..]).unwrap();
        sub.child("b").write(&b"!"[..]).unwrap();
        root.child("top").write(&b"x"[..]).unwrap();
        assert_eq!(sub.child("a").read().unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(sub.child("a").size().unwrap(), Some(5));
        assert_eq!(sub.child("c").size().unwrap(), None);
        assert_eq!(std::fs::read(dir.path().join("ckpt-1/a")).unwrap(), b"hello", "a plain file");
        let listing = root.list().unwrap();
        assert_eq!(listing.dirs, vec!["ckpt-1".to_string()]);
        assert_eq!(listing.files, vec![("top".to_string(), 1)]);
        assert_eq!(sub.list().unwrap().files.len(), 2);
        sub.child("a").delete().unwrap();
        sub.child("a").delete().unwrap();
        assert_eq!(sub.list().unwrap().files, vec![("b".to_string(), 1)]);
        sub.delete_all().unwrap();
        assert!(!dir.path().join("ckpt-1").exists());
        assert_eq!(sub.to_string(), format!("{}/ckpt-1", dir.path().display()));
        assert_eq!(sub.name(), "ckpt-1");
    }

    #[tokio::test]
    async fn blocking_operations_work_inside_async_code() {
        let dir = tempfile::tempdir().unwrap();
        let loc = Location::local(dir.path()).unwrap().child("f");
        loc.write(Bytes::from_static(b"1")).unwrap();
        assert_eq!(loc.read().unwrap(), Bytes::from_static(b"1"));
    }

    #[test]
    fn urls_keep_their_form_in_messages() {
        let loc = Location::parse("s3://bucket/run/").unwrap();
        assert_eq!(loc.to_string(), "s3://bucket/run");
        assert_eq!(loc.child("ckpt-0000000001").to_string(), "s3://bucket/run/ckpt-0000000001");
        assert_eq!(loc.store().1.as_ref(), "run");
        assert_eq!(loc.local_path(), None);
    }
}

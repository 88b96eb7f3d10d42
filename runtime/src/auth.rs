//! The job token: every gRPC call inside a job carries
//! `authorization: Bearer <TFJOB_TOKEN>`; a call without the right token is
//! refused with UNAUTHENTICATED before it reaches a service.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The environment variable that holds the job token.
pub const TOKEN_ENV: &str = "TFJOB_TOKEN";

/// How a task reaches its peers: the job token, and TLS when the job has
/// certificates.
#[derive(Clone, Default)]
pub struct Credentials {
    pub token: Option<String>,
    pub tls: Option<TaskTls>,
}

/// Where a task's TLS comes from (its flags).
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// `--tls_cert`, `--tls_key`, `--tls_ca`: the task's certificate is given (`tfjob run`).
    Files { cert: PathBuf, key: PathBuf, ca: PathBuf },
    /// `--tls_ca`, `--tls_ca_key`: the job's CA, with which the task makes its own key and
    /// certificate at start ([`crate::replica_cert`]; on a cluster).
    JobCa { ca: PathBuf, ca_key: PathBuf },
}

/// One PEM input of a task's TLS and where it came from (for messages).
#[derive(Clone, Debug)]
pub(crate) struct Pem {
    bytes: Arc<[u8]>,
    origin: String,
}

impl Pem {
    fn read(path: &Path, flag: &str) -> Result<Self, String> {
        let origin = format!("--{flag} {}", path.display());
        let bytes = std::fs::read(path).map_err(|e| format!("{origin}: {e}"))?;
        Ok(Pem { bytes: bytes.into(), origin })
    }

    fn text(&self) -> Result<&str, String> {
        std::str::from_utf8(&self.bytes).map_err(|e| format!("{}: {e}", self.origin))
    }
}

impl TlsSource {
    /// Reads the task's TLS, once at start; with the job's CA, makes the task's certificate for
    /// `host` (its own address's host, [`crate::replica_cert::replica_names`]).
    pub fn load(&self, host: &str) -> Result<TaskTls, String> {
        match self {
            TlsSource::Files { cert, key, ca } => {
                Ok(TaskTls { cert: Pem::read(cert, "tls_cert")?, key: Pem::read(key, "tls_key")?, ca: Pem::read(ca, "tls_ca")? })
            }
            TlsSource::JobCa { ca, ca_key } => {
                let (ca, ca_key) = (Pem::read(ca, "tls_ca")?, Pem::read(ca_key, "tls_ca_key")?);
                let names = crate::replica_cert::replica_names(host);
                let made = crate::replica_cert::make_replica_cert(ca.text()?, ca_key.text()?, &names)
                    .map_err(|e| format!("cannot make this task's certificate with {} and {}: {e}", ca.origin, ca_key.origin))?;
                let origin = format!("the certificate made for {host}");
                let cert = Pem { bytes: made.cert_pem.into_bytes().into(), origin: origin.clone() };
                let key = Pem { bytes: made.key_pem.into_bytes().into(), origin };
                Ok(TaskTls { cert, key, ca })
            }
        }
    }
}

/// TLS between the tasks of a job, read once at start: this task's certificate and key
/// (served, and presented as a client), and the CA that signed every task's certificate
/// (checked on both sides).
#[derive(Clone, Debug)]
pub struct TaskTls {
    cert: Pem,
    key: Pem,
    pub(crate) ca: Pem,
}

/// The ALPN protocol a tensor channel asks for under TLS; gRPC asks for
/// `h2`. The ps's port tells the two apart by it once the handshake is done
/// (without TLS, by the channel's first bytes).
pub const CHANNEL_ALPN: &[u8] = b"tfjob-tensor-channel/1";

/// ring's TLS, with AES-128-GCM preferred: the fastest of its suites on CPUs with AES
/// instructions, and the tensors of every step go through it.
fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let fastest = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    provider.cipher_suites.retain(|s| s.suite() != fastest.suite());
    provider.cipher_suites.insert(0, fastest);
    Arc::new(provider)
}

impl TaskTls {
    /// Reads the three PEM files (`--tls_cert`, `--tls_key`, `--tls_ca`).
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<Self, String> {
        TlsSource::Files { cert: cert.into(), key: key.into(), ca: ca.into() }.load("")
    }

    /// Where the CA came from (`--tls_ca <path>`), for the log.
    pub fn ca_origin(&self) -> &str {
        &self.ca.origin
    }

    fn certificates(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem.bytes).collect::<Result<_, _>>().map_err(|e| format!("{}: {e}", pem.origin))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM certificate in it", pem.origin));
        }
        Ok(certs)
    }

    fn identity(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let key = PrivateKeyDer::from_pem_slice(&self.key.bytes).map_err(|e| format!("{}: {e}", self.key.origin))?;
        Ok((Self::certificates(&self.cert)?, key))
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in Self::certificates(&self.ca)? {
            roots.add(cert).map_err(|e| format!("{}: {e}", self.ca.origin))?;
        }
        Ok(Arc::new(roots))
    }

    /// Server side of a task's port (gRPC and the tensor channel): presents
    /// this task's certificate and accepts only clients with a certificate
    /// signed by the job's CA. TLS 1.3 only (every client is a task of the
    /// job: tonic's rustls or our channel), its records sealed and opened by
    /// [`crate::tls_stream`].
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(self.roots()?, crypto()).build().map_err(|e| e.to_string())?;
        let (certs, key) = self.identity()?;
        let mut config = rustls::ServerConfig::builder_with_provider(crypto())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| format!("{}, {}: {e}", self.cert.origin, self.key.origin))?;
        config.alpn_protocols = vec![b"h2".to_vec(), CHANNEL_ALPN.to_vec()];
        // This order, whatever the client's (tonic's gRPC client has its own).
        config.ignore_client_order = true;
        config.enable_secret_extraction = true;
        // No resumption: a ticket sent after the handshake would only be dropped.
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// Client side of gRPC: trust the job's CA, present this task's
    /// certificate, and check the peer's name (`host` of its address).
    pub fn client_config(&self, host: &str) -> Result<tonic::transport::ClientTlsConfig, String> {
        let ca = tonic::transport::Certificate::from_pem(&self.ca.bytes);
        let identity = tonic::transport::Identity::from_pem(&self.cert.bytes, &self.key.bytes);
        Ok(tonic::transport::ClientTlsConfig::new().ca_certificate(ca).identity(identity).domain_name(host))
    }

    /// Client side of the tensor channel: as [`Self::client_config`], over
    /// rustls directly, asking for [`CHANNEL_ALPN`]; TLS 1.3 only, its
    /// records sealed and opened by [`crate::tls_stream`].
    pub fn channel_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let (certs, key) = self.identity()?;
        let mut config = rustls::ClientConfig::builder_with_provider(crypto())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("{}, {}: {e}", self.cert.origin, self.key.origin))?;
        config.alpn_protocols = vec![CHANNEL_ALPN.to_vec()];
        config.enable_secret_extraction = true;
        // A new connection is a full handshake (one per ps, kept open).
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }
}

/// Counts refused requests and logs them at most every few seconds, so a
/// flood of bad requests is visible in the log without flooding it (and is
/// never fatal).
#[derive(Debug)]
pub struct RefusalLog {
    what: &'static str,
    state: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
}

impl RefusalLog {
    pub const fn new(what: &'static str) -> Self {
        RefusalLog { what, state: std::sync::Mutex::new((0, None)) }
    }

    /// Notes one refusal; logs a summary when the last one is old enough.
    pub fn note(&self, detail: &str) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 += 1;
        let due = st.1.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(5));
        if due {
            tracing::warn!("refused {} {} request(s) since the last report; latest: {detail}", st.0, self.what);
            st.0 = 0;
            st.1 = Some(std::time::Instant::now());
        }
    }
}

static UNAUTHENTICATED: RefusalLog = RefusalLog::new("unauthenticated");

/// Connections whose TLS handshake failed: no certificate, one not signed by
/// the job's CA, a plaintext client.
pub static TLS_REFUSED: RefusalLog = RefusalLog::new("TLS (no certificate of this job's CA, or plaintext)");

/// Checks incoming calls. With no token configured every call passes (a
/// job started by hand without a token).
#[derive(Clone)]
pub struct TokenCheck {
    expected: Option<Vec<u8>>,
}

impl TokenCheck {
    pub fn new(token: Option<&str>) -> Self {
        TokenCheck { expected: token.filter(|t| !t.is_empty()).map(|t| format!("Bearer {t}").into_bytes()) }
    }

    pub fn check<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        let given = request.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        if self.accepts(given) { Ok(request) } else { Err(Status::unauthenticated("missing or wrong job token (authorization: Bearer $TFJOB_TOKEN)")) }
    }

    /// Checks a bare token (the tensor channel's hello carries no header).
    pub fn check_token(&self, token: &str) -> bool {
        let given = if token.is_empty() { Vec::new() } else { format!("Bearer {token}").into_bytes() };
        self.accepts(&given)
    }

    /// `given`: the whole `authorization` value.
    fn accepts(&self, given: &[u8]) -> bool {
        let Some(expected) = &self.expected else { return true };
        // Constant time in the token's content (length differences are not secret).
        let ok = given.len() == expected.len() && bool::from(given.ct_eq(expected));
        if !ok {
            UNAUTHENTICATED.note(if given.is_empty() { "no token" } else { "wrong token" });
        }
        ok
    }
}

/// Adds the job token to outgoing calls.
#[derive(Clone)]
pub struct TokenAttach {
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl TokenAttach {
    pub fn new(token: Option<&str>) -> Result<Self, Status> {
        let value = match token.filter(|t| !t.is_empty()) {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| Status::invalid_argument("TFJOB_TOKEN contains characters not allowed in a header"))?),
            None => None,
        };
        Ok(TokenAttach { value })
    }

    pub fn attach<T>(&self, mut request: Request<T>) -> Result<Request<T>, Status> {
        if let Some(v) = &self.value {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(request)
    }
}

impl tonic::service::Interceptor for TokenAttach {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.attach(request)
    }
}

/// The TLS of a task at `localhost` in a job of its own: a new CA (`NAME-ca.pem`, its key
/// `NAME-ca.key`) under `dir`, and the task's certificate made with it as on a cluster
/// ([`TlsSource::JobCa`]).
#[cfg(test)]
pub(crate) fn task_tls_for_tests(dir: &Path, name: &str) -> TaskTls {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("tfjob {name} CA"));
    let (ca, ca_key_path) = (dir.join(format!("{name}-ca.pem")), dir.join(format!("{name}-ca.key")));
    std::fs::write(&ca, ca_params.self_signed(&ca_key).unwrap().pem()).unwrap();
    std::fs::write(&ca_key_path, ca_key.serialize_pem()).unwrap();
    TlsSource::JobCa { ca, ca_key: ca_key_path }.load("localhost").unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let check = TokenCheck::new(Some("s3cret"));
        let with = |v: Option<&str>| {
            let mut r = Request::new(());
            if let Some(v) = v {
                r.metadata_mut().insert("authorization", v.parse().unwrap());
            }
            r
        };
        assert!(check.check(with(Some("Bearer s3cret"))).is_ok());
        for bad in [None, Some("Bearer s3creT"), Some("Bearer s3cret2"), Some("s3cret"), Some("")] {
            let err = check.check(with(bad)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert!(TokenCheck::new(None).check(with(None)).is_ok());
        assert!(check.check_token("s3cret"));
        for bad in ["", "s3creT", "s3cret2", "Bearer s3cret"] {
            assert!(!check.check_token(bad), "{bad:?}");
        }
        assert!(TokenCheck::new(None).check_token(""));
        let attached = TokenAttach::new(Some("s3cret")).unwrap().attach(Request::new(())).unwrap();
        assert!(check.check(attached).is_ok());
    }
}

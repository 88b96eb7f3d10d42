//! The job token: every gRPC call inside a job carries
//! `authorization: Bearer <TFJOB_TOKEN>`; a call without the right token is
//! refused with UNAUTHENTICATED before it reaches a service.

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
    pub tls: Option<TlsFiles>,
}

/// PEM files for TLS between the tasks of a job: this task's certificate
/// and key (served), and the CA that signed every task's certificate
/// (checked on both sides).
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
}

impl TlsFiles {
    fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| format!("--tls_{what} {}: {e}", path.display()))
    }

    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, String> {
        let identity = tonic::transport::Identity::from_pem(Self::read(&self.cert, "cert")?, Self::read(&self.key, "key")?);
        Ok(tonic::transport::ServerTlsConfig::new().identity(identity))
    }

    /// Client side: trust the job's CA, present this task's certificate,
    /// and check the peer's name (`host` of its address).
    pub fn client_config(&self, host: &str) -> Result<tonic::transport::ClientTlsConfig, String> {
        let ca = tonic::transport::Certificate::from_pem(Self::read(&self.ca, "ca")?);
        let identity = tonic::transport::Identity::from_pem(Self::read(&self.cert, "cert")?, Self::read(&self.key, "key")?);
        Ok(tonic::transport::ClientTlsConfig::new().ca_certificate(ca).identity(identity).domain_name(host))
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

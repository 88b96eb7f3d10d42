//! The job token: every gRPC call inside a job carries
//! `authorization: Bearer <TFJOB_TOKEN>`; a call without the right token is
//! refused with UNAUTHENTICATED before it reaches a service.

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The environment variable that holds the job token.
pub const TOKEN_ENV: &str = "TFJOB_TOKEN";

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
        let Some(expected) = &self.expected else { return Ok(request) };
        let given = request.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        // Constant time in the token's content (length differences are not secret).
        if given.len() == expected.len() && bool::from(given.ct_eq(expected)) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong job token (authorization: Bearer $TFJOB_TOKEN)"))
        }
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
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Status::invalid_argument("TFJOB_TOKEN contains characters not allowed in a header"))?,
            ),
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
        let attached = TokenAttach::new(Some("s3cret")).unwrap().attach(Request::new(())).unwrap();
        assert!(check.check(attached).is_ok());
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

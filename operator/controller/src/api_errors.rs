//! What the API server's error answers mean to a caller that expects some of them: a delete
//! answered `404 Not Found` finds the object already gone, a create answered `409 Conflict`
//! finds it already there. A leaf of this crate: the controller and the leader election use it.

/// HTTP status of an object that does not exist.
pub const NOT_FOUND: u16 = 404;
/// HTTP status of an object that exists already, or changed since it was read.
pub const CONFLICT: u16 = 409;

/// Whether the API server answered `e` with HTTP status `code`.
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The result of a call for which the answers `codes` mean that what it wanted is already the
/// case: `Ok(None)` for those, the call's own result otherwise.
pub fn tolerate<T>(result: Result<T, kube::Error>, codes: &[u16]) -> Result<Option<T>, kube::Error> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if codes.iter().any(|c| is_status(&e, *c)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("refused", "Refused").with_code(code).boxed())
    }

    #[test]
    fn tolerated_answers_are_nothing_to_do() {
        assert!(is_status(&api_error(404), NOT_FOUND) && !is_status(&api_error(409), NOT_FOUND));
        assert_eq!(tolerate(Ok::<_, kube::Error>(7), &[NOT_FOUND]).unwrap(), Some(7));
        assert_eq!(tolerate::<()>(Err(api_error(404)), &[NOT_FOUND, CONFLICT]).unwrap(), None);
        assert_eq!(tolerate::<()>(Err(api_error(409)), &[NOT_FOUND, CONFLICT]).unwrap(), None);
        assert!(tolerate::<()>(Err(api_error(409)), &[NOT_FOUND]).is_err());
        assert!(tolerate::<()>(Err(api_error(500)), &[NOT_FOUND, CONFLICT]).is_err());
    }
}

//! Validation problems and the name rules they are about: a [`FieldError`] names the field it
//! is about, [`ValidationErrors`] is every problem of a job, and [`is_dns1035_label`] /
//! [`is_dns1123_label`] are the name rules of Kubernetes that job names, namespaces and pod
//! template values must follow.
//!
//! A leaf: it imports nothing of this crate, so the job's validation ([`crate::api`]) and the
//! pod-template checks ([`crate::template`]) both build on it.

/// One validation problem, naming the field it is about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Path of the field, e.g. `spec.tfReplicaSpecs.Worker.template.spec.containers`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// A problem of `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError { field: field.into(), message: message.into() }
    }
}

/// A list of validation problems (never empty when returned as an error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_errors(.0))]
pub struct ValidationErrors(pub Vec<FieldError>);

fn join_errors(errors: &[FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// `unsupported value "x"; supported values: "a", "b"`.
pub fn unsupported(field: &str, value: &str, allowed: &[&str]) -> FieldError {
    FieldError::new(
        field,
        format!("unsupported value {value:?}; supported values: {}", allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(", ")),
    )
}

/// Maximum length of a DNS label.
pub const DNS_LABEL_MAX: usize = 63;

/// Checks a DNS-1035 label: lower-case alphanumerics and `-`, starts with a letter, ends with an
/// alphanumeric, at most 63 characters.
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Checks a DNS-1123 label (like DNS-1035, but may start with a digit).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= DNS_LABEL_MAX
        && b[0] != b'-'
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns1035_label("mnist-1"));
        assert!(!is_dns1035_label("1mnist"));
        assert!(!is_dns1035_label("mnist-"));
        assert!(!is_dns1035_label("MNIST"));
        assert!(!is_dns1035_label(""));
        assert!(is_dns1123_label("1abc"));
    }
}

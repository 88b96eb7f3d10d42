//! The operator's TLS seed: 32 random bytes in a Secret of the operator's
//! own namespace, from which every job's CA is derived
//! ([`tfjob_api::pki::JobCa::derive`]). The first operator to start creates
//! it; every later one (a restart, another replica under leader election)
//! reads the same. Reading needs `get` on this one Secret only; the
//! operator still never lists, watches or reads any other Secret.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tfjob_api::pki::{SEED_BYTES, random_seed};

use crate::api_errors::{CONFLICT, NOT_FOUND, is_status};

/// Key of the seed in its Secret.
pub const SEED_KEY: &str = "seed";

/// Why the seed could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The Secret could not be read or created (RBAC: `get` on it, `create` on Secrets in the
    /// operator's namespace).
    #[error("TLS seed Secret {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The Secret exists without a usable seed.
    #[error(
        "TLS seed Secret {namespace}/{name}: no {SEED_BYTES}-byte `{SEED_KEY}` in it; delete it and restart the operator (running jobs keep their certificates, new replicas of them would not be trusted)"
    )]
    Malformed {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// The seed in a Secret, if it has a well-formed one.
pub fn seed_of(secret: &Secret) -> Option<Vec<u8>> {
    let seed = secret.data.as_ref()?.get(SEED_KEY)?;
    (seed.0.len() == SEED_BYTES).then(|| seed.0.clone())
}

/// Reads the seed from `namespace/name`, creating the Secret with a random seed when there is
/// none (and reading the winner's when another operator created it meanwhile).
pub async fn load_or_create(client: &Client, namespace: &str, name: &str) -> Result<Vec<u8>, SeedError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let failed = |source| SeedError::Api { namespace: namespace.to_string(), name: name.to_string(), source };
    let malformed = || SeedError::Malformed { namespace: namespace.to_string(), name: name.to_string() };
    match api.get(name).await {
        Ok(s) => return seed_of(&s).ok_or_else(malformed),
        Err(e) if is_status(&e, NOT_FOUND) => {}
        Err(e) => return Err(failed(e)),
    }
    let fresh = Secret {
        metadata: ObjectMeta { name: Some(name.to_string()), namespace: Some(namespace.to_string()), ..Default::default() },
        type_: Some("Opaque".to_string()),
        data: Some([(SEED_KEY.to_string(), ByteString(random_seed().to_vec()))].into()),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &fresh).await {
        Ok(s) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), "created the TLS seed of job certificates");
            seed_of(&s).ok_or_else(malformed)
        }
        Err(e) if is_status(&e, CONFLICT) => api.get(name).await.map_err(failed).and_then(|s| seed_of(&s).ok_or_else(malformed)),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_seed_of_the_right_length_is_taken() {
        let secret = |value: Option<&[u8]>| Secret { data: value.map(|v| [(SEED_KEY.to_string(), ByteString(v.to_vec()))].into()), ..Default::default() };
        assert_eq!(seed_of(&secret(Some(&[7; SEED_BYTES]))), Some(vec![7; SEED_BYTES]));
        for bad in [None, Some(&[7u8; 5][..]), Some(&[][..])] {
            assert_eq!(seed_of(&secret(bad)), None, "{bad:?}");
        }
    }
}

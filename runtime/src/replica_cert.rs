//! A replica's own certificate, made at start: on a cluster the operator gives every pod of a
//! job the job's CA (its certificate and key, from the job's Secret) and no certificate, and each
//! replica makes its own key and a certificate for the name its peers reach it by (the host of
//! its own address in the cluster spec), signed by that CA. The key never leaves the process.
//! (`tfjob run` gives each replica a certificate instead: `--tls_cert`.)

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, PKCS_ED25519};

/// Why a replica could not make its certificate.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaCertError {
    /// The CA's key is not a PKCS#8 PEM key rcgen can sign with.
    #[error("the CA key: {0}")]
    CaKey(rcgen::Error),
    /// The CA's certificate is not a PEM certificate.
    #[error("the CA certificate: {0}")]
    CaCert(rcgen::Error),
    /// The name is neither a DNS name nor an IP address, or signing failed.
    #[error("a certificate for {name}: {source}")]
    Certificate { name: String, source: rcgen::Error },
}

/// A certificate and its private key (PKCS#8), PEM.
pub struct MadeCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The names a replica at `host` is reached by: the host itself and, for a cluster name
/// `<pod>.<job>.<ns>.svc[.<domain>]`, the shorter forms a resolver completes (`<pod>.<job>.<ns>.svc`,
/// `<pod>.<job>.<ns>`, `<pod>.<job>`), as a client on the cluster may use any of them.
pub fn replica_names(host: &str) -> Vec<String> {
    let labels: Vec<&str> = host.split('.').collect();
    let mut names = vec![host.to_string()];
    if labels.get(3) == Some(&"svc") {
        for n in [4, 3, 2] {
            let name = labels[..n].join(".");
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// A fresh Ed25519 key and a certificate for `names` (the first its common name), good for
/// serving and as a client, signed by the CA whose certificate and key are given (PEM).
pub fn make_replica_cert(ca_cert_pem: &str, ca_key_pem: &str, names: &[String]) -> Result<MadeCert, ReplicaCertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(ReplicaCertError::CaKey)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).map_err(ReplicaCertError::CaCert)?;
    let first = names.first().cloned().unwrap_or_default();
    let failed = |source| ReplicaCertError::Certificate { name: first.clone(), source };
    let mut params = CertificateParams::new(names.to_vec()).map_err(failed)?;
    params.distinguished_name.push(DnType::CommonName, first.clone());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate_for(&PKCS_ED25519).map_err(failed)?;
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    Ok(MadeCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_a_replica() {
        let cases: &[(&str, &[&str])] = &[
            (
                "mnist-worker-1.mnist.team.svc.cluster.local",
                &["mnist-worker-1.mnist.team.svc.cluster.local", "mnist-worker-1.mnist.team.svc", "mnist-worker-1.mnist.team", "mnist-worker-1.mnist"],
            ),
            ("m-ps-0.m.n.svc", &["m-ps-0.m.n.svc", "m-ps-0.m.n", "m-ps-0.m"]),
            // Kubeflow's per-replica Services, a plain host, an address: as they are.
            ("m-ps-0.n.svc.cluster.local", &["m-ps-0.n.svc.cluster.local"]),
            ("localhost", &["localhost"]),
            ("127.0.0.1", &["127.0.0.1"]),
        ];
        for (host, want) in cases {
            assert_eq!(replica_names(host), *want, "{host}");
        }
    }

    /// A certificate made with a CA's key is verified by that CA's certificate (rustls's own
    /// verifier, as the peers use it) for each of its names, and by no other CA.
    #[test]
    fn a_made_certificate_is_trusted_by_its_ca_only() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let ca_of = |name: &str| {
            let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
            let mut params = CertificateParams::default();
            params.distinguished_name.push(DnType::CommonName, format!("tfjob {name} CA"));
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
            (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
        };
        let ((ca, ca_key), (other_ca, _)) = (ca_of("j"), ca_of("k"));
        let names = replica_names("j-ps-0.j.ns.svc.cluster.local");
        let made = make_replica_cert(&ca, &ca_key, &names).unwrap();
        assert!(made.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifies = |root: &str, name: &str| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(root.as_bytes()).unwrap()).unwrap();
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider.clone()).build().unwrap();
            let cert = CertificateDer::from_pem_slice(made.cert_pem.as_bytes()).unwrap();
            let name = ServerName::try_from(name.to_string()).unwrap();
            verifier.verify_server_cert(&cert, &[], &name, &[], UnixTime::now()).is_ok()
        };
        for name in &names {
            assert!(verifies(&ca, name), "{name}");
        }
        assert!(!verifies(&ca, "j-ps-1.j.ns.svc"), "another replica's name");
        assert!(!verifies(&other_ca, &names[0]), "another job's CA");
        assert!(matches!(make_replica_cert(&ca, "not a key", &names), Err(ReplicaCertError::CaKey(_))));
        assert!(matches!(make_replica_cert("not a certificate", &ca_key, &names), Err(ReplicaCertError::CaCert(_))));
    }
}

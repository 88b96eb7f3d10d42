//! Certificates for TLS between the replicas of a job: a CA per job, and one
//! certificate per replica for its names (served and presented as a client:
//! both sides verify).
//!
//! On a cluster the job's CA (certificate and key) is in the job's Secret
//! with its token, and each replica makes its own key and certificate at
//! start, signed by that CA (the runtime's `replica_cert`): a replica's key
//! never leaves its pod, a scaled-up replica needs nothing from the operator,
//! and a job costs the API server one Secret, not one per replica. Every
//! replica already holds the job's token, so the CA key gives a replica no
//! power over its job it did not have; it is worth nothing outside the job.
//! The CA key is derived from the operator's seed and the job's uid
//! ([`JobCa::derive`]): a Secret deleted by hand is made again with the same
//! CA, so running replicas keep trusting the new ones. `tfjob run`, which
//! lives as long as the job, uses a random CA ([`JobCa::generate`]) and
//! issues each replica's certificate itself ([`JobCa::issue`]).
//!
//! Ed25519 throughout: the key is 32 bytes (a seed is a key), and signing and
//! verifying are cheap. The CA certificate is deterministic too (rcgen's
//! default validity and a serial from the key), so every copy of it is the
//! same bytes.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ED25519};

/// Key of the CA certificate in a job's Secret (and file name under `tfjob run`).
pub const CA_CERT_KEY: &str = "ca.crt";
/// Key of the CA's private key in a job's Secret.
pub const CA_KEY_KEY: &str = "ca.key";
/// Key of the replica's certificate (Kubernetes' `kubernetes.io/tls` naming).
pub const TLS_CERT_KEY: &str = "tls.crt";
/// Key of the replica's private key.
pub const TLS_KEY_KEY: &str = "tls.key";

/// Bytes of an operator seed (and of an Ed25519 key).
pub const SEED_BYTES: usize = 32;

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused (a name that is neither a DNS name nor an IP address, ...).
    #[error("certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// No name to issue for.
    #[error("a certificate needs at least one name")]
    NoNames,
}

/// A job's certificate authority.
pub struct JobCa {
    params: CertificateParams,
    key: KeyPair,
}

/// A job's CA as its Secret holds it: the certificate and the private key (PKCS#8), PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaPem {
    /// The self-signed CA certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// A replica's certificate and key, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCert {
    /// The certificate, signed by the job's CA.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// The PKCS#8 (v1) encoding of the Ed25519 key with this seed: a fixed
/// header (RFC 8410) and the 32 bytes.
fn ed25519_pkcs8(seed: &[u8; SEED_BYTES]) -> Vec<u8> {
    const HEADER: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let mut der = HEADER.to_vec();
    der.extend_from_slice(seed);
    der
}

/// HMAC-SHA256 of `message` under `key`.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, message);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

impl JobCa {
    /// A CA with a fresh random key.
    pub fn generate(job: &str) -> Result<Self, PkiError> {
        Ok(Self::with_key(job, KeyPair::generate_for(&PKCS_ED25519)?))
    }

    /// The CA of the job with this uid under an operator `seed`: the same
    /// seed and uid give the same CA, every time and in every process.
    pub fn derive(seed: &[u8], job_uid: &str, job: &str) -> Result<Self, PkiError> {
        let key_seed = hmac_sha256(seed, format!("tfjob-rs job CA\0{job_uid}").as_bytes());
        let der = rustls_pki_types::PrivatePkcs8KeyDer::from(ed25519_pkcs8(&key_seed));
        Ok(Self::with_key(job, KeyPair::from_pkcs8_der_and_sign_algo(&der, &PKCS_ED25519)?))
    }

    fn with_key(job: &str, key: KeyPair) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, format!("tfjob {job} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        JobCa { params, key }
    }

    /// The CA's certificate (PEM), which every replica trusts.
    pub fn cert_pem(&self) -> Result<String, PkiError> {
        Ok(self.params.self_signed(&self.key)?.pem())
    }

    /// The CA's certificate and private key (PEM), for the job's Secret.
    pub fn pem(&self) -> Result<CaPem, PkiError> {
        Ok(CaPem { cert_pem: self.cert_pem()?, key_pem: self.key.serialize_pem() })
    }

    /// A certificate for a replica known by `names` (DNS names or IP
    /// addresses; the first is its common name), good for serving and as
    /// a client, with a fresh key.
    pub fn issue(&self, names: &[String]) -> Result<IssuedCert, PkiError> {
        let first = names.first().ok_or(PkiError::NoNames)?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, first.clone());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate_for(&PKCS_ED25519)?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(IssuedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// A random operator seed.
pub fn random_seed() -> [u8; SEED_BYTES] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 1 and 6 (a key longer than the block).
        let cases: [(&[u8], &[u8], &str); 2] = [
            (&[0x0b; 20], b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First", "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
        ];
        for (key, message, want) in cases {
            let got: String = hmac_sha256(key, message).iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_derived_ca_is_the_same_for_a_seed_and_uid_and_differs_otherwise() {
        // The certificate and the key: a Secret made again holds the same CA.
        let pem = |seed: &[u8], uid: &str| JobCa::derive(seed, uid, "mnist").unwrap().pem().unwrap();
        type Case<'a> = (&'a [u8], &'a str, &'a [u8], &'a str, bool);
        let cases: &[Case] =
            &[(b"seed-a", "uid-1", b"seed-a", "uid-1", true), (b"seed-a", "uid-1", b"seed-a", "uid-2", false), (b"seed-a", "uid-1", b"seed-b", "uid-1", false)];
        for (s1, u1, s2, u2, same) in cases {
            assert_eq!(pem(s1, u1) == pem(s2, u2), *same, "{u1} {u2}");
        }
        assert_ne!(JobCa::generate("j").unwrap().cert_pem().unwrap(), JobCa::generate("j").unwrap().cert_pem().unwrap());
        let ca = pem(b"seed-a", "uid-1");
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----") && ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    }

    #[test]
    fn issued_certificates_carry_their_names_and_a_key() {
        let ca = JobCa::generate("mnist").unwrap();
        let names = vec!["mnist-worker-0.mnist.default.svc".to_string(), "127.0.0.1".to_string()];
        let issued = ca.issue(&names).unwrap();
        assert!(issued.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_ne!(ca.issue(&names).unwrap().key_pem, issued.key_pem, "every certificate has its own key");
        assert!(matches!(ca.issue(&[]), Err(PkiError::NoNames)));
    }
}

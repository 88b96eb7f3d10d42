//! The TLS 1.3 record layer (RFC 8446 section 5), done here in user space
//! after rustls has made the handshake, as the kernel's TLS does after a
//! user-space handshake (rustls's `kernel` API hands over exactly what that
//! needs: the traffic keys, their sequence numbers, and key updates).
//!
//! Why not rustls's own record layer: it copies every record's plaintext
//! into a fresh `Vec` when it opens it (rustls 0.23, buffered and unbuffered
//! API alike), and its buffered reader copies the ciphertext into its own
//! buffer first; the caller then copies the plaintext out again. A tensor
//! channel moves about a gigabyte a second through a ps, and those copies and
//! allocations were a quarter of what TLS cost the MLP (BENCHMARKS.md). Here
//! a record is opened in place where the socket's bytes landed and sealed in
//! place where its plaintext was copied to: one copy each way, and AES-GCM.
//!
//! After the copies, the cipher is what TLS costs, and the fastest AES-GCM
//! depends on the CPU, so each key takes the library fastest here
//! ([`Cipher::fastest`]; both speak the same AES-GCM, so a record sealed by
//! one opens with the other, and peers on different CPUs interoperate).
//! Measured through [`seal_all`] and [`open`] (`cargo bench -p tfjob-runtime
//! --bench hot_path -- tls_records`: 1 MiB as 64 records, AES-128-GCM, GiB/s;
//! BENCHMARKS.md, "TLS inside a job"):
//!
//! | CPU | seal: ring / aws-lc | open and copy out: ring / aws-lc |
//! |---|---|---|
//! | Xeon with AVX-512 and VAES (2026-12-06) | - / 7.5 | - / 8.1 |
//! | EPYC with AVX2 and VAES, no AVX-512 (2026-12-06, later) | 5.7 / 3.2 | 6.2 / 3.5 |
//!
//! aws-lc has AES-GCM code for AVX-512 with vector AES (on that Xeon, sealing
//! 16 KiB records in a loop: aws-lc 11.0 GB/s, ring 7.4), none for vector AES
//! on AVX2, where ring's is nearly twice as fast. rustls's handshake keeps
//! ring, its only provider.
//!
//! Plain functions over byte buffers; `tls_stream` wires them to a
//! socket. The records are TLS 1.3's to the byte: a peer with rustls's own
//! record layer reads what these functions write (tested below).

use std::ops::Range;

use rustls::ConnectionTrafficSecrets;

/// A record's header: content type, legacy version 0x0303, length.
pub const HEADER_LEN: usize = 5;
/// AES-GCM's and ChaCha20-Poly1305's tag.
pub const TAG_LEN: usize = 16;
/// Most plaintext one record carries (2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Most ciphertext a peer may put in one record (2^14 + 256).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// The longest record, header included.
pub const MAX_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT;
/// A whole record of [`MAX_PLAINTEXT`] as sealed here: header, plaintext,
/// its content type, tag.
pub const FULL_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 1 + TAG_LEN;

/// TLS 1.3 records carry `application_data` (23) as their outer type; the
/// real one is the last non-zero byte of the plaintext.
pub const APPLICATION_DATA: u8 = 23;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;

/// How many records one key seals before a key update. AES-GCM's limit in
/// TLS 1.3 is 2^24.5 records of full size (RFC 8446 5.5; rustls stops at
/// 2^24); updating at 2^23 keeps far from it.
pub const RECORDS_PER_KEY: u64 = 1 << 23;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("TLS record of type {0} where TLS 1.3 sends only application_data")]
    OuterType(u8),
    #[error("the peer sent TLS alert {0:?}")]
    PlainAlert(rustls::AlertDescription),
    #[error("TLS record of {0} bytes, more than the {MAX_CIPHERTEXT} allowed")]
    TooLong(usize),
    #[error("TLS record too short to hold its tag ({0} bytes)")]
    TooShort(usize),
    #[error("TLS record does not decrypt (wrong key, or altered on the way)")]
    Decrypt,
    #[error("TLS record with no content type (all zero)")]
    NoContentType,
    #[error("TLS cipher suite {0} has no record layer here")]
    Suite(String),
    #[error("TLS sequence numbers of one key used up")]
    SequenceExhausted,
    #[error("TLS record could not be sealed (more than the cipher takes at once)")]
    Seal,
}

/// AES-GCM's and ChaCha20-Poly1305's nonce.
pub const NONCE_LEN: usize = 12;

/// The TLS 1.3 cipher suites' AEADs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

/// The library whose AEAD a key runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cipher {
    Ring,
    AwsLc,
}

impl Cipher {
    /// The faster library on this CPU (the table in the module's
    /// documentation): aws-lc where the CPU has the AVX-512 and vector AES its
    /// fastest code needs; elsewhere on x86-64 ring (its vector AES code for
    /// AVX2, or AES-NI as aws-lc would use); aws-lc on other architectures,
    /// where both use the CPU's AES instructions (not measured here).
    pub fn fastest() -> Cipher {
        if cfg!(target_arch = "x86_64") && !has_avx512_aes() { Cipher::Ring } else { Cipher::AwsLc }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512_aes() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("vaes") && std::arch::is_x86_feature_detected!("vpclmulqdq")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512_aes() -> bool {
    false
}

/// A key of either library (their APIs are the same; their types are not).
/// ring's holds its expanded key schedules inline (over 500 bytes): boxed.
enum AeadKey {
    Ring(Box<ring::aead::LessSafeKey>),
    AwsLc(aws_lc_rs::aead::LessSafeKey),
}

impl AeadKey {
    fn new(suite: Suite, cipher: Cipher, key: &[u8]) -> Result<AeadKey, RecordError> {
        use {aws_lc_rs::aead as aws, ring::aead as rg};
        fn bad<E>(_: E) -> RecordError {
            RecordError::Suite("(bad key length)".into())
        }
        Ok(match cipher {
            Cipher::Ring => {
                let algorithm = match suite {
                    Suite::Aes128Gcm => &rg::AES_128_GCM,
                    Suite::Aes256Gcm => &rg::AES_256_GCM,
                    Suite::Chacha20Poly1305 => &rg::CHACHA20_POLY1305,
                };
                AeadKey::Ring(Box::new(rg::LessSafeKey::new(rg::UnboundKey::new(algorithm, key).map_err(bad)?)))
            }
            Cipher::AwsLc => {
                let algorithm = match suite {
                    Suite::Aes128Gcm => &aws::AES_128_GCM,
                    Suite::Aes256Gcm => &aws::AES_256_GCM,
                    Suite::Chacha20Poly1305 => &aws::CHACHA20_POLY1305,
                };
                AeadKey::AwsLc(aws::LessSafeKey::new(aws::UnboundKey::new(algorithm, key).map_err(bad)?))
            }
        })
    }

    /// Encrypts `body` in place; its tag.
    fn seal(&self, nonce: [u8; NONCE_LEN], aad: [u8; HEADER_LEN], body: &mut [u8]) -> Result<[u8; TAG_LEN], RecordError> {
        let mut tag = [0u8; TAG_LEN];
        match self {
            AeadKey::Ring(k) => {
                let t = k.seal_in_place_separate_tag(ring::aead::Nonce::assume_unique_for_key(nonce), ring::aead::Aad::from(aad), body);
                tag.copy_from_slice(t.map_err(|_| RecordError::Seal)?.as_ref());
            }
            AeadKey::AwsLc(k) => {
                let t = k.seal_in_place_separate_tag(aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce), aws_lc_rs::aead::Aad::from(aad), body);
                tag.copy_from_slice(t.map_err(|_| RecordError::Seal)?.as_ref());
            }
        }
        Ok(tag)
    }

    /// Decrypts `body` (ciphertext and tag) in place; the plaintext's length.
    fn open(&self, nonce: [u8; NONCE_LEN], aad: [u8; HEADER_LEN], body: &mut [u8]) -> Result<usize, RecordError> {
        let opened = match self {
            AeadKey::Ring(k) => k.open_in_place(ring::aead::Nonce::assume_unique_for_key(nonce), ring::aead::Aad::from(aad), body).ok().map(|p| p.len()),
            AeadKey::AwsLc(k) => {
                k.open_in_place(aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce), aws_lc_rs::aead::Aad::from(aad), body).ok().map(|p| p.len())
            }
        };
        opened.ok_or(RecordError::Decrypt)
    }
}

/// One direction's traffic key: the AEAD key, its IV and the sequence number
/// of the next record.
pub struct RecordKey {
    key: AeadKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl RecordKey {
    /// The key of one direction as rustls hands it over, with the sequence
    /// number of that direction's next record, in the library fastest here.
    pub fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<Self, RecordError> {
        let (suite, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Suite::Aes128Gcm, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Suite::Aes256Gcm, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (Suite::Chacha20Poly1305, key, iv),
            _ => return Err(RecordError::Suite("other than AES-GCM or ChaCha20-Poly1305".into())),
        };
        let iv: [u8; NONCE_LEN] = iv.as_ref().try_into().map_err(|_| RecordError::Suite("(bad IV length)".into()))?;
        Self::from_raw(suite, Cipher::fastest(), key.as_ref(), iv, seq)
    }

    /// A key from its bytes in the library `cipher` (benchmarks and tests;
    /// the runtime takes rustls's, [`Self::new`]).
    pub fn from_raw(suite: Suite, cipher: Cipher, key: &[u8], iv: [u8; NONCE_LEN], seq: u64) -> Result<Self, RecordError> {
        Ok(RecordKey { key: AeadKey::new(suite, cipher, key)?, iv, seq })
    }

    /// Records this key has sealed or opened.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The next record's nonce: the IV with the sequence number XORed into
    /// its last eight bytes (RFC 8446 5.3); the number moves on.
    fn next_nonce(&mut self) -> Result<[u8; NONCE_LEN], RecordError> {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self.seq.checked_add(1).ok_or(RecordError::SequenceExhausted)?;
        Ok(nonce)
    }
}

fn header(ciphertext_len: usize) -> [u8; HEADER_LEN] {
    let [hi, lo] = (ciphertext_len as u16).to_be_bytes();
    [APPLICATION_DATA, 3, 3, hi, lo]
}

/// Appends `plaintext` (at most [`MAX_PLAINTEXT`] bytes) sealed as one record
/// of `content_type` to `out`: the one copy of the bytes, then the cipher
/// over them where they are.
pub fn seal(key: &mut RecordKey, content_type: u8, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
    debug_assert!(plaintext.len() <= MAX_PLAINTEXT);
    let ciphertext_len = plaintext.len() + 1 + TAG_LEN;
    let head = header(ciphertext_len);
    let start = out.len();
    out.reserve(HEADER_LEN + ciphertext_len);
    out.extend_from_slice(&head);
    out.extend_from_slice(plaintext);
    out.push(content_type);
    let nonce = key.next_nonce()?;
    let body = &mut out[start + HEADER_LEN..];
    let tag = key.key.seal(nonce, head, body)?;
    out.extend_from_slice(&tag);
    Ok(())
}

/// Seals `plaintext` of any length as records of up to [`MAX_PLAINTEXT`].
pub fn seal_all(key: &mut RecordKey, content_type: u8, plaintext: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
    for chunk in plaintext.chunks(MAX_PLAINTEXT) {
        seal(key, content_type, chunk, out)?;
    }
    Ok(())
}

/// The length of the record at the start of `buf`, header included, once
/// all of it is there; `None` while it is not.
pub fn whole_record(buf: &[u8]) -> Result<Option<usize>, RecordError> {
    let Some(head) = buf.get(..HEADER_LEN) else { return Ok(None) };
    // An alert a peer sends before it has keys comes unencrypted.
    if let [ALERT, 3, _, 0, 2, _, description, ..] = buf {
        return Err(RecordError::PlainAlert(rustls::AlertDescription::from(*description)));
    }
    if head[0] != APPLICATION_DATA {
        return Err(RecordError::OuterType(head[0]));
    }
    let len = u16::from_be_bytes([head[3], head[4]]) as usize;
    if len > MAX_CIPHERTEXT {
        return Err(RecordError::TooLong(len));
    }
    Ok((buf.len() >= HEADER_LEN + len).then_some(HEADER_LEN + len))
}

/// Opens the whole record `record` (as [`whole_record`] measured it) in
/// place: its real content type, and where in `record` its plaintext is.
pub fn open(key: &mut RecordKey, record: &mut [u8]) -> Result<(u8, Range<usize>), RecordError> {
    let (head, body) = record.split_at_mut(HEADER_LEN);
    if body.len() < TAG_LEN + 1 {
        return Err(RecordError::TooShort(body.len()));
    }
    let nonce = key.next_nonce()?;
    let aad: [u8; HEADER_LEN] = (&*head).try_into().expect("split at HEADER_LEN");
    let opened = key.key.open(nonce, aad, body)?;
    let plaintext = &body[..opened];
    // The real type is the last non-zero byte; zeros after it are padding.
    let end = plaintext.iter().rposition(|&b| b != 0).ok_or(RecordError::NoContentType)?;
    Ok((plaintext[end], HEADER_LEN..HEADER_LEN + end))
}

/// A handshake message after the handshake: what the record layer does
/// with it.
#[derive(Debug, PartialEq, Eq)]
pub enum PostHandshake<'a> {
    /// The peer's key changed: open its next records with the next key,
    /// and, when it asks, send a key update of our own.
    KeyUpdate { update_requested: bool },
    /// A session ticket (its body): a client may keep it, or not.
    NewSessionTicket(&'a [u8]),
}

const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// The handshake messages of one record's plaintext (type, 24-bit length,
/// body each). Anything but a session ticket or a key update is refused.
pub fn post_handshake_messages(mut plaintext: &[u8]) -> Result<Vec<PostHandshake<'_>>, String> {
    let mut messages = Vec::new();
    while !plaintext.is_empty() {
        let [kind, a, b, c, rest @ ..] = plaintext else {
            return Err("a truncated handshake message".into());
        };
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        if rest.len() < len {
            return Err("a handshake message split across records".into());
        }
        let (body, after) = rest.split_at(len);
        messages.push(match (*kind, body) {
            (KEY_UPDATE, [0]) => PostHandshake::KeyUpdate { update_requested: false },
            (KEY_UPDATE, [1]) => PostHandshake::KeyUpdate { update_requested: true },
            (NEW_SESSION_TICKET, _) => PostHandshake::NewSessionTicket(body),
            (kind, _) => return Err(format!("handshake message of type {kind} after the handshake")),
        });
        plaintext = after;
    }
    Ok(messages)
}

/// A key update message (sent in a [`HANDSHAKE`] record).
pub fn key_update(update_requested: bool) -> [u8; 5] {
    [KEY_UPDATE, 0, 0, 1, update_requested as u8]
}

/// The close_notify alert (sent in an [`ALERT`] record).
pub const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// What an alert record means: `Ok` for close_notify (the peer sends no
/// more), `Err` with a description otherwise.
pub fn alert(plaintext: &[u8]) -> Result<(), String> {
    match plaintext {
        [_, 0] => Ok(()),
        [_, description] => Err(format!("the peer sent TLS alert {:?}", rustls::AlertDescription::from(*description))),
        _ => Err("a malformed TLS alert".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn secrets(byte: u8) -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([byte; 32]), iv: Iv::from([byte ^ 0x5a; 12]) }
    }

    fn pair(seq: u64) -> (RecordKey, RecordKey) {
        (RecordKey::new(seq, &secrets(7)).unwrap(), RecordKey::new(seq, &secrets(7)).unwrap())
    }

    #[test]
    fn what_one_library_seals_the_other_opens() {
        // Each task takes the library fastest on its CPU, so a peer's records may come from
        // either: every suite, every pairing of sealer and opener.
        let ciphers = [Cipher::Ring, Cipher::AwsLc];
        for (suite, key_len) in [(Suite::Aes128Gcm, 16), (Suite::Aes256Gcm, 32), (Suite::Chacha20Poly1305, 32)] {
            for (sealer, opener) in ciphers.iter().flat_map(|s| ciphers.iter().map(move |o| (*s, *o))) {
                let key = |cipher| RecordKey::from_raw(suite, cipher, &vec![3; key_len], [5; NONCE_LEN], 41).unwrap();
                let (mut tx, mut rx) = (key(sealer), key(opener));
                let text: Vec<u8> = (0..MAX_PLAINTEXT + 100).map(|i| i as u8).collect();
                let mut wire = Vec::new();
                seal_all(&mut tx, APPLICATION_DATA, &text, &mut wire).unwrap();
                let (mut at, mut opened) = (0, Vec::new());
                while at < wire.len() {
                    let len = whole_record(&wire[at..]).unwrap().unwrap();
                    let (kind, range) = open(&mut rx, &mut wire[at..at + len]).unwrap();
                    assert_eq!(kind, APPLICATION_DATA);
                    opened.extend_from_slice(&wire[at..][range]);
                    at += len;
                }
                assert_eq!(opened, text, "{suite:?} sealed by {sealer:?}, opened by {opener:?}");
            }
        }
    }

    #[test]
    fn sealed_records_open_to_what_was_sealed_in_order() {
        let (mut tx, mut rx) = pair(3);
        let cases: [(u8, &[u8]); 4] = [(APPLICATION_DATA, b"hello"), (APPLICATION_DATA, &[0u8; 0]), (ALERT, &CLOSE_NOTIFY), (HANDSHAKE, &[0u8; 40])];
        let mut wire = Vec::new();
        for (kind, text) in cases {
            seal(&mut tx, kind, text, &mut wire).unwrap();
        }
        let mut at = 0;
        for (kind, text) in cases {
            let len = whole_record(&wire[at..]).unwrap().unwrap();
            let (got_kind, range) = open(&mut rx, &mut wire[at..at + len]).unwrap();
            assert_eq!((got_kind, &wire[at..][range]), (kind, text));
            at += len;
        }
        assert_eq!(at, wire.len());
        assert_eq!((tx.seq(), rx.seq()), (7, 7));
    }

    #[test]
    fn a_record_opened_with_another_sequence_number_or_altered_does_not_decrypt() {
        let (mut tx, _) = pair(0);
        let mut wire = Vec::new();
        seal(&mut tx, APPLICATION_DATA, b"tensor bytes", &mut wire).unwrap();
        let mut ahead = RecordKey::new(1, &secrets(7)).unwrap();
        assert_eq!(open(&mut ahead, &mut wire.clone()), Err(RecordError::Decrypt));
        for flip in [0usize, 3, HEADER_LEN, wire.len() - 1] {
            let mut altered = wire.clone();
            altered[flip] ^= if flip == 0 { 0 } else { 1 };
            if flip == 0 {
                continue; // the outer type is checked by whole_record
            }
            let mut rx = RecordKey::new(0, &secrets(7)).unwrap();
            assert_eq!(open(&mut rx, &mut altered), Err(RecordError::Decrypt), "byte {flip} flipped");
        }
        let mut wrong_key = RecordKey::new(0, &secrets(8)).unwrap();
        assert_eq!(open(&mut wrong_key, &mut wire), Err(RecordError::Decrypt));
    }

    #[test]
    fn whole_record_waits_for_the_whole_record_and_refuses_what_tls_13_never_sends() {
        let (mut tx, _) = pair(0);
        let mut wire = Vec::new();
        seal(&mut tx, APPLICATION_DATA, &[9u8; 100], &mut wire).unwrap();
        let len = HEADER_LEN + 100 + 1 + TAG_LEN;
        assert_eq!(wire.len(), len);
        for cut in [0, 1, HEADER_LEN, len - 1] {
            assert_eq!(whole_record(&wire[..cut]), Ok(None), "{cut} bytes");
        }
        assert_eq!(whole_record(&wire), Ok(Some(len)));
        assert_eq!(whole_record(&[22, 3, 3, 0, 5]), Err(RecordError::OuterType(22)));
        assert_eq!(whole_record(&[ALERT, 3, 3, 0, 2, 2, 42]), Err(RecordError::PlainAlert(rustls::AlertDescription::BadCertificate)));
        assert_eq!(whole_record(&[23, 3, 3, 0x41, 1]), Err(RecordError::TooLong(0x4101)));
        assert_eq!(open(&mut tx, &mut [23, 3, 3, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(RecordError::TooShort(16)));
    }

    #[test]
    fn seal_all_cuts_at_the_largest_record_tls_allows() {
        let (mut tx, mut rx) = pair(0);
        let text: Vec<u8> = (0..(2 * MAX_PLAINTEXT + 10)).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        seal_all(&mut tx, APPLICATION_DATA, &text, &mut wire).unwrap();
        assert_eq!(wire.len(), 2 * FULL_RECORD + HEADER_LEN + 10 + 1 + TAG_LEN);
        let (mut at, mut got) = (0, Vec::new());
        while at < wire.len() {
            let len = whole_record(&wire[at..]).unwrap().unwrap();
            let (_, range) = open(&mut rx, &mut wire[at..at + len]).unwrap();
            got.extend_from_slice(&wire[at..][range]);
            at += len;
        }
        assert_eq!(got, text);
    }

    #[test]
    fn padding_after_the_content_type_is_dropped() {
        // A peer may pad; seal a plaintext whose last bytes are the type and zeros.
        let (mut tx, mut rx) = pair(0);
        let mut wire = Vec::new();
        seal(&mut tx, 0, &[b'a', b'b', APPLICATION_DATA, 0, 0], &mut wire).unwrap();
        let (kind, range) = open(&mut rx, &mut wire).unwrap();
        assert_eq!((kind, &wire[range]), (APPLICATION_DATA, &b"ab"[..]));
        let mut all_zero = Vec::new();
        let (mut tx, mut rx) = pair(0);
        seal(&mut tx, 0, &[0, 0], &mut all_zero).unwrap();
        assert_eq!(open(&mut rx, &mut all_zero), Err(RecordError::NoContentType));
    }

    #[test]
    fn post_handshake_messages_are_key_updates_and_tickets_only() {
        let mut two = key_update(true).to_vec();
        two.extend_from_slice(&[NEW_SESSION_TICKET, 0, 0, 2, 7, 8]);
        type Case<'a> = (&'a [u8], Result<Vec<PostHandshake<'a>>, &'a str>);
        let table: [Case; 6] = [
            (&key_update(false), Ok(vec![PostHandshake::KeyUpdate { update_requested: false }])),
            (&two, Ok(vec![PostHandshake::KeyUpdate { update_requested: true }, PostHandshake::NewSessionTicket(&[7, 8])])),
            (&[KEY_UPDATE, 0, 0, 1, 2], Err("handshake message of type 24 after the handshake")),
            (&[20, 0, 0, 0], Err("handshake message of type 20 after the handshake")),
            (&[KEY_UPDATE, 0, 0], Err("a truncated handshake message")),
            (&[NEW_SESSION_TICKET, 0, 0, 9, 1], Err("a handshake message split across records")),
        ];
        for (plaintext, want) in table {
            assert_eq!(post_handshake_messages(plaintext), want.map_err(str::to_string), "{plaintext:?}");
        }
    }

    #[test]
    fn alerts_other_than_close_notify_are_errors() {
        assert_eq!(alert(&CLOSE_NOTIFY), Ok(()));
        assert_eq!(alert(&[2, 48]), Err("the peer sent TLS alert UnknownCA".into()));
        assert_eq!(alert(&[1]), Err("a malformed TLS alert".into()));
    }

    #[test]
    fn the_nonce_is_the_iv_xor_the_sequence_number() {
        // RFC 8446 5.3, checked by opening the record with the AEAD directly.
        let mut key = RecordKey::new(0x0102, &secrets(7)).unwrap();
        let mut wire = Vec::new();
        seal(&mut key, APPLICATION_DATA, b"x", &mut wire).unwrap();
        let mut nonce = [7u8 ^ 0x5a; 12];
        nonce[10] ^= 1;
        nonce[11] ^= 2;
        use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
        let raw = LessSafeKey::new(UnboundKey::new(&aead::AES_256_GCM, &[7u8; 32]).unwrap());
        let mut body = wire[HEADER_LEN..].to_vec();
        let aad: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().unwrap();
        let plain = raw.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body).unwrap();
        assert_eq!(plain, &[b'x', APPLICATION_DATA]);
    }
}

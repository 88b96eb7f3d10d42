//! A TLS 1.3 connection: rustls makes the handshake (its unbuffered API:
//! certificates checked both ways, ALPN, the key schedule), then hands the
//! traffic keys over (its `kernel` API, made for the kernel's TLS), and
//! [`crate::tls_records`] seals and opens the records in this stream's own
//! buffers. Key updates either way go through rustls's key schedule.
//!
//! Reads: the socket fills a buffer, each whole record is opened where it
//! is, and its plaintext is copied to the reader. Writes: the bytes are
//! copied into records and sealed in place; the records go out when they
//! fill [`WRITE_BYTES`] or at a flush.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::tls_records::{self as records, PostHandshake, RecordError, RecordKey};

/// How much of the socket one read takes at most (records are opened in
/// place in this buffer, so it holds at least one whole record).
pub const READ_BYTES: usize = 256 << 10;
/// The read buffer a connection starts with (the handshake's too); it grows
/// towards [`READ_BYTES`] while reads fill it: a gRPC connection that moves
/// little keeps 64 KiB, not 256.
pub const FIRST_READ_BYTES: usize = 64 << 10;
/// Sealed bytes a write leaves for later before it sends them.
pub const WRITE_BYTES: usize = 64 << 10;

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl From<RecordError> for io::Error {
    fn from(e: RecordError) -> Self {
        invalid(e)
    }
}

/// rustls's key schedule after the handshake, for key updates.
enum KeySchedule {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl KeySchedule {
    fn next_tx(&mut self) -> Result<RecordKey, io::Error> {
        let (seq, secrets) = match self {
            KeySchedule::Client(k) => k.update_tx_secret(),
            KeySchedule::Server(k) => k.update_tx_secret(),
        }
        .map_err(invalid)?;
        Ok(RecordKey::new(seq, &secrets)?)
    }

    fn next_rx(&mut self) -> Result<RecordKey, io::Error> {
        let (seq, secrets) = match self {
            KeySchedule::Client(k) => k.update_rx_secret(),
            KeySchedule::Server(k) => k.update_rx_secret(),
        }
        .map_err(invalid)?;
        Ok(RecordKey::new(seq, &secrets)?)
    }
}

/// A TLS 1.3 connection over `S` (a TCP stream in the runtime).
pub struct TlsStream<S> {
    io: S,
    keys: KeySchedule,
    alpn: Option<Vec<u8>>,
    tx: RecordKey,
    rx: RecordKey,
    /// Bytes read from `io`: `..opened` are records already opened,
    /// `opened..filled` are not yet (the last possibly not whole).
    incoming: Vec<u8>,
    filled: usize,
    opened: usize,
    /// Plaintext of the last opened record not yet read (inside `incoming`).
    plaintext: Range<usize>,
    /// Application data that came with the handshake, read first.
    early: Vec<u8>,
    early_read: usize,
    /// Sealed records, `sent..` of them not yet written to `io`.
    outgoing: Vec<u8>,
    sent: usize,
    /// The peer sent close_notify, or closed the connection.
    read_closed: bool,
    /// The peer asked for a key update; ours goes before our next record.
    key_update_owed: bool,
    /// Records one key seals before we move to the next
    /// ([`records::RECORDS_PER_KEY`]; fewer in tests).
    records_per_key: u64,
    close_notify_sealed: bool,
}

impl<S> TlsStream<S> {
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// The ALPN protocol the handshake settled on.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }
}

/// What one step of a handshake asks for next.
enum Next {
    Again,
    Transmit,
    Read,
    Done,
}

/// The two sides of rustls's unbuffered API, which share no trait.
trait Handshake: Sized {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn alpn(&self) -> Option<Vec<u8>>;
    fn into_keys(self) -> Result<(ExtractedSecrets, KeySchedule, Option<ProtocolVersion>), rustls::Error>;
}

/// The same five lines for each side (rustls gives them no common trait).
macro_rules! handshake_side {
    ($connection:ty, $data:ty, $schedule:path) => {
        impl Handshake for $connection {
            type Data = $data;
            fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, $data> {
                self.process_tls_records(incoming)
            }
            fn alpn(&self) -> Option<Vec<u8>> {
                self.alpn_protocol().map(<[u8]>::to_vec)
            }
            fn into_keys(self) -> Result<(ExtractedSecrets, KeySchedule, Option<ProtocolVersion>), rustls::Error> {
                let version = self.protocol_version();
                let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
                Ok((secrets, $schedule(kernel), version))
            }
        }
    };
}

handshake_side!(UnbufferedClientConnection, ClientConnectionData, KeySchedule::Client);
handshake_side!(UnbufferedServerConnection, ServerConnectionData, KeySchedule::Server);

/// The client side: `config` must allow TLS 1.3 only and have
/// `enable_secret_extraction` set ([`crate::auth::TaskTls::channel_config`]).
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(io: S, config: Arc<rustls::ClientConfig>, name: ServerName<'static>) -> io::Result<TlsStream<S>> {
    handshake(io, UnbufferedClientConnection::new(config, name).map_err(invalid)?).await
}

/// The server side: `config` as for [`connect`].
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(io: S, config: Arc<rustls::ServerConfig>) -> io::Result<TlsStream<S>> {
    handshake(io, UnbufferedServerConnection::new(config).map_err(invalid)?).await
}

/// Encodes one handshake record at the end of `outgoing`.
fn encode<Data>(e: &mut EncodeTlsData<'_, Data>, outgoing: &mut Vec<u8>) -> io::Result<()> {
    let start = outgoing.len();
    outgoing.resize(start + records::MAX_RECORD, 0);
    let written = match e.encode(&mut outgoing[start..]) {
        Err(EncodeError::InsufficientSize(need)) => {
            outgoing.resize(start + need.required_size, 0);
            e.encode(&mut outgoing[start..])
        }
        other => other,
    }
    .map_err(invalid)?;
    outgoing.truncate(start + written);
    Ok(())
}

/// One step of a handshake: what rustls says, done as far as it needs no
/// I/O; what is left to do, and how many bytes of `incoming` are done with.
fn step<C: Handshake>(conn: &mut C, incoming: &mut [u8], outgoing: &mut Vec<u8>, early: &mut Vec<u8>) -> (usize, Result<Next, rustls::Error>) {
    let status = conn.process(incoming);
    let mut discard = status.discard;
    let next = step_state(status.state, outgoing, early, &mut discard);
    (discard, next)
}

fn step_state<Data>(
    state: Result<ConnectionState<'_, '_, Data>, rustls::Error>,
    outgoing: &mut Vec<u8>,
    early: &mut Vec<u8>,
    discard: &mut usize,
) -> Result<Next, rustls::Error> {
    Ok(match state? {
        ConnectionState::EncodeTlsData(mut e) => {
            encode(&mut e, outgoing).map_err(|e| rustls::Error::General(e.to_string()))?;
            Next::Again
        }
        ConnectionState::TransmitTlsData(t) => {
            t.done();
            Next::Transmit
        }
        ConnectionState::BlockedHandshake => Next::Read,
        // The peer's first application data, in the same read as its last
        // handshake message.
        ConnectionState::ReadTraffic(mut r) => {
            while let Some(record) = r.next_record() {
                let record = record?;
                early.extend_from_slice(record.payload);
                *discard += record.discard;
            }
            Next::Again
        }
        ConnectionState::WriteTraffic(_) => Next::Done,
        other => return Err(rustls::Error::General(format!("the peer closed during the handshake ({other:?})"))),
    })
}

async fn handshake<S: AsyncRead + AsyncWrite + Unpin, C: Handshake>(mut io: S, mut conn: C) -> io::Result<TlsStream<S>> {
    let mut incoming = vec![0u8; FIRST_READ_BYTES];
    let (mut filled, mut outgoing, mut early) = (0, Vec::new(), Vec::new());
    loop {
        let (discard, next) = step(&mut conn, &mut incoming[..filled], &mut outgoing, &mut early);
        incoming.copy_within(discard..filled, 0);
        filled -= discard;
        let next = match next {
            Ok(next) => next,
            Err(e) => {
                send_alert(&mut io, &mut conn, &mut incoming[..filled], &mut outgoing).await;
                return Err(invalid(e));
            }
        };
        match next {
            Next::Again => {}
            Next::Transmit => {
                io.write_all(&outgoing).await?;
                io.flush().await?;
                outgoing.clear();
            }
            Next::Read => {
                if filled == incoming.len() {
                    return Err(invalid("a handshake message larger than the read buffer"));
                }
                let n = io.read(&mut incoming[filled..]).await?;
                if n == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection during the TLS handshake"));
                }
                filled += n;
            }
            Next::Done => break,
        }
    }
    let alpn = conn.alpn();
    let (secrets, keys, version) = conn.into_keys().map_err(invalid)?;
    if version != Some(ProtocolVersion::TLSv1_3) {
        return Err(invalid(format!("{version:?} negotiated; this record layer is TLS 1.3's")));
    }
    let key = |(seq, s): &(u64, ConnectionTrafficSecrets)| RecordKey::new(*seq, s);
    Ok(TlsStream {
        io,
        keys,
        alpn,
        tx: key(&secrets.tx)?,
        rx: key(&secrets.rx)?,
        incoming,
        filled,
        opened: 0,
        plaintext: 0..0,
        early,
        early_read: 0,
        outgoing,
        sent: 0,
        read_closed: false,
        key_update_owed: false,
        records_per_key: records::RECORDS_PER_KEY,
        close_notify_sealed: false,
    })
}

/// After a failed handshake, sends the alert rustls queued (a bad
/// certificate, say), so the peer learns why; best effort.
async fn send_alert<S: AsyncWrite + Unpin, C: Handshake>(io: &mut S, conn: &mut C, incoming: &mut [u8], outgoing: &mut Vec<u8>) {
    outgoing.clear();
    // rustls hands the alert over as the next record to encode; the bytes
    // it was given stay the same (its deframer points into them).
    while let (0, Ok(Next::Again)) = step(conn, incoming, outgoing, &mut Vec::new()) {}
    if !outgoing.is_empty() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), io.write_all(outgoing)).await;
    }
}

impl<S: AsyncRead + Unpin> TlsStream<S> {
    /// Opens the next record if all of it is in: its plaintext becomes
    /// readable, or it is an alert or a key update, handled here. `false`
    /// when no whole record is in.
    fn open_next(&mut self) -> io::Result<bool> {
        let Some(len) = records::whole_record(&self.incoming[self.opened..self.filled])? else { return Ok(false) };
        let start = self.opened;
        let (kind, range) = records::open(&mut self.rx, &mut self.incoming[start..start + len])?;
        self.opened += len;
        let body = start + range.start..start + range.end;
        match kind {
            records::APPLICATION_DATA => self.plaintext = body,
            records::ALERT => {
                records::alert(&self.incoming[body]).map_err(invalid)?;
                self.read_closed = true;
            }
            records::HANDSHAKE => {
                for message in records::post_handshake_messages(&self.incoming[body]).map_err(invalid)? {
                    match message {
                        PostHandshake::KeyUpdate { update_requested } => {
                            self.rx = self.keys.next_rx()?;
                            self.key_update_owed |= update_requested;
                        }
                        // Resumption is off on our clients; a ticket is of no use.
                        PostHandshake::NewSessionTicket(_) if matches!(self.keys, KeySchedule::Client(_)) => {}
                        PostHandshake::NewSessionTicket(_) => return Err(invalid("a client sent a session ticket")),
                    }
                }
            }
            other => return Err(invalid(format!("a record of content type {other}"))),
        }
        Ok(true)
    }

    /// Moves the bytes not yet opened to the front of the buffer.
    fn compact(&mut self) {
        self.incoming.copy_within(self.opened..self.filled, 0);
        self.filled -= self.opened;
        self.opened = 0;
        self.plaintext = 0..0;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.early_read < this.early.len() {
                let n = buf.remaining().min(this.early.len() - this.early_read);
                buf.put_slice(&this.early[this.early_read..this.early_read + n]);
                this.early_read += n;
                return Poll::Ready(Ok(()));
            }
            if !this.plaintext.is_empty() {
                let n = buf.remaining().min(this.plaintext.len());
                buf.put_slice(&this.incoming[this.plaintext.start..this.plaintext.start + n]);
                this.plaintext.start += n;
                return Poll::Ready(Ok(()));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            if this.open_next()? {
                continue;
            }
            this.compact();
            let mut room = ReadBuf::new(&mut this.incoming[this.filled..]);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut room))?;
            let n = room.filled().len();
            if n == room.capacity() && this.incoming.len() < READ_BYTES {
                this.incoming.resize((2 * this.incoming.len()).min(READ_BYTES), 0);
            }
            if n == 0 {
                if this.filled > 0 {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS: the peer closed in the middle of a record")));
                }
                this.read_closed = true;
            }
            this.filled += n;
        }
    }
}

impl<S: AsyncWrite + Unpin> TlsStream<S> {
    /// Seals the key update we owe the peer, or that our key's record count
    /// asks for, and moves to the next key.
    fn seal_key_update(&mut self) -> io::Result<()> {
        if self.key_update_owed || self.tx.seq() >= self.records_per_key {
            records::seal(&mut self.tx, records::HANDSHAKE, &records::key_update(false), &mut self.outgoing)?;
            self.tx = self.keys.next_tx()?;
            self.key_update_owed = false;
        }
        Ok(())
    }

    /// Writes every sealed record to `io`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.outgoing.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.outgoing.len() >= WRITE_BYTES {
            ready!(this.poll_send(cx))?;
        }
        this.seal_key_update()?;
        let take = buf.len().min(WRITE_BYTES.saturating_sub(this.outgoing.len()).max(records::MAX_PLAINTEXT));
        records::seal_all(&mut this.tx, records::APPLICATION_DATA, &buf[..take], &mut this.outgoing)?;
        Poll::Ready(Ok(take))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.seal_key_update()?;
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_notify_sealed {
            this.seal_key_update()?;
            records::seal(&mut this.tx, records::ALERT, &records::CLOSE_NOTIFY, &mut this.outgoing)?;
            this.close_notify_sealed = true;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::task_tls_for_tests;

    fn localhost() -> ServerName<'static> {
        ServerName::try_from("localhost").unwrap()
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    async fn send(w: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) {
        w.write_all(bytes).await.unwrap();
        w.flush().await.unwrap();
    }

    async fn receive(r: &mut (impl AsyncRead + Unpin), len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        r.read_exact(&mut got).await.unwrap();
        got
    }

    /// Our client against rustls's own server (its record layer, through a
    /// pipe smaller than what is sent): bytes both ways arrive whole; a key
    /// update rustls asks for is followed, and ours is answered; close_notify
    /// ends the peer's reading cleanly.
    #[tokio::test]
    async fn rustls_reads_our_records_and_we_read_its_records_through_key_updates() {
        let dir = tempfile::tempdir().unwrap();
        let files = task_tls_for_tests(dir.path(), "job");
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let acceptor = tokio_rustls::TlsAcceptor::from(files.server_config().unwrap());
        let (ours, theirs) = tokio::join!(connect(client_io, files.channel_config().unwrap(), localhost()), acceptor.accept(server_io));
        let (mut ours, mut theirs) = (ours.unwrap(), theirs.unwrap());
        assert_eq!(ours.alpn_protocol(), Some(crate::auth::CHANNEL_ALPN));
        let (up, down, again) = (pattern(1 << 20, 1), pattern(700_000, 2), pattern(100_001, 3));
        let (_, got) = tokio::join!(send(&mut ours, &up), receive(&mut theirs, up.len()));
        assert!(got == up, "client to rustls");
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
        let (_, got) = tokio::join!(send(&mut theirs, &down), receive(&mut ours, down.len()));
        assert!(got == down, "rustls to client, after its key update");
        let (_, got) = tokio::join!(send(&mut ours, &again), receive(&mut theirs, again.len()));
        assert!(got == again, "client to rustls, after our key update");
        ours.shutdown().await.unwrap();
        assert_eq!(theirs.read(&mut [0u8; 8]).await.unwrap(), 0, "close_notify is a clean end");
    }

    /// rustls's client against our server, our side moving to a new key
    /// every 3 records (rustls checks each update and each record's key).
    #[tokio::test]
    async fn rustls_follows_our_key_updates() {
        let dir = tempfile::tempdir().unwrap();
        let files = task_tls_for_tests(dir.path(), "job");
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let connector = tokio_rustls::TlsConnector::from(files.channel_config().unwrap());
        let (theirs, ours) = tokio::join!(connector.connect(localhost(), client_io), accept(server_io, files.server_config().unwrap()));
        let (mut theirs, mut ours) = (theirs.unwrap(), ours.unwrap());
        ours.records_per_key = 3;
        let (down, up) = (pattern(300_000, 4), pattern(50_000, 5));
        let (_, got) = tokio::join!(send(&mut ours, &down), receive(&mut theirs, down.len()));
        assert!(got == down, "server to rustls");
        let (_, got) = tokio::join!(send(&mut theirs, &up), receive(&mut ours, up.len()));
        assert!(got == up, "rustls to server");
        assert!(ours.tx.seq() <= 3, "a key seals at most 3 records: {}", ours.tx.seq());
    }

    /// Application data sent with the client's last handshake flight is
    /// the first thing our server reads (a channel's opening does this).
    #[tokio::test]
    async fn bytes_sent_right_after_the_handshake_are_read_first() {
        let dir = tempfile::tempdir().unwrap();
        let files = task_tls_for_tests(dir.path(), "job");
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let client = async {
            let mut c = connect(client_io, files.channel_config().unwrap(), localhost()).await.unwrap();
            send(&mut c, b"TFJOBTC1 hello").await;
            c
        };
        let (_client, server) = tokio::join!(client, accept(server_io, files.server_config().unwrap()));
        let mut server = server.unwrap();
        assert_eq!(receive(&mut server, 14).await, b"TFJOBTC1 hello");
    }

    /// A client whose certificate another CA signed: the server's handshake
    /// fails on it, and the client's first read reports the alert.
    #[tokio::test]
    async fn a_certificate_from_another_ca_is_refused_and_the_client_hears_why() {
        let dir = tempfile::tempdir().unwrap();
        let (job, other) = (task_tls_for_tests(dir.path(), "job"), task_tls_for_tests(dir.path(), "other"));
        // The intruder trusts the job's CA (it may have copied it) but has another's certificate.
        let mut intruder = other.clone();
        intruder.ca = job.ca.clone();
        let (client_io, server_io) = tokio::io::duplex(64 << 10);
        let (client, server) =
            tokio::join!(connect(client_io, intruder.channel_config().unwrap(), localhost()), accept(server_io, job.server_config().unwrap()));
        let server_error = server.err().expect("the server refuses").to_string();
        assert!(server_error.contains("certificate"), "{server_error}");
        let client_error = match client {
            Err(e) => e.to_string(),
            Ok(mut c) => c.read(&mut [0u8; 8]).await.expect_err("the first read fails").to_string(),
        };
        assert!(client_error.contains("alert"), "{client_error}");
    }

    /// A record altered on the way fails the read; nothing of it is read.
    #[tokio::test]
    async fn an_altered_record_is_an_error_not_data() {
        let dir = tempfile::tempdir().unwrap();
        let files = task_tls_for_tests(dir.path(), "job");
        let (client_io, relay_in) = tokio::io::duplex(64 << 10);
        let (relay_out, server_io) = tokio::io::duplex(64 << 10);
        // A relay that flips a bit of every byte after the first 4 KiB of application data.
        let relay = tokio::spawn(async move {
            let (mut from_client, mut to_client) = tokio::io::split(relay_in);
            let (mut from_server, mut to_server) = tokio::io::split(relay_out);
            let up = async {
                let mut seen = 0usize;
                let mut buf = vec![0u8; 8192];
                loop {
                    let n = from_client.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    seen += n;
                    if seen > 8 << 10 {
                        buf[n - 1] ^= 1;
                    }
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            };
            let down = tokio::io::copy(&mut from_server, &mut to_client);
            let _ = tokio::join!(up, down);
        });
        let (client, server) =
            tokio::join!(connect(client_io, files.channel_config().unwrap(), localhost()), accept(server_io, files.server_config().unwrap()));
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        let data = pattern(64 << 10, 6);
        let (_, got) = tokio::join!(send(&mut client, &data), async {
            let mut got = vec![0u8; data.len()];
            server.read_exact(&mut got).await.map(|_| got)
        });
        let err = got.expect_err("an altered record is refused");
        assert!(err.to_string().contains("does not decrypt"), "{err}");
        drop((client, server));
        relay.abort();
    }
}

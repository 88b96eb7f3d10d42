//! The tensor channel (ps.proto): pushes and pulls on a plain TCP connection
//! to the ps's own port, the tensors' contents written from the sender's
//! memory and read straight into the receiver's.
//!
//! Through gRPC every tensor byte is copied four times: into tonic's encode
//! buffer, into the kernel, out of it into tonic's decode buffer, and from
//! there into the variable. On two cores shared by the ps and its workers
//! those copies, not the network, bound the bandwidth (BENCHMARKS.md). Here
//! only the kernel's two copies remain. The ps's port serves both: a
//! connection that opens with [`MAGIC`] is a tensor channel, anything else
//! goes to the gRPC server. With TLS the channel runs inside it (rustls on
//! the connection), asked for by its ALPN protocol
//! ([`crate::auth::CHANNEL_ALPN`]) rather than the magic bytes' arrival.
//!
//! The framing (a little-endian u32 length, a protobuf message, raw
//! contents) is in plain functions; the server loop and the client
//! connection only wire them to sockets.

use std::borrow::Cow;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::auth::TokenCheck;
use crate::connection::Connection;
use crate::proto::{self, RawRowsPart, RawTensorPart, RowsPart, TensorChannelReply, TensorChannelRequest, TensorPart};
use crate::ps::{PsService, Pulled, SharedPull};

/// The first bytes of a tensor channel connection.
pub const MAGIC: &[u8; 8] = b"TFJOBTC1";

/// Largest message of a frame. Messages carry names and shapes only (the
/// contents travel raw), so a real one is far smaller.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// How long an accepted connection may take to send its first bytes.
pub const OPENING_TIMEOUT: Duration = Duration::from_secs(10);

/// Contents up to this size are copied behind their frame and sent in one
/// write (one packet, one wake-up of the peer: a linear model's whole step);
/// larger ones are written from where they are. Reads go through a buffer
/// of this size, which reads larger than it bypass.
pub const SMALL_BYTES: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {0} bytes is larger than the {MAX_FRAME_BYTES} allowed")]
    FrameTooLarge(usize),
    #[error("undecodable frame: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("{0}")]
    Protocol(String),
}

/// What the first bytes of a connection say it is: `Some(true)` a tensor
/// channel, `Some(false)` something else (gRPC's HTTP/2 preface, a TLS
/// hello), `None` not known yet (a prefix of [`MAGIC`]).
pub fn opening(first_bytes: &[u8]) -> Option<bool> {
    let n = first_bytes.len().min(MAGIC.len());
    if first_bytes[..n] != MAGIC[..n] {
        Some(false)
    } else if n == MAGIC.len() {
        Some(true)
    } else {
        None
    }
}

/// Looks at the first bytes of an accepted connection without consuming
/// them. Errors when the peer closes before saying anything.
pub async fn is_tensor_channel(stream: &TcpStream) -> std::io::Result<bool> {
    let mut buf = [0u8; MAGIC.len()];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(answer) = opening(&buf[..n]) {
            return Ok(answer);
        }
        // Part of the magic has arrived: peek returns at once while bytes
        // are waiting, so give the rest a moment.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A message as a frame: its length (u32, little-endian), then its bytes.
pub fn encode_frame(message: &impl Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    message.encode(&mut out).expect("a Vec grows as needed");
    out
}

pub async fn read_frame<M: Message + Default>(r: &mut (impl AsyncRead + Unpin)) -> Result<M, ChannelError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = crate::le::u32_at(&len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ChannelError::FrameTooLarge(len));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(M::decode(&buf[..])?)
}

/// Most bytes of receive buffers a connection keeps for its next push.
pub const MAX_POOLED_BYTES: usize = 256 << 20;

/// Reads exactly `len` bytes into `buf` (emptied first; no zeroing).
async fn read_content_into(r: &mut (impl AsyncRead + Unpin), len: usize, mut buf: BytesMut) -> std::io::Result<Bytes> {
    use bytes::BufMut;
    buf.clear();
    buf.reserve(len);
    while buf.len() < len {
        // Never more than `len`: what follows belongs to the next part.
        let remaining = len - buf.len();
        let mut room = (&mut buf).limit(remaining);
        if r.read_buf(&mut room).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

async fn read_content(r: &mut (impl AsyncRead + Unpin), len: usize) -> std::io::Result<Bytes> {
    read_content_into(r, len, BytesMut::new()).await
}

/// Reads little-endian f32 contents straight into `dst`.
async fn read_f32_into(r: &mut (impl AsyncRead + Unpin), dst: &mut [f32]) -> std::io::Result<()> {
    if cfg!(target_endian = "little") {
        r.read_exact(bytemuck::cast_slice_mut(dst)).await?;
    } else {
        let bytes = read_content(r, dst.len() * 4).await?;
        crate::tensor::copy_f32_from_le(dst, &bytes);
    }
    Ok(())
}

fn le_bytes(values: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        std::borrow::Cow::Owned(crate::tensor::f32_to_bytes(values).to_vec())
    }
}

/// Writes `bytes` and flushes: under TLS a write may leave its last record
/// in the session's buffer (the socket was full), where the peer would wait
/// for it for ever.
async fn send(w: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

/// Writes a frame and the contents that follow it: in one write when they
/// are small, else the frame, then each content from where it is; then
/// flushes.
async fn write_message<'a>(
    w: &mut (impl AsyncWrite + Unpin),
    message: &impl Message,
    contents: impl Iterator<Item = std::borrow::Cow<'a, [u8]>> + Clone,
) -> std::io::Result<()> {
    let mut head = encode_frame(message);
    let total: usize = contents.clone().map(|c| c.len()).sum();
    if total <= SMALL_BYTES {
        for c in contents {
            head.extend_from_slice(&c);
        }
        return send(w, &head).await;
    }
    w.write_all(&head).await?;
    for c in contents {
        w.write_all(&c).await?;
    }
    w.flush().await
}

/// Headers of `values` cut into parts of at most `part_bytes` (as
/// [`crate::tensor::encode_parts`] cuts them), with each part's values.
pub fn raw_parts<'a>(name: &str, shape: &[i64], values: &'a [f32], part_bytes: usize) -> Vec<(RawTensorPart, &'a [f32])> {
    let per_part = (part_bytes / 4).max(1);
    let part = |offset: usize, chunk: &'a [f32]| {
        let header = RawTensorPart {
            name: name.to_string(),
            dtype: proto::DataType::DtFloat as i32,
            shape: shape.to_vec(),
            offset: offset as u64,
            content_length: (chunk.len() * 4) as u64,
        };
        (header, chunk)
    };
    if values.is_empty() {
        return vec![part(0, values)];
    }
    values.chunks(per_part).enumerate().map(|(i, chunk)| part(i * per_part, chunk)).collect()
}

fn error_reply(status: &Status) -> TensorChannelReply {
    TensorChannelReply { code: status.code() as i32, message: status.message().to_string(), ..Default::default() }
}

// ------------------------------------------------------------------ server

/// Serves one tensor channel connection of a ps until the peer closes it,
/// it breaks the protocol, or the server stops. Errors of a request (a bad
/// push, a barrier that timed out) are answered and the connection goes on.
pub async fn serve_connection(stream: Connection, service: PsService, check: TokenCheck, mut stop: watch::Receiver<bool>) {
    let peer = stream.tcp().peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let mut stream = BufReader::with_capacity(SMALL_BYTES, stream);
    if let Err(e) = serve_inner(&mut stream, &service, &check, &mut stop).await {
        match e {
            ChannelError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            e => tracing::debug!("tensor channel from {peer}: {e}"),
        }
    }
}

async fn serve_inner(
    stream: &mut BufReader<Connection>,
    service: &PsService,
    check: &TokenCheck,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ChannelError> {
    if !greet(stream, check).await? {
        return Ok(());
    }
    // The buffers of the last push, for the next one (the store keeps none).
    let mut pool: Vec<BytesMut> = Vec::new();
    loop {
        let request: TensorChannelRequest = tokio::select! {
            r = read_frame(stream) => r?,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let total: u64 = request.push_parts.iter().map(|p| p.content_length).chain(request.push_rows.iter().map(|r| r.content_length)).sum();
        if total > service.max_push_bytes() as u64 {
            // The contents that follow cannot be skipped sensibly: answer and close.
            let refused = Status::invalid_argument(format!("push carries {total} bytes: more than this ps holds"));
            send(stream, &encode_frame(&error_reply(&refused))).await?;
            return Ok(());
        }
        let (parts, rows) = read_push(stream, &request, &mut pool).await?;
        // The reply may tell this task that training is over: the ps waits for it to be written.
        let _on_its_way = service.store().reply_on_its_way();
        let answer = service.exchange(request.push, &parts, &rows, request.pull).await;
        recycle(&mut pool, parts);
        match answer {
            Err(status) => send(stream, &encode_frame(&error_reply(&status))).await?,
            Ok((push, pulled)) => {
                let (mut reply, contents) = reply_of(push, pulled.as_ref(), service.part_bytes());
                if let Some(call) = &request.next_shard {
                    match service.store().next_shard(call) {
                        Ok(answer) => reply.next_shard = Some(answer),
                        Err(e) => reply.next_shard_error = Status::from(e).message().to_string(),
                    }
                }
                write_message(stream.get_mut(), &reply, contents.iter().map(|c| std::borrow::Cow::Borrowed(&c[..]))).await?;
            }
        }
    }
}

/// The channel's opening: the magic bytes and the hello with the job's
/// token, answered. False when the token was refused (and the peer told).
async fn greet(stream: &mut BufReader<Connection>, check: &TokenCheck) -> Result<bool, ChannelError> {
    let mut magic = [0u8; MAGIC.len()];
    stream.read_exact(&mut magic).await?;
    let hello: proto::TensorChannelHello = read_frame(stream).await?;
    if !check.check_token(&hello.token) {
        let refused = Status::unauthenticated("missing or wrong job token (TFJOB_TOKEN)");
        send(stream, &encode_frame(&error_reply(&refused))).await?;
        return Ok(false);
    }
    send(stream, &encode_frame(&TensorChannelReply::default())).await?;
    Ok(true)
}

/// The contents of a request's push: its parts, read into buffers of the
/// pool where there are some, and its rows.
async fn read_push(
    stream: &mut BufReader<Connection>,
    request: &TensorChannelRequest,
    pool: &mut Vec<BytesMut>,
) -> Result<(Vec<TensorPart>, Vec<RowsPart>), ChannelError> {
    let mut parts = Vec::with_capacity(request.push_parts.len());
    for h in &request.push_parts {
        let content = read_content_into(stream, h.content_length as usize, pool.pop().unwrap_or_default()).await?;
        parts.push(TensorPart { name: h.name.clone(), dtype: h.dtype, shape: h.shape.clone(), offset: h.offset, content });
    }
    let mut rows = Vec::with_capacity(request.push_rows.len());
    for h in &request.push_rows {
        let content = read_content(stream, h.content_length as usize).await?;
        rows.push(RowsPart { name: h.name.clone(), count: h.count, content });
    }
    Ok((parts, rows))
}

/// Keeps the buffers of a push that nobody holds any more, up to
/// [`MAX_POOLED_BYTES`] in all.
fn recycle(pool: &mut Vec<BytesMut>, parts: Vec<TensorPart>) {
    let mut pooled: usize = pool.iter().map(|b| b.capacity()).sum();
    for p in parts {
        if let Ok(buf) = p.content.try_into_mut()
            && pooled + buf.capacity() <= MAX_POOLED_BYTES
        {
            pooled += buf.capacity();
            pool.push(buf);
        }
    }
}

/// The reply to a request: the push's answer, and the pull's step and
/// values as raw parts and rows, with their contents (written from the
/// variables themselves: shared, not locked; an update meanwhile works on
/// a copy).
fn reply_of(push: Option<proto::PushGradientsReply>, pulled: Option<&Pulled<SharedPull>>, part_bytes: usize) -> (TensorChannelReply, Vec<Cow<'_, [u8]>>) {
    let mut reply = TensorChannelReply { push, ..Default::default() };
    let mut contents: Vec<Cow<'_, [u8]>> = Vec::new();
    let Some(pulled) = pulled else {
        return (reply, contents);
    };
    reply.step = pulled.step;
    reply.done = pulled.done;
    reply.waited_micros = pulled.waited_micros;
    let (shared, rows) = match &pulled.values {
        Some((shared, rows)) => (&shared[..], &rows[..]),
        None => (&[][..], &[][..]),
    };
    for v in shared {
        for (header, chunk) in raw_parts(&v.name, &v.shape, &v.values, part_bytes) {
            reply.parts.push(header);
            contents.push(le_bytes(chunk));
        }
    }
    for r in rows {
        reply.rows.push(RawRowsPart { name: r.name.clone(), count: r.ids.len() as u64, content_length: (r.ids.len() * 8 + r.values.len() * 4) as u64 });
        contents.push(Cow::Owned(crate::le::i64_bytes(&r.ids)));
        contents.push(le_bytes(&r.values));
    }
    (reply, contents)
}

// ------------------------------------------------------------------ client

/// Where the contents of a pulled part go: an index into the destination
/// slices and the element range inside it, or why the part is not wanted.
pub type Locate<'a> = dyn Fn(&RawTensorPart) -> Result<(usize, Range<usize>), String> + Send + Sync + 'a;

/// A worker's tensor channel to one ps: one connection, opened on first use
/// and again after any failure; one request at a time.
pub struct ChannelClient {
    address: String,
    token: String,
    connect_timeout: Duration,
    /// TLS to the ps (the job's certificates), with the name its certificate must carry.
    tls: Option<(std::sync::Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>)>,
    connection: tokio::sync::Mutex<Option<BufReader<Connection>>>,
}

/// A transport failure: the connection is dropped, and the caller sees
/// UNAVAILABLE (the same as a broken gRPC connection: the training loop
/// rejoins, and a retried push is not applied twice).
fn unavailable(address: &str, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("tensor channel to {address}: connection error: {e}"))
}

impl ChannelClient {
    pub fn new(address: &str, token: Option<&str>, connect_timeout: Duration) -> Self {
        ChannelClient {
            address: address.to_string(),
            token: token.unwrap_or_default().to_string(),
            connect_timeout,
            tls: None,
            connection: tokio::sync::Mutex::new(None),
        }
    }

    /// Over TLS: `config` holds the job's CA and this task's certificate
    /// ([`crate::auth::TaskTls::channel_config`]); the ps must present a
    /// certificate for its address's host.
    pub fn with_tls(mut self, config: std::sync::Arc<rustls::ClientConfig>) -> Result<Self, String> {
        let host = crate::connection::address_host(&self.address);
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| format!("{}: {e}", self.address))?;
        self.tls = Some((config, name));
        Ok(self)
    }

    async fn connect(&self) -> Result<BufReader<Connection>, Status> {
        let open = async {
            let tcp = TcpStream::connect(&self.address).await?;
            tcp.set_nodelay(true)?;
            let mut stream = match &self.tls {
                Some((config, name)) => Connection::from(crate::tls_stream::connect(tcp, config.clone(), name.clone()).await?),
                None => Connection::Plain(tcp),
            };
            let mut opening = MAGIC.to_vec();
            opening.extend(encode_frame(&proto::TensorChannelHello { token: self.token.clone() }));
            send(&mut stream, &opening).await?;
            let mut stream = BufReader::with_capacity(SMALL_BYTES, stream);
            let reply: TensorChannelReply = read_frame(&mut stream).await?;
            Ok::<_, ChannelError>((stream, reply))
        };
        let (stream, reply) = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| unavailable(&self.address, "timed out connecting"))?
            .map_err(|e| unavailable(&self.address, e))?;
        if reply.code != 0 {
            return Err(Status::new(Code::from(reply.code), reply.message));
        }
        Ok(stream)
    }

    /// Sends one request (with the raw contents of its pushed parts and
    /// rows) and reads the reply, the pulled contents going straight into
    /// `destinations` where `locate` says. Returns the reply (its `code` is
    /// 0), when its header arrived, and the contents of its rows (ids then
    /// values, per [`TensorChannelReply::rows`]).
    pub async fn exchange(
        &self,
        mut request: TensorChannelRequest,
        push: Vec<(RawTensorPart, &[f32])>,
        push_rows: Vec<(RawRowsPart, Vec<u8>)>,
        destinations: &mut [&mut [f32]],
        locate: &Locate<'_>,
        timeout: Duration,
    ) -> Result<(TensorChannelReply, Instant, Vec<Bytes>), Status> {
        let mut slot = self.connection.lock().await;
        let mut stream = match slot.take() {
            Some(s) => s,
            None => self.connect().await?,
        };
        let (headers, contents): (Vec<RawTensorPart>, Vec<&[f32]>) = push.into_iter().unzip();
        request.push_parts = headers;
        let (row_headers, row_contents): (Vec<RawRowsPart>, Vec<Vec<u8>>) = push_rows.into_iter().unzip();
        request.push_rows = row_headers;
        let io = async {
            let all = contents.iter().map(|c| le_bytes(c)).chain(row_contents.iter().map(|c| std::borrow::Cow::Borrowed(&c[..])));
            write_message(stream.get_mut(), &request, all).await?;
            let reply: TensorChannelReply = read_frame(&mut stream).await?;
            let arrived = Instant::now();
            for part in &reply.parts {
                let (k, range) = locate(part).map_err(ChannelError::Protocol)?;
                if part.content_length != (range.len() * 4) as u64 {
                    return Err(ChannelError::Protocol(format!("part of {:?}: content length does not match its elements", part.name)));
                }
                read_f32_into(&mut stream, &mut destinations[k][range]).await?;
            }
            let mut rows = Vec::with_capacity(reply.rows.len());
            for r in &reply.rows {
                let len = usize::try_from(r.content_length).ok().filter(|&n| n <= MAX_POOLED_BYTES);
                let len = len.ok_or_else(|| ChannelError::Protocol(format!("rows of {:?}: {} bytes", r.name, r.content_length)))?;
                rows.push(read_content(&mut stream, len).await?);
            }
            Ok::<_, ChannelError>((reply, arrived, rows))
        };
        let (reply, arrived, rows) = match tokio::time::timeout(timeout, io).await {
            Err(_) => {
                return Err(Status::deadline_exceeded(format!("tensor channel to {}: no reply within {timeout:?}", self.address)));
            }
            Ok(Err(ChannelError::Protocol(m))) => {
                return Err(Status::internal(format!("tensor channel to {}: {m}", self.address)));
            }
            Ok(Err(e)) => return Err(unavailable(&self.address, e)),
            Ok(Ok(r)) => r,
        };
        // Whole request and reply went through: the connection is reusable.
        *slot = Some(stream);
        if reply.code != 0 {
            return Err(Status::new(Code::from(reply.code), reply.message));
        }
        Ok((reply, arrived, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message written over TLS through a congested connection (a pipe of 16 KiB) arrives
    /// whole while the writer keeps the connection open, waiting for an answer, as a peer does:
    /// the last records a write leaves in the TLS session are flushed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_over_tls_arrives_whole_through_a_congested_connection() {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::auth::task_tls_for_tests(dir.path(), "job");
        let (client_io, server_io) = tokio::io::duplex(16 << 10);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (client, server) = tokio::join!(
            crate::tls_stream::connect(client_io, files.channel_config().unwrap(), name),
            crate::tls_stream::accept(server_io, files.server_config().unwrap())
        );
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        const N: usize = 300_000;
        let (hold, held) = tokio::sync::oneshot::channel::<()>();
        let writer = tokio::spawn(async move {
            let values: Vec<f32> = (0..N).map(|i| i as f32).collect();
            let message = TensorChannelReply { step: 7, ..Default::default() };
            write_message(&mut client, &message, std::iter::once(le_bytes(&values))).await.unwrap();
            let _ = held.await;
        });
        let read = async {
            let reply: TensorChannelReply = read_frame(&mut server).await?;
            let mut got = vec![0f32; N];
            read_f32_into(&mut server, &mut got).await?;
            Ok::<_, ChannelError>((reply, got))
        };
        let (reply, got) = tokio::time::timeout(Duration::from_secs(10), read).await.expect("the whole message arrives").unwrap();
        assert_eq!((reply.step, got[0], got[N - 1]), (7, 0.0, (N - 1) as f32));
        drop(hold);
        writer.await.unwrap();
    }

    #[test]
    fn openings() {
        let cases: &[(&[u8], Option<bool>)] = &[
            (b"TFJOBTC1", Some(true)),
            (b"TFJOBTC1\x05\x00", Some(true)),
            (b"TFJ", None),
            (b"T", None),
            (b"PRI * HTTP/2.0\r\n", Some(false)),
            (b"\x16\x03\x01", Some(false)),
            (b"TFJOBTC2", Some(false)),
            (b"TX", Some(false)),
        ];
        for (bytes, want) in cases {
            assert_eq!(opening(bytes), *want, "{bytes:?}");
        }
    }

    #[test]
    fn raw_parts_cover_the_values_once() {
        let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
        for (part_bytes, counts) in [(16, vec![4, 4, 2]), (40, vec![10]), (1, vec![1; 10]), (1 << 20, vec![10])] {
            let parts = raw_parts("v", &[10], &values, part_bytes);
            assert_eq!(parts.iter().map(|(_, c)| c.len()).collect::<Vec<_>>(), counts, "part_bytes {part_bytes}");
            let mut next = 0;
            for (h, c) in &parts {
                assert_eq!(h.offset as usize, next);
                assert_eq!(h.content_length as usize, c.len() * 4);
                assert_eq!(c[0], next as f32);
                next += c.len();
            }
            assert_eq!(next, 10);
        }
        let empty = raw_parts("e", &[0], &[], 8);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].0.content_length, 0);
    }

    #[tokio::test]
    async fn frames_round_trip_and_refuse_giants() {
        let reply = TensorChannelReply { code: 5, message: "gone".into(), step: 7, ..Default::default() };
        let bytes = encode_frame(&reply);
        let mut r = &bytes[..];
        let back: TensorChannelReply = read_frame(&mut r).await.unwrap();
        assert_eq!(back, reply);
        let giant = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes();
        let err = read_frame::<TensorChannelReply>(&mut &giant[..]).await.unwrap_err();
        assert!(matches!(err, ChannelError::FrameTooLarge(_)), "{err}");
        let cut = &bytes[..bytes.len() - 1];
        assert!(matches!(read_frame::<TensorChannelReply>(&mut &cut[..]).await, Err(ChannelError::Io(_))));
    }

    /// Small or large, the bytes on the wire are the frame, then each
    /// content in order.
    #[tokio::test]
    async fn messages_are_the_frame_then_the_contents() {
        let reply = TensorChannelReply { step: 3, ..Default::default() };
        for sizes in [vec![], vec![3usize, 0, 5], vec![SMALL_BYTES / 4 + 1, 2], vec![SMALL_BYTES / 4]] {
            let values: Vec<Vec<f32>> = sizes.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 7 + j) as f32).collect()).collect();
            let mut wire = Vec::new();
            write_message(&mut wire, &reply, values.iter().map(|v| le_bytes(v))).await.unwrap();
            let mut want = encode_frame(&reply);
            for v in &values {
                want.extend_from_slice(bytemuck::cast_slice(v));
            }
            assert!(wire == want, "sizes {sizes:?}");
        }
    }

    #[tokio::test]
    async fn contents_are_read_exactly() {
        let values = [1.5f32, -2.0, 3.25];
        let mut wire = Vec::new();
        wire.extend_from_slice(&le_bytes(&values));
        wire.extend_from_slice(b"next");
        let mut r = &wire[..];
        let mut dst = [0f32; 3];
        read_f32_into(&mut r, &mut dst).await.unwrap();
        assert_eq!(dst, values);
        assert_eq!(r, b"next");
        let mut r = &wire[..];
        let content = read_content(&mut r, 12).await.unwrap();
        assert_eq!(&content[..], &wire[..12]);
        assert_eq!(r, b"next");
        // Into a reused buffer larger than the content: still exactly 12.
        let mut r = &wire[..];
        let mut big = BytesMut::with_capacity(1 << 10);
        big.extend_from_slice(b"stale bytes");
        let content = read_content_into(&mut r, 12, big).await.unwrap();
        assert_eq!(&content[..], &wire[..12]);
        assert_eq!(r, b"next");
        assert!(read_content(&mut &wire[..5], 12).await.is_err());
    }
}

//! The registration socket's one quirk: the kubelet's plugin watcher dials
//! it with the socket's path as its target and no authority of its own
//! (k8s.io/kubernetes `pkg/kubelet/pluginmanager/operationexecutor`,
//! `dial()`), so grpc-go sends the path, e.g.
//! `/var/lib/kubelet/plugins_registry/enim.io-reg.sock`, as the HTTP/2
//! `:authority`. The h2 server under tonic refuses that as a malformed
//! authority and resets the stream (PROTOCOL_ERROR), and the kubelet never
//! registers the plugin (hyperium/h2#487 is still open). The DRA socket
//! itself is dialled as `unix:<path>` and is not affected.
//!
//! So the registration socket is served through [`relay`]: the bytes from
//! the kubelet pass through as they are, except that every header block is
//! decoded (HPACK, with loona-hpack), its `:authority` set to `localhost`,
//! and encoded again for the server, with one HPACK context per direction
//! of the relay, as the protocol wants. Replies pass through untouched.
//!
//! Anyone who can open the socket talks to this code before the gRPC
//! server sees a byte, and HPACK lets a few bytes stand for kilobytes, so
//! every buffer is bounded before it is allocated (enimd runs in 256 MiB):
//! - a frame's payload: at most [`MAX_FRAME`], the size HTTP/2 allows until
//!   the server's SETTINGS say more, and the registration server never
//!   says more ([`super::plugin`] builds it with exactly this);
//! - the HPACK dynamic table: [`HEADER_TABLE`], SETTINGS_HEADER_TABLE_SIZE's
//!   initial value, which the server keeps;
//! - a header block, encoded, and its header list, decoded and counted as
//!   HTTP/2 counts it: [`MAX_HEADER_LIST`] each, checked as the list is
//!   decoded, so a block of references to one large table entry stops at
//!   the bound instead of expanding;
//! - connections at once: [`MAX_CONNECTIONS`]; more wait in the socket's
//!   backlog, which costs enimd nothing; a client silent for [`CLIENT_IDLE`]
//!   is closed, so a stalled one does not keep its place.
//!
//! What breaks a bound closes that connection with a warning; the kubelet's
//! own requests are a few hundred bytes and never come near one.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use loona_hpack::decoder::DecoderError;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Semaphore};

/// What every request's `:authority` becomes.
pub const AUTHORITY: &[u8] = b"localhost";
/// The client connection preface (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload read from the kubelet and written to the
/// server: SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113, 6.5.2). The
/// relay does not parse the server's SETTINGS because the server is ours
/// and announces exactly this; a larger frame breaks the protocol anyway.
pub const MAX_FRAME: usize = 16_384;
/// The HPACK dynamic table the kubelet's encoder may fill:
/// SETTINGS_HEADER_TABLE_SIZE's initial value, which the server keeps.
pub const HEADER_TABLE: usize = 4_096;
/// The largest header block (encoded) and header list (decoded, each field
/// counted as its name, its value and 32, RFC 9113 6.5.2). grpc-go allows
/// 16 MiB; the plugin watcher sends only grpc-go's own few headers (no
/// metadata), a few hundred bytes, so 64 KiB is ample and keeps a
/// connection's worst case far below enimd's memory limit.
pub const MAX_HEADER_LIST: usize = 64 * 1024;
/// Streams open at once on one connection: the kubelet calls one at a time.
pub const MAX_STREAMS: u32 = 8;
/// Registration connections relayed at once: the kubelet opens one per
/// registration and closes it after.
pub const MAX_CONNECTIONS: usize = 8;
/// A client that sends nothing for this long is closed.
pub const CLIENT_IDLE: Duration = Duration::from_secs(60);
/// Each direction's buffer between a relay and the in-process server.
const DUPLEX_BUFFER: usize = 64 * 1024;

/// Why a relayed connection ended other than by a clean close.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not an HTTP/2 connection preface")]
    NotHttp2,
    #[error("frame of {len} bytes announced; the largest accepted is {MAX_FRAME}")]
    FrameTooLarge { len: usize },
    #[error("header block over {MAX_HEADER_LIST} bytes")]
    BlockTooLarge,
    #[error("header list over {MAX_HEADER_LIST} bytes once decoded")]
    HeaderListTooLarge,
    #[error("HPACK: {0}")]
    Hpack(DecoderError),
    #[error("malformed HTTP/2: {0}")]
    Malformed(&'static str),
    #[error("the client sent nothing for {0:?}")]
    Idle(Duration),
}

/// Rewrites one header block's `:authority`: the kubelet's HPACK context
/// on one side, the server's on the other.
pub struct AuthorityFix {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl Default for AuthorityFix {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        // A size update above it is an HPACK error, not a larger table.
        decoder.set_max_allowed_table_size(HEADER_TABLE);
        AuthorityFix {
            decoder,
            encoder: Encoder::new(),
        }
    }
}

impl AuthorityFix {
    /// The block with `:authority` (when present) set to [`AUTHORITY`].
    /// The decoded list is counted field by field and kept only up to
    /// [`MAX_HEADER_LIST`]: fields past it are never copied.
    pub fn rewrite(&mut self, block: &[u8]) -> Result<Vec<u8>, RelayError> {
        if block.len() > MAX_HEADER_LIST {
            return Err(RelayError::BlockTooLarge);
        }
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut list_size = 0usize;
        self.decoder
            .decode_with_cb(block, |name, value| {
                let value: &[u8] = if &*name == b":authority" {
                    AUTHORITY
                } else {
                    &value
                };
                list_size = list_size.saturating_add(name.len() + value.len() + 32);
                if list_size <= MAX_HEADER_LIST {
                    headers.push((name.to_vec(), value.to_vec()));
                }
            })
            .map_err(RelayError::Hpack)?;
        if list_size > MAX_HEADER_LIST {
            return Err(RelayError::HeaderListTooLarge);
        }
        Ok(self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
    }
}

/// A frame's 9-byte header.
fn frame_head(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// Fills `buf` from `from`, or fails once `idle` passes without it.
async fn read_within<R: AsyncRead + Unpin>(
    from: &mut R,
    buf: &mut [u8],
    idle: Duration,
) -> Result<(), RelayError> {
    match tokio::time::timeout(idle, from.read_exact(buf)).await {
        Ok(read) => read.map(|_| ()).map_err(RelayError::Io),
        Err(_) => Err(RelayError::Idle(idle)),
    }
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct Pending {
    stream: u32,
    /// The HEADERS frame's flags.
    flags: u8,
    /// Its priority fields, when it had them.
    priority: Vec<u8>,
    block: Vec<u8>,
}

/// The header block fragment of a HEADERS frame's payload, after its
/// padding length and priority fields, before its padding.
fn headers_fragment(payload: &[u8], flags: u8) -> Result<(&[u8], &[u8]), RelayError> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&len, rest) = body
            .split_first()
            .ok_or(RelayError::Malformed("padded HEADERS without a length"))?;
        pad = usize::from(len);
        body = rest;
    }
    let mut priority: &[u8] = &[];
    if flags & PRIORITY != 0 {
        if body.len() < 5 {
            return Err(RelayError::Malformed("HEADERS too short for its priority"));
        }
        (priority, body) = body.split_at(5);
    }
    let end = body
        .len()
        .checked_sub(pad)
        .ok_or(RelayError::Malformed("HEADERS padding too long"))?;
    Ok((priority, &body[..end]))
}

/// Copies the kubelet's side of the connection from `from` to `to`,
/// rewriting header blocks; returns at the end of `from`. A client silent
/// for `idle` is an error.
pub async fn rewrite_client_stream<R, W>(
    from: &mut R,
    to: &mut W,
    idle: Duration,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    read_within(from, &mut preface, idle).await?;
    if &preface != PREFACE {
        return Err(RelayError::NotHttp2);
    }
    to.write_all(&preface).await?;
    let mut fix = AuthorityFix::default();
    let mut pending: Option<Pending> = None;
    // One buffer for every payload, never larger than MAX_FRAME.
    let mut payload = Vec::with_capacity(MAX_FRAME);
    loop {
        let mut head = [0u8; 9];
        match read_within(from, &mut head, idle).await {
            Ok(()) => {}
            Err(RelayError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        // Before a byte of the payload is read or room made for it.
        if len > MAX_FRAME {
            return Err(RelayError::FrameTooLarge { len });
        }
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        payload.resize(len, 0);
        read_within(from, &mut payload, idle).await?;
        let block_done = match (kind, pending.as_mut()) {
            (HEADERS, None) => {
                let (priority, fragment) = headers_fragment(&payload, flags)?;
                pending = Some(Pending {
                    stream,
                    flags,
                    priority: priority.to_vec(),
                    block: fragment.to_vec(),
                });
                flags & END_HEADERS != 0
            }
            (CONTINUATION, Some(p)) if p.stream == stream => {
                if p.block.len() + payload.len() > MAX_HEADER_LIST {
                    return Err(RelayError::BlockTooLarge);
                }
                p.block.extend_from_slice(&payload);
                flags & END_HEADERS != 0
            }
            (_, Some(_)) => return Err(RelayError::Malformed("a frame inside a header block")),
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        };
        if !block_done {
            continue;
        }
        let done = pending.take().expect("a block was collected");
        let mut out = done.priority;
        out.extend(fix.rewrite(&done.block)?);
        // One HEADERS (unpadded; its priority kept) and CONTINUATIONs.
        let mut chunks = out.chunks(MAX_FRAME).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut f) = if first {
                (HEADERS, done.flags & (END_STREAM | PRIORITY))
            } else {
                (CONTINUATION, 0)
            };
            if last {
                f |= END_HEADERS;
            }
            to.write_all(&frame_head(chunk.len(), kind, f, done.stream))
                .await?;
            to.write_all(chunk).await?;
            first = false;
        }
        to.flush().await?;
    }
}

/// Relays one kubelet connection to the in-process gRPC server at
/// `server`, rewriting its requests' authority; ends when either side
/// closes, or when the client stays silent for `idle`.
pub async fn relay<C, S>(client: C, server: S, idle: Duration) -> Result<(), RelayError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    let up = async {
        let r = rewrite_client_stream(&mut cr, &mut sw, idle).await;
        let _ = sw.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut sr, &mut cw).await.map(|_| ());
        let _ = cw.shutdown().await;
        r.map_err(RelayError::Io)
    };
    // Either side closing ends the relay.
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

/// How many registration connections are relayed at once, and how long a
/// silent one is kept.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections: usize,
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: MAX_CONNECTIONS,
            idle: CLIENT_IDLE,
        }
    }
}

/// Accepts connections on the registration socket and relays each to the
/// server through a fresh in-process stream sent on `to_server`, at most
/// `limits.connections` at once: the next is accepted only when one ends.
/// Returns once the server stops taking streams.
pub async fn accept(
    listener: UnixListener,
    to_server: mpsc::Sender<io::Result<DuplexStream>>,
    limits: Limits,
) {
    let open = Arc::new(Semaphore::new(limits.connections));
    loop {
        // The permit before the accept: a connection beyond the limit waits
        // in the socket's backlog, where it costs enimd nothing.
        let permit = match open.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                tracing::warn!(
                    limit = limits.connections,
                    "registration socket: connection limit reached; the next waits for one to end"
                );
                match open.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => return,
                }
            }
        };
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "registration socket: accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (ours, theirs) = tokio::io::duplex(DUPLEX_BUFFER);
        if to_server.send(Ok(theirs)).await.is_err() {
            return;
        }
        tokio::spawn(async move {
            let _permit = permit;
            match relay(conn, ours, limits.idle).await {
                Ok(()) => {}
                Err(RelayError::Io(e)) => {
                    tracing::debug!(error = %e, "registration connection ended");
                }
                Err(e @ RelayError::Idle(_)) => {
                    tracing::info!(error = %e, "registration connection closed");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registration connection refused and closed");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// This test binary's heap, counted per thread: what a relay allocates
    /// is measured, not guessed.
    mod heap {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static LIVE: Cell<isize> = const { Cell::new(0) };
            static PEAK: Cell<isize> = const { Cell::new(0) };
        }

        fn grew(by: usize) {
            let by = isize::try_from(by).unwrap_or(isize::MAX);
            let _ = LIVE.try_with(|live| {
                let now = live.get().saturating_add(by);
                live.set(now);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
            });
        }

        fn shrank(by: usize) {
            let by = isize::try_from(by).unwrap_or(isize::MAX);
            let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(by)));
        }

        struct Counting;

        // SAFETY: every call goes to the system allocator unchanged; the
        // counters beside it only read sizes and never allocate (const
        // thread-locals of a type without a destructor).
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                // SAFETY: the caller's contract, passed on as it is.
                let p = unsafe { System.alloc(layout) };
                if !p.is_null() {
                    grew(layout.size());
                }
                p
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                // SAFETY: the caller's contract, passed on as it is.
                let p = unsafe { System.alloc_zeroed(layout) };
                if !p.is_null() {
                    grew(layout.size());
                }
                p
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: the caller's contract, passed on as it is.
                unsafe { System.dealloc(ptr, layout) };
                shrank(layout.size());
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                // SAFETY: the caller's contract, passed on as it is.
                let p = unsafe { System.realloc(ptr, layout, new_size) };
                if !p.is_null() {
                    // Both blocks may exist at once while it moves.
                    grew(new_size);
                    shrank(layout.size());
                }
                p
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        /// `f`'s result, and the most this thread's heap grew while it ran.
        pub fn peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
            let start = LIVE.with(Cell::get);
            PEAK.with(|p| p.set(start));
            let out = f();
            let peak = PEAK.with(Cell::get);
            (out, usize::try_from(peak - start).unwrap_or(0))
        }
    }

    const SOCKET: &[u8] = b"/var/lib/kubelet/plugins_registry/enim.io-reg.sock";
    const IDLE: Duration = Duration::from_secs(5);
    const MIB: usize = 1 << 20;

    /// A header block as grpc-go sends the kubelet's requests: the first
    /// on a connection carries `:authority` as a literal added to the
    /// dynamic table (HPACK 0x41: incremental indexing, name index 1);
    /// later ones refer to that entry (0xbe: dynamic index 62).
    fn kubelet_headers(enc: &mut Encoder<'static>, path: &[u8], first: bool) -> Vec<u8> {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
        ];
        let mut block = enc.encode(headers);
        if first {
            block.push(0x41);
            block.push(u8::try_from(SOCKET.len()).unwrap());
            block.extend_from_slice(SOCKET);
        } else {
            block.push(0xbe);
        }
        block
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = frame_head(payload.len(), kind, flags, stream).to_vec();
        f.extend_from_slice(payload);
        f
    }

    /// `block` as one HEADERS frame and as many CONTINUATIONs as
    /// [`MAX_FRAME`] needs.
    fn block_frames(stream: u32, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            out.extend(frame(kind, flags, stream, chunk));
        }
        out
    }

    /// One frame as the server sees it: kind, flags, stream, the decoded
    /// headers of a header block, the payload of any other frame.
    type Seen = (u8, u8, u32, Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>);

    /// Parses frames, decoding header blocks with one server-side context.
    fn server_view(bytes: &[u8]) -> Vec<Seen> {
        assert_eq!(&bytes[..24], PREFACE);
        let mut dec = Decoder::new();
        let mut out = Vec::new();
        let mut rest = &bytes[24..];
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME, "the relay wrote a frame of {len}");
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = rest[9..9 + len].to_vec();
            rest = &rest[9 + len..];
            if kind == HEADERS || kind == CONTINUATION {
                let body = if kind == HEADERS && flags & PRIORITY != 0 {
                    &payload[5..]
                } else {
                    &payload[..]
                };
                block.extend_from_slice(body);
                if flags & END_HEADERS != 0 {
                    out.push((HEADERS, flags, stream, dec.decode(&block).unwrap(), vec![]));
                    block.clear();
                }
            } else {
                out.push((kind, flags, stream, vec![], payload));
            }
        }
        out
    }

    /// The relay's output for `input`, or why it refused.
    async fn through(input: Vec<u8>) -> Result<Vec<u8>, RelayError> {
        let mut out = Vec::new();
        rewrite_client_stream(&mut input.as_slice(), &mut out, IDLE).await?;
        Ok(out)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Counts what is written and keeps none of it.
    #[derive(Default)]
    struct Count(usize);

    impl AsyncWrite for Count {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0 += buf.len();
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn every_requests_authority_becomes_localhost_the_rest_passes() {
        let mut enc = Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
        let first = kubelet_headers(&mut enc, b"/pluginregistration.Registration/GetInfo", true);
        input.extend(frame(HEADERS, END_HEADERS, 1, &first));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0])); // DATA
                                                                   // The second request's block refers to the first's dynamic table
                                                                   // entries: the contexts must stay paired across the rewrite.
        let second = kubelet_headers(
            &mut enc,
            b"/pluginregistration.Registration/NotifyRegistrationStatus",
            false,
        );
        input.extend(frame(HEADERS, END_HEADERS, 3, &second));
        let out = through(input).await.unwrap();
        let frames = server_view(&out);
        assert_eq!(frames.len(), 4);
        assert_eq!(
            (frames[0].0, frames[0].4.as_slice()),
            (0x4, &[0u8, 3, 0, 0, 0, 100][..])
        );
        for (i, path) in [(1, "GetInfo"), (3, "NotifyRegistrationStatus")] {
            let h = &frames[i].3;
            let get = |n: &[u8]| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
            assert_eq!(get(b":authority").as_deref(), Some(AUTHORITY));
            assert_eq!(
                get(b":path").unwrap(),
                format!("/pluginregistration.Registration/{path}").into_bytes()
            );
            assert_eq!(get(b":method").as_deref(), Some(&b"POST"[..]));
            assert_eq!(h.len(), 4);
        }
        assert_eq!((frames[2].0, frames[2].1), (0x0, END_STREAM));
    }

    #[tokio::test]
    async fn padding_priority_and_continuations_are_handled() {
        let mut enc = Encoder::new();
        let block = kubelet_headers(&mut enc, b"/x/Y", true);
        let (a, b) = block.split_at(7);
        // HEADERS: padded (3 bytes), with priority, END_STREAM, no
        // END_HEADERS; then a CONTINUATION ends it.
        let mut payload = vec![3];
        payload.extend([0, 0, 0, 0, 16]);
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        let frames = server_view(&through(input).await.unwrap());
        assert_eq!(frames.len(), 1);
        let (kind, flags, stream, headers, _) = &frames[0];
        assert_eq!((*kind, *stream), (HEADERS, 5));
        assert_eq!(
            *flags,
            PRIORITY | END_STREAM | END_HEADERS,
            "no padding left"
        );
        assert!(headers.contains(&(b":authority".to_vec(), AUTHORITY.to_vec())));
    }

    #[tokio::test]
    async fn garbage_is_refused_not_passed_on() {
        let e = through(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
            .await
            .unwrap_err();
        assert!(matches!(e, RelayError::NotHttp2), "{e}");
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        let e = through(input).await.unwrap_err();
        assert!(matches!(e, RelayError::Hpack(_)), "{e}");
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, &[]));
        let e = through(input).await.unwrap_err();
        assert!(e.to_string().contains("inside a header block"), "{e}");
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_before_its_payload_is_read() {
        // The largest frame allowed passes.
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x0, 0, 1, &vec![7; MAX_FRAME]));
        let out = through(input).await.unwrap();
        assert_eq!(out.len(), 24 + 9 + MAX_FRAME);

        // 16 MiB announced, 3 bytes sent, the client's side kept open: the
        // relay must answer from the frame's header alone, not wait for (or
        // make room for) the payload.
        for len in [MAX_FRAME + 1, 0xff_ffff] {
            let (mut client, mut relay_end) = tokio::io::duplex(1024);
            client.write_all(PREFACE).await.unwrap();
            client
                .write_all(&frame_head(len, HEADERS, END_HEADERS, 1))
                .await
                .unwrap();
            client.write_all(&[0x82, 0x86, 0x84]).await.unwrap();
            let mut out = Count::default();
            let refused = tokio::time::timeout(
                Duration::from_secs(2),
                rewrite_client_stream(&mut relay_end, &mut out, IDLE),
            )
            .await
            .expect("refused at once, not after reading the payload");
            assert!(
                matches!(refused, Err(RelayError::FrameTooLarge { len: l }) if l == len),
                "{refused:?}"
            );
            assert_eq!(out.0, 24, "nothing but the preface passed");
            drop(client);
        }
    }

    #[test]
    fn an_oversize_frame_costs_no_allocation_of_its_size() {
        let mut input = PREFACE.to_vec();
        input.extend(frame_head(0xff_ffff, 0x0, 0, 1));
        let rt = runtime();
        let (refused, peak) = heap::peak_growth(|| {
            rt.block_on(rewrite_client_stream(
                &mut input.as_slice(),
                &mut Count::default(),
                IDLE,
            ))
        });
        assert!(
            matches!(refused, Err(RelayError::FrameTooLarge { .. })),
            "{refused:?}"
        );
        assert!(peak < MIB, "the relay allocated {peak} bytes");
    }

    /// The first request of a connection, with one more field added to the
    /// dynamic table: `x-bomb`, 4000 bytes (4038 as HPACK counts it, under
    /// the 4096 table), the newest entry, so 0xbe (index 62) names it.
    fn bomb_entry() -> Vec<u8> {
        let mut enc = Encoder::new();
        let mut block =
            kubelet_headers(&mut enc, b"/pluginregistration.Registration/GetInfo", true);
        block.push(0x40);
        block.push(6);
        block.extend_from_slice(b"x-bomb");
        block.extend(loona_hpack::encoder::encode_integer(4000, 7));
        block.extend(std::iter::repeat_n(b'a', 4000));
        let mut input = PREFACE.to_vec();
        input.extend(block_frames(1, &block));
        input
    }

    #[test]
    fn a_decompression_bomb_is_refused_without_expanding_it() {
        // 60,000 one-byte references to the 4 KB entry: 242 MB decoded,
        // from a block under the block bound.
        let mut input = bomb_entry();
        input.extend(block_frames(3, &vec![0xbe; 60_000]));
        let rt = runtime();
        let started = std::time::Instant::now();
        let (refused, peak) = heap::peak_growth(|| rt.block_on(through(input)));
        assert!(
            matches!(refused, Err(RelayError::HeaderListTooLarge)),
            "{refused:?}"
        );
        assert!(peak < MIB, "the relay allocated {peak} bytes");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn the_4_gib_bomb_is_refused_by_its_block_size() {
        // The case: a 1 MiB block of references to the 4 KB entry
        // would decode to about 4 GiB.
        let mut input = bomb_entry();
        input.extend(block_frames(3, &vec![0xbe; MIB - 64]));
        let rt = runtime();
        let started = std::time::Instant::now();
        let (refused, peak) = heap::peak_growth(|| rt.block_on(through(input)));
        assert!(
            matches!(refused, Err(RelayError::BlockTooLarge)),
            "{refused:?}"
        );
        assert!(peak < MIB, "the relay allocated {peak} bytes");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_header_list_at_the_bound_passes_one_byte_more_is_refused() {
        let list = |big: usize| -> Vec<(Vec<u8>, Vec<u8>)> {
            vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), b"/x/Y".to_vec()),
                (b":authority".to_vec(), SOCKET.to_vec()),
                (b"x-big".to_vec(), vec![b'b'; big]),
            ]
        };
        // As HTTP/2 counts it, with the authority the server will see.
        let fixed: usize = list(0)
            .iter()
            .map(|(n, v)| {
                let v = if n == b":authority" {
                    AUTHORITY.len()
                } else {
                    v.len()
                };
                n.len() + v + 32
            })
            .sum();
        let at_bound = MAX_HEADER_LIST - fixed;
        for (big, passes) in [(at_bound, true), (at_bound + 1, false)] {
            let headers = list(big);
            let block = Encoder::new().encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
            let mut input = PREFACE.to_vec();
            input.extend(block_frames(1, &block));
            let result = through(input).await;
            if passes {
                let frames = server_view(&result.unwrap());
                let seen = &frames[0].3;
                assert_eq!(seen[3], (b":authority".to_vec(), AUTHORITY.to_vec()));
                assert_eq!(seen[4].1.len(), big);
            } else {
                assert!(
                    matches!(result, Err(RelayError::HeaderListTooLarge)),
                    "{result:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_table_larger_than_the_servers_is_refused() {
        // A dynamic table size update to 1 MiB (0x3f, then 1 MiB - 31 in
        // 7-bit groups) before an indexed field.
        let mut block = vec![0x3f];
        let mut rest = MIB - 31;
        while rest >= 128 {
            block.push(u8::try_from(rest % 128).unwrap() | 0x80);
            rest /= 128;
        }
        block.push(u8::try_from(rest).unwrap());
        block.push(0x82);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let e = through(input).await.unwrap_err();
        assert!(
            matches!(e, RelayError::Hpack(DecoderError::InvalidMaxDynamicSize)),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_silent_client_is_closed() {
        let (_client, mut relay_end) = tokio::io::duplex(1024);
        let idle = Duration::from_millis(50);
        let e = rewrite_client_stream(&mut relay_end, &mut Count::default(), idle)
            .await
            .unwrap_err();
        assert!(matches!(e, RelayError::Idle(d) if d == idle), "{e}");
    }

    /// One frame of a generated stream: its kind, flags, stream, payload.
    fn any_frame() -> impl Strategy<Value = (u8, u8, u32, Vec<u8>)> {
        let kind = prop_oneof![
            Just(HEADERS),
            Just(CONTINUATION),
            Just(0x0),
            Just(0x4),
            any::<u8>()
        ];
        (kind, any::<u8>(), 0u32..4, any_block())
    }

    /// HPACK-shaped bytes: indexed fields (static and dynamic), literals
    /// that enter the table (up to 3000 bytes, so that references expand),
    /// size updates, and raw bytes.
    fn any_block() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![
            4 => (1usize..66).prop_map(|i| loona_hpack::encoder::encode_integer(i, 7)
                .into_iter()
                .enumerate()
                .map(|(k, b)| if k == 0 { b | 0x80 } else { b })
                .collect::<Vec<u8>>()),
            3 => (
                proptest::collection::vec(any::<u8>(), 0..16),
                0usize..3000
            )
                .prop_map(|(name, len)| {
                    let mut f = vec![0x40];
                    f.extend(loona_hpack::encoder::encode_integer(name.len(), 7));
                    f.extend(name);
                    f.extend(loona_hpack::encoder::encode_integer(len, 7));
                    f.extend(std::iter::repeat_n(b'v', len));
                    f
                }),
            2 => Just(vec![0xbe; 32]),
            1 => (0usize..5000).prop_map(|size| {
                let mut f = loona_hpack::encoder::encode_integer(size, 5);
                f[0] |= 0x20;
                f
            }),
            1 => proptest::collection::vec(any::<u8>(), 0..8),
        ];
        proptest::collection::vec(field, 0..12).prop_map(|fields| fields.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any stream: no panic, the relay's own heap stays under a
        /// constant, what it writes is bounded by what it read, and it ends
        /// at once.
        #[test]
        fn any_stream_is_relayed_or_refused_within_bounds(
            frames in proptest::collection::vec(any_frame(), 0..10),
            tail in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let mut input = PREFACE.to_vec();
            for (kind, flags, stream, payload) in &frames {
                input.extend(frame(*kind, *flags, *stream, payload));
            }
            input.extend(&tail);
            let rt = runtime();
            let started = std::time::Instant::now();
            let mut out = Count::default();
            let (_, peak) = heap::peak_growth(|| {
                rt.block_on(rewrite_client_stream(&mut input.as_slice(), &mut out, IDLE))
            });
            prop_assert!(peak < 2 * MIB, "the relay allocated {} bytes", peak);
            // A byte in stands for at most one field of at most the table's
            // size (or the authority), once re-encoded with its frame.
            prop_assert!(out.0 <= input.len() * (HEADER_TABLE + 64), "{} out of {}", out.0, input.len());
            prop_assert!(started.elapsed() < Duration::from_secs(5));
        }

        /// Any sequence of blocks on one context: rewritten exactly as a
        /// reference decoder reads them (authority aside) while the list is
        /// within the bound, refused past it, never a panic.
        #[test]
        fn any_hpack_blocks_are_rewritten_faithfully_or_refused(
            blocks in proptest::collection::vec(any_block(), 1..4),
        ) {
            let mut fix = AuthorityFix::default();
            let mut reference = Decoder::new();
            reference.set_max_allowed_table_size(HEADER_TABLE);
            let mut server = Decoder::new();
            for block in &blocks {
                let expected = reference.decode(block);
                let got = fix.rewrite(block);
                let Ok(expected) = expected else {
                    prop_assert!(matches!(got, Err(RelayError::Hpack(_))), "{:?}", got);
                    break;
                };
                let expected: Vec<_> = expected
                    .into_iter()
                    .map(|(n, v)| if n == b":authority" { (n, AUTHORITY.to_vec()) } else { (n, v) })
                    .collect();
                let size: usize = expected.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
                if size > MAX_HEADER_LIST {
                    prop_assert!(matches!(got, Err(RelayError::HeaderListTooLarge)), "{:?}", got);
                    break;
                }
                let got = got.unwrap();
                prop_assert!(got.len() <= MAX_HEADER_LIST);
                prop_assert_eq!(server.decode(&got).unwrap(), expected);
            }
        }
    }
}

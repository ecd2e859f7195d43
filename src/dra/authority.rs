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

use std::io;

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may set: rewritten blocks
/// are cut into frames no larger.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is refused (a registration request's
/// is a few hundred bytes).
const MAX_BLOCK: usize = 1 << 20;

fn bad(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Rewrites one header block's `:authority`: the kubelet's HPACK context
/// on one side, the server's on the other.
pub struct AuthorityFix {
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl Default for AuthorityFix {
    fn default() -> Self {
        AuthorityFix {
            decoder: Decoder::new(),
            encoder: Encoder::new(),
        }
    }
}

impl AuthorityFix {
    /// The block with `:authority` (when present) set to [`AUTHORITY`].
    pub fn rewrite(&mut self, block: &[u8]) -> io::Result<Vec<u8>> {
        let mut headers = self
            .decoder
            .decode(block)
            .map_err(|e| bad(format!("HPACK: {e}")))?;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" {
                *value = AUTHORITY.to_vec();
            }
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

/// Copies the kubelet's side of the connection from `from` to `to`,
/// rewriting header blocks; returns at the end of `from`.
pub async fn rewrite_client_stream<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(bad("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let mut fix = AuthorityFix::default();
    // A header block being collected from HEADERS + CONTINUATION frames:
    // its stream, its HEADERS flags, its priority fields, its bytes.
    let mut pending: Option<(u32, u8, Vec<u8>, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let block_done = match (kind, pending.as_mut()) {
            (HEADERS, None) => {
                let mut body = payload.as_slice();
                let mut pad = 0usize;
                if flags & PADDED != 0 {
                    pad = usize::from(
                        *body
                            .first()
                            .ok_or_else(|| bad("padded HEADERS without a length"))?,
                    );
                    body = &body[1..];
                }
                let mut priority = Vec::new();
                if flags & PRIORITY != 0 {
                    if body.len() < 5 {
                        return Err(bad("HEADERS too short for its priority"));
                    }
                    priority = body[..5].to_vec();
                    body = &body[5..];
                }
                let fragment = body
                    .get(
                        ..body
                            .len()
                            .checked_sub(pad)
                            .ok_or_else(|| bad("HEADERS padding too long"))?,
                    )
                    .ok_or_else(|| bad("HEADERS padding too long"))?;
                pending = Some((stream, flags, priority, fragment.to_vec()));
                flags & END_HEADERS != 0
            }
            (CONTINUATION, Some((s, _, _, block))) if *s == stream => {
                block.extend_from_slice(&payload);
                if block.len() > MAX_BLOCK {
                    return Err(bad("header block too large"));
                }
                flags & END_HEADERS != 0
            }
            (_, Some(_)) => return Err(bad("a frame inside a header block")),
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        };
        if !block_done {
            continue;
        }
        let (stream, flags, priority, block) = pending.take().expect("a block was collected");
        let mut out = priority;
        out.extend(fix.rewrite(&block)?);
        // One HEADERS (unpadded; its priority kept) and CONTINUATIONs.
        let mut chunks = out.chunks(MAX_FRAME).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut f) = if first {
                (HEADERS, flags & (END_STREAM | PRIORITY))
            } else {
                (CONTINUATION, 0)
            };
            if last {
                f |= END_HEADERS;
            }
            to.write_all(&frame_head(chunk.len(), kind, f, stream))
                .await?;
            to.write_all(chunk).await?;
            first = false;
        }
        to.flush().await?;
    }
}

/// Relays one kubelet connection to the in-process gRPC server at
/// `server`, rewriting its requests' authority; ends when either side
/// closes.
pub async fn relay<C, S>(client: C, server: S) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    let up = async {
        let r = rewrite_client_stream(&mut cr, &mut sw).await;
        let _ = sw.shutdown().await;
        r
    };
    let down = async {
        let r = tokio::io::copy(&mut sr, &mut cw).await.map(|_| ());
        let _ = cw.shutdown().await;
        r
    };
    // Either side closing ends the relay.
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKET: &[u8] = b"/var/lib/kubelet/plugins_registry/enim.io-reg.sock";

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

    async fn through(input: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        rewrite_client_stream(&mut input.as_slice(), &mut out).await?;
        Ok(out)
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
        assert!(e.to_string().contains("preface"), "{e}");
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        let e = through(input).await.unwrap_err();
        assert!(e.to_string().contains("HPACK"), "{e}");
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, &[]));
        let e = through(input).await.unwrap_err();
        assert!(e.to_string().contains("inside a header block"), "{e}");
    }
}

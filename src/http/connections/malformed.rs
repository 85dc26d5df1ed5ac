//! Bodies for the answers hyper writes itself.
//!
//! When a request cannot be parsed at all (a bad request line, conflicting
//! `Content-Length` headers, a URI or header block over hyper's limits), hyper answers 400,
//! 414 or 431 before any service sees the request, always with `content-length: 0` and no
//! way to supply a body. The contract says every 4xx carries the JSON error shape, so
//! [`ErrorBodies`] sits between hyper and the socket and rewrites exactly those answers as
//! they are written. It can tell them from the router's: every error the router sends has
//! a JSON body, so a 400, 414 or 431 head declaring an empty body came from hyper.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose bodiless parse-error answers get the error shape (module doc).
pub(crate) struct ErrorBodies<S> {
    inner: S,
    /// The rewritten answer and how much of it the socket has taken. Set while a rewrite
    /// is being written: hyper retries the same buffer after `Pending`, and is told it was
    /// written only once all of the rewrite was.
    rewrite: Option<(Vec<u8>, usize)>,
}

impl<S> ErrorBodies<S> {
    pub(crate) fn new(inner: S) -> Self {
        ErrorBodies {
            inner,
            rewrite: None,
        }
    }
}

/// hyper's automatic answer as written, rewritten with a body, or `None` for any other
/// bytes. hyper writes the whole head of such an answer in one buffer.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let (code, message) = match head.get(..13)? {
        b"HTTP/1.1 400 " => (
            "bad_request",
            "the request is not valid HTTP/1.1 (a malformed request line or header, or \
             conflicting Content-Length headers); check what the client sends",
        ),
        b"HTTP/1.1 414 " => (
            "uri_too_long",
            "the request's URI is longer than the server reads; put long values in a JSON \
             body instead of the query string",
        ),
        b"HTTP/1.1 431 " => (
            "headers_too_large",
            "the request's headers are larger or more numerous than the server reads (at \
             most 100 headers and about 400 KiB); send fewer or shorter headers",
        ),
        _ => return None,
    };
    // The head up to and including its last header line's CRLF.
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 2;
    let lines = &head[..end];
    let empty = b"\r\ncontent-length: 0\r\n";
    let at = lines.windows(empty.len()).position(|w| w == empty)?;
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(&lines[..at]);
    out.extend_from_slice(b"\r\ncontent-type: application/json");
    out.extend_from_slice(format!("\r\ncontent-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(&lines[at + empty.len()..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

impl<S: AsyncWrite + Unpin> ErrorBodies<S> {
    /// Writes `buf`, or its rewrite; `Ready(Ok(buf.len()))` once all of it is out.
    fn poll_answer(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.rewrite.is_none() {
            match rewrite(buf) {
                Some(out) => self.rewrite = Some((out, 0)),
                None => return Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        let (out, written) = self.rewrite.as_mut().expect("set above");
        while *written < out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &out[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        self.rewrite = None;
        Poll::Ready(Ok(buf.len()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ErrorBodies<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_answer(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // An answer's head is always its first slice; only a head is ever rewritten, and a
        // partial vectored write (the head alone) is allowed.
        match bufs.iter().find(|b| !b.is_empty()) {
            Some(first) if this.rewrite.is_some() || rewrite(first).is_some() => {
                this.poll_answer(cx, first)
            }
            _ => Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodiless_parse_error_heads_are_rewritten() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
                     content-length: 0\r\ndate: Tue, 01 Dec 2026 22:03:05 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(head).unwrap()).unwrap();
        let (lines, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(
            lines.contains("\r\ncontent-type: application/json\r\n"),
            "{lines}"
        );
        assert!(lines.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        assert!(
            lines.ends_with("GMT"),
            "the other headers are kept: {lines}"
        );
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "headers_too_large");
        // The router's own 400s have bodies; a 200 with an empty body is left alone.
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                     content-length: 61\r\n\r\n";
        assert!(rewrite(ours).is_none());
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 4").is_none());
    }
}

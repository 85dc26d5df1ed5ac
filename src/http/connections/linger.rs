//! A lingering close: when the server closes a connection, it first stops writing (the
//! client sees the answer and the end of it), then reads and discards what the client is
//! still sending before it lets go of the socket.
//!
//! Without it, an answer given before the request body was read — `413` for a body over
//! the limit, declared or not — is lost: closing a socket with unread bytes makes the
//! kernel reset the connection, and a client still sending its body (Python's `urllib`,
//! `requests` and `httpx` do not wait for `100 Continue`) gets `BrokenPipeError` or
//! `ConnectionResetError` instead of the answer and its message. The discard is bounded:
//! at most [`Linger::bound`] bytes, and it ends when the client closes, or sends nothing
//! for [`LINGER_IDLE`], or after [`LINGER_MAX`] in all; past those the socket is closed as
//! before (a client sending far more than the limit may still see a reset).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The longest pause in what the client sends before a lingering close gives up.
pub(crate) const LINGER_IDLE: Duration = Duration::from_secs(2);

/// The longest a lingering close lasts.
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(30);

/// A connection that closes lingering (module doc).
pub(crate) struct Linger<S> {
    inner: S,
    /// Bytes discarded at most while lingering.
    bound: u64,
    /// Set when the last answer closes the connection with its request's body possibly
    /// unread (the router's `Connection: close` answers); other closes — an idle
    /// connection timed out or evicted — need no lingering and free their slot at once.
    wanted: Arc<AtomicBool>,
    state: State,
}

enum State {
    /// Serving: reads and writes go through.
    Open,
    /// The write side is shut; discarding what arrives until the client is done.
    Draining {
        discarded: u64,
        idle: Pin<Box<Sleep>>,
        until: Instant,
    },
    Closed,
}

impl<S> Linger<S> {
    pub(crate) fn new(inner: S, bound: u64, wanted: Arc<AtomicBool>) -> Self {
        Linger {
            inner,
            bound,
            wanted,
            state: State::Open,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Linger<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Linger<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Open => {
                    // The answer is out and the client told so (FIN); now drain.
                    ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
                    if !this.wanted.load(Ordering::Acquire) {
                        this.state = State::Closed;
                        continue;
                    }
                    this.state = State::Draining {
                        discarded: 0,
                        idle: Box::pin(tokio::time::sleep(LINGER_IDLE)),
                        until: Instant::now() + LINGER_MAX,
                    };
                }
                State::Draining {
                    discarded,
                    idle,
                    until,
                } => {
                    let mut scratch = [0u8; 16 * 1024];
                    let mut buf = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                        // The client is done (or gone): close.
                        Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                            this.state = State::Closed;
                        }
                        Poll::Ready(Err(_)) => this.state = State::Closed,
                        Poll::Ready(Ok(())) => {
                            *discarded += buf.filled().len() as u64;
                            let now = Instant::now();
                            if *discarded > this.bound || now >= *until {
                                this.state = State::Closed;
                            } else {
                                idle.as_mut().reset((now + LINGER_IDLE).min(*until));
                            }
                        }
                        Poll::Pending => {
                            ready!(idle.as_mut().poll(cx));
                            this.state = State::Closed;
                        }
                    }
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_close_waits_for_the_client_to_finish_sending_and_drops_what_it_sent() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut server = Linger::new(server, 1 << 20, Arc::new(AtomicBool::new(true)));
        let (mut client_read, mut client_write) = tokio::io::split(client);
        // The client sends 512 KiB without reading, as a client sending a big body does.
        let sender = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..8 {
                client_write.write_all(&chunk).await?;
            }
            client_write.shutdown().await?;
            Ok::<_, io::Error>(())
        });
        server
            .write_all(b"HTTP/1.1 413 Payload Too Large\r\n\r\n")
            .await
            .unwrap();
        server.shutdown().await.unwrap();
        sender
            .await
            .unwrap()
            .expect("the client sent everything without a reset");
        let mut answer = String::new();
        client_read.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_sending_is_closed_after_the_idle_wait() {
        let (_client, server) = tokio::io::duplex(1024);
        let mut server = Linger::new(server, 1 << 20, Arc::new(AtomicBool::new(true)));
        let started = Instant::now();
        server.shutdown().await.unwrap();
        assert!(started.elapsed() >= LINGER_IDLE && started.elapsed() < LINGER_MAX);
    }
}

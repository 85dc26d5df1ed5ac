//! How `serve` holds its connections: the accept loop, the per-connection timeouts, the
//! bound on open connections and the drain with a deadline (the `[server]` section,
//! [`Edge`]).
//!
//! axum's own `serve` reads headers and bodies without a deadline and, on shutdown, waits
//! for every connection to finish however long it takes: a client holding half-sent
//! headers kept SIGTERM from ever completing. Here hyper serves each connection with a
//! header read timeout (which also closes idle keep-alive connections, since hyper starts
//! it whenever it waits for the next request), the router bounds the time between body
//! chunks ([`crate::server::router`]), connections past [`Edge::max_connections`] are
//! answered `503 overloaded` at once, a connection the server closes lingers to discard
//! what the client still sends so it reads the answer (`linger`), and a shutdown stops
//! accepting, lets each connection
//! finish the request it is serving, and closes whatever is still open after
//! [`Edge::drain_timeout`]. The answers hyper writes itself to requests it cannot parse
//! get the contract's error body on the way out ([`malformed`]).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::metrics::ConnectionMetrics;
use crate::server::ApiError;
use linger::Linger;
use malformed::ErrorBodies;

mod linger;
mod malformed;

/// The `[server]` section as written: durations are human strings (`"30s"`, `"2m"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// How long a client has to send a request's headers in full, counted from when the
    /// server is ready for them (the connection opened, or the previous answer sent): a
    /// keep-alive connection idle this long is closed. Default `"30s"`.
    pub header_timeout: String,
    /// How long a request body may pause between two chunks before the request is
    /// answered `408 body_timeout` and the connection closed. Default `"30s"`.
    pub body_timeout: String,
    /// After SIGTERM or Ctrl-C, how long requests in flight may take to finish before the
    /// connections still open are closed and the runtime is flushed. Default `"10s"`.
    pub drain_timeout: String,
    /// How long an admitted request may take to be answered, its body's arrival included;
    /// past it the answer is `503 timeout` (with `Retry-After`) and the work is abandoned,
    /// so no request holds its admission slot without end. Default `"30s"`.
    pub request_timeout: String,
    /// Connections served at once; one more is answered `503 overloaded` and closed.
    /// Default 1024.
    pub max_connections: usize,
    /// Recalls and knowledge searches being answered at once; one more waits for a slot
    /// (`queue_wait`, `max_queued`). Default 2 per core, what the runtime ranks at once:
    /// more in flight only queue inside the runtime, where an unlucky one waits behind
    /// all the others instead of first come, first served.
    pub max_recalls: usize,
    /// Writes (events, feedback, condense, status changes) being answered at once; one
    /// more waits for a slot like a recall. Default 512.
    pub max_writes: usize,
    /// How long a recall or write past its class's slots may wait for one; a request that
    /// cannot expect a slot within it (the requests ahead of it times the time a slot is
    /// held, over the slots) is answered `503 overloaded` at once, with the expected wait
    /// (`crate::server` admission). `"0s"` refuses at once, without waiting. Default
    /// `"100ms"`.
    pub queue_wait: String,
    /// Requests of one class waiting for a slot at most; one more is answered
    /// `503 overloaded` at once. Default 1024.
    pub max_queued: usize,
    /// Run the thread that reads requests and answers refusals at real-time priority
    /// (`SCHED_FIFO`, the lowest level; Linux, with `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`
    /// of at least 1). On a saturated machine a woken thread of normal priority waits for
    /// a scheduler tick: with 200 mixed clients on 2 cores, refusals' p99 was 11–16 ms at
    /// normal priority, 7–10 ms with this, and 2.5–3.8 ms with this and clients that did
    /// not compete for the same cores. The thread only parses requests and moves bytes,
    /// and the kernel leaves other threads at least 5 % of every core
    /// (`sched_rt_runtime_us`). When the priority cannot be had, `serve` says so and runs
    /// at normal priority. Default `false`.
    pub edge_realtime: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_timeout: "30s".into(),
            body_timeout: "30s".into(),
            drain_timeout: "10s".into(),
            request_timeout: "30s".into(),
            max_connections: 1024,
            max_recalls: 2 * cores(),
            max_writes: 512,
            queue_wait: "100ms".into(),
            max_queued: 1024,
            edge_realtime: false,
        }
    }
}

impl ServerConfig {
    /// The settings checked and parsed; every problem is listed, each naming its key.
    pub fn edge(&self) -> Result<Edge, Vec<String>> {
        let mut problems = Vec::new();
        let mut duration = |key: &str, text: &str| match humantime::parse_duration(text.trim()) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                problems.push(format!(
                    "server.{key} = {text:?}: zero would close every connection at once; \
                     use a few seconds, e.g. \"30s\""
                ));
                Duration::ZERO
            }
            Err(e) => {
                problems.push(format!(
                    "server.{key} = {text:?} is not a duration ({e}); write it like \"30s\" \
                     or \"2m\""
                ));
                Duration::ZERO
            }
        };
        let edge = Edge {
            header_timeout: duration("header_timeout", &self.header_timeout),
            body_timeout: duration("body_timeout", &self.body_timeout),
            drain_timeout: duration("drain_timeout", &self.drain_timeout),
            request_timeout: duration("request_timeout", &self.request_timeout),
            max_connections: self.max_connections,
            max_recalls: self.max_recalls,
            max_writes: self.max_writes,
            queue_wait: match humantime::parse_duration(self.queue_wait.trim()) {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!(
                        "server.queue_wait = {:?} is not a duration ({e}); write it like \
                         \"100ms\", or \"0s\" to refuse at once",
                        self.queue_wait
                    ));
                    Duration::ZERO
                }
            },
            max_queued: self.max_queued,
            linger_bytes: MIN_LINGER_BYTES,
            realtime: self.edge_realtime,
        };
        for (key, value, default) in [
            ("max_connections", self.max_connections, 1024),
            ("max_recalls", self.max_recalls, 2 * cores()),
            ("max_writes", self.max_writes, 512),
        ] {
            if value == 0 {
                problems.push(format!(
                    "server.{key} = 0 would refuse every request; use at least 1 (default \
                     {default})"
                ));
            }
        }
        match problems.is_empty() {
            true => Ok(edge),
            false => Err(problems),
        }
    }
}

/// The cores this process may use (1 when the system will not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How the server treats connections (see [`ServerConfig`] for each setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// Time to send a request's headers, and the idle keep-alive timeout.
    pub header_timeout: Duration,
    /// Longest pause between two chunks of a request body.
    pub body_timeout: Duration,
    /// Time the drain gives requests in flight after a shutdown signal.
    pub drain_timeout: Duration,
    /// Time an admitted request has to be answered.
    pub request_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Recalls and knowledge searches answered at once.
    pub max_recalls: usize,
    /// Writes answered at once.
    pub max_writes: usize,
    /// Longest wait for an admission slot.
    pub queue_wait: Duration,
    /// Requests of one class waiting for a slot at most.
    pub max_queued: usize,
    /// Bytes a closing connection reads and discards at most, so the client sees an answer
    /// given before its body was read ([`Edge::lingering_for`], `listen/linger.rs`).
    pub linger_bytes: u64,
    /// The connections' thread asks for real-time priority ([`raise_to_realtime`]).
    pub realtime: bool,
}

/// What a closing connection discards at least: a client's body well past the usual
/// limits still gets its `413`.
const MIN_LINGER_BYTES: u64 = 64 << 20;

impl Edge {
    /// This edge, discarding up to the larger of 4× `body_limit` and 64 MiB of what a
    /// client still sends when its connection closes.
    pub fn lingering_for(self, body_limit: usize) -> Edge {
        Edge {
            linger_bytes: (4 * body_limit as u64).max(MIN_LINGER_BYTES),
            ..self
        }
    }
}

impl Default for Edge {
    fn default() -> Self {
        ServerConfig::default()
            .edge()
            .expect("the default [server] settings are valid")
    }
}

/// Puts the calling thread at the lowest real-time priority (`SCHED_FIFO` 1), so that when
/// it wakes it preempts every thread of normal priority instead of waiting for the next
/// scheduler tick; threads it creates start at normal priority again. The error says what
/// would allow it.
pub fn raise_to_realtime() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 1 };
        // SAFETY: changes only the calling thread's (pid 0) scheduling; `param` outlives
        // the call.
        let rc = unsafe {
            libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        Err(format!(
            "server.edge_realtime: real-time priority was refused ({e}); grant the process \
             CAP_SYS_NICE (systemd: AmbientCapabilities=CAP_SYS_NICE; docker: --cap-add \
             SYS_NICE) or an RLIMIT_RTPRIO of 1 (systemd: LimitRTPRIO=1); serving at normal \
             priority"
        ))
    }
    #[cfg(not(target_os = "linux"))]
    Err("server.edge_realtime needs Linux; serving at normal priority".into())
}

/// What [`serve_connections`] did, for the operator's last lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open at the drain deadline, closed without their answer.
    pub cut: usize,
}

/// Serves `app` on `listener` until `shutdown` completes, then drains (see the module
/// doc). Returns once every connection is closed.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    edge: Edge,
    counts: ConnectionMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Drained {
    let slots = Arc::new(Semaphore::new(edge.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(edge.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors, or a connection reset before it was taken:
                    // the listener is still good. A pause keeps EMFILE from spinning.
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let peer = stream.peer_addr().ok();
                let _ = stream.set_nodelay(true);
                let io = TokioIo::new(ErrorBodies::new(Linger::new(stream, edge.linger_bytes)));
                let mut stop = stop_rx.clone();
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        // Handlers see the client's address (`ConnectInfo`), as under
                        // axum's own `serve`: failed authentication is counted by it.
                        let app = app.clone().map_request(move |mut req: Request<hyper::body::Incoming>| {
                            if let Some(peer) = peer {
                                req.extensions_mut().insert(ConnectInfo(peer));
                            }
                            req
                        });
                        let conn = builder.serve_connection(io, TowerToHyperService::new(app));
                        let open = counts.open.clone();
                        open.inc();
                        connections.spawn(async move {
                            tokio::pin!(conn);
                            tokio::select! {
                                _ = conn.as_mut() => {}
                                () = async { let _ = stop.wait_for(|s| *s).await; } => {
                                    // Finish the request being served, close when idle.
                                    conn.as_mut().graceful_shutdown();
                                    let _ = conn.await;
                                }
                            }
                            drop(slot);
                            open.dec();
                        });
                    }
                    Err(_) => {
                        // Over the bound: answered at once, never queued.
                        counts.refused.inc();
                        let mut refusal = http1::Builder::new();
                        refusal
                            .timer(TokioTimer::new())
                            .header_read_timeout(edge.header_timeout)
                            .keep_alive(false);
                        let limit = edge.max_connections;
                        let conn = refusal.serve_connection(
                            io,
                            hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                                std::future::ready(Ok::<_, Infallible>(overloaded(limit)))
                            }),
                        );
                        connections.spawn(async move {
                            let _ = conn.await;
                        });
                    }
                }
            }
            // Reap finished connections so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let deadline = tokio::time::sleep(edge.drain_timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = connections.join_next() => {
                if next.is_none() {
                    return Drained::default();
                }
            }
            () = &mut deadline => {
                let cut = connections.len();
                counts.cut.inc_by(cut as u64);
                tracing::warn!(
                    connections = cut,
                    "closing connections still open {}s after the shutdown signal \
                     (server.drain_timeout); their requests get no answer",
                    edge.drain_timeout.as_secs_f64()
                );
                connections.abort_all();
                while connections.join_next().await.is_some() {}
                return Drained { cut };
            }
        }
    }
}

/// The answer to a connection past the bound.
fn overloaded(limit: usize) -> Response<Body> {
    let mut answer = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        format!(
            "the server holds its limit of {limit} connections (server.max_connections); \
             retry shortly, or reuse fewer connections per client"
        ),
    )
    .into_response();
    let headers = answer.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_bad_values_are_named() {
        let edge = Edge::default();
        assert_eq!(edge.header_timeout, Duration::from_secs(30));
        assert_eq!(edge.drain_timeout, Duration::from_secs(10));
        let bad = ServerConfig {
            header_timeout: "soon".into(),
            body_timeout: "0s".into(),
            max_connections: 0,
            ..ServerConfig::default()
        };
        let problems = bad.edge().unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("server.header_timeout"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("server.body_timeout"),
            "{problems:?}"
        );
        assert!(
            problems[2].starts_with("server.max_connections"),
            "{problems:?}"
        );
    }
}

//! How `serve` holds its connections: the accept loop, the per-connection timeouts, the
//! bound on open connections and the drain with a deadline (the `[server]` section,
//! [`ServerLimits`]).
//!
//! axum's own `serve` reads headers and bodies without a deadline and, on shutdown, waits
//! for every connection to finish however long it takes: a client holding half-sent
//! headers kept SIGTERM from ever completing. Here hyper serves each connection with a
//! header read timeout (which also closes idle keep-alive connections, since hyper starts
//! it whenever it waits for the next request), the router bounds the time between body
//! chunks ([`super::router`]), at [`ServerLimits::max_connections`] the idlest connection
//! makes room for a new one and one address holds at most its share (`held`), a
//! connection the server closes lingers to discard what the client still sends so it
//! reads the answer (`linger`), and a shutdown stops accepting, lets each connection
//! finish the request it is serving, and closes whatever is still open after
//! [`ServerLimits::drain_timeout`]. The answers hyper writes itself to requests it cannot parse
//! get the contract's error body on the way out ([`malformed`]).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
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
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::admission::AdmissionLimits;
use crate::api::ApiError;
use crate::metrics::ConnectionMetrics;
use held::{Connections, Refused};
use linger::Linger;
use malformed::ErrorBodies;

mod held;
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
    /// Connections served at once. At the bound the connection idle longest is closed to
    /// make room for a new one; only when every connection is answering a request is the
    /// new one answered `503 overloaded` and closed. Default 1024.
    pub max_connections: usize,
    /// Connections one client address may hold (trusted proxies excepted): past it, that
    /// address's own idlest connection makes room, or the new one is refused, so one
    /// client cannot hold every slot. Default half of `max_connections`. A reverse proxy
    /// in front of the server is one address: list it in `trusted_proxies`.
    pub max_connections_per_address: Option<usize>,
    /// Addresses or networks (`"10.0.0.0/8"`, `"127.0.0.1"`) of reverse proxies that
    /// terminate TLS in front of the server: a request through one is taken to come from
    /// the last address its `X-Forwarded-For` names before the trusted proxies, and to
    /// have arrived over the scheme its `X-Forwarded-Proto` names (so the dashboard's
    /// cookie is `Secure`). Headers from any other address are ignored. Default none.
    pub trusted_proxies: Vec<String>,
    /// Recalls and knowledge searches being answered at once; one more waits for a slot
    /// (`queue_wait`, `max_queued`). Default 2 per core, what the runtime ranks at once:
    /// more in flight only queue inside the runtime, where an unlucky one waits behind
    /// all the others instead of first come, first served.
    pub max_recalls: usize,
    /// Writes (events, feedback, condense, status changes) being answered at once; one
    /// more waits for a slot (`write_queue_wait`). Default 2 per core, like recalls: each
    /// write's work (and the indexing it causes) takes the same cores recall ranks on, and
    /// with more in flight a write flood at saturation starves recall (docs/configuration.md,
    /// "Admission and connections").
    pub max_writes: usize,
    /// How long a recall (or knowledge search, graph walk) past its slots may wait for one;
    /// a request that cannot expect a slot within it (the requests ahead of it times the
    /// time a slot is held, over the slots) is answered `503 overloaded` at once, with the
    /// expected wait (`crate::admission`). `"0s"` refuses at once, without waiting.
    /// Default `"50ms"`: with 200 clients saturating, admitted recalls' p99 stays within a
    /// few tens of milliseconds, and a burst of good clients still waits its turn.
    pub queue_wait: String,
    /// The same for writes, which a client would rather have late than refused (a bulk
    /// load sends many at once). Default `"2s"`.
    pub write_queue_wait: String,
    /// Requests of one class waiting for a slot at most; one more is answered
    /// `503 overloaded` at once. Default 1024.
    pub max_queued: usize,
    /// Run the thread that reads requests and answers refusals at real-time priority
    /// (`SCHED_FIFO`, the lowest level; Linux, with `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`
    /// of at least 1). On a saturated machine a woken thread of normal priority waits for
    /// a scheduler tick, and a refusal that should take microseconds waits milliseconds
    /// (docs/benchmarks.md has the measured difference). The thread only parses requests and moves bytes,
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
            max_connections_per_address: None,
            trusted_proxies: Vec::new(),
            max_recalls: 2 * cores(),
            max_writes: 2 * cores(),
            queue_wait: "50ms".into(),
            write_queue_wait: "2s".into(),
            max_queued: 1024,
            edge_realtime: false,
        }
    }
}

impl ServerConfig {
    /// The settings checked and parsed; every problem is listed, each naming its key.
    pub fn limits(&self) -> Result<ServerLimits, Vec<String>> {
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
        let edge = ServerLimits {
            header_timeout: duration("header_timeout", &self.header_timeout),
            body_timeout: duration("body_timeout", &self.body_timeout),
            drain_timeout: duration("drain_timeout", &self.drain_timeout),
            request_timeout: duration("request_timeout", &self.request_timeout),
            max_connections: self.max_connections,
            max_connections_per_address: self
                .max_connections_per_address
                .unwrap_or(self.max_connections / 2)
                .max(1),
            trusted_proxies: match Proxies::parse(&self.trusted_proxies) {
                Ok(p) => p,
                Err(e) => {
                    problems.push(e);
                    Proxies::default()
                }
            },
            max_recalls: self.max_recalls,
            max_writes: self.max_writes,
            queue_wait: wait("queue_wait", &self.queue_wait, &mut problems),
            write_queue_wait: wait("write_queue_wait", &self.write_queue_wait, &mut problems),
            max_queued: self.max_queued,
            linger_bytes: MIN_LINGER_BYTES,
            realtime: self.edge_realtime,
        };
        for (key, value, default) in [
            ("max_connections", self.max_connections, 1024),
            ("max_recalls", self.max_recalls, 2 * cores()),
            ("max_writes", self.max_writes, 2 * cores()),
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

/// An admission wait (`queue_wait`, `write_queue_wait`): any duration, zero included.
fn wait(key: &str, text: &str, problems: &mut Vec<String>) -> Duration {
    humantime::parse_duration(text.trim()).unwrap_or_else(|e| {
        problems.push(format!(
            "server.{key} = {text:?} is not a duration ({e}); write it like \"100ms\", or \
             \"0s\" to refuse at once"
        ));
        Duration::ZERO
    })
}

/// The cores this process may use (1 when the system will not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Reverse proxies whose forwarding headers are believed (`[server] trusted_proxies`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies(Arc<[(std::net::IpAddr, u8)]>);

impl Proxies {
    /// Parses addresses and networks (`a.b.c.d`, `a.b.c.d/n`, IPv6 alike); the error
    /// names the entry.
    pub fn parse(entries: &[String]) -> Result<Proxies, String> {
        let mut nets = Vec::with_capacity(entries.len());
        for entry in entries {
            let bad = || {
                format!(
                    "server.trusted_proxies: {entry:?} is not an address or a network; write \
                     e.g. \"10.0.0.5\" or \"10.0.0.0/8\""
                )
            };
            let (addr, bits) = match entry.trim().split_once('/') {
                Some((a, n)) => (a, Some(n.parse::<u8>().map_err(|_| bad())?)),
                None => (entry.trim(), None),
            };
            let ip: std::net::IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits = bits.unwrap_or(max);
            if bits > max {
                return Err(bad());
            }
            nets.push((ip, bits));
        }
        Ok(Proxies(nets.into()))
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        self.0.iter().any(|&(net, bits)| in_net(ip, net, bits))
    }

    /// Whether any proxy is trusted.
    pub fn any(&self) -> bool {
        !self.0.is_empty()
    }
}

/// Who sent a request, as far as the server can tell: the connection's address, or, through
/// a trusted proxy, the client address and scheme the proxy forwarded. Every request served
/// by [`serve_connections`] carries one in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's address (the throttle and the connection share count it).
    pub ip: std::net::IpAddr,
    /// Whether it reached the proxy over HTTPS (`X-Forwarded-Proto: https`).
    pub https: bool,
}

impl Client {
    /// The client of a request that arrived from `peer`: `peer` itself unless it is a
    /// trusted proxy, in which case the last address of `X-Forwarded-For` that is not a
    /// trusted proxy (the nearest untrusted hop: whatever a client wrote before it cannot be
    /// believed) and the scheme of the last `X-Forwarded-Proto`.
    pub fn of(peer: std::net::IpAddr, headers: &header::HeaderMap, trusted: &Proxies) -> Client {
        if !trusted.contains(peer) {
            return Client {
                ip: peer,
                https: false,
            };
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut ip = peer;
        for hop in hops.iter().rev() {
            let Ok(hop) = hop.parse::<std::net::IpAddr>() else {
                break;
            };
            ip = hop;
            if !trusted.contains(hop) {
                break;
            }
        }
        let https = headers
            .get_all("x-forwarded-proto")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .next_back()
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"));
        Client { ip, https }
    }
}

/// Whether `ip` lies in `net`/`bits` (an IPv4-mapped IPv6 address counts as its IPv4).
fn in_net(ip: std::net::IpAddr, net: std::net::IpAddr, bits: u8) -> bool {
    use std::net::IpAddr::{V4, V6};
    let ip = match ip {
        V6(v6) => v6.to_ipv4_mapped().map_or(ip, V4),
        v4 => v4,
    };
    match (ip, net) {
        (V4(a), V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (V6(a), V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// How the server treats connections (see [`ServerConfig`] for each setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
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
    /// Connections one client address holds at most.
    pub max_connections_per_address: usize,
    /// Reverse proxies whose forwarding headers are believed.
    pub trusted_proxies: Proxies,
    /// Recalls and knowledge searches answered at once.
    pub max_recalls: usize,
    /// Writes answered at once.
    pub max_writes: usize,
    /// Longest wait for a recall's admission slot.
    pub queue_wait: Duration,
    /// Longest wait for a write's admission slot.
    pub write_queue_wait: Duration,
    /// Requests of one class waiting for a slot at most.
    pub max_queued: usize,
    /// Bytes a closing connection reads and discards at most, so the client sees an answer
    /// given before its body was read ([`ServerLimits::lingering_for`], `listen/linger.rs`).
    pub linger_bytes: u64,
    /// The connections' thread asks for real-time priority ([`raise_to_realtime`]).
    pub realtime: bool,
}

/// What a closing connection discards at least: a client's body well past the usual
/// limits still gets its `413`.
const MIN_LINGER_BYTES: u64 = 64 << 20;

impl ServerLimits {
    /// What admission works by.
    pub(crate) fn admission(&self) -> AdmissionLimits {
        AdmissionLimits {
            max_recalls: self.max_recalls,
            max_writes: self.max_writes,
            max_queued: self.max_queued,
            queue_wait: self.queue_wait,
            write_queue_wait: self.write_queue_wait,
        }
    }

    /// This edge, discarding up to the larger of 4× `body_limit` and 64 MiB of what a
    /// client still sends when its connection closes.
    pub fn lingering_for(self, body_limit: usize) -> ServerLimits {
        ServerLimits {
            linger_bytes: (4 * body_limit as u64).max(MIN_LINGER_BYTES),
            ..self
        }
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerConfig::default()
            .limits()
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
    edge: ServerLimits,
    counts: ConnectionMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Drained {
    let held = Connections::new(
        edge.max_connections,
        edge.max_connections_per_address,
        edge.trusted_proxies.clone(),
    );
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
                let mut stop = stop_rx.clone();
                let (held, app, builder, counts) = (held.clone(), app.clone(), builder.clone(), counts.clone());
                let trusted = edge.trusted_proxies.clone();
                let (limits, linger_bytes, header_timeout) =
                    ((edge.max_connections, edge.max_connections_per_address), edge.linger_bytes, edge.header_timeout);
                connections.spawn(async move {
                    let place = match held.admit(peer.map(|p| p.ip())).await {
                        Ok(place) => place,
                        Err(why) => {
                            // Answered at once, never queued; it may have sent a body.
                            counts.refused.inc();
                            let linger = Arc::new(AtomicBool::new(true));
                            let io = TokioIo::new(ErrorBodies::new(Linger::new(stream, linger_bytes, linger)));
                            let mut refusal = http1::Builder::new();
                            refusal
                                .timer(TokioTimer::new())
                                .header_read_timeout(header_timeout)
                                .keep_alive(false);
                            let conn = refusal.serve_connection(
                                io,
                                hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                                    std::future::ready(Ok::<_, Infallible>(overloaded(why, limits)))
                                }),
                            );
                            let _ = conn.await;
                            return;
                        }
                    };
                    let this = place.held.clone();
                    let io = TokioIo::new(ErrorBodies::new(Linger::new(
                        stream,
                        linger_bytes,
                        this.linger.clone(),
                    )));
                    let (starts, follows) = (this.clone(), this.clone());
                    // Handlers see the client's address (`ConnectInfo`), as under axum's own
                    // `serve`: failed authentication is counted by it.
                    let app = app
                        .map_request(move |mut req: Request<hyper::body::Incoming>| {
                            starts.start();
                            if let Some(peer) = peer {
                                let client = Client::of(peer.ip(), req.headers(), &trusted);
                                req.extensions_mut().insert(ConnectInfo(peer));
                                req.extensions_mut().insert(client);
                            }
                            req
                        })
                        .map_response(move |answer| follows.follow(answer));
                    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
                    counts.open.inc();
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        () = this.evicted() => {
                            // Idle, and its slot is wanted: closed at once.
                            counts.evicted.inc();
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                        () = async { let _ = stop.wait_for(|s| *s).await; } => {
                            // Finish the request being served, close when idle.
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                    drop(place);
                    counts.open.dec();
                });
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

/// The answer to a connection past the bound (`limits`: `max_connections` and
/// `max_connections_per_address`).
fn overloaded(why: Refused, limits: (usize, usize)) -> Response<Body> {
    let message = match why {
        Refused::Full => format!(
            "the server holds its limit of {} connections (server.max_connections), every \
             one answering a request; retry shortly",
            limits.0
        ),
        Refused::Share => format!(
            "this client address holds its share of {} connections \
             (server.max_connections_per_address), every one answering a request; retry \
             shortly, or reuse fewer connections",
            limits.1
        ),
    };
    let mut answer =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message).into_response();
    let headers = answer.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_headers_count_only_from_a_trusted_proxy() {
        let proxies = Proxies::parse(&["10.0.0.0/8".into(), "::1".into()]).unwrap();
        let mut h = header::HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "6.6.6.6, 203.0.113.7, 10.1.2.3".parse().unwrap(),
        );
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // Through the trusted proxy: the nearest untrusted hop, not what the client wrote.
        let c = Client::of(ip("10.0.0.5"), &h, &proxies);
        assert_eq!((c.ip, c.https), (ip("203.0.113.7"), true));
        // From anyone else, the headers are ignored.
        let c = Client::of(ip("192.0.2.1"), &h, &proxies);
        assert_eq!((c.ip, c.https), (ip("192.0.2.1"), false));
        assert!(proxies.contains(ip("::ffff:10.9.9.9")));
        assert!(!proxies.contains(ip("11.0.0.1")));
        for bad in ["10.0.0.0/33", "proxy.example", "10.0.0/8"] {
            assert!(Proxies::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_defaults_are_valid_and_bad_values_are_named() {
        let edge = ServerLimits::default();
        assert_eq!(edge.header_timeout, Duration::from_secs(30));
        assert_eq!(edge.drain_timeout, Duration::from_secs(10));
        let bad = ServerConfig {
            header_timeout: "soon".into(),
            body_timeout: "0s".into(),
            max_connections: 0,
            ..ServerConfig::default()
        };
        let problems = bad.limits().unwrap_err();
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

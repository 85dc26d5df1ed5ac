//! The connections being served, as the accept loop sees them: whose each one is (its client
//! address), whether it is answering a request or idle and since when, and how to ask it to
//! close.
//!
//! At `[server] max_connections` a new connection does not get `503` while others merely
//! sit idle: the connection idle longest is closed to make room (as nginx and HAProxy do
//! with keep-alive connections), and only when every connection is answering a request is
//! the new one refused. One client address holds at most `max_connections_per_address`
//! (trusted proxies excepted): past it, that address's own idlest connection makes room, or
//! the new one is refused; so one client cannot take every slot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Response, header};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How long a new connection waits for an evicted one to let go of its slot.
const EVICTION_WAIT: Duration = Duration::from_millis(500);

/// One connection being served.
pub(crate) struct HeldConnection {
    id: u64,
    ip: Option<IpAddr>,
    /// Requests being answered (their answers not yet written in full).
    busy: AtomicUsize,
    /// When it last became idle (or was accepted).
    idle_since: Mutex<Instant>,
    /// Asked to close to make room.
    evicted: AtomicBool,
    close: Notify,
    /// Its last answer closes it with a body possibly unread: close lingering.
    pub(crate) linger: Arc<AtomicBool>,
}

impl HeldConnection {
    /// A request arrived.
    pub(crate) fn start(&self) {
        self.busy.fetch_add(1, Ordering::AcqRel);
    }

    /// An answer was written in full (or dropped).
    fn finish(&self) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.busy.fetch_sub(1, Ordering::AcqRel);
    }

    /// Waits until the connection is asked to close.
    pub(crate) async fn evicted(&self) {
        let asked = self.close.notified();
        if self.evicted.load(Ordering::Acquire) {
            return;
        }
        asked.await;
    }

    /// Follows `answer` through to its last byte: the connection is busy until then, and
    /// an answer that closes the connection makes it linger.
    pub(crate) fn follow(self: &Arc<Self>, answer: Response<Body>) -> Response<Body> {
        let closes = answer
            .headers()
            .get(header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        if closes {
            self.linger.store(true, Ordering::Release);
        }
        let done = Done(self.clone());
        answer.map(|body| Body::new(Followed { body, _done: done }))
    }
}

/// Marks its connection idle when dropped, with the answer's body.
struct Done(Arc<HeldConnection>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// An answer's body, with the mark that its connection is idle again once it is written.
struct Followed {
    body: Body,
    _done: Done,
}

impl HttpBody for Followed {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Why a new connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every one of `max_connections` is answering a request.
    Full,
    /// Its address holds its share, every one of them answering a request.
    Share,
}

/// The connections being served and their slots.
pub(crate) struct Connections {
    slots: Arc<Semaphore>,
    per_address: usize,
    trusted: super::Proxies,
    inner: Mutex<Inner>,
    /// A connection let go of its slot.
    freed: Notify,
}

#[derive(Default)]
struct Inner {
    next: u64,
    held: HashMap<u64, Arc<HeldConnection>>,
    per_ip: HashMap<IpAddr, usize>,
}

/// A connection's place: its slot and its entry, both given back when dropped.
pub(crate) struct ConnectionPlace {
    /// Taken (given back) before the waiters are woken, so the one woken finds it free.
    slot: Option<OwnedSemaphorePermit>,
    pub(crate) held: Arc<HeldConnection>,
    connections: Arc<Connections>,
}

impl Drop for ConnectionPlace {
    fn drop(&mut self) {
        {
            let mut inner = self
                .connections
                .inner
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            inner.held.remove(&self.held.id);
            if let Some(ip) = self.held.ip
                && let Some(n) = inner.per_ip.get_mut(&ip)
            {
                *n -= 1;
                if *n == 0 {
                    inner.per_ip.remove(&ip);
                }
            }
        }
        drop(self.slot.take());
        self.connections.freed.notify_waiters();
    }
}

impl Connections {
    pub(crate) fn new(max: usize, per_address: usize, trusted: super::Proxies) -> Arc<Self> {
        Arc::new(Connections {
            slots: Arc::new(Semaphore::new(max)),
            per_address,
            trusted,
            inner: Mutex::new(Inner::default()),
            freed: Notify::new(),
        })
    }

    /// Connections being served now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held
            .len()
    }

    /// A place for a new connection from `ip`, making room by closing an idle one if need
    /// be (module doc); `Refused` when every connection that could make room is busy.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        ip: Option<IpAddr>,
    ) -> Result<ConnectionPlace, Refused> {
        let shared = ip.filter(|ip| !self.trusted.contains(*ip));
        let deadline = tokio::time::Instant::now() + EVICTION_WAIT;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let over_share = shared.is_some_and(|ip| {
                    inner.per_ip.get(&ip).copied().unwrap_or(0) >= self.per_address
                });
                if over_share {
                    if !evict_idlest(&inner, shared) {
                        return Err(Refused::Share);
                    }
                } else if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                    return Ok(self.register(&mut inner, slot, ip));
                } else if !evict_idlest(&inner, None) {
                    return Err(Refused::Full);
                }
            }
            // An idle connection was asked to close: wait for it to let go.
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(Refused::Full);
            }
        }
    }

    fn register(
        self: &Arc<Self>,
        inner: &mut Inner,
        slot: OwnedSemaphorePermit,
        ip: Option<IpAddr>,
    ) -> ConnectionPlace {
        inner.next += 1;
        let held = Arc::new(HeldConnection {
            id: inner.next,
            ip,
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evicted: AtomicBool::new(false),
            close: Notify::new(),
            linger: Arc::new(AtomicBool::new(false)),
        });
        inner.held.insert(held.id, held.clone());
        if let Some(ip) = ip {
            *inner.per_ip.entry(ip).or_default() += 1;
        }
        ConnectionPlace {
            slot: Some(slot),
            held,
            connections: self.clone(),
        }
    }
}

/// Asks the connection idle longest (of `ip`, when given) to close; `false` when every
/// such connection is answering a request or already asked.
fn evict_idlest(inner: &Inner, ip: Option<IpAddr>) -> bool {
    let idlest = inner
        .held
        .values()
        .filter(|h| ip.is_none() || h.ip == ip)
        .filter(|h| h.busy.load(Ordering::Acquire) == 0 && !h.evicted.load(Ordering::Acquire))
        .min_by_key(|h| *h.idle_since.lock().unwrap_or_else(|p| p.into_inner()));
    match idlest {
        Some(h) => {
            h.evicted.store(true, Ordering::Release);
            h.close.notify_one();
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[tokio::test]
    async fn at_the_bound_the_idlest_connection_makes_room_and_busy_ones_never_do() {
        let c = Connections::new(2, 10, super::super::Proxies::default());
        let a = c.admit(ip("10.0.0.1")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let b = c.admit(ip("10.0.0.2")).await.unwrap();
        b.held.start();
        // `a` is idle: asked to close; it lets go when its task ends.
        let closer = {
            let held = a.held.clone();
            tokio::spawn(async move {
                held.evicted().await;
                drop(a);
            })
        };
        let third = c.admit(ip("10.0.0.3")).await.expect("room was made");
        closer.await.unwrap();
        assert_eq!(c.open(), 2);
        // Now both are busy: the next is refused.
        third.held.start();
        assert_eq!(c.admit(ip("10.0.0.4")).await.err(), Some(Refused::Full));
    }

    #[tokio::test]
    async fn one_address_holds_its_share_and_a_trusted_proxy_is_not_counted() {
        let proxies = super::super::Proxies::parse(&["10.9.0.0/16".to_string()]).unwrap();
        let c = Connections::new(100, 2, proxies);
        let one = c.admit(ip("10.0.0.1")).await.unwrap();
        let two = c.admit(ip("10.0.0.1")).await.unwrap();
        one.held.start();
        two.held.start();
        assert_eq!(c.admit(ip("10.0.0.1")).await.err(), Some(Refused::Share));
        // Another address is not held back, nor is a proxy.
        let _other = c.admit(ip("10.0.0.2")).await.unwrap();
        let mut via_proxy = Vec::new();
        for _ in 0..5 {
            via_proxy.push(c.admit(ip("10.9.3.4")).await.unwrap());
        }
    }
}

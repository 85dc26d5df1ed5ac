//! Seals under the cluster secret: what one node tells another over NATS carries an
//! HMAC-SHA256 (RFC 2104, ring's implementation) under a secret only the nodes hold, so a
//! NATS user that is not a node — or one that stole a node's NATS credential but not the
//! secret — can neither forge nor alter a forwarded identity, an answer, a log entry, a
//! sign-in, a policy ask or a partition's snapshot. NATS's own TLS and permissions keep the traffic private and
//! decide who may publish where; the seals decide what a node believes.
//!
//! Every seal names its kind (a domain such as `request` or `log`) and the context it is
//! bound to (a request's nonce, a log entry's stream and position), each length-prefixed,
//! so a seal made for one purpose or place never verifies for another. A sealed message is
//! its 32-byte tag followed by the body, and the tag is checked before the body is decoded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use subtle::ConstantTimeEq;

/// The tag's length (HMAC-SHA256).
pub(super) const TAG: usize = 32;

/// The fewest bytes a cluster secret may have.
pub(super) const MIN_SECRET: usize = 32;

/// What a seal is for; a tag made for one kind never verifies as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A forwarded request with the identity the front verified.
    Request,
    /// The owner's answer to a forwarded request.
    Answer,
    /// An entry of a partition's write log.
    Log,
    /// A dashboard sign-in kept in the shared bucket.
    SignIn,
    /// An ask sent to every node (a policy reload, a status).
    Ask,
    /// A node's answer to an ask.
    Reply,
    /// A partition's snapshot in the object store.
    Snapshot,
}

impl Kind {
    fn domain(self) -> &'static [u8] {
        match self {
            Kind::Request => b"shadowbrain/cluster/request/v1",
            Kind::Answer => b"shadowbrain/cluster/answer/v1",
            Kind::Log => b"shadowbrain/cluster/log/v1",
            Kind::SignIn => b"shadowbrain/cluster/sign-in/v1",
            Kind::Ask => b"shadowbrain/cluster/ask/v1",
            Kind::Reply => b"shadowbrain/cluster/reply/v1",
            Kind::Snapshot => b"shadowbrain/cluster/snapshot/v1",
        }
    }
}

/// A message whose seal did not verify: it was not made by a node holding the secret, or
/// it was altered, or it was made for another purpose or place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refused(pub(super) Kind);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a {:?} message without a valid seal of the cluster secret (sent by something \
             that is not a node of this cluster, or by a node with another secret)",
            self.0
        )
    }
}

/// Seals and checks under one cluster secret.
pub(super) struct Sealer {
    key: hmac::Key,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub(super) fn new(secret: &[u8]) -> Self {
        Sealer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    fn tag(&self, kind: Kind, context: &[&[u8]], body: &[u8]) -> hmac::Tag {
        let mut mac = hmac::Context::with_key(&self.key);
        let mut part = |bytes: &[u8]| {
            mac.update(&(bytes.len() as u64).to_be_bytes());
            mac.update(bytes);
        };
        part(kind.domain());
        for c in context {
            part(c);
        }
        part(body);
        mac.sign()
    }

    /// `body` with its tag in front.
    pub(super) fn seal(&self, kind: Kind, context: &[&[u8]], body: &[u8]) -> Vec<u8> {
        let tag = self.tag(kind, context, body);
        let mut out = Vec::with_capacity(TAG + body.len());
        out.extend_from_slice(tag.as_ref());
        out.extend_from_slice(body);
        out
    }

    /// The body of a sealed message, once its tag verified.
    pub(super) fn open<'a>(
        &self,
        kind: Kind,
        context: &[&[u8]],
        sealed: &'a [u8],
    ) -> Result<&'a [u8], Refused> {
        let (tag, body) = sealed.split_at_checked(TAG).ok_or(Refused(kind))?;
        self.verify(kind, context, body, tag).map(|()| body)
    }

    /// The tag of `body` alone, hex (for a header).
    pub(super) fn sign_hex(&self, kind: Kind, context: &[&[u8]], body: &[u8]) -> String {
        crate::auth::hex(self.tag(kind, context, body).as_ref())
    }

    /// Checks a hex tag made by [`Sealer::sign_hex`].
    pub(super) fn verify_hex(
        &self,
        kind: Kind,
        context: &[&[u8]],
        body: &[u8],
        tag: &str,
    ) -> Result<(), Refused> {
        let bytes = unhex(tag).ok_or(Refused(kind))?;
        self.verify(kind, context, body, &bytes)
    }

    fn verify(
        &self,
        kind: Kind,
        context: &[&[u8]],
        body: &[u8],
        tag: &[u8],
    ) -> Result<(), Refused> {
        let expected = self.tag(kind, context, body);
        // Constant time: how much of a guess matched must not show in how long it took.
        match bool::from(expected.as_ref().ct_eq(tag)) {
            true => Ok(()),
            false => Err(Refused(kind)),
        }
    }
}

/// 32 bytes (a tag, a SHA-256) from 64 hex digits.
pub(super) fn unhex(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if text.len() != 2 * TAG {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// How far a request's issue time may be from the receiver's clock: NTP keeps nodes far
/// closer; a sealed request older than this is refused, so a captured one cannot be
/// replayed later.
pub(super) const FRESH_FOR: Duration = Duration::from_secs(60);

/// The nonces of the sealed requests seen within [`FRESH_FOR`]: a sealed request is
/// answered once, however often it is sent again on the wire.
#[derive(Debug, Default)]
pub(super) struct SeenNonces {
    seen: Mutex<HashMap<[u8; 16], u64>>,
}

/// Nonces remembered at most before the expired ones are dropped.
const NONCES_KEPT: usize = 1 << 20;

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// 16 random bytes.
pub(super) fn nonce() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    // The operating system's generator; without it no nonce would be unpredictable.
    getrandom::fill(&mut bytes).expect("the operating system's random generator failed");
    bytes
}

impl SeenNonces {
    /// Whether a request issued at `issued` (ms) with `nonce` is fresh and new; it is then
    /// remembered, so the same one is refused next time.
    pub(super) fn admit(&self, nonce: [u8; 16], issued: u64, now: u64) -> Result<(), String> {
        let window = FRESH_FOR.as_millis() as u64;
        if issued.abs_diff(now) > window {
            return Err(format!(
                "the request was sealed {} s from this node's clock, past the {} s allowed; \
                 are the nodes' clocks synchronised (NTP)?",
                issued.abs_diff(now) / 1000,
                FRESH_FOR.as_secs()
            ));
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= NONCES_KEPT {
            seen.retain(|_, at| at.abs_diff(now) <= window);
        }
        match seen.insert(nonce, issued) {
            None => Ok(()),
            Some(_) => Err("the same sealed request was sent again (a replay)".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_verifies_only_for_its_kind_context_body_and_secret() {
        let a = Sealer::new(&[7; 32]);
        let sealed = a.seal(Kind::Request, &[b"sb.rpc.001", b"n1"], b"body");
        assert_eq!(
            a.open(Kind::Request, &[b"sb.rpc.001", b"n1"], &sealed),
            Ok(&b"body"[..])
        );
        // Another kind, place, split of the context, body or secret: refused.
        assert!(
            a.open(Kind::Answer, &[b"sb.rpc.001", b"n1"], &sealed)
                .is_err()
        );
        assert!(
            a.open(Kind::Request, &[b"sb.rpc.002", b"n1"], &sealed)
                .is_err()
        );
        assert!(
            a.open(Kind::Request, &[b"sb.rpc.001n", b"1"], &sealed)
                .is_err()
        );
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(
            a.open(Kind::Request, &[b"sb.rpc.001", b"n1"], &altered)
                .is_err()
        );
        let b = Sealer::new(&[8; 32]);
        assert!(
            b.open(Kind::Request, &[b"sb.rpc.001", b"n1"], &sealed)
                .is_err()
        );
        assert!(a.open(Kind::Request, &[], b"short").is_err());

        let tag = a.sign_hex(Kind::Log, &[b"sb.log.001", b"41"], b"entry");
        assert!(
            a.verify_hex(Kind::Log, &[b"sb.log.001", b"41"], b"entry", &tag)
                .is_ok()
        );
        assert!(
            a.verify_hex(Kind::Log, &[b"sb.log.001", b"42"], b"entry", &tag)
                .is_err()
        );
        assert!(
            a.verify_hex(Kind::Log, &[b"sb.log.001", b"41"], b"entry", "zz")
                .is_err()
        );
    }

    #[test]
    fn a_request_is_admitted_once_and_only_while_fresh() {
        let seen = SeenNonces::default();
        let now = 1_000_000_000;
        assert!(seen.admit([1; 16], now - 5_000, now).is_ok());
        let again = seen.admit([1; 16], now - 5_000, now).unwrap_err();
        assert!(again.contains("replay"), "{again}");
        let old = seen.admit([2; 16], now - 61_000, now).unwrap_err();
        assert!(old.contains("clocks"), "{old}");
        assert!(seen.admit([3; 16], now + 30_000, now).is_ok());
    }
}

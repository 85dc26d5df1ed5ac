//! The runtime clock. Recency, decay, condensation windows and purge ages all read a
//! [`Clock`], never `SystemTime::now()` directly, so a simulated month runs in seconds and a
//! run replays exactly. Time is [`Timestamp`]: milliseconds since the Unix epoch, UTC.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Milliseconds since the Unix epoch (UTC). Negative values are before 1970.
pub type Timestamp = i64;

/// Milliseconds in one day, the unit most policies think in.
pub const DAY_MS: i64 = 86_400_000;

/// A source of "now".
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The wall clock, for production.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        }
    }
}

/// A clock that moves only when told to, for simulations and tests.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicI64,
}

impl VirtualClock {
    /// A virtual clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        VirtualClock {
            now: AtomicI64::new(start),
        }
    }

    /// Jump to `t` (may go backwards: simulations sometimes rewind).
    pub fn set(&self, t: Timestamp) {
        self.now.store(t, Ordering::SeqCst);
    }

    /// Move forward by `d` and return the new time.
    pub fn advance(&self, d: Duration) -> Timestamp {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst).saturating_add(ms)
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        self.now.load(Ordering::SeqCst)
    }
}

/// Formats a timestamp as RFC 3339 (UTC, millisecond precision), e.g. `2026-11-29T17:04:13.000Z`.
pub fn to_rfc3339(t: Timestamp) -> String {
    match chrono::DateTime::from_timestamp_millis(t) {
        Some(dt) => dt.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        None => format!("@{t}ms"),
    }
}

/// Formats a timestamp as a short human date for prompts, e.g. `2023-05-08 13:56`.
pub fn to_human(t: Timestamp) -> String {
    match chrono::DateTime::from_timestamp_millis(t) {
        Some(dt) => dt.format("%Y-%m-%d %H:%M").to_string(),
        None => format!("@{t}ms"),
    }
}

/// Parses an RFC 3339 time (any offset) into a [`Timestamp`].
pub fn parse_rfc3339(field: &str, s: &str) -> Result<Timestamp> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|dt| dt.timestamp_millis())
        .map_err(|e| {
            Error::invalid(
                field,
                format!("`{s}` is not an RFC 3339 time ({e}); write e.g. `2026-05-08T13:56:00Z`"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_told() {
        let c = VirtualClock::new(1_000);
        assert_eq!(c.now(), 1_000);
        assert_eq!(c.advance(Duration::from_secs(2)), 3_000);
        assert_eq!(c.now(), 3_000);
        c.set(10);
        assert_eq!(c.now(), 10);
    }

    #[test]
    fn rfc3339_round_trips_and_rejects_garbage() {
        let t = parse_rfc3339("timestamp", "2023-05-08T13:56:00+02:00").unwrap();
        assert_eq!(to_rfc3339(t), "2023-05-08T11:56:00.000Z");
        let err = parse_rfc3339("timestamp", "8 May 2023").unwrap_err();
        assert!(err.to_string().contains("RFC 3339"), "{err}");
    }
}

//! The state the dashboard keeps beside the server's: sign-ins, the served counters'
//! samples the overview turns into rates, and insights recently computed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::signins::Logins;
use crate::Insights;

/// The dashboard's state (see the module docs), one per router.
pub(in crate::http) struct Ui {
    pub(super) logins: Arc<Logins>,
    pub(super) rates: Mutex<Samples>,
    pub(super) insights: Mutex<HashMap<String, Cached>>,
    /// Per namespace, held while its insights are computed: one computation at a time.
    pub(super) computing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) started: Instant,
}

impl Ui {
    pub(in crate::http) fn new(logins: Arc<Logins>) -> Self {
        Ui {
            logins,
            rates: Mutex::new(Samples::default()),
            insights: Mutex::new(HashMap::new()),
            computing: Mutex::new(HashMap::new()),
            started: Instant::now(),
        }
    }
}

/// Samples of the served counters older than this are dropped; rates are over it.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Served-counter samples, one at most per second, for rates over [`RATE_WINDOW`].
#[derive(Debug, Default)]
pub(super) struct Samples {
    ring: VecDeque<(Instant, u64, u64)>,
}

impl Samples {
    /// Events and recalls per second over the window (since `started` while the window
    /// has no older sample), and the seconds the rate is over.
    pub(super) fn rates(
        &mut self,
        now: Instant,
        served: (u64, u64),
        started: Instant,
    ) -> (f64, f64, f64) {
        if self
            .ring
            .back()
            .is_none_or(|(at, _, _)| now.duration_since(*at) >= Duration::from_secs(1))
        {
            self.ring.push_back((now, served.0, served.1));
        }
        // Keep one sample at or before the window's start, so the rate spans all of it.
        while self.ring.len() > 2 && now.duration_since(self.ring[1].0) >= RATE_WINDOW {
            self.ring.pop_front();
        }
        let (from, events, recalls) = match self.ring.front() {
            Some(&(at, e, r)) if now.duration_since(at) >= Duration::from_secs(1) => (at, e, r),
            _ => (started, 0, 0),
        };
        let secs = now.duration_since(from).as_secs_f64().max(1e-3);
        (
            served.0.saturating_sub(events) as f64 / secs,
            served.1.saturating_sub(recalls) as f64 / secs,
            secs,
        )
    }
}

/// Insights computed for one namespace.
pub(super) struct Cached {
    pub(super) insights: Arc<Insights>,
    pub(super) at: Instant,
    pub(super) took: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_span_the_window_and_start_from_the_first_view() {
        let start = Instant::now();
        let mut s = Samples::default();
        // First view, 10 s after start: the rate since start.
        let (e, r, over) = s.rates(start + Duration::from_secs(10), (100, 20), start);
        assert!((e - 10.0).abs() < 1e-9 && (r - 2.0).abs() < 1e-9 && (over - 10.0).abs() < 1e-9);
        // 10 s later: the rate between the two views.
        let (e, _, over) = s.rates(start + Duration::from_secs(20), (300, 20), start);
        assert!((e - 20.0).abs() < 1e-9 && (over - 10.0).abs() < 1e-9);
        // Two minutes on, with a view every 30 s: the rate over the last window only.
        for i in 1..=4 {
            s.rates(
                start + Duration::from_secs(20 + 30 * i),
                (300 + 30 * i, 20),
                start,
            );
        }
        let (e, _, over) = s.rates(start + Duration::from_secs(170), (450, 20), start);
        assert!(over <= 61.0, "{over}");
        assert!((e - 1.0).abs() < 1e-9, "{e}");
    }
}

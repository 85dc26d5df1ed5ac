//! Admission control: how many recalls and writes are answered at once, and what a request
//! past that does.
//!
//! Each class of work has its slots (`[server] max_recalls`, `max_writes`). A request that
//! finds them all taken waits for one, first come first served, while it can still be
//! answered within `[server] queue_wait`: it is refused at once, `503 overloaded`, only when
//! the queue is at its bound (`max_queued`) or the wait it can expect — the requests ahead
//! of it times the time a slot is held (a moving average), over the slots — is more than
//! half its wait (the other half is the estimate's margin), and it gives up with the same
//! answer when the wait runs out. So a burst of a few more requests than slots waits a few
//! milliseconds instead of being told to come back in a second, and only a server that is
//! really saturated sheds load, fast.
//!
//! Recalls come first: while any recall waits for a slot, a write that starts also takes
//! one of half the write slots, so writes keep at most half their share of the cores. An
//! agent waits for its recall before it can go on; a write is acknowledged within
//! `write_queue_wait` either way (docs/benchmarks.md, "Admission that waits", has the figures).
//!
//! A refusal says how long the wait would have been: `Retry-After` in whole seconds (what
//! HTTP allows, at least 1) and `retry_after_ms` in the error body.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::{ApiError, ApiResult};

/// The `[server]` settings admission works by (docs/configuration.md): the slots of each
/// class, the queue's bound and each class's longest wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdmissionLimits {
    /// Recalls and knowledge searches answered at once.
    pub(crate) max_recalls: usize,
    /// Writes answered at once.
    pub(crate) max_writes: usize,
    /// Requests of one class waiting for a slot at most.
    pub(crate) max_queued: usize,
    /// Longest wait for a recall's slot.
    pub(crate) queue_wait: Duration,
    /// Longest wait for a write's slot.
    pub(crate) write_queue_wait: Duration,
}

/// What an admitted request does, for [`Admission::enter`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum WorkClass {
    /// A recall, a knowledge search, or another read that ranks or walks many records.
    Recall,
    /// A write: events, feedback, condensation, a status change or an archive.
    Write,
}

/// Per class of work, the requests being answered at once and those waiting: `/v1` routes,
/// MCP tool calls and the dashboard's searches take their slots here, so all count against
/// the same limits.
pub(crate) struct Admission {
    recalls: Class,
    writes: Class,
    /// Half the write slots: what a write takes besides its slot while recalls wait.
    yielded: Arc<Semaphore>,
}

/// One class's slots, queue and the time a slot is held.
struct Class {
    /// `recalls` or `writes`, for the messages.
    what: &'static str,
    /// The setting that bounds its wait, for the messages.
    wait_setting: &'static str,
    slots: Arc<Semaphore>,
    limit: usize,
    /// Requests waiting for a slot now.
    waiting: AtomicUsize,
    max_queued: usize,
    max_wait: Duration,
    /// How long a slot is held, in microseconds: a moving average of the last few dozen,
    /// from [`FIRST_HOLD_US`].
    held_us: Arc<AtomicU64>,
}

/// An admission slot, held while the request is answered; dropping it frees the slot and
/// counts how long it was held.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    /// One of the write slots kept while recalls wait (see [`Admission::enter`]).
    _share: Option<OwnedSemaphorePermit>,
    since: Instant,
    held_us: Arc<AtomicU64>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let took = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        // An exponential moving average with weight 1/16: a few dozen requests, so one slow
        // answer moves it little and a change of load shows within milliseconds. It starts
        // from FIRST_HOLD_US, not from the first answer: the first recalls of a fresh
        // process are its slowest (memory touched for the first time), and one taken whole
        // would refuse the burst queued behind it.
        let _ = self
            .held_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
                Some(avg - avg / 16 + took / 16)
            });
    }
}

/// How long a slot is assumed to be held before any was, in microseconds: a fast recall.
const FIRST_HOLD_US: u64 = 2_000;

impl Class {
    fn new(
        what: &'static str,
        limit: usize,
        (wait_setting, max_wait): (&'static str, Duration),
        max_queued: usize,
    ) -> Class {
        Class {
            what,
            wait_setting,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            waiting: AtomicUsize::new(0),
            max_queued,
            max_wait,
            held_us: Arc::new(AtomicU64::new(FIRST_HOLD_US)),
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            _permit: permit,
            _share: None,
            since: Instant::now(),
            held_us: self.held_us.clone(),
        }
    }

    /// The wait a request can expect with `ahead` requests queued before it.
    fn expected_wait(&self, ahead: usize) -> Duration {
        let held = Duration::from_micros(self.held_us.load(Ordering::Relaxed));
        // Each slot frees once per hold; the request is served when `ahead + 1` have.
        held.mul_f64((ahead + 1) as f64 / self.limit as f64)
    }

    async fn enter(&self) -> ApiResult<Slot> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(self.slot(permit));
        }
        let ahead = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _leave = Leave(&self.waiting);
        let expected = self.expected_wait(ahead);
        if ahead >= self.max_queued {
            return Err(self.refusal(expected, "its queue is full"));
        }
        // Half the bound is kept for the estimate's error: it is an average, a stall (an
        // index commit) stretches every wait at once, and a request that waits out its
        // whole bound only to be refused pays the most for nothing (at saturation most
        // refusals were such timeouts, answered at 50 ms instead of at once).
        if expected.saturating_mul(2) > self.max_wait {
            return Err(self.refusal(expected, "the expected wait is more than half its bound"));
        }
        match tokio::time::timeout(self.max_wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(self.slot(permit)),
            // The semaphore is never closed; read it as a full queue all the same.
            Ok(Err(_)) => Err(self.refusal(expected, "its queue is closed")),
            Err(_) => Err(self.refusal(
                self.expected_wait(self.waiting.load(Ordering::Acquire)),
                "no slot freed within its bound",
            )),
        }
    }

    fn refusal(&self, wait: Duration, why: &str) -> ApiError {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        let (limit, what, wait_setting) = (self.limit, self.what, self.wait_setting);
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            format!(
                "the server is answering its limit of {limit} {what} at once \
                 (server.max_{what}) and {why} (server.{wait_setting}); the wait is about {ms} \
                 ms: retry after it"
            ),
        );
        // HTTP counts in whole seconds: the next one up, and never 0 (which means at once).
        e.retry_after = Some(ms.div_ceil(1000).max(1));
        e.retry_after_ms = Some(ms);
        e
    }
}

/// Leaves the queue when dropped (admitted, refused, or the request abandoned).
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub(crate) fn new(limits: AdmissionLimits) -> Self {
        Admission {
            recalls: Class::new(
                "recalls",
                limits.max_recalls,
                ("queue_wait", limits.queue_wait),
                limits.max_queued,
            ),
            writes: Class::new(
                "writes",
                limits.max_writes,
                ("write_queue_wait", limits.write_queue_wait),
                limits.max_queued,
            ),
            yielded: Arc::new(Semaphore::new((limits.max_writes / 2).max(1))),
        }
    }

    /// A slot for `work`, held until dropped, once one is free (see the module docs); or
    /// 503 `overloaded` with the expected wait. A write that starts while recalls wait for
    /// a slot also takes one of half the write slots: recalls come first at saturation.
    pub(crate) async fn enter(&self, work: WorkClass) -> ApiResult<Slot> {
        match work {
            WorkClass::Recall => self.recalls.enter().await,
            WorkClass::Write => {
                let started = Instant::now();
                let mut slot = self.writes.enter().await?;
                if self.recalls.waiting.load(Ordering::Acquire) > 0 {
                    let left = self.writes.max_wait.saturating_sub(started.elapsed());
                    match tokio::time::timeout(left, self.yielded.clone().acquire_owned()).await {
                        Ok(Ok(share)) => slot._share = Some(share),
                        _ => {
                            return Err(self.writes.refusal(
                                self.writes.expected_wait(self.writes.limit),
                                "recalls were waiting and no write slot freed within its bound",
                            ));
                        }
                    }
                }
                Ok(slot)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(slots: usize, queued: usize, wait_ms: u64) -> AdmissionLimits {
        AdmissionLimits {
            max_recalls: slots,
            max_writes: 4,
            write_queue_wait: Duration::from_millis(wait_ms),
            max_queued: queued,
            queue_wait: Duration::from_millis(wait_ms),
        }
    }

    #[tokio::test]
    async fn a_burst_past_the_slots_waits_and_is_served_in_turn() {
        let admission = Arc::new(Admission::new(edge(2, 64, 1_000)));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let a = admission.clone();
            tasks.push(tokio::spawn(async move {
                let slot = a.enter(WorkClass::Recall).await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
                Ok::<_, ApiError>(())
            }));
        }
        for t in tasks {
            t.await
                .unwrap()
                .expect("every request of the burst is admitted");
        }
        assert_eq!(admission.recalls.waiting.load(Ordering::Acquire), 0);
        let held = admission.recalls.held_us.load(Ordering::Relaxed);
        // From FIRST_HOLD_US (2 ms) toward the 5 ms each held, a sixteenth per answer.
        assert!(held >= 3_000, "the hold time is learned: {held} µs");
    }

    #[tokio::test]
    async fn while_recalls_wait_writes_keep_half_their_slots() {
        let edge = AdmissionLimits {
            max_recalls: 1,
            max_writes: 4,
            max_queued: 64,
            queue_wait: Duration::from_secs(5),
            write_queue_wait: Duration::from_millis(100),
        };
        let admission = Arc::new(Admission::new(edge));
        let writes = |n: usize| {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let a = admission.clone();
                    tokio::spawn(async move { a.enter(WorkClass::Write).await })
                })
                .collect();
            async move {
                let mut answers = Vec::new();
                for t in tasks {
                    answers.push(t.await.unwrap());
                }
                answers
            }
        };
        // Nobody waits for a recall: writes take all four slots.
        let all = writes(4).await;
        assert!(all.iter().all(Result::is_ok), "four writes, four slots");
        drop(all);
        // One recall answered, one waiting for it.
        let answering = admission.enter(WorkClass::Recall).await.unwrap();
        let a = admission.clone();
        let waiting = tokio::spawn(async move { a.enter(WorkClass::Recall).await.map(drop) });
        while admission.recalls.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let tries = writes(4).await;
        let admitted = tries.iter().filter(|t| t.is_ok()).count();
        assert_eq!(admitted, 2, "half the write slots while a recall waits");
        let refused = tries
            .into_iter()
            .find_map(Result::err)
            .expect("two refused");
        assert_eq!(refused.code(), "overloaded");
        assert!(
            refused.message().contains("recalls were waiting"),
            "{}",
            refused.message()
        );
        drop(answering);
        waiting
            .await
            .unwrap()
            .expect("the waiting recall is served");
    }

    #[tokio::test]
    async fn one_slow_first_answer_does_not_refuse_the_burst_behind_it() {
        // A fresh process's first recall is its slowest; taken whole as the hold time, it
        // would make three waiting requests look like a 60 ms wait against a 50 ms bound.
        let admission = Admission::new(edge(4, 64, 50));
        let slot = admission.enter(WorkClass::Recall).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        drop(slot);
        let expected = admission.recalls.expected_wait(3);
        assert!(
            expected < Duration::from_millis(20),
            "one slow answer moved the expected wait to {expected:?}"
        );
    }

    #[tokio::test]
    async fn past_the_queue_bound_or_the_wait_it_is_refused_at_once_with_the_wait() {
        let admission = Admission::new(edge(1, 1, 50));
        let held = admission.enter(WorkClass::Recall).await.unwrap();
        // One may wait; it gives up when the wait runs out, saying so.
        let started = Instant::now();
        let waited = admission
            .enter(WorkClass::Recall)
            .await
            .err()
            .expect("refused");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(waited.code(), "overloaded");
        assert!(
            waited.message().contains("server.queue_wait"),
            "{}",
            waited.message()
        );
        // With one waiting, the next finds the queue full and is refused at once.
        let a = Arc::new(admission);
        let b = a.clone();
        let queued = tokio::spawn(async move { b.enter(WorkClass::Recall).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let started = Instant::now();
        let full = a.enter(WorkClass::Recall).await.err().expect("refused");
        assert!(started.elapsed() < Duration::from_millis(20));
        assert!(
            full.message().contains("queue is full"),
            "{}",
            full.message()
        );
        assert_eq!(full.retry_after, Some(1));
        assert!(full.retry_after_ms.is_some_and(|ms| ms >= 1));
        drop(held);
        queued
            .await
            .unwrap()
            .expect("the waiting one gets the freed slot");
    }

    #[tokio::test]
    async fn a_wait_longer_than_the_budget_is_refused_without_waiting() {
        let admission = Admission::new(edge(1, 64, 50));
        // Slots are held 200 ms: one ahead means about 200 ms, past the 50 ms budget.
        admission.recalls.held_us.store(200_000, Ordering::Relaxed);
        let _held = admission.enter(WorkClass::Recall).await.unwrap();
        let started = Instant::now();
        let refused = admission
            .enter(WorkClass::Recall)
            .await
            .err()
            .expect("refused");
        assert!(started.elapsed() < Duration::from_millis(20));
        assert_eq!(refused.retry_after, Some(1));
        assert_eq!(refused.retry_after_ms, Some(200));
    }
}

//! The gateway every LLM call goes through, and what keeps the calls few and bounded:
//! the per-namespace token budget, and the counters the server's metrics read.
//!
//! The judge and the condenser share one [`Llm`]: one [`ChatClient`] (so one concurrency
//! bound and one set of retry counters) and one [`TokenBudget`]. Before a call the budget
//! is checked for the namespace the work belongs to; a namespace that has spent its tokens
//! for the current hour of the *runtime* clock is refused with [`Error::OverBudget`], which
//! the callers turn into rules / extractive condensation with the reason audited. After a
//! call the tokens the server reported (or an estimate, when it reported none) are charged.
//! Hours are aligned to the clock (10:00–11:00 UTC), so a simulation on the virtual clock
//! sees the budget return exactly when its clock crosses the hour.
//!
//! The content cache and semantic reuse, which spare calls rather than bound them, belong
//! to the judge ([`super::judge`]): they depend on what a judgement is.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::chat::{ChatAnswer, ChatClient, ChatRequest, ChatStats};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// Milliseconds in the budget's period.
const HOUR_MS: i64 = 3_600_000;

/// Tokens each namespace may spend per hour of the runtime clock.
#[derive(Debug)]
pub struct TokenBudget {
    per_hour: u64,
    spent: Mutex<HashMap<String, Spent>>,
}

/// One namespace's spending in one hour.
#[derive(Debug, Clone, Copy)]
struct Spent {
    hour: i64,
    tokens: u64,
}

impl TokenBudget {
    /// A budget of `per_hour` tokens per namespace; 0 means unlimited.
    pub fn new(per_hour: u64) -> Self {
        TokenBudget {
            per_hour,
            spent: Mutex::new(HashMap::new()),
        }
    }

    /// Tokens each namespace may spend per hour; 0 means unlimited.
    pub fn per_hour(&self) -> u64 {
        self.per_hour
    }

    /// Tokens `namespace` has spent in the hour holding `now`.
    pub fn spent(&self, namespace: &str, now: Timestamp) -> u64 {
        let hour = now.div_euclid(HOUR_MS);
        self.lock()
            .get(namespace)
            .filter(|s| s.hour == hour)
            .map_or(0, |s| s.tokens)
    }

    /// `Ok` when `namespace` may make a call at `now`; otherwise why not, and until when.
    pub fn check(&self, namespace: &str, now: Timestamp) -> Result<()> {
        if self.per_hour == 0 {
            return Ok(());
        }
        let spent = self.spent(namespace, now);
        if spent < self.per_hour {
            return Ok(());
        }
        let next = (now.div_euclid(HOUR_MS) + 1) * HOUR_MS;
        Err(Error::OverBudget {
            namespace: namespace.to_string(),
            spent,
            limit: self.per_hour,
            until: chrono::DateTime::from_timestamp_millis(next)
                .map_or_else(|| next.to_string(), |t| t.format("%H:%M UTC").to_string()),
        })
    }

    /// Adds `tokens` to what `namespace` spent in the hour holding `now`.
    pub fn charge(&self, namespace: &str, now: Timestamp, tokens: u64) {
        let hour = now.div_euclid(HOUR_MS);
        let mut spent = self.lock();
        let entry = spent
            .entry(namespace.to_string())
            .or_insert(Spent { hour, tokens: 0 });
        if entry.hour != hour {
            *entry = Spent { hour, tokens: 0 };
        }
        entry.tokens = entry.tokens.saturating_add(tokens);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Spent>> {
        // A panic elsewhere while holding the map leaves counts that are still counts.
        self.spent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the LLM layer did, since it was built: the client's exchange counters plus what the
/// judge and condenser decided. Read by the server's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LlmStats {
    /// The chat client's counters (requests, retries, failures, tokens).
    pub chat: ChatStats,
    /// Records whose importance the model gave in this process.
    pub judged: u64,
    /// Records that took a cached judgement of the same text instead of a call.
    pub cache_hits: u64,
    /// Records that took the judgement of a near-duplicate instead of a call.
    pub reuse_hits: u64,
    /// Windows the model condensed.
    pub condensed: u64,
    /// Records and windows left to rules / extractive condensation because their namespace
    /// had spent its hourly token budget.
    pub over_budget: u64,
    /// Records and windows left to rules / extractive condensation because the provider
    /// failed or its answer could not be used (budget refusals not included).
    pub fallbacks: u64,
}

/// Counters behind [`LlmStats`], bumped by the judge and condenser.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) judged: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) reuse_hits: AtomicU64,
    pub(crate) condensed: AtomicU64,
    pub(crate) over_budget: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The model behind the judge and the condenser, with the budget they share.
#[derive(Debug)]
pub struct Llm {
    client: Arc<ChatClient>,
    budget: TokenBudget,
    pub(crate) counters: Counters,
}

impl Llm {
    /// Calls through `client`, at most `tokens_per_hour` tokens per namespace (0: no limit).
    pub fn new(client: Arc<ChatClient>, tokens_per_hour: u64) -> Self {
        Llm {
            client,
            budget: TokenBudget::new(tokens_per_hour),
            counters: Counters::default(),
        }
    }

    /// The model's name, for audit entries (`llm:<model>`).
    pub fn model(&self) -> &str {
        self.client.model()
    }

    /// The budget, to read what a namespace spent.
    pub fn budget(&self) -> &TokenBudget {
        &self.budget
    }

    /// One exchange on behalf of `namespace` at runtime-clock time `now`: refused with
    /// [`Error::OverBudget`] when the namespace's hour is spent, otherwise sent, and its
    /// tokens charged (the server's count, or about one token per four characters when it
    /// gave none, so a server that omits `usage` is not free).
    pub async fn complete(
        &self,
        namespace: &str,
        now: Timestamp,
        request: ChatRequest,
    ) -> Result<ChatAnswer> {
        self.budget.check(namespace, now)?;
        let estimate = (request.system.len() + request.user.len()) as u64 / 4;
        let answer = self.client.complete(request).await?;
        let tokens = match answer.usage.total {
            0 => estimate + answer.content.len() as u64 / 4,
            reported => reported,
        };
        self.budget.charge(namespace, now, tokens);
        Ok(answer)
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> LlmStats {
        let c = &self.counters;
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LlmStats {
            chat: self.client.stats(),
            judged: read(&c.judged),
            cache_hits: read(&c.cache_hits),
            reuse_hits: read(&c.reuse_hits),
            condensed: read(&c.condensed),
            over_budget: read(&c.over_budget),
            fallbacks: read(&c.fallbacks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = 1_780_000_000_000 - 1_780_000_000_000 % HOUR_MS;

    #[test]
    fn the_budget_is_per_namespace_and_returns_with_the_hour() {
        let b = TokenBudget::new(1_000);
        b.check("a", T0).unwrap();
        b.charge("a", T0 + 1, 600);
        b.check("a", T0 + 2).unwrap();
        b.charge("a", T0 + 3, 600);
        let err = b.check("a", T0 + 4).unwrap_err();
        let shown = err.to_string();
        assert!(
            matches!(err, Error::OverBudget { spent: 1_200, .. }),
            "{err:?}"
        );
        assert!(
            shown.contains("`a`") && shown.contains("1200 of 1000"),
            "{shown}"
        );
        b.check("b", T0 + 4)
            .expect("another namespace has its own budget");
        b.check("a", T0 + HOUR_MS - 1)
            .expect_err("still the same hour");
        b.check("a", T0 + HOUR_MS)
            .expect("the next hour starts afresh");
        assert_eq!(b.spent("a", T0 + HOUR_MS), 0);
        b.charge("a", T0 + HOUR_MS, 10);
        assert_eq!(b.spent("a", T0 + HOUR_MS), 10);
    }

    #[test]
    fn a_zero_budget_is_unlimited() {
        let b = TokenBudget::new(0);
        b.charge("a", T0, u64::MAX);
        b.check("a", T0).unwrap();
    }
}

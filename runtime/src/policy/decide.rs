//! The policy's decisions: importance from rules, the score breakdown recall ranks by,
//! strength over time (half-life or Ebbinghaus curve), reinforcement, forgetting
//! (keep / decay / archive / purge) and promotion eligibility.
//!
//! Every function here is pure: a function of (policy, inputs, `now`). It must never read a
//! clock, touch the store or log; actors call these and apply (and audit) the result, which
//! is what makes a simulated month replay identically.
//!
//! Strength model, chosen here and relied on by the actors:
//! - a new record starts at [`Policy::initial_strength`] `= 0.5 + importance / 20`
//!   (0.5 for importance 0, 1.0 for importance 10), so important records survive longer;
//! - it decays from `(record.strength, record.strength_at)`; both curves are memoryless, so
//!   rebasing (writing the decayed value with `strength_at = now`) never changes the
//!   trajectory;
//! - reinforcement adds to the strength as of `now` (capped at 1), resets `strength_at`, and
//!   counts in `record.reinforcements`, which slows the Ebbinghaus curve.

use crate::clock::Timestamp;
use crate::model::{MemoryRecord, PolicyStamp, Reinforce, Status, Tier};

use super::Policy;
use super::compile::{Curve, RecencyBasis};

/// The importance the rules give a new record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImportanceDecision {
    /// Importance, 0..=10.
    pub importance: f32,
    /// Index (0-based, file order) of the rule that matched.
    pub rule: Option<usize>,
    /// No rule matched and `default_importance` was used; an LLM judge may do better.
    pub defaulted: bool,
}

/// What the scoring policy needs to know about one candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreInput {
    /// Query similarity, 0..=1, already normalised by retrieval.
    pub relevance: f32,
    /// Age in ms for the recency component (see [`Policy::recency_age`]).
    pub age_ms: i64,
    /// Importance, 0..=10.
    pub importance: f32,
    /// Utility: the Beta mean, 0..=1.
    pub utility: f32,
    /// Strength as of now, 0..=1 (see [`Policy::strength_at`]).
    pub strength: f32,
}

/// Why a candidate ranked where it did: each field is weight x component.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ScoreBreakdown {
    /// `scoring.relevance x relevance`.
    pub relevance: f32,
    /// `scoring.recency x 2^(-age / recency_half_life)`.
    pub recency: f32,
    /// `scoring.importance x importance / 10`.
    pub importance: f32,
    /// `scoring.utility x utility`.
    pub utility: f32,
    /// `scoring.strength x strength` (0 unless the policy weights strength).
    pub strength: f32,
    /// The sum of the fields above.
    pub total: f32,
}

/// What a decay sweep should do with one record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ForgetDecision {
    /// Leave it as it is.
    Keep,
    /// Store the lower strength (as of `now`).
    Decay {
        /// Strength as of `now`.
        strength: f32,
    },
    /// Its strength fell below `archive_below`: archive it (soft delete).
    Archive {
        /// Strength as of `now`.
        strength: f32,
    },
    /// Archived for `purge_archived_after` or longer: delete it for good.
    Purge,
}

/// A sweep reports a decay only once strength dropped by this much since it was last
/// stored, so the audit log is not flooded with invisible changes.
pub const DECAY_STEP: f32 = 0.01;

fn clamp01(x: f32) -> f32 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Policy {
    /// Importance by the rules: the first rule whose kinds and regex both match wins; with
    /// no match, `default_importance` and `defaulted: true`.
    pub fn importance(&self, kind: &str, text: &str) -> ImportanceDecision {
        for (i, rule) in self.evaluation.rules.iter().enumerate() {
            let kind_ok = rule.kinds.is_empty() || rule.kinds.iter().any(|k| k == kind);
            let text_ok = rule.matches.as_ref().is_none_or(|re| re.is_match(text));
            if kind_ok && text_ok {
                return ImportanceDecision {
                    importance: rule.importance,
                    rule: Some(i),
                    defaulted: false,
                };
            }
        }
        ImportanceDecision {
            importance: self.evaluation.default_importance,
            rule: None,
            defaulted: true,
        }
    }

    /// The recency component `2^(-age / recency_half_life)`, 1.0 for age <= 0 or when the
    /// half-life is "never".
    pub fn recency(&self, age_ms: i64) -> f32 {
        match self.scoring.recency_half_life {
            Some(h) if age_ms > 0 => (-(age_ms as f64) / ms(h)).exp2() as f32,
            _ => 1.0,
        }
    }

    /// The age recency is computed from, per `scoring.recency_basis`: since the event, or
    /// since the last reinforcement (`strength_at`).
    pub fn recency_age(&self, record: &MemoryRecord, now: Timestamp) -> i64 {
        let since = match self.scoring.recency_basis {
            RecencyBasis::Event => record.event_time,
            RecencyBasis::LastAccess => record.strength_at,
        };
        now.saturating_sub(since).max(0)
    }

    /// The weighted score breakdown; out-of-range inputs are clamped, NaN counts as 0.
    pub fn score(&self, input: &ScoreInput) -> ScoreBreakdown {
        let w = &self.scoring;
        let importance = if input.importance.is_nan() {
            0.0
        } else {
            input.importance.clamp(0.0, 10.0) / 10.0
        };
        let relevance = w.relevance * clamp01(input.relevance);
        let recency = w.recency * self.recency(input.age_ms);
        let importance = w.importance * importance;
        let utility = w.utility * clamp01(input.utility);
        let strength = w.strength * clamp01(input.strength);
        ScoreBreakdown {
            relevance,
            recency,
            importance,
            utility,
            strength,
            total: relevance + recency + importance + utility + strength,
        }
    }

    /// [`Policy::score`] for a stored record: fills age, importance, utility and strength
    /// from the record as of `now`.
    pub fn score_record(
        &self,
        record: &MemoryRecord,
        relevance: f32,
        now: Timestamp,
    ) -> ScoreBreakdown {
        self.score(&ScoreInput {
            relevance,
            age_ms: self.recency_age(record, now),
            importance: record.importance,
            utility: record.utility.mean(),
            strength: self.strength_at(record, now),
        })
    }

    /// Strength of a new record: `0.5 + importance / 20`, i.e. 0.5..=1.0.
    pub fn initial_strength(&self, importance: f32) -> f32 {
        let i = if importance.is_nan() {
            0.0
        } else {
            importance.clamp(0.0, 10.0)
        };
        0.5 + i / 20.0
    }

    /// Whether the record never decays: pinned, or of a protected kind.
    pub fn is_protected(&self, record: &MemoryRecord) -> bool {
        record.status == Status::Pinned
            || self
                .forgetting
                .protect_kinds
                .iter()
                .any(|k| k == record.kind.as_str())
    }

    /// The Ebbinghaus stability S (ms) after `reinforcements` recalls.
    pub fn stability_ms(&self, reinforcements: u32) -> f64 {
        let f = &self.forgetting;
        ms(f.stability) * (1.0 + f64::from(f.stability_growth) * f64::from(reinforcements))
    }

    /// Strength as of `now`, decayed from `record.strength` at `record.strength_at` along
    /// the policy's curve. Protected records do not decay; a `now` before `strength_at`
    /// (a rewound simulation clock) counts as no time passed.
    pub fn strength_at(&self, record: &MemoryRecord, now: Timestamp) -> f32 {
        let base = clamp01(record.strength);
        if self.is_protected(record) {
            return base;
        }
        let t = now.saturating_sub(record.strength_at).max(0) as f64;
        let factor = match self.forgetting.curve {
            Curve::HalfLife => match self.forgetting.half_life {
                Some(h) => (-t / ms(h)).exp2(),
                None => 1.0,
            },
            Curve::Ebbinghaus => (-t / self.stability_ms(record.reinforcements)).exp(),
        };
        clamp01((f64::from(base) * factor) as f32)
    }

    /// The strength after reinforcing by `amount` at `now`: the decayed strength plus
    /// `amount`, within 0..=1. The caller stores it with `strength_at = now` and counts the
    /// reinforcement (see [`Policy::apply_reinforcement`]).
    pub fn reinforce(&self, record: &MemoryRecord, now: Timestamp, amount: f32) -> f32 {
        let amount = if amount.is_finite() { amount } else { 0.0 };
        clamp01(self.strength_at(record, now) + amount)
    }

    /// Applies [`Policy::reinforce`] to the record: new strength, `strength_at = now`, one
    /// more reinforcement, and this policy's stamp.
    pub fn apply_reinforcement(&self, record: &mut MemoryRecord, now: Timestamp, amount: f32) {
        record.strength = self.reinforce(record, now, amount);
        record.strength_at = now.max(record.strength_at);
        record.reinforcements = record.reinforcements.saturating_add(1);
        record.policy = self.stamp();
    }

    /// What a decay sweep at `now` should do with the record.
    ///
    /// - archived: purged once `now - status_at >= purge_archived_after` (whatever its kind:
    ///   archiving was already decided), else kept;
    /// - obsolete and wrong (kept for history), pinned, and protected kinds: kept;
    /// - active: archived when its strength as of `now` is below `archive_below`, else
    ///   decayed when strength dropped by at least [`DECAY_STEP`], else kept.
    ///
    /// `"never"` durations and `archive_below = 0` switch the matching step off.
    pub fn forgetting(&self, record: &MemoryRecord, now: Timestamp) -> ForgetDecision {
        match record.status {
            Status::Archived => {
                return match self.forgetting.purge_archived_after {
                    Some(after) if now.saturating_sub(record.status_at) as f64 >= ms(after) => {
                        ForgetDecision::Purge
                    }
                    _ => ForgetDecision::Keep,
                };
            }
            Status::Obsolete | Status::Wrong | Status::Pinned => return ForgetDecision::Keep,
            Status::Active => {}
        }
        if self.is_protected(record) {
            return ForgetDecision::Keep;
        }
        let strength = self.strength_at(record, now);
        if strength < self.forgetting.archive_below {
            ForgetDecision::Archive { strength }
        } else if clamp01(record.strength) - strength >= DECAY_STEP {
            ForgetDecision::Decay { strength }
        } else {
            ForgetDecision::Keep
        }
    }

    /// Whether a session's condensation trigger fires: `events` uncondensed episodic
    /// records, the oldest written at `oldest`. Fires at `every_events`, or at `min_events`
    /// once the oldest is `max_age` old; never below `min_events` (or with none).
    pub fn condensation_due(&self, events: u64, oldest: Option<Timestamp>, now: Timestamp) -> bool {
        let c = &self.condensation;
        if events == 0 || events < u64::from(c.min_events) {
            return false;
        }
        if events >= u64::from(c.every_events.max(1)) {
            return true;
        }
        match (c.max_age, oldest) {
            (Some(age), Some(oldest)) => now.saturating_sub(oldest) as f64 >= ms(age),
            _ => false,
        }
    }

    /// Whether the record may be promoted into the knowledge pool; `Err` lists every
    /// reason it may not, joined with `; `.
    pub fn promotion(&self, record: &MemoryRecord) -> Result<(), String> {
        let p = &self.promotion;
        let mut reasons = Vec::new();
        match record.tier {
            Tier::Condensed => {}
            Tier::Episodic => reasons
                .push("it is an episodic record; only condensed records are promoted".to_string()),
            Tier::Knowledge => reasons.push("it is already in the knowledge pool".to_string()),
        }
        if !record.status.recallable() {
            reasons.push(format!(
                "its status is {}; only active or pinned records are promoted",
                record.status.as_str()
            ));
        }
        if record.importance.is_nan() || record.importance < p.min_importance {
            reasons.push(format!(
                "importance {} is below promotion.min_importance {}",
                record.importance, p.min_importance
            ));
        }
        let utility = record.utility.mean();
        if utility < p.min_utility {
            reasons.push(format!(
                "utility {utility:.2} ({} successes, {} failures) is below promotion.min_utility {}",
                record.utility.successes, record.utility.failures, p.min_utility
            ));
        }
        if record.utility.successes < p.min_successes {
            reasons.push(format!(
                "{} successes, promotion.min_successes is {}",
                record.utility.successes, p.min_successes
            ));
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons.join("; "))
        }
    }
}

/// The store applies a recall's reinforcement when it commits, by the policy that ranked it.
impl Reinforce for Policy {
    fn apply(&self, record: &mut MemoryRecord, now: Timestamp, amount: f32) {
        self.apply_reinforcement(record, now, amount);
    }

    fn stamp(&self) -> PolicyStamp {
        Policy::stamp(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::DAY_MS;
    use crate::model::{Kind, MemoryId, PolicyStamp, Utility};

    const HOUR_MS: i64 = 3_600_000;
    const T0: Timestamp = 1_700_000_000_000;

    fn record(kind: &str, status: Status, strength: f32) -> MemoryRecord {
        MemoryRecord {
            id: MemoryId(1),
            namespace: "default".into(),
            session_id: "s1".into(),
            agent_id: None,
            tier: Tier::Episodic,
            kind: Kind::new(kind).unwrap(),
            text: "text".into(),
            content: serde_json::Value::Null,
            metadata: serde_json::Value::Null,
            parent_id: None,
            event_time: T0,
            recorded_time: T0,
            importance: 3.0,
            strength,
            strength_at: T0,
            reinforcements: 0,
            utility: Utility::default(),
            status,
            status_at: T0,
            sources: Vec::new(),
            policy: PolicyStamp::default(),
            embedding: None,
        }
    }

    fn policy(toml: &str) -> Policy {
        Policy::from_toml("<test>", toml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-4
    }

    #[test]
    fn importance_comes_from_the_first_matching_rule() {
        let p = policy(
            r#"
            [evaluation]
            default_importance = 2
            [[evaluation.rules]]
            kinds = ["goal"]
            importance = 9
            [[evaluation.rules]]
            kinds = ["observation", "action"]
            matches = "(?i)error|failed"
            importance = 7
            [[evaluation.rules]]
            matches = "deploy"
            importance = 6
            [[evaluation.rules]]
            kinds = ["observation"]
            importance = 4
            "#,
        );
        let cases = [
            ("goal", "anything at all", 9.0, Some(0)),
            ("observation", "Build FAILED", 7.0, Some(1)),
            ("action", "ran tests: error", 7.0, Some(1)),
            // Rule 1 and rule 2 both match; the first wins.
            ("observation", "deploy error", 7.0, Some(1)),
            ("thought", "deploy now", 6.0, Some(2)),
            // The regex is case-sensitive unless it says (?i).
            ("thought", "Deploy now", 2.0, None),
            ("observation", "all good", 4.0, Some(3)),
            ("user_message", "hello", 2.0, None),
        ];
        for (kind, text, importance, rule) in cases {
            let d = p.importance(kind, text);
            assert_eq!(
                d,
                ImportanceDecision {
                    importance,
                    rule,
                    defaulted: rule.is_none()
                },
                "{kind}: {text}"
            );
        }
        // The default rules.
        let d = Policy::default_policy();
        assert_eq!(d.importance("goal", "ship v1").importance, 9.0);
        assert_eq!(
            d.importance("observation", "NullPointerException").rule,
            Some(1)
        );
        assert_eq!(d.importance("observation", "sunny").importance, 3.0);
        assert!(d.importance("observation", "sunny").defaulted);
        // No rules at all: everything is defaulted.
        let none = policy("[evaluation]\nrules = []\n");
        assert!(none.importance("goal", "x").defaulted);
    }

    #[test]
    fn score_is_the_sum_of_weighted_components() {
        let d = Policy::default_policy();
        let input = |relevance, age_ms, importance, utility| ScoreInput {
            relevance,
            age_ms,
            importance,
            utility,
            strength: 0.7,
        };
        // (input, relevance, recency, importance, utility) with weights 1, .5, .5, .5.
        let cases = [
            (input(0.8, 0, 5.0, 0.5), 0.8, 0.5, 0.25, 0.25),
            (input(0.8, 3 * DAY_MS, 5.0, 0.5), 0.8, 0.25, 0.25, 0.25),
            (input(0.8, 6 * DAY_MS, 10.0, 1.0), 0.8, 0.125, 0.5, 0.5),
            // Future events (clock skew) count as brand new.
            (input(0.2, -DAY_MS, 0.0, 0.0), 0.2, 0.5, 0.0, 0.0),
            // Out-of-range and NaN inputs are clamped, never propagated.
            (input(1.5, 0, 20.0, -1.0), 1.0, 0.5, 0.5, 0.0),
            (input(f32::NAN, 0, f32::NAN, f32::NAN), 0.0, 0.5, 0.0, 0.0),
        ];
        for (i, (inp, rel, rec, imp, util)) in cases.into_iter().enumerate() {
            let b = d.score(&inp);
            assert!(close(b.relevance, rel), "case {i}: {b:?}");
            assert!(close(b.recency, rec), "case {i}: {b:?}");
            assert!(close(b.importance, imp), "case {i}: {b:?}");
            assert!(close(b.utility, util), "case {i}: {b:?}");
            assert_eq!(b.strength, 0.0, "default policy does not weight strength");
            assert!(close(b.total, rel + rec + imp + util), "case {i}: {b:?}");
        }
        // Weights scale components; "never" keeps recency at 1.
        let p = policy(
            "[scoring]\nrelevance = 2\nrecency = 1\nimportance = 0\nutility = 0\nstrength = 3\n\
             recency_half_life = \"never\"\n",
        );
        let b = p.score(&input(0.5, 365 * DAY_MS, 9.0, 1.0));
        assert_eq!(
            (b.relevance, b.recency, b.importance, b.utility),
            (1.0, 1.0, 0.0, 0.0)
        );
        assert!(close(b.strength, 2.1), "{b:?}");
        assert!(close(b.total, 4.1), "{b:?}");
    }

    #[test]
    fn recency_age_follows_the_basis() {
        let mut r = record("thought", Status::Active, 1.0);
        r.strength_at = T0 + 10 * DAY_MS; // last recalled 10 days after the event
        let now = T0 + 12 * DAY_MS;
        let event = Policy::default_policy();
        let access = policy("[scoring]\nrecency_basis = \"last_access\"\n");
        assert_eq!(event.recency_age(&r, now), 12 * DAY_MS);
        assert_eq!(access.recency_age(&r, now), 2 * DAY_MS);
        assert!(close(
            event.score_record(&r, 1.0, now).recency,
            0.5 * (-4.0f32).exp2()
        ));
        assert!(close(
            access.score_record(&r, 1.0, now).recency,
            0.5 * (-2.0f32 / 3.0).exp2()
        ));
    }

    #[test]
    fn initial_strength_grows_with_importance() {
        let d = Policy::default_policy();
        for (importance, strength) in [
            (0.0, 0.5),
            (3.0, 0.65),
            (10.0, 1.0),
            (20.0, 1.0),
            (-5.0, 0.5),
            (f32::NAN, 0.5),
        ] {
            assert!(
                close(d.initial_strength(importance), strength),
                "{importance}"
            );
        }
    }

    #[test]
    fn strength_decays_along_the_half_life_curve() {
        let d = Policy::default_policy(); // half_life 30d, protect goal
        let active = record("observation", Status::Active, 0.8);
        let cases = [
            (&active, 0, 0.8),
            (&active, 30 * DAY_MS, 0.4),
            (&active, 60 * DAY_MS, 0.2),
            (&active, 15 * DAY_MS, 0.8 / 2f32.sqrt()),
            (&active, -DAY_MS, 0.8), // a rewound clock is no time passed
        ];
        for (r, dt, want) in cases {
            let got = d.strength_at(r, T0 + dt);
            assert!(close(got, want), "dt {dt}: {got} != {want}");
        }
        let pinned = record("observation", Status::Pinned, 0.8);
        let goal = record("goal", Status::Active, 0.8);
        assert_eq!(d.strength_at(&pinned, T0 + 300 * DAY_MS), 0.8);
        assert_eq!(d.strength_at(&goal, T0 + 300 * DAY_MS), 0.8);
        let never = policy("[forgetting]\nhalf_life = \"never\"\n");
        assert_eq!(never.strength_at(&active, T0 + 3650 * DAY_MS), 0.8);
    }

    #[test]
    fn ebbinghaus_retention_slows_with_each_recall() {
        let p = policy(
            "[forgetting]\ncurve = \"ebbinghaus\"\nstability = \"1d\"\nstability_growth = 1.0\n",
        );
        // (reinforcements, elapsed, expected) with s0 = 1: e^(-t / (1d * (1 + n))).
        let cases = [
            (0, DAY_MS, (-1.0f32).exp()),
            (1, DAY_MS, (-0.5f32).exp()),
            (3, DAY_MS, (-0.25f32).exp()),
            (0, 2 * DAY_MS, (-2.0f32).exp()),
            (0, 0, 1.0),
        ];
        for (n, dt, want) in cases {
            let mut r = record("observation", Status::Active, 1.0);
            r.reinforcements = n;
            let got = p.strength_at(&r, T0 + dt);
            assert!(close(got, want), "n {n} dt {dt}: {got} != {want}");
        }
        // Through reinforcement: after a recall the same day costs less retention.
        let mut r = record("observation", Status::Active, 1.0);
        let first_day = 1.0 - p.strength_at(&r, T0 + DAY_MS);
        p.apply_reinforcement(&mut r, T0 + DAY_MS, 1.0);
        assert_eq!(
            (r.strength, r.strength_at, r.reinforcements),
            (1.0, T0 + DAY_MS, 1)
        );
        assert_eq!(r.policy, p.stamp());
        let second_day = 1.0 - p.strength_at(&r, T0 + 2 * DAY_MS);
        assert!(second_day < first_day, "{second_day} vs {first_day}");
        assert!(close(second_day, 1.0 - (-0.5f32).exp()));
        // The half-life curve ignores the recall count.
        let mut h = record("observation", Status::Active, 1.0);
        h.reinforcements = 5;
        let d = Policy::default_policy();
        assert!(close(d.strength_at(&h, T0 + 30 * DAY_MS), 0.5));
    }

    #[test]
    fn reinforcement_adds_to_the_decayed_strength() {
        let d = Policy::default_policy();
        let r = |s| record("observation", Status::Active, s);
        let cases = [
            (r(0.5), 30 * DAY_MS, 0.05, 0.30),
            (r(0.98), 0, 0.05, 1.0), // capped at 1
            (r(0.5), 30 * DAY_MS, f32::NAN, 0.25),
            (r(0.1), 0, -1.0, 0.0), // never negative
            (record("goal", Status::Active, 0.5), 30 * DAY_MS, 0.1, 0.6), // protected: no decay
        ];
        for (rec, dt, amount, want) in cases {
            let got = d.reinforce(&rec, T0 + dt, amount);
            assert!(close(got, want), "{dt} {amount}: {got} != {want}");
        }
    }

    #[test]
    fn forgetting_keeps_decays_archives_and_purges() {
        let d = Policy::default_policy(); // 30d half-life, archive < 0.05, purge after 180d
        let keep_all = policy(
            "[forgetting]\nhalf_life = \"never\"\narchive_below = 0\n\
             purge_archived_after = \"never\"\n",
        );
        let rec = |kind: &str, status, strength, status_age: i64| {
            let mut r = record(kind, status, strength);
            r.status_at = T0 - status_age;
            r
        };
        let decay_1d = 2f32.powf(-1.0 / 30.0);
        let cases: Vec<(&Policy, MemoryRecord, i64, ForgetDecision)> = vec![
            (
                &d,
                rec("observation", Status::Active, 1.0, 0),
                0,
                ForgetDecision::Keep,
            ),
            // An hour's decay is below DECAY_STEP: no audit entry for it.
            (
                &d,
                rec("observation", Status::Active, 1.0, 0),
                HOUR_MS,
                ForgetDecision::Keep,
            ),
            (
                &d,
                rec("observation", Status::Active, 1.0, 0),
                DAY_MS,
                ForgetDecision::Decay { strength: decay_1d },
            ),
            (
                &d,
                rec("observation", Status::Active, 0.06, 0),
                30 * DAY_MS,
                ForgetDecision::Archive { strength: 0.03 },
            ),
            (
                &d,
                rec("goal", Status::Active, 0.06, 0),
                300 * DAY_MS,
                ForgetDecision::Keep,
            ),
            (
                &d,
                rec("observation", Status::Pinned, 0.06, 0),
                300 * DAY_MS,
                ForgetDecision::Keep,
            ),
            (
                &d,
                rec("observation", Status::Obsolete, 0.01, 0),
                300 * DAY_MS,
                ForgetDecision::Keep,
            ),
            (
                &d,
                rec("observation", Status::Archived, 0.01, 179 * DAY_MS),
                0,
                ForgetDecision::Keep,
            ),
            (
                &d,
                rec("observation", Status::Archived, 0.01, 180 * DAY_MS),
                0,
                ForgetDecision::Purge,
            ),
            // Archived goals are purged too: archiving was already decided.
            (
                &d,
                rec("goal", Status::Archived, 0.9, 200 * DAY_MS),
                0,
                ForgetDecision::Purge,
            ),
            (
                &keep_all,
                rec("observation", Status::Active, 0.06, 0),
                3650 * DAY_MS,
                ForgetDecision::Keep,
            ),
            (
                &keep_all,
                rec("observation", Status::Archived, 0.0, 3650 * DAY_MS),
                0,
                ForgetDecision::Keep,
            ),
        ];
        for (i, (p, r, dt, want)) in cases.into_iter().enumerate() {
            let got = p.forgetting(&r, T0 + dt);
            match (got, want) {
                (ForgetDecision::Decay { strength: a }, ForgetDecision::Decay { strength: b })
                | (
                    ForgetDecision::Archive { strength: a },
                    ForgetDecision::Archive { strength: b },
                ) => {
                    assert!(close(a, b), "case {i}: {got:?} != {want:?}")
                }
                _ => assert_eq!(got, want, "case {i}"),
            }
        }
        // Ebbinghaus: an importance-3 memory (s0 = 0.65) is archived after ~2.6 days.
        let e = policy("[forgetting]\ncurve = \"ebbinghaus\"\nstability = \"1d\"\n");
        let r = record("observation", Status::Active, 0.65);
        assert!(matches!(
            e.forgetting(&r, T0 + 2 * DAY_MS),
            ForgetDecision::Decay { .. }
        ));
        assert!(matches!(
            e.forgetting(&r, T0 + 3 * DAY_MS),
            ForgetDecision::Archive { .. }
        ));
    }

    #[test]
    fn promotion_needs_every_threshold_and_says_which_failed() {
        let d = Policy::default_policy(); // importance 6, utility 0.6, 1 success
        let candidate = |tier, status, importance, successes, failures| {
            let mut r = record("observation", status, 1.0);
            r.tier = tier;
            r.importance = importance;
            r.utility = Utility {
                successes,
                failures,
            };
            r
        };
        let ok = candidate(Tier::Condensed, Status::Active, 7.0, 1, 0);
        assert_eq!(d.promotion(&ok), Ok(()));
        let pinned = candidate(Tier::Condensed, Status::Pinned, 6.0, 3, 1);
        assert_eq!(d.promotion(&pinned), Ok(()));
        let cases: Vec<(MemoryRecord, Vec<&str>)> = vec![
            (
                candidate(Tier::Episodic, Status::Active, 7.0, 1, 0),
                vec!["episodic", "only condensed"],
            ),
            (
                candidate(Tier::Knowledge, Status::Active, 7.0, 1, 0),
                vec!["already in the knowledge pool"],
            ),
            (
                candidate(Tier::Condensed, Status::Archived, 7.0, 1, 0),
                vec!["status is archived"],
            ),
            (
                candidate(Tier::Condensed, Status::Active, 5.5, 1, 0),
                vec!["importance 5.5 is below promotion.min_importance 6"],
            ),
            (
                candidate(Tier::Condensed, Status::Active, 7.0, 1, 2),
                vec!["utility 0.40", "below promotion.min_utility 0.6"],
            ),
            (
                candidate(Tier::Condensed, Status::Active, 7.0, 0, 0),
                vec!["utility 0.50", "0 successes, promotion.min_successes is 1"],
            ),
            (
                candidate(Tier::Episodic, Status::Obsolete, 1.0, 0, 5),
                vec![
                    "episodic",
                    "obsolete",
                    "importance 1",
                    "utility 0.14",
                    "0 successes",
                ],
            ),
        ];
        for (r, needles) in cases {
            let reason = d.promotion(&r).unwrap_err();
            for n in needles {
                assert!(reason.contains(n), "{reason:?} lacks {n:?}");
            }
        }
        let lenient =
            policy("[promotion]\nmin_importance = 0\nmin_utility = 0\nmin_successes = 0\n");
        assert_eq!(
            lenient.promotion(&candidate(Tier::Condensed, Status::Active, 0.0, 0, 9)),
            Ok(())
        );
    }

    #[test]
    fn condensation_triggers() {
        let p = policy("[condensation]\nevery_events = 10\nmin_events = 3\nmax_age = \"1h\"\n");
        let hour = 3_600_000;
        let now = 100 * hour;
        let cases = [
            // (events, oldest written, due)
            (0, None, false),
            (2, Some(now - 5 * hour), false), // below min_events, however old
            (3, Some(now - hour + 1), false), // min_events, not old enough
            (3, Some(now - hour), true),      // min_events and max_age
            (9, Some(now), false),
            (10, Some(now), true), // every_events
        ];
        for (events, oldest, due) in cases {
            assert_eq!(
                p.condensation_due(events, oldest, now),
                due,
                "{events} events, oldest {oldest:?}"
            );
        }
        let never =
            policy("[condensation]\nevery_events = 10\nmin_events = 3\nmax_age = \"never\"\n");
        assert!(!never.condensation_due(9, Some(0), now));
    }
}

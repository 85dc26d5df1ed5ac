//! What a namespace's memory has been doing, for a person looking at it: the records recall
//! returned most, those feedback found most useful, those most often part of a recall that
//! went well, those about to fade into the archive, those lately retired (archived,
//! obsolete, wrong) or superseded, and open contradictions held for review. Read-only: it
//! never changes a record, so looking does not disturb what it shows.
//!
//! One pass over the namespace's records (headers and scores, never embeddings) and one
//! over the remembered recalls, in each store that holds part of the namespace (in a
//! cluster placed by session, every partition: each answers its share and the shares are
//! merged); the dashboard keeps the answer for a little while.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::Substrate;
use super::recall::Carried;
use crate::clock::Timestamp;
use crate::error::Result;
use crate::model::{MemoryId, MemoryRecord, Relation, Status};
use crate::policy::Policy;
use crate::store::{Filter, Visit};

/// How far ahead [`Fading::archive_at`] is looked for: past it, a record is not fading.
const FADING_HORIZON_MS: i64 = 10 * 365 * 24 * 3_600_000;

/// A record with a count: how many recalls returned it, or how many successful ones did.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The record (without its embedding).
    pub record: MemoryRecord,
    /// The count.
    pub times: u64,
}

/// A record on its way to the archive under the policy's forgetting curve.
#[derive(Debug, Clone)]
pub struct Fading {
    /// The record (without its embedding).
    pub record: MemoryRecord,
    /// Its strength now, after decay.
    pub strength_now: f32,
    /// When its strength falls below the policy's `archive_below` if nothing reinforces it
    /// (the next decay sweep after this archives it).
    pub archive_at: Timestamp,
}

/// A record another one replaces (a `supersedes` edge).
#[derive(Debug, Clone)]
pub struct Superseded {
    /// The older record.
    pub record: MemoryRecord,
    /// The record that replaces it.
    pub by: MemoryId,
}

/// What [`Substrate::insights`] found.
#[derive(Debug, Clone, Default)]
pub struct Insights {
    /// Returned by the most recalls.
    pub most_recalled: Vec<Counted>,
    /// The most success feedback (ties: the better success share).
    pub most_useful: Vec<MemoryRecord>,
    /// Returned by the most recalls whose feedback said they went well.
    pub in_successful_recalls: Vec<Counted>,
    /// Active records that will be archived soonest if nothing reinforces them.
    pub fading: Vec<Fading>,
    /// Archived, obsolete or wrong, most recent change first.
    pub retired: Vec<MemoryRecord>,
    /// Replaced by a newer record.
    pub superseded: Vec<Superseded>,
    /// Open contradictions, held for review: each record with the records it conflicts
    /// with (settle them with [`Substrate::resolve`]).
    pub conflicts: Vec<(MemoryRecord, Vec<MemoryId>)>,
    /// Records read.
    pub records: u64,
    /// Remembered recalls of the namespace read.
    pub recalls: u64,
}

/// One store's share of a namespace's [`Insights`], in a form the shares of every part of
/// a spread namespace merge into what one store holding every record answers: the recall
/// counts whole (a remembered recall may name records of any part), each list's first
/// `limit` entries with the keys it is ordered by.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(in crate::engine) struct InsightsShare {
    recalled: Vec<(MemoryId, u64)>,
    in_success: Vec<(MemoryId, u64)>,
    /// Successes, their share, the record.
    useful: Vec<(u32, f32, Carried)>,
    /// Strength now, archive time, the record.
    fading: Vec<(f32, Timestamp, Carried)>,
    /// Status change time, the record.
    retired: Vec<(Timestamp, Carried)>,
    /// The newer record, the one it supersedes.
    superseded: Vec<(MemoryId, Carried)>,
    conflicts: Vec<(Carried, Vec<MemoryId>)>,
    records: u64,
    recalls: u64,
}

impl Substrate {
    /// [`Insights`] on `namespace` as of `now`, at most `limit` entries per list: over
    /// this store and, with a spread (a cluster placed by session), every other part of
    /// the namespace, with the lists one store holding every record gives.
    pub async fn insights(
        &self,
        namespace: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Insights> {
        let shares = self.insight_shares(namespace, now, limit).await?;
        let mut out = Insights::default();
        let mut recalled: HashMap<MemoryId, u64> = HashMap::new();
        let mut in_success: HashMap<MemoryId, u64> = HashMap::new();
        let (mut useful, mut fading, mut retired) = (Vec::new(), Vec::new(), Vec::new());
        for share in shares {
            out.records += share.records;
            out.recalls += share.recalls;
            for (id, n) in share.recalled {
                *recalled.entry(id).or_default() += n;
            }
            for (id, n) in share.in_success {
                *in_success.entry(id).or_default() += n;
            }
            useful.extend(share.useful);
            fading.extend(share.fading);
            retired.extend(share.retired);
            out.superseded.extend(
                share
                    .superseded
                    .into_iter()
                    .map(|(by, r)| Superseded { record: r.0, by }),
            );
            out.conflicts
                .extend(share.conflicts.into_iter().map(|(r, with)| (r.0, with)));
        }
        out.most_recalled = self.top_counted(namespace, &recalled, limit).await?;
        out.in_successful_recalls = self.top_counted(namespace, &in_success, limit).await?;
        useful.sort_by(|a, b| {
            (b.0.cmp(&a.0))
                .then(b.1.total_cmp(&a.1))
                .then(a.2.0.id.cmp(&b.2.0.id))
        });
        out.most_useful = useful.into_iter().take(limit).map(|u| u.2.0).collect();
        fading.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.0.id.cmp(&b.2.0.id)));
        out.fading = (fading.into_iter().take(limit))
            .map(|(strength_now, archive_at, r)| Fading {
                record: r.0,
                strength_now,
                archive_at,
            })
            .collect();
        retired.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.0.id.cmp(&a.1.0.id)));
        out.retired = retired.into_iter().take(limit).map(|r| r.1.0).collect();
        // In a store's order: by the edge's key (the newer record, then the older).
        out.superseded.sort_by_key(|s| (s.by, s.record.id));
        out.superseded.truncate(limit);
        out.conflicts.sort_by_key(|c| c.0.id);
        out.conflicts.truncate(limit);
        Ok(out)
    }

    /// This store's [`InsightsShare`] of `namespace` (one pass over its records' headers
    /// and one over its remembered recalls).
    pub(in crate::engine) fn insights_share(
        &self,
        namespace: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<InsightsShare> {
        let store = self.store();
        let policy = self.policy_for(namespace);
        let mut successful = HashSet::new();
        store.for_each_recall_outcome(|n, success| {
            if success {
                successful.insert(n);
            }
            Ok(Visit::Continue)
        })?;
        let mut recalled: HashMap<MemoryId, u64> = HashMap::new();
        let mut in_success: HashMap<MemoryId, u64> = HashMap::new();
        let mut recalls = 0;
        store.for_each_recall(|n, recall| {
            if recall.namespace == namespace {
                recalls += 1;
                let good = successful.contains(&n);
                for id in recall.ids {
                    *recalled.entry(id).or_default() += 1;
                    if good {
                        *in_success.entry(id).or_default() += 1;
                    }
                }
            }
            Ok(Visit::Continue)
        })?;

        let ids = store.candidates(&Filter {
            namespace,
            ..Filter::default()
        });
        let mut useful = Vec::new();
        let mut fading = Vec::new();
        let mut retired = Vec::new();
        let mut records = 0;
        for id in ids.iter().map(MemoryId) {
            let Some(r) = store.get_light(id)? else {
                continue;
            };
            records += 1;
            if r.utility.successes > 0 {
                useful.push((r.utility.successes, r.utility.mean(), id));
            }
            match r.status {
                Status::Active if !policy.is_protected(&r) => {
                    let strength = policy.strength_at(&r, now);
                    if strength >= policy.forgetting.archive_below {
                        fading.push((strength, id));
                    }
                }
                Status::Archived | Status::Obsolete | Status::Wrong => {
                    retired.push((r.status_at, id));
                }
                _ => {}
            }
        }
        useful.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
        fading.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        retired.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));

        let light = |id: MemoryId| Ok::<_, crate::error::Error>(store.get_light(id)?.map(Carried));
        let mut out = InsightsShare {
            recalled: recalled.into_iter().collect(),
            in_success: in_success.into_iter().collect(),
            records,
            recalls,
            ..InsightsShare::default()
        };
        for &(successes, mean, id) in useful.iter().take(limit) {
            out.useful.extend(light(id)?.map(|r| (successes, mean, r)));
        }
        for &(strength, id) in &fading {
            if out.fading.len() == limit {
                break;
            }
            let Some(record) = light(id)? else { continue };
            // Strength only falls between reinforcements: the crossing is found by halving.
            if let Some(archive_at) = archive_time(&policy, &record.0, now) {
                out.fading.push((strength, archive_at, record));
            }
        }
        for &(at, id) in retired.iter().take(limit) {
            out.retired.extend(light(id)?.map(|r| (at, r)));
        }
        for edge in store.edges(namespace, None)? {
            if edge.relation == Relation::Supersedes
                && out.superseded.len() < limit
                && let Some(record) = light(edge.to)?
            {
                out.superseded.push((edge.from, record));
            }
        }
        for n in store.conflicted(&ids).iter().take(limit) {
            let id = MemoryId(n);
            if let Some(record) = light(id)? {
                out.conflicts.push((record, store.validity(id)?.conflicts));
            }
        }
        Ok(out)
    }

    /// The `limit` ids with the highest counts (ties: the lower id first), with their
    /// records, wherever they are held.
    async fn top_counted(
        &self,
        namespace: &str,
        counts: &HashMap<MemoryId, u64>,
        limit: usize,
    ) -> Result<Vec<Counted>> {
        let mut ranked: Vec<(u64, MemoryId)> = counts.iter().map(|(id, n)| (*n, *id)).collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut out = Vec::new();
        // A record purged since the recall is no longer there to show: read a list's
        // worth at a time until the list is full.
        for chunk in ranked.chunks(limit.max(1)) {
            if out.len() == limit {
                break;
            }
            let ids = chunk.iter().map(|(_, id)| *id).collect();
            let mut found = self.records_anywhere(namespace, ids).await?;
            for (times, id) in chunk {
                if out.len() == limit {
                    break;
                }
                if let Some(record) = found.remove(id) {
                    out.push(Counted {
                        record,
                        times: *times,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// When `record`'s strength falls below the policy's `archive_below`, within
/// [`FADING_HORIZON_MS`] of `now`; `None` when it stays above it that long (or
/// archiving is off).
fn archive_time(policy: &Policy, record: &MemoryRecord, now: Timestamp) -> Option<Timestamp> {
    let below = |t| policy.strength_at(record, t) < policy.forgetting.archive_below;
    let (mut lo, mut hi) = (now, now.saturating_add(FADING_HORIZON_MS));
    if !below(hi) {
        return None;
    }
    // To the second: 40 halvings of ten years.
    while hi - lo > 1_000 {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

//! Records in time order: a session's and a namespace's listings, neighbouring turns, a
//! session's timeline and statistics.

use super::codec;
use super::keys;
use super::kv::{Range, Visit};
use super::*;
use crate::clock::Timestamp;
use crate::error::Result;
use crate::model::{MemoryId, MemoryRecord};

impl Store {
    pub(super) fn listing(
        &self,
        prefix: &[u8],
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        let mut end_buf = Vec::new();
        let bound;
        let range = match before {
            Some((t, id)) => {
                bound = {
                    let mut k = keys::listing_at(prefix, t);
                    k.extend_from_slice(&id.0.to_be_bytes());
                    k
                };
                Range::between(prefix, &bound)
            }
            None => Range::prefix(prefix, &mut end_buf),
        };
        let mut ids = Vec::new();
        if limit == 0 {
            return Ok(ids);
        }
        self.inner.kv.scan(range, true, &mut |k, _| {
            if let Some((_, id)) = keys::listing_time_id(k) {
                ids.push(id);
            }
            Ok(if ids.len() >= limit {
                Visit::Stop
            } else {
                Visit::Continue
            })
        })?;
        Ok(ids)
    }

    /// A session's record ids, newest event first, optionally only those before
    /// `(time, id)` (for paging).
    pub fn session_ids(
        &self,
        namespace: &str,
        session: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        self.listing(&keys::session_prefix(namespace, session), before, limit)
    }

    /// The records next to `at` (a record's event time and id) in its session's listing, as
    /// (event time, id): up to `n` before it (nearest first) and up to `n` after it (nearest
    /// first), none further than `max_gap` in time from `at`. Only ids `keep` accepts
    /// count; at most `4n` entries are looked at on each side, so a session crowded with
    /// unwanted records costs a bounded scan.
    pub fn session_neighbours(
        &self,
        namespace: &str,
        session: &str,
        at: (Timestamp, MemoryId),
        n: usize,
        max_gap: Timestamp,
        keep: impl Fn(MemoryId) -> bool,
    ) -> Result<(Vec<Listed>, Vec<Listed>)> {
        use std::ops::Bound;
        let prefix = keys::session_prefix(namespace, session);
        let here = keys::session_entry(namespace, session, at.0, at.1);
        let mut end_buf = Vec::new();
        let whole = Range::prefix(&prefix, &mut end_buf);
        let side = |range: Range<'_>, reverse: bool| -> Result<Vec<Listed>> {
            let mut walk = Side::new(at.0, n, max_gap);
            if n > 0 {
                self.inner.kv.scan(range, reverse, &mut |k, _| {
                    Ok(walk.step(keys::listing_time_id(k), &keep))
                })?;
            }
            Ok(walk.found)
        };
        let before = side(
            Range {
                start: whole.start,
                end: Bound::Excluded(&here),
            },
            true,
        )?;
        let after = side(
            Range {
                start: Bound::Excluded(&here),
                end: whole.end,
            },
            false,
        )?;
        Ok((before, after))
    }

    /// A whole session's listing, oldest first, in one scan: `None` when it holds more
    /// than `limit` entries. A small session read once answers every
    /// [`neighbours_in`] of it without a scan per record.
    pub fn session_listing(
        &self,
        namespace: &str,
        session: &str,
        limit: usize,
    ) -> Result<Option<Vec<Listed>>> {
        let prefix = keys::session_prefix(namespace, session);
        let mut end_buf = Vec::new();
        let mut all = Vec::new();
        let mut over = false;
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end_buf), false, &mut |k, _| {
                if all.len() == limit {
                    over = true;
                    return Ok(Visit::Stop);
                }
                if let Some(entry) = keys::listing_time_id(k) {
                    all.push(entry);
                }
                Ok(Visit::Continue)
            })?;
        Ok((!over).then_some(all))
    }

    /// A namespace's record ids, newest event first.
    pub fn namespace_ids(
        &self,
        namespace: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryId>> {
        self.listing(&keys::namespace_prefix(namespace), before, limit)
    }

    /// A session's records, newest first (without embeddings).
    pub fn timeline(
        &self,
        namespace: &str,
        session: &str,
        before: Option<(Timestamp, MemoryId)>,
        limit: usize,
    ) -> Result<Vec<MemoryRecord>> {
        let ids = self.session_ids(namespace, session, before, limit)?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(r) = self.get_light(id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Statistics of one session.
    pub fn session_stats(&self, namespace: &str, session: &str) -> Result<Option<SessionStats>> {
        self.decoded(&keys::session_stats(namespace, session))
    }

    /// Every session of a namespace, by session id.
    pub fn sessions(&self, namespace: &str) -> Result<Vec<SessionStats>> {
        let prefix = keys::session_stats_prefix(namespace);
        let mut end = Vec::new();
        let mut out = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
                out.push(codec::decode(k, v)?);
                Ok(Visit::Continue)
            })?;
        Ok(out)
    }
}

/// [`Store::session_neighbours`] of `at` in a session's whole `listing` (oldest first, as
/// [`Store::session_listing`] reads it): the same answer, found in memory.
pub fn neighbours_in(
    listing: &[Listed],
    at: Listed,
    n: usize,
    max_gap: Timestamp,
    keep: impl Fn(MemoryId) -> bool,
) -> (Vec<Listed>, Vec<Listed>) {
    let (first_after, last_before) = match listing.binary_search(&at) {
        Ok(i) => (i + 1, i),
        Err(i) => (i, i),
    };
    let side = |entries: &mut dyn Iterator<Item = &Listed>| {
        let mut walk = Side::new(at.0, n, max_gap);
        if n > 0 {
            for &entry in entries {
                if walk.step(Some(entry), &keep) == Visit::Stop {
                    break;
                }
            }
        }
        walk.found
    };
    let before = side(&mut listing[..last_before].iter().rev());
    let after = side(&mut listing[first_after..].iter());
    (before, after)
}

/// One side of a record's neighbours, walked away from it in time order: at most `n`
/// kept entries, at most `4n` looked at, none further than `max_gap` from `at`.
struct Side {
    at: Timestamp,
    n: usize,
    max_gap: Timestamp,
    looked: usize,
    found: Vec<Listed>,
}

impl Side {
    fn new(at: Timestamp, n: usize, max_gap: Timestamp) -> Self {
        Side {
            at,
            n,
            max_gap,
            looked: 0,
            found: Vec::with_capacity(n),
        }
    }

    /// Takes the next entry (`None`: a key that is not a listing entry); says whether to
    /// go on.
    fn step(&mut self, entry: Option<Listed>, keep: impl Fn(MemoryId) -> bool) -> Visit {
        self.looked += 1;
        match entry {
            // Listings are time-ordered: everything further is further still.
            Some((t, _)) if t.abs_diff(self.at) > self.max_gap.unsigned_abs() => {
                return Visit::Stop;
            }
            Some((t, id)) if keep(id) => self.found.push((t, id)),
            _ => {}
        }
        if self.found.len() >= self.n || self.looked >= 4 * self.n {
            Visit::Stop
        } else {
            Visit::Continue
        }
    }
}

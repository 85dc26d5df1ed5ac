//! The durable work queues (what waits to be embedded, evaluated, condensed, promoted, …)
//! and the change log the derived indexes follow.

use super::codec;
use super::keys::{self, family, meta};
use super::kv::{Range, Visit};
use super::*;
use crate::error::{Error, Result};
use crate::model::MemoryId;

impl Store {
    /// Up to `limit` records waiting on `queue`, oldest id first.
    pub fn queued(&self, queue: Queue, limit: usize) -> Result<Vec<MemoryId>> {
        let prefix = keys::queue_prefix(queue as u8);
        let mut end = Vec::new();
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, _| {
                if let Some(id) = keys::id_from_key(k) {
                    out.push(id);
                }
                Ok(if out.len() >= limit {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            })?;
        Ok(out)
    }

    /// Items in a work queue, counted up to `cap` (a scrape must stay cheap however far
    /// behind a queue is).
    pub fn queue_depth(&self, queue: Queue, cap: usize) -> Result<usize> {
        let prefix = keys::queue_prefix(queue as u8);
        let mut end = Vec::new();
        self.count_keys(Range::prefix(&prefix, &mut end), cap)
    }

    /// Keys in `range`, counted up to `at_most` (the scan stops there).
    fn count_keys(&self, range: Range<'_>, at_most: usize) -> Result<usize> {
        let mut n = 0;
        if at_most == 0 {
            return Ok(0);
        }
        self.inner.kv.scan(range, false, &mut |_, _| {
            n += 1;
            Ok(if n >= at_most {
                Visit::Stop
            } else {
                Visit::Continue
            })
        })?;
        Ok(n)
    }

    /// Whether `id` waits on `queue`.
    pub fn is_queued(&self, queue: Queue, id: MemoryId) -> Result<bool> {
        Ok(self
            .inner
            .kv
            .get(&keys::queue_item(queue as u8, id))?
            .is_some())
    }

    /// Change-log entries with a sequence above `after`, oldest first, at most `limit`.
    pub fn changes_after(&self, after: u64, limit: usize) -> Result<Vec<(u64, Change)>> {
        let start = keys::change(after.saturating_add(1));
        let end = [family::CHANGE + 1];
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.inner
            .kv
            .scan(Range::between(&start, &end), false, &mut |k, v| {
                let seq = keys::change_seq(k).ok_or_else(|| Error::Corrupt {
                    key: format!("{k:02x?}"),
                    message: "change key without a sequence".into(),
                })?;
                out.push((seq, codec::decode(k, v)?));
                Ok(if out.len() >= limit {
                    Visit::Stop
                } else {
                    Visit::Continue
                })
            })?;
        Ok(out)
    }

    /// How many change-log entries have a sequence above `after`, counted up to
    /// `at_most` (the scan stops there). Sequences are shared with the audit log and
    /// recall outcomes, so a difference of sequences would count those too.
    pub fn changes_counted_after(&self, after: u64, at_most: usize) -> Result<usize> {
        let start = keys::change(after.saturating_add(1));
        let end = [family::CHANGE + 1];
        self.count_keys(Range::between(&start, &end), at_most)
    }

    /// How far the change log has been truncated (`None` for a store that never truncated
    /// it, or one written before the mark existed).
    pub fn changes_truncated(&self) -> Result<Option<u64>> {
        read_u64(self.inner.kv.as_ref(), meta::CHANGES_TRUNCATED)
    }

    /// The oldest change-log sequence still kept, if any.
    pub fn first_change(&self) -> Result<Option<u64>> {
        Ok(self.changes_after(0, 1)?.first().map(|(s, _)| *s))
    }

    /// The sequence the next change will get (so `last_seq() == next - 1`).
    pub fn next_seq(&self) -> u64 {
        self.inner.committer.next_seq()
    }

    /// Write sets waiting for the commit thread (recall's reinforcement among them).
    pub fn commit_backlog(&self) -> u64 {
        self.inner.committer.backlog()
    }
}

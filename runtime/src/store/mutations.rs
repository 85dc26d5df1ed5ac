//! Writing: ids and recall numbers handed out, write sets sent to the commit thread (and
//! log entries a standby applies), tombstones of archived-then-forgotten records.

use std::sync::atomic::{AtomicU32, Ordering};

use super::keys::{self, family};
use super::kv::{Range, Visit};
use super::*;
use crate::error::{Error, Result};
use crate::model::MemoryId;

impl Store {
    /// Hands out `n` fresh record ids, consecutive, from the store's block
    /// ([`Store::id_block`]). Ids of writes that never commit are skipped, never reused.
    pub fn allocate_ids(&self, n: usize) -> Result<Vec<MemoryId>> {
        let n32 = u32::try_from(n).map_err(|_| Error::invalid("batch", "too many records"))?;
        let first = self.take(&self.inner.next_id, n32, "record ids")?;
        Ok((first..first + n32).map(MemoryId).collect())
    }

    /// Takes `n` numbers from `counter`, all within the store's block.
    fn take(&self, counter: &AtomicU32, n: u32, what: &str) -> Result<u32> {
        // The counter holds the next number to hand out, so it may reach one past the
        // block's last id; as a u32 it stops at u32::MAX, which is then never handed out.
        let end = (u64::from(self.inner.ids.last) + 1).min(u64::from(u32::MAX));
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                let next = u64::from(cur) + u64::from(n);
                (next <= end).then_some(next as u32)
            })
            .map_err(|_| {
                Error::storage(
                    self.backend().as_str(),
                    format!("{what} exhausted: this store hands out {}", self.inner.ids),
                )
            })
    }

    /// Refuses an id outside the store's block: another partition's.
    fn check_in_block(&self, id: u32, what: &str) -> Result<()> {
        if self.inner.ids.contains(id) {
            Ok(())
        } else {
            Err(Error::invalid(
                "id",
                format!(
                    "{what} is outside the ids this store hands out ({}): it belongs to \
                     another cluster partition's store",
                    self.inner.ids
                ),
            ))
        }
    }

    /// Makes sure ids up to and including `id` are never handed out by
    /// [`Store::allocate_ids`]: for writers that bring their own ids (an import). The next
    /// commit persists the counter.
    pub fn reserve_ids_through(&self, id: MemoryId) -> Result<()> {
        self.check_in_block(id.0, &id.to_string())?;
        let next = id.0.checked_add(1).ok_or_else(|| {
            Error::storage(
                self.backend().as_str(),
                format!("{id} is the last possible id; no id is left after it"),
            )
        })?;
        self.inner.next_id.fetch_max(next, Ordering::SeqCst);
        Ok(())
    }

    /// The next id [`Store::allocate_ids`] would hand out: every id below it was used by
    /// a record, a quarantined input or a purged record (or, in stores from before recalls
    /// were counted apart, a recall), or skipped. An export
    /// carries it so the importing store never reuses one of those ids.
    pub fn next_id(&self) -> u32 {
        self.inner.next_id.load(Ordering::SeqCst)
    }

    /// Hands out a recall number (the `n` of `rcl-n`), never one handed out before: the
    /// counter is persisted with every commit, as the record ids' is.
    pub fn allocate_recall(&self) -> Result<u32> {
        self.take(&self.inner.next_recall, 1, "recall numbers")
    }

    /// The next recall number [`Store::allocate_recall`] would hand out.
    pub fn next_recall(&self) -> u32 {
        self.inner.next_recall.load(Ordering::SeqCst)
    }

    /// Makes sure recall numbers up to and including `n` are never handed out (an import
    /// brings its own). The next commit persists the counter.
    pub fn reserve_recalls_through(&self, n: u32) -> Result<()> {
        self.check_in_block(n, &format!("rcl-{n:08x}"))?;
        let next = n.checked_add(1).ok_or_else(|| {
            Error::storage(
                self.backend().as_str(),
                format!("rcl-{n:08x} is the last possible recall; none is left after it"),
            )
        })?;
        self.inner.next_recall.fetch_max(next, Ordering::SeqCst);
        Ok(())
    }

    /// Applies `writes` atomically and returns once they are durable. Blocks the calling
    /// thread (about a millisecond); async code should prefer [`Store::write_async`].
    pub fn write(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_blocking(writes)
    }

    /// Queues `writes` for the next group commit and returns at once, without waiting for
    /// the flush: for side effects nobody waits on (recall's reinforcement). Writes are
    /// committed in the order they are queued, so any later [`Store::write`] returning
    /// means these are durable too; a crash before then loses them.
    pub fn write_detached(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_detached(writes)
    }

    /// [`Store::write`] for async callers: awaits the durable commit without blocking.
    pub async fn write_async(&self, writes: WriteSet) -> Result<()> {
        self.inner.committer.submit_async(writes).await
    }

    /// Returns once every write queued before this call (detached ones included) is
    /// durable.
    pub async fn sync(&self) -> Result<()> {
        self.write_async(WriteSet::new()).await
    }

    /// Applies entries of a cluster log, (position, bytes from
    /// [`encode_entry`]), as they are: one transaction with the last position, the
    /// entries at or below the applied position skipped, the catalog and counters then
    /// brought up to date. What a standby's store does with its owner's log.
    pub fn apply_logged(&self, entries: Vec<(u64, Vec<u8>)>) -> Result<()> {
        self.inner.committer.apply_logged(entries)
    }

    /// The position of the last cluster log entry applied to this store (0: none).
    pub fn log_applied(&self) -> Result<u64> {
        log::applied(self.inner.kv.as_ref())
    }

    /// A purged record's tombstone (the namespace it belonged to), if `id` was purged.
    pub fn tombstone(&self, id: MemoryId) -> Result<Option<String>> {
        Ok(self
            .inner
            .kv
            .get(&keys::tombstone(id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Every tombstone, in id order: the purged ids and the namespace each belonged to.
    pub fn for_each_tombstone(
        &self,
        mut f: impl FnMut(MemoryId, String) -> Result<Visit>,
    ) -> Result<()> {
        let mut end = Vec::new();
        self.inner.kv.scan(
            Range::prefix(&[family::TOMBSTONE], &mut end),
            false,
            &mut |k, v| match keys::id_from_key(k) {
                Some(id) if k.len() == 5 => f(id, String::from_utf8_lossy(v).into_owned()),
                _ => Ok(Visit::Continue),
            },
        )
    }

    /// Writes a tombstone for a record purged elsewhere (an import of its history), so its
    /// audit log stays isolated to `namespace` as after a purge here. Refuses an id that
    /// holds a live record.
    pub fn restore_tombstone(&self, id: MemoryId, namespace: &str) -> Result<()> {
        if self.inner.kv.get(&keys::record(id))?.is_some() {
            return Err(Error::invalid(
                "id",
                format!("{id} holds a live record; only a purged id gets a tombstone"),
            ));
        }
        let op = kv::Op::Put(keys::tombstone(id).to_vec(), namespace.as_bytes().to_vec());
        self.inner.kv.commit(&[&[op]])
    }
}

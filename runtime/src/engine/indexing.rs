//! Keeping the derived indexes (vectors, keywords) following the store: reconciling them
//! with the change log on open, applying logged changes to their in-memory tails, building
//! and committing them when due, rebuilding them from the store, and `reindex`. What an
//! indexing pass does is decided here, once; who schedules the passes is either this
//! handle's own indexer threads (a substrate used as a library) or the runtime's Indexer
//! actor, and both run [`Substrate::index_step`].

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::{Substrate, SubstrateOptions};
use crate::embed::embed_records;
use crate::error::{Error, Result};
use crate::index::text::ANALYZER_VERSION;
use crate::store::{Change, Mutation, Queue, Store, StoreOptions, Visit, WriteSet};

/// Which index an indexing pass works on ([`Substrate::index_pass_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// The BM25 keyword index: commits are cheap and frequent.
    Keywords = 0,
    /// The vector index: tree builds are slow and may lag behind ingest.
    Vectors = 1,
}

/// When the oldest and the newest change an index has not built yet were applied.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StagedTimes {
    oldest: Option<Instant>,
    newest: Option<Instant>,
}

/// Counts from one indexing pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexPass {
    /// Changes applied to the tails.
    pub applied: usize,
    /// Whether the indexes were built / committed.
    pub built: bool,
    /// The pass stopped applying at its bound: the log holds more, run the next one now.
    pub more: bool,
}

impl Substrate {
    /// At open: rebuilds an index the change log cannot catch up, then applies the log's
    /// tail to the indexes' tails, building them now only when the tail is small.
    pub(super) fn reconcile(&self) -> Result<()> {
        let store = &self.inner.store;
        let vec_wm = self.inner.vectors.watermark()?;
        let kw_wm = self.inner.keywords.watermark()?;
        let first = store.first_change()?;
        let last = store.next_seq().saturating_sub(1);
        // An index older than the oldest kept change (lost, or from before a truncation)
        // cannot be caught up from the log: rebuild it from the store. The truncation mark
        // says exactly how far the log was dropped; sequences are shared with the audit
        // log, so without it (stores from before the mark) an index is judged by the first
        // kept change, which makes an empty log after audits look stale on every start.
        let truncated = store.changes_truncated()?;
        let stale = |wm: u64| match truncated {
            Some(t) => wm < t,
            None => wm < last && first.is_none_or(|f| wm + 1 < f),
        };
        // Without the mark, an empty index over records is judged by the first kept
        // change too; with it (every store made since) the mark alone says whether the log
        // still holds every change an index lacks — a copy whose vector index was never
        // built, over a whole log, takes the log instead of a rebuild.
        let unmarked = truncated.is_none() && !store.is_empty() && first != Some(1);
        let vec_stale =
            stale(vec_wm) || (unmarked && vec_wm == 0 && self.inner.vectors.len()? == 0);
        let kw_stale = stale(kw_wm) || (unmarked && kw_wm == 0 && self.inner.keywords.len()? == 0);
        if vec_stale || kw_stale {
            tracing::warn!(
                vec_wm,
                kw_wm,
                ?first,
                last,
                "an index is behind the kept change log; rebuilding it from the store"
            );
            self.rebuild(vec_stale, kw_stale)?;
        }
        let from = self
            .inner
            .vectors
            .watermark()?
            .min(self.inner.keywords.watermark()?);
        self.inner.applied.store(from, Ordering::SeqCst);
        let started = Instant::now();
        let applied = self.catch_up()?;
        // A small tail is built now, as a close builds one. A large one is left to the
        // indexer, as a close leaves it: searches read the tails exactly meanwhile, and an
        // open's time does not grow with the tail (a cluster's takeover waits for this
        // open, and a build of a hundred thousand changes takes half a minute on a busy
        // machine).
        let small = |pending: usize| pending <= super::CLOSE_BUILD_LIMIT;
        if small(self.inner.keywords.pending()) {
            self.index_pass_for(IndexKind::Keywords, true)?;
        }
        if small(self.inner.vectors.pending()) {
            self.index_pass_for(IndexKind::Vectors, true)?;
        }
        if !self.indexes_caught_up()? {
            self.wake_indexer();
        }
        if started.elapsed().as_secs() >= 1 || applied > super::CLOSE_BUILD_LIMIT {
            tracing::info!(
                changes = applied,
                from,
                ms = started.elapsed().as_millis() as u64,
                "the indexes took the change log's tail; what is left is built in the background"
            );
        }
        Ok(())
    }

    /// Re-embeds every record with `opts.embedder`, records its dimension in the store and
    /// rebuilds both indexes — the way out of a dimension mismatch after changing embedders.
    /// `progress(done, total)` is called as records are re-embedded.
    pub async fn reindex(
        dir: &Path,
        opts: SubstrateOptions,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Substrate> {
        let embedder = opts.embedder.clone();
        {
            let store = Store::open(
                &dir.join("store"),
                StoreOptions {
                    backend: opts.backend,
                    log: opts.log.clone(),
                    standby: false,
                    ids: opts.ids,
                },
            )?;
            let total = store.len();
            let mut ids = Vec::with_capacity(total as usize);
            store.for_each_id(|id| {
                ids.push(id);
                Ok(Visit::Continue)
            })?;
            let mut done = 0u64;
            for chunk in ids.chunks(256) {
                let mut records = Vec::with_capacity(chunk.len());
                for id in chunk {
                    if let Some(r) = store.get_light(*id)? {
                        records.push(r);
                    }
                }
                let texts: Vec<&str> = records.iter().map(|r| r.text.as_str()).collect();
                let embedded = embed_records(embedder.as_ref(), &texts).await?;
                let mut writes = WriteSet::new();
                for (mut r, e) in records.into_iter().zip(embedded) {
                    let id = r.id;
                    r.embedding = Some(e.vector);
                    writes.push(Mutation::Dequeue(Queue::Enrich, id));
                    writes.push(Mutation::Update {
                        record: Box::new(r),
                        reindex: true,
                    });
                    // Always, so passages of an earlier embedder never outlive it.
                    writes.push(Mutation::SetPassages(id, e.passages));
                }
                store.write_async(writes).await?;
                done += chunk.len() as u64;
                progress(done, total);
            }
            store.reset_dimension(embedder.dimensions(), embedder.name())?;
        }
        for sub in ["vectors", "keywords"] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
            }
        }
        // Opening finds both indexes missing and rebuilds them from the store.
        Substrate::open(dir, opts)
    }

    /// Rebuilds the keyword index when it was built by another analyzer version.
    pub(super) fn check_analyzer(&self) -> Result<()> {
        let store = &self.inner.store;
        match store.analyzer_version()? {
            Some(v) if v == ANALYZER_VERSION => return Ok(()),
            Some(v) => {
                tracing::warn!(
                    from = v,
                    to = ANALYZER_VERSION,
                    "the text analyzer changed; rebuilding the keyword index from the store"
                );
                self.rebuild(false, true)?;
            }
            None if !store.is_empty() => self.rebuild(false, true)?,
            None => {}
        }
        store.set_analyzer_version(ANALYZER_VERSION)
    }

    /// Rebuilds the chosen indexes from the store (what `shadowbrain reindex` runs).
    pub fn rebuild(&self, vectors: bool, keywords: bool) -> Result<()> {
        // Nothing may apply or build meanwhile (same lock order as `index_pass`).
        let _no_applier = self
            .inner
            .apply_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _builders = self
            .inner
            .build_locks
            .each_ref()
            .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()));
        self.inner.rebuilds.fetch_add(1, Ordering::Relaxed);
        let store = &self.inner.store;
        // Changes written from here on are replayed on top of the rebuild.
        let upto = store.next_seq().saturating_sub(1);
        if vectors {
            self.inner.vectors.clear()?;
            let mut batch = Vec::with_capacity(10_000);
            store.for_each_embedding(|id, v| {
                batch.push((id.0, v));
                if batch.len() >= 10_000 {
                    self.inner.vectors.upsert(&batch);
                    batch.clear();
                }
                Ok(Visit::Continue)
            })?;
            self.inner.vectors.upsert(&batch);
            self.inner.vectors.build_at_once(upto)?;
        }
        if keywords {
            self.inner.keywords.clear()?;
            let mut batch = Vec::with_capacity(10_000);
            store.for_each_id(|id| {
                if let Some(r) = store.get_light(id)? {
                    batch.push((id.0, r.text));
                }
                if batch.len() >= 10_000 {
                    self.inner.keywords.upsert(&batch);
                    batch.clear();
                }
                Ok(Visit::Continue)
            })?;
            self.inner.keywords.upsert(&batch);
            self.inner.keywords.commit(upto)?;
        }
        Ok(())
    }

    /// Applies every change the store has logged since the last call to the indexes'
    /// in-memory tails, where search sees them at once. Recall calls this first, so it
    /// never misses an acknowledged write even if the indexer thread is behind.
    pub fn catch_up(&self) -> Result<usize> {
        self.apply_changes(usize::MAX)
    }

    /// Applies logged changes to the tails, about `max` at most (whole log batches). The
    /// indexer threads apply a bounded share per pass: under sustained ingest, catching up
    /// completely may take longer than ingest takes to log more, and their commits must
    /// not wait for that.
    fn apply_changes(&self, max: usize) -> Result<usize> {
        let _one_applier = self
            .inner
            .apply_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let store = &self.inner.store;
        let mut total = 0;
        while total < max {
            let from = self.inner.applied.load(Ordering::SeqCst);
            // Nothing committed past it (every acknowledged write is below `next_seq`):
            // no scan of the log, which every recall would otherwise pay to find nothing.
            if from.saturating_add(1) >= store.next_seq() {
                return Ok(total);
            }
            let changes = store.changes_after(from, self.inner.indexing.batch)?;
            let Some((last, _)) = changes.last() else {
                return Ok(total);
            };
            let mut docs = Vec::new();
            let mut vecs = Vec::new();
            let mut stored = Vec::new();
            let (mut kw_removed, mut vec_removed) = (Vec::new(), Vec::new());
            // Past its memory budget the vector tail stages ids only: do not even read the
            // embeddings then (1.5 KB each at 384 dimensions); builds read them once.
            let spill = self.inner.vectors.spilling();
            // An index skips what it already holds: after an open, the log is read from the
            // older watermark of the two (the vectors', when a big build was left for
            // later), and staging again what the keyword index committed long ago would
            // cost a node taking over seconds of tokenising and a re-commit of every such
            // document.
            let (kw_done, vec_done) = (
                self.inner.keywords.watermark()?,
                self.inner.vectors.watermark()?,
            );
            for (seq, change) in &changes {
                let (kw, vec) = (*seq > kw_done, *seq > vec_done);
                match change {
                    Change::Upsert(id) if kw && vec && !spill => match store.get(*id)? {
                        Some(r) => {
                            if let Some(e) = r.embedding {
                                vecs.push((id.0, e));
                            }
                            docs.push((id.0, r.text));
                        }
                        None => {
                            kw_removed.push(id.0);
                            vec_removed.push(id.0);
                        }
                    },
                    Change::Upsert(id) if kw || (vec && spill) => match store.get_light(*id)? {
                        Some(r) => {
                            if vec {
                                stored.push(id.0);
                            }
                            if kw {
                                docs.push((id.0, r.text));
                            }
                        }
                        None => {
                            if kw {
                                kw_removed.push(id.0);
                            }
                            if vec {
                                vec_removed.push(id.0);
                            }
                        }
                    },
                    // The vectors only: the embedding alone (no record decoded).
                    Change::Upsert(id) if vec => match store.embedding(*id)? {
                        Some(e) => vecs.push((id.0, e)),
                        // Not embedded yet (its `Embedded` change follows) or gone.
                        None if store.get_light(*id)?.is_none() => vec_removed.push(id.0),
                        None => {}
                    },
                    Change::Upsert(_) => {}
                    Change::Embedded(id) if vec && spill => stored.push(id.0),
                    // No embedding: the record was purged since, and its removal follows.
                    Change::Embedded(id) if vec => {
                        if let Some(e) = store.embedding(*id)? {
                            vecs.push((id.0, e));
                        }
                    }
                    Change::Embedded(_) => {}
                    Change::Remove(id) => {
                        if kw {
                            kw_removed.push(id.0);
                        }
                        if vec {
                            vec_removed.push(id.0);
                        }
                    }
                }
            }
            self.inner.keywords.upsert(&docs);
            self.inner.vectors.upsert(&vecs);
            self.inner.vectors.stage_stored(&stored);
            self.inner.keywords.remove(&kw_removed);
            self.inner.vectors.remove(&vec_removed);
            self.inner.applied.store(*last, Ordering::SeqCst);
            total += changes.len();
            let now = Instant::now();
            let mut times = self.staged_times();
            for t in times.iter_mut() {
                t.oldest.get_or_insert(now);
                t.newest = Some(now);
            }
        }
        Ok(total)
    }

    /// Catches the tails up, then commits the keyword index and builds the vector index
    /// when each is due — its count of staged changes reached, or a quiet period after the
    /// last change, or the oldest staged change too old — or at once when `force`.
    pub fn index_pass(&self, force: bool) -> Result<IndexPass> {
        let keywords = self.index_pass_for(IndexKind::Keywords, force)?;
        let vectors = self.index_pass_for(IndexKind::Vectors, force)?;
        Ok(IndexPass {
            applied: keywords.applied + vectors.applied,
            built: keywords.built || vectors.built,
            more: keywords.more || vectors.more,
        })
    }

    /// One index's share of [`Substrate::index_pass`]. Indexers run one loop per index, so
    /// keyword commits never wait for a tree build (which takes minutes on a busy machine);
    /// without `force` a pass applies a bounded share of the change log, so a pass ends
    /// even while ingest logs changes faster than they are applied.
    pub fn index_pass_for(&self, kind: IndexKind, force: bool) -> Result<IndexPass> {
        let opts = &self.inner.indexing;
        let share = opts.keyword_every.min(opts.build_every);
        let applied = if force {
            self.catch_up()?
        } else {
            self.apply_changes(share)?
        };
        let _one_builder = self.inner.build_locks[kind as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut pass = IndexPass {
            applied,
            built: false,
            more: !force && applied >= share,
        };
        let (staged, every, watermark) = match kind {
            IndexKind::Keywords => (
                self.inner.keywords.pending(),
                opts.keyword_every,
                self.inner.keywords.watermark()?,
            ),
            IndexKind::Vectors => (
                self.inner.vectors.pending(),
                opts.build_every,
                self.inner.vectors.watermark()?,
            ),
        };
        let times = self.staged_times()[kind as usize];
        let due = staged >= every
            || times.newest.is_some_and(|t| t.elapsed() >= opts.debounce)
            || times.oldest.is_some_and(|t| t.elapsed() >= opts.max_delay);
        let upto = self.inner.applied.load(Ordering::SeqCst);
        if (force || due) && (staged > 0 || watermark < upto) {
            // Changes applied after `upto` was read may be built too; their watermark stays
            // lower, so a restart replays them (applying a change twice is harmless).
            self.staged_times()[kind as usize] = StagedTimes::default();
            match kind {
                IndexKind::Keywords => self.inner.keywords.commit(upto)?,
                IndexKind::Vectors if force => {
                    self.inner.vectors.build(upto)?;
                }
                // Builds may wait for ingest and recall (lower CPU priority): on a busy
                // machine the trees lag behind, and acknowledged writes are searchable
                // meanwhile through the tail, whose vectors past its memory budget are
                // read back from the store. One bounded transaction per pass; what it
                // left is due at once.
                IndexKind::Vectors => {
                    let stats = self.inner.vectors.build_with(upto, true)?;
                    if stats.remaining > 0 {
                        pass.more = true;
                        let now = Instant::now();
                        let mut times = self.staged_times();
                        let t = &mut times[kind as usize];
                        // As old as `max_delay`: due at the next pass.
                        t.oldest = Some(now.checked_sub(opts.max_delay).unwrap_or(now));
                        t.newest.get_or_insert(now);
                    }
                }
            }
            self.truncate_changes()?;
            pass.built = true;
        }
        Ok(pass)
    }

    /// One scheduled indexing pass of `kind` (never forced), logged; whether the log holds
    /// more, so the caller should run the next one at once. A failed pass is logged and
    /// reported as "no more": the scheduler's next tick retries it. A keyword pass is
    /// followed by a round of update detection, which needs the records it applied (not
    /// on a standby: its owner's log carries what the owner's detection decided).
    pub fn index_step(&self, kind: IndexKind) -> bool {
        let more = self.index_pass_step(kind);
        match kind {
            IndexKind::Keywords if self.inner.standby => more,
            IndexKind::Keywords => self.updates_step() | more,
            IndexKind::Vectors => more,
        }
    }

    fn index_pass_step(&self, kind: IndexKind) -> bool {
        match self.index_pass_for(kind, false) {
            Ok(pass) => {
                if pass.built {
                    tracing::debug!(?kind, ?pass, "index built");
                }
                pass.more
            }
            Err(Error::Closed) => {
                tracing::debug!(index = ?kind, "index pass given up: the substrate is closing");
                false
            }
            Err(e) => {
                tracing::warn!(index = ?kind, error = %e, "index pass failed; the next tick retries");
                false
            }
        }
    }

    /// When each index's oldest and newest unbuilt change were applied.
    fn staged_times(&self) -> std::sync::MutexGuard<'_, [StagedTimes; 2]> {
        self.inner
            .staged_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the change-log entries both indexes have built.
    fn truncate_changes(&self) -> Result<()> {
        let upto = self
            .inner
            .vectors
            .watermark()?
            .min(self.inner.keywords.watermark()?);
        if self.inner.truncated.fetch_max(upto, Ordering::SeqCst) < upto {
            self.inner
                .store
                .write(WriteSet(vec![Mutation::TruncateChanges(upto)]))?;
        }
        Ok(())
    }

    /// Applies every waiting change and builds both indexes now (one build).
    pub fn flush_indexes(&self) -> Result<()> {
        self.index_pass(true)?;
        Ok(())
    }

    /// Changes the store has logged that the slower of the two indexes has not built,
    /// counted up to `at_most` (the count reads the change log that far). Not the
    /// distance from the watermark to the last sequence: audit entries and recall
    /// outcomes take sequences too and no index builds them, so after a burst of
    /// feedback that distance stays large on indexes that are built.
    pub fn unbuilt(&self, at_most: usize) -> Result<usize> {
        let built = self
            .inner
            .vectors
            .watermark()?
            .min(self.inner.keywords.watermark()?);
        self.inner.store.changes_counted_after(built, at_most)
    }

    /// Whether both indexes have built everything the store has logged.
    pub fn indexes_caught_up(&self) -> Result<bool> {
        let last = self.inner.store.next_seq().saturating_sub(1);
        Ok(self.inner.vectors.watermark()? >= last && self.inner.keywords.watermark()? >= last)
    }

    pub(super) fn wake_indexer(&self) {
        for tx in self
            .inner
            .wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = tx.send(());
        }
    }

    pub(super) fn start_indexer(&self) -> Result<()> {
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for (kind, name) in [
            (IndexKind::Keywords, "keyword-indexer"),
            (IndexKind::Vectors, "vector-indexer"),
        ] {
            let (tx, rx) = mpsc::channel::<()>();
            senders.push(tx);
            // The thread holds only a weak handle, so dropping every Substrate ends it.
            let weak = Arc::downgrade(&self.inner);
            let debounce = self.inner.indexing.debounce;
            let handle = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    // Nobody waits on a pass (see `crate::background`).
                    crate::background::lower_priority();
                    loop {
                        match rx.recv_timeout(debounce) {
                            Ok(()) => while rx.try_recv().is_ok() {},
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                        let Some(inner) = weak.upgrade() else { return };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let sub = Substrate { inner };
                        while sub.index_step(kind) {}
                    }
                })
                .map_err(|e| Error::io("indexer thread", e))?;
            handles.push(handle);
        }
        *self.inner.wake.lock().unwrap_or_else(|p| p.into_inner()) = senders;
        *self.inner.indexer.lock().unwrap_or_else(|p| p.into_inner()) = handles;
        Ok(())
    }
}

//! Building the forests: the tail's vectors written into arroy in bounded transactions
//! that give their pages back, on a pool of background threads at low priority, with the
//! map grown ahead of need; cancelling, stopping and resuming builds.

use super::*;

impl VectorIndex {
    /// Writes every staged change into arroy, rebuilds the trees and records `watermark`
    /// (the caller's position in the store), in LMDB write transactions of at most
    /// [`VectorOptions::max_build_items`] changes, each committed durably before the
    /// changes it wrote leave the tail. The watermark is written with the last one.
    /// Changes staged while the build runs stay staged for the next one. Deterministic:
    /// the tree builder's RNG is seeded from `watermark` and each transaction's first id. A
    /// full LMDB map is grown and the build retried. Returns the sums over the transactions.
    pub fn build(&self, watermark: u64) -> Result<BuildStats> {
        let started = Instant::now();
        let mut total = self.build_with(watermark, false)?;
        while total.remaining > 0 {
            let next = self.build_with(watermark, false)?;
            total = BuildStats {
                upserted: total.upserted + next.upserted,
                removed: total.removed + next.removed,
                map_resizes: total.map_resizes + next.map_resizes,
                elapsed: started.elapsed(),
                ..next
            };
        }
        Ok(total)
    }

    /// Makes a build in progress, and every later one, give up soon (the closing index
    /// must not wait minutes for a tree build: what it leaves staged is still in the
    /// store's change log and is built after the next open). Builds that gave up fail
    /// with [`Error::Closed`]. Waits until no build is running, then lets builds run again.
    pub fn cancel_builds(&self) {
        self.stop_builds();
        drop(self.writer.lock().unwrap_or_else(|p| p.into_inner()));
        self.resume_builds();
    }

    /// Makes a build in progress, and every later one, give up soon, until
    /// [`VectorIndex::resume_builds`]: while the threads that run builds are stopped.
    pub fn stop_builds(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Lets builds run again after [`VectorIndex::stop_builds`].
    pub fn resume_builds(&self) {
        self.cancelled.store(false, Ordering::Relaxed);
    }

    /// One transaction of [`VectorIndex::build`]: the first
    /// [`VectorOptions::max_build_items`] staged changes, on the lower-priority threads when
    /// `background` (a build that may wait for ingest and recall). `watermark` is recorded
    /// only when nothing staged was left out (see [`BuildStats::remaining`]).
    pub fn build_with(&self, watermark: u64, background: bool) -> Result<BuildStats> {
        self.build_chunk(watermark, background, self.opts.max_build_items)
    }

    /// Everything staged in one transaction: the from-scratch path of `reindex`, where
    /// arroy builds a whole forest faster than it grows one chunk by chunk (LMDB itself
    /// writes dirty pages out past 512 MB of them).
    pub fn build_at_once(&self, watermark: u64) -> Result<BuildStats> {
        self.build_chunk(watermark, false, usize::MAX)
    }

    pub(super) fn build_chunk(
        &self,
        watermark: u64,
        background: bool,
        max_items: usize,
    ) -> Result<BuildStats> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let mut batch: Vec<(u32, Staged)> = self
            .tail_read()
            .entries
            .iter()
            .map(|(&id, staged)| (id, staged.clone()))
            .collect();
        // Item order decides LMDB page layout and thus the build: sort for determinism.
        batch.sort_unstable_by_key(|(id, _)| *id);
        let remaining = batch.len().saturating_sub(max_items.max(1));
        batch.truncate(batch.len() - remaining);
        // A partial build keeps the recorded watermark: a restart must replay what is left.
        let record = (remaining == 0).then_some(watermark);
        let upserted = batch
            .iter()
            .filter(|(_, s)| !matches!(s.change, Change::Remove))
            .count();
        let removed = batch.len() - upserted;

        let mut map_resizes = 0;
        if self.grow_ahead && upserted > 0 {
            map_resizes += self.grow_ahead_for(upserted)?;
        }
        // LMDB ties a write transaction to its thread: open, fill, build and commit it all
        // on the build thread.
        // Vectors read back from the source, kept for the hot cache (up to its budget).
        let mut read_back = HashMap::new();
        let pool = self.build_pool(background)?;
        let (items, n_trees, shards) = self.releasing_while(|| {
            pool.install(|| {
                self.write_with_growth_counted(&mut map_resizes, |wtxn| {
                    read_back.clear();
                    self.write_batch(wtxn, &batch, watermark, record, &mut read_back)
                })
            })
        })?;
        // The build read the whole forest through the map (arroy walks every item and
        // node): give those pages back now (see `MapRelease`).
        if let Ok(_shared) = self.gate.try_read() {
            self.release.release_now();
        }
        // Before the tail lets go of what the build wrote, so a search sees it either way.
        self.set_shards(shards);

        {
            let mut tail = self.tail_write();
            tail.generation += 1;
            for (id, written) in &batch {
                match &written.change {
                    Change::Upsert(v) => tail.hot.insert(*id, v.clone()),
                    Change::Stored => match read_back.remove(id) {
                        Some(v) => tail.hot.insert(*id, v),
                        None => tail.hot.remove(*id),
                    },
                    Change::Remove => tail.hot.remove(*id),
                }
                tail.unstage(*id, written.seq);
            }
        }

        let stats = BuildStats {
            upserted,
            removed,
            items,
            n_trees,
            watermark: match record {
                Some(w) => w,
                None => self.watermark()?,
            },
            remaining,
            map_resizes,
            elapsed: started.elapsed(),
        };
        tracing::debug!(?stats, "vector index built");
        Ok(stats)
    }

    /// The body of one build attempt, inside its write transaction.
    pub(super) fn write_batch(
        &self,
        wtxn: &mut RwTxn<'_>,
        batch: &[(u32, Staged)],
        seed: u64,
        record: Option<u64>,
        read_back: &mut HashMap<u32, Arc<StagedVector>>,
    ) -> arroy::Result<Result<(u64, usize, Vec<u16>)>> {
        let mut read_back_bytes = 0;
        let (mut items, mut n_trees) = (0, 0);
        // The batch is sorted by id, so each shard's changes are one run of it.
        let mut rest = batch;
        let mut shards: std::collections::BTreeSet<u16> = self.shards().iter().copied().collect();
        while let Some((first, _)) = rest.first() {
            let shard = self.shard_of(*first);
            let end = rest
                .iter()
                .position(|(id, _)| self.shard_of(*id) != shard)
                .unwrap_or(rest.len());
            let (run, next) = rest.split_at(end);
            rest = next;
            let mut writer = Writer::<Cosine>::new(self.arroy, shard, self.dimensions);
            // The builder spills tree nodes to temporary files; keep them on the index's disk.
            writer.set_tmpdir(self.dir.clone());
            // Items past the largest one are appended (`MDB_APPEND`): LMDB then fills pages,
            // where inserting at the end splits them in half and leaves one 1.5 KB vector
            // per 4 KB page.
            let (existed, mut largest) = match Reader::<Cosine>::open(wtxn, shard, self.arroy) {
                Ok(reader) => (true, reader.item_ids().max()),
                Err(arroy::Error::MissingMetadata(_)) => (false, None),
                Err(e) => return Err(e),
            };
            let mut changed = false;
            for (id, staged) in run {
                if self.cancelled.load(Ordering::Relaxed) {
                    return Err(arroy::Error::BuildCancelled);
                }
                let vector = match &staged.change {
                    Change::Upsert(v) => Some(v.clone()),
                    // `None` when it is gone from the store: its removal is (or was) logged.
                    Change::Stored => match self.read_back(*id) {
                        Ok(v) => {
                            if let Some(v) = &v
                                && read_back_bytes < self.opts.hot_cache_bytes
                            {
                                read_back_bytes += Hot::cost(v);
                                read_back.insert(*id, v.clone());
                            }
                            v
                        }
                        Err(e) => return Ok(Err(e)),
                    },
                    Change::Remove => None,
                };
                match vector {
                    Some(v) => {
                        let values = v.values();
                        if largest.is_none_or(|l| *id > l) {
                            match writer.append_item(wtxn, *id, &values) {
                                // arroy checks against the table's last key; never fail on it.
                                Err(arroy::Error::InvalidItemAppend) => {
                                    writer.add_item(wtxn, *id, &values)?
                                }
                                other => other?,
                            }
                            largest = Some(*id);
                        } else {
                            writer.add_item(wtxn, *id, &values)?;
                        }
                        changed = true;
                    }
                    None => changed |= writer.del_item(wtxn, *id)?,
                }
            }
            // arroy refuses to read an index with unbuilt changes, so adding and building
            // must share this transaction; an untouched shard is not rebuilt at all, and
            // removals alone never create one.
            if !changed && !existed {
                continue;
            }
            if changed || writer.need_build(wtxn)? {
                let first = u64::from(*first);
                let mut rng = StdRng::seed_from_u64(BUILD_SEED ^ seed ^ (first << 32));
                let mut builder = writer.builder(&mut rng);
                if let Some(n) = self.opts.n_trees {
                    builder.n_trees(n.max(1));
                }
                builder.cancel(|| self.cancelled.load(Ordering::Relaxed));
                builder.build(wtxn)?;
            }
            shards.insert(shard);
        }
        // The count bounds the shard numbers a later open probes for forests.
        let bound = shards.last().map_or(1, |&s| u64::from(s) + 1);
        write_u64(self.meta, wtxn, META_SHARDS, bound)?;
        if let Some(watermark) = record {
            write_u64(self.meta, wtxn, META_WATERMARK, watermark)?;
        }
        for &shard in &shards {
            match Reader::<Cosine>::open(wtxn, shard, self.arroy) {
                Ok(reader) => {
                    items += reader.n_items();
                    n_trees = n_trees.max(reader.n_trees());
                }
                Err(arroy::Error::MissingMetadata(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Ok((items, n_trees, shards.into_iter().collect())))
    }

    /// Runs `work` in a write transaction and commits it, growing the map and retrying on
    /// `MDB_MAP_FULL`. `work` returns `Ok(Err(e))` to abort with a domain error.
    pub(super) fn write_with_growth<T>(
        &self,
        work: impl FnMut(&mut RwTxn<'_>) -> arroy::Result<Result<T>>,
    ) -> Result<T> {
        let mut resizes = 0;
        self.write_with_growth_counted(&mut resizes, work)
    }

    pub(super) fn write_with_growth_counted<T>(
        &self,
        resizes: &mut u32,
        mut work: impl FnMut(&mut RwTxn<'_>) -> arroy::Result<Result<T>>,
    ) -> Result<T> {
        loop {
            let attempt = {
                let _shared = self.gate_read();
                self.env
                    .write_txn()
                    .map_err(arroy::Error::from)
                    .and_then(|mut wtxn| match work(&mut wtxn)? {
                        Ok(value) => {
                            wtxn.commit()?;
                            Ok(Ok(value))
                        }
                        // Dropping the transaction aborts it.
                        Err(e) => Ok(Err(e)),
                    })
            };
            match attempt {
                Ok(result) => return result,
                Err(e) if is_map_full(&e) && *resizes < MAX_GROW_RETRIES => {
                    *resizes += 1;
                    self.grow(0)?;
                }
                Err(e) => return Err(arroy_error(e)),
            }
        }
    }

    /// Grows the map ahead of a build that adds `new_items` vectors, so a large build is not
    /// thrown away halfway by `MDB_MAP_FULL`. Returns 1 if it grew.
    pub(super) fn grow_ahead_for(&self, new_items: usize) -> Result<u32> {
        let info = self.env.info();
        let page = self.env.unnamed_database_stat().page_size as usize;
        let used = info.last_page_number.saturating_add(1).saturating_mul(page);
        let per_item = self.dimensions * 4 + ITEM_OVERHEAD;
        // Vectors, then tree nodes and copy-on-write pages: three times the vectors is a
        // comfortable bound measured on 384-d data.
        let needed = used.saturating_add(new_items.saturating_mul(per_item).saturating_mul(3));
        if needed <= info.map_size {
            return Ok(0);
        }
        self.grow(needed)?;
        Ok(1)
    }

    /// Doubles the map (or more, to reach `at_least`).
    pub(super) fn grow(&self, at_least: usize) -> Result<()> {
        let _exclusive = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let current = self.env.info().map_size;
        let next = round_to_granule(current.saturating_mul(2).max(at_least));
        if next <= current {
            return Err(Error::index(
                "vector",
                format!(
                    "the LMDB map at {} cannot grow past {current} bytes; free address \
                     space or disk",
                    self.dir.display()
                ),
            ));
        }
        tracing::info!(from = current, to = next, dir = %self.dir.display(), "growing the vector index map");
        // Forgotten first: a resize that fails halfway may have unmapped the map already.
        self.release.map_moved();
        // SAFETY: the exclusive gate guarantees no transaction of this process is open.
        unsafe { self.env.resize(next)? };
        Ok(())
    }

    /// Runs `work` (a build) while another thread gives the map's pages back every
    /// [`BUILD_RELEASE_INTERVAL`]: arroy reads items and nodes through the map, no read of
    /// ours counts them, and a build of a whole shard would otherwise keep all of it
    /// mapped (hundreds of MB at 100,000 sessions). Each release walks the map's page
    /// tables, about a millisecond.
    pub(super) fn releasing_while<T>(&self, work: impl FnOnce() -> T) -> T {
        let done = std::sync::Mutex::new(false);
        let wake = std::sync::Condvar::new();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut finished = done.lock().unwrap_or_else(|p| p.into_inner());
                while !*finished {
                    let (guard, _) = wake
                        .wait_timeout(finished, BUILD_RELEASE_INTERVAL)
                        .unwrap_or_else(|p| p.into_inner());
                    finished = guard;
                    if !*finished && let Ok(_shared) = self.gate.try_read() {
                        self.release.release_now();
                    }
                }
            });
            let out = work();
            *done.lock().unwrap_or_else(|p| p.into_inner()) = true;
            wake.notify_all();
            out
        })
    }

    pub(super) fn build_pool(&self, background: bool) -> Result<&rayon::ThreadPool> {
        let cell = if background {
            &self.background_pool
        } else {
            &self.build_pool
        };
        if let Some(pool) = cell.get() {
            return Ok(pool);
        }
        let threads = if background {
            self.opts.background_build_threads
        } else {
            self.opts.build_threads
        };
        let mut builder = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|_| "shadowbrain-vector-build".to_string());
        if background {
            builder = builder.start_handler(|_| crate::background::lower_priority());
        }
        let pool = builder.build().map_err(|e| {
            Error::index(
                "vector",
                format!(
                    "cannot start the index build thread ({e}); check the process thread limit"
                ),
            )
        })?;
        // Only build() gets here, under the writer mutex: nobody races to set it.
        Ok(cell.get_or_init(|| pool))
    }

    pub(super) fn gate_read(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// How often a running build's pages are given back (see `VectorIndex::releasing_while`).
pub(super) const BUILD_RELEASE_INTERVAL: Duration = Duration::from_millis(100);

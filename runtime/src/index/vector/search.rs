//! Searching: the tail scored exactly, a session-sized scope scored exactly from stored
//! vectors, and the built forests searched and rescored.

use super::*;

impl VectorIndex {
    /// The `k` items most similar to `query` by cosine similarity (1 = same direction),
    /// best first, ties broken by the smaller id. With `candidates`, only those ids can be
    /// returned. Merges the built index with the staged tail: staged removals are hidden
    /// and staged vectors replace built ones.
    ///
    /// Up to `exact_threshold` candidates are scored exactly; otherwise arroy walks its
    /// trees (approximate, see [`VectorOptions::search_k_factor`]).
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        candidates: Option<&RoaringBitmap>,
    ) -> Result<Vec<(u32, f32)>> {
        let query_norm = self.check_vector("query", query)?;
        if k == 0 || candidates.is_some_and(RoaringBitmap::is_empty) {
            return Ok(Vec::new());
        }
        let hits = match candidates.filter(|c| c.len() <= self.opts.exact_threshold) {
            Some(c) => self.search_exact(query, query_norm, k, c)?,
            None => {
                // The tail is read before the read transaction opens (module docs say why).
                let (mut hits, shadowed) = self.search_tail(query, query_norm, k, candidates)?;
                let built = self.search_built(query, k, candidates, &shadowed)?;
                hits.extend(built);
                keep_best(&mut hits, k);
                hits
            }
        };
        // A search reads a few pages per candidate or tree leaf it visits.
        self.release.tick(8);
        Ok(hits)
    }

    /// Scores the staged vectors and returns them with the ids the tail shadows.
    pub(super) fn search_tail(
        &self,
        query: &[f32],
        query_norm: f32,
        k: usize,
        candidates: Option<&RoaringBitmap>,
    ) -> Result<(Vec<(u32, f32)>, RoaringBitmap)> {
        let tail = self.tail_read();
        let mut hits = Vec::new();
        let mut stored = Vec::new();
        let mut score = |id: u32, staged: &Staged| match &staged.change {
            Change::Upsert(v) => {
                let dot = v.dot(query);
                hits.push((id, crate::index::cosine_of(dot, query_norm, v.norm)));
            }
            Change::Stored => stored.push(id),
            Change::Remove => {}
        };
        let shadowed = match candidates {
            // Walk whichever side is smaller.
            Some(c) if c.len() < tail.entries.len() as u64 => {
                for id in c {
                    if let Some(staged) = tail.entries.get(&id) {
                        score(id, staged);
                    }
                }
                &tail.ids & c
            }
            Some(c) => {
                for (&id, staged) in &tail.entries {
                    if c.contains(id) {
                        score(id, staged);
                    }
                }
                &tail.ids & c
            }
            None => {
                for (&id, staged) in &tail.entries {
                    score(id, staged);
                }
                tail.ids.clone()
            }
        };
        drop(tail);
        // Read back outside the lock, so builds and ingest never wait on the store.
        self.score_stored(query, query_norm, &stored, &mut hits)?;
        keep_best(&mut hits, k);
        Ok((hits, shadowed))
    }

    /// Scores ids staged past the budget, reading their vectors back from the source.
    pub(super) fn score_stored(
        &self,
        query: &[f32],
        query_norm: f32,
        stored: &[u32],
        hits: &mut Vec<(u32, f32)>,
    ) -> Result<()> {
        for &id in stored {
            if let Some(v) = self.read_back(id)? {
                let dot = v.dot(query);
                hits.push((id, crate::index::cosine_of(dot, query_norm, v.norm)));
            }
        }
        Ok(())
    }

    /// Scores every candidate exactly: staged and hot vectors from memory, the rest read
    /// from LMDB (and then cached). A session-sized scope is cheaper this way than opening
    /// a reader, which decodes the whole item bitmap, and walking trees.
    pub(super) fn search_exact(
        &self,
        query: &[f32],
        query_norm: f32,
        k: usize,
        candidates: &RoaringBitmap,
    ) -> Result<Vec<(u32, f32)>> {
        let mut hits = Vec::with_capacity(candidates.len() as usize);
        let mut misses = Vec::new();
        let mut stored = Vec::new();
        let generation = {
            let tail = self.tail_read();
            for id in candidates {
                let vector = match tail.entries.get(&id) {
                    Some(Staged {
                        change: Change::Upsert(v),
                        ..
                    }) => v,
                    Some(Staged {
                        change: Change::Stored,
                        ..
                    }) => {
                        stored.push(id);
                        continue;
                    }
                    Some(_) => continue,
                    None => match tail.hot.get(id) {
                        Some(v) => v,
                        None => {
                            misses.push(id);
                            continue;
                        }
                    },
                };
                let dot = vector.dot(query);
                hits.push((id, crate::index::cosine_of(dot, query_norm, vector.norm)));
            }
            tail.generation
        };
        self.score_stored(query, query_norm, &stored, &mut hits)?;
        if !misses.is_empty() {
            // The tail was read before this transaction opens (module docs say why).
            let mut fetched = Vec::with_capacity(misses.len());
            {
                let _shared = self.gate_read();
                let rtxn = self.env.read_txn()?;
                for id in misses {
                    let shard = self.shard_of(id);
                    let writer = Writer::<Cosine>::new(self.arroy, shard, self.dimensions);
                    if let Some(v) = writer.item_vector(&rtxn, id)? {
                        let (dot, norm2) = dot_and_norm2(query, &v);
                        let norm = norm2.sqrt();
                        hits.push((id, crate::index::cosine_of(dot, query_norm, norm)));
                        fetched.push((id, StagedVector::new(&v, norm)));
                    }
                }
            }
            if self.opts.hot_cache_bytes > 0 && !fetched.is_empty() {
                let mut tail = self.tail_write();
                // A build or clear since the tail was read may have changed what is built.
                if tail.generation == generation {
                    for (id, v) in fetched {
                        if !tail.entries.contains_key(&id) && tail.hot.get(id).is_none() {
                            tail.hot.insert(id, v);
                        }
                    }
                }
            }
        }
        keep_best(&mut hits, k);
        Ok(hits)
    }

    /// Searches the last committed build, never returning an id in `shadowed`: each
    /// shard's forest that can hold a candidate, best `k` of all.
    pub(super) fn search_built(
        &self,
        query: &[f32],
        k: usize,
        candidates: Option<&RoaringBitmap>,
        shadowed: &RoaringBitmap,
    ) -> Result<Vec<(u32, f32)>> {
        let _shared = self.gate_read();
        let rtxn = self.env.read_txn()?;
        let mut hits = Vec::new();
        let unshadowed: Option<RoaringBitmap> = candidates
            .filter(|_| !shadowed.is_empty())
            .map(|c| c - shadowed);
        for &shard in self.shards().iter() {
            if candidates.is_some_and(|c| c.range_cardinality(self.shard_ids(shard)) == 0) {
                continue;
            }
            let reader = match Reader::<Cosine>::open(&rtxn, shard, self.arroy) {
                Ok(reader) => reader,
                Err(arroy::Error::MissingMetadata(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            let filter: Option<Cow<'_, RoaringBitmap>> = match candidates {
                // A scope that covers the whole shard (one namespace) filters nothing;
                // arroy would still intersect every leaf bucket it visits with it.
                Some(c) if shadowed.is_empty() && reader.item_ids().is_subset(c) => None,
                Some(c) => Some(Cow::Borrowed(unshadowed.as_ref().unwrap_or(c))),
                None if reader.item_ids().is_disjoint(shadowed) => None,
                None => Some(Cow::Owned(reader.item_ids() - shadowed)),
            };
            let search_k = k
                .saturating_mul(reader.n_trees().max(1))
                .saturating_mul(self.opts.search_k_factor.max(1));
            let mut nns = reader.nns(k);
            nns.search_k(NonZeroUsize::new(search_k).unwrap_or(NonZeroUsize::MIN));
            if let Some(filter) = &filter {
                nns.candidates(filter);
            }
            // arroy's cosine distance is (1 - cos) / 2.
            hits.extend(
                nns.by_vector(&rtxn, query)?
                    .into_iter()
                    .map(|(id, distance)| (id, (1.0 - 2.0 * distance).clamp(-1.0, 1.0))),
            );
        }
        keep_best(&mut hits, k);
        Ok(hits)
    }
}

/// Sorts best first (ties: smaller id first) and keeps `k`.
pub(super) fn keep_best(hits: &mut Vec<(u32, f32)>, k: usize) {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if hits.len() > k {
        hits.select_nth_unstable_by(k, order);
        hits.truncate(k);
    }
    hits.sort_unstable_by(order);
}

//! Vectors not yet in a built forest: upserts and removals staged in the tail (at half
//! precision, within its memory budget, read back from the store past it), and the hot
//! cache of vectors read back lately.

use super::*;

impl VectorIndex {
    /// Names where vectors staged past [`VectorOptions::tail_memory_bytes`] are read back
    /// from; until it is called, every staged vector stays in memory. Set once: later calls
    /// are ignored (the source is the store, which does not change under an open index).
    pub fn read_back_from(&self, source: Arc<dyn VectorSource>) {
        let _ = self.source.set(source);
    }

    /// Whether new upserts are staged by id only (a source is set and the tail's vectors
    /// fill their budget): a caller may then skip reading the vectors at all and use
    /// [`stage_stored`](Self::stage_stored).
    pub fn spilling(&self) -> bool {
        self.tail_read().bytes >= self.tail_budget()
    }

    /// Memory the tail's vectors may take: unbounded until a source can give them back.
    pub(super) fn tail_budget(&self) -> usize {
        self.source
            .get()
            .map_or(usize::MAX, |_| self.opts.tail_memory_bytes)
    }

    /// Stages upserts whose vectors the source holds (read back when searched or built;
    /// an id the source has no vector for is skipped then). Ignored without a source.
    pub fn stage_stored(&self, ids: &[u32]) {
        if ids.is_empty() || self.source.get().is_none() {
            return;
        }
        let mut tail = self.tail_write();
        for &id in ids {
            tail.stage(id, Change::Stored);
        }
    }

    /// Memory held by staged vectors, in bytes (ids staged past the budget not counted).
    pub fn tail_bytes(&self) -> usize {
        self.tail_read().bytes
    }

    /// Stages vectors; they are searchable at once, and written into the trees by the next
    /// [`build`](Self::build). Re-upserting an id replaces its vector. An item that cannot
    /// be indexed (wrong dimension, a NaN or infinite component, the zero vector) is skipped
    /// with a warning and leaves the id's previous state alone; use
    /// [`try_upsert`](Self::try_upsert) to get the error instead.
    pub fn upsert(&self, items: &[(u32, Vec<f32>)]) {
        let mut valid = Vec::with_capacity(items.len());
        for (id, values) in items {
            match self.check_vector("embedding", values) {
                Ok(norm) => valid.push((*id, StagedVector::new(values, norm))),
                Err(e) => tracing::warn!(id, error = %e, "vector index skipped an item"),
            }
        }
        self.stage_vectors(valid);
    }

    /// Like [`upsert`](Self::upsert), but all or nothing: the first item that cannot be
    /// indexed is reported as [`Error::Invalid`] (or [`Error::DimensionMismatch`]) and
    /// nothing is staged.
    pub fn try_upsert(&self, items: &[(u32, Vec<f32>)]) -> Result<()> {
        let mut valid = Vec::with_capacity(items.len());
        for (id, values) in items {
            let norm = self
                .check_vector("embedding", values)
                .map_err(|e| match e {
                    Error::Invalid { field, reason } => {
                        Error::invalid(field, format!("item {id}: {reason}"))
                    }
                    other => other,
                })?;
            valid.push((*id, StagedVector::new(values, norm)));
        }
        self.stage_vectors(valid);
        Ok(())
    }

    pub(super) fn stage_vectors(&self, valid: Vec<(u32, Arc<StagedVector>)>) {
        if valid.is_empty() {
            return;
        }
        let budget = self.tail_budget();
        let mut tail = self.tail_write();
        for (id, vector) in valid {
            // Over budget, the store keeps the vector for us; the id alone stays staged.
            let change = if tail.bytes.saturating_add(Hot::cost(&vector)) > budget {
                Change::Stored
            } else {
                Change::Upsert(vector)
            };
            tail.stage(id, change);
        }
    }

    /// Reads a staged-by-id vector back from the source, `None` when it is gone or no longer
    /// valid (then it is skipped, as an invalid upsert would have been).
    pub(super) fn read_back(&self, id: u32) -> Result<Option<Arc<StagedVector>>> {
        let Some(source) = self.source.get() else {
            return Ok(None);
        };
        let Some(values) = source.vector(id)? else {
            return Ok(None);
        };
        match self.check_vector("embedding", &values) {
            Ok(norm) => Ok(Some(StagedVector::new(&values, norm))),
            Err(e) => {
                tracing::warn!(id, error = %e, "vector index skipped a stored item");
                Ok(None)
            }
        }
    }

    /// Stages removals: the ids disappear from search results at once, and from the trees
    /// at the next [`build`](Self::build). Removing an unknown id is harmless.
    pub fn remove(&self, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let mut tail = self.tail_write();
        for &id in ids {
            tail.stage(id, Change::Remove);
        }
    }

    /// Staged changes not yet written by a build.
    pub fn pending(&self) -> usize {
        self.tail_read().entries.len()
    }

    pub(super) fn tail_read(&self) -> RwLockReadGuard<'_, Tail> {
        self.tail.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn tail_write(&self) -> RwLockWriteGuard<'_, Tail> {
        self.tail.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// A staged vector, with its norm computed once so tail scans cost one dot product.
#[derive(Debug)]
pub(super) struct StagedVector {
    pub(super) values: Values,
    pub(super) norm: f32,
}

/// A vector's values in memory. Every vector read from the store is exactly a binary16
/// vector times a power of two (the store keeps embeddings so), and is held as that: half
/// the memory, so the tail and the hot cache hold twice as many within their budgets.
/// Any other vector is held as it is.
#[derive(Debug)]
pub(super) enum Values {
    Full(Box<[f32]>),
    Half {
        scale: f32,
        halves: Box<[half::f16]>,
    },
}

impl StagedVector {
    pub(super) fn new(values: &[f32], norm: f32) -> Arc<Self> {
        let (exp, halves) = codec::half_precision(values);
        let scale = codec::pow2(exp);
        let mut widened = [0f32; WIDEN];
        let exact = halves
            .chunks(WIDEN)
            .zip(values.chunks(WIDEN))
            .all(|(h, v)| {
                codec::from_halves(h, scale, &mut widened[..h.len()]);
                widened[..h.len()] == *v
            });
        let values = match exact {
            true => Values::Half {
                scale,
                halves: halves.into(),
            },
            false => Values::Full(values.into()),
        };
        Arc::new(StagedVector { values, norm })
    }

    /// Bytes of the values.
    pub(super) fn bytes(&self) -> usize {
        match &self.values {
            Values::Full(v) => std::mem::size_of_val(&**v),
            Values::Half { halves, .. } => std::mem::size_of_val(&**halves),
        }
    }

    /// The values as float32: borrowed when held so, widened when held at half precision.
    pub(super) fn values(&self) -> Cow<'_, [f32]> {
        match &self.values {
            Values::Full(v) => Cow::Borrowed(v),
            Values::Half { scale, halves } => {
                let mut out = vec![0f32; halves.len()];
                codec::from_halves(halves, *scale, &mut out);
                Cow::Owned(out)
            }
        }
    }

    pub(super) fn to_vec(&self) -> Vec<f32> {
        self.values().into_owned()
    }

    /// [`dot`] of `query` and these values, with the same bits whichever way they are held.
    #[inline]
    pub(super) fn dot(&self, query: &[f32]) -> f32 {
        match &self.values {
            Values::Full(v) => dot(query, v),
            Values::Half { scale, halves } => dot_half(query, halves, *scale),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) enum Change {
    Upsert(Arc<StagedVector>),
    /// An upsert whose vector is in the [`VectorSource`] only (the tail was over budget).
    Stored,
    Remove,
}

#[derive(Debug, Clone)]
pub(super) struct Staged {
    /// Order of staging; a build only drops an entry whose `seq` it wrote, so a change
    /// staged while the build ran stays staged.
    pub(super) seq: u64,
    pub(super) change: Change,
}

/// Changes not yet written into arroy, and the hot cache of what is built.
#[derive(Debug, Default)]
pub(super) struct Tail {
    pub(super) entries: HashMap<u32, Staged>,
    /// The keys of `entries`, kept as a bitmap because every search subtracts it from the
    /// built index.
    pub(super) ids: RoaringBitmap,
    pub(super) next_seq: u64,
    pub(super) hot: Hot,
    /// Bumped by every commit that changes the built index (build, clear), so a search that
    /// read vectors from LMDB can tell whether they are still what is built.
    pub(super) generation: u64,
    /// Memory held by the staged vectors of `entries`, as [`Hot::cost`] counts it.
    pub(super) bytes: usize,
}

impl Tail {
    pub(super) fn new(hot_budget: usize) -> Self {
        Tail {
            hot: Hot {
                budget: hot_budget,
                ..Hot::default()
            },
            ..Tail::default()
        }
    }

    /// Forgets everything staged and cached, after a clear committed.
    pub(super) fn reset(&mut self) {
        let generation = self.generation + 1;
        *self = Tail::new(self.hot.budget);
        self.generation = generation;
    }

    pub(super) fn stage(&mut self, id: u32, change: Change) {
        self.next_seq += 1;
        if let Change::Upsert(v) = &change {
            self.bytes += Hot::cost(v);
        }
        let staged = Staged {
            seq: self.next_seq,
            change,
        };
        if let Some(old) = self.entries.insert(id, staged) {
            self.forget_bytes(&old);
        }
        self.ids.insert(id);
    }

    /// Drops the entry of `id` if it is still the one staged as `seq`.
    pub(super) fn unstage(&mut self, id: u32, seq: u64) {
        if self.entries.get(&id).is_some_and(|s| s.seq == seq) {
            if let Some(old) = self.entries.remove(&id) {
                self.forget_bytes(&old);
            }
            self.ids.remove(id);
        }
    }

    pub(super) fn forget_bytes(&mut self, staged: &Staged) {
        if let Change::Upsert(v) = &staged.change {
            self.bytes -= Hot::cost(v);
        }
    }
}

/// Built vectors kept in memory, bounded by `budget` bytes and evicted in insertion order.
#[derive(Debug, Default)]
pub(super) struct Hot {
    /// Each vector with the insertion number its `order` entry carries.
    pub(super) map: HashMap<u32, (Arc<StagedVector>, u64)>,
    /// Insertion order; entries whose number no longer matches `map` are stale and skipped.
    pub(super) order: VecDeque<(u32, u64)>,
    pub(super) bytes: usize,
    pub(super) budget: usize,
    pub(super) inserted: u64,
}

impl Hot {
    pub(super) fn cost(v: &StagedVector) -> usize {
        // The values plus the map, queue and allocation overhead of one entry.
        v.bytes() + 64
    }

    pub(super) fn get(&self, id: u32) -> Option<&Arc<StagedVector>> {
        self.map.get(&id).map(|(v, _)| v)
    }

    pub(super) fn insert(&mut self, id: u32, v: Arc<StagedVector>) {
        let cost = Self::cost(&v);
        if cost > self.budget {
            self.remove(id);
            return;
        }
        self.inserted += 1;
        if let Some((old, _)) = self.map.insert(id, (v, self.inserted)) {
            self.bytes -= Self::cost(&old);
        }
        self.bytes += cost;
        self.order.push_back((id, self.inserted));
        while self.bytes > self.budget {
            let Some((old_id, n)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old_id).is_some_and(|(_, m)| *m == n) {
                self.remove(old_id);
            }
        }
        // Replaced entries leave stale queue slots behind; drop them before they pile up.
        if self.order.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.order
                .retain(|(id, n)| map.get(id).is_some_and(|(_, m)| m == n));
        }
    }

    pub(super) fn remove(&mut self, id: u32) {
        if let Some((old, _)) = self.map.remove(&id) {
            self.bytes -= Self::cost(&old);
        }
    }
}

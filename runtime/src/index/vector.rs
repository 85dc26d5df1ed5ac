//! The vector index: cosine nearest neighbours over record embeddings, kept in arroy on its
//! own LMDB environment (heed), plus an in-memory *tail* of staged changes that are
//! searchable the moment they are staged.
//!
//! It owns the LMDB environment in its directory (the arroy trees, the item vectors and a
//! small meta table: format version, dimension, watermark, shard size and count), the
//! staged tail, and the single-writer discipline around both. It is **derived** data: the store is the system of
//! record and keeps every embedding, so this index may always be cleared and rebuilt
//! (`shadowbrain reindex`). It must therefore never be the only copy of anything, never call
//! an embedder, and never decide what a caller is allowed to see — scoping is the caller's
//! candidate bitmap.
//!
//! Life of a change: [`VectorIndex::upsert`] / [`VectorIndex::remove`] stage it in the tail
//! (visible to [`VectorIndex::search`] at once, by an exact scan of the tail);
//! [`VectorIndex::build`] writes every staged change into arroy, rebuilds the trees and
//! records the caller's watermark in the same LMDB write transaction, commits durably, and
//! only then drops the built changes from the tail. Searches read the tail *before* they
//! open their read transaction, so a change is always visible in at least one of the two.
//!
//! Built vectors are also kept in a bounded in-memory *hot cache* (insertion-ordered,
//! evicted oldest first), filled by builds and by exact searches that had to read a vector
//! from LMDB. A session-scoped search scores about a hundred vectors; reading each from LMDB
//! costs ~1 µs of B-tree descent, a cached one a few nanoseconds. The cache only ever holds
//! what the built index holds: it changes under the tail's lock together with the tail, and
//! a search caches what it read only if no build or clear committed in between.
//!
//! The tail lives in memory only. A failed build leaves it staged for the next build; a
//! close or crash loses it, which is why the watermark exists: on start-up the caller
//! re-stages everything the store holds past [`VectorIndex::watermark`].
//!
//! The tail's vectors are bounded by [`VectorOptions::tail_memory_bytes`] once the caller
//! names a [`VectorSource`] (the store, which keeps every embedding): past the budget only
//! the id is staged and the vector is read back from the source when a search scores it or
//! a build writes it. On two cores the trees are built several times slower than ingest
//! writes, so under a long burst the unbuilt tail grows to hundreds of thousands of items;
//! holding them all would cost 1.5 KB each (384 dimensions), reading one back costs a store
//! lookup (a few µs).
//!
//! The built index is **sharded by id range** ([`VectorOptions::shard_items`]): one arroy
//! forest (arroy's index number) per range of ids. An arroy build walks every item and node
//! of the forest it changes, so with one forest every build would read, and map, the whole
//! index (2.4 GB at 1M 384-dimensional vectors); ids are handed out in order, so new
//! records land in the last shard and a build reads that one. A search walks each shard
//! that can hold a candidate and keeps the best `k` of all. An index of the format before
//! shards opens as one shard holding every id; `shadowbrain reindex` rebuilds it in
//! shards.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use arroy::distances::Cosine;
use arroy::{Reader, Writer};
use heed::types::{Bytes, Str};
use heed::{CommitOrAbort, Env, EnvOpenOptions, RoTxn, RwTxn, WithoutTls};
use rand::SeedableRng;
use rand::rngs::StdRng;
use roaring::RoaringBitmap;

use crate::error::{Error, Result};
use crate::pages::MapRelease;
use crate::store::codec;

/// On-disk layout version of the index directory; bumped on any incompatible change.
const FORMAT_VERSION: u32 = 2;
/// The format before shards: one arroy forest holds every id. Opened as one shard (and
/// recorded as format 2, so an older binary refuses it instead of missing shards).
const FORMAT_ONE_FOREST: u64 = 1;
/// Shard size recorded for indexes written before shards: one shard holds every id.
const ONE_SHARD: u64 = 1 << 32;
/// Base seed of the tree builder: builds are deterministic for a given content and watermark.
const BUILD_SEED: u64 = 0x5bd1_e995_0f1d_a7a5;
/// Map sizes stay a multiple of this, which is a multiple of every common page size.
const MAP_GRANULE: usize = 64 << 10;
/// A build that keeps hitting `MDB_MAP_FULL` after this many doublings is a real problem.
const MAX_GROW_RETRIES: u32 = 24;
/// Rough bytes per stored item besides its components (LMDB node, key, arroy header).
const ITEM_OVERHEAD: usize = 64;

const META_FORMAT: &str = "format";
const META_DIMENSIONS: &str = "dimensions";
const META_WATERMARK: &str = "watermark";
const META_SHARD_ITEMS: &str = "shard_items";
const META_SHARDS: &str = "shards";

type ArroyDb = arroy::Database<'static, Cosine>;
type MetaDb = heed::Database<'static, Str, Bytes>;

/// Tuning of a [`VectorIndex`]. The defaults are chosen on W1 (`runtime/examples/w1.rs`:
/// 100k × 384-d clustered vectors, release, 2 shared cores) for recall@10 against exact
/// search and Q2 (namespace-wide top-10) latency; docs/benchmarks.md has the figures.
///
/// More trees with a smaller factor reach the same recall with fewer items scored (each
/// costs an LMDB read); the tree count is bounded by the 15 s budget for a 100k build.
/// On vectors as the store keeps them (half precision), 24 trees need factor 8 to keep
/// recall@10 at 0.99.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorOptions {
    /// Trees in the arroy forest, passed on every build. `None` lets arroy choose (about 150
    /// for 384 dimensions): better recall per probe, but much slower builds — and every
    /// incremental build may grow the forest, so keep it for experiments.
    pub n_trees: Option<usize>,
    /// Approximate searches inspect `k × n_trees × search_k_factor` leaf items; higher is
    /// more accurate and slower. `0` is treated as `1`.
    pub search_k_factor: usize,
    /// A scoped search whose candidate bitmap holds at most this many ids scores every
    /// candidate exactly instead of walking the trees (session scope is the common case).
    pub exact_threshold: u64,
    /// Memory for the hot cache of built vectors (see the module docs), in bytes; `0`
    /// turns it off. The default holds about 160,000 384-dimensional vectors read from
    /// the store (held at half precision, as it keeps them). A build keeps what it read
    /// back for the cache while it runs, so up to twice this is held at a time.
    pub hot_cache_bytes: usize,
    /// Initial LMDB map size in bytes. The map doubles whenever it fills, so this only saves
    /// a few resizes; it is reserved address space, not disk.
    pub initial_map_size: usize,
    /// Threads that build trees. arroy numbers nodes in the order its threads finish, so only
    /// `1` gives bit-identical forests for identical histories; more threads build a 100k
    /// index about twice as fast on two cores. The default uses every core: the indexer's
    /// debounced build boundaries already depend on timing, so a replayed run does not get
    /// the same forest anyway — exact replays set 1 and flush indexes at fixed points.
    pub build_threads: usize,
    /// Threads that build trees in the background ([`VectorIndex::build_with`] with
    /// `background`, what the indexer runs while the server answers), at lower CPU
    /// priority. The default is half the cores, at least one: a build that takes every
    /// core delays ingest and recall behind it even at lower priority (a lower priority
    /// only orders the threads that wait; a long build still holds every core between
    /// their turns), while half the cores still keep the trees seconds behind a saturating
    /// load.
    pub background_build_threads: usize,
    /// Memory for staged vectors, in bytes, once a [`VectorSource`] is set: past it only
    /// ids are staged and vectors are read back from the source (see the module docs).
    /// Without a source every staged vector stays in memory. The default holds about
    /// 80,000 384-dimensional vectors read from the store.
    pub tail_memory_bytes: usize,
    /// Staged changes written by one build transaction at most (lowest ids first). LMDB
    /// keeps a write transaction's dirty pages in memory until it commits, so a build of
    /// the hundreds of thousands of items a long burst leaves staged would hold hundreds
    /// of MB of them. Larger chunks cost fewer tree passes.
    pub max_build_items: usize,
    /// Ids per shard: the index keeps one arroy forest per range of this many ids (arroy's
    /// index number is the shard). A build walks every item and node of each forest it
    /// changes, and so maps all of it: with ids handed out in order, new records land in
    /// the last shard and a build reads that one (2.4 GB of forest at 1M 384-dimensional
    /// vectors in one shard; about 330 MB per shard of 131,072). Searches over the whole
    /// index walk every shard's forest, which costs more the more shards there are.
    /// Recorded on first open; an index written before shards stays one shard.
    pub shard_items: u32,
}

impl Default for VectorOptions {
    fn default() -> Self {
        VectorOptions {
            n_trees: Some(24),
            search_k_factor: 8,
            exact_threshold: 2_000,
            hot_cache_bytes: 128 << 20,
            initial_map_size: 256 << 20,
            build_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            background_build_threads: std::thread::available_parallelism()
                .map_or(1, |n| (n.get() / 2).max(1)),
            tail_memory_bytes: 64 << 20,
            max_build_items: 50_000,
            shard_items: 1 << 17,
        }
    }
}

/// What one [`VectorIndex::build`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildStats {
    /// Staged vectors written into the built index.
    pub upserted: usize,
    /// Staged removals applied to the built index.
    pub removed: usize,
    /// Items in the built index after the build.
    pub items: u64,
    /// Trees in the forest after the build.
    pub n_trees: usize,
    /// The watermark now recorded with the index (the caller's only once a build wrote
    /// everything that was staged).
    pub watermark: u64,
    /// Staged changes this build left for the next one ([`VectorOptions::max_build_items`]).
    pub remaining: usize,
    /// How many times the LMDB map had to grow during this build.
    pub map_resizes: u32,
    /// Wall time of the whole build, commit included.
    pub elapsed: Duration,
}

/// Where staged vectors past the tail's memory budget are read back from: the system of
/// record, which keeps every embedding. It answers the id's *current* vector; a later change
/// of it is staged again anyway, so reading the newer one early is harmless.
pub trait VectorSource: Send + Sync {
    /// The vector of `id`, or `None` when the id has none any more.
    fn vector(&self, id: u32) -> Result<Option<Vec<f32>>>;
}

/// A staged vector, with its norm computed once so tail scans cost one dot product.
#[derive(Debug)]
struct StagedVector {
    values: Values,
    norm: f32,
}

/// A vector's values in memory. Every vector read from the store is exactly a binary16
/// vector times a power of two (the store keeps embeddings so), and is held as that: half
/// the memory, so the tail and the hot cache hold twice as many within their budgets.
/// Any other vector is held as it is.
#[derive(Debug)]
enum Values {
    Full(Box<[f32]>),
    Half {
        scale: f32,
        halves: Box<[half::f16]>,
    },
}

/// How often a running build's pages are given back (see `VectorIndex::releasing_while`).
const BUILD_RELEASE_INTERVAL: Duration = Duration::from_millis(100);

/// Elements a half-precision vector is widened at a time to be multiplied.
const WIDEN: usize = 64;

/// Independent sums a dot product is split into, so the compiler can vectorise it without
/// reassociating floats.
const LANES: usize = 8;

impl StagedVector {
    fn new(values: &[f32], norm: f32) -> Arc<Self> {
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
    fn bytes(&self) -> usize {
        match &self.values {
            Values::Full(v) => std::mem::size_of_val(&**v),
            Values::Half { halves, .. } => std::mem::size_of_val(&**halves),
        }
    }

    /// The values as float32: borrowed when held so, widened when held at half precision.
    fn values(&self) -> Cow<'_, [f32]> {
        match &self.values {
            Values::Full(v) => Cow::Borrowed(v),
            Values::Half { scale, halves } => {
                let mut out = vec![0f32; halves.len()];
                codec::from_halves(halves, *scale, &mut out);
                Cow::Owned(out)
            }
        }
    }

    fn to_vec(&self) -> Vec<f32> {
        self.values().into_owned()
    }

    /// [`dot`] of `query` and these values, with the same bits whichever way they are held.
    fn dot(&self, query: &[f32]) -> f32 {
        match &self.values {
            Values::Full(v) => dot(query, v),
            Values::Half { scale, halves } => dot_half(query, halves, *scale),
        }
    }
}

/// [`dot`] of `query` and `halves × scale`: the same products summed in the same lanes and
/// order, so the same bits as the dot of the widened vector. On a CPU with F16C (x86-64
/// since 2013) the halves are widened eight at a time in registers: widening them into a
/// buffer first would take about 40 % of a session search's time.
fn dot_half(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has the features the function is compiled for (checked above).
        return unsafe { dot_half_f16c(query, halves, scale) };
    }
    dot_half_widened(query, halves, scale)
}

/// [`dot_half`] on any CPU: the lanes of [`dot`], fed a widened block at a time.
fn dot_half_widened(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut widened = [0f32; WIDEN];
    let (mut left, mut left_q, mut left_v) = (0, [0f32; LANES], [0f32; LANES]);
    for (h, q) in halves.chunks(WIDEN).zip(query.chunks(WIDEN)) {
        let w = &mut widened[..h.len()];
        codec::from_halves(h, scale, w);
        let (qc, wc) = (q.chunks_exact(LANES), w.chunks_exact(LANES));
        let (qr, wr) = (qc.remainder(), wc.remainder());
        for (x, y) in qc.zip(wc) {
            for i in 0..LANES {
                lanes[i] += x[i] * y[i];
            }
        }
        // Only the last block can leave a remainder (WIDEN is a multiple of LANES).
        left = qr.len().min(wr.len());
        left_q[..left].copy_from_slice(&qr[..left]);
        left_v[..left].copy_from_slice(&wr[..left]);
    }
    let mut d: f32 = lanes.iter().sum();
    for (x, y) in left_q[..left].iter().zip(&left_v[..left]) {
        d += x * y;
    }
    d
}

/// [`dot_half`] with F16C: one register of eight lanes, each lane `+= q × (h × scale)` with
/// separate multiplies and adds (never fused), as [`dot`] computes them.
///
/// # Safety
/// The CPU must have AVX and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn dot_half_f16c(query: &[f32], halves: &[half::f16], scale: f32) -> f32 {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm256_add_ps, _mm256_cvtph_ps, _mm256_loadu_ps, _mm256_mul_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    const _: () = assert!(LANES == 8, "one 256-bit register holds the lanes");
    let n = query.len().min(halves.len());
    let whole = n - n % LANES;
    let scale8 = _mm256_set1_ps(scale);
    let mut acc = _mm256_setzero_ps();
    for i in (0..whole).step_by(LANES) {
        // SAFETY: i + 8 <= n, so both reads are within their slices; the loads are
        // unaligned, and f16 is two plain bytes.
        let (h, q) = unsafe {
            (
                _mm_loadu_si128(halves.as_ptr().add(i).cast::<__m128i>()),
                _mm256_loadu_ps(query.as_ptr().add(i)),
            )
        };
        let w = _mm256_mul_ps(_mm256_cvtph_ps(h), scale8);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(q, w));
    }
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` has room for the eight floats written.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let mut d: f32 = lanes.iter().sum();
    for (x, h) in query[whole..n].iter().zip(&halves[whole..n]) {
        d += x * (h.to_f32() * scale);
    }
    d
}

#[derive(Debug, Clone)]
enum Change {
    Upsert(Arc<StagedVector>),
    /// An upsert whose vector is in the [`VectorSource`] only (the tail was over budget).
    Stored,
    Remove,
}

#[derive(Debug, Clone)]
struct Staged {
    /// Order of staging; a build only drops an entry whose `seq` it wrote, so a change
    /// staged while the build ran stays staged.
    seq: u64,
    change: Change,
}

/// Changes not yet written into arroy, and the hot cache of what is built.
#[derive(Debug, Default)]
struct Tail {
    entries: HashMap<u32, Staged>,
    /// The keys of `entries`, kept as a bitmap because every search subtracts it from the
    /// built index.
    ids: RoaringBitmap,
    next_seq: u64,
    hot: Hot,
    /// Bumped by every commit that changes the built index (build, clear), so a search that
    /// read vectors from LMDB can tell whether they are still what is built.
    generation: u64,
    /// Memory held by the staged vectors of `entries`, as [`Hot::cost`] counts it.
    bytes: usize,
}

impl Tail {
    fn new(hot_budget: usize) -> Self {
        Tail {
            hot: Hot {
                budget: hot_budget,
                ..Hot::default()
            },
            ..Tail::default()
        }
    }

    /// Forgets everything staged and cached, after a clear committed.
    fn reset(&mut self) {
        let generation = self.generation + 1;
        *self = Tail::new(self.hot.budget);
        self.generation = generation;
    }

    fn stage(&mut self, id: u32, change: Change) {
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
    fn unstage(&mut self, id: u32, seq: u64) {
        if self.entries.get(&id).is_some_and(|s| s.seq == seq) {
            if let Some(old) = self.entries.remove(&id) {
                self.forget_bytes(&old);
            }
            self.ids.remove(id);
        }
    }

    fn forget_bytes(&mut self, staged: &Staged) {
        if let Change::Upsert(v) = &staged.change {
            self.bytes -= Hot::cost(v);
        }
    }
}

/// Built vectors kept in memory, bounded by `budget` bytes and evicted in insertion order.
#[derive(Debug, Default)]
struct Hot {
    /// Each vector with the insertion number its `order` entry carries.
    map: HashMap<u32, (Arc<StagedVector>, u64)>,
    /// Insertion order; entries whose number no longer matches `map` are stale and skipped.
    order: VecDeque<(u32, u64)>,
    bytes: usize,
    budget: usize,
    inserted: u64,
}

impl Hot {
    fn cost(v: &StagedVector) -> usize {
        // The values plus the map, queue and allocation overhead of one entry.
        v.bytes() + 64
    }

    fn get(&self, id: u32) -> Option<&Arc<StagedVector>> {
        self.map.get(&id).map(|(v, _)| v)
    }

    fn insert(&mut self, id: u32, v: Arc<StagedVector>) {
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

    fn remove(&mut self, id: u32) {
        if let Some((old, _)) = self.map.remove(&id) {
            self.bytes -= Self::cost(&old);
        }
    }
}

/// A cosine vector index over `u32` item ids (the record ids of the store): arroy trees on
/// LMDB plus a staged tail. `Send + Sync`; every method takes `&self`. One writer at a time
/// (upserts and removals only touch the tail; builds and clears serialise on a mutex), any
/// number of concurrent searches, each seeing the last committed build plus the tail.
pub struct VectorIndex {
    env: Env<WithoutTls>,
    arroy: ArroyDb,
    meta: MetaDb,
    dir: PathBuf,
    dimensions: usize,
    opts: VectorOptions,
    tail: RwLock<Tail>,
    /// Serialises the write work (build, clear): LMDB allows one write transaction anyway,
    /// and this keeps a second builder from blocking inside LMDB with locks held.
    writer: Mutex<()>,
    /// Set by [`VectorIndex::cancel_builds`]: a build in progress gives up (its
    /// transaction is aborted, its changes stay staged) at arroy's next check.
    cancelled: AtomicBool,
    /// Held shared by every transaction and exclusively by a map resize, which LMDB forbids
    /// while any transaction of this process is open.
    gate: Arc<RwLock<()>>,
    /// Gives the pages searches map back now and then (see `MapRelease`).
    release: MapRelease,
    /// Ids per shard, as recorded in the meta table.
    shard_items: AtomicU64,
    /// Shards that may hold built items: `0..shards`.
    shards: AtomicU32,
    /// Grow the map before a big build instead of discovering `MDB_MAP_FULL` halfway;
    /// tests turn it off to exercise the abort-grow-retry path.
    grow_ahead: bool,
    /// One-thread pool the whole write transaction runs on (made on first write). arroy
    /// numbers tree nodes in thread-arrival order, so a multi-threaded build gives the same
    /// trees different node ids and searches different tie-breaks: one thread makes a
    /// build a pure function of (content, watermark), and leaves the other cores to ingest
    /// and recall.
    build_pool: OnceLock<rayon::ThreadPool>,
    /// The same at a lower CPU priority (`nice` 10), for builds that may wait: on a busy
    /// machine they take the cores ingest and recall leave over, instead of halving
    /// ingest throughput.
    background_pool: OnceLock<rayon::ThreadPool>,
    /// Where vectors staged past the tail budget are read back from (see the module docs).
    source: OnceLock<Arc<dyn VectorSource>>,
}

impl fmt::Debug for VectorIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VectorIndex")
            .field("dir", &self.dir)
            .field("dimensions", &self.dimensions)
            .field("opts", &self.opts)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl VectorIndex {
    /// Creates or opens the index in `dir` (created if missing). The dimension is recorded
    /// on first open; opening with another one is [`Error::DimensionMismatch`], whose
    /// message points at `shadowbrain reindex`. Only the meta table is read: reopening a
    /// large index costs about as much as opening an empty one.
    pub fn open(dir: &Path, dimensions: usize, opts: VectorOptions) -> Result<Self> {
        let index = Self::open_env(dir, dimensions, opts)?;
        index.init_meta(false)?;
        Ok(index)
    }

    /// Opens the index in `dir` for a different embedder: everything in it is dropped and
    /// `dimensions` becomes the recorded dimension. This is the first step of
    /// `shadowbrain reindex`; the caller then upserts every embedding from the store.
    pub fn recreate(dir: &Path, dimensions: usize, opts: VectorOptions) -> Result<Self> {
        let index = Self::open_env(dir, dimensions, opts)?;
        index.init_meta(true)?;
        Ok(index)
    }

    fn open_env(dir: &Path, dimensions: usize, opts: VectorOptions) -> Result<Self> {
        if dimensions == 0 || u32::try_from(dimensions).is_err() {
            return Err(Error::invalid(
                "dimensions",
                format!(
                    "{dimensions} is not a usable vector dimension; pass the embedder's \
                     dimension (for example 384)"
                ),
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let file_len = std::fs::metadata(dir.join("data.mdb"))
            .map(|m| usize::try_from(m.len()).unwrap_or(usize::MAX))
            .unwrap_or(0);
        let map_size = round_to_granule(opts.initial_map_size.max(file_len.saturating_mul(2)));
        // SAFETY: heed refuses a second open of the same path in this process, and nothing
        // but this index writes the directory's files.
        let env = unsafe {
            EnvOpenOptions::new()
                .read_txn_without_tls()
                .map_size(map_size)
                .max_dbs(2)
                // One reader slot per concurrent search; LMDB's default of 126 is too few
                // for a server whose blocking pool can run hundreds of recalls at once.
                .max_readers(1024)
                .open(dir)
        }
        .map_err(|e| match e {
            heed::Error::EnvAlreadyOpened => Error::index(
                "vector",
                format!(
                    "the index at {} is already open in this process; share the one \
                     VectorIndex (it is Send + Sync) instead of opening it twice",
                    dir.display()
                ),
            ),
            other => Error::from(other),
        })?;
        let wtxn = env.write_txn()?;
        let (arroy, meta): (ArroyDb, MetaDb) = env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
                let arroy = opener.create_database(wtxn, Some("arroy"))?;
                let meta = opener.create_database(wtxn, Some("meta"))?;
                Ok(CommitOrAbort::<_, ()>::Commit((arroy, meta)))
            })?
            .unwrap_commit();
        let gate = Arc::new(RwLock::new(()));
        Ok(VectorIndex {
            env,
            arroy,
            meta,
            dir: dir.to_path_buf(),
            dimensions,
            tail: RwLock::new(Tail::new(opts.hot_cache_bytes)),
            opts,
            writer: Mutex::new(()),
            cancelled: AtomicBool::new(false),
            release: MapRelease::new(dir, gate.clone()),
            gate,
            shard_items: AtomicU64::new(ONE_SHARD),
            shards: AtomicU32::new(1),
            grow_ahead: true,
            build_pool: OnceLock::new(),
            background_pool: OnceLock::new(),
            source: OnceLock::new(),
        })
    }

    /// Checks (or, on first open or `reset`, writes) the format version, dimension and
    /// shard size.
    fn init_meta(&self, reset: bool) -> Result<()> {
        let dims = self.dimensions as u64;
        self.write_with_growth(|wtxn| {
            let format = read_u64(self.meta, wtxn, META_FORMAT)?;
            let stored = read_u64(self.meta, wtxn, META_DIMENSIONS)?;
            if !reset {
                let known = [u64::from(FORMAT_VERSION), FORMAT_ONE_FOREST];
                if let Some(found) = format.filter(|f| !known.contains(f)) {
                    return Ok(Err(Error::FormatVersion {
                        found: u32::try_from(found).unwrap_or(u32::MAX),
                        expected: FORMAT_VERSION,
                    }));
                }
                if let Some(expected) = stored.filter(|&d| d != dims) {
                    return Ok(Err(Error::DimensionMismatch {
                        got: self.dimensions,
                        expected: usize::try_from(expected).unwrap_or(usize::MAX),
                    }));
                }
                if format == Some(FORMAT_ONE_FOREST) && stored.is_some() {
                    // Every id is in index 0; a forest-less index may take shards.
                    let shard_items = match Reader::<Cosine>::open(wtxn, 0, self.arroy) {
                        Ok(_) => ONE_SHARD,
                        Err(arroy::Error::MissingMetadata(_)) => {
                            u64::from(self.opts.shard_items.max(1))
                        }
                        Err(e) => return Err(e),
                    };
                    write_u64(self.meta, wtxn, META_SHARD_ITEMS, shard_items)?;
                    write_u64(self.meta, wtxn, META_SHARDS, 1)?;
                    write_u64(self.meta, wtxn, META_FORMAT, u64::from(FORMAT_VERSION))?;
                    return Ok(Ok(()));
                }
                if format.is_some() && stored.is_some() {
                    return Ok(Ok(()));
                }
            } else {
                // Every forest, whatever the recorded shard count says.
                self.arroy.clear(wtxn)?;
                self.meta.clear(wtxn)?;
            }
            write_u64(self.meta, wtxn, META_FORMAT, u64::from(FORMAT_VERSION))?;
            write_u64(self.meta, wtxn, META_DIMENSIONS, dims)?;
            if reset || read_u64(self.meta, wtxn, META_WATERMARK)?.is_none() {
                write_u64(self.meta, wtxn, META_WATERMARK, 0)?;
            }
            let shard_items = u64::from(self.opts.shard_items.max(1));
            write_u64(self.meta, wtxn, META_SHARD_ITEMS, shard_items)?;
            write_u64(self.meta, wtxn, META_SHARDS, 1)?;
            Ok(Ok(()))
        })?;
        let _shared = self.gate_read();
        let rtxn = self.env.read_txn()?;
        let shard_items = read_u64(self.meta, &rtxn, META_SHARD_ITEMS)?.unwrap_or(ONE_SHARD);
        let shards = read_u64(self.meta, &rtxn, META_SHARDS)?.unwrap_or(1);
        self.shard_items
            .store(shard_items.max(1), Ordering::Relaxed);
        self.shards
            .store(u32::try_from(shards).unwrap_or(u32::MAX), Ordering::Relaxed);
        Ok(())
    }

    /// The shard (arroy index number) that holds `id`. Ids past the last number arroy
    /// has (only with a `shard_items` below 65,537) share the last shard.
    fn shard_of(&self, id: u32) -> u16 {
        let shard = u64::from(id) / self.shard_items.load(Ordering::Relaxed);
        u16::try_from(shard).unwrap_or(u16::MAX)
    }

    /// The shards that may hold built items.
    fn shard_range(&self) -> impl Iterator<Item = u16> + Clone {
        let shards = self.shards.load(Ordering::Relaxed);
        (0..shards.min(u32::from(u16::MAX) + 1)).map(|s| u16::try_from(s).unwrap_or(u16::MAX))
    }

    /// The ids of `shard`.
    fn shard_ids(&self, shard: u16) -> std::ops::RangeInclusive<u32> {
        let per = self.shard_items.load(Ordering::Relaxed);
        let lo = u64::from(shard) * per;
        let hi = if shard == u16::MAX {
            u64::from(u32::MAX)
        } else {
            (lo + per - 1).min(u64::from(u32::MAX))
        };
        u32::try_from(lo).unwrap_or(u32::MAX)..=u32::try_from(hi).unwrap_or(u32::MAX)
    }

    /// The dimension every vector and query must have.
    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// The options the index was opened with.
    pub fn options(&self) -> &VectorOptions {
        &self.opts
    }

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
    fn tail_budget(&self) -> usize {
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

    fn stage_vectors(&self, valid: Vec<(u32, Arc<StagedVector>)>) {
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
    fn read_back(&self, id: u32) -> Result<Option<Arc<StagedVector>>> {
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

    fn build_chunk(
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
        self.shards.store(shards, Ordering::Relaxed);

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
    fn write_batch(
        &self,
        wtxn: &mut RwTxn<'_>,
        batch: &[(u32, Staged)],
        seed: u64,
        record: Option<u64>,
        read_back: &mut HashMap<u32, Arc<StagedVector>>,
    ) -> arroy::Result<Result<(u64, usize, u32)>> {
        let mut read_back_bytes = 0;
        let (mut items, mut n_trees) = (0, 0);
        // The batch is sorted by id, so each shard's changes are one run of it.
        let mut rest = batch;
        let mut shards = u64::from(self.shards.load(Ordering::Relaxed));
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
            shards = shards.max(u64::from(shard) + 1);
        }
        write_u64(self.meta, wtxn, META_SHARDS, shards)?;
        if let Some(watermark) = record {
            write_u64(self.meta, wtxn, META_WATERMARK, watermark)?;
        }
        for shard in 0..u16::try_from(shards).unwrap_or(u16::MAX) {
            match Reader::<Cosine>::open(wtxn, shard, self.arroy) {
                Ok(reader) => {
                    items += reader.n_items();
                    n_trees = n_trees.max(reader.n_trees());
                }
                Err(arroy::Error::MissingMetadata(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Ok((
            items,
            n_trees,
            u32::try_from(shards).unwrap_or(u32::MAX),
        )))
    }

    /// The watermark of the last successful build (0 for a new or cleared index).
    pub fn watermark(&self) -> Result<u64> {
        let _shared = self.gate_read();
        let rtxn = self.env.read_txn()?;
        Ok(read_u64(self.meta, &rtxn, META_WATERMARK)?.unwrap_or(0))
    }

    /// Items in the built index (staged changes not counted).
    pub fn len(&self) -> Result<u64> {
        let _shared = self.gate_read();
        let rtxn = self.env.read_txn()?;
        let mut items = 0;
        for shard in self.shard_range() {
            match Reader::<Cosine>::open(&rtxn, shard, self.arroy) {
                Ok(reader) => items += reader.n_items(),
                Err(arroy::Error::MissingMetadata(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(items)
    }

    /// `true` when nothing is built and nothing is staged.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.pending() == 0 && self.len()? == 0)
    }

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
    fn search_tail(
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
                hits.push((id, super::cosine_of(dot, query_norm, v.norm)));
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
    fn score_stored(
        &self,
        query: &[f32],
        query_norm: f32,
        stored: &[u32],
        hits: &mut Vec<(u32, f32)>,
    ) -> Result<()> {
        for &id in stored {
            if let Some(v) = self.read_back(id)? {
                let dot = v.dot(query);
                hits.push((id, super::cosine_of(dot, query_norm, v.norm)));
            }
        }
        Ok(())
    }

    /// Scores every candidate exactly: staged and hot vectors from memory, the rest read
    /// from LMDB (and then cached). A session-sized scope is cheaper this way than opening
    /// a reader, which decodes the whole item bitmap, and walking trees.
    fn search_exact(
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
                hits.push((id, super::cosine_of(dot, query_norm, vector.norm)));
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
                        hits.push((id, super::cosine_of(dot, query_norm, norm)));
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
    fn search_built(
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
        for shard in self.shard_range() {
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

    /// Empties the index: built items, staged changes, and the watermark (back to 0). The
    /// dimension stays; to change it, use [`recreate`](Self::recreate).
    pub fn clear(&self) -> Result<()> {
        let _writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Held across the commit so no search sees the cleared tree with the old tail.
        let mut tail = self.tail_write();
        self.write_with_growth(|wtxn| {
            // Every forest, whatever the recorded shard count says.
            self.arroy.clear(wtxn)?;
            write_u64(self.meta, wtxn, META_WATERMARK, 0)?;
            write_u64(self.meta, wtxn, META_SHARDS, 1)?;
            Ok(Ok(()))
        })?;
        self.shards.store(1, Ordering::Relaxed);
        tail.reset();
        Ok(())
    }

    /// The vector currently indexed for `id`: the staged one if any (`None` when a removal
    /// is staged), else the built one.
    pub fn get(&self, id: u32) -> Result<Option<Vec<f32>>> {
        {
            let tail = self.tail_read();
            if let Some(staged) = tail.entries.get(&id) {
                return match &staged.change {
                    Change::Upsert(v) => Ok(Some(v.to_vec())),
                    Change::Stored => {
                        drop(tail);
                        Ok(self.read_back(id)?.map(|v| v.to_vec()))
                    }
                    Change::Remove => Ok(None),
                };
            }
            if let Some(v) = tail.hot.get(id) {
                return Ok(Some(v.to_vec()));
            }
        }
        let shard = self.shard_of(id);
        let _shared = self.gate_read();
        let rtxn = self.env.read_txn()?;
        let writer = Writer::<Cosine>::new(self.arroy, shard, self.dimensions);
        Ok(writer.item_vector(&rtxn, id)?)
    }

    /// Validates a vector for this index and returns its norm.
    fn check_vector(&self, field: &str, values: &[f32]) -> Result<f32> {
        if values.len() != self.dimensions {
            return Err(Error::invalid(
                field,
                format!(
                    "has {} dimensions but this vector index holds {}-dimensional vectors; \
                     embed it with the embedder the index was built for, or run \
                     `shadowbrain reindex` after changing embedders",
                    values.len(),
                    self.dimensions
                ),
            ));
        }
        if let Some((i, x)) = values.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(Error::invalid(
                field,
                format!("component {i} is {x}; every component must be a finite number"),
            ));
        }
        let norm = values.iter().map(|x| x * x).sum::<f32>().sqrt();
        if !(norm.is_finite() && norm > 0.0) {
            return Err(Error::invalid(
                field,
                format!(
                    "has norm {norm}; cosine similarity needs a non-zero vector whose squared \
                     components sum to a finite number (scale it, e.g. normalise to length 1)"
                ),
            ));
        }
        Ok(norm)
    }

    /// Runs `work` in a write transaction and commits it, growing the map and retrying on
    /// `MDB_MAP_FULL`. `work` returns `Ok(Err(e))` to abort with a domain error.
    fn write_with_growth<T>(
        &self,
        work: impl FnMut(&mut RwTxn<'_>) -> arroy::Result<Result<T>>,
    ) -> Result<T> {
        let mut resizes = 0;
        self.write_with_growth_counted(&mut resizes, work)
    }

    fn write_with_growth_counted<T>(
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
    fn grow_ahead_for(&self, new_items: usize) -> Result<u32> {
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
    fn grow(&self, at_least: usize) -> Result<()> {
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
    fn releasing_while<T>(&self, work: impl FnOnce() -> T) -> T {
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

    fn build_pool(&self, background: bool) -> Result<&rayon::ThreadPool> {
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
            builder = builder.start_handler(|_| lower_priority());
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

    fn tail_read(&self) -> RwLockReadGuard<'_, Tail> {
        self.tail.read().unwrap_or_else(|p| p.into_inner())
    }

    fn tail_write(&self) -> RwLockWriteGuard<'_, Tail> {
        self.tail.write().unwrap_or_else(|p| p.into_inner())
    }

    fn gate_read(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for VectorIndex {
    /// The map release thread stops before the environment closes (see `MapRelease`).
    fn drop(&mut self) {
        self.release.stop();
    }
}

/// Lowers the calling thread's CPU priority to `nice` 10 (Linux: per thread). Failure
/// only means the build competes at normal priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id, no memory involved.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

fn read_u64(db: MetaDb, rtxn: &RoTxn<'_>, key: &str) -> heed::Result<Option<u64>> {
    Ok(db
        .get(rtxn, key)?
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map(u64::from_be_bytes))
}

fn write_u64(db: MetaDb, wtxn: &mut RwTxn<'_>, key: &str, value: u64) -> heed::Result<()> {
    db.put(wtxn, key, &value.to_be_bytes())
}

fn is_map_full(e: &arroy::Error) -> bool {
    matches!(
        e,
        arroy::Error::Heed(heed::Error::Mdb(heed::MdbError::MapFull))
    )
}

fn arroy_error(e: arroy::Error) -> Error {
    match e {
        arroy::Error::Heed(e) => Error::from(e),
        // Only [`VectorIndex::cancel_builds`] cancels, when the index is closing.
        arroy::Error::BuildCancelled => Error::Closed,
        other => Error::from(other),
    }
}

fn round_to_granule(n: usize) -> usize {
    n.div_ceil(MAP_GRANULE).saturating_mul(MAP_GRANULE)
}

/// Dot product of `a` and `b`, summed exactly as [`dot_and_norm2`] sums it (the same
/// bits), for vectors whose norm is known already.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut dot = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
        }
    }
    let mut d: f32 = dot.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        d += x * y;
    }
    d
}

/// Dot product of `a` and `b` and the squared norm of `b`, in eight independent lanes so
/// the compiler can vectorise without reassociating floats.
fn dot_and_norm2(a: &[f32], b: &[f32]) -> (f32, f32) {
    let mut dot = [0f32; LANES];
    let mut norm = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            dot[i] += x[i] * y[i];
            norm[i] += y[i] * y[i];
        }
    }
    let mut d: f32 = dot.iter().sum();
    let mut n: f32 = norm.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        d += x * y;
        n += y * y;
    }
    (d, n)
}

/// Sorts best first (ties: smaller id first) and keeps `k`.
fn keep_best(hits: &mut Vec<(u32, f32)>, k: usize) {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if hits.len() > k {
        hits.select_nth_unstable_by(k, order);
        hits.truncate(k);
    }
    hits.sort_unstable_by(order);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use rand::RngExt;
    use tempfile::{TempDir, tempdir};

    use super::*;

    /// `n` vectors around `centroids` random directions: the shape of real embeddings
    /// (topics), which is what tree partitioning has to cope with.
    fn clustered(n: usize, dims: usize, centroids: usize, noise: f32, seed: u64) -> Vec<Vec<f32>> {
        around(n, dims, centroids, noise, seed, seed)
    }

    /// Queries drawn from the same clusters as `clustered(.., seed)`, with fresh noise.
    fn queries(n: usize, dims: usize, centroids: usize, noise: f32, seed: u64) -> Vec<Vec<f32>> {
        around(n, dims, centroids, noise, seed, seed ^ 0x9e37_79b9)
    }

    fn around(
        n: usize,
        dims: usize,
        centroids: usize,
        noise: f32,
        centre_seed: u64,
        point_seed: u64,
    ) -> Vec<Vec<f32>> {
        let mut rng = StdRng::seed_from_u64(centre_seed);
        let centres: Vec<Vec<f32>> = (0..centroids)
            .map(|_| unit(gaussian(&mut rng, dims, 1.0)))
            .collect();
        let mut rng = StdRng::seed_from_u64(point_seed.wrapping_add(1));
        let sigma = noise / (dims as f32).sqrt();
        (0..n)
            .map(|_| {
                let c = &centres[rng.random_range(0..centroids)];
                let e = gaussian(&mut rng, dims, sigma);
                c.iter().zip(e).map(|(c, e)| c + e).collect()
            })
            .collect()
    }

    fn gaussian(rng: &mut StdRng, dims: usize, sigma: f32) -> Vec<f32> {
        (0..dims)
            .map(|_| {
                // Box–Muller: rand 0.10 has no normal distribution without rand_distr.
                let u1: f32 = rng.random::<f32>().max(f32::MIN_POSITIVE);
                let u2: f32 = rng.random();
                sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect()
    }

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// Brute force over `(id, vector)` pairs, the reference every search is checked against.
    fn brute_force(
        items: &[(u32, Vec<f32>)],
        query: &[f32],
        k: usize,
        candidates: Option<&RoaringBitmap>,
    ) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = items
            .iter()
            .filter(|(id, _)| candidates.is_none_or(|c| c.contains(*id)))
            .map(|(id, v)| (*id, crate::index::cosine(query, v)))
            .collect();
        keep_best(&mut all, k);
        all
    }

    fn ids(hits: &[(u32, f32)]) -> Vec<u32> {
        hits.iter().map(|(id, _)| *id).collect()
    }

    fn with_ids(vectors: Vec<Vec<f32>>) -> Vec<(u32, Vec<f32>)> {
        vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i as u32, v))
            .collect()
    }

    fn open(dir: &TempDir, dims: usize) -> VectorIndex {
        VectorIndex::open(dir.path(), dims, VectorOptions::default()).unwrap()
    }

    fn axis(dims: usize, i: usize) -> Vec<f32> {
        let mut v = vec![0.0; dims];
        v[i] = 1.0;
        v
    }

    #[test]
    fn the_index_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<VectorIndex>();
    }

    #[test]
    fn staged_vectors_are_searchable_before_any_build() {
        let dir = TempDir::new().unwrap();
        let index = open(&dir, 4);
        index.upsert(&[
            (7, axis(4, 0)),
            (8, axis(4, 1)),
            (9, vec![1.0, 1.0, 0.0, 0.0]),
        ]);
        assert_eq!(index.pending(), 3);
        assert_eq!(index.len().unwrap(), 0);

        let hits = index.search(&axis(4, 0), 2, None).unwrap();
        assert_eq!(ids(&hits), vec![7, 9]);
        assert!((hits[0].1 - 1.0).abs() < 1e-6);
        assert!((hits[1].1 - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-5);

        let stats = index.build(3).unwrap();
        assert_eq!((stats.upserted, stats.removed, stats.items), (3, 0, 3));
        assert_eq!(index.pending(), 0);
        assert_eq!(index.len().unwrap(), 3);
        let after = index.search(&axis(4, 0), 2, None).unwrap();
        assert_eq!(ids(&after), vec![7, 9]);
        assert!((after[1].1 - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-5);
        assert_eq!(index.get(8).unwrap(), Some(axis(4, 1)));
    }

    #[test]
    fn a_removal_hides_the_item_at_once_and_after_the_build() {
        let dir = TempDir::new().unwrap();
        let index = open(&dir, 4);
        index.upsert(&[
            (1, axis(4, 0)),
            (2, vec![0.9, 0.1, 0.0, 0.0]),
            (3, axis(4, 2)),
        ]);
        index.build(1).unwrap();

        index.remove(&[1]);
        // Also remove something only staged, and something that never existed.
        index.upsert(&[(4, vec![0.8, 0.2, 0.0, 0.0])]);
        index.remove(&[4, 99]);
        let hits = index.search(&axis(4, 0), 10, None).unwrap();
        assert_eq!(ids(&hits), vec![2, 3]);
        assert_eq!(index.get(1).unwrap(), None);
        let scoped = index
            .search(&axis(4, 0), 10, Some(&RoaringBitmap::from_iter([1, 2])))
            .unwrap();
        assert_eq!(ids(&scoped), vec![2]);

        let stats = index.build(2).unwrap();
        assert_eq!(stats.removed, 3);
        assert_eq!(index.len().unwrap(), 2);
        assert_eq!(
            ids(&index.search(&axis(4, 0), 10, None).unwrap()),
            vec![2, 3]
        );
        assert_eq!(index.get(1).unwrap(), None);
    }

    #[test]
    fn a_re_upsert_replaces_the_vector_before_and_after_the_build() {
        let dir = TempDir::new().unwrap();
        let index = open(&dir, 4);
        index.upsert(&[(1, axis(4, 0)), (2, axis(4, 1))]);
        index.build(1).unwrap();

        index.upsert(&[(1, axis(4, 3))]);
        let hits = index.search(&axis(4, 3), 10, None).unwrap();
        assert_eq!(hits.iter().filter(|(id, _)| *id == 1).count(), 1);
        assert_eq!(hits[0].0, 1);
        assert!((hits[0].1 - 1.0).abs() < 1e-6);
        let old_direction = index.search(&axis(4, 0), 1, None).unwrap();
        assert!(
            old_direction[0].1 < 0.5,
            "the old vector still answers: {old_direction:?}"
        );
        assert_eq!(index.get(1).unwrap(), Some(axis(4, 3)));

        index.build(2).unwrap();
        assert_eq!(index.len().unwrap(), 2);
        let hits = index.search(&axis(4, 3), 10, None).unwrap();
        assert_eq!(hits[0].0, 1);
        assert!((hits[0].1 - 1.0).abs() < 1e-6);
        assert_eq!(index.get(1).unwrap(), Some(axis(4, 3)));
    }

    #[test]
    fn candidates_never_leak_on_the_exact_or_the_tree_path() {
        let dims = 16;
        let items = with_ids(clustered(3000, dims, 20, 0.6, 1));
        let qs = queries(20, dims, 20, 0.6, 1);
        for exact_threshold in [u64::MAX, 0] {
            let dir = TempDir::new().unwrap();
            let opts = VectorOptions {
                exact_threshold,
                ..VectorOptions::default()
            };
            let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
            index.upsert(&items[..2500]);
            index.build(1).unwrap();
            // A staged tail inside and outside the candidates, and a staged removal.
            index.upsert(&items[2500..]);
            index.remove(&[0, 2]);
            let live: Vec<(u32, Vec<f32>)> = items
                .iter()
                .filter(|(id, _)| *id != 0 && *id != 2)
                .cloned()
                .collect();

            // Small scopes, and one over half the index so arroy walks its trees.
            let small = RoaringBitmap::from_iter((0..3000).step_by(37));
            let half: RoaringBitmap = (0..3000u32).filter(|i| i % 3 != 1).collect();
            for scope in [&small, &half] {
                for q in &qs {
                    let hits = index.search(q, 10, Some(scope)).unwrap();
                    assert_eq!(hits.len(), 10);
                    for (id, _) in &hits {
                        assert!(scope.contains(*id), "id {id} is outside the candidates");
                        assert!(*id != 0 && *id != 2, "removed id {id} came back");
                    }
                    if scope.len() <= exact_threshold {
                        assert_eq!(ids(&hits), ids(&brute_force(&live, q, 10, Some(scope))));
                    }
                }
            }
        }
    }

    /// The hot cache must never change an answer: random upserts, re-upserts, removals,
    /// builds, clears and reopens, with a cache too small for the data (so it evicts all the
    /// time) and with none, against a brute-force reference.
    #[test]
    fn the_hot_cache_never_changes_an_answer() {
        let dims = 8;
        let budget = 5 * Hot::cost(&StagedVector::new(&axis(dims, 0), 1.0));
        let (dir_hot, dir_cold) = (tempdir().unwrap(), tempdir().unwrap());
        let opts = |hot_cache_bytes| VectorOptions {
            hot_cache_bytes,
            build_threads: 1,
            ..VectorOptions::default()
        };
        let mut hot = VectorIndex::open(dir_hot.path(), dims, opts(budget)).unwrap();
        let mut cold = VectorIndex::open(dir_cold.path(), dims, opts(0)).unwrap();
        let mut reference: BTreeMap<u32, Vec<f32>> = BTreeMap::new();
        let mut rng = StdRng::seed_from_u64(11);
        for step in 0..400u64 {
            match rng.random_range(0..20) {
                0..=7 => {
                    let id = rng.random_range(0..40);
                    let v = gaussian(&mut rng, dims, 1.0);
                    hot.upsert(&[(id, v.clone())]);
                    cold.upsert(&[(id, v.clone())]);
                    reference.insert(id, v);
                }
                8..=9 => {
                    let id = rng.random_range(0..40);
                    hot.remove(&[id]);
                    cold.remove(&[id]);
                    reference.remove(&id);
                }
                10..=13 => {
                    hot.build(step).unwrap();
                    cold.build(step).unwrap();
                }
                14 if step % 7 == 0 => {
                    hot.clear().unwrap();
                    cold.clear().unwrap();
                    reference.clear();
                }
                15 => {
                    // Reopening drops the tail and the cache; rebuild like the substrate does.
                    hot.build(step).unwrap();
                    cold.build(step).unwrap();
                    drop((hot, cold));
                    hot = VectorIndex::open(dir_hot.path(), dims, opts(budget)).unwrap();
                    cold = VectorIndex::open(dir_cold.path(), dims, opts(0)).unwrap();
                }
                _ => {
                    let candidates: RoaringBitmap =
                        (0..40).filter(|_| rng.random_bool(0.5)).collect();
                    let query = gaussian(&mut rng, dims, 1.0);
                    let items: Vec<(u32, Vec<f32>)> =
                        reference.iter().map(|(&id, v)| (id, v.clone())).collect();
                    let want = ids(&brute_force(&items, &query, 5, Some(&candidates)));
                    let from_hot = hot.search(&query, 5, Some(&candidates)).unwrap();
                    let from_cold = cold.search(&query, 5, Some(&candidates)).unwrap();
                    assert_eq!(ids(&from_hot), want, "step {step}: hot cache");
                    assert_eq!(ids(&from_cold), want, "step {step}: no cache");
                    for id in 0..40 {
                        assert_eq!(
                            hot.get(id).unwrap(),
                            reference.get(&id).cloned(),
                            "get {id}"
                        );
                    }
                }
            }
            let tail = hot.tail_read();
            assert!(
                tail.hot.bytes <= budget,
                "step {step}: {} bytes cached",
                tail.hot.bytes
            );
            assert!(tail.hot.map.len() <= 5);
        }
        assert!(hot.tail_read().hot.inserted > 0, "the cache was never used");
    }

    /// The store's side of a spilled tail in these tests: the current vector of every id.
    #[derive(Default)]
    struct MapSource(Mutex<BTreeMap<u32, Vec<f32>>>);

    impl VectorSource for MapSource {
        fn vector(&self, id: u32) -> Result<Option<Vec<f32>>> {
            Ok(self.0.lock().unwrap().get(&id).cloned())
        }
    }

    #[test]
    fn a_tail_over_budget_reads_vectors_back_and_answers_the_same() {
        let dims = 8;
        let budget = 3 * Hot::cost(&StagedVector::new(&axis(dims, 0), 1.0));
        let source = Arc::new(MapSource::default());
        let dirs = [tempdir().unwrap(), tempdir().unwrap()];
        // Session-sized scopes take the exact path; a zero threshold forces the tail scan
        // plus the trees.
        let indexes: Vec<VectorIndex> = [2_000, 0]
            .into_iter()
            .zip(&dirs)
            .map(|(exact_threshold, dir)| {
                let index = VectorIndex::open(
                    dir.path(),
                    dims,
                    VectorOptions {
                        exact_threshold,
                        tail_memory_bytes: budget,
                        build_threads: 1,
                        ..VectorOptions::default()
                    },
                )
                .unwrap();
                index.read_back_from(source.clone());
                index
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(12);
        let mut spilled = 0;
        for step in 0..300u64 {
            match rng.random_range(0..12) {
                0..=5 => {
                    let id = rng.random_range(0..40);
                    let v = gaussian(&mut rng, dims, 1.0);
                    source.0.lock().unwrap().insert(id, v.clone());
                    for index in &indexes {
                        index.upsert(&[(id, v.clone())]);
                    }
                }
                6 => {
                    let id = rng.random_range(0..40);
                    source.0.lock().unwrap().remove(&id);
                    for index in &indexes {
                        index.remove(&[id]);
                    }
                }
                7 => {
                    for index in &indexes {
                        index.build(step).unwrap();
                    }
                }
                _ => {
                    let scope: RoaringBitmap = (0..40).filter(|_| rng.random_bool(0.6)).collect();
                    let candidates = [None, Some(&scope)][rng.random_range(0..2)];
                    let query = gaussian(&mut rng, dims, 1.0);
                    let items: Vec<(u32, Vec<f32>)> = source
                        .0
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|(&id, v)| (id, v.clone()))
                        .collect();
                    let want = ids(&brute_force(&items, &query, 5, candidates));
                    for (n, index) in indexes.iter().enumerate() {
                        let got = index.search(&query, 5, candidates).unwrap();
                        assert_eq!(ids(&got), want, "step {step}, index {n}");
                    }
                    for id in 0..40 {
                        let want = source.0.lock().unwrap().get(&id).cloned();
                        assert_eq!(indexes[0].get(id).unwrap(), want, "get {id}");
                    }
                }
            }
            for index in &indexes {
                let tail = index.tail_read();
                assert!(tail.bytes <= budget, "step {step}: {} bytes", tail.bytes);
                spilled += tail
                    .entries
                    .values()
                    .filter(|s| matches!(s.change, Change::Stored))
                    .count();
            }
        }
        assert!(spilled > 0, "nothing was ever staged past the budget");
        // A build empties the tail and gives its bytes back.
        for index in &indexes {
            index.build(1_000).unwrap();
            assert_eq!((index.pending(), index.tail_bytes()), (0, 0));
        }
    }

    /// Ids spread over many shards answer like one index: exact and tree paths against
    /// brute force through upserts, removals, builds and a reopen.
    #[test]
    fn shards_answer_like_one_index_and_survive_a_reopen() {
        let dims = 8;
        let dirs = [tempdir().unwrap(), tempdir().unwrap()];
        let opts = |exact_threshold| VectorOptions {
            exact_threshold,
            shard_items: 16,
            max_build_items: 30,
            build_threads: 1,
            ..VectorOptions::default()
        };
        let mut indexes: Vec<VectorIndex> = [2_000, 0]
            .into_iter()
            .zip(&dirs)
            .map(|(t, dir)| VectorIndex::open(dir.path(), dims, opts(t)).unwrap())
            .collect();
        let mut rng = StdRng::seed_from_u64(21);
        let mut truth: HashMap<u32, Vec<f32>> = HashMap::new();
        for step in 0..400u64 {
            match rng.random_range(0..12) {
                0..=5 => {
                    let id = rng.random_range(0..100);
                    let v = gaussian(&mut rng, dims, 1.0);
                    truth.insert(id, v.clone());
                    for index in &indexes {
                        index.upsert(&[(id, v.clone())]);
                    }
                }
                6 => {
                    let id = rng.random_range(0..100);
                    truth.remove(&id);
                    for index in &indexes {
                        index.remove(&[id]);
                    }
                }
                7 => {
                    for index in &indexes {
                        index.build(step).unwrap();
                    }
                }
                8 if step % 5 == 0 => {
                    for index in &indexes {
                        index.build(step).unwrap();
                    }
                    // Closed before reopening: LMDB refuses a second open of a directory.
                    indexes.clear();
                    indexes = [2_000, 0]
                        .into_iter()
                        .zip(&dirs)
                        .map(|(t, dir)| VectorIndex::open(dir.path(), dims, opts(t)).unwrap())
                        .collect();
                    for index in &indexes {
                        assert_eq!(index.len().unwrap(), truth.len() as u64, "step {step}");
                    }
                }
                _ => {
                    let scope: RoaringBitmap = (0..100).filter(|_| rng.random_bool(0.3)).collect();
                    let candidates = [None, Some(&scope)][rng.random_range(0..2)];
                    let query = gaussian(&mut rng, dims, 1.0);
                    let items: Vec<(u32, Vec<f32>)> =
                        truth.iter().map(|(&id, v)| (id, v.clone())).collect();
                    let want = ids(&brute_force(&items, &query, 5, candidates));
                    for (n, index) in indexes.iter().enumerate() {
                        let got = index.search(&query, 5, candidates).unwrap();
                        assert_eq!(ids(&got), want, "step {step}, index {n}");
                    }
                    for id in 0..100 {
                        assert_eq!(indexes[1].get(id).unwrap(), truth.get(&id).cloned());
                    }
                }
            }
        }
        for index in &indexes {
            index.build(1_000).unwrap();
            assert_eq!(index.len().unwrap(), truth.len() as u64);
            let shards = index.shards.load(Ordering::Relaxed);
            assert!(shards >= 6, "ids 0..100 in shards of 16");
            // Removing an id of an empty shard creates no forest there.
            index.remove(&[50_000]);
            index.build(1_001).unwrap();
            assert_eq!(index.shards.load(Ordering::Relaxed), shards);
        }
    }

    /// An index written before shards keeps every id in its one forest.
    #[test]
    fn an_index_from_before_shards_stays_one_shard() {
        let dir = tempdir().unwrap();
        let dims = 4;
        {
            let index = open(&dir, dims);
            index.upsert(
                &(0..10)
                    .map(|i| (i, axis(dims, i as usize % dims)))
                    .collect::<Vec<_>>(),
            );
            index.build(1).unwrap();
            // What an index of the first format holds: format 1, no shard keys.
            index
                .write_with_growth(|wtxn| {
                    index.meta.delete(wtxn, META_SHARD_ITEMS)?;
                    index.meta.delete(wtxn, META_SHARDS)?;
                    write_u64(index.meta, wtxn, META_FORMAT, FORMAT_ONE_FOREST)?;
                    Ok(Ok(()))
                })
                .unwrap();
        }
        let opts = VectorOptions {
            shard_items: 4,
            ..VectorOptions::default()
        };
        let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
        assert_eq!(index.len().unwrap(), 10);
        index.upsert(&[(50, axis(dims, 1))]);
        index.build(2).unwrap();
        assert_eq!(index.shard_of(50), 0);
        assert_eq!(index.len().unwrap(), 11);
        assert_eq!(index.get(7).unwrap(), Some(axis(dims, 3)));
        // Recorded as the current format: a binary from before shards refuses it.
        assert_eq!(index.watermark().unwrap(), 2);
        let rtxn = index.env.read_txn().unwrap();
        let format = read_u64(index.meta, &rtxn, META_FORMAT).unwrap();
        assert_eq!(format, Some(u64::from(FORMAT_VERSION)));
    }

    #[test]
    fn builds_go_in_bounded_transactions_and_record_the_watermark_with_the_last() {
        let dir = tempdir().unwrap();
        let index = VectorIndex::open(
            dir.path(),
            4,
            VectorOptions {
                max_build_items: 3,
                build_threads: 1,
                ..VectorOptions::default()
            },
        )
        .unwrap();
        let items: Vec<(u32, Vec<f32>)> = (0..10).map(|i| (i, axis(4, i as usize % 4))).collect();
        index.upsert(&items);
        let first = index.build_with(7, true).unwrap();
        assert_eq!((first.upserted, first.remaining), (3, 7));
        assert_eq!(
            first.watermark, 0,
            "a partial build keeps the old watermark"
        );
        assert_eq!((index.pending(), index.len().unwrap()), (7, 3));
        assert_eq!(index.watermark().unwrap(), 0);
        // Built or staged, every item is found.
        let all: RoaringBitmap = (0..10).collect();
        assert_eq!(index.search(&axis(4, 1), 10, Some(&all)).unwrap().len(), 10);
        let rest = index.build(7).unwrap();
        assert_eq!((rest.upserted, rest.remaining, rest.watermark), (7, 0, 7));
        assert_eq!((index.pending(), index.len().unwrap()), (0, 10));
        assert_eq!(index.watermark().unwrap(), 7);
    }

    #[test]
    fn search_equals_exact_search_on_small_data() {
        let dims = 32;
        let items = with_ids(clustered(600, dims, 8, 0.7, 2));
        let dir = TempDir::new().unwrap();
        let opts = VectorOptions {
            exact_threshold: 0,
            ..VectorOptions::default()
        };
        let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
        index.upsert(&items);
        index.build(1).unwrap();
        for q in queries(30, dims, 8, 0.7, 2) {
            let got = index.search(&q, 10, None).unwrap();
            let want = brute_force(&items, &q, 10, None);
            assert_eq!(ids(&got), ids(&want));
            for ((_, g), (_, w)) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "similarity {g} vs exact {w}");
            }
        }
    }

    #[test]
    fn the_watermark_and_items_survive_a_reopen() {
        let dir = TempDir::new().unwrap();
        let items = with_ids(clustered(300, 8, 4, 0.5, 3));
        {
            let index = open(&dir, 8);
            assert_eq!(index.watermark().unwrap(), 0);
            index.upsert(&items);
            let stats = index.build(42).unwrap();
            assert_eq!(stats.watermark, 42);
            // Staged but never built: lost on close by design, the store replays it.
            index.upsert(&[(1000, axis(8, 0))]);
        }
        let index = open(&dir, 8);
        assert_eq!(index.watermark().unwrap(), 42);
        assert_eq!(index.len().unwrap(), 300);
        assert_eq!(index.pending(), 0);
        assert_eq!(index.get(5).unwrap(), Some(items[5].1.clone()));
        let hits = index.search(&items[17].1, 1, None).unwrap();
        assert_eq!(hits[0].0, 17);

        index.clear().unwrap();
        assert_eq!(index.watermark().unwrap(), 0);
        assert_eq!(index.len().unwrap(), 0);
        assert!(index.search(&items[17].1, 5, None).unwrap().is_empty());
        drop(index);
        assert_eq!(open(&dir, 8).len().unwrap(), 0);
    }

    #[test]
    fn another_dimension_on_reopen_names_shadowbrain_reindex() {
        let dir = TempDir::new().unwrap();
        {
            let index = open(&dir, 8);
            index.upsert(&[(1, axis(8, 0))]);
            index.build(1).unwrap();
        }
        let err = VectorIndex::open(dir.path(), 16, VectorOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::DimensionMismatch {
                    got: 16,
                    expected: 8
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("shadowbrain reindex"), "{err}");

        // The reindex path: recreate with the new dimension, then it opens normally.
        let index = VectorIndex::recreate(dir.path(), 16, VectorOptions::default()).unwrap();
        assert_eq!(index.len().unwrap(), 0);
        assert_eq!(index.watermark().unwrap(), 0);
        index.upsert(&[(1, axis(16, 9))]);
        index.build(5).unwrap();
        drop(index);
        let index = VectorIndex::open(dir.path(), 16, VectorOptions::default()).unwrap();
        assert_eq!(index.get(1).unwrap(), Some(axis(16, 9)));
    }

    #[test]
    fn opening_the_same_directory_twice_is_an_error_not_a_panic() {
        let dir = TempDir::new().unwrap();
        let _first = open(&dir, 4);
        let err = VectorIndex::open(dir.path(), 4, VectorOptions::default()).unwrap_err();
        assert!(err.to_string().contains("already open"), "{err}");
    }

    #[test]
    fn a_full_map_grows_and_the_build_is_retried() {
        let dir = TempDir::new().unwrap();
        let dims = 64;
        let opts = VectorOptions {
            initial_map_size: 64 << 10,
            ..VectorOptions::default()
        };
        let items = with_ids(clustered(3000, dims, 10, 0.5, 4));
        {
            let mut index = VectorIndex::open(dir.path(), dims, opts.clone()).unwrap();
            index.grow_ahead = false;
            index.upsert(&items[..2000]);
            let stats = index.build(1).unwrap();
            assert!(stats.map_resizes > 0, "{stats:?}");
            assert!(index.env.info().map_size > 64 << 10);
            assert_eq!(stats.items, 2000);
            index.upsert(&items[2000..]);
            assert_eq!(index.build(2).unwrap().items, 3000);
        }
        // Reopening with the tiny initial size still fits the grown file.
        let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
        assert_eq!(index.len().unwrap(), 3000);
        assert_eq!(index.watermark().unwrap(), 2);
        assert_eq!(index.search(&items[2999].1, 1, None).unwrap()[0].0, 2999);
    }

    #[test]
    fn bad_queries_and_vectors_are_clear_errors() {
        let dir = TempDir::new().unwrap();
        let index = open(&dir, 4);
        index.upsert(&[(1, axis(4, 0))]);

        let invalid = |r: Result<Vec<(u32, f32)>>| match r {
            Err(Error::Invalid { field, reason }) => {
                assert_eq!(field, "query");
                reason
            }
            other => panic!("expected Error::Invalid, got {other:?}"),
        };
        let reason = invalid(index.search(&[1.0, 0.0], 5, None));
        assert!(reason.contains("has 2 dimensions") && reason.contains("4-dimensional"));
        let reason = invalid(index.search(&[1.0, f32::NAN, 0.0, 0.0], 5, None));
        assert!(reason.contains("component 1 is NaN"), "{reason}");
        invalid(index.search(&[f32::INFINITY, 0.0, 0.0, 0.0], 5, None));
        let reason = invalid(index.search(&[0.0; 4], 5, None));
        assert!(reason.contains("non-zero"), "{reason}");
        assert!(index.search(&axis(4, 0), 0, None).unwrap().is_empty());
        let none = RoaringBitmap::new();
        assert!(
            index
                .search(&axis(4, 0), 5, Some(&none))
                .unwrap()
                .is_empty()
        );

        // try_upsert is all or nothing and names the item.
        let err = index
            .try_upsert(&[(2, axis(4, 1)), (3, vec![f32::NAN; 4])])
            .unwrap_err();
        assert!(err.to_string().contains("item 3"), "{err}");
        assert_eq!(index.pending(), 1);
        // upsert skips what it cannot index and keeps the rest.
        index.upsert(&[(4, vec![1.0; 3]), (5, axis(4, 2)), (1, vec![0.0; 4])]);
        assert_eq!(index.pending(), 2);
        assert_eq!(index.get(1).unwrap(), Some(axis(4, 0)));
        assert_eq!(index.get(4).unwrap(), None);
        assert!(matches!(
            VectorIndex::open(&dir.path().join("zero"), 0, VectorOptions::default()),
            Err(Error::Invalid { .. })
        ));
    }

    #[test]
    fn builds_are_deterministic() {
        let dims = 24;
        let items = with_ids(clustered(2500, dims, 15, 0.8, 5));
        let qs = queries(20, dims, 15, 0.8, 5);
        let opts = VectorOptions {
            n_trees: Some(4),
            search_k_factor: 1,
            exact_threshold: 0,
            build_threads: 1,
            ..VectorOptions::default()
        };
        let run = || {
            let dir = TempDir::new().unwrap();
            let index = VectorIndex::open(dir.path(), dims, opts.clone()).unwrap();
            index.upsert(&items[..2000]);
            index.build(10).unwrap();
            index.upsert(&items[2000..]);
            index.build(20).unwrap();
            qs.iter()
                .map(|q| index.search(q, 10, None).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn changes_staged_during_builds_are_never_lost() {
        let dims = 16;
        let dir = TempDir::new().unwrap();
        let index = open(&dir, dims);
        let items = with_ids(clustered(4000, dims, 10, 0.5, 6));
        let replacements = clustered(40, dims, 10, 0.5, 60);
        index.upsert(&items[..2000]);
        std::thread::scope(|s| {
            s.spawn(|| {
                for (i, chunk) in items[2000..].chunks(50).enumerate() {
                    index.upsert(chunk);
                    // Replace an id a running build may be writing with its old vector.
                    index.upsert(&[(i as u32, replacements[i].clone())]);
                }
            });
            s.spawn(|| {
                for wm in 1..=20 {
                    index.build(wm).unwrap();
                }
            });
        });
        index.build(100).unwrap();
        assert_eq!(index.pending(), 0);
        assert_eq!(index.len().unwrap(), 4000);
        for (i, v) in replacements.iter().enumerate() {
            assert_eq!(index.get(i as u32).unwrap().as_ref(), Some(v), "item {i}");
        }
        for (id, v) in items.iter().skip(40).step_by(97) {
            assert_eq!(index.get(*id).unwrap().as_ref(), Some(v), "item {id}");
        }
    }

    #[test]
    fn searches_during_a_build_always_see_every_item() {
        let dims = 32;
        let dir = TempDir::new().unwrap();
        let index = open(&dir, dims);
        let items = with_ids(clustered(6000, dims, 30, 0.5, 7));
        index.upsert(&items[..3000]);
        index.build(1).unwrap();
        index.upsert(&items[3000..]);
        let probes: Vec<usize> = (3000..6000).step_by(211).collect();
        let scope: RoaringBitmap = probes.iter().map(|&i| i as u32).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                index.build(2).unwrap();
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            s.spawn(|| {
                let mut rounds = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || rounds < 3 {
                    for &i in &probes {
                        let hits = index.search(&items[i].1, 1, Some(&scope)).unwrap();
                        assert_eq!(hits[0].0, i as u32, "item {i} vanished mid-build");
                    }
                    rounds += 1;
                }
            });
        });
        assert_eq!(index.pending(), 0);
        assert_eq!(index.len().unwrap(), 6000);
    }

    /// Recall and latency on synthetic clustered data, run once in release to pick the
    /// defaults:
    /// `cargo test --release -p shadowbrain-runtime --lib vector -- --ignored --nocapture`.
    /// `SB_BENCH_N`, `SB_BENCH_TREES` (e.g. `8,16`) and `SB_BENCH_FACTORS` override the grid.
    #[test]
    #[ignore = "measurement: run in release"]
    fn measure_recall_and_latency() {
        let env_list = |name: &str, default: &str| -> Vec<usize> {
            std::env::var(name)
                .unwrap_or_else(|_| default.to_string())
                .split(',')
                .map(|s| s.trim().parse().unwrap())
                .collect()
        };
        let n = env_list("SB_BENCH_N", "100000")[0];
        let trees = env_list("SB_BENCH_TREES", "16");
        let factors = env_list("SB_BENCH_FACTORS", "2,4,8,16");
        let (dims, centroids, noise, k, nq) = (384, 200, 0.75, 10, 200);
        let items = with_ids(clustered(n, dims, centroids, noise, 11));
        let qs = queries(nq, dims, centroids, noise, 11);
        let truth: Vec<HashSet<u32>> = qs
            .iter()
            .map(|q| ids(&brute_force(&items, q, k, None)).into_iter().collect())
            .collect();
        let p50 = |mut t: Vec<Duration>| {
            t.sort();
            t[t.len() / 2]
        };
        for &n_trees in &trees {
            let dir = TempDir::new().unwrap();
            let opts = VectorOptions {
                n_trees: Some(n_trees),
                ..VectorOptions::default()
            };
            let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
            index.upsert(&items);
            let stats = index.build(1).unwrap();
            println!(
                "n={n} dims={dims} n_trees={n_trees}: full build {:?}",
                stats.elapsed
            );
            let more: Vec<(u32, Vec<f32>)> = clustered(1000, dims, centroids, noise, 12)
                .into_iter()
                .enumerate()
                .map(|(i, v)| ((n + i) as u32, v))
                .collect();
            index.upsert(&more);
            let incremental = index.build(2).unwrap().elapsed;
            println!("  incremental build of 1000: {incremental:?}");
            index.remove(&more.iter().map(|(id, _)| *id).collect::<Vec<_>>());
            index.build(3).unwrap();
            drop(index);
            for &factor in &factors {
                let opts = VectorOptions {
                    n_trees: Some(n_trees),
                    search_k_factor: factor,
                    ..VectorOptions::default()
                };
                let started = Instant::now();
                let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
                let reopen = started.elapsed();
                let (mut hit, mut times) = (0usize, Vec::new());
                for (q, want) in qs.iter().zip(&truth) {
                    let t = Instant::now();
                    let got = index.search(q, k, None).unwrap();
                    times.push(t.elapsed());
                    hit += got.iter().filter(|(id, _)| want.contains(id)).count();
                }
                let recall = hit as f64 / (nq * k) as f64;
                println!(
                    "  search_k_factor={factor}: recall@10 {recall:.4}, p50 {:?} (reopen {reopen:?})",
                    p50(times)
                );
            }
        }
        // Session scope: 100 candidates, exact path.
        let dir = TempDir::new().unwrap();
        let index = VectorIndex::open(dir.path(), dims, VectorOptions::default()).unwrap();
        index.upsert(&items[..20_000]);
        index.build(1).unwrap();
        let scope: RoaringBitmap = (0..20_000u32).step_by(200).collect();
        let mut times = Vec::new();
        for q in qs.iter().cycle().take(1000) {
            let t = Instant::now();
            let got = index.search(q, 10, Some(&scope)).unwrap();
            times.push(t.elapsed());
            assert_eq!(
                ids(&got),
                ids(&brute_force(&items[..20_000], q, 10, Some(&scope)))
            );
        }
        println!("scoped top-10 over 100 candidates: p50 {:?}", p50(times));
    }

    #[test]
    fn the_dot_alone_has_the_bits_of_the_dot_beside_the_norm() {
        let mut rng = rand::rng();
        for len in [1, 7, 8, 9, 383, 384, 385] {
            let a: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            assert_eq!(dot(&a, &b).to_bits(), dot_and_norm2(&a, &b).0.to_bits());
        }
    }

    #[test]
    fn a_stored_vector_is_held_at_half_precision_and_scores_with_the_same_bits() {
        let mut rng = rand::rng();
        for len in [1, 7, 8, 63, 64, 65, 383, 384, 385] {
            let raw: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let stored = crate::store::stored_embedding(&raw);
            let query: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            for (values, half) in [(&stored, true), (&raw, false)] {
                let v = StagedVector::new(values, 1.0);
                assert_eq!(matches!(v.values, Values::Half { .. }), half, "{len}");
                assert_eq!(&v.to_vec(), values);
                assert_eq!(v.dot(&query).to_bits(), dot(&query, values).to_bits());
            }
            // Both ways of widening, whichever this CPU takes, give those bits too, down to
            // vectors whose products are subnormal.
            for magnitude in [1.0, 1e-38, 1e30] {
                let scaled: Vec<f32> = raw.iter().map(|x| x * magnitude).collect();
                let stored = crate::store::stored_embedding(&scaled);
                let (exp, halves) = codec::half_precision(&stored);
                let scale = codec::pow2(exp);
                let want = dot(&query, &stored).to_bits();
                let widened = dot_half_widened(&query, &halves, scale);
                assert_eq!(widened.to_bits(), want, "{len} {magnitude}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("f16c")
                    && std::arch::is_x86_feature_detected!("avx")
                {
                    // SAFETY: the features were just checked.
                    let got = unsafe { dot_half_f16c(&query, &halves, scale) };
                    assert_eq!(got.to_bits(), want, "{len} {magnitude}");
                }
            }
            let (full, halved) = (
                StagedVector::new(&raw, 1.0),
                StagedVector::new(&stored, 1.0),
            );
            assert_eq!(halved.bytes() * 2, full.bytes());
        }
    }
}

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
//! that holds a forest and can hold a candidate, and keeps the best `k` of all: the
//! shards with a forest are found once at open, so ids that start high (a cluster
//! partition's block, `store::IdBlock`) cost no walk over the empty shards beneath them.
//! An index of the format before shards opens as one shard holding every id;
//! `shadowbrain reindex` rebuilds it in shards.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use dot::*;
use tail::*;

mod build;
mod dot;
mod search;
mod tail;

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
    /// The shards that hold a forest, ascending: found at open (below the recorded
    /// count) and added to by builds.
    shards: RwLock<Arc<[u16]>>,
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
            shards: RwLock::new(Arc::from([])),
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
        let bound = read_u64(self.meta, &rtxn, META_SHARDS)?.unwrap_or(1);
        self.shard_items
            .store(shard_items.max(1), Ordering::Relaxed);
        // The recorded count bounds the shard numbers; which of them hold a forest is
        // probed once here (a missing forest is one lookup), not on every search.
        let mut present = Vec::new();
        for shard in 0..bound.min(u64::from(u16::MAX) + 1) {
            let shard = u16::try_from(shard).unwrap_or(u16::MAX);
            match Reader::<Cosine>::open(&rtxn, shard, self.arroy) {
                Ok(_) => present.push(shard),
                Err(arroy::Error::MissingMetadata(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.set_shards(present);
        Ok(())
    }

    /// Records which shards hold a forest (ascending).
    fn set_shards(&self, shards: Vec<u16>) {
        *self.shards.write().unwrap_or_else(|p| p.into_inner()) = Arc::from(shards);
    }

    /// The shard (arroy index number) that holds `id`. Ids past the last number arroy
    /// has (only with a `shard_items` below 65,537) share the last shard.
    fn shard_of(&self, id: u32) -> u16 {
        let shard = u64::from(id) / self.shard_items.load(Ordering::Relaxed);
        u16::try_from(shard).unwrap_or(u16::MAX)
    }

    /// The shards that hold a forest, ascending.
    fn shards(&self) -> Arc<[u16]> {
        self.shards
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
        for &shard in self.shards().iter() {
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
        self.set_shards(Vec::new());
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
}

impl Drop for VectorIndex {
    /// The map release thread stops before the environment closes (see `MapRelease`).
    fn drop(&mut self) {
        self.release.stop();
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

#[cfg(test)]
mod tests;

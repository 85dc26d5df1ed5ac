//! The LMDB backend of [`Kv`](super::Kv), through heed. LMDB is a copy-on-write B-tree:
//! a commit is durable when it returns (fsync), and a crash at any moment leaves the last
//! committed state (opened [`Durability::Logged`], a machine crash may leave an earlier
//! one). The memory map grows on demand — `MDB_MAP_FULL` aborts the transaction, doubles
//! the map and retries — so a growing store never crashes on size.
//!
//! **One table per key family.** Keys start with a family byte (`store::keys`), and most
//! families grow at their end (ids and sequence numbers are handed out in order). In one
//! shared table, a family's end sits in the middle of the tree, and LMDB splits a full page
//! in the middle: pages there end up half empty, and a page of 1.5 KB embeddings holds one
//! instead of two (W1: 521 MB for 200 MB of data). Here every family byte below
//! [`RAW_FROM`] has its own table and the rest share one, so a family's end is its table's
//! end, and a key past the last one is written with `MDB_APPEND`, which fills pages.
//! Ordered scans walk the tables in family order, so callers see one ordered key space.
//!
//! Directories written before this layout (one `store` table) are moved into it on open,
//! in one transaction, with nothing lost.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, PutFlags, RwTxn, WithoutTls};

use super::{Backend, Durability, Kv, Op, Range, ValueVisitor, Visit, Visitor};
use crate::error::{Error, Result};
use crate::pages::MapRelease;

/// The map starts here and doubles whenever it fills.
const INITIAL_MAP_SIZE: usize = 256 << 20;

/// Family bytes from here up share the last table (raw keys of the layers above).
const RAW_FROM: u8 = 0x10;

/// Tables: one per family byte below [`RAW_FROM`], and one for the rest.
const TABLES: usize = RAW_FROM as usize + 1;

/// The single table of the first layout, migrated on open.
const LEGACY_TABLE: &str = "store";

/// Entries copied per step of that migration.
const MIGRATION_CHUNK: usize = 10_000;

type Table = Database<'static, Bytes, Bytes>;

/// LMDB-backed ordered KV.
#[derive(Debug)]
pub struct LmdbKv {
    env: Env<WithoutTls>,
    tables: [Table; TABLES],
    dir: PathBuf,
    /// Held shared by every transaction and exclusively by a resize: LMDB forbids changing
    /// the map size while any transaction of this process is open.
    gate: Arc<RwLock<()>>,
    /// Gives the map's pages back now and then (see [`MapRelease`]).
    release: MapRelease,
}

impl LmdbKv {
    /// Opens (or creates) an LMDB environment in `dir`, flushing everything.
    #[cfg(test)]
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_as(dir, Durability::Full)
    }

    /// Opens (or creates) an LMDB environment in `dir`, with the given durability.
    pub fn open_as(dir: &Path, durability: Durability) -> Result<Self> {
        Self::open_with(dir, INITIAL_MAP_SIZE, durability)
    }

    /// Opens with a given initial map size (tests use a tiny one to exercise growth).
    fn open_with(dir: &Path, map_size: usize, durability: Durability) -> Result<Self> {
        let file_len = std::fs::metadata(dir.join("data.mdb"))
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        let map_size = round_to_page(map_size.max(file_len.saturating_mul(2)));
        let mut options = EnvOpenOptions::new().read_txn_without_tls();
        options.map_size(map_size).max_dbs(TABLES as u32 + 1);
        if durability == Durability::Logged {
            // SAFETY: NOMETASYNC keeps the database whole through any crash; what it gives
            // up (a machine crash may undo the last commits) is what `Logged` allows.
            unsafe { options.flags(EnvFlags::NO_META_SYNC) };
        }
        // SAFETY: the environment is opened once per directory by this process (the store
        // takes a lock file first), and its files are never touched by anything else.
        let env = unsafe { options.open(dir)? };
        let wtxn = env.write_txn()?;
        let (tables, legacy): ([Table; TABLES], Option<Table>) = env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
                let mut made = Vec::with_capacity(TABLES);
                for slot in 0..TABLES {
                    made.push(opener.create_database(wtxn, Some(&table_name(slot)))?);
                }
                let tables: [_; TABLES] = made
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("one table per slot was made"));
                let legacy = opener.open_database::<Bytes, Bytes>(wtxn, Some(LEGACY_TABLE))?;
                Ok(CommitOrAbort::<_, ()>::Commit((tables, legacy)))
            })?
            .unwrap_commit();
        let gate = Arc::new(RwLock::new(()));
        let kv = LmdbKv {
            env,
            tables,
            dir: dir.to_path_buf(),
            release: MapRelease::new(dir, gate.clone()),
            gate,
        };
        if let Some(legacy) = legacy {
            kv.migrate(legacy)?;
        }
        Ok(kv)
    }

    /// Moves every key of the one-table layout into the family tables, in one transaction.
    fn migrate(&self, legacy: Table) -> Result<()> {
        loop {
            let attempt = (|| -> heed::Result<u64> {
                let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
                let mut wtxn = self.env.write_txn()?;
                let mut moved = 0u64;
                let mut tails = Tails::default();
                // In chunks, so a large store is never all in memory at once.
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let start = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
                    let chunk: Vec<(Vec<u8>, Vec<u8>)> = legacy
                        .range(&wtxn, &(start, Bound::Unbounded))?
                        .take(MIGRATION_CHUNK)
                        .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())))
                        .collect::<heed::Result<_>>()?;
                    let Some((last, _)) = chunk.last() else {
                        break;
                    };
                    let last = last.clone();
                    for (k, v) in &chunk {
                        self.put(&mut wtxn, &mut tails, k, v)?;
                        moved += 1;
                    }
                    after = Some(last);
                }
                legacy.clear(&mut wtxn)?;
                wtxn.commit()?;
                Ok(moved)
            })();
            match attempt {
                Ok(0) => return Ok(()),
                Ok(moved) => {
                    tracing::info!(moved, dir = %self.dir.display(), "moved the store into one table per key family");
                    return Ok(());
                }
                Err(e) if is_map_full(&e) => self.grow()?,
                Err(e) => return Err(Error::from(e)),
            }
        }
    }

    fn grow(&self) -> Result<()> {
        let _exclusive = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let current = self.env.info().map_size;
        let next = round_to_page(current.saturating_mul(2));
        tracing::info!(from = current, to = next, "growing the LMDB map");
        // Forgotten first: a resize that fails halfway may have unmapped the map already.
        self.release.map_moved();
        // SAFETY: the exclusive gate guarantees no transaction of this process is open.
        unsafe { self.env.resize(next)? };
        Ok(())
    }

    /// [`Kv::scan`] inside one read transaction.
    fn scan_shared(&self, range: Range<'_>, reverse: bool, visit: &mut Visitor<'_>) -> Result<()> {
        let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let rtxn = self.env.read_txn()?;
        let slots = Self::slots(&range);
        let bounds = (range.start, range.end);
        let order: Box<dyn Iterator<Item = usize>> = if reverse {
            Box::new(slots.rev())
        } else {
            Box::new(slots)
        };
        for slot in order {
            let table = self.tables[slot];
            if reverse {
                for item in table.rev_range(&rtxn, &bounds)? {
                    let (k, v) = item?;
                    if visit(k, v)? == Visit::Stop {
                        return Ok(());
                    }
                }
            } else {
                for item in table.range(&rtxn, &bounds)? {
                    let (k, v) = item?;
                    if visit(k, v)? == Visit::Stop {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    fn try_commit(&self, batches: &[&[Op]]) -> heed::Result<()> {
        let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let mut wtxn = self.env.write_txn()?;
        let mut tails = Tails::default();
        for ops in batches {
            for op in ops.iter() {
                match op {
                    Op::Put(k, v) => self.put(&mut wtxn, &mut tails, k, v)?,
                    Op::Delete(k) => {
                        self.tables[slot(k)].delete(&mut wtxn, k)?;
                    }
                }
            }
        }
        wtxn.commit()
    }

    /// Puts one key, appending when it sorts after every key of its table.
    fn put(
        &self,
        wtxn: &mut RwTxn<'_>,
        tails: &mut Tails,
        key: &[u8],
        value: &[u8],
    ) -> heed::Result<()> {
        let slot = slot(key);
        let table = self.tables[slot];
        let last = match &mut tails.0[slot] {
            Some(last) => last,
            empty => empty.insert(
                table
                    .last(wtxn)?
                    .map(|(k, _)| k.to_vec())
                    .unwrap_or_default(),
            ),
        };
        // An empty `last` means an empty table (keys are never empty: they carry a family).
        if key > last.as_slice() {
            table.put_with_flags(wtxn, PutFlags::APPEND, key, value)?;
            last.clear();
            last.extend_from_slice(key);
        } else {
            table.put(wtxn, key, value)?;
        }
        Ok(())
    }

    /// The tables a range can touch, in key order.
    fn slots(range: &Range<'_>) -> std::ops::RangeInclusive<usize> {
        let first = match range.start {
            Bound::Included(k) | Bound::Excluded(k) => slot(k),
            Bound::Unbounded => 0,
        };
        let last = match range.end {
            Bound::Included(k) | Bound::Excluded(k) => slot(k),
            Bound::Unbounded => TABLES - 1,
        };
        first..=last.max(first)
    }
}

/// The last key of each table written in this transaction (looked up on first use).
#[derive(Default)]
struct Tails([Option<Vec<u8>>; TABLES]);

fn table_name(slot: usize) -> String {
    if slot < RAW_FROM as usize {
        format!("family-{slot:02x}")
    } else {
        "raw".to_string()
    }
}

/// The table of a key: its family byte, or the shared raw table.
fn slot(key: &[u8]) -> usize {
    usize::from(key.first().copied().unwrap_or(0).min(RAW_FROM))
}

fn round_to_page(n: usize) -> usize {
    let page = 4096;
    n.div_ceil(page) * page
}

fn is_map_full(e: &heed::Error) -> bool {
    matches!(e, heed::Error::Mdb(heed::MdbError::MapFull))
}

impl Drop for LmdbKv {
    /// The map release thread stops before the environment closes (see `MapRelease`).
    fn drop(&mut self) {
        self.release.stop();
    }
}

impl Kv for LmdbKv {
    fn backend(&self) -> Backend {
        Backend::Lmdb
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let value = {
            let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let rtxn = self.env.read_txn()?;
            self.tables[slot(key)].get(&rtxn, key)?.map(<[u8]>::to_vec)
        };
        self.release.tick(1);
        Ok(value)
    }

    fn get_each(&self, keys: &[&[u8]], visit: &mut ValueVisitor<'_>) -> Result<()> {
        {
            let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
            let rtxn = self.env.read_txn()?;
            for (i, key) in keys.iter().enumerate() {
                visit(i, self.tables[slot(key)].get(&rtxn, key)?)?;
            }
        }
        self.release.tick(keys.len() as u64);
        Ok(())
    }

    fn scan(&self, range: Range<'_>, reverse: bool, visit: &mut Visitor<'_>) -> Result<()> {
        let scanned = self.scan_shared(range, reverse, visit);
        self.release.tick(1);
        scanned
    }

    fn commit(&self, batches: &[&[Op]]) -> Result<()> {
        // One write transaction (one fsync) for the whole group.
        loop {
            match self.try_commit(batches) {
                Ok(()) => {
                    // Each write read the B-tree path to its key.
                    let writes = batches.iter().map(|ops| ops.len() as u64).sum();
                    self.release.tick(writes);
                    return Ok(());
                }
                Err(e) if is_map_full(&e) => self.grow()?,
                Err(e) => return Err(Error::from(e)),
            }
        }
    }

    fn disk_bytes(&self) -> Result<u64> {
        super::dir_disk_bytes(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_keys(kv: &LmdbKv, reverse: bool) -> Vec<Vec<u8>> {
        let mut seen = Vec::new();
        kv.scan(
            Range {
                start: Bound::Unbounded,
                end: Bound::Unbounded,
            },
            reverse,
            &mut |k, _| {
                seen.push(k.to_vec());
                Ok(Visit::Continue)
            },
        )
        .unwrap();
        seen
    }

    /// Keys of many families, written in random order (appends and inserts mixed, the last
    /// key deleted and rewritten), read back as one ordered key space in both directions.
    #[test]
    fn the_family_tables_read_as_one_ordered_key_space() {
        use rand::{RngExt, SeedableRng};
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open(dir.path()).unwrap();
        let mut reference = std::collections::BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for round in 0..30 {
            let mut ops = Vec::new();
            for _ in 0..50 {
                let family = [0u8, 1, 2, 9, 0x0f, 0x10, 0x42, 0xff][rng.random_range(0..8)];
                // Mostly ascending ids (the append path), some older ones (inserts).
                let id: u32 = if rng.random_bool(0.8) {
                    round * 1000 + rng.random_range(0..1000)
                } else {
                    rng.random_range(0..1000)
                };
                let mut key = vec![family];
                key.extend_from_slice(&id.to_be_bytes());
                if rng.random_bool(0.1) {
                    ops.push(Op::Delete(key.clone()));
                    reference.remove(&key);
                } else {
                    let value = vec![family; rng.random_range(0..2000)];
                    ops.push(Op::Put(key.clone(), value.clone()));
                    reference.insert(key, value);
                }
            }
            // Delete the largest key and write past it again in the same transaction.
            if let Some(last) = reference.keys().next_back().cloned() {
                ops.push(Op::Delete(last.clone()));
                reference.remove(&last);
            }
            kv.commit(&[&ops]).unwrap();
        }
        let want: Vec<Vec<u8>> = reference.keys().cloned().collect();
        assert_eq!(all_keys(&kv, false), want);
        let mut backwards = want.clone();
        backwards.reverse();
        assert_eq!(all_keys(&kv, true), backwards);
        for (k, v) in &reference {
            assert_eq!(kv.get(k).unwrap().as_ref(), Some(v));
        }
        // A range across tables, stopping inside the second one.
        let mut seen = Vec::new();
        kv.scan(Range::between(&[1], &[0x10]), false, &mut |k, _| {
            seen.push(k.to_vec());
            Ok(if seen.len() == 3 {
                Visit::Stop
            } else {
                Visit::Continue
            })
        })
        .unwrap();
        let expected: Vec<Vec<u8>> = want
            .iter()
            .filter(|k| k[0] >= 1 && k[0] < 0x10)
            .take(3)
            .cloned()
            .collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn sequential_embeddings_fill_their_pages() {
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open(dir.path()).unwrap();
        // Records and embeddings of the same ids interleave in every commit, as in ingest.
        for batch in 0u32..20 {
            let ops: Vec<Op> = (batch * 100..(batch + 1) * 100)
                .flat_map(|id| {
                    let mut record = vec![1];
                    record.extend_from_slice(&id.to_be_bytes());
                    let mut embedding = vec![2];
                    embedding.extend_from_slice(&id.to_be_bytes());
                    [
                        Op::Put(record, vec![0; 300]),
                        Op::Put(embedding, vec![0; 1536]),
                    ]
                })
                .collect();
            kv.commit(&[&ops]).unwrap();
        }
        let rtxn = kv.env.read_txn().unwrap();
        let stat = kv.tables[2].stat(&rtxn).unwrap();
        // Two 1.5 KB values fit a 4 KB page; half-empty pages would need about 2,000.
        assert!(stat.leaf_pages <= 1_050, "{stat:?}");
    }

    #[test]
    fn a_one_table_store_is_moved_into_family_tables() {
        let dir = tempfile::tempdir().unwrap();
        // More keys than one migration chunk, over every table.
        let keys: Vec<Vec<u8>> = (0u8..=0x12)
            .flat_map(|f| (0u16..1_500).map(move |i| [[f].as_slice(), &i.to_be_bytes()].concat()))
            .collect();
        assert!(keys.len() > 2 * MIGRATION_CHUNK);
        {
            // The first layout: every key in one table named `store`.
            let env = unsafe { EnvOpenOptions::new().max_dbs(4).open(dir.path()).unwrap() };
            let wtxn = env.write_txn().unwrap();
            let legacy: Table = env
                .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
                    opener
                        .create_database(wtxn, Some(LEGACY_TABLE))
                        .map(CommitOrAbort::<_, ()>::Commit)
                })
                .unwrap()
                .unwrap_commit();
            let mut wtxn = env.write_txn().unwrap();
            for k in &keys {
                legacy.put(&mut wtxn, k, b"kept").unwrap();
            }
            wtxn.commit().unwrap();
        }
        for _ in 0..2 {
            let kv = LmdbKv::open(dir.path()).unwrap();
            assert_eq!(all_keys(&kv, false), keys);
            for k in &keys {
                assert_eq!(kv.get(k).unwrap().as_deref(), Some(&b"kept"[..]));
            }
        }
    }

    #[test]
    fn the_map_grows_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open_with(dir.path(), 64 * 1024, Durability::Full).unwrap();
        let value = vec![7u8; 2000];
        for round in 0u32..20 {
            let ops: Vec<Op> = (0u32..100)
                .map(|i| Op::Put((round * 100 + i).to_be_bytes().to_vec(), value.clone()))
                .collect();
            kv.commit(&[&ops]).unwrap();
        }
        assert!(kv.env.info().map_size > 64 * 1024);
        assert_eq!(kv.get(&1999u32.to_be_bytes()).unwrap(), Some(value));
    }

    /// The pages a read maps are given back to the kernel, and every value reads the same
    /// afterwards (module `pages`).
    #[cfg(target_os = "linux")]
    #[test]
    fn released_pages_leave_the_rss_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open(dir.path()).unwrap();
        // Only the explicit release below: 48 MB is within the budget for reads, and a
        // slow machine must not release by time halfway.
        kv.release.hold();
        let value = |i: u32| vec![(i % 251) as u8; 3000];
        for chunk in 0..8u32 {
            let ops: Vec<Op> = (chunk * 2000..(chunk + 1) * 2000)
                .map(|i| Op::Put([&[0x01], &i.to_be_bytes()[..]].concat(), value(i)))
                .collect();
            kv.commit(&[&ops]).unwrap();
        }
        let read_all = || {
            for i in 0..16_000u32 {
                let got = kv.get(&[&[0x01], &i.to_be_bytes()[..]].concat()).unwrap();
                assert_eq!(got, Some(value(i)));
            }
        };
        read_all();
        let file = std::fs::canonicalize(dir.path().join("data.mdb")).unwrap();
        let mapped = crate::pages::mapped_bytes(&file);
        assert!(mapped > 16 << 20, "48 MB read, {mapped} bytes mapped");
        {
            let _shared = kv.gate.read().unwrap();
            assert!(kv.release.release_now() >= kv.env.info().map_size);
        }
        let after = crate::pages::mapped_bytes(&file);
        assert!(after < 1 << 20, "{after} bytes still mapped");
        read_all();
    }

    /// A release that falls due is done by the release thread, not by the read that made
    /// it due (a commit or a request would otherwise wait for the `madvise`).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_due_release_runs_on_its_own_thread_not_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open(dir.path()).unwrap();
        let value = vec![7u8; 3000];
        let ops: Vec<Op> = (0..8_000u32)
            .map(|i| Op::Put(i.to_be_bytes().to_vec(), value.clone()))
            .collect();
        kv.commit(&[&ops]).unwrap();
        for i in 0..8_000u32 {
            assert_eq!(kv.get(&i.to_be_bytes()).unwrap(), Some(value.clone()));
        }
        let file = std::fs::canonicalize(dir.path().join("data.mdb")).unwrap();
        assert!(crate::pages::mapped_bytes(&file) > 8 << 20);
        // Releases are held up: a read that released by itself would wait here for ever.
        let blocked = kv.release.block_releases();
        std::thread::sleep(crate::pages::RELEASE_INTERVAL);
        assert_eq!(kv.get(&1u32.to_be_bytes()).unwrap(), Some(value.clone()));
        drop(blocked);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut mapped = crate::pages::mapped_bytes(&file);
        while mapped >= 1 << 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            mapped = crate::pages::mapped_bytes(&file);
        }
        assert!(
            mapped < 1 << 20,
            "the release thread left {mapped} bytes mapped"
        );
    }

    /// A logged copy skips only the meta page's flush; what it committed reads back whole
    /// when opened again, by either durability.
    #[test]
    fn a_logged_copy_leaves_its_meta_page_to_the_next_flush_and_reopens_whole() {
        let dir = tempfile::tempdir().unwrap();
        let no_meta_sync = |kv: &LmdbKv| {
            let flags = kv.env.flags().unwrap().unwrap();
            flags.contains(EnvFlags::NO_META_SYNC)
        };
        {
            let kv = LmdbKv::open_as(dir.path(), Durability::Logged).unwrap();
            assert!(no_meta_sync(&kv));
            for i in 0u32..50 {
                let op = Op::Put([&[0x01], &i.to_be_bytes()[..]].concat(), vec![i as u8; 100]);
                kv.commit(&[&[op]]).unwrap();
            }
        }
        let kv = LmdbKv::open(dir.path()).unwrap();
        assert!(!no_meta_sync(&kv));
        for i in 0u32..50 {
            let got = kv.get(&[&[0x01], &i.to_be_bytes()[..]].concat()).unwrap();
            assert_eq!(got, Some(vec![i as u8; 100]));
        }
    }
}

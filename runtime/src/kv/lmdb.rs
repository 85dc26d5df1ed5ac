//! The LMDB backend of [`Kv`](super::Kv), through heed. LMDB is a copy-on-write B-tree:
//! a commit is durable when it returns (fsync), and a crash at any moment leaves the last
//! committed state. The memory map grows on demand — `MDB_MAP_FULL` aborts the transaction,
//! doubles the map and retries — so a growing store never crashes on size.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions, WithoutTls};

use super::{Backend, Kv, Op, Range, Visit, Visitor};
use crate::error::{Error, Result};

/// The map starts here and doubles whenever it fills.
const INITIAL_MAP_SIZE: usize = 256 << 20;

/// LMDB-backed ordered KV.
#[derive(Debug)]
pub struct LmdbKv {
    env: Env<WithoutTls>,
    db: Database<'static, Bytes, Bytes>,
    dir: PathBuf,
    /// Held shared by every transaction and exclusively by a resize: LMDB forbids changing
    /// the map size while any transaction of this process is open.
    gate: RwLock<()>,
}

impl LmdbKv {
    /// Opens (or creates) an LMDB environment in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with_map_size(dir, INITIAL_MAP_SIZE)
    }

    /// Opens with a given initial map size (tests use a tiny one to exercise growth).
    pub fn open_with_map_size(dir: &Path, map_size: usize) -> Result<Self> {
        let file_len = std::fs::metadata(dir.join("data.mdb"))
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        let map_size = round_to_page(map_size.max(file_len.saturating_mul(2)));
        // SAFETY: the environment is opened once per directory by this process (the store
        // takes a lock file first), and its files are never touched by anything else.
        let env = unsafe {
            EnvOpenOptions::new()
                .read_txn_without_tls()
                .map_size(map_size)
                .max_dbs(4)
                .open(dir)?
        };
        let wtxn = env.write_txn()?;
        let db: Database<'static, Bytes, Bytes> = env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
                opener
                    .create_database(wtxn, Some("store"))
                    .map(CommitOrAbort::<_, ()>::Commit)
            })?
            .unwrap_commit();
        Ok(LmdbKv {
            env,
            db,
            dir: dir.to_path_buf(),
            gate: RwLock::new(()),
        })
    }

    fn grow(&self) -> Result<()> {
        let _exclusive = self.gate.write().unwrap_or_else(|p| p.into_inner());
        let current = self.env.info().map_size;
        let next = round_to_page(current.saturating_mul(2));
        tracing::info!(from = current, to = next, "growing the LMDB map");
        // SAFETY: the exclusive gate guarantees no transaction of this process is open.
        unsafe { self.env.resize(next)? };
        Ok(())
    }

    fn try_commit(&self, batches: &[&[Op]]) -> heed::Result<()> {
        let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let mut wtxn = self.env.write_txn()?;
        for ops in batches {
            for op in ops.iter() {
                match op {
                    Op::Put(k, v) => self.db.put(&mut wtxn, k, v)?,
                    Op::Delete(k) => {
                        self.db.delete(&mut wtxn, k)?;
                    }
                }
            }
        }
        wtxn.commit()
    }
}

fn round_to_page(n: usize) -> usize {
    let page = 4096;
    n.div_ceil(page) * page
}

fn is_map_full(e: &heed::Error) -> bool {
    matches!(e, heed::Error::Mdb(heed::MdbError::MapFull))
}

impl Kv for LmdbKv {
    fn backend(&self) -> Backend {
        Backend::Lmdb
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let rtxn = self.env.read_txn()?;
        Ok(self.db.get(&rtxn, key)?.map(<[u8]>::to_vec))
    }

    fn scan(&self, range: Range<'_>, reverse: bool, visit: &mut Visitor<'_>) -> Result<()> {
        let _shared = self.gate.read().unwrap_or_else(|p| p.into_inner());
        let rtxn = self.env.read_txn()?;
        let bounds = (range.start, range.end);
        if reverse {
            for item in self.db.rev_range(&rtxn, &bounds)? {
                let (k, v) = item?;
                if visit(k, v)? == Visit::Stop {
                    break;
                }
            }
        } else {
            for item in self.db.range(&rtxn, &bounds)? {
                let (k, v) = item?;
                if visit(k, v)? == Visit::Stop {
                    break;
                }
            }
        }
        Ok(())
    }

    fn commit(&self, batches: &[&[Op]]) -> Result<()> {
        // One write transaction (one fsync) for the whole group.
        loop {
            match self.try_commit(batches) {
                Ok(()) => return Ok(()),
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

    #[test]
    fn the_map_grows_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let kv = LmdbKv::open_with_map_size(dir.path(), 64 * 1024).unwrap();
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
}

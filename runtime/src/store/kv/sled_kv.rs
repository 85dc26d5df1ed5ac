//! The sled backend of [`Kv`](super::Kv): one default tree, batches applied atomically, one
//! `flush` per group commit. sled 0.34 is unmaintained; the crash test decides whether it
//! can be the default (docs/storage.md has the figures).

use std::path::{Path, PathBuf};

use super::{Backend, Kv, Op, Range, Visit, Visitor};
use crate::error::Result;

/// sled-backed ordered KV.
#[derive(Debug)]
pub struct SledKv {
    db: sled::Db,
    dir: PathBuf,
}

impl SledKv {
    /// Opens (or creates) a sled database in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            // The store flushes explicitly on every commit; background flushing only adds
            // I/O that competes with it.
            .flush_every_ms(None)
            .open()?;
        Ok(SledKv {
            db,
            dir: dir.to_path_buf(),
        })
    }
}

impl Kv for SledKv {
    fn backend(&self) -> Backend {
        Backend::Sled
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get(key)?.map(|v| v.to_vec()))
    }

    fn scan(&self, range: Range<'_>, reverse: bool, visit: &mut Visitor<'_>) -> Result<()> {
        let iter = self.db.range::<&[u8], _>((range.start, range.end));
        let mut step = |item: sled::Result<(sled::IVec, sled::IVec)>| -> Result<Visit> {
            let (k, v) = item?;
            visit(&k, &v)
        };
        if reverse {
            for item in iter.rev() {
                if step(item)? == Visit::Stop {
                    break;
                }
            }
        } else {
            for item in iter {
                if step(item)? == Visit::Stop {
                    break;
                }
            }
        }
        Ok(())
    }

    fn commit(&self, batches: &[&[Op]]) -> Result<()> {
        // One sled batch for the whole group: atomic together, then one flush for all.
        let mut batch = sled::Batch::default();
        for ops in batches {
            for op in ops.iter() {
                match op {
                    Op::Put(k, v) => batch.insert(k.as_slice(), v.as_slice()),
                    Op::Delete(k) => batch.remove(k.as_slice()),
                }
            }
        }
        self.db.apply_batch(batch)?;
        self.db.flush()?;
        Ok(())
    }

    fn disk_bytes(&self) -> Result<u64> {
        super::dir_disk_bytes(&self.dir)
    }
}

//! The ordered key-value seam under the store. Two backends implement [`Kv`]: sled (the
//! project owner's choice) and LMDB through heed (crash-proven; docs/storage.md says why
//! LMDB is the default).
//! The trait is deliberately small — point reads, ordered range scans, and durable group
//! commits of whole batches — so a distributed backend can implement it later. It knows
//! nothing about records: keys and values are bytes.

use std::ops::Bound;
use std::path::Path;
use std::str::FromStr;

use crate::error::{Error, Result};

mod lmdb;
mod sled_kv;

pub use lmdb::LmdbKv;
pub use sled_kv::SledKv;

/// One write in a batch (serialisable: a cluster logs them, see `store/log.rs`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// Set `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Remove `key` (no error when absent).
    Delete(Vec<u8>),
}

/// An ordered key range for scans.
#[derive(Debug, Clone)]
pub struct Range<'a> {
    /// Lower bound.
    pub start: Bound<&'a [u8]>,
    /// Upper bound.
    pub end: Bound<&'a [u8]>,
}

impl<'a> Range<'a> {
    /// Every key starting with `prefix`.
    pub fn prefix(prefix: &'a [u8], end_buf: &'a mut Vec<u8>) -> Range<'a> {
        *end_buf = prefix.to_vec();
        // The smallest key after every key with this prefix: strip trailing 0xff bytes and
        // increment the last one; an all-0xff prefix has no upper bound.
        while end_buf.last() == Some(&0xff) {
            end_buf.pop();
        }
        match end_buf.last_mut() {
            Some(b) => {
                *b += 1;
                Range {
                    start: Bound::Included(prefix),
                    end: Bound::Excluded(end_buf.as_slice()),
                }
            }
            None => Range {
                start: Bound::Included(prefix),
                end: Bound::Unbounded,
            },
        }
    }

    /// `[start, end)`.
    pub fn between(start: &'a [u8], end: &'a [u8]) -> Range<'a> {
        Range {
            start: Bound::Included(start),
            end: Bound::Excluded(end),
        }
    }
}

/// What a scan visitor says after each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Keep going.
    Continue,
    /// Stop the scan.
    Stop,
}

/// The callback a scan calls for each entry, in order; it may stop the scan.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<Visit> + 'a;

/// What [`Kv::get_each`] calls with each key's index and value (`None`: absent).
pub type ValueVisitor<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<()> + 'a;

/// An ordered byte key-value store with durable batch commits.
pub trait Kv: Send + Sync + std::fmt::Debug {
    /// `sled` or `lmdb`.
    fn backend(&self) -> Backend;
    /// Reads one key.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Reads several keys, as one snapshot where the backend has them (LMDB: one read
    /// transaction for all, where a `get` each opens one; recall reads a hundred records),
    /// handing each value to `visit` with the key's index, in order, without copying it
    /// where the backend can lend it.
    fn get_each(&self, keys: &[&[u8]], visit: &mut ValueVisitor<'_>) -> Result<()> {
        for (i, k) in keys.iter().enumerate() {
            visit(i, self.get(k)?.as_deref())?;
        }
        Ok(())
    }
    /// Visits the entries of `range` in key order (or reverse), until the visitor stops.
    fn scan(&self, range: Range<'_>, reverse: bool, visit: &mut Visitor<'_>) -> Result<()>;
    /// Applies every batch, each atomically, and returns only once all of them are durable
    /// on disk. Callers pass several batches at once to share one flush (group commit).
    fn commit(&self, batches: &[&[Op]]) -> Result<()>;
    /// Bytes the backend uses on disk.
    fn disk_bytes(&self) -> Result<u64>;
}

/// Which ordered-KV backend holds the store.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// LMDB through heed: copy-on-write B-tree, survives kill -9 (the default; see
    /// docs/storage.md).
    #[default]
    Lmdb,
    /// sled 0.34.
    Sled,
}

impl Backend {
    /// `lmdb` or `sled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Lmdb => "lmdb",
            Backend::Sled => "sled",
        }
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lmdb" => Ok(Backend::Lmdb),
            "sled" => Ok(Backend::Sled),
            other => Err(Error::invalid(
                "backend",
                format!("`{other}` is not a store backend; use `lmdb` or `sled`"),
            )),
        }
    }
}

/// What a returned commit survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Everything: a commit is on disk when it returns.
    #[default]
    Full,
    /// The process dying, not the machine: the store is a copy of a log that holds every
    /// write durably elsewhere (a cluster's partitions, whose writes JetStream acknowledged
    /// first). A crash of the machine may undo the last commits, never corrupt the rest;
    /// the copy reads them from the log again. LMDB then leaves its meta page to the next
    /// commit's flush (`MDB_NOMETASYNC`): one flush per commit instead of two. sled flushes
    /// every commit either way.
    Logged,
}

/// Opens the backend's files under `dir` (created when missing).
pub fn open(backend: Backend, dir: &Path, durability: Durability) -> Result<Box<dyn Kv>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    Ok(match backend {
        Backend::Lmdb => Box::new(LmdbKv::open_as(dir, durability)?),
        Backend::Sled => Box::new(SledKv::open(dir)?),
    })
}

/// Sums the sizes of the files under `dir` as allocated on disk (sparse files count what
/// they use, not their length).
pub fn dir_disk_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let meta = entry.metadata().map_err(|e| Error::io(entry.path(), e))?;
        if meta.is_dir() {
            total += dir_disk_bytes(&entry.path())?;
        } else {
            total += meta.blocks() * 512;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(kv: &dyn Kv) {
        let b1 = vec![
            Op::Put(b"a1".to_vec(), b"x".to_vec()),
            Op::Put(b"a2".to_vec(), b"y".to_vec()),
            Op::Put(b"b1".to_vec(), b"z".to_vec()),
        ];
        let b2 = vec![Op::Delete(b"a2".to_vec()), Op::Put(b"a3".to_vec(), vec![])];
        kv.commit(&[&b1, &b2]).unwrap();
        assert_eq!(kv.get(b"a1").unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(kv.get(b"a2").unwrap(), None);
        let mut end = Vec::new();
        let mut seen = Vec::new();
        kv.scan(Range::prefix(b"a", &mut end), true, &mut |k, _| {
            seen.push(k.to_vec());
            Ok(Visit::Continue)
        })
        .unwrap();
        assert_eq!(seen, vec![b"a3".to_vec(), b"a1".to_vec()]);
        let mut first = None;
        kv.scan(Range::between(b"a", b"c"), false, &mut |k, _| {
            first = Some(k.to_vec());
            Ok(Visit::Stop)
        })
        .unwrap();
        assert_eq!(first.as_deref(), Some(&b"a1"[..]));
        assert!(kv.disk_bytes().unwrap() > 0);
    }

    #[test]
    fn both_backends_behave_the_same() {
        for backend in [Backend::Lmdb, Backend::Sled] {
            for durability in [Durability::Full, Durability::Logged] {
                let dir = tempfile::tempdir().unwrap();
                let kv = open(backend, dir.path(), durability).unwrap();
                exercise(kv.as_ref());
            }
        }
    }

    #[test]
    fn prefix_range_handles_0xff() {
        let mut end = Vec::new();
        let r = Range::prefix(&[1, 0xff], &mut end);
        assert_eq!(r.end, Bound::Excluded(&[2u8][..]));
        let mut end = Vec::new();
        let r = Range::prefix(&[0xff], &mut end);
        assert_eq!(r.end, Bound::Unbounded);
    }
}

//! The seam a cluster puts under the store (docs/cluster.md): a [`CommitLog`] the commit
//! thread appends every commit group to *before* it commits the group locally, and a
//! [`Replica`] that applies such a log to another copy of the store.
//!
//! What is logged is the group's key-value operations as the commit thread encoded them:
//! records with the importance, time and strength already decided, counters, audit entries,
//! queues, the change log. So every mutation is in the log, not only events, and a replay
//! never recomputes anything (a model's answer, the wall clock): it writes the same bytes,
//! and a replica's store equals the owner's key for key. The derived indexes are not in the
//! log; each copy rebuilds them from its store's change log, as it does after a crash.
//!
//! Exactly once: each applied entry's log position is written in the same backend
//! transaction as the entry's operations (`meta::LOG_APPLIED`), by the owner and by every
//! replica, so a crash between the two is impossible and a replayed entry at or below that
//! position is skipped.

use std::path::Path;

use super::keys::{self, meta};
use super::kv::{self, Backend, Kv, Op};
use super::read_u64;
use crate::error::{Error, Result};

/// Where a store's commit groups go before they are committed locally. An implementation
/// appends an entry durably (a replicated log) and says at which position it landed.
pub trait CommitLog: Send + Sync + std::fmt::Debug {
    /// Appends `entry` (bytes from [`encode_entry`]) and returns its position once the log
    /// holds it durably. Called from the store's commit thread, which blocks meanwhile. An
    /// error means the group is answered with it and not committed locally; whether the
    /// entry is in the log is then unknown, so an implementation must refuse every later
    /// append until its owner has caught up with the log again.
    fn append(&self, entry: &[u8]) -> Result<u64>;

    /// The largest entry the log accepts, in bytes: a commit group is cut into entries of
    /// at most this size (a single write set is never cut).
    fn max_entry_bytes(&self) -> usize;

    /// The entry appended at `position` could not be committed locally (`error`): the
    /// local store is now behind its own log, so the implementation must refuse every
    /// later append until its owner has caught up with the log again.
    fn local_commit_failed(&self, position: u64, error: &Error);
}

/// One commit group's operations as a log entry.
pub fn encode_entry(ops: &[Op]) -> Vec<u8> {
    // Serialising a slice of an enum of byte vectors cannot fail.
    postcard::to_stdvec(ops).expect("operations serialise")
}

/// The operations of a log entry from [`encode_entry`].
pub fn decode_entry(entry: &[u8]) -> Result<Vec<Op>> {
    postcard::from_bytes(entry).map_err(|e| Error::Corrupt {
        key: "cluster log entry".into(),
        message: format!("not a commit group ({e}); was it written by another version?"),
    })
}

/// The bytes an operation adds to an entry, near enough to cut groups by.
pub(super) fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put(k, v) => k.len() + v.len() + 8,
        Op::Delete(k) => k.len() + 4,
    }
}

/// The operation recording that the log entry at `position` is applied.
pub(super) fn applied_op(position: u64) -> Op {
    Op::Put(
        keys::meta(meta::LOG_APPLIED),
        position.to_be_bytes().to_vec(),
    )
}

/// The position of the last log entry applied to the store under `kv` (0: none).
pub(super) fn applied(kv: &dyn Kv) -> Result<u64> {
    Ok(read_u64(kv, meta::LOG_APPLIED)?.unwrap_or(0))
}

/// A copy of a store kept by applying a log's entries: the warm standby of a cluster node.
/// It holds the backend's files open without the store's catalog, commit thread or
/// indexes; [`Replica::close`] hands the directory over to [`super::Store::open`] when the
/// node takes the store over.
#[derive(Debug)]
pub struct Replica {
    kv: Box<dyn Kv>,
    applied: u64,
}

impl Replica {
    /// Opens (or creates) the store files in `dir` as a replica.
    pub fn open(dir: &Path, backend: Backend) -> Result<Replica> {
        // Durable in the log it copies.
        let kv = kv::open(backend, dir, kv::Durability::Logged)?;
        let applied = applied(kv.as_ref())?;
        Ok(Replica { kv, applied })
    }

    /// The position of the last entry applied (0: none).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Applies the entry at `position`, with the position, in one transaction. An entry at
    /// or below the applied position was applied already and is skipped (`false`).
    pub fn apply(&mut self, position: u64, entry: &[u8]) -> Result<bool> {
        if position <= self.applied {
            return Ok(false);
        }
        let mut ops = decode_entry(entry)?;
        ops.push(applied_op(position));
        self.kv.commit(&[&ops])?;
        self.applied = position;
        Ok(true)
    }

    /// Applies consecutive entries (position, bytes) in one transaction, with the last
    /// position; those at or below the applied position are skipped. Returns how many
    /// were applied. A standby applies what arrived together this way: one flush for many.
    pub fn apply_all(&mut self, entries: &[(u64, &[u8])]) -> Result<usize> {
        let mut ops = Vec::new();
        let mut last = self.applied;
        let mut applied = 0;
        for (position, entry) in entries {
            if *position <= last {
                continue;
            }
            ops.extend(decode_entry(entry)?);
            last = *position;
            applied += 1;
        }
        if applied > 0 {
            ops.push(applied_op(last));
            self.kv.commit(&[&ops])?;
            self.applied = last;
        }
        Ok(applied)
    }

    /// Visits every key the log carries and its value, in key order — all but what each
    /// copy keeps for itself (`meta::NODE_LOCAL` and the change log): to compare copies.
    pub fn for_each_logged(&self, visit: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        let local: Vec<Vec<u8>> = meta::NODE_LOCAL
            .iter()
            .map(|name| keys::meta(name))
            .collect();
        let all = kv::Range {
            start: std::ops::Bound::Unbounded,
            end: std::ops::Bound::Unbounded,
        };
        self.kv.scan(all, false, &mut |k, v| {
            if k.first() != Some(&keys::family::CHANGE) && !local.iter().any(|l| l.as_slice() == k)
            {
                visit(k, v);
            }
            Ok(kv::Visit::Continue)
        })
    }

    /// Closes the files, so that the store can be opened on them.
    pub fn close(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_applied_once_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let ops = vec![
            Op::Put(vec![9, 1], b"one".to_vec()),
            Op::Put(vec![9, 2], b"two".to_vec()),
            Op::Delete(vec![9, 1]),
        ];
        let entry = encode_entry(&ops);
        assert_eq!(decode_entry(&entry).unwrap(), ops);
        let mut replica = Replica::open(dir.path(), Backend::Lmdb).unwrap();
        assert_eq!(replica.applied(), 0);
        assert!(replica.apply(3, &entry).unwrap());
        // The same entry again, or an older one, changes nothing.
        let later = encode_entry(&[Op::Put(vec![9, 1], b"again".to_vec())]);
        assert!(!replica.apply(3, &later).unwrap());
        assert!(!replica.apply(2, &later).unwrap());
        // Several at once: the ones already applied are skipped, the rest land together.
        let fourth = encode_entry(&[Op::Put(vec![9, 4], b"four".to_vec())]);
        let fifth = encode_entry(&[Op::Delete(vec![9, 4]), Op::Put(vec![9, 5], vec![])]);
        let batch = [(3, &later[..]), (4, &fourth[..]), (5, &fifth[..])];
        assert_eq!(replica.apply_all(&batch).unwrap(), 2);
        assert_eq!(replica.applied(), 5);
        assert_eq!(replica.kv.get(&[9, 4]).unwrap(), None);
        replica.close();
        let replica = Replica::open(dir.path(), Backend::Lmdb).unwrap();
        assert_eq!(replica.applied(), 5);
        assert_eq!(replica.kv.get(&[9, 1]).unwrap(), None);
        assert_eq!(
            replica.kv.get(&[9, 2]).unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert!(decode_entry(b"\xff\xff\xff").is_err());
    }
}

//! Every key the store writes, built by named constructors in this one module (as arroy's
//! `key.rs` does), private to the store: no other layer builds or parses key bytes. Keys
//! are big-endian so that prefix scans walk a session or a namespace in time order and
//! records in id order. The first byte names the family; strings (namespace, session) are
//! validated ids that never contain `0x00`, which ends them.

use crate::clock::Timestamp;
use crate::model::MemoryId;

/// Key families (first byte).
pub mod family {
    /// Store metadata: format version, dimension, counters.
    pub const META: u8 = 0x00;
    /// A record (without its embedding), by id.
    pub const RECORD: u8 = 0x01;
    /// A record's embedding, by id.
    pub const EMBEDDING: u8 = 0x02;
    /// Per-session listing: namespace, session, time, id.
    pub const SESSION_LIST: u8 = 0x03;
    /// Per-namespace listing: namespace, time, id.
    pub const NAMESPACE_LIST: u8 = 0x04;
    /// Per-session statistics.
    pub const SESSION_STATS: u8 = 0x05;
    /// Audit log: id, sequence.
    pub const AUDIT: u8 = 0x06;
    /// Durable work queues: queue, id.
    pub const QUEUE: u8 = 0x07;
    /// Index change log: sequence. Changes are logged with the writes that make them, but
    /// each copy of a store drops them once its own indexes built them, so which are still
    /// there differs between copies.
    pub const CHANGE: u8 = 0x08;
    /// Which namespace a purged record belonged to, so its audit log stays isolated.
    pub const TOMBSTONE: u8 = 0x09;
    /// A long record's passages (byte ranges and their embeddings), by id.
    pub const PASSAGES: u8 = 0x0a;
    /// What recall's reinforcements changed in a record, by id (`codec::Strength`).
    pub const STRENGTH: u8 = 0x0b;
}

/// Metadata key names.
pub mod meta {
    /// On-disk format version (u32 BE).
    pub const FORMAT_VERSION: &str = "format_version";
    /// Embedding dimension (u32 BE).
    pub const DIMENSION: &str = "dimension";
    /// Name of the embedder that made the stored embeddings.
    pub const EMBEDDER: &str = "embedder";
    /// Version of the text analyzer the keyword index was built with (u32 BE).
    pub const ANALYZER: &str = "analyzer";
    /// Next record id to hand out (u32 BE), so purged ids are never reused.
    pub const NEXT_ID: &str = "next_id";
    /// Next sequence number for the change log and the audit log (u64 BE).
    pub const NEXT_SEQ: &str = "next_seq";
    /// Next recall number to hand out (u32 BE). Recalls count apart from records, so a
    /// recall-heavy agent does not thin out the id ranges the vector index is sharded by.
    pub const NEXT_RECALL: &str = "next_recall";
    /// The change log has been truncated through this sequence (u64 BE): an index whose
    /// watermark is below it missed changes that can no longer be replayed.
    pub const CHANGES_TRUNCATED: &str = "changes_truncated";
    /// The position of the last cluster log entry applied to this store (u64 BE; see
    /// `store/log.rs`), written in the same transaction as the entry.
    pub const LOG_APPLIED: &str = "log_applied";
    /// The ids this store hands out (`store::IdBlock`: first and last, u32 BE each),
    /// recorded when a cluster partition's store first opens.
    pub const ID_BLOCK: &str = "id_block";

    /// The keys each copy of a store writes for itself, so never in a cluster's log: the
    /// format version, the embedder's dimension and name, the text analyzer the local
    /// keyword index was built with, how far the local indexes let the change log be
    /// truncated (with the change log itself: see [`family::CHANGE`]), and the id block
    /// (the same on every copy of a partition, written by each when it opens).
    pub const NODE_LOCAL: [&str; 6] = [
        FORMAT_VERSION,
        DIMENSION,
        EMBEDDER,
        ANALYZER,
        CHANGES_TRUNCATED,
        ID_BLOCK,
    ];
}

/// Timestamps are signed; flipping the sign bit makes their big-endian bytes sort in time
/// order across the epoch.
fn time_bytes(t: Timestamp) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// Inverse of [`time_bytes`].
pub fn time_from_bytes(b: [u8; 8]) -> Timestamp {
    (u64::from_be_bytes(b) ^ (1 << 63)) as i64
}

/// A metadata key.
pub fn meta(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(family::META);
    k.extend_from_slice(name.as_bytes());
    k
}

/// A record key.
pub fn record(id: MemoryId) -> [u8; 5] {
    id_key(family::RECORD, id)
}

/// An embedding key.
pub fn embedding(id: MemoryId) -> [u8; 5] {
    id_key(family::EMBEDDING, id)
}

/// A long record's passages.
pub fn passages(id: MemoryId) -> [u8; 5] {
    id_key(family::PASSAGES, id)
}

fn id_key(family: u8, id: MemoryId) -> [u8; 5] {
    let mut k = [family; 5];
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// The id in a record, embedding or listing key (its last four bytes).
pub fn id_from_key(key: &[u8]) -> Option<MemoryId> {
    let tail: [u8; 4] = key.get(key.len().checked_sub(4)?..)?.try_into().ok()?;
    Some(MemoryId(u32::from_be_bytes(tail)))
}

/// A record's reinforced strength, when a recall reinforced it since it was last written.
pub fn strength(id: MemoryId) -> [u8; 5] {
    id_key(family::STRENGTH, id)
}

/// A purged record's tombstone.
pub fn tombstone(id: MemoryId) -> [u8; 5] {
    id_key(family::TOMBSTONE, id)
}

/// The prefix of one session's listing.
pub fn session_prefix(namespace: &str, session: &str) -> Vec<u8> {
    // Room for an entry's time and id (`session_entry`).
    per_session(family::SESSION_LIST, namespace, session, 12)
}

/// `tag namespace 0 session 0`, with room for `tail` more bytes: the prefix of a table kept
/// per session.
fn per_session(tag: u8, namespace: &str, session: &str, tail: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + namespace.len() + session.len() + tail);
    k.push(tag);
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k.extend_from_slice(session.as_bytes());
    k.push(0);
    k
}

/// Families of the typed tables the layers above keep in the store (`families.rs`).
pub mod layer {
    /// Per session: the largest episodic record id a condensation has covered.
    pub const CONDENSED_UPTO: u8 = 0x10;
    /// Runtime-clock time of the last decay sweep.
    pub const DECAY: u8 = 0x11;
    /// Per recall: what it returned, so feedback can name the recall.
    pub const RECALL: u8 = 0x12;
    /// Knowledge-graph edges, per namespace.
    pub const GRAPH_EDGE: u8 = 0x13;
    /// Per condensed record: the knowledge record it was promoted (or merged) into.
    pub const PROMOTED: u8 = 0x14;
    /// Per record: how many times processing it made an actor fail, and the last error.
    pub const STRIKES: u8 = 0x15;
    /// Per quarantined record or input: why it was set aside.
    pub const QUARANTINE: u8 = 0x16;
    /// Per namespace and idempotency key: the write it made (see `families::Idempotent`).
    pub const IDEMPOTENT: u8 = 0x17;
    /// The same keys by the time they were written, so expired ones are found in order.
    pub const IDEMPOTENT_BY_TIME: u8 = 0x18;
    /// Per recall and feedback: how a recall's feedback said it went (one entry each time).
    pub const RECALL_OUTCOME: u8 = 0x19;
    /// Per record: whether it still holds (superseded, in conflict, a repeat); see
    /// `families::Validity`.
    pub const VALIDITY: u8 = 0x1a;
    /// Per session of the records reinforced: what each recall's reinforcement did to
    /// them, in commit order (see `families::Reinforcements`).
    pub const REINFORCED: u8 = 0x1b;
    /// Per purged record: its session, so its reinforcements are still found in that
    /// session's log after the record is gone.
    pub const PURGED_SESSION: u8 = 0x1c;
}

/// A namespace's idempotency key (keys are visible ASCII, never `0x00`).
pub fn idempotent(namespace: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + namespace.len() + key.len());
    k.push(layer::IDEMPOTENT);
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The time-ordered entry of an idempotency key written at `at`.
pub fn idempotent_by_time(at: Timestamp, namespace: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + namespace.len() + key.len());
    k.push(layer::IDEMPOTENT_BY_TIME);
    k.extend_from_slice(&time_bytes(at));
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The first time-ordered idempotency entry written at or after `at`.
pub fn idempotent_by_time_from(at: Timestamp) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(layer::IDEMPOTENT_BY_TIME);
    k.extend_from_slice(&time_bytes(at));
    k
}

/// The namespace and key of a time-ordered idempotency entry.
pub fn idempotent_by_time_parts(entry: &[u8]) -> Option<(&str, &str)> {
    let rest = entry.get(9..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    let namespace = std::str::from_utf8(&rest[..end]).ok()?;
    let key = std::str::from_utf8(&rest[end + 1..]).ok()?;
    Some((namespace, key))
}

/// A record's strike count (see `families::Strikes`).
pub fn strikes(id: MemoryId) -> [u8; 5] {
    let mut k = [layer::STRIKES, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// A record's validity (see `families::Validity`).
pub fn validity(id: MemoryId) -> [u8; 5] {
    let mut k = [layer::VALIDITY, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// A quarantine entry, by the id of the record or of the rejected input.
pub fn quarantine(id: MemoryId) -> [u8; 5] {
    let mut k = [layer::QUARANTINE, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// All knowledge-graph edges of a namespace start with this.
pub fn graph_edge_prefix(namespace: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + namespace.len());
    k.push(layer::GRAPH_EDGE);
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k
}

/// One edge: `from` —`relation`→ `to`.
pub fn graph_edge(namespace: &str, from: MemoryId, relation: u8, to: MemoryId) -> Vec<u8> {
    let mut k = graph_edge_prefix(namespace);
    k.extend_from_slice(&from.0.to_be_bytes());
    k.push(relation);
    k.extend_from_slice(&to.0.to_be_bytes());
    k
}

/// Splits an edge key into (from, relation, to).
pub fn graph_edge_parts(key: &[u8]) -> Option<(MemoryId, u8, MemoryId)> {
    let tail = key.get(key.len().checked_sub(9)?..)?;
    let from = u32::from_be_bytes(tail[0..4].try_into().ok()?);
    let to = u32::from_be_bytes(tail[5..9].try_into().ok()?);
    Some((MemoryId(from), tail[4], MemoryId(to)))
}

/// Which knowledge record a condensed record went into.
pub fn promoted(id: MemoryId) -> [u8; 5] {
    let mut k = [layer::PROMOTED, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// What a recall returned (its id is a number from the record id sequence).
pub fn recall(id: u32) -> [u8; 5] {
    let mut k = [layer::RECALL, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// One piece of feedback on recall `n` (`seq` from the shared sequence keeps each apart).
pub fn recall_outcome(n: u32, seq: u64) -> [u8; 13] {
    let mut k = [0; 13];
    k[0] = layer::RECALL_OUTCOME;
    k[1..5].copy_from_slice(&n.to_be_bytes());
    k[5..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The recall number of a [`recall_outcome`] key.
pub fn recall_outcome_number(key: &[u8]) -> Option<u32> {
    key.get(1..5)?.try_into().ok().map(u32::from_be_bytes)
}

/// When the last decay sweep ran (runtime clock).
pub fn last_decay_sweep() -> Vec<u8> {
    vec![layer::DECAY, b'l', b'a', b's', b't']
}

/// Where a session's condensation stands: the largest record id already condensed.
pub fn condensed_upto(namespace: &str, session: &str) -> Vec<u8> {
    let mut k = session_prefix(namespace, session);
    k[0] = layer::CONDENSED_UPTO;
    k
}

/// A session listing entry: sorts by event time, then id.
pub fn session_entry(namespace: &str, session: &str, time: Timestamp, id: MemoryId) -> Vec<u8> {
    let mut k = session_prefix(namespace, session);
    k.extend_from_slice(&time_bytes(time));
    k.extend_from_slice(&id.0.to_be_bytes());
    k
}

/// The prefix of one namespace's listing.
pub fn namespace_prefix(namespace: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + namespace.len());
    k.push(family::NAMESPACE_LIST);
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k
}

/// A namespace listing entry.
pub fn namespace_entry(namespace: &str, time: Timestamp, id: MemoryId) -> Vec<u8> {
    let mut k = namespace_prefix(namespace);
    k.extend_from_slice(&time_bytes(time));
    k.extend_from_slice(&id.0.to_be_bytes());
    k
}

/// A listing key bound at `time` (inclusive lower bound when used as a start).
pub fn listing_at(prefix: &[u8], time: Timestamp) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&time_bytes(time));
    k
}

/// The time and id at the end of a listing entry.
pub fn listing_time_id(key: &[u8]) -> Option<(Timestamp, MemoryId)> {
    let n = key.len().checked_sub(12)?;
    let t: [u8; 8] = key[n..n + 8].try_into().ok()?;
    Some((time_from_bytes(t), id_from_key(key)?))
}

/// Prefix of every session-stats key of a namespace.
pub fn session_stats_prefix(namespace: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + namespace.len());
    k.push(family::SESSION_STATS);
    k.extend_from_slice(namespace.as_bytes());
    k.push(0);
    k
}

/// A session's statistics key.
pub fn session_stats(namespace: &str, session: &str) -> Vec<u8> {
    let mut k = session_stats_prefix(namespace);
    k.extend_from_slice(session.as_bytes());
    k
}

/// The prefix of one record's audit log.
pub fn audit_prefix(id: MemoryId) -> [u8; 5] {
    id_key(family::AUDIT, id)
}

/// One audit entry: record id, then a global sequence so entries keep their order.
pub fn audit(id: MemoryId, seq: u64) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[..5].copy_from_slice(&audit_prefix(id));
    k[5..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The prefix of one session's reinforcement log.
pub fn reinforced_prefix(namespace: &str, session: &str) -> Vec<u8> {
    per_session(layer::REINFORCED, namespace, session, 8)
}

/// One entry of a session's reinforcement log: the session, then the global sequence, so
/// a session's entries sit together and each new one goes after the last.
pub fn reinforced(namespace: &str, session: &str, seq: u64) -> Vec<u8> {
    let mut k = reinforced_prefix(namespace, session);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The sequence number that ends an audit or reinforcement-log key.
pub fn trailing_seq(key: &[u8]) -> Option<u64> {
    let at = key.len().checked_sub(8)?;
    Some(u64::from_be_bytes(key[at..].try_into().ok()?))
}

/// A purged record's session (see [`layer::PURGED_SESSION`]).
pub fn purged_session(id: MemoryId) -> [u8; 5] {
    id_key(layer::PURGED_SESSION, id)
}

/// The prefix of one work queue.
pub fn queue_prefix(queue: u8) -> [u8; 2] {
    [family::QUEUE, queue]
}

/// A work-queue item: one per record and queue.
pub fn queue_item(queue: u8, id: MemoryId) -> [u8; 6] {
    let mut k = [0u8; 6];
    k[..2].copy_from_slice(&queue_prefix(queue));
    k[2..].copy_from_slice(&id.0.to_be_bytes());
    k
}

/// A change-log entry.
pub fn change(seq: u64) -> [u8; 9] {
    let mut k = [family::CHANGE; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The sequence number of a change-log key.
pub fn change_seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(1..9)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_keys_sort_by_time_across_the_epoch() {
        let a = session_entry("ns", "s", -5, MemoryId(9));
        let b = session_entry("ns", "s", 0, MemoryId(1));
        let c = session_entry("ns", "s", 7, MemoryId(0));
        assert!(a < b && b < c);
        assert_eq!(listing_time_id(&a), Some((-5, MemoryId(9))));
        assert!(a.starts_with(&session_prefix("ns", "s")));
        // A session whose name extends another's never shares its prefix.
        assert!(!session_entry("ns", "s2", 0, MemoryId(0)).starts_with(&session_prefix("ns", "s")));
    }

    #[test]
    fn ids_and_sequences_round_trip() {
        assert_eq!(id_from_key(&record(MemoryId(77))), Some(MemoryId(77)));
        assert_eq!(change_seq(&change(1 << 40)), Some(1 << 40));
        assert!(record(MemoryId(1)) < record(MemoryId(256)));
        assert!(audit(MemoryId(1), 5).starts_with(&audit_prefix(MemoryId(1))));
        assert_eq!(trailing_seq(&audit(MemoryId(1), 5)), Some(5));
        let entry = reinforced("ns", "s", 1 << 40);
        assert!(entry.starts_with(&reinforced_prefix("ns", "s")));
        assert!(!reinforced("ns", "s2", 0).starts_with(&reinforced_prefix("ns", "s")));
        assert_eq!(trailing_seq(&entry), Some(1 << 40));
        assert!(reinforced("ns", "s", 9) < reinforced("ns", "s", 256));
    }
}

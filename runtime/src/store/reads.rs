//! Reading records: one, many (light, deferred, by owner), their passages, embeddings and
//! history, whole-store scans, and the catalog's answers (candidates by filter, counts by
//! tier and status, namespaces).

use super::catalog::{Catalog, Census, Filter};
use super::codec::{self, RawJson};
use super::keys::{self, family};
use super::kv::{Range, Visit, Visitor};
use super::*;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{AuditEntry, MemoryId, MemoryRecord, Passage, Status, Tier};

impl Store {
    /// Reads one record with its embedding.
    pub fn get(&self, id: MemoryId) -> Result<Option<MemoryRecord>> {
        Ok(self.get_many(&[id])?.pop().flatten())
    }

    /// Reads one record without its embedding (cheaper; for listings and rendering).
    pub fn get_light(&self, id: MemoryId) -> Result<Option<MemoryRecord>> {
        Ok(self.get_many_with(&[id], false)?.pop().flatten())
    }

    /// Reads a record only if it lives in `namespace`: namespace isolation is enforced here,
    /// so no caller can read across tenants by guessing an id.
    pub fn get_in(&self, namespace: &str, id: MemoryId) -> Result<MemoryRecord> {
        match self.get(id)? {
            Some(r) if r.namespace == namespace => Ok(r),
            _ => Err(Error::NotFound {
                what: "memory",
                id: id.to_string(),
            }),
        }
    }

    /// Several records with their embeddings, as [`get`](Self::get) reads each, in one
    /// snapshot of the backend (LMDB: one read transaction, values decoded in place). sled
    /// has no read snapshots: there a record and its reinforced strength are two reads, and
    /// a write that folds the strength into the record between them can leave the read a
    /// reinforcement behind (one more reason LMDB is the default).
    pub fn get_many(&self, ids: &[MemoryId]) -> Result<Vec<Option<MemoryRecord>>> {
        self.get_many_with(ids, true)
    }

    /// [`get_many`](Self::get_many), with the embeddings or without them (`embeddings`
    /// false: [`get_light`](Self::get_light) of each, in one snapshot).
    pub fn get_many_with(
        &self,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<Option<MemoryRecord>>> {
        self.get_many_deferred(ids, embeddings)?
            .into_iter()
            .map(|read| {
                read.map(|(mut r, json)| {
                    json.fill(&mut r)?;
                    Ok(r)
                })
                .transpose()
            })
            .collect()
    }

    /// [`get_many_with`](Self::get_many_with), each record's `content` and `metadata` left
    /// as JSON text ([`RawJson::fill`] parses them): recall reads many candidates and
    /// returns a few, and parsing JSON it never returns would cost it for nothing.
    pub fn get_many_deferred(
        &self,
        ids: &[MemoryId],
        embeddings: bool,
    ) -> Result<Vec<Option<(MemoryRecord, RawJson)>>> {
        let per = if embeddings { 3 } else { 2 };
        let keys: Vec<[[u8; 5]; 3]> = ids
            .iter()
            .map(|&id| [keys::record(id), keys::strength(id), keys::embedding(id)])
            .collect();
        let flat: Vec<&[u8]> = keys
            .iter()
            .flat_map(|k| &k[..per])
            .map(|k| &k[..])
            .collect();
        let mut out: Vec<Option<(MemoryRecord, RawJson)>> = Vec::with_capacity(ids.len());
        // Each id's record comes first, then its reinforced strength (laid over it), then
        // (when asked for) its embedding.
        self.inner.kv.get_each(&flat, &mut |i, value| {
            let (n, key) = (i / per, flat[i]);
            match (i % per, value) {
                (0, Some(bytes)) => out.push(Some(codec::decode_deferred(ids[n], key, bytes)?)),
                (0, None) => out.push(None),
                (1, Some(bytes)) => {
                    if let Some(Some((r, _))) = out.last_mut() {
                        codec::Strength::decode_over(key, bytes, r)?;
                    }
                }
                (_, Some(bytes)) => {
                    if let Some(Some((r, _))) = out.last_mut() {
                        r.embedding = Some(codec::decode_embedding(key, bytes)?);
                    }
                }
                (_, None) => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Where each of `ids` sits: its namespace, session and event time (`None` for a
    /// record that is gone), read from the headers alone, in one snapshot.
    pub fn places(&self, ids: &[MemoryId]) -> Result<Vec<Option<(String, String, Timestamp)>>> {
        let keys: Vec<[u8; 5]> = ids.iter().map(|&id| keys::record(id)).collect();
        let flat: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let mut out = Vec::with_capacity(ids.len());
        self.inner.kv.get_each(&flat, &mut |i, value| {
            out.push(
                value
                    .map(|bytes| {
                        let h = codec::decode_header(flat[i], bytes)?;
                        Ok::<_, Error>((h.namespace, h.session_id, h.event_time))
                    })
                    .transpose()?,
            );
            Ok(())
        })?;
        Ok(out)
    }

    /// The namespace a record belongs to — or belonged to, if it was purged.
    pub fn owner(&self, id: MemoryId) -> Result<Option<String>> {
        if let Some(bytes) = self.inner.kv.get(&keys::record(id))? {
            return Ok(Some(
                codec::decode_header(&keys::record(id), &bytes)?.namespace,
            ));
        }
        Ok(self
            .inner
            .kv
            .get(&keys::tombstone(id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// A long record's passages with their embeddings (empty when it has none: a text that
    /// is not long, or one not embedded yet).
    pub fn passages(&self, id: MemoryId) -> Result<Vec<Passage>> {
        let key = keys::passages(id);
        match self.inner.kv.get(&key)? {
            Some(bytes) => codec::decode(&key, &bytes),
            None => Ok(Vec::new()),
        }
    }

    /// A record's embedding, if it has one.
    pub fn embedding(&self, id: MemoryId) -> Result<Option<Vec<f32>>> {
        let key = keys::embedding(id);
        match self.inner.kv.get(&key)? {
            Some(bytes) => codec::decode_embedding(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// A record's audit log, oldest first. It outlives the record: purges are audited.
    ///
    /// Recall's reinforcements are kept in the log of the record's session (one entry per
    /// recall, see [`families::Reinforcements`]); they are merged in here by sequence, so
    /// the history reads as one log. Reading it scans that session's reinforcement log.
    pub fn history(&self, id: MemoryId) -> Result<Vec<AuditEntry>> {
        let mut out = self.own_audit(id)?;
        let home = match self.inner.kv.get(&keys::record(id))? {
            Some(bytes) => {
                let h = codec::decode_header(&keys::record(id), &bytes)?;
                Some((h.namespace, h.session_id))
            }
            None => match (self.tombstone(id)?, self.purged_session(id)?) {
                (Some(namespace), Some(session)) => Some((namespace, session)),
                _ => None,
            },
        };
        if let Some((namespace, session)) = home {
            let reinforced = self.reinforcements_of(&namespace, &session, id)?;
            if !reinforced.is_empty() {
                out.extend(reinforced);
                // Both parts are in sequence order already; a stable sort merges them.
                out.sort_by_key(|(seq, _)| *seq);
            }
        }
        Ok(out.into_iter().map(|(_, entry)| entry).collect())
    }

    /// A record's own audit entries, oldest first: its [`history`](Self::history) without
    /// recall's reinforcements, read without scanning its session's reinforcement log (for
    /// checks that look for an action a person or a rule took).
    pub fn audit_entries(&self, id: MemoryId) -> Result<Vec<AuditEntry>> {
        Ok(self
            .own_audit(id)?
            .into_iter()
            .map(|(_, entry)| entry)
            .collect())
    }

    /// The entries kept under the record, with their sequence numbers.
    pub(super) fn own_audit(&self, id: MemoryId) -> Result<Vec<(u64, AuditEntry)>> {
        let prefix = keys::audit_prefix(id);
        let mut end = Vec::new();
        let mut out = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(&prefix, &mut end), false, &mut |k, v| {
                out.push((keys::trailing_seq(k).unwrap_or(0), codec::decode(k, v)?));
                Ok(Visit::Continue)
            })?;
        Ok(out)
    }

    /// Visits every record id in id order (for rebuilds and exports).
    pub fn for_each_id(&self, mut f: impl FnMut(MemoryId) -> Result<Visit>) -> Result<()> {
        let prefix = [family::RECORD];
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(
                Range::prefix(&prefix, &mut end),
                false,
                &mut |k, _| match keys::id_from_key(k) {
                    Some(id) => f(id),
                    None => Ok(Visit::Continue),
                },
            )
    }

    /// Visits every stored embedding in id order.
    pub fn for_each_embedding(
        &self,
        mut f: impl FnMut(MemoryId, Vec<f32>) -> Result<Visit>,
    ) -> Result<()> {
        let prefix = [family::EMBEDDING];
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(
                Range::prefix(&prefix, &mut end),
                false,
                &mut |k, v| match keys::id_from_key(k) {
                    Some(id) => f(id, codec::decode_embedding(k, v)?),
                    None => Ok(Visit::Continue),
                },
            )
    }

    /// Scans the keys under `prefix`.
    pub(super) fn scan_prefix(&self, prefix: &[u8], visit: &mut Visitor<'_>) -> Result<()> {
        let mut end = Vec::new();
        self.inner
            .kv
            .scan(Range::prefix(prefix, &mut end), false, visit)
    }

    pub(super) fn catalog(&self) -> std::sync::RwLockReadGuard<'_, Catalog> {
        self.inner.catalog.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The ids a query may see (see [`Filter`]).
    pub fn candidates(&self, filter: &Filter<'_>) -> roaring::RoaringBitmap {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .candidates(filter)
    }

    /// Which of `ids` a newer record superseded.
    pub fn superseded(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().superseded() & ids
    }

    /// How many graph edges that may be `namespace`'s were written or deleted since open:
    /// that namespace's graph loaded at another count may be stale, and no other's is.
    pub fn edge_changes_in(&self, namespace: &str) -> u64 {
        self.catalog().edge_changes_in(namespace)
    }

    /// Which of `ids` are in an open conflict.
    pub fn conflicted(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().conflicted() & ids
    }

    /// Which of `ids` have stored passages (long records, once embedded).
    pub fn with_passages(&self, ids: &roaring::RoaringBitmap) -> roaring::RoaringBitmap {
        self.catalog().with_passages() & ids
    }

    /// Records of one tier.
    pub fn tier_len(&self, tier: Tier) -> u64 {
        self.catalog().tier_len(tier)
    }

    /// Archived records (soft-deleted or faded; kept for history until purged).
    pub fn archived_len(&self) -> u64 {
        self.catalog().archived_len()
    }

    /// One namespace's records by tier and status, and its sessions (from the catalog, no
    /// record read).
    pub fn census(&self, namespace: &str) -> Census {
        self.catalog().census(namespace)
    }

    /// The sessions of one namespace with at least one record, in no order (from the
    /// catalog).
    pub fn sessions_with_records(&self, namespace: &str) -> Vec<String> {
        self.catalog().sessions_with_records(namespace)
    }

    /// One namespace's records in `status`.
    pub fn with_status(&self, namespace: &str, status: Status) -> roaring::RoaringBitmap {
        self.catalog().with_status(namespace, status)
    }

    /// Number of records in the store.
    pub fn len(&self) -> u64 {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every namespace with records.
    pub fn namespaces(&self) -> Vec<String> {
        self.inner
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .namespaces()
    }
}

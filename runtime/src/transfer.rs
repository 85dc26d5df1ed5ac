//! Export and import: a whole store as JSON lines, one record per line ([`Exported`]), of
//! every tier and status, with what it takes to restore it exactly — the record itself (id,
//! sources, status, strength, utility, timestamps, metadata, embedding), its audit history,
//! its knowledge-graph links, the knowledge record it was promoted into, and the work
//! queues it waits on. Exporting, importing into an empty store and exporting again gives
//! the same bytes: lines come in id order, and import keeps every id and writes nothing of
//! its own (no extra audit entry).
//!
//! Import goes through the store's ordinary commit path ([`Mutation::Insert`]), so the
//! catalog, the listings, the session statistics and the change log follow as for any new
//! record, and the vector and keyword indexes pick the records up from the change log. It
//! must never overwrite a record: an id already in the store is skipped when it is the same
//! record (a re-run after an interrupted import) and refused when it is another one.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::keys;
use crate::knowledge::Relation;
use crate::kv::Visit;
use crate::model::{AuditEntry, MemoryId, MemoryRecord, Tier, validate_embedding, validate_id};
use crate::store::{Filter, Mutation, Queue, Store, WriteSet};
use crate::substrate::Substrate;

/// The version of the line format this build writes and reads.
pub const FORMAT: u32 = 1;

/// Records written in one commit by [`Importer`]: large enough that fsyncs do not dominate,
/// small enough that an interrupted import redoes little.
const BATCH: usize = 512;

/// A work queue a record waits on, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// Waiting for its embedding.
    Enrich,
    /// Waiting for the LLM judge's importance.
    Evaluate,
    /// Waiting for condensation.
    Condense,
}

impl Waiting {
    const ALL: [Waiting; 3] = [Waiting::Enrich, Waiting::Evaluate, Waiting::Condense];

    fn queue(self) -> Queue {
        match self {
            Waiting::Enrich => Queue::Enrich,
            Waiting::Evaluate => Queue::Evaluate,
            Waiting::Condense => Queue::Condense,
        }
    }
}

/// A knowledge-graph edge that starts at the exported record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// What the edge means.
    pub relation: Relation,
    /// Where it ends.
    pub to: MemoryId,
}

/// One line of an export: a record and everything attached to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exported {
    /// [`FORMAT`] of the build that wrote the line.
    pub format: u32,
    /// The record, with its embedding when it has one.
    pub record: MemoryRecord,
    /// Its audit log, oldest first.
    #[serde(default)]
    pub history: Vec<AuditEntry>,
    /// Knowledge-graph edges from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
    /// The knowledge record a condensed record was promoted (or merged) into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_into: Option<MemoryId>,
    /// The work queues it waits on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
}

/// What [`Importer::add`] did with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written (durable after the next [`Importer::flush`]).
    Imported,
    /// The store already holds this record under this id: left alone.
    AlreadyPresent,
}

/// The ids an export visits, in id order: every record, or one namespace's.
pub fn export_ids(store: &Store, namespace: Option<&str>) -> Result<Vec<MemoryId>> {
    if let Some(ns) = namespace {
        return Ok(store
            .candidates(&Filter {
                namespace: ns,
                ..Filter::default()
            })
            .into_iter()
            .map(MemoryId)
            .collect());
    }
    let mut ids = Vec::with_capacity(store.len() as usize);
    store.for_each_id(|id| {
        ids.push(id);
        Ok(Visit::Continue)
    })?;
    Ok(ids)
}

/// One record's export line; `None` when it no longer exists.
pub fn export_record(store: &Store, id: MemoryId) -> Result<Option<Exported>> {
    let Some(record) = store.get(id)? else {
        return Ok(None);
    };
    let history = store.history(id)?;
    // An edge key is the namespace's prefix, `from`, the relation byte and `to`: the
    // prefix plus `from` selects exactly this record's outgoing edges.
    let mut prefix = keys::graph_edge_prefix(&record.namespace);
    prefix.extend_from_slice(&id.0.to_be_bytes());
    let mut links = Vec::new();
    store.scan_raw(&prefix, &mut |k, _| {
        if let Some((from, rel, to)) = keys::graph_edge_parts(k)
            && from == id
        {
            let relation = relation_of(rel).ok_or_else(|| Error::Corrupt {
                key: format!("{k:02x?}"),
                message: format!("unknown knowledge-graph relation {rel}"),
            })?;
            links.push(Link { relation, to });
        }
        Ok(Visit::Continue)
    })?;
    let promoted_into = match store.get_raw(&keys::promoted(id))? {
        Some(v) => Some(MemoryId(u32::from_be_bytes(
            v.as_slice().try_into().map_err(|_| Error::Corrupt {
                key: format!("promoted {id}"),
                message: format!("expected 4 bytes, found {}", v.len()),
            })?,
        ))),
        None => None,
    };
    let mut waiting = Vec::new();
    for w in Waiting::ALL {
        if store.is_queued(w.queue(), id)? {
            waiting.push(w);
        }
    }
    Ok(Some(Exported {
        format: FORMAT,
        record,
        history,
        links,
        promoted_into,
        waiting,
    }))
}

fn relation_of(b: u8) -> Option<Relation> {
    [
        Relation::DerivedFrom,
        Relation::SimilarTo,
        Relation::Supersedes,
        Relation::Contradicts,
    ]
    .into_iter()
    .find(|r| *r as u8 == b)
}

/// Reads one line of an export. Errors say which field is wrong; the caller adds the line
/// number.
pub fn parse_line(text: &str) -> Result<Exported> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Error::invalid(
            "line",
            format!("is not JSON ({e}); every line must be one JSON object as written by `shadowbrain export`"),
        )
    })?;
    match value.get("format").map(Value::as_u64) {
        Some(Some(n)) if n == u64::from(FORMAT) => {}
        Some(Some(n)) => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is {n}, but this build reads format {FORMAT}; import with the shadowbrain \
                     version that exported the file, or a newer one"
                ),
            ));
        }
        _ => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is missing; lines written by `shadowbrain export` start with \
                     {{\"format\":{FORMAT},\"record\":{{…}}"
                ),
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| {
        Error::invalid(
            "line",
            format!("{e}; fields and their types are those `shadowbrain export` writes"),
        )
    })
}

/// Writes exported lines into a substrate, in batches. Call [`Importer::flush`] at the
/// end (and before giving up on a bad line: what was added before it is then durable).
#[derive(Debug)]
pub struct Importer {
    sub: Substrate,
    writes: WriteSet,
    /// Ids added since the last flush (not yet in the store).
    pending_ids: HashSet<MemoryId>,
    highest: Option<MemoryId>,
    queued: bool,
    /// Per session: the largest source id its condensed records cover (see
    /// `keys::condensed_upto`), so the condenser does not condense imported events again.
    condensed_upto: HashMap<Vec<u8>, u32>,
}

impl Importer {
    /// An importer into `sub`.
    pub fn new(sub: &Substrate) -> Importer {
        Importer {
            sub: sub.clone(),
            writes: WriteSet::new(),
            pending_ids: HashSet::new(),
            highest: None,
            queued: false,
            condensed_upto: HashMap::new(),
        }
    }

    /// Checks a line and queues its writes; commits a batch when one is full. Nothing of a
    /// line that fails its checks is written.
    pub fn add(&mut self, line: Exported) -> Result<Outcome> {
        self.check(&line)?;
        let id = line.record.id;
        if self.pending_ids.contains(&id) {
            // The same id twice in one file: decide against the first once it is stored.
            self.flush()?;
        }
        if let Some(existing) = self.sub.store().get_light(id)? {
            return if same_record(&existing, &line.record) {
                Ok(Outcome::AlreadyPresent)
            } else {
                Err(Error::invalid(
                    "record.id",
                    format!(
                        "{id} is already used in this data directory by another record \
                         (namespace `{}`, session `{}`, {} {}); import into an empty data \
                         directory, or remove the line",
                        existing.namespace,
                        existing.session_id,
                        existing.tier.as_str(),
                        existing.kind
                    ),
                ))
            };
        }
        self.push(line)?;
        if self.pending_ids.len() >= BATCH {
            self.flush()?;
        }
        Ok(Outcome::Imported)
    }

    fn check(&self, line: &Exported) -> Result<()> {
        if line.format != FORMAT {
            return Err(Error::invalid(
                "format",
                format!("is {}, but this build reads format {FORMAT}", line.format),
            ));
        }
        let r = &line.record;
        validate_id("record.namespace", &r.namespace)?;
        validate_id("record.session_id", &r.session_id)?;
        if let Some(a) = &r.agent_id {
            validate_id("record.agent_id", a)?;
        }
        if r.text.trim().is_empty() {
            return Err(Error::invalid(
                "record.text",
                "is empty; every record needs the text it is recalled by",
            ));
        }
        if !(r.importance.is_finite() && (0.0..=10.0).contains(&r.importance)) {
            return Err(Error::invalid(
                "record.importance",
                format!(
                    "{} is out of range; it must be a number from 0 to 10",
                    r.importance
                ),
            ));
        }
        if !(r.strength.is_finite() && r.strength >= 0.0) {
            return Err(Error::invalid(
                "record.strength",
                format!(
                    "{} is not a strength; it must be a finite number ≥ 0",
                    r.strength
                ),
            ));
        }
        if let Some(e) = &r.embedding {
            let dims = self.sub.embedder().dimensions();
            validate_embedding(e, Some(dims)).map_err(|err| match err {
                Error::DimensionMismatch { got, expected } => Error::invalid(
                    "record.embedding",
                    format!(
                        "has {got} dimensions but this data directory's embedder (`{}`) makes \
                         {expected}; import with the `--config` whose [embedder] made the \
                         export, then `shadowbrain reindex` to change embedders",
                        self.sub.embedder().name()
                    ),
                ),
                Error::Invalid { reason, .. } => Error::invalid("record.embedding", reason),
                other => other,
            })?;
        }
        Ok(())
    }

    fn push(&mut self, line: Exported) -> Result<()> {
        let Exported {
            record,
            history,
            links,
            promoted_into,
            mut waiting,
            ..
        } = line;
        let id = record.id;
        // A record without its embedding waits for the enricher, like any new record.
        if record.embedding.is_none() && !waiting.contains(&Waiting::Enrich) {
            waiting.push(Waiting::Enrich);
        }
        for entry in history {
            self.writes.push(Mutation::Audit(id, entry));
        }
        for link in links {
            self.writes.push(Mutation::PutRaw(
                keys::graph_edge(&record.namespace, id, link.relation as u8, link.to),
                Vec::new(),
            ));
        }
        if let Some(k) = promoted_into {
            self.writes.push(Mutation::PutRaw(
                keys::promoted(id).to_vec(),
                k.0.to_be_bytes().to_vec(),
            ));
        }
        for w in waiting {
            self.queued |= w == Waiting::Enrich;
            self.writes.push(Mutation::Enqueue(w.queue(), id));
        }
        if record.tier == Tier::Condensed
            && let Some(upto) = record.sources.iter().map(|s| s.0).max()
        {
            let key = keys::condensed_upto(&record.namespace, &record.session_id);
            let current = match self.condensed_upto.get(&key) {
                Some(v) => Some(*v),
                None => self
                    .sub
                    .store()
                    .get_raw(&key)?
                    .and_then(|v| v.as_slice().try_into().ok().map(u32::from_be_bytes)),
            };
            if current.is_none_or(|c| c < upto) {
                self.condensed_upto.insert(key, upto);
            }
        }
        self.highest = self.highest.max(Some(id));
        self.pending_ids.insert(id);
        self.writes.push(Mutation::Insert(Box::new(record)));
        Ok(())
    }

    /// Commits what was added since the last flush and returns once it is durable; the
    /// indexes then follow in a bounded pass, as under ingest.
    pub fn flush(&mut self) -> Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        if let Some(h) = self.highest.take() {
            self.sub.store().reserve_ids_through(h)?;
        }
        let mut writes = std::mem::take(&mut self.writes);
        for (key, upto) in self.condensed_upto.drain() {
            writes.push(Mutation::PutRaw(key, upto.to_be_bytes().to_vec()));
        }
        self.sub.store().write(writes)?;
        self.pending_ids.clear();
        self.sub.after_write(std::mem::take(&mut self.queued));
        self.sub.index_pass(false)?;
        Ok(())
    }
}

/// Whether two records with one id are the same record (later reinforcement, decay or
/// feedback may have changed the rest).
fn same_record(a: &MemoryRecord, b: &MemoryRecord) -> bool {
    a.namespace == b.namespace
        && a.session_id == b.session_id
        && a.tier == b.tier
        && a.kind == b.kind
        && a.text == b.text
        && a.event_time == b.event_time
        && a.recorded_time == b.recorded_time
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NewMemory;
    use crate::substrate::{RecallRequest, SubstrateOptions};

    fn export_all(store: &Store) -> Vec<String> {
        export_ids(store, None)
            .unwrap()
            .into_iter()
            .filter_map(|id| export_record(store, id).unwrap())
            .map(|e| serde_json::to_string(&e).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_round_trip_keeps_every_byte_and_recall_finds_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let ids = a
            .record(
                "default",
                "s1",
                vec![
                    NewMemory::new("goal", "ship the quarterly report"),
                    NewMemory {
                        metadata: Some(serde_json::json!({"tool": "grep", "n": 1.5})),
                        ..NewMemory::new("observation", "the nightly backup job timed out")
                    },
                ],
            )
            .await
            .unwrap();
        a.archive("default", ids[0], "test").unwrap();
        a.link(
            "default",
            crate::knowledge::Edge {
                from: ids[1],
                to: ids[0],
                relation: Relation::Contradicts,
            },
            "test",
        )
        .unwrap();
        a.close().unwrap();
        let first = export_all(a.store());
        assert_eq!(first.len(), 2);
        assert!(first[0].contains("\"status\":\"archived\""), "{}", first[0]);
        assert!(
            first[1].contains("\"relation\":\"contradicts\""),
            "{}",
            first[1]
        );
        drop(a);

        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        let mut importer = Importer::new(&b);
        for line in &first {
            assert_eq!(
                importer.add(parse_line(line).unwrap()).unwrap(),
                Outcome::Imported
            );
        }
        importer.flush().unwrap();
        // Again: already there, nothing written twice.
        for line in &first {
            assert_eq!(
                importer.add(parse_line(line).unwrap()).unwrap(),
                Outcome::AlreadyPresent
            );
        }
        importer.flush().unwrap();
        assert_eq!(export_all(b.store()), first);
        assert_eq!(
            b.store()
                .session_stats("default", "s1")
                .unwrap()
                .unwrap()
                .events,
            2
        );
        // New ids never collide with imported ones.
        let fresh = b
            .record("default", "s1", vec![NewMemory::new("thought", "later")])
            .await
            .unwrap()[0];
        assert!(fresh > ids[1], "{fresh} after {}", ids[1]);
        let res = b
            .recall(&RecallRequest::new("default", "s1", "backup job timed out"))
            .await
            .unwrap();
        assert_eq!(res.memories.first().map(|m| m.record.id), Some(ids[1]));
        b.close().unwrap();
    }

    #[tokio::test]
    async fn bad_lines_are_refused_with_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
        let id = sub
            .record("default", "s", vec![NewMemory::new("goal", "keep it")])
            .await
            .unwrap()[0];
        let good = serde_json::to_value(export_record(sub.store(), id).unwrap().unwrap()).unwrap();
        let mut importer = Importer::new(&sub);
        let cases: Vec<(Value, &str)> = vec![
            (serde_json::json!({"record": {}}), "format"),
            (serde_json::json!({"format": 99, "record": {}}), "format 1"),
            (
                {
                    let mut v = good.clone();
                    v["record"]["importance"] = serde_json::json!(12.0);
                    v["record"]["id"] = serde_json::json!("mem-00000100");
                    v
                },
                "0 to 10",
            ),
            (
                {
                    let mut v = good.clone();
                    v["record"]["embedding"] = serde_json::json!([0.5, 0.5]);
                    v["record"]["id"] = serde_json::json!("mem-00000100");
                    v
                },
                "2 dimensions",
            ),
            (
                {
                    let mut v = good.clone();
                    v["record"]["text"] = serde_json::json!("another text");
                    v
                },
                "already used",
            ),
            (
                {
                    let mut v = good.clone();
                    v["surprise"] = serde_json::json!(1);
                    v
                },
                "surprise",
            ),
        ];
        for (value, needle) in cases {
            let err = parse_line(&value.to_string())
                .and_then(|line| importer.add(line))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{value}: {err}");
        }
        assert!(
            parse_line("{not json")
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        importer.flush().unwrap();
        assert_eq!(sub.store().len(), 1);
        sub.close().unwrap();
    }
}

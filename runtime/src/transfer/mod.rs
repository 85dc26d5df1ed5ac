//! Export and import: a whole store (or one namespace) as JSON lines, with what it takes to
//! restore it exactly. Every line is one JSON object with `"format":1` and one of:
//!
//! - `header` — always the first line ([`Header`]): the embedder that made the vectors and
//!   their dimension, and the source's next id and next recall number. Import refuses
//!   another embedder (vectors of different models cannot be compared) and never hands out
//!   an id below `next_id` or a recall number below `next_recall`, so a recall id, a
//!   quarantined input's id or a purged record's id of the source never comes back meaning
//!   something else.
//! - `record` — one per record of every tier and status ([`Exported`]), in id order: the
//!   record itself (id, sources, status, strength, utility, timestamps, metadata, embedding),
//!   its audit history, its knowledge-graph links, the knowledge record it was promoted
//!   into, what is known against it (its `validity`: superseded by, valid until, open
//!   conflicts, the record it repeats; absent while clear, so older exports import
//!   unchanged), and the work queues it waits on.
//! - `purged` — a purged record's tombstone ([`Purged`]): its namespace, its audit history
//!   and the graph edges that still start at it.
//! - `quarantine` — an entry set aside because processing it kept failing, with the audit
//!   history of an input that never became a record.
//! - `recall` — what a recall returned ([`RecallLog`]), so feedback on a recall id given
//!   before the move keeps working after it, and how the feedback on it went so far.
//!
//! What is **not** exported, because it is derived or local to a running process: the
//! vector and keyword indexes (rebuilt from the records), the change log, strike counts of
//! records not (yet) quarantined, and the time of the last decay sweep (the importing
//! server sweeps on its own schedule). Session statistics are rebuilt from the imported
//! records, so events of records purged before the export are no longer counted.
//!
//! Exporting, importing into an empty store and exporting again gives the same bytes: lines
//! come in a fixed order, the header holds nothing that changes between runs (no export
//! time, for that reason), and import keeps every id and writes nothing of its own (no extra
//! audit entry).
//!
//! Import goes through the store's ordinary commit path ([`Mutation::Insert`]), so the
//! catalog, the listings, the session statistics and the change log follow as for any new
//! record, and the vector and keyword indexes pick the records up from the change log. It
//! never overwrites anything: an id already in the store is skipped when it holds the same
//! thing (a re-run after an interrupted import), reported as [`Outcome::Different`] when it
//! holds the same record in another state (a newer or older export), and refused when it
//! is another record altogether.
//!
//! This file holds the line format (its types and [`parse_line`]); `export` writes lines,
//! `import` reads them into a store.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{AuditEntry, MemoryId, MemoryRecord, Relation};
use crate::store::{QuarantineEntry, Queue, Store, Validity};

mod export;
mod import;

pub use export::{Extra, export_extra, export_extras, export_header, export_ids, export_record};
pub use import::{Dangling, ImportError, Importer, Outcome};

/// The version of the line format this build writes and reads.
pub const FORMAT: u32 = 1;

/// Lines written in one commit by [`Importer`]: large enough that fsyncs do not dominate,
/// small enough that an interrupted import redoes little.
const BATCH: usize = 512;

/// The first line of every export: what the importing directory must agree with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The name of the embedder that made the exported embeddings (`None` when the source
    /// never stored one).
    pub embedder: Option<String>,
    /// Their dimension.
    pub dimension: Option<usize>,
    /// The source's next id: every id below it was handed out there (records, quarantined
    /// inputs, purged records), so the importing store reserves them all.
    pub next_id: u32,
    /// The source's next recall number (recalls count apart from records): the importing
    /// store reserves every number below it, so an old `rcl-…` id never names a new recall.
    pub next_recall: u32,
    /// The one namespace exported, when `--namespace` chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

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
    /// Waiting to be compared with older records (`[updates]`).
    Updates,
    /// Admitted by the promotion policy, waiting to be promoted into the knowledge pool.
    Promote,
}

impl Waiting {
    const ALL: [Waiting; 5] = [
        Waiting::Enrich,
        Waiting::Evaluate,
        Waiting::Condense,
        Waiting::Updates,
        Waiting::Promote,
    ];

    fn queue(self) -> Queue {
        match self {
            Waiting::Enrich => Queue::Enrich,
            Waiting::Evaluate => Queue::Evaluate,
            Waiting::Condense => Queue::Condense,
            Waiting::Updates => Queue::Updates,
            Waiting::Promote => Queue::Promote,
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

/// A `record` line: a record and everything attached to it.
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
    /// What is known against it: superseded, in open conflict, a repeat.
    #[serde(default, skip_serializing_if = "Validity::is_clear")]
    pub validity: Validity,
    /// The work queues it waits on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
}

/// A `purged` line: what is left of a purged record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purged {
    /// Its id (never handed out again).
    pub id: MemoryId,
    /// The namespace it belonged to, which alone may read its history.
    pub namespace: String,
    /// Its audit log, oldest first (the last entry says why it was purged).
    pub history: Vec<AuditEntry>,
    /// Knowledge-graph edges that still start at it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Link>,
}

/// A `recall` line: what one recall returned, so feedback can still name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecallLog {
    /// The recall id the client was given, `rcl-` and 8 hex digits.
    pub id: String,
    /// The namespace that asked.
    pub namespace: String,
    /// The session that asked.
    pub session: String,
    /// When (runtime clock).
    pub at: Timestamp,
    /// The records it returned, best first.
    pub ids: Vec<MemoryId>,
    /// Feedback on it that said it went well (absent: none, as in exports made before
    /// feedback on recalls was kept apart).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub successes: u32,
    /// Feedback on it that said it did not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One line of an export.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// The first line.
    Header(Header),
    /// A record.
    Record(Box<Exported>),
    /// A purged record's tombstone.
    Purged(Purged),
    /// A quarantine entry; `history` is the audit log of an input that never became a
    /// record (a record's own line carries its history).
    Quarantine {
        /// The entry.
        entry: QuarantineEntry,
        /// The audit log of an input that never became a record; empty otherwise.
        history: Vec<AuditEntry>,
    },
    /// A recall.
    Recall(RecallLog),
}

impl Line {
    /// The line as JSON, without the newline.
    pub fn to_json(&self) -> Result<String> {
        let value = match self {
            Line::Header(h) => serde_json::json!({"format": FORMAT, "header": h}),
            Line::Record(e) => serde_json::to_value(e).map_err(json_error)?,
            Line::Purged(p) => serde_json::json!({"format": FORMAT, "purged": p}),
            Line::Quarantine { entry, history } if history.is_empty() => {
                serde_json::json!({"format": FORMAT, "quarantine": entry})
            }
            Line::Quarantine { entry, history } => {
                serde_json::json!({"format": FORMAT, "quarantine": entry, "history": history})
            }
            Line::Recall(r) => serde_json::json!({"format": FORMAT, "recall": r}),
        };
        serde_json::to_string(&value).map_err(json_error)
    }
}

/// A value that did not turn into JSON (cannot happen for these types; kept an error
/// rather than a panic all the same).
fn json_error(e: serde_json::Error) -> Error {
    Error::invalid("line", format!("cannot be written as JSON: {e}"))
}

/// The knowledge-graph edges that start at `id`.
fn links_from(store: &Store, namespace: &str, id: MemoryId) -> Result<Vec<Link>> {
    Ok(store
        .edges(namespace, Some(id))?
        .into_iter()
        .filter(|e| e.from == id)
        .map(|e| Link {
            relation: e.relation,
            to: e.to,
        })
        .collect())
}

/// Reads one line of an export. Errors say which field is wrong; the caller adds the line
/// number.
pub fn parse_line(text: &str) -> Result<Line> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Error::invalid(
            "line",
            format!("is not JSON ({e}); every line must be one JSON object as written by `shadowbrain export`"),
        )
    })?;
    let Some(object) = value.as_object() else {
        return Err(Error::invalid(
            "line",
            "is not a JSON object; every line of an export is one object with a `format`",
        ));
    };
    match object.get("format") {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(FORMAT)) => {}
        Some(Value::Number(n)) => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is {n}, but this build reads format {FORMAT}; import with the shadowbrain \
                     version that exported the file, or a newer one"
                ),
            ));
        }
        Some(other) => {
            return Err(Error::invalid(
                "format",
                format!("is {other}, not a number; it must be the number {FORMAT}, unquoted"),
            ));
        }
        None => {
            return Err(Error::invalid(
                "format",
                format!(
                    "is missing; lines written by `shadowbrain export` start with \
                     {{\"format\":{FORMAT},…}}"
                ),
            ));
        }
    }
    let kinds = ["header", "record", "purged", "quarantine", "recall"];
    let present: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| object.contains_key(*k))
        .collect();
    let kind = match present.as_slice() {
        [one] => *one,
        _ => {
            return Err(Error::invalid(
                "line",
                format!(
                    "has {}; every line holds exactly one of `{}` as written by `shadowbrain \
                     export`",
                    if present.is_empty() {
                        "none of them".to_string()
                    } else {
                        present.join(" and ")
                    },
                    kinds.join("`, `")
                ),
            ));
        }
    };
    let fields_error = |e: serde_json::Error| {
        Error::invalid(
            "line",
            format!("{e}; fields and their types are those `shadowbrain export` writes"),
        )
    };
    let allowed: &[&str] = match kind {
        "record" => &[],
        "quarantine" => &["format", "quarantine", "history"],
        _ => &["format", kind],
    };
    if let Some(extra) = object
        .keys()
        .find(|k| !allowed.is_empty() && !allowed.contains(&k.as_str()))
    {
        return Err(Error::invalid(
            "line",
            format!("unknown field `{extra}` beside `{kind}`; remove it"),
        ));
    }
    let inner = &object[kind];
    Ok(match kind {
        "header" => Line::Header(Header::deserialize(inner).map_err(|e| in_field("header", e))?),
        "record" => {
            let exported = Exported::deserialize(&value).map_err(fields_error)?;
            // `MemoryRecord` itself ignores unknown fields; an export never has any, so one
            // here is a typo or a file from another program, and must not vanish silently.
            let known = serde_json::to_value(&exported.record).map_err(json_error)?;
            for sub in [None, Some("utility"), Some("policy")] {
                let (given, known) = match sub {
                    None => (Some(inner), Some(&known)),
                    Some(k) => (inner.get(k), known.get(k)),
                };
                if let (Some(Value::Object(given)), Some(Value::Object(known))) = (given, known)
                    && let Some(extra) = given.keys().find(|k| !known.contains_key(*k))
                {
                    let path = sub.map_or("record".to_string(), |s| format!("record.{s}"));
                    return Err(Error::invalid(
                        path,
                        format!("has an unknown field `{extra}`; remove it"),
                    ));
                }
            }
            Line::Record(Box::new(exported))
        }
        "purged" => Line::Purged(Purged::deserialize(inner).map_err(|e| in_field("purged", e))?),
        "quarantine" => {
            let entry =
                QuarantineEntry::deserialize(inner).map_err(|e| in_field("quarantine", e))?;
            let known = serde_json::to_value(&entry).map_err(json_error)?;
            if let (Value::Object(given), Value::Object(known)) = (inner, &known)
                && let Some(extra) = given.keys().find(|k| !known.contains_key(*k))
            {
                return Err(Error::invalid(
                    "quarantine",
                    format!("has an unknown field `{extra}`; remove it"),
                ));
            }
            let history = match object.get("history") {
                Some(h) => Vec::<AuditEntry>::deserialize(h).map_err(|e| in_field("history", e))?,
                None => Vec::new(),
            };
            Line::Quarantine { entry, history }
        }
        _ => Line::Recall(RecallLog::deserialize(inner).map_err(|e| in_field("recall", e))?),
    })
}

fn in_field(field: &str, e: serde_json::Error) -> Error {
    Error::invalid(
        field,
        format!("{e}; fields and their types are those `shadowbrain export` writes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{FeedbackTarget, Outcome as Feedback};
    use crate::engine::{RecallRequest, Substrate, SubstrateOptions};
    use crate::model::NewMemory;
    use crate::store::Strikes;
    use crate::store::{Mutation, ValidityChange, WriteSet};

    fn export_all(store: &Store) -> Vec<String> {
        let mut lines = vec![
            Line::Header(export_header(store, None).unwrap())
                .to_json()
                .unwrap(),
        ];
        for id in export_ids(store, None).unwrap() {
            if let Some(e) = export_record(store, id).unwrap() {
                lines.push(Line::Record(Box::new(e)).to_json().unwrap());
            }
        }
        for extra in export_extras(store, None).unwrap() {
            if let Some(l) = export_extra(store, extra).unwrap() {
                lines.push(l.to_json().unwrap());
            }
        }
        lines
    }

    /// Imports `lines` (numbered from 1) and finishes; the outcomes and dangling references.
    fn import_all(sub: &Substrate, lines: &[String]) -> (Vec<Outcome>, Vec<Dangling>) {
        let mut importer = Importer::new(sub);
        let outcomes = lines
            .iter()
            .zip(1..)
            .map(|(l, n)| importer.add(parse_line(l).unwrap(), n).unwrap())
            .collect();
        (outcomes, importer.finish().unwrap())
    }

    fn import_err(sub: &Substrate, lines: &[String]) -> String {
        let mut importer = Importer::new(sub);
        for (l, n) in lines.iter().zip(1..) {
            if let Err(e) = parse_line(l)
                .map_err(ImportError::Line)
                .and_then(|l| importer.add(l, n))
            {
                importer.flush().unwrap();
                return e.to_string();
            }
        }
        panic!("every line was accepted")
    }

    #[tokio::test]
    async fn an_imported_long_record_gets_its_passages_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let text = "The rollout of the new billing service went through four stages. ".repeat(60);
        let id = a
            .record("default", "s1", vec![NewMemory::new("observation", &text)])
            .await
            .unwrap()[0];
        let passages = a.store().passages(id).unwrap();
        assert!(passages.len() > 3, "{} passages", passages.len());
        a.close().unwrap();
        let lines = export_all(a.store());
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &lines);
        while b.enrich_pending(16).await.unwrap() > 0 {}
        assert_eq!(b.store().passages(id).unwrap(), passages);
        assert_eq!(b.store().get(id).unwrap().unwrap().text, text);
    }

    #[tokio::test]
    async fn validity_and_the_updates_queue_survive_a_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let opts = || SubstrateOptions {
            policy: crate::policy::Policy::from_toml("<test>", "[updates]\nmode = \"rules\"\n")
                .unwrap(),
            // No background pass: nothing is embedded, so detection cannot change the
            // validity written below, and every record stays queued for it.
            indexing: crate::engine::IndexingOptions {
                background: false,
                ..Default::default()
            },
            ..SubstrateOptions::default()
        };
        let a = Substrate::open(&dir.path().join("a"), opts()).unwrap();
        let texts = [
            "the runner is in eu-1",
            "the runner moved to eu-2",
            "tabs, not spaces",
        ];
        let mut ids = Vec::new();
        for text in texts {
            ids.extend(
                a.record("default", "s1", vec![NewMemory::new("observation", text)])
                    .await
                    .unwrap(),
            );
        }
        // Written by hand, so the test does not depend on what the rules find: one
        // supersession, one open conflict both ways, one repeat.
        let store = a.store();
        let now = 1_780_000_000_000;
        store
            .write(WriteSet(vec![
                Mutation::Validity(
                    ids[0],
                    ValidityChange::SupersededBy {
                        by: ids[1],
                        until: now - 5,
                        at: now,
                    },
                ),
                Mutation::Validity(
                    ids[1],
                    ValidityChange::Conflict {
                        with: ids[2],
                        open: true,
                    },
                ),
                Mutation::Validity(
                    ids[2],
                    ValidityChange::Conflict {
                        with: ids[1],
                        open: true,
                    },
                ),
                Mutation::Validity(ids[2], ValidityChange::DuplicateOf(ids[0])),
            ]))
            .unwrap();
        let before: Vec<Validity> = ids.iter().map(|i| store.validity(*i).unwrap()).collect();
        assert!(before[0].superseded() && before[2].duplicate_of.is_some());
        let lines = export_all(store);
        assert!(
            lines.iter().any(|l| l.contains("\"validity\"")),
            "validity is exported"
        );
        let b = Substrate::open(&dir.path().join("b"), opts()).unwrap();
        let (_, dangling) = import_all(&b, &lines);
        assert!(dangling.is_empty(), "{dangling:?}");
        let after: Vec<Validity> = ids
            .iter()
            .map(|i| b.store().validity(*i).unwrap())
            .collect();
        assert_eq!(after, before);
        let all: roaring::RoaringBitmap = ids.iter().map(|i| i.0).collect();
        assert_eq!(b.store().superseded(&all), a.store().superseded(&all));
        assert_eq!(b.store().conflicted(&all).len(), 2);
        for id in &ids {
            assert!(b.store().is_queued(Queue::Updates, *id).unwrap());
        }
        assert_eq!(export_all(b.store()), lines, "the same bytes again");
    }

    #[tokio::test]
    async fn a_round_trip_keeps_every_byte_and_recall_and_feedback_work() {
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
                    NewMemory::new("thought", "a passing thought to purge"),
                ],
            )
            .await
            .unwrap();
        a.archive("default", ids[0], "test").unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[1],
                to: ids[0],
                relation: Relation::Contradicts,
            },
            "test",
        )
        .unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[2],
                to: ids[1],
                relation: Relation::SimilarTo,
            },
            "test",
        )
        .unwrap();
        a.purge("default", ids[2], "test").unwrap();
        let quarantined = a
            .quarantine_input("default", "s1", "session", "boom", 3, "[{}]".into())
            .await
            .unwrap()
            .id;
        let recall = a
            .recall(&RecallRequest::new("default", "s1", "backup job"))
            .await
            .unwrap()
            .recall_id
            .unwrap();
        // How that recall went travels with it (it counts toward "in successful recalls").
        a.feedback(
            "default",
            &FeedbackTarget::Recall(recall.clone()),
            Feedback::Success,
            "test",
        )
        .await
        .unwrap();
        a.close().unwrap();
        let first = export_all(a.store());
        let next_id = a.store().next_id();
        let next_recall = a.store().next_recall();
        assert_eq!(first.len(), 1 + 2 + 3, "{first:#?}");
        assert!(
            first[0].starts_with(r#"{"format":1,"header":{"dimension":384,"embedder":"hash","#),
            "{}",
            first[0]
        );
        assert!(first[1].contains("\"status\":\"archived\""), "{}", first[1]);
        assert!(
            first[2].contains("\"relation\":\"contradicts\""),
            "{}",
            first[2]
        );
        assert!(
            first[3].contains("\"purged\"") && first[3].contains("\"similar_to\""),
            "{}",
            first[3]
        );
        assert!(first[4].contains("\"quarantine\"") && first[4].contains("\"history\""));
        assert!(
            first[5].contains(&format!("\"id\":\"{recall}\""))
                && first[5].contains("\"successes\":1"),
            "{}",
            first[5]
        );
        drop(a);

        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        let (outcomes, dangling) = import_all(&b, &first);
        assert_eq!(outcomes[0], Outcome::Header);
        assert!(
            outcomes[1..].iter().all(|o| *o == Outcome::Imported),
            "{outcomes:?}"
        );
        assert_eq!(dangling, []);
        // Again: already there, nothing written twice.
        let (outcomes, _) = import_all(&b, &first);
        assert!(
            outcomes[1..].iter().all(|o| *o == Outcome::AlreadyPresent),
            "{outcomes:?}"
        );
        assert_eq!(export_all(b.store()), first);
        // Session statistics are rebuilt from the records: the purged one is not counted.
        assert_eq!(
            b.store()
                .session_stats("default", "s1")
                .unwrap()
                .unwrap()
                .events,
            2
        );
        // The purged record's and the quarantined input's histories stay in their namespace.
        assert!(b.history("default", ids[2]).unwrap().len() >= 2);
        assert!(b.history("acme", ids[2]).is_err());
        assert_eq!(b.history("default", quarantined).unwrap().len(), 1);
        assert!(b.quarantine_entry(quarantined).unwrap().is_some());
        // Feedback on a recall id given before the move still names that recall.
        let report = b
            .feedback(
                "default",
                &FeedbackTarget::Recall(recall.clone()),
                Feedback::Success,
                "test",
            )
            .await
            .unwrap();
        assert!(report.updated >= 1, "{report:?}");
        // New ids never reuse an id the source handed out, the recall's included.
        let fresh = b
            .record("default", "s1", vec![NewMemory::new("thought", "later")])
            .await
            .unwrap()[0];
        assert!(fresh.0 >= next_id, "{fresh} reuses an id below {next_id}");
        let res = b
            .recall(&RecallRequest::new("default", "s1", "backup job timed out"))
            .await
            .unwrap();
        assert_eq!(res.memories.first().map(|m| m.record.id), Some(ids[1]));
        let new_recall = res.recall_id.unwrap();
        assert!(
            new_recall.as_str() >= format!("rcl-{next_recall:08x}").as_str(),
            "{new_recall} reuses a recall number below {next_recall}"
        );
        assert_ne!(new_recall, recall);
        b.close().unwrap();
    }

    #[tokio::test]
    async fn a_newer_export_is_reported_as_different_and_nothing_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let id = a
            .record("default", "s", vec![NewMemory::new("goal", "keep it")])
            .await
            .unwrap()[0];
        let old = export_all(a.store());
        a.feedback(
            "default",
            &FeedbackTarget::Memories(vec![id]),
            Feedback::Success,
            "test",
        )
        .await
        .unwrap();
        a.close().unwrap();
        let newer = export_all(a.store());
        assert_ne!(old, newer);
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &old);
        let (outcomes, _) = import_all(&b, &newer);
        assert_eq!(outcomes[1], Outcome::Different(id.to_string()));
        assert_eq!(export_all(b.store()), old, "the store's version is kept");
        b.close().unwrap();
    }

    #[tokio::test]
    async fn a_quarantined_record_is_not_queued_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let id = a
            .record("default", "s", vec![NewMemory::new("goal", "poison")])
            .await
            .unwrap()[0];
        // As if embedding it kept failing: no embedding, off the queue, quarantined.
        let mut r = a.store().get(id).unwrap().unwrap();
        r.embedding = None;
        let strikes = Strikes {
            count: 3,
            actor: "enricher".into(),
            last_error: "boom".into(),
        };
        a.quarantine_record(
            "default",
            id,
            "enricher",
            &strikes,
            vec![Mutation::Dequeue(Queue::Enrich, id)],
        )
        .await
        .unwrap();
        a.close().unwrap();
        let mut lines = export_all(a.store());
        let mut v: Value = serde_json::from_str(&lines[1]).unwrap();
        v["record"]["embedding"] = Value::Null;
        lines[1] = v.to_string();
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        import_all(&b, &lines);
        assert!(!b.store().is_queued(Queue::Enrich, id).unwrap());
        assert!(b.quarantine_entry(id).unwrap().is_some());
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
        let lines = export_all(sub.store());
        let header = lines[0].clone();
        let good: Value = serde_json::from_str(&lines[1]).unwrap();
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            v["record"]["id"] = serde_json::json!("mem-00000000");
            f(&mut v);
            v.to_string()
        };
        let header_with = |f: &dyn Fn(&mut Value)| {
            let mut v: Value = serde_json::from_str(&header).unwrap();
            f(&mut v);
            v.to_string()
        };
        let cases: Vec<(Vec<String>, &str)> = vec![
            (vec![lines[1].clone()], "header: is missing"),
            (vec![r#"{"record": {}}"#.into()], "format: is missing"),
            (vec![r#"{"format": 99, "record": {}}"#.into()], "format 1"),
            (
                vec![r#"{"format": "1", "record": {}}"#.into()],
                "not a number",
            ),
            (
                vec![
                    header_with(&|v| v["header"]["embedder"] = "openai:small".into()),
                    lines[1].clone(),
                ],
                "shadowbrain reindex",
            ),
            (
                vec![header_with(&|v| v["header"]["dimension"] = 128.into())],
                "128 dimensions",
            ),
            (vec![header.clone(), header.clone()], "second time"),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["importance"] = 12.0.into()),
                ],
                "0 to 10",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["embedding"] = serde_json::json!([0.5, 0.5])),
                ],
                "2 dimensions",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["text"] = "x".repeat((1 << 20) + 1).into()),
                ],
                "record.text is too large",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["surprise"] = 1.into()),
                ],
                "record: has an unknown field `surprise`",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["utility"]["wins"] = 1.into()),
                ],
                "record.utility: has an unknown field `wins`",
            ),
            (
                vec![header.clone(), edit(&|v| v["surprise"] = 1.into())],
                "surprise",
            ),
            (
                vec![header.clone(), lines[1].clone(), lines[1].clone()],
                "also on line 2",
            ),
            (
                vec![
                    header.clone(),
                    edit(&|v| v["record"]["id"] = "mem-000000ff".into()),
                ],
                "not below the header's next_id",
            ),
        ];
        for (lines, needle) in cases {
            let err = import_err(&sub, &lines);
            assert!(err.contains(needle), "{lines:?}: {err}");
        }
        // Another record under a used id is refused.
        let fresh = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        drop(fresh);
        let other = {
            let mut v = good.clone();
            v["record"]["text"] = "another text".into();
            v.to_string()
        };
        assert!(import_err(&sub, &[header.clone(), other]).contains("already used"));
        assert!(
            parse_line("{not json")
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
        assert_eq!(sub.store().len(), 1);
        assert!(sub.store().get(id).unwrap().is_some());
        sub.close().unwrap();
    }

    #[tokio::test]
    async fn references_to_records_missing_from_file_and_store_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let a = Substrate::open(&dir.path().join("a"), SubstrateOptions::default()).unwrap();
        let ids = a
            .record(
                "default",
                "s",
                vec![NewMemory::new("goal", "one"), NewMemory::new("goal", "two")],
            )
            .await
            .unwrap();
        a.link(
            "default",
            crate::model::Edge {
                from: ids[1],
                to: ids[0],
                relation: Relation::SimilarTo,
            },
            "test",
        )
        .unwrap();
        a.close().unwrap();
        let lines = export_all(a.store());
        let b = Substrate::open(&dir.path().join("b"), SubstrateOptions::default()).unwrap();
        // The first record left out: the link from the second dangles.
        let (_, dangling) = import_all(&b, &[lines[0].clone(), lines[2].clone()]);
        assert_eq!(
            dangling,
            [Dangling {
                from: ids[1],
                field: "links",
                to: ids[0]
            }]
        );
        b.close().unwrap();
    }
}

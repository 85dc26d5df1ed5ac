//! Reading lines into a store through its ordinary commit path, in batches, never
//! overwriting: what is already there is skipped, reported as different, or refused.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::engine::{Substrate, recall_id};
use crate::error::{Error, Result};
use crate::index::passage::is_long;
use crate::model::{
    AuditAction, AuditEntry, Edge, MemoryId, MemoryRecord, Tier, validate_embedding, validate_id,
};
use crate::store::{
    Mutation, QuarantineEntry, RememberedRecall, Validity, ValidityChange, WriteSet,
};

use super::*;

/// The changes that give a record with no validity yet the validity `v`.
fn validity_changes(v: &Validity) -> Vec<ValidityChange> {
    let mut changes = Vec::new();
    if let (Some(by), Some(until), Some(at)) = (v.superseded_by, v.valid_until, v.learned_at) {
        changes.push(ValidityChange::SupersededBy { by, until, at });
    }
    changes.extend(
        v.conflicts
            .iter()
            .map(|&with| ValidityChange::Conflict { with, open: true }),
    );
    changes.extend(v.duplicate_of.map(ValidityChange::DuplicateOf));
    changes
}

/// The edge a link of record `from` stands for.
fn edge(namespace: &str, from: MemoryId, link: Link) -> Mutation {
    Mutation::PutEdge(
        namespace.to_string(),
        Edge {
            from,
            to: link.to,
            relation: link.relation,
        },
    )
}

/// What [`Importer::add`] did with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (durable after the next [`Importer::flush`]).
    Imported,
    /// The store already holds exactly this: left alone.
    AlreadyPresent,
    /// The store holds this id for the same thing, in another state (later reinforcement,
    /// decay, feedback, history): the store's version was kept. The id, for the report.
    Different(String),
    /// The header: checked, and the source's ids reserved.
    Header,
}

/// Why [`Importer::add`] or [`Importer::flush`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The line is wrong (or clashes with the store); nothing of it was written.
    #[error("{0}")]
    Line(Error),
    /// Reading or writing the data directory failed: the line may be fine.
    #[error("{0}")]
    Store(Error),
}

/// A reference from one imported line to a record that is neither in the store nor in the
/// file (after the whole file was imported).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dangling {
    /// The record that refers.
    pub from: MemoryId,
    /// What refers: `sources`, `links` or `promoted_into`.
    pub field: &'static str,
    /// The record referred to, missing from the namespace.
    pub to: MemoryId,
}

impl std::fmt::Display for Dangling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} → {}", self.from, self.field, self.to)
    }
}

/// Writes exported lines into a substrate, in batches. Call [`Importer::finish`] at the end
/// (or [`Importer::flush`] before giving up on a bad line: what was added before it is then
/// durable).
#[derive(Debug)]
pub struct Importer {
    sub: Substrate,
    writes: WriteSet,
    /// Lines added since the last flush (not yet in the store).
    pending: usize,
    /// Lines made durable so far.
    committed: u64,
    highest: Option<MemoryId>,
    queued: bool,
    /// Per (namespace, session): the largest source id its condensed records cover (see
    /// `Store::condensed_upto`), so the condenser does not condense imported events again.
    condensed_upto: HashMap<(String, String), MemoryId>,
    /// Tombstones to write once the batch holding their history is durable.
    tombstones: Vec<(MemoryId, String)>,
    header: Option<Header>,
    /// Line numbers of the ids seen in this file, per kind of line: an export lists each once.
    seen: HashMap<(u8, u32), u64>,
    /// Ids referred to by imported lines, checked by [`Importer::finish`]: (from, field, to).
    references: Vec<(MemoryId, &'static str, MemoryId)>,
}

impl Importer {
    /// An importer into `sub`.
    pub fn new(sub: &Substrate) -> Importer {
        Importer {
            sub: sub.clone(),
            writes: WriteSet::new(),
            pending: 0,
            committed: 0,
            highest: None,
            queued: false,
            condensed_upto: HashMap::new(),
            tombstones: Vec::new(),
            header: None,
            seen: HashMap::new(),
            references: Vec::new(),
        }
    }

    /// Lines made durable so far (header excluded).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Checks line `number` of the file and queues its writes; commits a batch when one is
    /// full. Nothing of a line that fails its checks is written.
    pub fn add(&mut self, line: Line, number: u64) -> Result<Outcome, ImportError> {
        let Some(header) = &self.header else {
            let Line::Header(h) = line else {
                return Err(ImportError::Line(Error::invalid(
                    "header",
                    format!(
                        "is missing: an export starts with a header line \
                         ({{\"format\":{FORMAT},\"header\":{{\"embedder\":…}}}}) naming the \
                         embedder and the ids in use. Files written before exports had one \
                         cannot be imported; export the source again with this build"
                    ),
                )));
            };
            self.check_header(&h).map_err(ImportError::Line)?;
            if let Some(last) = h.next_id.checked_sub(1) {
                self.sub
                    .store()
                    .reserve_ids_through(MemoryId(last))
                    .map_err(ImportError::Store)?;
            }
            if let Some(last) = h.next_recall.checked_sub(1) {
                self.sub
                    .store()
                    .reserve_recalls_through(last)
                    .map_err(ImportError::Store)?;
            }
            self.header = Some(h);
            return Ok(Outcome::Header);
        };
        let (kind, id, line_ns) = match &line {
            Line::Record(e) => (0u8, e.record.id.0, &e.record.namespace),
            Line::Purged(p) => (0, p.id.0, &p.namespace),
            Line::Quarantine { entry, .. } => (1, entry.id.0, &entry.namespace),
            Line::Recall(r) => (
                2,
                recall_number(&r.id).map_err(ImportError::Line)?,
                &r.namespace,
            ),
            Line::Header(_) => return Err(second_header()),
        };
        let (bound, bound_name, shown) = if kind == 2 {
            (header.next_recall, "next_recall", recall_id(id))
        } else {
            (header.next_id, "next_id", MemoryId(id).to_string())
        };
        if id >= bound {
            return Err(ImportError::Line(Error::invalid(
                "id",
                format!(
                    "{shown} is not below the header's {bound_name} ({bound}), so the source \
                     never handed it out; the file was edited or is damaged. Export the \
                     source again"
                ),
            )));
        }
        if let Some(ns) = &header.namespace
            && line_ns != ns
        {
            return Err(ImportError::Line(Error::invalid(
                "namespace",
                format!(
                    "is `{line_ns}`, but the header says this is an export of namespace \
                     `{ns}` only; the file was edited or two exports were mixed"
                ),
            )));
        }
        if let Some(first) = self.seen.insert((kind, id), number) {
            let what = match kind {
                0 => MemoryId(id).to_string(),
                1 => format!("the quarantine entry of {}", MemoryId(id)),
                _ => recall_id(id),
            };
            return Err(ImportError::Line(Error::invalid(
                "id",
                format!(
                    "{what} is also on line {first}; an export lists each once, so the file \
                     was edited or two exports were mixed. Keep one of the two lines"
                ),
            )));
        }
        let outcome = match line {
            Line::Record(e) => self.add_record(*e)?,
            Line::Purged(p) => self.add_purged(p)?,
            Line::Quarantine { entry, history } => self.add_quarantine(entry, history)?,
            Line::Recall(r) => self.add_recall(r, id)?,
            Line::Header(_) => return Err(second_header()),
        };
        if outcome == Outcome::Imported {
            // Recall numbers are reserved by the header alone; they are not record ids.
            if kind != 2 {
                self.highest = self.highest.max(Some(MemoryId(id)));
            }
            self.pending += 1;
            if self.pending >= BATCH {
                self.flush()?;
            }
        }
        Ok(outcome)
    }

    fn check_header(&self, h: &Header) -> Result<()> {
        let embedder = self.sub.embedder();
        if let Some(name) = &h.embedder
            && name != embedder.name()
        {
            return Err(Error::invalid(
                "header.embedder",
                format!(
                    "the export's embeddings were made by `{name}`, but this data directory's \
                     embedder is `{}`, and vectors of different models cannot be compared; \
                     import into a fresh data directory with a --config whose [embedder] is \
                     `{name}` (as the source's), then run `shadowbrain reindex` with the new \
                     embedder's config there to re-embed every record",
                    embedder.name()
                ),
            ));
        }
        if let Some(d) = h.dimension
            && d != embedder.dimensions()
        {
            return Err(Error::invalid(
                "header.dimension",
                format!(
                    "the export's embeddings have {d} dimensions, but this data directory's \
                     embedder (`{}`) makes {}; import with the --config whose [embedder] made \
                     the export, then `shadowbrain reindex` to change embedders",
                    embedder.name(),
                    embedder.dimensions()
                ),
            ));
        }
        if let Some(ns) = &h.namespace {
            validate_id("header.namespace", ns)?;
        }
        Ok(())
    }

    fn add_record(&mut self, mut line: Exported) -> Result<Outcome, ImportError> {
        self.check(&line).map_err(ImportError::Line)?;
        let id = line.record.id;
        // A record without its embedding waits for the enricher, like any new record —
        // unless the source set it aside because embedding it kept failing.
        let quarantined = line
            .history
            .iter()
            .any(|e| e.action == AuditAction::Quarantined);
        // A long record's passages are not in the export (they follow from its text and
        // the embedder): embed it again, passage by passage, as when it was first written.
        if is_long(&line.record.text) && !quarantined {
            line.record.embedding = None;
        }
        if line.record.embedding.is_none()
            && !quarantined
            && !line.waiting.contains(&Waiting::Enrich)
        {
            line.waiting.push(Waiting::Enrich);
        }
        // The cheap look first: most lines of an import are new.
        let present = self
            .sub
            .store()
            .get_light(id)
            .map_err(ImportError::Store)?
            .is_some();
        if present
            && let Some(existing) =
                export_record(self.sub.store(), id).map_err(ImportError::Store)?
        {
            return if !same_record(&existing.record, &line.record) {
                Err(ImportError::Line(Error::invalid(
                    "record.id",
                    format!(
                        "{id} is already used in this data directory by another record \
                         (namespace `{}`, session `{}`, {} {}); import into an empty data \
                         directory",
                        existing.record.namespace,
                        existing.record.session_id,
                        existing.record.tier.as_str(),
                        existing.record.kind
                    ),
                )))
            } else if existing == line {
                Ok(Outcome::AlreadyPresent)
            } else {
                Ok(Outcome::Different(id.to_string()))
            };
        }
        self.refuse_if_taken(id, "record.id")?;
        let r = &line.record;
        for s in &r.sources {
            self.references.push((id, "sources", *s));
        }
        for l in &line.links {
            self.references.push((id, "links", l.to));
        }
        if let Some(k) = line.promoted_into {
            self.references.push((id, "promoted_into", k));
        }
        let v = &line.validity;
        for (field, other) in (v
            .superseded_by
            .iter()
            .map(|o| ("validity.superseded_by", *o)))
        .chain(v.conflicts.iter().map(|o| ("validity.conflicts", *o)))
        .chain(v.duplicate_of.iter().map(|o| ("validity.duplicate_of", *o)))
        {
            self.references.push((id, field, other));
        }
        self.push(line).map_err(ImportError::Store)?;
        Ok(Outcome::Imported)
    }

    /// Refuses an id that the store uses for something other than a record (a purged
    /// record, a quarantined input). Recall numbers are counted apart and cannot clash.
    fn refuse_if_taken(&self, id: MemoryId, field: &str) -> Result<(), ImportError> {
        let store = self.sub.store();
        let taken = if store.tombstone(id).map_err(ImportError::Store)?.is_some() {
            Some("a purged record")
        } else if store
            .quarantine_entry(id)
            .map_err(ImportError::Store)?
            .is_some()
        {
            Some("a quarantined input")
        } else {
            None
        };
        match taken {
            Some(what) => Err(ImportError::Line(Error::invalid(
                field,
                format!(
                    "{id} is already used in this data directory by {what}; import into an \
                     empty data directory"
                ),
            ))),
            None => Ok(()),
        }
    }

    fn check(&self, line: &Exported) -> Result<()> {
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
        // The limits the importing directory applies to new events (its config's
        // `[limits]`): an import must not bring in what `record` would refuse.
        let limits = self.sub.limits();
        let json_len = |v: &Value| match v {
            Value::Null => 0,
            v => serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX),
        };
        for (field, size, limit) in [
            ("record.text", r.text.len(), limits.max_text_bytes),
            (
                "record.content",
                json_len(&r.content),
                limits.max_content_bytes,
            ),
            (
                "record.metadata",
                json_len(&r.metadata),
                limits.max_metadata_bytes,
            ),
        ] {
            if size > limit {
                return Err(Error::TooLarge {
                    field: field.into(),
                    size,
                    limit,
                    hint: "raise the limit in the [limits] section of the --config file, or \
                           shorten the field in the file"
                        .into(),
                });
            }
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

    fn add_purged(&mut self, p: Purged) -> Result<Outcome, ImportError> {
        validate_id("purged.namespace", &p.namespace).map_err(ImportError::Line)?;
        let store = self.sub.store();
        if let Some(r) = store.get_light(p.id).map_err(ImportError::Store)? {
            return Err(ImportError::Line(Error::invalid(
                "purged.id",
                format!(
                    "{} is a live record in this data directory (namespace `{}`), not a \
                     purged one; import into an empty data directory",
                    p.id, r.namespace
                ),
            )));
        }
        let history = store.history(p.id).map_err(ImportError::Store)?;
        let tombstone = store.tombstone(p.id).map_err(ImportError::Store)?;
        match tombstone {
            Some(ns) if ns != p.namespace => {
                return Err(ImportError::Line(Error::invalid(
                    "purged.id",
                    format!(
                        "{} was purged from namespace `{ns}` in this data directory, not from \
                         `{}`; import into an empty data directory",
                        p.id, p.namespace
                    ),
                )));
            }
            Some(_)
                if history == p.history
                    && links_from(store, &p.namespace, p.id).map_err(ImportError::Store)?
                        == p.links =>
            {
                return Ok(Outcome::AlreadyPresent);
            }
            Some(_) => return Ok(Outcome::Different(p.id.to_string())),
            // An import interrupted between the history and the tombstone: finish it.
            None if !history.is_empty() && history == p.history => {
                self.tombstones.push((p.id, p.namespace));
                return Ok(Outcome::Imported);
            }
            None if !history.is_empty() => {
                return Err(ImportError::Line(Error::invalid(
                    "purged.id",
                    format!(
                        "{} already has another audit history in this data directory; \
                         import into an empty data directory",
                        p.id
                    ),
                )));
            }
            None => {}
        }
        self.refuse_if_taken(p.id, "purged.id")?;
        for entry in p.history {
            self.writes.push(Mutation::Audit(p.id, entry));
        }
        for link in p.links {
            self.writes.push(edge(&p.namespace, p.id, link));
        }
        self.tombstones.push((p.id, p.namespace));
        Ok(Outcome::Imported)
    }

    fn add_quarantine(
        &mut self,
        entry: QuarantineEntry,
        history: Vec<AuditEntry>,
    ) -> Result<Outcome, ImportError> {
        validate_id("quarantine.namespace", &entry.namespace).map_err(ImportError::Line)?;
        let present = self
            .sub
            .store()
            .quarantine_entry(entry.id)
            .map_err(ImportError::Store)?;
        if let Some(existing) = present {
            return Ok(if existing == entry {
                Outcome::AlreadyPresent
            } else {
                Outcome::Different(format!("quarantine of {}", entry.id))
            });
        }
        if !history.is_empty() {
            // An input that never became a record: its id is its own.
            let store = self.sub.store();
            if store.owner(entry.id).map_err(ImportError::Store)?.is_some()
                || store
                    .recall(entry.id.0)
                    .map_err(ImportError::Store)?
                    .is_some()
            {
                return Err(ImportError::Line(Error::invalid(
                    "quarantine.id",
                    format!(
                        "{} is already used in this data directory by something else; import \
                         into an empty data directory",
                        entry.id
                    ),
                )));
            }
            for e in history {
                self.writes.push(Mutation::Audit(entry.id, e));
            }
        }
        self.writes.push(Mutation::Quarantine(Box::new(entry)));
        Ok(Outcome::Imported)
    }

    fn add_recall(&mut self, r: RecallLog, n: u32) -> Result<Outcome, ImportError> {
        validate_id("recall.namespace", &r.namespace).map_err(ImportError::Line)?;
        validate_id("recall.session", &r.session).map_err(ImportError::Line)?;
        let stored = RememberedRecall {
            namespace: r.namespace,
            session: r.session,
            at: r.at,
            ids: r.ids,
        };
        if let Some(existing) = self.sub.store().recall(n).map_err(ImportError::Store)? {
            return Ok(if existing == stored {
                Outcome::AlreadyPresent
            } else {
                Outcome::Different(r.id)
            });
        }
        self.writes.push(Mutation::RememberRecall(n, stored));
        for success in std::iter::repeat_n(true, r.successes as usize)
            .chain(std::iter::repeat_n(false, r.failures as usize))
        {
            self.writes
                .push(Mutation::RecallOutcome { recall: n, success });
        }
        Ok(Outcome::Imported)
    }

    fn push(&mut self, line: Exported) -> Result<()> {
        let Exported {
            record,
            history,
            links,
            promoted_into,
            validity,
            waiting,
            ..
        } = line;
        let id = record.id;
        for entry in history {
            self.writes.push(Mutation::Audit(id, entry));
        }
        for link in links {
            self.writes.push(edge(&record.namespace, id, link));
        }
        if let Some(knowledge) = promoted_into {
            self.writes.push(Mutation::MarkPromoted {
                condensed: id,
                knowledge,
            });
        }
        for w in waiting {
            self.queued |= w == Waiting::Enrich;
            self.writes.push(Mutation::Enqueue(w.queue(), id));
        }
        if record.tier == Tier::Condensed
            && let Some(upto) = record.sources.iter().copied().max()
        {
            let key = (record.namespace.clone(), record.session_id.clone());
            let current = match self.condensed_upto.get(&key) {
                Some(v) => Some(*v),
                None => self.sub.store().condensed_upto(&key.0, &key.1)?,
            };
            if current.is_none_or(|c| c < upto) {
                self.condensed_upto.insert(key, upto);
            }
        }
        self.writes.push(Mutation::Insert(Box::new(record)));
        // After the insert: a validity change applies to a record that exists.
        for change in validity_changes(&validity) {
            self.writes.push(Mutation::Validity(id, change));
        }
        Ok(())
    }

    /// Commits what was added since the last flush and returns once it is durable; the
    /// indexes then follow in a bounded pass, as under ingest.
    pub fn flush(&mut self) -> Result<(), ImportError> {
        self.flush_inner().map_err(ImportError::Store)
    }

    fn flush_inner(&mut self) -> Result<()> {
        if self.writes.is_empty() && self.tombstones.is_empty() {
            return Ok(());
        }
        if let Some(h) = self.highest.take() {
            self.sub.store().reserve_ids_through(h)?;
        }
        let mut writes = std::mem::take(&mut self.writes);
        for ((namespace, session), upto) in self.condensed_upto.drain() {
            writes.push(Mutation::SetCondensedUpto {
                namespace,
                session,
                upto,
            });
        }
        self.sub.store().write(writes)?;
        // After the history they guard is durable: an interruption in between leaves a
        // history without its tombstone, which the next run of the import completes.
        for (id, ns) in std::mem::take(&mut self.tombstones) {
            self.sub.store().restore_tombstone(id, &ns)?;
        }
        self.committed += std::mem::take(&mut self.pending) as u64;
        self.sub.after_write(std::mem::take(&mut self.queued));
        self.sub.index_pass(false)?;
        Ok(())
    }

    /// Flushes, then checks every reference the imported lines made (`sources`, `links`,
    /// `promoted_into`) against the store: each must name a record, live or purged, of the
    /// same namespace. Returns the ones that do not, in file order; the records are
    /// imported either way.
    pub fn finish(mut self) -> Result<Vec<Dangling>, ImportError> {
        self.flush()?;
        if self.header.is_none() {
            return Err(ImportError::Line(Error::invalid(
                "file",
                "is empty; an export has at least its header line. Check the file name, or \
                 that the export finished",
            )));
        }
        let store = self.sub.store();
        let mut owners: HashMap<MemoryId, Option<String>> = HashMap::new();
        let mut owner = |id: MemoryId| -> Result<Option<String>> {
            if let Some(o) = owners.get(&id) {
                return Ok(o.clone());
            }
            let o = store.owner(id)?;
            owners.insert(id, o.clone());
            Ok(o)
        };
        let mut dangling = Vec::new();
        let mut reported = HashSet::new();
        for (from, field, to) in std::mem::take(&mut self.references) {
            let from_ns = owner(from).map_err(ImportError::Store)?;
            if owner(to).map_err(ImportError::Store)? != from_ns && reported.insert((from, to)) {
                dangling.push(Dangling { from, field, to });
            }
        }
        Ok(dangling)
    }
}

fn second_header() -> ImportError {
    ImportError::Line(Error::invalid(
        "header",
        "appears a second time; an export has one header, on its first line (were two \
         exports concatenated? import them one by one)",
    ))
}

/// The number in a recall id (`rcl-` and 8 hex digits).
fn recall_number(id: &str) -> Result<u32> {
    crate::engine::recall_number(id).ok_or_else(|| {
        Error::invalid(
            "recall.id",
            format!("`{id}` is not a recall id; recall ids are `rcl-` and 8 hex digits"),
        )
    })
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

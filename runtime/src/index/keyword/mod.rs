//! The keyword index: BM25 over record text, on tantivy. A long record is one document per
//! passage (`crate::index::passage`), all under its id, and scores as its best passage.
//!
//! It owns one tantivy index directory (schema: `id` u64 indexed + fast, `text` indexed with
//! the shared analyzer, not stored) and a staged tail of upserts and removals that are
//! searchable at once and written to tantivy by [`KeywordIndex::commit`], which records the
//! caller's watermark as tantivy's commit payload.
//!
//! The index is **derived**: the store is the system of record. A crash loses at most the
//! staged tail, which the store replays from [`KeywordIndex::watermark`]; `reindex` rebuilds
//! everything after [`KeywordIndex::clear`]. So this module must never hold anything the store
//! does not (it does not even store the text), and it must never tokenise on its own: every
//! term comes from [`crate::index::text`], so the index and the embedder agree on terms. Queries are
//! bags of analysed terms, never tantivy's query syntax, so no user text can make them fail.

mod tail;

#[cfg(test)]
mod tests;

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};
use tantivy::collector::Count;
use tantivy::directory::MmapDirectory;
use tantivy::fieldnorm::FieldNormReader;
use tantivy::index::SegmentId;
use tantivy::query::{
    Bm25StatisticsProvider, Bm25Weight, BooleanQuery, EnableScoring, Occur, Query, TermQuery,
    TermSetQuery,
};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{MAX_TOKEN_LEN, TokenizerManager};
use tantivy::{
    DocId, Index, IndexReader, IndexWriter, ReloadPolicy, Score, Searcher, SegmentReader,
    TantivyDocument, Term,
};

use tantivy::DocSet;
use tantivy::postings::Postings;

use crate::error::{Error, Result};
use crate::index::passage::split;
use crate::index::text::{ANALYZER_NAME, analyze, analyzer};
use tail::{StagedDoc, Tail};

const ID_FIELD: &str = "id";

/// Scopes up to this many ids are scored by looking their docs up (see `search`).
const SCOPED_LOOKUP_MAX: u64 = 4096;
const TEXT_FIELD: &str = "text";

/// One indexing thread: the machine is shared with the store and the actors, and the
/// indexer commits in batches, so a second thread would buy little.
const WRITER_THREADS: usize = 1;
/// Enough for ~100k short documents per segment without flushing mid-batch.
const WRITER_HEAP_BYTES: usize = 50_000_000;

/// The BM25 keyword index over record text. `Send + Sync`; every method takes `&self`.
///
/// Writes are staged ([`upsert`](Self::upsert), [`remove`](Self::remove)) and visible to
/// [`search`](Self::search) at once; [`commit`](Self::commit) makes them durable in tantivy.
pub struct KeywordIndex {
    dir: PathBuf,
    reader: IndexReader,
    /// The single tantivy writer; holding its lock also serialises commits and clears.
    writer: Mutex<IndexWriter>,
    /// Staged operations. Searches hold it shared while they read the searcher, and commits
    /// reload the reader under it exclusively, so no search ever sees a document twice or
    /// not at all while a commit lands.
    tail: RwLock<Tail>,
    id_field: Field,
    text_field: Field,
    watermark: AtomicU64,
    /// Every id at or above this was never committed, so its upsert needs no delete:
    /// tantivy keeps each pending delete as a query until the commit (about 1 KB each,
    /// 280 MB for a 300k-document commit), and record ids only grow.
    fresh_from: AtomicU64,
    /// Each segment's documents by record id, as (id, doc) sorted: segments never change,
    /// so the table is read once from the `id` fast field when a segment is first searched
    /// by id (8 bytes a document), and dropped when the segment leaves the searcher. A
    /// session-scoped recall finds its hundred-odd documents by binary search here, where
    /// a lookup in the id field's term dictionary per id would cost a few percent of it.
    id_docs: Mutex<HashMap<SegmentId, IdTable>>,
}

/// A segment's (record id, doc) pairs, sorted.
type IdTable = Arc<[(u32, DocId)]>;

/// Record ids with their BM25 scores, best first, and what a small scope's search read on
/// the way (see [`KeywordIndex::search_with_counts`]).
type Counted = (Vec<(u32, f32)>, Option<ScopeCounts>);

impl fmt::Debug for KeywordIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeywordIndex")
            .field("dir", &self.dir)
            .field("pending", &self.pending())
            .field("watermark", &self.watermark.load(AtomicOrdering::Acquire))
            .finish_non_exhaustive()
    }
}

fn schema() -> (Schema, Field, Field) {
    let mut builder = Schema::builder();
    let id_field =
        builder.add_u64_field(ID_FIELD, NumericOptions::default().set_indexed().set_fast());
    let text_field = builder.add_text_field(
        TEXT_FIELD,
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(ANALYZER_NAME)
                .set_index_option(IndexRecordOption::WithFreqs)
                .set_fieldnorms(true),
        ),
    );
    (builder.build(), id_field, text_field)
}

fn parse_watermark(payload: Option<&str>) -> Result<u64> {
    match payload {
        None => Ok(0),
        Some(p) => p.trim().parse().map_err(|_| {
            Error::index(
                "keyword",
                format!(
                    "the last commit's payload `{p}` is not a watermark (an unsigned integer); \
                     the index was not written by shadowbrain or is damaged"
                ),
            )
        }),
    }
}

impl KeywordIndex {
    /// Opens the index in `dir`, creating the directory and an empty index when missing.
    ///
    /// Fails when another `KeywordIndex` (in this or another process) holds `dir`, or when
    /// `dir` holds an index with another schema.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let directory = MmapDirectory::open(dir).map_err(|e| {
            Error::index(
                "keyword",
                format!("cannot open the index directory {}: {e}", dir.display()),
            )
        })?;
        let (schema, id_field, text_field) = schema();
        let tokenizers = TokenizerManager::default();
        tokenizers.register(ANALYZER_NAME, analyzer());
        let index = Index::builder()
            .schema(schema)
            .tokenizers(tokenizers)
            .open_or_create(directory)
            .map_err(|e| match e {
                tantivy::TantivyError::SchemaError(_) => Error::index(
                    "keyword",
                    format!(
                        "{} holds a keyword index with another schema ({e}); delete that \
                         directory so it is rebuilt from the store",
                        dir.display()
                    ),
                ),
                other => Error::index(
                    "keyword",
                    format!("cannot open the index in {}: {other}", dir.display()),
                ),
            })?;
        // The writer's threads (indexing, merging) do work nobody waits on: start them from
        // a thread at the background priority, which they inherit (`crate::background`);
        // each commit's new indexing threads come from an index pass, already there.
        let writer = std::thread::scope(|scope| {
            let started = scope.spawn(|| {
                crate::background::lower_priority();
                index.writer_with_num_threads(WRITER_THREADS, WRITER_HEAP_BYTES)
            });
            started
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
        .map_err(|e| match e {
            tantivy::TantivyError::LockFailure(..) => Error::index(
                "keyword",
                format!(
                    "{} is already open by another keyword index (in this process or \
                     another one); close it first or use another data directory",
                    dir.display()
                ),
            ),
            other => other.into(),
        })?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let watermark = parse_watermark(index.load_metas()?.payload.as_deref())?;
        let mut fresh_from = 0;
        for segment in reader.searcher().segment_readers() {
            let ids = segment.fast_fields().u64(ID_FIELD)?;
            if segment.max_doc() > 0 {
                fresh_from = fresh_from.max(ids.max_value().saturating_add(1));
            }
        }
        Ok(KeywordIndex {
            dir: dir.to_path_buf(),
            reader,
            writer: Mutex::new(writer),
            tail: RwLock::new(Tail::default()),
            id_field,
            text_field,
            watermark: AtomicU64::new(watermark),
            fresh_from: AtomicU64::new(fresh_from),
            id_docs: Mutex::new(HashMap::new()),
        })
    }

    // A panic while holding a lock leaves nothing half-written that matters more than the
    // index itself, which is derived and rebuildable; so a poisoned lock is used as is.
    fn read_tail(&self) -> RwLockReadGuard<'_, Tail> {
        self.tail.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_tail(&self) -> RwLockWriteGuard<'_, Tail> {
        self.tail.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_writer(&self) -> MutexGuard<'_, IndexWriter> {
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stages `(id, text)` documents, replacing any earlier version of each id. They are
    /// searchable as soon as this returns; [`commit`](Self::commit) makes them durable.
    /// Within one call the last document for an id wins.
    pub fn upsert(&self, docs: &[(u32, String)]) {
        if docs.is_empty() {
            return;
        }
        // Analyse before taking the lock: searches and commits never wait for tokenising.
        let staged: Vec<(u32, StagedDoc)> = docs
            .iter()
            .map(|(id, text)| (*id, StagedDoc::new(text)))
            .collect();
        let mut tail = self.write_tail();
        for (id, doc) in staged {
            tail.stage(id, Some(doc));
        }
    }

    /// Stages the removal of `ids`: they disappear from search results at once and from
    /// the committed index at the next [`commit`](Self::commit). Unknown ids are ignored.
    pub fn remove(&self, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let mut tail = self.write_tail();
        for &id in ids {
            tail.stage(id, None);
        }
    }

    /// Number of staged (uncommitted) upserts and removals.
    pub fn pending(&self) -> usize {
        self.read_tail().len()
    }

    /// Writes every staged operation to tantivy and commits durably with `watermark` as the
    /// commit payload, then reloads the reader and drops the committed entries from the tail.
    /// Operations staged while the commit runs stay staged for the next one.
    ///
    /// On failure nothing is dropped from the tail and the writer is rolled back to the last
    /// commit, so retrying is always safe.
    pub fn commit(&self, watermark: u64) -> Result<()> {
        let mut writer = self.lock_writer();
        let (snapshot, snapshot_seq) = {
            let tail = self.read_tail();
            (tail.snapshot(), tail.next_seq())
        };
        if snapshot.is_empty() && watermark == self.watermark.load(AtomicOrdering::Acquire) {
            return Ok(());
        }
        let fresh_from = self.fresh_from.load(AtomicOrdering::Acquire);
        let written = (|| -> tantivy::Result<()> {
            for (id, _, text) in &snapshot {
                if u64::from(*id) < fresh_from {
                    writer.delete_term(Term::from_field_u64(self.id_field, u64::from(*id)));
                }
                if let Some(text) = text {
                    // One document per passage, all under the record's id: a deletion by
                    // id removes them together.
                    for range in split(text) {
                        let mut doc = TantivyDocument::new();
                        doc.add_u64(self.id_field, u64::from(*id));
                        doc.add_text(self.text_field, &text[range]);
                        writer.add_document(doc)?;
                    }
                }
            }
            let mut prepared = writer.prepare_commit()?;
            prepared.set_payload(&watermark.to_string());
            prepared.commit()?;
            Ok(())
        })();
        if let Err(e) = written {
            let rolled_back = writer.rollback();
            return Err(Error::index(
                "keyword",
                match rolled_back {
                    Ok(_) => format!("commit failed, staged writes kept for a retry: {e}"),
                    Err(r) => format!(
                        "commit failed ({e}) and so did the rollback ({r}); reopen the index"
                    ),
                },
            ));
        }
        self.watermark.store(watermark, AtomicOrdering::Release);
        if let Some(max) = snapshot.iter().map(|(id, _, _)| u64::from(*id)).max() {
            self.fresh_from.fetch_max(max + 1, AtomicOrdering::AcqRel);
        }
        let mut tail = self.write_tail();
        // If the reload fails the tail keeps its entries, which still shadow the stale
        // committed view, so searches stay right; the next commit reloads again.
        self.reader.reload()?;
        let committed = tail.drop_committed(&snapshot, snapshot_seq);
        // Freed once searches and staging writes may go on.
        drop(tail);
        drop(committed);
        Ok(())
    }

    /// The watermark of the last commit (0 for a new or cleared index): everything the store
    /// wrote up to it is in the committed index.
    pub fn watermark(&self) -> Result<u64> {
        Ok(self.watermark.load(AtomicOrdering::Acquire))
    }

    /// The `k` best documents for `query` by BM25, best first, as `(id, score)`; only ids in
    /// `candidates` when given. Staged documents are scored with the same statistics as
    /// committed ones (committed plus staged doc count, token count and document
    /// frequencies), so the two kinds of score compare directly.
    ///
    /// `query` is plain user text: it is analysed like the indexed text and its terms are
    /// OR-ed, so quotes, colons or brackets are just characters. A query without index terms
    /// (only stop words or punctuation) has no results.
    pub fn search(
        &self,
        query: &str,
        k: usize,
        candidates: Option<&RoaringBitmap>,
    ) -> Result<Vec<(u32, f32)>> {
        Ok(self.run(query, k, candidates, false, None, false)?.0)
    }

    /// [`search`](Self::search) within `scope`, and, when the scope is small enough to be
    /// looked up document by document (a session), the [`ScopeCounts`] that walk read on
    /// the way: every scope document's query-term counts and length, and the query's
    /// statistics. Recall's neighbouring-turn step needs exactly those for the turns around
    /// each hit, all of them in the scope, and would otherwise walk the same postings again.
    /// Records scoring the same as the `k`-th are returned too, so recall breaks those ties
    /// by time rather than by id.
    pub fn search_with_counts(
        &self,
        query: &str,
        k: usize,
        scope: &RoaringBitmap,
    ) -> Result<Counted> {
        self.run(query, k, Some(scope), true, None, true)
    }

    /// [`search`](Self::search) within `scope`, scored with `corpus` (statistics summed
    /// over several indexes by [`CorpusStats::add`]) instead of this index's own: each
    /// part of a namespace spread over several stores then scores its documents as one
    /// index holding all of them would. Records tied with the `k`-th are returned too.
    pub fn search_in_corpus(
        &self,
        query: &str,
        k: usize,
        scope: &RoaringBitmap,
        corpus: &CorpusStats,
    ) -> Result<Vec<(u32, f32)>> {
        Ok(self
            .run(query, k, Some(scope), false, Some(corpus), true)?
            .0)
    }

    /// This index's BM25 statistics for `query` (committed and staged documents): what
    /// [`search_in_corpus`](Self::search_in_corpus) needs summed over every part.
    pub fn corpus_stats(&self, query: &str) -> Result<CorpusStats> {
        let tail = self.read_tail();
        let searcher = self.reader.searcher();
        let stats = Stats::new(&searcher, &tail, self.text_field, None)?;
        let words = query_words(query);
        let doc_freq = words
            .iter()
            .map(|w| stats.doc_freq(&Term::from_field_text(self.text_field, w)))
            .collect::<tantivy::Result<Vec<_>>>()?;
        Ok(CorpusStats {
            docs: stats.docs,
            tokens: stats.tokens,
            words,
            doc_freq,
        })
    }

    fn run(
        &self,
        query: &str,
        k: usize,
        candidates: Option<&RoaringBitmap>,
        count: bool,
        corpus: Option<&CorpusStats>,
        ties: bool,
    ) -> Result<Counted> {
        if k == 0 || candidates.is_some_and(RoaringBitmap::is_empty) {
            return Ok((Vec::new(), None));
        }
        let words = query_words(query);
        if words.is_empty() {
            return Ok((Vec::new(), None));
        }

        let tail = self.read_tail();
        let searcher = self.reader.searcher();
        let stats = Stats::new(&searcher, &tail, self.text_field, corpus)?;
        if stats.docs == 0 {
            return Ok((Vec::new(), None));
        }
        let mut top = TopK::new(k, stats.docs, ties);
        let terms: Vec<Term> = words
            .iter()
            .map(|w| Term::from_field_text(self.text_field, w))
            .collect();

        if tail.live_docs() > 0 {
            score_tail(&tail, &stats, &words, &terms, candidates, &mut top)?;
        }
        let hidden = tail.staged_ids();
        if let Some(c) = candidates
            && c.len() <= SCOPED_LOOKUP_MAX
        {
            // A small scope (a session): look its docs up by id and score only them,
            // instead of scoring every doc that shares a query term and filtering. Each
            // term's postings seek by skip list from one scope doc to the next, where a
            // should-union's buffered seek would refill its window from every term (a
            // seventh of a session recall's CPU).
            let query_stats = query_stats_of(&stats, words)?;
            let mut counts = HashMap::new();
            if count {
                for id in c.iter().filter(|id| hidden.contains(*id)) {
                    if let Some(doc) = staged_counts(&tail, &query_stats, id) {
                        counts.insert(id, doc);
                    }
                }
            }
            let weights = terms
                .iter()
                .map(|t| Bm25Weight::for_terms(&stats, std::slice::from_ref(t)))
                .collect::<tantivy::Result<Vec<_>>>()?;
            for segment in searcher.segment_readers() {
                let docs = self.docs_of(
                    &searcher,
                    segment,
                    c.iter().filter(|id| !hidden.contains(*id)),
                )?;
                if docs.is_empty() {
                    continue;
                }
                let tf = self.term_freqs(segment, &terms, &docs)?;
                let norms = segment.get_fieldnorms_reader(self.text_field)?;
                for (&(doc, id), row) in docs.iter().zip(tf.chunks_exact(terms.len())) {
                    // Summed in term order, as tantivy's scorers would sum them. A long
                    // record has a document per passage and scores as its best.
                    let norm = norms.fieldnorm_id(doc);
                    let mut score = None::<Score>;
                    for (weight, &f) in weights.iter().zip(row) {
                        if f > 0 {
                            score = Some(score.unwrap_or(0.0) + weight.score(norm, f));
                        }
                    }
                    if let Some(score) = score {
                        top.push(score, id);
                    }
                    if count {
                        counts.entry(id).or_insert_with(Vec::new).push(TermCounts {
                            len: norms.fieldnorm(doc),
                            tf: row.to_vec(),
                        });
                    }
                }
            }
            let counts = count.then_some(ScopeCounts {
                stats: query_stats,
                counts,
            });
            return Ok((top.into_sorted(), counts));
        }
        if searcher.num_docs() > 0 {
            let scoring = EnableScoring::enabled_from_statistics_provider(&stats, &searcher);
            let query = BooleanQuery::new(
                terms
                    .into_iter()
                    .map(|t| {
                        let q: Box<dyn Query> =
                            Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs));
                        (Occur::Should, q)
                    })
                    .collect(),
            );
            let weight = query.weight(scoring)?;
            for segment in searcher.segment_readers() {
                let ids = segment.fast_fields().u64(ID_FIELD)?;
                let alive = segment.alive_bitset();
                // Filtering inside the pruning loop keeps block-WAND's skipping for whatever
                // the filter lets through, and a filtered doc never raises the threshold.
                weight.for_each_pruning(top.threshold(), segment, &mut |doc, score| {
                    let visible = !alive.is_some_and(|a| a.is_deleted(doc));
                    if let Some(id) = ids.first(doc).and_then(|id| u32::try_from(id).ok())
                        && visible
                        && !hidden.contains(id)
                        && candidates.is_none_or(|c| c.contains(id))
                    {
                        top.push(score, id);
                    }
                    top.threshold()
                })?;
            }
        }
        Ok((top.into_sorted(), None))
    }

    /// Each of `terms`' frequency in each of `docs` (sorted by doc) in one segment, as a
    /// row per doc: every term's postings walked once, seeking from one doc to the next.
    fn term_freqs(
        &self,
        segment: &SegmentReader,
        terms: &[Term],
        docs: &[(DocId, u32)],
    ) -> Result<Vec<u32>> {
        let mut tf = vec![0u32; docs.len() * terms.len()];
        let text_index = segment.inverted_index(self.text_field)?;
        for (i, term) in terms.iter().enumerate() {
            let Some(mut postings) = text_index
                .read_postings(term, IndexRecordOption::WithFreqs)
                .map_err(|e| Error::index("keyword", e))?
            else {
                continue;
            };
            for (j, (doc, _)) in docs.iter().enumerate() {
                if postings.doc() < *doc {
                    postings.seek(*doc);
                }
                if postings.doc() == tantivy::TERMINATED {
                    break;
                }
                if postings.doc() == *doc {
                    tf[j * terms.len() + i] = postings.term_freq();
                }
            }
        }
        Ok(tf)
    }

    /// What scoring a text outside the index needs, for `query`: the document count, the
    /// mean document length in terms, and each distinct query term with its BM25 idf, all
    /// from the same statistics [`search`](Self::search) scores with. Recall uses it to
    /// score a record together with its neighbours' words.
    pub fn query_stats(&self, query: &str) -> Result<QueryStats> {
        let tail = self.read_tail();
        let searcher = self.reader.searcher();
        let stats = Stats::new(&searcher, &tail, self.text_field, None)?;
        query_stats_of(&stats, query_words(query))
    }

    /// The [`TermCounts`] of every document of each of `ids` (a long record has one per
    /// passage, in no particular order; an id the index does not hold is absent), for the
    /// terms of `stats`. Recall reads a keyword hit together with its neighbouring turns:
    /// their query-term frequencies and lengths come from the postings and field norms the
    /// index already holds, where analysing each neighbour's text again would cost three
    /// quarters of that step.
    pub fn term_counts(
        &self,
        stats: &QueryStats,
        ids: &[u32],
    ) -> Result<HashMap<u32, Vec<TermCounts>>> {
        let mut out: HashMap<u32, Vec<TermCounts>> = HashMap::with_capacity(ids.len());
        let tail = self.read_tail();
        let searcher = self.reader.searcher();
        let hidden = tail.staged_ids();
        for &id in ids.iter().filter(|id| hidden.contains(**id)) {
            if let Some(counts) = staged_counts(&tail, stats, id) {
                out.insert(id, counts);
            }
        }
        let terms: Vec<Term> = stats
            .terms
            .iter()
            .map(|(t, _)| Term::from_field_text(self.text_field, t))
            .collect();
        for segment in searcher.segment_readers() {
            let docs = self.docs_of(
                &searcher,
                segment,
                ids.iter().copied().filter(|id| !hidden.contains(*id)),
            )?;
            if docs.is_empty() {
                continue;
            }
            let norms = segment.get_fieldnorms_reader(self.text_field)?;
            let tf = self.term_freqs(segment, &terms, &docs)?;
            for ((doc, id), row) in docs.into_iter().zip(tf.chunks_exact(terms.len().max(1))) {
                out.entry(id).or_default().push(TermCounts {
                    len: norms.fieldnorm(doc),
                    tf: row[..terms.len()].to_vec(),
                });
            }
        }
        Ok(out)
    }

    /// The live documents of `ids` in one segment, as (doc, id) in doc order: a record's
    /// documents (one per passage) are found in the segment's id table.
    fn docs_of(
        &self,
        searcher: &Searcher,
        segment: &SegmentReader,
        ids: impl Iterator<Item = u32>,
    ) -> Result<Vec<(DocId, u32)>> {
        let table = self.id_table(searcher, segment)?;
        let alive = segment.alive_bitset();
        let mut docs = Vec::new();
        for id in ids {
            let from = table.partition_point(|&(i, _)| i < id);
            for &(_, doc) in table[from..].iter().take_while(|&&(i, _)| i == id) {
                if !alive.is_some_and(|a| a.is_deleted(doc)) {
                    docs.push((doc, id));
                }
            }
        }
        docs.sort_unstable();
        Ok(docs)
    }

    /// `segment`'s (id, doc) table, read from its `id` fast field the first time it is
    /// asked for. Tables of segments `searcher` no longer holds (merged away, or cleared)
    /// are dropped then.
    fn id_table(&self, searcher: &Searcher, segment: &SegmentReader) -> Result<IdTable> {
        let key = segment.segment_id();
        let mut tables = self.id_docs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = tables.get(&key) {
            return Ok(Arc::clone(t));
        }
        let ids = segment.fast_fields().u64(ID_FIELD)?;
        let mut table: Vec<(u32, DocId)> = (0..segment.max_doc())
            .filter_map(|doc| Some((u32::try_from(ids.first(doc)?).ok()?, doc)))
            .collect();
        table.sort_unstable();
        let table: IdTable = table.into();
        let live: Vec<SegmentId> = searcher
            .segment_readers()
            .iter()
            .map(|s| s.segment_id())
            .collect();
        tables.retain(|id, _| live.contains(id));
        tables.insert(key, Arc::clone(&table));
        Ok(table)
    }

    /// Number of searchable documents: committed ones not shadowed by the tail, plus staged
    /// upserts.
    pub fn len(&self) -> Result<u64> {
        let tail = self.read_tail();
        let searcher = self.reader.searcher();
        let committed = searcher.num_docs();
        let shadowed = if tail.len() == 0 || committed == 0 {
            0
        } else {
            let terms = tail
                .staged_ids()
                .iter()
                .map(|id| Term::from_field_u64(self.id_field, u64::from(id)));
            searcher.search(&TermSetQuery::new(terms), &Count)? as u64
        };
        Ok(committed - shadowed + tail.live_docs())
    }

    /// Whether no document is searchable.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Deletes every document, committed and staged, and commits with watermark 0, so a
    /// `reindex` that crashes half-way starts again from the beginning. Operations staged
    /// while the clear runs survive it.
    pub fn clear(&self) -> Result<()> {
        let mut writer = self.lock_writer();
        let upto = self.read_tail().next_seq();
        let cleared = (|| -> tantivy::Result<()> {
            writer.delete_all_documents()?;
            let mut prepared = writer.prepare_commit()?;
            prepared.set_payload("0");
            prepared.commit()?;
            Ok(())
        })();
        if let Err(e) = cleared {
            let _ = writer.rollback();
            return Err(Error::index(
                "keyword",
                format!("clearing the index failed, nothing was deleted: {e}"),
            ));
        }
        self.watermark.store(0, AtomicOrdering::Release);
        self.fresh_from.store(0, AtomicOrdering::Release);
        let mut tail = self.write_tail();
        self.reader.reload()?;
        tail.drop_before(upto);
        Ok(())
    }

    /// The directory this index lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Corpus statistics of one query (see [`KeywordIndex::query_stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueryStats {
    /// Searchable documents.
    pub docs: u64,
    /// Mean document length, in analysed terms.
    pub mean_len: f32,
    /// Each distinct analysed query term and its idf.
    pub terms: Vec<(String, f32)>,
}

/// BM25's corpus statistics for one query, from one index ([`KeywordIndex::corpus_stats`])
/// or summed over several ([`CorpusStats::add`]): what scores a document the same in
/// whichever index holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusStats {
    /// Documents (tantivy counts deleted ones until a merge).
    pub docs: u64,
    /// Tokens of the text field.
    pub tokens: u64,
    /// The query's distinct analysed terms, sorted.
    pub words: Vec<String>,
    /// Each word's document frequency.
    pub doc_freq: Vec<u64>,
}

impl CorpusStats {
    /// Adds another index's statistics for the same query.
    pub fn add(&mut self, other: &CorpusStats) {
        if self.words.is_empty() && self.docs == 0 {
            self.words.clone_from(&other.words);
            self.doc_freq = vec![0; other.words.len()];
        }
        self.docs += other.docs;
        self.tokens += other.tokens;
        for (mine, theirs) in self.doc_freq.iter_mut().zip(&other.doc_freq) {
            *mine += theirs;
        }
    }

    /// The [`QueryStats`] these statistics give: what recall's neighbouring-turn step
    /// scores with.
    pub fn query_stats(&self) -> QueryStats {
        QueryStats {
            docs: self.docs,
            mean_len: if self.docs == 0 {
                0.0
            } else {
                self.tokens as f32 / self.docs as f32
            },
            terms: self
                .words
                .iter()
                .zip(&self.doc_freq)
                .map(|(w, &n)| (w.clone(), bm25_idf(n, self.docs)))
                .collect(),
        }
    }

    fn doc_freq_of(&self, word: &str) -> Option<u64> {
        let i = self.words.binary_search_by(|w| w.as_str().cmp(word)).ok()?;
        self.doc_freq.get(i).copied()
    }
}

/// What [`KeywordIndex::search_with_counts`] read of a small scope besides its hits.
#[derive(Debug, Clone, Default)]
pub struct ScopeCounts {
    /// The query's statistics, as [`KeywordIndex::query_stats`] gives them.
    pub stats: QueryStats,
    counts: HashMap<u32, Vec<TermCounts>>,
}

impl ScopeCounts {
    /// What [`KeywordIndex::term_counts`] answers for `ids`, from what the search read: an
    /// id outside the scope (or not in the index) is absent.
    pub fn term_counts(&self, ids: &[u32]) -> HashMap<u32, Vec<TermCounts>> {
        ids.iter()
            .filter_map(|id| Some((*id, self.counts.get(id)?.clone())))
            .collect()
    }
}

/// One document's length and how often each query term occurs in it, in the order of
/// [`QueryStats::terms`]: all that BM25 needs of a text, read from the index instead of
/// analysing the text again (see [`KeywordIndex::term_counts`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TermCounts {
    /// The document's length in analysed terms, as tantivy's field norm holds it (exact up
    /// to 40 terms, then rounded to a few per cent).
    pub len: u32,
    /// Each query term's frequency.
    pub tf: Vec<u32>,
}

impl TermCounts {
    /// The counts of an already analysed text, with its length rounded as the index rounds
    /// it, so a text scores the same whether or not it came from the index (for tests:
    /// recall reads counts from the index).
    #[cfg(test)]
    pub fn of(stats: &QueryStats, terms: &[String]) -> Self {
        TermCounts {
            len: quantised_len(u32::try_from(terms.len()).unwrap_or(u32::MAX)),
            tf: stats
                .terms
                .iter()
                .map(|(t, _)| terms.iter().filter(|x| *x == t).count() as u32)
                .collect(),
        }
    }
}

/// `len` as tantivy's one-byte field norm stores it.
fn quantised_len(len: u32) -> u32 {
    FieldNormReader::id_to_fieldnorm(FieldNormReader::fieldnorm_to_id(len))
}

/// BM25's idf, as tantivy computes it: `ln(1 + (N − n + 0.5) / (n + 0.5))`.
pub fn bm25_idf(doc_freq: u64, docs: u64) -> f32 {
    let n = doc_freq.min(docs) as f32;
    (1.0 + (docs as f32 - n + 0.5) / (n + 0.5)).ln()
}

/// BM25 statistics of the committed index plus the staged tail, so both are scored alike;
/// or, when a corpus is given, that corpus's (several indexes' sums).
struct Stats<'a> {
    searcher: &'a Searcher,
    tail: &'a Tail,
    text_field: Field,
    corpus: Option<&'a CorpusStats>,
    /// Committed documents (tantivy counts deleted ones until a merge) plus staged ones.
    docs: u64,
    /// Tokens of the text field, committed plus staged.
    tokens: u64,
}

impl<'a> Stats<'a> {
    fn new(
        searcher: &'a Searcher,
        tail: &'a Tail,
        text_field: Field,
        corpus: Option<&'a CorpusStats>,
    ) -> Result<Self> {
        let (docs, tokens) = match corpus {
            Some(c) => (c.docs, c.tokens),
            None => (
                Bm25StatisticsProvider::total_num_docs(searcher)? + tail.live_docs(),
                Bm25StatisticsProvider::total_num_tokens(searcher, text_field)?
                    + tail.total_tokens(),
            ),
        };
        Ok(Stats {
            searcher,
            tail,
            text_field,
            corpus,
            docs,
            tokens,
        })
    }
}

impl Bm25StatisticsProvider for Stats<'_> {
    fn total_num_tokens(&self, field: Field) -> tantivy::Result<u64> {
        if field == self.text_field {
            Ok(self.tokens)
        } else {
            Bm25StatisticsProvider::total_num_tokens(self.searcher, field)
        }
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self.docs)
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        if let Some(c) = self.corpus
            && term.field() == self.text_field
            && let Some(n) = term.value().as_str().and_then(|t| c.doc_freq_of(t))
        {
            return Ok(n);
        }
        let committed = self.searcher.doc_freq(term)?;
        let staged = if term.field() == self.text_field {
            term.value().as_str().map_or(0, |t| self.tail.doc_freq(t))
        } else {
            0
        };
        Ok(committed + staged)
    }
}

/// Scores the staged documents that contain at least one query term, exactly as tantivy's
/// `TermQuery` scores committed ones: same weights, same quantised field norms.
/// A query's distinct analysed terms, sorted (a repeated query word is not more important
/// than a single one; over-long tokens are never indexed).
fn query_words(query: &str) -> Vec<String> {
    let mut words = analyze(query);
    words.retain(|w| w.len() <= MAX_TOKEN_LEN);
    words.sort_unstable();
    words.dedup();
    words
}

/// The [`QueryStats`] of `words` under `stats`.
fn query_stats_of(stats: &Stats<'_>, words: Vec<String>) -> Result<QueryStats> {
    let docs = stats.docs;
    let mut terms = Vec::with_capacity(words.len());
    for w in words {
        let n = stats.doc_freq(&Term::from_field_text(stats.text_field, &w))?;
        terms.push((w, bm25_idf(n, docs)));
    }
    Ok(QueryStats {
        docs,
        mean_len: if docs == 0 {
            0.0
        } else {
            stats.tokens as f32 / docs as f32
        },
        terms,
    })
}

/// A staged record's [`TermCounts`], from the tail's own analysis, its length rounded as a
/// commit would round it.
fn staged_counts(tail: &Tail, stats: &QueryStats, id: u32) -> Option<Vec<TermCounts>> {
    let doc = tail.doc(id)?;
    Some(
        doc.passages
            .iter()
            .map(|p| TermCounts {
                len: quantised_len(p.num_tokens),
                tf: stats.terms.iter().map(|(t, _)| p.term_freq(t)).collect(),
            })
            .collect(),
    )
}

fn score_tail(
    tail: &Tail,
    stats: &Stats<'_>,
    words: &[String],
    terms: &[Term],
    candidates: Option<&RoaringBitmap>,
    top: &mut TopK,
) -> Result<()> {
    let mut weights: Vec<(&str, Bm25Weight)> = Vec::with_capacity(words.len());
    let mut matching = RoaringBitmap::new();
    for (word, term) in words.iter().zip(terms) {
        if let Some(ids) = tail.postings(word) {
            matching |= ids;
            weights.push((
                word,
                Bm25Weight::for_terms(stats, std::slice::from_ref(term))?,
            ));
        }
    }
    if let Some(candidates) = candidates {
        matching &= candidates;
    }
    for id in &matching {
        let Some(doc) = tail.doc(id) else { continue };
        // A record scores as its best passage.
        let best = doc
            .passages
            .iter()
            .map(|p| {
                let norm = FieldNormReader::fieldnorm_to_id(p.num_tokens);
                weights
                    .iter()
                    .map(|(word, weight)| match p.term_freq(word) {
                        0 => 0.0,
                        tf => weight.score(norm, tf),
                    })
                    .sum::<Score>()
            })
            .fold(None, |best: Option<Score>, s| {
                Some(best.map_or(s, |b| b.max(s)))
            });
        if let Some(score) = best.filter(|s| *s > 0.0) {
            top.push(score, id);
        }
    }
    Ok(())
}

/// A scored id; greater means better (higher score, then lower id).
#[derive(Clone, Copy, Debug)]
struct Hit {
    score: Score,
    id: u32,
}

impl Ord for Hit {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.id.cmp(&self.id))
    }
}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Hit {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Hit {}

/// The `k` best records seen so far, each once at its best score (a long record has a
/// document per passage), ordered so the worst is the one to beat: it gives block-WAND an
/// exact threshold after every push. With `ties`, records scoring the same as the `k`-th
/// are kept too, so a caller can break the tie by something other than the id (recall
/// breaks it by time, the same in one store and in several).
struct TopK {
    k: usize,
    hits: BTreeSet<Hit>,
    best: HashMap<u32, Score>,
    /// Records left out of `hits` that score the same as its worst (with `ties`).
    tied: Option<HashMap<u32, Score>>,
}

impl TopK {
    fn new(k: usize, docs: u64, ties: bool) -> Self {
        // `k` comes from the caller and may be huge; never reserve more than can be found.
        let capacity = k.min(usize::try_from(docs).unwrap_or(usize::MAX));
        TopK {
            k,
            hits: BTreeSet::new(),
            best: HashMap::with_capacity(capacity),
            tied: ties.then(HashMap::new),
        }
    }

    /// The score a new hit must exceed to enter (keeping ties: to equal).
    fn threshold(&self) -> Score {
        match self.hits.first() {
            Some(worst) if self.hits.len() >= self.k => match self.tied {
                Some(_) => worst.score.next_down(),
                None => worst.score,
            },
            _ => Score::MIN,
        }
    }

    fn push(&mut self, score: Score, id: u32) {
        if self.k == 0 {
            return;
        }
        if let Some(tied) = &mut self.tied
            && let Some(&old) = tied.get(&id)
        {
            if score <= old {
                return;
            }
            tied.remove(&id);
        }
        let hit = Hit { score, id };
        let mut out = None;
        if let Some(&old) = self.best.get(&id) {
            if score <= old {
                return;
            }
            self.hits.remove(&Hit { score: old, id });
        } else if self.hits.len() >= self.k {
            match self.hits.first() {
                Some(worst) if hit > *worst => {
                    let worst = *worst;
                    self.hits.remove(&worst);
                    self.best.remove(&worst.id);
                    out = Some(worst);
                }
                Some(worst) if score == worst.score => {
                    if let Some(tied) = &mut self.tied {
                        tied.insert(id, score);
                    }
                    return;
                }
                _ => return,
            }
        }
        self.hits.insert(hit);
        self.best.insert(id, score);
        // Ties are kept only with the set's worst: what left the set for a better hit, or
        // was tied with a worst that rose, stays only while it scores the same.
        if let Some(tied) = &mut self.tied
            && self.hits.len() >= self.k
            && let Some(worst) = self.hits.first().map(|w| w.score)
        {
            if let Some(out) = out {
                tied.insert(out.id, out.score);
            }
            tied.retain(|_, s| *s == worst);
        }
    }

    /// Best first (ties: lower id first), with the records tied with the `k`-th.
    fn into_sorted(self) -> Vec<(u32, f32)> {
        let mut out: Vec<(u32, f32)> = self
            .hits
            .into_iter()
            .map(|hit| (hit.id, hit.score))
            .chain(self.tied.into_iter().flatten())
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }
}

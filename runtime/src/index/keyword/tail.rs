//! The staged tail of the keyword index: upserts and removals that are searchable at once but
//! not yet committed to tantivy (a long record as one document per passage, as committed), with the statistics BM25 needs (doc count, token count,
//! document frequency per term) kept incrementally so a query never rescans the tail.
//!
//! It owns only in-memory state. It must never touch tantivy's files, and it must never count
//! a term differently from the index: every term comes from [`crate::index::text::analyze`], minus
//! the over-long tokens tantivy's indexer drops.

use std::collections::HashMap;
use std::sync::Arc;

use roaring::RoaringBitmap;
use tantivy::tokenizer::MAX_TOKEN_LEN;

use crate::index::passage::split;
use crate::index::text::analyze;

/// One staged record, analysed once at upsert time: one document per passage (a text that
/// is not long is one passage), as the committed index holds it.
pub(super) struct StagedDoc {
    /// The text, shared with the commit snapshot so committing never copies it again.
    pub(super) text: Arc<str>,
    /// Its passages' documents, in order.
    pub(super) passages: Box<[PassageDoc]>,
}

/// One passage's document.
pub(super) struct PassageDoc {
    /// Tokens in the document: tantivy's field norm before quantisation.
    pub(super) num_tokens: u32,
    /// Distinct terms with their frequency, sorted by term for binary search.
    terms: Box<[(Arc<str>, u32)]>,
}

impl PassageDoc {
    fn new(text: &str) -> Self {
        let mut tokens = analyze(text);
        // tantivy's postings writer silently drops such tokens; so must we, or the field
        // norms of the tail and the committed index would disagree.
        tokens.retain(|t| t.len() <= MAX_TOKEN_LEN);
        let num_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        tokens.sort_unstable();
        let mut terms: Vec<(Arc<str>, u32)> = Vec::new();
        for token in tokens {
            match terms.last_mut() {
                Some((last, n)) if **last == *token => *n += 1,
                _ => terms.push((Arc::from(token), 1)),
            }
        }
        PassageDoc {
            num_tokens,
            terms: terms.into_boxed_slice(),
        }
    }

    /// How often `term` occurs in the passage (0 when absent).
    pub(super) fn term_freq(&self, term: &str) -> u32 {
        self.terms
            .binary_search_by(|(t, _)| (**t).cmp(term))
            .map_or(0, |i| self.terms[i].1)
    }
}

impl StagedDoc {
    /// Splits `text` into passages and analyses each with the shared analyzer.
    pub(super) fn new(text: &str) -> Self {
        let passages = split(text)
            .into_iter()
            .map(|r| PassageDoc::new(&text[r]))
            .collect();
        StagedDoc {
            text: Arc::from(text),
            passages,
        }
    }

    fn num_tokens(&self) -> u64 {
        self.passages.iter().map(|p| u64::from(p.num_tokens)).sum()
    }
}

/// A staged operation: `doc` is `Some` for an upsert and `None` for a removal.
pub(super) struct Staged {
    /// Stage order; a commit drops only the entries it saw, by matching this number.
    pub(super) seq: u64,
    /// The new document, or `None` when the id is being removed.
    pub(super) doc: Option<StagedDoc>,
}

/// What a commit writes: `(id, seq, text)`, `text` being `None` for a removal.
pub(super) type Snapshot = Vec<(u32, u64, Option<Arc<str>>)>;

/// Staged operations with their BM25 statistics.
#[derive(Default)]
pub(super) struct Tail {
    next_seq: u64,
    entries: HashMap<u32, Staged>,
    /// Every id with an entry: their committed versions are stale and must stay hidden.
    staged: RoaringBitmap,
    /// Term -> the staged records containing it, and how many staged (passage) documents
    /// do: the tail's document frequency.
    postings: HashMap<Arc<str>, (RoaringBitmap, u64)>,
    live_docs: u64,
    total_tokens: u64,
}

impl Tail {
    /// Stages `doc` (or a removal) for `id`, replacing whatever was staged for it.
    pub(super) fn stage(&mut self, id: u32, doc: Option<StagedDoc>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(old) = self.entries.remove(&id) {
            self.unaccount(id, old.doc.as_ref());
        }
        self.insert(id, Staged { seq, doc });
    }

    /// Adds an entry for an id that has none, counting its document.
    fn insert(&mut self, id: u32, mut staged: Staged) {
        if let Some(doc) = &mut staged.doc {
            self.live_docs += doc.passages.len() as u64;
            self.total_tokens += doc.num_tokens();
            for passage in doc.passages.iter_mut() {
                for (term, _) in passage.terms.iter_mut() {
                    // Interned: a term the tail already holds is shared, not kept once per
                    // document (a large unbuilt tail is mostly the same few thousand words).
                    if let Some((shared, _)) = self.postings.get_key_value(&**term) {
                        *term = shared.clone();
                    }
                    let (ids, docs) = self.postings.entry(term.clone()).or_default();
                    ids.insert(id);
                    *docs += 1;
                }
            }
        }
        self.staged.insert(id);
        self.entries.insert(id, staged);
    }

    fn unaccount(&mut self, id: u32, doc: Option<&StagedDoc>) {
        let Some(doc) = doc else { return };
        self.live_docs -= doc.passages.len() as u64;
        self.total_tokens -= doc.num_tokens();
        for passage in doc.passages.iter() {
            for (term, _) in passage.terms.iter() {
                if let Some((ids, docs)) = self.postings.get_mut(&**term) {
                    ids.remove(id);
                    *docs -= 1;
                    if *docs == 0 {
                        self.postings.remove(&**term);
                    }
                }
            }
        }
    }

    /// Removes `id`'s entry if it is still the one staged as `seq` (a newer one stays).
    fn unstage_if(&mut self, id: u32, seq: u64) {
        if self.entries.get(&id).is_some_and(|e| e.seq == seq) {
            if let Some(old) = self.entries.remove(&id) {
                self.unaccount(id, old.doc.as_ref());
            }
            self.staged.remove(id);
        }
        if self.entries.is_empty() {
            self.reset();
        }
    }

    /// Drops the entries a commit wrote, unless they were re-staged since the snapshot,
    /// which was taken when [`next_seq`](Self::next_seq) was `snapshot_seq`. Returns what
    /// was dropped, for the caller to free after it lets go of the tail's lock.
    ///
    /// It runs under the lock every search and every staging write waits for, so it costs
    /// what the smaller side costs: when most of the tail was committed (the usual case: a
    /// commit takes a fraction of a second, the tail holds up to its threshold) the tail is
    /// rebuilt from the entries staged since, instead of unaccounting every committed entry
    /// term by term, which for a large batch would stall recalls and writes for tens of
    /// milliseconds.
    pub(super) fn drop_committed(&mut self, snapshot: &Snapshot, snapshot_seq: u64) -> Tail {
        let later: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, e)| e.seq >= snapshot_seq)
            .map(|(id, _)| *id)
            .collect();
        if later.len() * 2 < self.entries.len() {
            let mut old = std::mem::replace(
                self,
                Tail {
                    next_seq: self.next_seq,
                    ..Tail::default()
                },
            );
            for id in later {
                if let Some(staged) = old.entries.remove(&id) {
                    self.insert(id, staged);
                }
            }
            return old;
        }
        for &(id, seq, _) in snapshot {
            self.unstage_if(id, seq);
        }
        Tail::default()
    }

    /// Drops every entry staged before `seq` (what a `clear` has wiped).
    pub(super) fn drop_before(&mut self, seq: u64) {
        let old: Vec<(u32, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.seq < seq)
            .map(|(id, e)| (*id, e.seq))
            .collect();
        for (id, seq) in old {
            self.unstage_if(id, seq);
        }
    }

    /// Forgets everything but keeps counting sequence numbers, and gives a large batch's
    /// memory back once it is committed.
    fn reset(&mut self) {
        *self = Tail {
            next_seq: self.next_seq,
            ..Tail::default()
        };
    }

    /// Every staged operation, for a commit to write.
    pub(super) fn snapshot(&self) -> Snapshot {
        self.entries
            .iter()
            .map(|(id, e)| (*id, e.seq, e.doc.as_ref().map(|d| d.text.clone())))
            .collect()
    }

    /// The sequence number the next staged entry will get.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Number of staged operations (upserts and removals).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Ids whose committed version must be hidden.
    pub(super) fn staged_ids(&self) -> &RoaringBitmap {
        &self.staged
    }

    /// Staged documents (upserts only).
    pub(super) fn live_docs(&self) -> u64 {
        self.live_docs
    }

    /// Tokens over all staged documents.
    pub(super) fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// Staged records containing `term`.
    pub(super) fn postings(&self, term: &str) -> Option<&RoaringBitmap> {
        self.postings.get(term).map(|(ids, _)| ids)
    }

    /// Number of staged (passage) documents containing `term`.
    pub(super) fn doc_freq(&self, term: &str) -> u64 {
        self.postings.get(term).map_or(0, |(_, docs)| *docs)
    }

    /// The staged document for `id`, if `id` is staged as an upsert.
    pub(super) fn doc(&self, id: u32) -> Option<&StagedDoc> {
        self.entries.get(&id).and_then(|e| e.doc.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index term of one word under whatever analyzer `text` ships.
    fn term(word: &str) -> String {
        analyze(word).pop().expect("test words are not stop words")
    }

    fn tokens(text: &str) -> u64 {
        analyze(text).len() as u64
    }

    #[test]
    fn statistics_follow_replacements_and_removals() {
        let mut tail = Tail::default();
        tail.stage(1, Some(StagedDoc::new("alpha beta beta")));
        tail.stage(2, Some(StagedDoc::new("beta gamma")));
        assert_eq!(tail.live_docs(), 2);
        assert_eq!(tail.total_tokens(), tokens("alpha beta beta beta gamma"));
        assert_eq!(tail.doc_freq(&term("beta")), 2);
        assert_eq!(
            tail.doc(1).map(|d| d.passages[0].term_freq(&term("beta"))),
            Some(2)
        );

        tail.stage(1, Some(StagedDoc::new("delta")));
        assert_eq!(tail.live_docs(), 2);
        assert_eq!(tail.total_tokens(), tokens("delta beta gamma"));
        assert_eq!(tail.doc_freq(&term("beta")), 1);
        assert_eq!(tail.doc_freq(&term("alpha")), 0);

        tail.stage(2, None);
        assert_eq!(tail.live_docs(), 1);
        assert_eq!(tail.doc_freq(&term("gamma")), 0);
        assert_eq!(tail.len(), 2, "a removal stays staged until committed");
        assert!(tail.staged_ids().contains(2));
    }

    #[test]
    fn drop_committed_keeps_entries_restaged_after_the_snapshot() {
        let mut tail = Tail::default();
        tail.stage(1, Some(StagedDoc::new("quokka")));
        tail.stage(2, Some(StagedDoc::new("platypus")));
        let (snapshot, seq) = (tail.snapshot(), tail.next_seq());
        tail.stage(1, Some(StagedDoc::new("wombat")));
        drop(tail.drop_committed(&snapshot, seq));
        assert_eq!(tail.len(), 1);
        assert_eq!(tail.doc_freq(&term("wombat")), 1);
        assert_eq!(tail.doc_freq(&term("quokka")), 0);
        assert_eq!(tail.doc_freq(&term("platypus")), 0);
        assert!(tail.staged_ids().contains(1));
        assert!(!tail.staged_ids().contains(2));
        assert_eq!(tail.total_tokens(), tokens("wombat"));

        let (snapshot, seq) = (tail.snapshot(), tail.next_seq());
        drop(tail.drop_committed(&snapshot, seq));
        assert_eq!(tail.len(), 0);
        assert_eq!(tail.live_docs(), 0);
        assert_eq!(tail.total_tokens(), 0);
        assert!(tail.staged_ids().is_empty());
        assert_eq!(tail.next_seq(), seq, "sequence numbers never go back");
    }

    /// A commit of most of the tail leaves exactly what a tail that staged only the later
    /// entries would hold (the rebuild path of `drop_committed`).
    #[test]
    fn a_mostly_committed_tail_is_rebuilt_from_what_came_later() {
        let words = ["quokka", "wombat", "platypus", "echidna", "dingo"];
        let mut tail = Tail::default();
        for id in 0..20u32 {
            let text = format!(
                "{} {}",
                words[id as usize % 5],
                words[(id as usize + 1) % 5]
            );
            tail.stage(id, Some(StagedDoc::new(&text)));
        }
        let (snapshot, seq) = (tail.snapshot(), tail.next_seq());
        tail.stage(3, Some(StagedDoc::new("kangaroo wombat")));
        tail.stage(7, None);
        tail.stage(40, Some(StagedDoc::new("wombat wombat dingo")));
        let dropped = tail.drop_committed(&snapshot, seq);
        assert_eq!(
            dropped.len(),
            18,
            "the committed entries are handed back to free"
        );

        let mut fresh = Tail::default();
        fresh.stage(3, Some(StagedDoc::new("kangaroo wombat")));
        fresh.stage(7, None);
        fresh.stage(40, Some(StagedDoc::new("wombat wombat dingo")));
        assert_eq!(tail.len(), 3);
        assert_eq!(tail.live_docs(), fresh.live_docs());
        assert_eq!(tail.total_tokens(), fresh.total_tokens());
        assert_eq!(tail.staged_ids(), fresh.staged_ids());
        for word in words.iter().chain(&["kangaroo"]) {
            let t = term(word);
            assert_eq!(tail.doc_freq(&t), fresh.doc_freq(&t), "{word}");
            assert_eq!(tail.postings(&t), fresh.postings(&t), "{word}");
        }
        assert_eq!(tail.next_seq(), seq + 3, "sequence numbers never go back");
        assert_eq!(
            tail.doc(40)
                .map(|d| d.passages[0].term_freq(&term("wombat"))),
            Some(2)
        );
    }
}

//! Retrieval evaluations that run through the real recall path (ingest into a substrate,
//! ask through [`crate::Substrate::recall`]). Data sets are read from files the
//! caller names; nothing is bundled or downloaded.
//!
//! One harness for every data set: [`locomo`] and [`beam`] load their files into
//! [`Conversation`]s (turns with their ids, questions with the ids of their evidence);
//! [`ingest`] records each conversation as one session and waits until every record is
//! embedded, and [`ask`] asks every question twice (once per policy to compare): through recall, and through plain BM25 over the same
//! analysed text and the same session ([`crate::Substrate::bm25`]) — the anchor every
//! figure is printed beside — and through BM25 over whole turns ([`WholeBm25`]).

pub mod beam;
pub mod locomo;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::engine::{RecallRequest, Substrate};
use crate::error::{Error, Result};
use crate::index::keyword::bm25_idf;
use crate::index::text::analyze;
use crate::internals::Queue;
use crate::model::{MemoryId, NewMemory};
use crate::retrieval::Scope;

/// One turn of a conversation.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Its id in the data set (LoCoMo's `dia_id`, BEAM's message id), which evidence names.
    pub id: String,
    /// The text recorded.
    pub text: String,
    /// Its event time.
    pub time: Timestamp,
}

/// One question with its evidence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Question {
    /// Index in the data set's question list.
    pub qa_index: usize,
    /// The question.
    pub question: String,
    /// Its group: LoCoMo's category (`"1"`…`"5"`), BEAM's ability.
    pub group: String,
    /// Evidence turn ids that exist in the conversation.
    pub evidence: Vec<String>,
}

/// One conversation of a data set, as loaded.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Position in the data set (LoCoMo: 0-based in the file; BEAM: the chat's number).
    pub index: usize,
    /// Used as the session id.
    pub sample_id: String,
    /// Turns in order.
    pub turns: Vec<Turn>,
    /// Questions with evidence.
    pub questions: Vec<Question>,
}

/// What a data set's figures look like.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The headline row's name (`cats 1-4`).
    pub headline: &'static str,
    /// Groups left out of the headline (LoCoMo's adversarial questions).
    pub outside_headline: &'static [&'static str],
    /// The two halves by conversation index (inclusive), reported apart: on LoCoMo the
    /// first is where defaults were tuned and the second is held out; on BEAM neither was
    /// tuned on.
    pub halves: [(usize, usize); 2],
    /// A group's name in the table (`1 multi-hop`).
    pub label: fn(&str) -> String,
}

/// Recall figures for a group of questions.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Figures {
    /// Questions counted.
    pub questions: usize,
    /// Mean recall@k per k.
    pub recall: BTreeMap<usize, f64>,
    /// Share of questions with at least one evidence turn in the top k.
    pub hit: BTreeMap<usize, f64>,
}

impl Figures {
    /// As JSON: `{"n", "r5", "r10", …, "hit5", "hit10", …}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("n".into(), self.questions.into());
        for (k, r) in &self.recall {
            m.insert(format!("r{k}"), round(*r).into());
        }
        for (k, h) in &self.hit {
            m.insert(format!("hit{k}"), round(*h).into());
        }
        serde_json::Value::Object(m)
    }
}

/// Four decimals: enough to compare runs, short enough to read.
fn round(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// What recall, and the BM25 baseline, returned for one question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// The conversation's `sample_id`.
    pub sample_id: String,
    /// The conversation's index (see [`Conversation::index`]).
    pub conversation: usize,
    /// Index in the data set's question list.
    pub qa_index: usize,
    /// The question's group.
    pub group: String,
    /// The evidence turn ids asked for.
    pub evidence: Vec<String>,
    /// The turn ids recall returned, best first.
    pub ranked: Vec<String>,
    /// The turn ids plain BM25 returned, best first.
    pub baseline: Vec<String>,
    /// The turn ids BM25 over whole turns returned, best first (see [`WholeBm25`]).
    #[serde(default)]
    pub whole: Vec<String>,
}

/// Which ranking of an answer to score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// shadowbrain's recall.
    Recall,
    /// Plain BM25 over the same analysed text: the keyword index alone, which scores a
    /// long turn by its best passage.
    Bm25,
    /// BM25 over whole turns, however long ([`WholeBm25`]): an anchor that does not depend
    /// on how the keyword index cuts long turns into passages.
    WholeBm25,
}

impl Answer {
    fn ranking(&self, which: Ranking) -> &[String] {
        match which {
            Ranking::Recall => &self.ranked,
            Ranking::Bm25 => &self.baseline,
            Ranking::WholeBm25 => &self.whole,
        }
    }

    /// recall@k: the share of the evidence in the top k.
    pub fn recall_at(&self, which: Ranking, k: usize) -> f64 {
        self.found_at(which, k) as f64 / self.evidence.len().max(1) as f64
    }

    /// Evidence turns in the top k.
    pub fn found_at(&self, which: Ranking, k: usize) -> usize {
        let ranked = self.ranking(which);
        let top = &ranked[..ranked.len().min(k)];
        self.evidence.iter().filter(|e| top.contains(e)).count()
    }
}

/// The result of a run: every answer, and the figures computed from them.
#[derive(Debug, Clone)]
pub struct Report {
    /// The k values figures are computed at.
    pub ks: Vec<usize>,
    /// One per question asked, in data order.
    pub answers: Vec<Answer>,
    /// How the figures are grouped.
    pub layout: Layout,
}

impl Report {
    /// Figures of `which` over the answers `keep` selects.
    pub fn figures(&self, which: Ranking, keep: impl Fn(&Answer) -> bool) -> Figures {
        let chosen: Vec<&Answer> = self.answers.iter().filter(|a| keep(a)).collect();
        let mut f = Figures {
            questions: chosen.len(),
            ..Figures::default()
        };
        if chosen.is_empty() {
            return f;
        }
        let n = chosen.len() as f64;
        for &k in &self.ks {
            let recall = chosen.iter().map(|a| a.recall_at(which, k)).sum::<f64>();
            f.recall.insert(k, recall / n);
            let hits = chosen.iter().filter(|a| a.found_at(which, k) > 0).count();
            f.hit.insert(k, hits as f64 / n);
        }
        f
    }

    fn in_headline(&self, a: &Answer) -> bool {
        !self.layout.outside_headline.contains(&a.group.as_str())
    }

    /// The headline figure (LoCoMo: categories 1–4).
    pub fn headline(&self, which: Ranking) -> Figures {
        self.figures(which, |a| self.in_headline(a))
    }

    /// The headline questions of conversations `from..=to`.
    pub fn split(&self, which: Ranking, from: usize, to: usize) -> Figures {
        self.figures(which, |a| {
            self.in_headline(a) && (from..=to).contains(&a.conversation)
        })
    }

    /// The groups, in order, with their figures.
    pub fn per_group(&self, which: Ranking) -> BTreeMap<String, Figures> {
        let mut groups: Vec<&str> = self.answers.iter().map(|a| a.group.as_str()).collect();
        groups.sort_unstable();
        groups.dedup();
        groups
            .into_iter()
            .map(|g| (g.to_string(), self.figures(which, |a| a.group == g)))
            .collect()
    }

    fn section(&self, which: Ranking) -> serde_json::Value {
        let per_group: serde_json::Map<String, serde_json::Value> = self
            .per_group(which)
            .iter()
            .map(|(g, f)| (g.clone(), f.to_json()))
            .collect();
        let [(a, b), (c, d)] = self.layout.halves;
        serde_json::json!({
            "headline": self.headline(which).to_json(),
            "all": self.figures(which, |_| true).to_json(),
            "per_group": per_group,
            format!("split_{a}_{b}"): self.split(which, a, b).to_json(),
            format!("split_{c}_{d}"): self.split(which, c, d).to_json(),
        })
    }

    /// `summary.json`: the recall figures at the top level (`headline`, `all`, `per_group`
    /// and the two halves), the same for plain BM25 under `bm25`, and recall's R@k over
    /// BM25's under `ratio_to_bm25`.
    pub fn summary(&self) -> serde_json::Value {
        let mut out = self.section(Ranking::Recall);
        // Recall's headline R@k over an anchor's, per k.
        let ratio_to = |anchor: Ranking| -> serde_json::Map<String, serde_json::Value> {
            self.ks
                .iter()
                .map(|&k| {
                    let (r, b) = (
                        self.headline(Ranking::Recall).recall[&k],
                        self.headline(anchor).recall[&k],
                    );
                    (
                        format!("r{k}"),
                        round(if b > 0.0 { r / b } else { 0.0 }).into(),
                    )
                })
                .collect()
        };
        let (ratio, whole) = (ratio_to(Ranking::Bm25), ratio_to(Ranking::WholeBm25));
        if let serde_json::Value::Object(m) = &mut out {
            m.insert("bm25".into(), self.section(Ranking::Bm25));
            m.insert("ratio_to_bm25".into(), ratio.into());
            m.insert("bm25_whole".into(), self.section(Ranking::WholeBm25));
            m.insert("ratio_to_bm25_whole".into(), whole.into());
        }
        out
    }

    /// A plain-text table: one row per group, the headline, all, and the two halves, each
    /// with recall's R@k, plain BM25's R@k, and their ratio at the middle k; then BM25 over
    /// whole turns at the middle k and recall's ratio to it.
    pub fn table(&self) -> String {
        let mid = self.ks[self.ks.len() / 2];
        let mut out = format!("{:<28} {:>5}", "questions", "n");
        for k in &self.ks {
            out.push_str(&format!(" {:>7}", format!("R@{k}")));
        }
        for k in &self.ks {
            out.push_str(&format!(" {:>7}", format!("hit@{k}")));
        }
        for k in &self.ks {
            out.push_str(&format!(" {:>7}", format!("bm25@{k}")));
        }
        out.push_str(&format!(" {:>7}", format!("×@{mid}")));
        out.push_str(&format!(
            " {:>8} {:>8}\n",
            format!("whole@{mid}"),
            format!("×w@{mid}")
        ));
        let mut row = |name: &str, keep: &dyn Fn(&Answer) -> bool| {
            let (f, b) = (
                self.figures(Ranking::Recall, keep),
                self.figures(Ranking::Bm25, keep),
            );
            if f.questions == 0 {
                return;
            }
            out.push_str(&format!("{name:<28} {:>5}", f.questions));
            for v in f
                .recall
                .values()
                .chain(f.hit.values())
                .chain(b.recall.values())
            {
                out.push_str(&format!(" {v:>7.3}"));
            }
            let ratio = |base: f64| match base {
                0.0 => f64::NAN,
                base => f.recall[&mid] / base,
            };
            let w = self.figures(Ranking::WholeBm25, keep).recall[&mid];
            out.push_str(&format!(
                " {:>7.3} {w:>8.3} {:>8.3}\n",
                ratio(b.recall[&mid]),
                ratio(w)
            ));
        };
        for group in self.per_group(Ranking::Recall).keys() {
            row(&(self.layout.label)(group), &|a| &a.group == group);
        }
        row(self.layout.headline, &|a| self.in_headline(a));
        row("all", &|_| true);
        for (from, to) in self.layout.halves {
            row(&format!("{} {from}-{to}", self.layout.headline), &|a| {
                self.in_headline(a) && (from..=to).contains(&a.conversation)
            });
        }
        out
    }
}

/// How many top-ranked turn ids each answer keeps (`ranked.jsonl`).
pub const RANKED_KEPT: usize = 20;

/// How long the enrichment queue may stand still before the run gives up on it.
const STALLED: Duration = Duration::from_secs(120);

/// Waits until no record of `sub` waits for its embedding (the substrate's own enricher
/// embeds them), or fails when the queue has not moved for [`STALLED`]. `progress` is
/// called with how many records wait.
async fn embedded(sub: &Substrate, mut progress: impl FnMut(usize)) -> Result<()> {
    let (mut last, mut since) = (usize::MAX, Instant::now());
    loop {
        let queued = sub.store().queue_depth(Queue::Enrich, usize::MAX)?;
        progress(queued);
        if queued == 0 {
            return Ok(());
        }
        if queued < last {
            (last, since) = (queued, Instant::now());
        } else if since.elapsed() > STALLED {
            return Err(Error::Unavailable {
                what: format!("the embedder `{}`", sub.embedder().name()),
                message: format!(
                    "{queued} records have waited for their embedding for {}s without progress",
                    STALLED.as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`ingest`] wrote: per conversation (in order), the turn id of each record.
#[derive(Debug, Clone, Default)]
pub struct Ingested {
    turns: Vec<HashMap<MemoryId, String>>,
    whole: WholeBm25,
}

impl Ingested {
    /// The turn id of each record of the `i`-th conversation ingested.
    pub fn turns_of(&self, i: usize) -> Option<&HashMap<MemoryId, String>> {
        self.turns.get(i)
    }
}

/// BM25 over whole turns, however long (k1 = 1.2, b = 0.75, tantivy's idf; statistics over
/// every turn of every conversation, as the keyword index's are over the namespace),
/// computed here from the data alone: the keyword index scores a long turn by its best
/// passage, so it cannot give this anchor.
#[derive(Debug, Clone, Default)]
pub struct WholeBm25 {
    /// Per conversation, per turn: its analysed terms with their counts, and its length.
    turns: Vec<Vec<(HashMap<String, u32>, u32)>>,
    /// Turns containing each term.
    doc_freq: HashMap<String, u64>,
    docs: u64,
    mean_len: f64,
}

impl WholeBm25 {
    fn new(conversations: &[Conversation]) -> Self {
        let mut out = WholeBm25::default();
        let mut tokens = 0u64;
        for conv in conversations {
            let mut turns = Vec::with_capacity(conv.turns.len());
            for t in &conv.turns {
                let terms = analyze(&t.text);
                let mut counts: HashMap<String, u32> = HashMap::new();
                for term in &terms {
                    *counts.entry(term.clone()).or_default() += 1;
                }
                for term in counts.keys() {
                    *out.doc_freq.entry(term.clone()).or_default() += 1;
                }
                tokens += terms.len() as u64;
                turns.push((counts, terms.len() as u32));
            }
            out.docs += turns.len() as u64;
            out.turns.push(turns);
        }
        out.mean_len = tokens as f64 / out.docs.max(1) as f64;
        out
    }

    /// The `k` best turns of conversation `conv` (by position) for `query`, best first.
    fn top(&self, conv: usize, query: &str, k: usize) -> Vec<usize> {
        let mut words = analyze(query);
        words.sort_unstable();
        words.dedup();
        let idf: Vec<(&str, f64)> = words
            .iter()
            .filter_map(|w| {
                let n = *self.doc_freq.get(w)?;
                Some((w.as_str(), f64::from(bm25_idf(n, self.docs))))
            })
            .collect();
        let (k1, b) = (1.2, 0.75);
        let mut scored: Vec<(usize, f64)> = self.turns[conv]
            .iter()
            .enumerate()
            .filter_map(|(i, (counts, len))| {
                let norm = k1 * (1.0 - b + b * f64::from(*len) / self.mean_len.max(1e-9));
                let s: f64 = idf
                    .iter()
                    .filter_map(|(w, idf)| {
                        let tf = f64::from(*counts.get(*w)?);
                        Some(idf * tf * (k1 + 1.0) / (tf + norm))
                    })
                    .sum();
                (s > 0.0).then_some((i, s))
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        scored.into_iter().map(|(i, _)| i).collect()
    }
}

/// Ingests `conversations` into `sub` (one session each, in namespace `default`) and waits
/// until every record is embedded. `progress` is called with what is going on and the
/// turns done so far: [`Stage::Recording`] them, then [`Stage::Embedding`] (turns embedded).
pub async fn ingest(
    sub: &Substrate,
    conversations: &[Conversation],
    mut progress: impl FnMut(Stage, u64),
) -> Result<Ingested> {
    let mut out = Ingested {
        whole: WholeBm25::new(conversations),
        ..Ingested::default()
    };
    let mut done = 0u64;
    for conv in conversations {
        let mut turn_of: HashMap<MemoryId, String> = HashMap::new();
        for chunk in conv.turns.chunks(500) {
            let events: Vec<NewMemory> = chunk
                .iter()
                .map(|t| NewMemory {
                    kind: "user_message".into(),
                    text: Some(t.text.clone()),
                    timestamp: Some(t.time),
                    metadata: Some(serde_json::json!({ "dia_id": t.id })),
                    ..NewMemory::default()
                })
                .collect();
            let ids = sub.record("default", &conv.sample_id, events).await?;
            for (id, t) in ids.into_iter().zip(chunk) {
                turn_of.insert(id, t.id.clone());
            }
            done += chunk.len() as u64;
            progress(Stage::Recording, done);
        }
        out.turns.push(turn_of);
    }
    embedded(sub, |queued| {
        progress(Stage::Embedding, done.saturating_sub(queued as u64))
    })
    .await?;
    // Under a policy with `[updates]` on, questions are asked once every record has been
    // compared with its neighbours, as in a store that has settled.
    sub.detect_all_updates()?;
    Ok(out)
}

/// What [`ingest`] is doing when it reports progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Writing the turns as events.
    Recording,
    /// Waiting for their embeddings (a local or remote embedder works in the background).
    Embedding,
}

impl Stage {
    /// Lower-case, for a progress line.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Recording => "recording",
            Stage::Embedding => "embedding",
        }
    }
}

/// Asks every question of the [`ingest`]ed `conversations` through recall, with `sub`'s
/// active policy, and through plain BM25, keeping the top `max(ks, 20)` of each.
/// `progress` is called with the questions done so far.
pub async fn ask(
    sub: &Substrate,
    conversations: &[Conversation],
    ingested: &Ingested,
    ks: &[usize],
    layout: Layout,
    progress: impl FnMut(u64),
) -> Result<Report> {
    ask_with(sub, conversations, ingested, ks, layout, |_| {}, progress).await
}

/// [`ask`], with each recall request changed by `tweak` before it is asked (e.g.
/// `include_superseded`, to compare rankings on one ingest).
pub async fn ask_with(
    sub: &Substrate,
    conversations: &[Conversation],
    ingested: &Ingested,
    ks: &[usize],
    layout: Layout,
    tweak: impl Fn(&mut RecallRequest),
    mut progress: impl FnMut(u64),
) -> Result<Report> {
    let depth = ks.iter().copied().max().unwrap_or(10).max(RANKED_KEPT);
    let mut answers = Vec::new();
    let mut done = 0u64;
    for (ci, (conv, turn_of)) in conversations.iter().zip(&ingested.turns).enumerate() {
        let turns = |ids: &mut dyn Iterator<Item = MemoryId>| -> Vec<String> {
            ids.filter_map(|id| turn_of.get(&id).cloned()).collect()
        };
        for q in &conv.questions {
            let mut req = RecallRequest::new("default", &conv.sample_id, &q.question);
            req.k = depth;
            req.scope = Scope::Session;
            req.include_knowledge = false;
            req.reinforce = false;
            tweak(&mut req);
            let res = sub.recall(&req).await?;
            let ranked = turns(&mut res.memories.iter().map(|m| m.record.id));
            let bm25 = sub.bm25("default", &conv.sample_id, &q.question, depth)?;
            let whole = ingested.whole.top(ci, &q.question, depth);
            answers.push(Answer {
                sample_id: conv.sample_id.clone(),
                conversation: conv.index,
                qa_index: q.qa_index,
                group: q.group.clone(),
                evidence: q.evidence.clone(),
                ranked,
                baseline: turns(&mut bm25.into_iter()),
                whole: whole
                    .into_iter()
                    .map(|t| conv.turns[t].id.clone())
                    .collect(),
            });
            done += 1;
            progress(done);
        }
    }
    Ok(Report {
        ks: ks.to_vec(),
        answers,
        layout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(texts: &[&str]) -> Conversation {
        Conversation {
            index: 0,
            sample_id: "c".into(),
            turns: texts
                .iter()
                .enumerate()
                .map(|(i, t)| Turn {
                    id: format!("t{i}"),
                    text: t.to_string(),
                    time: i as Timestamp,
                })
                .collect(),
            questions: Vec::new(),
        }
    }

    #[test]
    fn whole_turn_bm25_counts_a_long_turn_whole() {
        let long = format!("the quokka {}", "rainfall in the valley ".repeat(300));
        let bm25 = WholeBm25::new(&[conversation(&[
            "a note about the printer",
            &long,
            "we saw a quokka at the zoo",
            "nothing here",
        ])]);
        // Both mention it once; the long turn's length counts against it.
        assert_eq!(bm25.top(0, "quokka", 10), [2, 1]);
        assert_eq!(bm25.top(0, "printer", 10), [0]);
        assert!(bm25.top(0, "zebra", 10).is_empty());
        assert_eq!(bm25.top(0, "quokka", 1), [2]);
    }
}

//! LoCoMo evidence recall (`../shared/data/locomo/README.md`): each conversation becomes one
//! session, each dialog turn one memory (`Speaker: text [shares caption]`, its session's
//! date as event time, `dia_id` in metadata); every question is asked through recall, and
//! recall@k = |evidence ∩ top-k| / |evidence| is averaged per category. No LLM involved.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::engine::{RecallRequest, Substrate};
use crate::error::{Error, Result};
use crate::model::{MemoryId, NewMemory};
use crate::retrieval::Scope;

/// One conversation of the data set, as loaded.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Position in the data file (0-based).
    pub index: usize,
    /// `sample_id`, used as the session id.
    pub sample_id: String,
    /// Turns in order: (dia_id, text, event time).
    pub turns: Vec<(String, String, Timestamp)>,
    /// Questions: (question, category, normalised evidence dia_ids).
    pub questions: Vec<Question>,
}

/// One question with its evidence.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Question {
    /// Index in the sample's `qa` list.
    pub qa_index: usize,
    /// The question.
    pub question: String,
    /// 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
    pub category: u8,
    /// Evidence dia_ids that exist in the conversation.
    pub evidence: Vec<String>,
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

/// What recall returned for one question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// The conversation's `sample_id`.
    pub sample_id: String,
    /// The conversation's position in the data file (0-based), for the 0–4 / 5–9 split.
    pub conversation: usize,
    /// Index in the sample's `qa` list.
    pub qa_index: usize,
    /// 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
    pub category: u8,
    /// The evidence dia_ids asked for.
    pub evidence: Vec<String>,
    /// The dia_ids recall returned, best first.
    pub ranked_dia_ids: Vec<String>,
}

impl Answer {
    /// recall@k: the share of the evidence in the top k.
    pub fn recall_at(&self, k: usize) -> f64 {
        self.found_at(k) as f64 / self.evidence.len().max(1) as f64
    }

    /// Evidence turns in the top k.
    pub fn found_at(&self, k: usize) -> usize {
        let top = &self.ranked_dia_ids[..self.ranked_dia_ids.len().min(k)];
        self.evidence.iter().filter(|e| top.contains(e)).count()
    }
}

/// The result of a run: every answer, and the figures computed from them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The k values figures are computed at.
    pub ks: Vec<usize>,
    /// One per question asked, in data order.
    pub answers: Vec<Answer>,
}

impl Report {
    /// Figures over the answers `keep` selects.
    pub fn figures(&self, keep: impl Fn(&Answer) -> bool) -> Figures {
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
            f.recall
                .insert(k, chosen.iter().map(|a| a.recall_at(k)).sum::<f64>() / n);
            f.hit.insert(
                k,
                chosen.iter().filter(|a| a.found_at(k) > 0).count() as f64 / n,
            );
        }
        f
    }

    /// Categories 1–4 together: the benchmark's headline figure.
    pub fn cats_1_4(&self) -> Figures {
        self.figures(|a| (1..=4).contains(&a.category))
    }

    /// Per category (1..=5; a category appears only when it has questions with evidence).
    pub fn per_category(&self) -> BTreeMap<u8, Figures> {
        (1..=5u8)
            .map(|c| (c, self.figures(|a| a.category == c)))
            .filter(|(_, f)| f.questions > 0)
            .collect()
    }

    /// Categories 1–4 of conversations `from..=to` (positions in the data file): the tuning
    /// split (0–4) and the held-out one (5–9).
    pub fn split(&self, from: usize, to: usize) -> Figures {
        self.figures(|a| (1..=4).contains(&a.category) && (from..=to).contains(&a.conversation))
    }

    /// `summary.json`: `cats_1_4`, `all` (every category with evidence), `per_category`,
    /// `split_0_4` and `split_5_9`.
    pub fn summary(&self) -> serde_json::Value {
        let per_category: serde_json::Map<String, serde_json::Value> = self
            .per_category()
            .iter()
            .map(|(c, f)| (c.to_string(), f.to_json()))
            .collect();
        serde_json::json!({
            "cats_1_4": self.cats_1_4().to_json(),
            "all": self.figures(|_| true).to_json(),
            "per_category": per_category,
            "split_0_4": self.split(0, 4).to_json(),
            "split_5_9": self.split(5, 9).to_json(),
        })
    }

    /// A plain-text table: one row per category, then categories 1–4, all, and the splits.
    pub fn table(&self) -> String {
        let mut out = format!("{:<14} {:>5}", "questions", "n");
        for k in &self.ks {
            out.push_str(&format!(" {:>7}", format!("R@{k}")));
        }
        for k in &self.ks {
            out.push_str(&format!(" {:>7}", format!("hit@{k}")));
        }
        out.push('\n');
        let mut row = |name: &str, f: &Figures| {
            out.push_str(&format!("{name:<14} {:>5}", f.questions));
            for v in f.recall.values().chain(f.hit.values()) {
                out.push_str(&format!(" {v:>7.3}"));
            }
            out.push('\n');
        };
        for (c, f) in self.per_category() {
            row(&format!("{c} {}", category_name(c)), &f);
        }
        row("cats 1-4", &self.cats_1_4());
        row("all", &self.figures(|_| true));
        for (name, from, to) in [("conv 0-4", 0, 4), ("conv 5-9", 5, 9)] {
            let f = self.split(from, to);
            if f.questions > 0 {
                row(name, &f);
            }
        }
        out
    }
}

/// LoCoMo's name for a category.
pub fn category_name(c: u8) -> &'static str {
    match c {
        1 => "multi-hop",
        2 => "temporal",
        3 => "open-domain",
        4 => "single-hop",
        5 => "adversarial",
        _ => "other",
    }
}

/// Parses LoCoMo's session dates, e.g. `1:56 pm on 8 May, 2023`.
pub fn parse_date(s: &str) -> Result<Timestamp> {
    chrono::NaiveDateTime::parse_from_str(s.trim(), "%I:%M %p on %d %B, %Y")
        .map(|dt| dt.and_utc().timestamp_millis())
        .map_err(|e| Error::invalid("session date", format!("`{s}`: {e}")))
}

/// Splits and repairs evidence ids (`"D8:6; D9:17"`, `"D:11:26"`, `"D30:05"`).
pub fn normalise_evidence(raw: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for item in raw {
        for part in item
            .split([';', ',', ' '])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let p = part.replace("D:", "D");
            let Some((s, t)) = p.strip_prefix('D').and_then(|r| r.split_once(':')) else {
                continue;
            };
            let (Ok(s), Ok(t)) = (s.parse::<u32>(), t.parse::<u32>()) else {
                continue;
            };
            out.push(format!("D{s}:{t}"));
        }
    }
    out.dedup();
    out
}

/// Loads `locomo10.json`.
pub fn load(path: &Path) -> Result<Vec<Conversation>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let samples: Vec<serde_json::Value> = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid("locomo data", format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (index, s) in samples.into_iter().enumerate() {
        let sample_id = s["sample_id"].as_str().unwrap_or("sample").to_string();
        let conv = &s["conversation"];
        let mut sessions: Vec<(u32, Timestamp, &Vec<serde_json::Value>)> = Vec::new();
        if let Some(map) = conv.as_object() {
            for (k, v) in map {
                let Some(n) = k
                    .strip_prefix("session_")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let Some(turns) = v.as_array() else { continue };
                let date = conv[format!("session_{n}_date_time")]
                    .as_str()
                    .unwrap_or("");
                sessions.push((n, parse_date(date)?, turns));
            }
        }
        sessions.sort_by_key(|s| s.0);
        let mut turns = Vec::new();
        for (_, t0, list) in sessions {
            for (i, turn) in list.iter().enumerate() {
                let dia = turn["dia_id"].as_str().unwrap_or_default().to_string();
                let speaker = turn["speaker"].as_str().unwrap_or_default();
                let mut text = format!("{speaker}: {}", turn["text"].as_str().unwrap_or_default());
                if let Some(c) = turn["blip_caption"].as_str() {
                    text.push_str(&format!(" [shares {c}]"));
                }
                // Turns of one session share its date; a second apart keeps their order.
                turns.push((dia, text, t0 + i as i64 * 1000));
            }
        }
        let known: std::collections::HashSet<&str> = turns.iter().map(|t| t.0.as_str()).collect();
        let mut questions = Vec::new();
        for (qa_index, q) in s["qa"].as_array().into_iter().flatten().enumerate() {
            let raw: Vec<String> = q["evidence"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect();
            let evidence: Vec<String> = normalise_evidence(&raw)
                .into_iter()
                .filter(|e| known.contains(e.as_str()))
                .collect();
            if evidence.is_empty() {
                continue;
            }
            questions.push(Question {
                qa_index,
                question: q["question"].as_str().unwrap_or_default().to_string(),
                category: q["category"].as_u64().unwrap_or(0) as u8,
                evidence,
            });
        }
        out.push(Conversation {
            index,
            sample_id,
            turns,
            questions,
        });
    }
    Ok(out)
}

/// How many top-ranked dia_ids each answer keeps (`ranked.jsonl`'s `ranked_dia_ids`).
pub const RANKED_KEPT: usize = 20;

/// Progress steps of [`run`]: one per turn ingested and one per question asked.
pub fn steps(conversations: &[Conversation]) -> u64 {
    conversations
        .iter()
        .map(|c| (c.turns.len() + c.questions.len()) as u64)
        .sum()
}

/// Ingests `conversations` into `sub` (one session each, in namespace `default`) and asks
/// every question through recall, keeping the top `max(ks, 20)`. `progress` is called
/// with the steps done so far (see [`steps`]).
pub async fn run(
    sub: &Substrate,
    conversations: &[Conversation],
    ks: &[usize],
    mut progress: impl FnMut(u64),
) -> Result<Report> {
    let depth = ks.iter().copied().max().unwrap_or(10).max(RANKED_KEPT);
    let mut answers = Vec::new();
    let mut done = 0u64;
    for conv in conversations {
        let mut dia_of: HashMap<MemoryId, String> = HashMap::new();
        for chunk in conv.turns.chunks(500) {
            let events: Vec<NewMemory> = chunk
                .iter()
                .map(|(dia, text, t)| NewMemory {
                    kind: "user_message".into(),
                    text: Some(text.clone()),
                    timestamp: Some(*t),
                    metadata: Some(serde_json::json!({ "dia_id": dia })),
                    ..NewMemory::default()
                })
                .collect();
            let ids = sub.record("default", &conv.sample_id, events).await?;
            for (id, (dia, _, _)) in ids.into_iter().zip(chunk) {
                dia_of.insert(id, dia.clone());
            }
            done += chunk.len() as u64;
            progress(done);
        }
        for q in &conv.questions {
            let mut req = RecallRequest::new("default", &conv.sample_id, &q.question);
            req.k = depth;
            req.scope = Scope::Session;
            req.include_knowledge = false;
            req.reinforce = false;
            let res = sub.recall(&req).await?;
            let ranked: Vec<String> = res
                .memories
                .iter()
                .filter_map(|m| dia_of.get(&m.record.id).cloned())
                .collect();
            answers.push(Answer {
                sample_id: conv.sample_id.clone(),
                conversation: conv.index,
                qa_index: q.qa_index,
                category: q.category,
                evidence: q.evidence.clone(),
                ranked_dia_ids: ranked,
            });
            done += 1;
            progress(done);
        }
    }
    Ok(Report {
        ks: ks.to_vec(),
        answers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse() {
        let t = parse_date("1:56 pm on 8 May, 2023").unwrap();
        assert_eq!(crate::clock::to_rfc3339(t), "2023-05-08T13:56:00.000Z");
        assert!(parse_date("8 May").is_err());
    }

    #[test]
    fn malformed_evidence_is_repaired() {
        let raw: Vec<String> = ["D8:6; D9:17", "D:11:26", "D30:05", "D1:2 D1:3", "D"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            normalise_evidence(&raw),
            vec!["D8:6", "D9:17", "D11:26", "D30:5", "D1:2", "D1:3"]
        );
    }
}

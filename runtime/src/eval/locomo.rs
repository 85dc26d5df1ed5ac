//! LoCoMo evidence recall (`../shared/data/locomo/README.md`): each conversation becomes one
//! session, each dialog turn one memory (`Speaker: text [shares caption]`, its session's
//! date as event time, `dia_id` in metadata); every question is asked through recall, and
//! recall@k = |evidence ∩ top-k| / |evidence| is averaged per category. No LLM involved.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{MemoryId, NewMemory};
use crate::retrieval::Scope;
use crate::substrate::{RecallRequest, Substrate};

/// One conversation of the data set, as loaded.
#[derive(Debug, Clone)]
pub struct Conversation {
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

/// Per k: (recall@k, whether any evidence was in the top k).
type AtK = BTreeMap<usize, (f64, bool)>;

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

/// The result of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Categories 1–4 together.
    pub cats_1_4: Figures,
    /// Per category (1..=5; 5 only when it has evidence).
    pub per_category: BTreeMap<u8, Figures>,
    /// Top-ranked dia_ids per question: (sample_id, qa_index, category, ranked).
    pub ranked: Vec<(String, usize, u8, Vec<String>)>,
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
    for s in samples {
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
            sample_id,
            turns,
            questions,
        });
    }
    Ok(out)
}

/// Ingests `conversations` into `sub` (one session each) and asks every question through
/// recall with the largest k in `ks`. `progress` is called after each conversation.
pub async fn run(
    sub: &Substrate,
    conversations: &[Conversation],
    ks: &[usize],
    mut progress: impl FnMut(usize, usize),
) -> Result<Report> {
    let kmax = ks.iter().copied().max().unwrap_or(10).max(1);
    // Per question: its category and, per k, (recall, hit).
    let mut per_q: Vec<(u8, AtK)> = Vec::new();
    let mut ranked_out = Vec::new();
    for (ci, conv) in conversations.iter().enumerate() {
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
        }
        for q in &conv.questions {
            let mut req = RecallRequest::new("default", &conv.sample_id, &q.question);
            req.k = kmax;
            req.scope = Scope::Session;
            req.include_knowledge = false;
            req.reinforce = false;
            let res = sub.recall(&req).await?;
            let ranked: Vec<String> = res
                .memories
                .iter()
                .filter_map(|m| dia_of.get(&m.record.id).cloned())
                .collect();
            let mut at = BTreeMap::new();
            for &k in ks {
                let top = &ranked[..ranked.len().min(k)];
                let found = q.evidence.iter().filter(|e| top.contains(e)).count();
                at.insert(k, (found as f64 / q.evidence.len() as f64, found > 0));
            }
            per_q.push((q.category, at));
            ranked_out.push((conv.sample_id.clone(), q.qa_index, q.category, ranked));
        }
        progress(ci + 1, conversations.len());
    }
    let figures = |filter: &dyn Fn(u8) -> bool| {
        let chosen: Vec<&AtK> = per_q
            .iter()
            .filter(|(c, _)| filter(*c))
            .map(|(_, a)| a)
            .collect();
        let mut f = Figures {
            questions: chosen.len(),
            ..Figures::default()
        };
        if chosen.is_empty() {
            return f;
        }
        for &k in ks {
            let r: f64 = chosen.iter().map(|a| a[&k].0).sum::<f64>() / chosen.len() as f64;
            let h = chosen.iter().filter(|a| a[&k].1).count() as f64 / chosen.len() as f64;
            f.recall.insert(k, r);
            f.hit.insert(k, h);
        }
        f
    };
    let mut per_category = BTreeMap::new();
    for c in 1..=5u8 {
        let f = figures(&|x| x == c);
        if f.questions > 0 {
            per_category.insert(c, f);
        }
    }
    Ok(Report {
        cats_1_4: figures(&|c| (1..=4).contains(&c)),
        per_category,
        ranked: ranked_out,
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

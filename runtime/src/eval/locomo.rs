//! LoCoMo evidence recall (`locomo10.json`, not shipped): each conversation becomes one
//! session, each dialog turn one memory (`Speaker: text [shares caption]`, its session's
//! date as event time, `dia_id` in metadata); every question is asked through recall, and
//! recall@k = |evidence ∩ top-k| / |evidence| is averaged per category (see [`super::ask`]).
//! No LLM involved.

use std::path::Path;

use super::{Conversation, Layout, Question, Turn};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// LoCoMo's figures: categories 1–4 are the headline (5, adversarial, has no answer in the
/// conversation), conversations 0–4 tune the defaults and 5–9 are held out.
pub const LAYOUT: Layout = Layout {
    headline: "cats 1-4",
    outside_headline: &["5"],
    halves: [(0, 4), (5, 9)],
    label,
};

fn label(group: &str) -> String {
    let name = group.parse().map_or("other", category_name);
    format!("{group} {name}")
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
                turns.push(Turn {
                    id: dia,
                    text,
                    time: t0 + i as i64 * 1000,
                });
            }
        }
        let known: std::collections::HashSet<&str> = turns.iter().map(|t| t.id.as_str()).collect();
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
                group: q["category"].as_u64().unwrap_or(0).to_string(),
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

//! BEAM evidence recall (the 100K-token split, not shipped): each chat
//! becomes one session and each message one memory (`role: content`, in id order, the
//! batch's `time_anchor` date as event time); every probing question that names evidence
//! (`source_chat_ids`; abstention questions name none) is asked through recall and scored
//! per ability (see [`super::ask`]). No LLM involved.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::{Conversation, Layout, Question, Turn};
use crate::clock::{DAY_MS, Timestamp};
use crate::error::{Error, Result};

/// BEAM's figures: every ability with evidence is in the headline; chats 1–10 and 11–20
/// are the two halves.
pub const LAYOUT: Layout = Layout {
    headline: "abilities",
    outside_headline: &[],
    halves: [(1, 10), (11, 20)],
    label: str::to_string,
};

/// Parses BEAM's `time_anchor` dates, e.g. `March-15-2024`, as midnight UTC.
pub fn parse_anchor(s: &str) -> Result<Timestamp> {
    chrono::NaiveDate::parse_from_str(s.trim(), "%B-%d-%Y")
        .map(|d| {
            d.and_hms_opt(0, 0, 0)
                .unwrap_or_default()
                .and_utc()
                .timestamp_millis()
        })
        .map_err(|e| Error::invalid("time_anchor", format!("`{s}`: {e}")))
}

/// The evidence ids of a question: a list of ints, or an object of lists (their union).
fn evidence_ids(v: &Value) -> Vec<u64> {
    let mut out: Vec<u64> = match v {
        Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
        Value::Object(m) => m
            .values()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(Value::as_u64)
            .collect(),
        _ => Vec::new(),
    };
    out.sort_unstable();
    out.dedup();
    out
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid("beam data", format!("{}: {e}", path.display())))
}

/// Loads the chats of a BEAM split directory (`100K/`: `1/chat.json`,
/// `1/probing_questions.json`, …), in chat-number order.
pub fn load(dir: &Path) -> Result<Vec<Conversation>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut numbers: Vec<usize> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|n: &usize| dir.join(n.to_string()).join("chat.json").is_file())
        .collect();
    numbers.sort_unstable();
    if numbers.is_empty() {
        return Err(Error::invalid(
            "beam data",
            format!(
                "{} holds no chats (numbered directories with chat.json); pass the split's \
                 directory, e.g. shared/data/beam/100K",
                dir.display()
            ),
        ));
    }
    numbers
        .into_iter()
        .map(|n| load_chat(&dir.join(n.to_string()), n))
        .collect()
}

fn load_chat(dir: &Path, index: usize) -> Result<Conversation> {
    let chat = read_json(&dir.join("chat.json"))?;
    let mut turns = Vec::new();
    // A chat starts on its first anchor; a batch without one goes on a day after the last.
    let mut day: Timestamp = 0;
    for batch in chat.as_array().into_iter().flatten() {
        let anchor = batch["time_anchor"]
            .as_str()
            .or_else(|| batch["turns"][0][0]["time_anchor"].as_str());
        day = match anchor {
            Some(a) => parse_anchor(a)?,
            None => day + DAY_MS,
        };
        let messages = batch["turns"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|pair| pair.as_array().into_iter().flatten());
        for m in messages {
            let Some(id) = m["id"].as_u64() else { continue };
            let role = m["role"].as_str().unwrap_or("user");
            let content = m["content"].as_str().unwrap_or_default();
            turns.push(Turn {
                id: id.to_string(),
                text: format!("{role}: {content}"),
                // A second apart keeps the messages of a day in order.
                time: day + turns.len() as i64 * 1000,
            });
        }
    }
    let known: HashSet<&str> = turns.iter().map(|t| t.id.as_str()).collect();
    let probing = read_json(&dir.join("probing_questions.json"))?;
    let mut questions = Vec::new();
    let mut qa_index = 0;
    for (ability, list) in probing.as_object().into_iter().flatten() {
        for q in list.as_array().into_iter().flatten() {
            qa_index += 1;
            let evidence: Vec<String> = evidence_ids(&q["source_chat_ids"])
                .into_iter()
                .map(|id| id.to_string())
                .filter(|id| known.contains(id.as_str()))
                .collect();
            if evidence.is_empty() {
                continue;
            }
            questions.push(Question {
                qa_index: qa_index - 1,
                question: q["question"].as_str().unwrap_or_default().to_string(),
                group: ability.clone(),
                evidence,
            });
        }
    }
    Ok(Conversation {
        index,
        sample_id: format!("beam-{index}"),
        turns,
        questions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_parse() {
        let t = parse_anchor("March-15-2024").unwrap();
        assert_eq!(crate::clock::to_rfc3339(t), "2024-03-15T00:00:00.000Z");
        assert!(parse_anchor("15 March").is_err());
    }

    #[test]
    fn evidence_is_a_list_or_the_union_of_an_object_of_lists() {
        let list = serde_json::json!([3, 1, 3]);
        let object = serde_json::json!({"first_statement": [12], "second_statement": [140, 12]});
        assert_eq!(evidence_ids(&list), vec![1, 3]);
        assert_eq!(evidence_ids(&object), vec![12, 140]);
        assert!(evidence_ids(&Value::Null).is_empty());
    }
}

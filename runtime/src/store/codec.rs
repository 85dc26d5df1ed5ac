//! How records and embeddings become bytes. Records are postcard with a leading format byte;
//! the fields the catalog needs come first so that opening a store decodes only a header.
//! JSON fields are kept as JSON text, since postcard is not self-describing. Embeddings live
//! under their own key as little-endian f32, so listings never drag vectors through memory.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{Kind, MemoryId, MemoryRecord, PolicyStamp, Status, Tier, Utility};

/// The record encoding this build writes.
const RECORD_FORMAT: u8 = 1;

/// What the catalog needs from a record; the leading fields of every encoded record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Namespace.
    pub namespace: String,
    /// Session.
    pub session_id: String,
    /// Agent, when known.
    pub agent_id: Option<String>,
    /// Tier.
    pub tier: Tier,
    /// Kind.
    pub kind: String,
    /// Status.
    pub status: Status,
    /// Event time.
    pub event_time: Timestamp,
}

#[derive(Serialize, Deserialize)]
struct Body {
    recorded_time: Timestamp,
    importance: f32,
    strength: f32,
    strength_at: Timestamp,
    reinforcements: u32,
    utility: Utility,
    status_at: Timestamp,
    sources: Vec<MemoryId>,
    policy: PolicyStamp,
    parent_id: Option<String>,
    text: String,
    content: String,
    metadata: String,
}

fn corrupt(key: &[u8], e: impl std::fmt::Display) -> Error {
    Error::Corrupt {
        key: format!("{key:02x?}"),
        message: e.to_string(),
    }
}

/// The catalog header of a record.
pub fn header_of(r: &MemoryRecord) -> Header {
    Header {
        namespace: r.namespace.clone(),
        session_id: r.session_id.clone(),
        agent_id: r.agent_id.clone(),
        tier: r.tier,
        kind: r.kind.as_str().to_string(),
        status: r.status,
        event_time: r.event_time,
    }
}

/// Encodes a record (its embedding is stored separately).
pub fn encode_record(r: &MemoryRecord) -> Vec<u8> {
    let header = header_of(r);
    let json = |v: &serde_json::Value| {
        if v.is_null() {
            String::new()
        } else {
            v.to_string()
        }
    };
    let body = Body {
        recorded_time: r.recorded_time,
        importance: r.importance,
        strength: r.strength,
        strength_at: r.strength_at,
        reinforcements: r.reinforcements,
        utility: r.utility,
        status_at: r.status_at,
        sources: r.sources.clone(),
        policy: r.policy.clone(),
        parent_id: r.parent_id.clone(),
        text: r.text.clone(),
        content: json(&r.content),
        metadata: json(&r.metadata),
    };
    let mut out = vec![RECORD_FORMAT];
    // Serializing plain structs into a Vec cannot fail.
    out.extend(postcard::to_allocvec(&header).unwrap_or_default());
    out.extend(postcard::to_allocvec(&body).unwrap_or_default());
    out
}

fn split_format<'a>(key: &[u8], bytes: &'a [u8]) -> Result<&'a [u8]> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => Ok(rest),
        Some((v, _)) => Err(corrupt(key, format!("unknown record format {v}"))),
        None => Err(corrupt(key, "empty record")),
    }
}

/// Decodes only the header of an encoded record.
pub fn decode_header(key: &[u8], bytes: &[u8]) -> Result<Header> {
    let rest = split_format(key, bytes)?;
    postcard::take_from_bytes::<Header>(rest)
        .map(|(h, _)| h)
        .map_err(|e| corrupt(key, e))
}

/// Decodes a whole record.
pub fn decode_record(
    id: MemoryId,
    key: &[u8],
    bytes: &[u8],
    embedding: Option<Vec<f32>>,
) -> Result<MemoryRecord> {
    let rest = split_format(key, bytes)?;
    let (h, rest) = postcard::take_from_bytes::<Header>(rest).map_err(|e| corrupt(key, e))?;
    let (b, _) = postcard::take_from_bytes::<Body>(rest).map_err(|e| corrupt(key, e))?;
    let json = |s: &str| -> Result<serde_json::Value> {
        if s.is_empty() {
            Ok(serde_json::Value::Null)
        } else {
            serde_json::from_str(s).map_err(|e| corrupt(key, e))
        }
    };
    Ok(MemoryRecord {
        id,
        namespace: h.namespace,
        session_id: h.session_id,
        agent_id: h.agent_id,
        tier: h.tier,
        kind: Kind::new(h.kind).map_err(|e| corrupt(key, e))?,
        text: b.text,
        content: json(&b.content)?,
        metadata: json(&b.metadata)?,
        parent_id: b.parent_id,
        event_time: h.event_time,
        recorded_time: b.recorded_time,
        importance: b.importance,
        strength: b.strength,
        strength_at: b.strength_at,
        reinforcements: b.reinforcements,
        utility: b.utility,
        status: h.status,
        status_at: b.status_at,
        sources: b.sources,
        policy: b.policy,
        embedding,
    })
}

/// Encodes an embedding as little-endian f32.
pub fn encode_embedding(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Decodes an embedding.
pub fn decode_embedding(key: &[u8], bytes: &[u8]) -> Result<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(corrupt(key, format!("embedding of {} bytes", bytes.len())));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Encodes any serde value for the store's own tables (stats, audit, queue items).
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

/// Decodes a value written by [`encode`].
pub fn decode<'a, T: Deserialize<'a>>(key: &[u8], bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| corrupt(key, e))
}

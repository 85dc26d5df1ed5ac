//! How records and embeddings become bytes. Records are postcard with a leading format byte;
//! the fields the catalog needs come first so that opening a store decodes only a header.
//! JSON fields are kept as JSON text, since postcard is not self-describing; a reader that
//! may not need them (recall's candidates, a reinforcement) takes that text as [`RawJson`]
//! and parses it only if it must. What a reinforcement changes is kept apart, as a small
//! [`Strength`] entry that readers lay over the record. Embeddings live under their own key at half
//! precision, so listings never drag vectors through memory.

use half::slice::HalfFloatSliceExt;
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

/// What recall's reinforcements changed in a record, kept under the record's id in a table
/// of its own instead of in the record ([`super::keys::strength`]). Each recall reinforces
/// about ten records, and rewriting each would dirty a page of the record table; these entries
/// are small enough that a session's fit in a page or two. Readers lay the entry over the
/// record ([`Strength::lay_over`]); any other rewrite of the record folds it back in and
/// drops it. Postcard is positional: these fields, in this order, are the stored bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Strength {
    strength: f32,
    strength_at: Timestamp,
    reinforcements: u32,
    /// The deciding policy, when it is not the one the record's own bytes name (usually it
    /// is, and the entry stays a dozen bytes).
    policy: Option<PolicyStamp>,
}

impl Strength {
    /// The entry for `r` as reinforced, against `stored`, the stamp in the record's bytes.
    pub fn of(r: &MemoryRecord, stored: &PolicyStamp) -> Self {
        Strength {
            strength: r.strength,
            strength_at: r.strength_at,
            reinforcements: r.reinforcements,
            policy: (r.policy != *stored).then(|| r.policy.clone()),
        }
    }

    /// Lays the entry's fields over the record read from the record table.
    pub fn lay_over(self, r: &mut MemoryRecord) {
        r.strength = self.strength;
        r.strength_at = self.strength_at;
        r.reinforcements = self.reinforcements;
        if let Some(policy) = self.policy {
            r.policy = policy;
        }
    }

    /// Decodes `bytes` (read under `key`) and lays them over `r`.
    pub fn decode_over(key: &[u8], bytes: &[u8], r: &mut MemoryRecord) -> Result<()> {
        decode::<Strength>(key, bytes)?.lay_over(r);
        Ok(())
    }
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
    let json = |v: &serde_json::Value| {
        if v.is_null() {
            String::new()
        } else {
            v.to_string()
        }
    };
    encode_parts(r, json(&r.content), json(&r.metadata))
}

/// Encodes `r` with `content` and `metadata` as JSON text (empty for null): the header's
/// and the body's fields borrowed from the record, written into one buffer sized for them
/// (the commit thread encodes every record of a write, so copies and regrowth add up).
fn encode_parts(r: &MemoryRecord, content: String, metadata: String) -> Vec<u8> {
    let header = HeaderRef {
        namespace: &r.namespace,
        session_id: &r.session_id,
        agent_id: r.agent_id.as_deref(),
        tier: r.tier,
        kind: r.kind.as_str(),
        status: r.status,
        event_time: r.event_time,
    };
    let body = BodyRef {
        recorded_time: r.recorded_time,
        importance: r.importance,
        strength: r.strength,
        strength_at: r.strength_at,
        reinforcements: r.reinforcements,
        utility: r.utility,
        status_at: r.status_at,
        sources: &r.sources,
        policy: &r.policy,
        parent_id: r.parent_id.as_deref(),
        text: &r.text,
        content: &content,
        metadata: &metadata,
    };
    // Strings and ids as they are, plus room for the numbers and lengths (a few bytes each).
    let size = 128
        + r.namespace.len()
        + r.session_id.len()
        + r.agent_id.as_ref().map_or(0, String::len)
        + r.kind.as_str().len()
        + r.policy.name.len()
        + r.policy.hash.len()
        + r.parent_id.as_ref().map_or(0, String::len)
        + r.text.len()
        + content.len()
        + metadata.len()
        + 5 * r.sources.len();
    let mut out = Vec::with_capacity(size);
    out.push(RECORD_FORMAT);
    // Serializing plain structs into a Vec cannot fail.
    let out = postcard::to_extend(&header, out).unwrap_or_default();
    postcard::to_extend(&body, out).unwrap_or_default()
}

/// [`Header`] borrowed from a record, for writing: the same fields in the same order, so
/// the same bytes (postcard is positional; a test holds them equal).
#[derive(Serialize)]
struct HeaderRef<'a> {
    namespace: &'a str,
    session_id: &'a str,
    agent_id: Option<&'a str>,
    tier: Tier,
    kind: &'a str,
    status: Status,
    event_time: Timestamp,
}

/// [`Body`] borrowed from a record, for writing, as [`HeaderRef`].
#[derive(Serialize)]
struct BodyRef<'a> {
    recorded_time: Timestamp,
    importance: f32,
    strength: f32,
    strength_at: Timestamp,
    reinforcements: u32,
    utility: Utility,
    status_at: Timestamp,
    sources: &'a [MemoryId],
    policy: &'a PolicyStamp,
    parent_id: Option<&'a str>,
    text: &'a str,
    content: &'a str,
    metadata: &'a str,
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

/// A record's `content` and `metadata` as the JSON text they are stored as, not yet parsed
/// (see [`decode_deferred`]).
#[derive(Debug)]
pub struct RawJson {
    content: String,
    metadata: String,
}

impl RawJson {
    /// Parses the text into `r.content` and `r.metadata` (null when empty).
    pub fn fill(self, r: &mut MemoryRecord) -> Result<()> {
        let key = super::keys::record(r.id);
        let json = |s: &str| -> Result<serde_json::Value> {
            if s.is_empty() {
                Ok(serde_json::Value::Null)
            } else {
                serde_json::from_str(s).map_err(|e| corrupt(&key, e))
            }
        };
        r.content = json(&self.content)?;
        r.metadata = json(&self.metadata)?;
        Ok(())
    }
}

/// Decodes a whole record.
pub fn decode_record(
    id: MemoryId,
    key: &[u8],
    bytes: &[u8],
    embedding: Option<Vec<f32>>,
) -> Result<MemoryRecord> {
    let (mut r, json) = decode_deferred(id, key, bytes)?;
    json.fill(&mut r)?;
    r.embedding = embedding;
    Ok(r)
}

/// Decodes a record but its JSON fields: `content` and `metadata` are null in the record and
/// returned as text, for [`RawJson::fill`] once the caller knows it needs them.
pub fn decode_deferred(id: MemoryId, key: &[u8], bytes: &[u8]) -> Result<(MemoryRecord, RawJson)> {
    let rest = split_format(key, bytes)?;
    let (h, rest) = postcard::take_from_bytes::<Header>(rest).map_err(|e| corrupt(key, e))?;
    let (b, _) = postcard::take_from_bytes::<Body>(rest).map_err(|e| corrupt(key, e))?;
    let record = MemoryRecord {
        id,
        namespace: h.namespace,
        session_id: h.session_id,
        agent_id: h.agent_id,
        tier: h.tier,
        kind: Kind::new(h.kind).map_err(|e| corrupt(key, e))?,
        text: b.text,
        content: serde_json::Value::Null,
        metadata: serde_json::Value::Null,
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
        embedding: None,
    };
    let json = RawJson {
        content: b.content,
        metadata: b.metadata,
    };
    Ok((record, json))
}

/// The leading byte of an embedding stored at half precision (see [`encode_embedding`]).
const HALF_TAG: u8 = 0xf1;

/// Encodes an embedding at half precision: a tag byte, a power-of-two scale (its exponent
/// as i16, little-endian), then each element divided by the scale as an IEEE binary16.
/// Half the bytes of float32 for what cosine can tell apart: on W1's 100k vectors the exact
/// top-10 of 1,000 global queries keeps recall@10 0.9995 (int8 kept 0.98). The scale puts
/// the largest element in [1, 2), so any finite vector fits binary16's range, and encoding
/// a decoded vector again gives the same bytes (export and import round trips are exact).
/// The length is 3 + 2d, never a multiple of 4, which tells it from the float32 layout of
/// stores written before it (4d bytes), still read as they are.
pub fn encode_embedding(v: &[f32]) -> Vec<u8> {
    let exp = half_exponent(v);
    let mut out = Vec::with_capacity(3 + 2 * v.len());
    out.push(HALF_TAG);
    out.extend_from_slice(&(exp as i16).to_le_bytes());
    // A block at a time through a buffer on the stack: no vector of halves in between.
    let mut halves = [half::f16::ZERO; BLOCK];
    for chunk in v.chunks(BLOCK) {
        let halves = &mut halves[..chunk.len()];
        to_halves(chunk, pow2(exp), halves);
        for h in halves.iter() {
            out.extend_from_slice(&h.to_bits().to_le_bytes());
        }
    }
    out
}

/// `v` as the store keeps it: the exponent of its power-of-two scale ([`half_exponent`])
/// and each element divided by that scale, rounded to binary16.
pub(crate) fn half_precision(v: &[f32]) -> (i32, Vec<half::f16>) {
    let exp = half_exponent(v);
    let mut halves = vec![half::f16::ZERO; v.len()];
    to_halves(v, pow2(exp), &mut halves);
    (exp, halves)
}

/// The exponent of the power-of-two scale a vector is stored with: its largest element
/// divided by the scale lies in [1, 2) and stays below 2 once rounded to binary16.
pub(crate) fn half_exponent(v: &[f32]) -> i32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut exp = if max > 0.0 && max.is_finite() {
        max.log2().floor() as i32
    } else {
        0
    };
    // log2 may land a hair off at powers of two; settle it exactly, then make sure the
    // largest element does not round up to 2.0, which a second encoding would rescale.
    while exp > -149 && max < pow2(exp) {
        exp -= 1;
    }
    while exp < 127 && max >= pow2(exp + 1) {
        exp += 1;
    }
    if exp < 127 && half::f16::from_f32(max / pow2(exp)).to_f32() >= 2.0 {
        exp += 1;
    }
    exp
}

/// Elements converted at a time between binary16 and float32.
const BLOCK: usize = 64;

/// `v / scale` rounded to binary16 into `out` (as long as `v`). Converted a block at a
/// time: half's slice conversion uses the CPU's F16C instructions, its per-element one
/// checks for them on every call.
pub(crate) fn to_halves(v: &[f32], scale: f32, out: &mut [half::f16]) {
    let mut scaled = [0f32; BLOCK];
    for (chunk, dst) in v.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let n = chunk.len();
        for (s, x) in scaled.iter_mut().zip(chunk) {
            *s = x / scale;
        }
        dst.convert_from_f32_slice(&scaled[..n]);
    }
}

/// `halves × scale` into `out` (as long as `halves`): exact, as the scale is a power of two.
pub(crate) fn from_halves(halves: &[half::f16], scale: f32, out: &mut [f32]) {
    halves.convert_to_f32_slice(out);
    for x in out.iter_mut() {
        *x *= scale;
    }
}

/// 2^e as f32 for e in -149..=127, exactly (subnormal below -126).
pub(crate) fn pow2(e: i32) -> f32 {
    let e = e.clamp(-149, 127);
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (e + 149))
    }
}

/// Decodes an embedding: half precision with its scale, or the float32 of older stores.
pub fn decode_embedding(key: &[u8], bytes: &[u8]) -> Result<Vec<f32>> {
    if bytes.len().is_multiple_of(4) {
        return Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect());
    }
    match bytes {
        [HALF_TAG, e0, e1, rest @ ..] if !rest.is_empty() && rest.len().is_multiple_of(2) => {
            let scale = pow2(i32::from(i16::from_le_bytes([*e0, *e1])));
            let mut out = vec![0f32; rest.len() / 2];
            // The bytes may sit at any address in the backend's page: copy them into an
            // aligned block, then convert the block at once (see `to_halves`).
            let mut halves = [half::f16::ZERO; BLOCK];
            for (dst, src) in out.chunks_mut(BLOCK).zip(rest.chunks(2 * BLOCK)) {
                let n = dst.len();
                for (h, c) in halves.iter_mut().zip(src.chunks_exact(2)) {
                    *h = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                }
                from_halves(&halves[..n], scale, dst);
            }
            Ok(out)
        }
        _ => Err(corrupt(key, format!("embedding of {} bytes", bytes.len()))),
    }
}

/// What an embedding reads back as once stored: what the indexes and recall will see.
pub fn stored_embedding(v: &[f32]) -> Vec<f32> {
    // Decoding what was just encoded cannot fail.
    decode_embedding(&[], &encode_embedding(v)).unwrap_or_else(|_| v.to_vec())
}

/// Encodes any serde value for the store's own tables (stats, audit, queue items).
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

/// Decodes a value written by [`encode`].
pub fn decode<'a, T: Deserialize<'a>>(key: &[u8], bytes: &'a [u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| corrupt(key, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_json() -> MemoryRecord {
        let mut r = MemoryRecord::episodic(
            MemoryId(7),
            "ns",
            "s",
            Kind::new("observation").unwrap(),
            "the deploy failed",
            1_000,
        );
        r.content = serde_json::json!({"tool": "deploy", "args": [1, 2.5, "x"]});
        r.metadata = serde_json::json!({"source": "ci", "run": 41});
        r
    }

    /// The borrowed structs a record is written with give the bytes of the owned ones it is
    /// read with, field for field (a field moved or retyped in one of them fails here).
    #[test]
    fn a_record_is_written_as_its_header_and_body_are_read() {
        let mut r = with_json();
        r.agent_id = Some("planner".into());
        r.parent_id = Some("mem-00000003".into());
        r.sources = vec![MemoryId(3), MemoryId(u32::MAX)];
        r.utility = Utility {
            successes: 2,
            failures: 1,
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
            content: r.content.to_string(),
            metadata: r.metadata.to_string(),
        };
        let mut owned = vec![RECORD_FORMAT];
        owned.extend(postcard::to_allocvec(&header_of(&r)).unwrap());
        owned.extend(postcard::to_allocvec(&body).unwrap());
        assert_eq!(encode_record(&r), owned);
        let key = super::super::keys::record(r.id);
        assert_eq!(decode_record(r.id, &key, &owned, None).unwrap(), r);
    }

    #[test]
    fn a_deferred_record_is_the_whole_record_once_filled() {
        let r = with_json();
        let key = super::super::keys::record(r.id);
        let bytes = encode_record(&r);
        let (mut deferred, json) = decode_deferred(r.id, &key, &bytes).unwrap();
        assert!(deferred.content.is_null() && deferred.metadata.is_null());
        json.fill(&mut deferred).unwrap();
        assert_eq!(deferred, decode_record(r.id, &key, &bytes, None).unwrap());
        assert_eq!(deferred, r);
        // Null JSON stays null either way.
        let plain = MemoryRecord {
            content: serde_json::Value::Null,
            metadata: serde_json::Value::Null,
            ..r
        };
        let (mut back, json) = decode_deferred(plain.id, &key, &encode_record(&plain)).unwrap();
        json.fill(&mut back).unwrap();
        assert_eq!(back, plain);
    }

    #[test]
    fn a_strength_entry_carries_what_a_reinforcement_changes_and_no_more() {
        let r = with_json();
        let stored = r.policy.clone();
        let mut reinforced = MemoryRecord {
            strength: 0.75,
            strength_at: r.strength_at + 1_000,
            reinforcements: r.reinforcements + 1,
            ..r.clone()
        };
        let key = super::super::keys::strength(r.id);
        // Same policy: the entry does not repeat its stamp.
        let same = encode(&Strength::of(&reinforced, &stored));
        reinforced.policy = PolicyStamp {
            name: "other".into(),
            hash: "ff".into(),
        };
        let other = encode(&Strength::of(&reinforced, &stored));
        assert!(
            same.len() < 16 && other.len() > same.len(),
            "{same:?} {other:?}"
        );
        for (bytes, policy) in [(same, &stored), (other, &reinforced.policy)] {
            let mut back = r.clone();
            Strength::decode_over(&key, &bytes, &mut back).unwrap();
            assert_eq!(
                back,
                MemoryRecord {
                    policy: policy.clone(),
                    ..reinforced.clone()
                }
            );
        }
        assert!(matches!(
            Strength::decode_over(&key, &[0xff; 3], &mut r.clone()),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn broken_json_is_corrupt_when_it_is_parsed() {
        let r = with_json();
        let key = super::super::keys::record(r.id);
        let (mut deferred, _) = decode_deferred(r.id, &key, &encode_record(&r)).unwrap();
        let broken = RawJson {
            content: "{\"tool\":".into(),
            metadata: String::new(),
        };
        let bytes = encode_parts(&deferred, broken.content, broken.metadata);
        let (_, json) = decode_deferred(r.id, &key, &bytes).unwrap();
        assert!(matches!(
            json.fill(&mut deferred),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            decode_record(r.id, &key, &bytes, None),
            Err(Error::Corrupt { .. })
        ));
    }

    fn vector() -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
        use proptest::prelude::*;
        // Elements of one magnitude per vector, from tiny to huge, with some zeros.
        (-140i32..120, proptest::collection::vec(-1.0f32..1.0, 1..64)).prop_map(|(e, v)| {
            v.into_iter()
                .map(|x| if x.abs() < 0.05 { 0.0 } else { x * pow2(e) })
                .collect()
        })
    }

    proptest::proptest! {
        #[test]
        fn a_stored_embedding_stores_as_the_same_bytes(v in vector()) {
            let once = encode_embedding(&v);
            let back = decode_embedding(b"k", &once).unwrap();
            proptest::prop_assert_eq!(back.len(), v.len());
            proptest::prop_assert_eq!(encode_embedding(&back), once);
            // Within half a binary16 step of the largest element.
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in v.iter().zip(&back) {
                proptest::prop_assert!((a - b).abs() <= max * 2f32.powi(-10), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn a_stored_embedding_is_half_the_bytes_and_never_a_float32_length() {
        for d in 1..20 {
            let v: Vec<f32> = (0..d).map(|i| i as f32 - 3.5).collect();
            let bytes = encode_embedding(&v);
            assert_eq!(bytes.len(), 3 + 2 * d);
            assert!(!bytes.len().is_multiple_of(4));
        }
        let unit: Vec<f32> = (0..384)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 600.0)
            .collect();
        assert_eq!(encode_embedding(&unit).len(), 771);
        // The scale keeps any finite vector within binary16's range.
        for v in [
            [3.0e38f32, -1.0e38],
            [1.0e-40, 2.0e-41],
            [65504.0 * 4.0, 1.0],
        ] {
            let back = stored_embedding(&v);
            assert!(back.iter().all(|x| x.is_finite()), "{v:?} -> {back:?}");
            assert!(
                (back[0] - v[0]).abs() <= v[0].abs() * 1e-3,
                "{v:?} -> {back:?}"
            );
        }
    }

    #[test]
    fn float32_embeddings_of_older_stores_read_as_they_were() {
        let v = [0.25f32, -1.5, 3.0e-7, 12345.678];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(decode_embedding(b"k", &bytes).unwrap(), v);
    }

    #[test]
    fn an_embedding_of_a_broken_length_or_tag_is_corrupt() {
        for bytes in [
            &[HALF_TAG, 0, 0, 1][..3],
            &[HALF_TAG, 0, 0, 1, 2, 3],
            &[7, 0, 0, 1, 2],
        ] {
            let err = decode_embedding(b"k", bytes).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
        }
    }
}

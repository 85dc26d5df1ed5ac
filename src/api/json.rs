//! Reading JSON bodies strictly: a body that is not JSON is 400 `malformed_json` with where
//! it broke, JSON of the wrong shape is 422 `invalid_<what>`, and an object that repeats a
//! key is refused instead of silently keeping the last value.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::{ApiError, ApiResult};

/// Parses a JSON body: 400 when it is not JSON, with where it broke; 422 when an object
/// in it repeats a key (serde_json would keep the last one silently, while the typed
/// bodies refuse a repeated field: one rule for both).
pub(crate) fn parse_json(body: Result<Bytes, BytesRejection>) -> ApiResult<Value> {
    let body = body.map_err(ApiError::body)?;
    match serde_json::from_slice::<Strict>(&body) {
        Ok(Strict(value)) => Ok(value),
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            Err(ApiError::invalid("event", e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON ({e}); send one JSON object"),
        )),
    }
}

/// A JSON value whose objects never repeat a key.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key `{key}` appears twice in one object; send each key once"
                )));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Reads a JSON value into `T`: 422 when it is JSON of the wrong shape.
pub(crate) fn from_value<T: serde::de::DeserializeOwned>(what: &str, value: Value) -> ApiResult<T> {
    serde_json::from_value(value).map_err(|e| ApiError::invalid(what, e.to_string()))
}

/// Reads a JSON body straight into `T` (no intermediate value): 400 when it is not JSON,
/// 422 when it is JSON of the wrong shape.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    what: &str,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<T> {
    let body = body.map_err(ApiError::body)?;
    serde_json::from_slice(&body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::invalid(what, e.to_string()),
        _ => ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON ({e}); send one JSON object"),
        ),
    })
}

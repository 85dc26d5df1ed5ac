//! The contract's layer, below HTTP and MCP: the wire types of every request and answer
//! ([`wire`], re-exported here), the one error shape and its mapping from the runtime's
//! errors ([`ApiError`]), the strict JSON reader, and the reading of requests that HTTP's
//! handlers and MCP's tools share ([`requests`]), so both refuse the same input with the same
//! code and words (docs/http-api.md, docs/mcp.md).

mod error;
mod json;
pub(crate) mod requests;
mod wire;

pub use error::ApiError;
pub(crate) use error::ApiResult;
pub(crate) use json::{from_json, from_value, parse_json};
pub use wire::*;

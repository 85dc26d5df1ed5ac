//! shadowbrain, the library: the one import root of an embedding application. It re-exports
//! the actor runtime's [`Runtime`] handle and everything of the substrate under it
//! (`shadowbrain::NewMemory`, `shadowbrain::Policy`, `shadowbrain::embed`,
//! `shadowbrain::llm`, …), so an application depends on this crate alone.
//!
//! The edges the binary runs are behind cargo features, all on by default: `server` (the
//! HTTP server, its wire types, metrics and config file), `lab` (the policy lab of
//! `simulate`) and `cli` (the binary itself). An application that only embeds the runtime
//! depends on `shadowbrain = { default-features = false }` and compiles none of axum,
//! utoipa, prometheus-client, clap, indicatif or plotters.
#![warn(missing_docs)]

pub use shadowbrain_actors::{
    KnowledgeHandle, MemoryHandle, Runtime, RuntimeConfig, SessionHandle,
};
pub use shadowbrain_runtime::*;

// The root package's layers, bottom to top (docs/architecture.md, "The layer rules"); each
// uses only those below it: `api` (the contract: wire types, the error shape, requests read
// alike by HTTP and MCP) → `auth` (who a caller is) → `admission` → `metrics` → `mcp` (the
// tools over the runtime) → `http` (routes, connections, the dashboard; it mounts MCP) →
// `config` (the config file: every section, `[server]` included) → `setup` (a data
// directory opened as `serve` opens it) → `embedded` (the HTTP contract answered in-process:
// the Python package) → `cluster` (an `http` router per partition a node owns); `sim`, the
// policy lab, and `files` (export files, for `export`/`import` and `embedded`) use the
// runtime only; the CLI (`src/cli.rs`, the binary's) is on top.
#[cfg(feature = "server")]
pub(crate) mod admission;
#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod embedded;
#[cfg(feature = "server")]
pub mod files;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
pub mod mcp;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod setup;
#[cfg(feature = "lab")]
pub mod sim;

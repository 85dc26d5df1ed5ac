//! Integration tests of the `shadowbrain` package (one binary; modules below).

mod abuse;
mod cli;
mod cluster;
mod common;
mod dashboard;
mod edge;
mod embedder;
mod eval;
mod fuzz;
mod llm;
mod mcp;
mod promotion;
mod python_package;
mod server;
mod sim;

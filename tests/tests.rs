//! Integration tests of the `shadowbrain` package (one binary; modules below).

mod cli;
mod edge;
mod embedder;
mod eval;
mod llm;
mod server;
mod sim;

//! Integration tests of the `shadowbrain` package (one binary; modules below).

mod cli;
mod llm;
mod server;
mod sim;

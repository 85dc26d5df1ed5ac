//! Integration tests of the substrate, in one binary so the crate links once.

mod crash;
mod enrich;
mod idempotency;
mod knowledge;
mod lifecycle;
mod local_model;
mod log;
mod passages;
mod recall;
mod scatter;
mod store_model;
mod updates;

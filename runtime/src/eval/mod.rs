//! Retrieval evaluations that run through the real recall path (ingest into a substrate,
//! ask through [`crate::Substrate::recall`]). Data sets are read from files the
//! caller names; nothing is bundled or downloaded.

pub mod locomo;

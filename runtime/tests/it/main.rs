//! Integration tests of the substrate, in one binary so the crate links once.

mod store_model;

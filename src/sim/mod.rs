//! The policy lab: a deterministic synthetic multi-agent workload on the virtual
//! clock, to compare memory policies on identical input.
//!
//! [`workload`] plans the run (sessions, planted items with known ground truth, probes) and
//! yields its steps in time order; [`run`] plays it through the actor runtime for one
//! policy and records what became of the planted items; [`report`] and [`plots`] write
//! what `shadowbrain simulate` leaves in its output directory.

pub mod plots;
pub mod report;
pub mod run;
pub mod workload;

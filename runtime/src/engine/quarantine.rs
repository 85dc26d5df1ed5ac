//! Poison inputs: records (or events that never became records) that keep making an actor
//! fail are set aside instead of crashing it forever.
//!
//! An actor that processes records from a work queue counts a **strike** against each
//! record it was working on when it failed, in the store, so the count survives the
//! actor's restart and the process's. Once a record has [`MAX_STRIKES`] strikes it is
//! **quarantined**: taken off the queue, given a `quarantined` audit entry with the error,
//! and listed under [`Substrate::quarantined`] (the server counts them in its metrics). The
//! record itself stays in the store, as every accepted record does; only the processing
//! that kept failing on it stops.
//!
//! An event that crashes the session actor before it is written has no record yet: its
//! input is kept in the quarantine entry, under an id of its own, so it can be inspected
//! and sent again once the fault is fixed.

use super::Substrate;
use crate::error::{Error, Result};
use crate::model::{AuditAction, AuditEntry, MemoryId};
use crate::store::{Mutation, QuarantineEntry, Strikes, Visit, WriteSet};

/// Failures on the same record before it is quarantined.
pub const MAX_STRIKES: u32 = 3;

impl Substrate {
    /// The strikes counted against a record, if any.
    pub fn strikes(&self, id: MemoryId) -> Result<Option<Strikes>> {
        self.store().strikes(id)
    }

    /// Counts one strike against each of `ids` (durably, before the caller fails) and
    /// returns the new counts in order.
    pub async fn add_strikes(
        &self,
        ids: &[MemoryId],
        actor: &str,
        error: &str,
    ) -> Result<Vec<u32>> {
        let mut writes = WriteSet::new();
        let mut counts = Vec::with_capacity(ids.len());
        for &id in ids {
            let count = self.strikes(id)?.map_or(0, |s| s.count) + 1;
            let strikes = Strikes {
                count,
                actor: actor.into(),
                last_error: error.into(),
            };
            writes.push(Mutation::SetStrikes(id, strikes));
            counts.push(count);
        }
        self.store().write_async(writes).await?;
        Ok(counts)
    }

    /// The mutation that forgets a record's strikes (processing it succeeded), to commit
    /// with the result.
    pub fn clear_strikes(id: MemoryId) -> Mutation {
        Mutation::ClearStrikes(id)
    }

    /// Sets a record aside: its quarantine entry and audit entry, with `also` (e.g. taking
    /// it off its work queue) in the same commit.
    pub async fn quarantine_record(
        &self,
        namespace: &str,
        id: MemoryId,
        actor: &str,
        strikes: &Strikes,
        also: Vec<Mutation>,
    ) -> Result<QuarantineEntry> {
        let session_id = self.store().get_light(id)?.map(|r| r.session_id);
        let entry = QuarantineEntry {
            id,
            namespace: namespace.into(),
            session_id,
            actor: actor.into(),
            error: strikes.last_error.clone(),
            strikes: strikes.count,
            at: self.clock().now(),
            input: None,
        };
        let mut writes = WriteSet(also);
        writes.push(Self::clear_strikes(id));
        self.write_quarantine(&entry, writes).await?;
        Ok(entry)
    }

    /// Sets aside events that crashed the actor meant to write them: they get an id of
    /// their own, under which their input, error and audit entry are kept.
    pub async fn quarantine_input(
        &self,
        namespace: &str,
        session: &str,
        actor: &str,
        error: &str,
        strikes: u32,
        input: String,
    ) -> Result<QuarantineEntry> {
        let id = self.store().allocate_ids(1)?[0];
        let entry = QuarantineEntry {
            id,
            namespace: namespace.into(),
            session_id: Some(session.into()),
            actor: actor.into(),
            error: error.into(),
            strikes,
            at: self.clock().now(),
            input: Some(input),
        };
        self.write_quarantine(&entry, WriteSet::new()).await?;
        Ok(entry)
    }

    async fn write_quarantine(&self, entry: &QuarantineEntry, mut writes: WriteSet) -> Result<()> {
        tracing::error!(
            id = %entry.id, namespace = %entry.namespace, actor = %entry.actor,
            error = %entry.error, strikes = entry.strikes,
            "quarantined: processing it kept failing"
        );
        writes.push(Mutation::Quarantine(Box::new(entry.clone())));
        writes.push(Mutation::Audit(
            entry.id,
            AuditEntry {
                at: entry.at,
                action: AuditAction::Quarantined,
                by: entry.actor.clone(),
                detail: format!(
                    "set aside after {} failures; last error: {}",
                    entry.strikes, entry.error
                ),
            },
        ));
        self.store().write_async(writes).await
    }

    /// The quarantine entry of an id, if it was set aside.
    pub fn quarantine_entry(&self, id: MemoryId) -> Result<Option<QuarantineEntry>> {
        self.store().quarantine_entry(id)
    }

    /// Everything set aside, in id order; only `namespace`'s when given.
    pub fn quarantined(&self, namespace: Option<&str>) -> Result<Vec<QuarantineEntry>> {
        let mut out = Vec::new();
        self.store().for_each_quarantined(|entry| {
            if namespace.is_none_or(|ns| ns == entry.namespace) {
                out.push(entry);
            }
            Ok(Visit::Continue)
        })?;
        Ok(out)
    }
}

/// The text of a panic payload, for strikes and logs.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked (no message)".to_string()
    }
}

/// The error a caller gets for a quarantined input.
pub fn quarantined_error(entry: &QuarantineEntry) -> Error {
    Error::Quarantined {
        id: entry.id.to_string(),
        message: entry.error.clone(),
    }
}

//! Writing a store (or one namespace) as lines: the header, every record in id order, then
//! the extras (purged records' tombstones, quarantine entries, remembered recalls).

use crate::engine::recall_id;
use crate::error::Result;
use crate::model::MemoryId;
use crate::store::{Filter, Store, Visit};

use super::*;

/// The header an export of `store` (or of one namespace) starts with.
pub fn export_header(store: &Store, namespace: Option<&str>) -> Result<Header> {
    Ok(Header {
        embedder: store.embedder_name()?,
        dimension: store.dimension()?,
        next_id: store.next_id(),
        next_recall: store.next_recall(),
        namespace: namespace.map(str::to_string),
    })
}

/// The ids an export visits, in id order: every record, or one namespace's.
pub fn export_ids(store: &Store, namespace: Option<&str>) -> Result<Vec<MemoryId>> {
    if let Some(ns) = namespace {
        return Ok(store
            .candidates(&Filter {
                namespace: ns,
                ..Filter::default()
            })
            .into_iter()
            .map(MemoryId)
            .collect());
    }
    let mut ids = Vec::with_capacity(store.len() as usize);
    store.for_each_id(|id| {
        ids.push(id);
        Ok(Visit::Continue)
    })?;
    Ok(ids)
}

/// One record's export line; `None` when it no longer exists.
pub fn export_record(store: &Store, id: MemoryId) -> Result<Option<Exported>> {
    let Some(record) = store.get(id)? else {
        return Ok(None);
    };
    let history = store.history(id)?;
    let links = links_from(store, &record.namespace, id)?;
    let promoted_into = store.promoted_into(id)?;
    let validity = store.validity(id)?;
    let mut waiting = Vec::new();
    for w in Waiting::ALL {
        if store.is_queued(w.queue(), id)? {
            waiting.push(w);
        }
    }
    Ok(Some(Exported {
        format: FORMAT,
        record,
        history,
        links,
        promoted_into,
        validity,
        waiting,
    }))
}

/// Something an export writes after the records (see [`export_extras`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    /// A purged record's tombstone.
    Purged(MemoryId),
    /// A quarantine entry.
    Quarantine(MemoryId),
    /// A recall, by the number in its id.
    Recall(u32),
}

/// What an export writes after the records, in the order it writes them: tombstones,
/// quarantine entries, recalls (each in id order), all of them or one namespace's.
pub fn export_extras(store: &Store, namespace: Option<&str>) -> Result<Vec<Extra>> {
    let wanted = |ns: &str| namespace.is_none_or(|n| n == ns);
    let mut out = Vec::new();
    store.for_each_tombstone(|id, ns| {
        if wanted(&ns) {
            out.push(Extra::Purged(id));
        }
        Ok(Visit::Continue)
    })?;
    store.for_each_quarantined(|entry| {
        if wanted(&entry.namespace) {
            out.push(Extra::Quarantine(entry.id));
        }
        Ok(Visit::Continue)
    })?;
    store.for_each_recall(|n, recall| {
        if wanted(&recall.namespace) {
            out.push(Extra::Recall(n));
        }
        Ok(Visit::Continue)
    })?;
    Ok(out)
}

/// The line of one [`Extra`]; `None` when it is gone.
pub fn export_extra(store: &Store, extra: Extra) -> Result<Option<Line>> {
    Ok(match extra {
        Extra::Purged(id) => match store.tombstone(id)? {
            Some(namespace) => Some(Line::Purged(Purged {
                id,
                history: store.history(id)?,
                links: links_from(store, &namespace, id)?,
                namespace,
            })),
            None => None,
        },
        Extra::Quarantine(id) => {
            match store.quarantine_entry(id)? {
                Some(entry) => {
                    // A record's (or purged record's) line carries its history already.
                    let history = if store.owner(id)?.is_none() {
                        store.history(id)?
                    } else {
                        Vec::new()
                    };
                    Some(Line::Quarantine { entry, history })
                }
                None => None,
            }
        }
        Extra::Recall(n) => match store.recall(n)? {
            Some(r) => {
                let (successes, failures) = store.recall_outcomes(n)?;
                Some(Line::Recall(RecallLog {
                    id: recall_id(n),
                    namespace: r.namespace,
                    session: r.session,
                    at: r.at,
                    ids: r.ids,
                    successes,
                    failures,
                }))
            }
            None => None,
        },
    })
}

//! The in-memory catalog: roaring bitmaps of record ids by namespace, session, agent, tier,
//! kind and recallability, the long records that have passages, and the records superseded
//! or in conflict. Recall builds its candidate set from these (scoped vector and keyword
//! search take a bitmap), so a session-scoped query never even looks at another session's
//! records. Rebuilt from record headers (and the passage and validity keys) when the store
//! opens; updated by the
//! commit thread only after a write is durable, so nothing unacknowledged is ever visible.

use std::collections::HashMap;

use roaring::RoaringBitmap;

use super::codec::Header;
use crate::model::{MemoryId, Status, Tier};

/// Who may be returned: the scope and filters of one query.
#[derive(Debug, Clone, Default)]
pub struct Filter<'a> {
    /// Namespace (required: nothing crosses namespaces).
    pub namespace: &'a str,
    /// Only this session.
    pub session: Option<&'a str>,
    /// Only this agent.
    pub agent: Option<&'a str>,
    /// Only these tiers (all when `None`).
    pub tiers: Option<&'a [Tier]>,
    /// Only these kinds (all when `None`).
    pub kinds: Option<&'a [String]>,
    /// Only active and pinned records (what recall may return).
    pub recallable_only: bool,
}

/// Bitmaps of record ids.
#[derive(Debug, Default)]
pub struct Catalog {
    recallable: RoaringBitmap,
    /// Long records whose passages are stored.
    passages: RoaringBitmap,
    /// Records a newer one superseded (recall demotes them).
    superseded: RoaringBitmap,
    /// Records in an open conflict with another.
    conflicted: RoaringBitmap,
    /// By status, in [`Status::ALL`] order.
    statuses: [RoaringBitmap; 5],
    tiers: [RoaringBitmap; 3],
    namespaces: HashMap<String, Scoped>,
    /// Per namespace, graph edges written or deleted there since open: a graph cached at
    /// another count is stale (edges are written by promotion, detection and resolutions
    /// alike).
    edge_changes_in: std::collections::HashMap<String, u64>,
    /// Edges written or deleted whose namespace is not known (a cluster log's entries):
    /// they count for every namespace.
    edge_changes_anywhere: u64,
}

#[derive(Debug, Default)]
struct Scoped {
    all: RoaringBitmap,
    sessions: HashMap<String, RoaringBitmap>,
    agents: HashMap<String, RoaringBitmap>,
    kinds: HashMap<String, RoaringBitmap>,
}

/// How many records of one namespace are in each tier and status, and its sessions: what
/// an overview shows, counted from the bitmaps without reading a record.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Census {
    /// Records by tier (episodic, condensed, knowledge) and status ([`Status::ALL`] order).
    pub by_tier_status: [[u64; 5]; 3],
    /// Sessions with at least one record.
    pub sessions: usize,
}

impl Census {
    /// Every record counted.
    pub fn total(&self) -> u64 {
        self.by_tier_status.iter().flatten().sum()
    }

    /// Records of one tier, every status.
    pub fn tier(&self, tier: Tier) -> u64 {
        self.by_tier_status[tier_index(tier)].iter().sum()
    }

    /// Records of one status, every tier.
    pub fn status(&self, status: Status) -> u64 {
        self.by_tier_status
            .iter()
            .map(|t| t[status_index(status)])
            .sum()
    }
}

fn status_index(s: Status) -> usize {
    match s {
        Status::Active => 0,
        Status::Pinned => 1,
        Status::Obsolete => 2,
        Status::Archived => 3,
        Status::Wrong => 4,
    }
}

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::Episodic => 0,
        Tier::Condensed => 1,
        Tier::Knowledge => 2,
    }
}

impl Catalog {
    /// Adds a record.
    pub fn insert(&mut self, id: MemoryId, h: &Header) {
        let n = id.0;
        if h.status.recallable() {
            self.recallable.insert(n);
        } else {
            self.recallable.remove(n);
        }
        self.set_status_bit(n, h.status);
        self.tiers[tier_index(h.tier)].insert(n);
        let ns = self.namespaces.entry(h.namespace.clone()).or_default();
        ns.all.insert(n);
        ns.sessions
            .entry(h.session_id.clone())
            .or_default()
            .insert(n);
        if let Some(a) = &h.agent_id {
            ns.agents.entry(a.clone()).or_default().insert(n);
        }
        ns.kinds.entry(h.kind.clone()).or_default().insert(n);
    }

    /// Records a status change.
    pub fn set_status(&mut self, id: MemoryId, status: Status) {
        if status.recallable() {
            self.recallable.insert(id.0);
        } else {
            self.recallable.remove(id.0);
        }
        self.set_status_bit(id.0, status);
    }

    fn set_status_bit(&mut self, n: u32, status: Status) {
        for (i, b) in self.statuses.iter_mut().enumerate() {
            if i == status_index(status) {
                b.insert(n);
            } else {
                b.remove(n);
            }
        }
    }

    /// Removes a purged record.
    pub fn remove(&mut self, id: MemoryId, h: &Header) {
        let n = id.0;
        self.recallable.remove(n);
        self.passages.remove(n);
        self.superseded.remove(n);
        self.conflicted.remove(n);
        for b in &mut self.statuses {
            b.remove(n);
        }
        self.tiers[tier_index(h.tier)].remove(n);
        if let Some(ns) = self.namespaces.get_mut(&h.namespace) {
            ns.all.remove(n);
            if let Some(s) = ns.sessions.get_mut(&h.session_id) {
                s.remove(n);
            }
            if let Some(a) = h.agent_id.as_ref().and_then(|a| ns.agents.get_mut(a)) {
                a.remove(n);
            }
            if let Some(k) = ns.kinds.get_mut(&h.kind) {
                k.remove(n);
            }
        }
    }

    /// Marks whether `id` has stored passages.
    pub fn set_passages(&mut self, id: MemoryId, has: bool) {
        if has {
            self.passages.insert(id.0);
        } else {
            self.passages.remove(id.0);
        }
    }

    /// The records with stored passages (long, and embedded).
    pub fn with_passages(&self) -> &RoaringBitmap {
        &self.passages
    }

    /// Counts an edge written or deleted in `namespace` (`None`: in a namespace not known,
    /// which counts for every namespace).
    pub fn edges_changed(&mut self, namespace: Option<&str>) {
        match namespace {
            Some(ns) => *self.edge_changes_in.entry(ns.to_string()).or_default() += 1,
            None => self.edge_changes_anywhere += 1,
        }
    }

    /// Edges written or deleted since open that may be `namespace`'s.
    pub fn edge_changes_in(&self, namespace: &str) -> u64 {
        self.edge_changes_anywhere + self.edge_changes_in.get(namespace).copied().unwrap_or(0)
    }

    /// Marks whether `id` is superseded, and whether it is in an open conflict.
    pub fn set_validity(&mut self, id: MemoryId, superseded: bool, conflicted: bool) {
        for (set, on) in [
            (&mut self.superseded, superseded),
            (&mut self.conflicted, conflicted),
        ] {
            if on {
                set.insert(id.0);
            } else {
                set.remove(id.0);
            }
        }
    }

    /// The records a newer one superseded.
    pub fn superseded(&self) -> &RoaringBitmap {
        &self.superseded
    }

    /// The records in an open conflict.
    pub fn conflicted(&self) -> &RoaringBitmap {
        &self.conflicted
    }

    /// The ids a query may see.
    ///
    /// Every step intersects with the (usually small) scope first: a session's few hundred
    /// ids against a tier, never a union of whole tiers of 100k ids against the session,
    /// and never a clone of the namespace's bitmap just to narrow it (such copies are a
    /// visible part of a loaded server's recall CPU).
    pub fn candidates(&self, f: &Filter<'_>) -> RoaringBitmap {
        let Some(ns) = self.namespaces.get(f.namespace) else {
            return RoaringBitmap::new();
        };
        let base = match (f.session, f.agent) {
            (Some(s), _) => ns.sessions.get(s),
            (None, Some(a)) => ns.agents.get(a),
            (None, None) => Some(&ns.all),
        };
        let Some(base) = base else {
            return RoaringBitmap::new();
        };
        let mut set = match f.tiers {
            Some(tiers) => {
                let mut kept = RoaringBitmap::new();
                for t in tiers {
                    kept |= base & &self.tiers[tier_index(*t)];
                }
                kept
            }
            None => base.clone(),
        };
        if let (Some(_), Some(a)) = (f.session, f.agent) {
            match ns.agents.get(a) {
                Some(agent) => set &= agent,
                None => set.clear(),
            }
        }
        if let Some(kinds) = f.kinds {
            let mut kept = RoaringBitmap::new();
            for k in kinds {
                if let Some(b) = ns.kinds.get(k) {
                    kept |= &set & b;
                }
            }
            set = kept;
        }
        if f.recallable_only {
            set &= &self.recallable;
        }
        set
    }

    /// Records of one tier.
    pub fn tier_len(&self, tier: Tier) -> u64 {
        self.tiers[tier_index(tier)].len()
    }

    /// Archived records (kept for history until purged).
    pub fn archived_len(&self) -> u64 {
        self.statuses[status_index(Status::Archived)].len()
    }

    /// One namespace's records by tier and status, and its sessions.
    pub fn census(&self, namespace: &str) -> Census {
        let mut census = Census::default();
        let Some(ns) = self.namespaces.get(namespace) else {
            return census;
        };
        for (t, tier) in self.tiers.iter().enumerate() {
            let in_tier = &ns.all & tier;
            for (s, status) in self.statuses.iter().enumerate() {
                census.by_tier_status[t][s] = in_tier.intersection_len(status);
            }
        }
        census.sessions = ns.sessions.values().filter(|s| !s.is_empty()).count();
        census
    }

    /// The sessions of one namespace with at least one record (those [`Catalog::census`]
    /// counts), in no order.
    pub fn sessions_with_records(&self, namespace: &str) -> Vec<String> {
        match self.namespaces.get(namespace) {
            Some(ns) => ns
                .sessions
                .iter()
                .filter(|(_, ids)| !ids.is_empty())
                .map(|(s, _)| s.clone())
                .collect(),
            None => Vec::new(),
        }
    }

    /// One namespace's records in `status`.
    pub fn with_status(&self, namespace: &str, status: Status) -> RoaringBitmap {
        match self.namespaces.get(namespace) {
            Some(ns) => &ns.all & &self.statuses[status_index(status)],
            None => RoaringBitmap::new(),
        }
    }

    /// Number of records known.
    pub fn len(&self) -> u64 {
        self.tiers.iter().map(|t| t.len()).sum()
    }

    /// Whether the catalog is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every namespace with records.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v: Vec<String> = self.namespaces.keys().cloned().collect();
        v.sort();
        v
    }
}

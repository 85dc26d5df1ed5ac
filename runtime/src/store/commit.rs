//! Group commit. One thread owns every write to the store: it takes the first waiting
//! write set, gathers whatever else arrived meanwhile, encodes them all, commits them in one
//! durable backend commit (one fsync), then updates the catalog and answers every writer.
//! Owning all writes in one thread also makes read-modify-write tables (session stats,
//! sequence counters) race-free without locks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::catalog::Catalog;
use super::codec::{self, Header};
use super::families::{self, Reinforcements};
use super::keys::{self, meta};
use super::kv::{Kv, Op, Range, Visit};
use super::log::{self, CommitLog};
use super::{Change, Mutation, Queue, RecordPatch, SessionStats, Validity, WriteSet};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::model::{MemoryId, MemoryRecord, Status, Tier};

/// Most write sets folded into one commit: bounds the latency a single large group adds.
const MAX_GROUP: usize = 512;

/// How long a group holding only detached writes waits for more before it commits. A crash
/// within it loses what detached writes always risked (a reinforcement, a recall's memory
/// for feedback). It bounds the flushes a stream of recalls causes; it does not make their
/// writes cheaper (each recall rewrites the records it reinforces): 10 ms and 50 ms gave
/// the same HTTP recall throughput.
const DETACHED_LINGER: Duration = Duration::from_millis(10);

/// Cumulative group-commit counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Durable backend commits (fsyncs).
    pub commits: u64,
    /// Write sets committed; `write_sets / commits` is the average group size.
    pub write_sets: u64,
}

/// Where the outcome goes: a blocked thread or an awaiting task.
pub(super) enum Reply {
    Blocking(mpsc::SyncSender<Result<()>>),
    Async(oneshot::Sender<Result<()>>),
    /// Nobody waits (side effects such as recall's reinforcement): a failure is logged.
    Detached,
}

impl Reply {
    fn send(self, r: Result<()>) {
        // A writer that gave up waiting is not an error for the others.
        match self {
            Reply::Blocking(tx) => {
                let _ = tx.send(r);
            }
            Reply::Async(tx) => {
                let _ = tx.send(r);
            }
            Reply::Detached => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "a write nobody waited for failed");
                }
            }
        }
    }
}

/// What a request asks of the commit thread.
enum Work {
    /// A write set to encode and commit.
    Writes(WriteSet),
    /// A cluster log's entries, (position, bytes), to apply as they are: the store of a
    /// standby following its partition's owner (see `log.rs`).
    Logged(Vec<(u64, Vec<u8>)>),
}

struct Request {
    work: Work,
    reply: Reply,
}

/// An encoded write set waiting for its commit: who to answer, its operations, and what it
/// changes in the catalog once committed.
type Accepted = (Reply, Vec<Op>, Vec<CatalogOp>);

#[derive(Debug)]
pub(super) struct Committer {
    tx: Mutex<Option<mpsc::Sender<Request>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_seq: Arc<AtomicU64>,
    commits: Arc<AtomicU64>,
    write_sets: Arc<AtomicU64>,
    /// Write sets submitted and not yet committed (or refused).
    backlog: Arc<AtomicU64>,
}

/// Overlay entries to put back if a write set fails to encode: each key's value before.
type Undo = Vec<(Vec<u8>, Option<Option<Vec<u8>>>)>;

enum CatalogOp {
    Insert(MemoryId, Header),
    Status(MemoryId, Status),
    Remove(MemoryId, Header),
    Passages(MemoryId, bool),
    Validity(MemoryId, bool, bool),
    /// An edge of this namespace was written or deleted.
    Edges(String),
}

/// A write set's reinforcement-log entries, one per session and recall, before they are
/// written. Each entry takes its sequence at its first reinforcement, so a history orders it
/// among the write set's other audit entries where it happened; a reinforcement after any
/// other sequence was taken starts a new entry (a recall's write set takes none, so it
/// keeps one entry per session).
#[derive(Default)]
struct ReinforcementLog {
    entries: Vec<(String, String, u64, Reinforcements)>,
    /// The sequence the newest entry took.
    last_seq: Option<u64>,
    /// The first entry a reinforcement may still join.
    joinable_from: usize,
}

impl ReinforcementLog {
    fn add(
        &mut self,
        worker: &mut Worker,
        namespace: String,
        session: String,
        at: Timestamp,
        by: String,
        item: (MemoryId, f32, f32),
    ) {
        if worker.next_seq.checked_sub(1) != self.last_seq {
            self.joinable_from = self.entries.len();
        }
        let joinable = self.entries[self.joinable_from..]
            .iter_mut()
            .find(|(ns, s, _, e)| *ns == namespace && *s == session && e.at == at && e.by == by);
        match joinable {
            Some((_, _, _, entry)) => entry.items.push(item),
            None => {
                let seq = worker.seq();
                self.last_seq = Some(seq);
                let items = vec![item];
                self.entries
                    .push((namespace, session, seq, Reinforcements { at, by, items }));
            }
        }
    }
}

struct Worker {
    kv: Arc<dyn Kv>,
    /// The store's directory: a failed commit checks the space left on its disk.
    dir: PathBuf,
    catalog: Arc<RwLock<Catalog>>,
    next_id: Arc<AtomicU32>,
    next_recall: Arc<AtomicU32>,
    next_seq: u64,
    shared_seq: Arc<AtomicU64>,
    stats: HashMap<Vec<u8>, SessionStats>,
    /// Values of read-modify-write keys (records, validity) written earlier in the current
    /// group, by key (`None`: deleted), so a patch later in the same group applies to what
    /// it will follow, not to the disk's older copy.
    overlay: HashMap<Vec<u8>, Option<Vec<u8>>>,
    commits: Arc<AtomicU64>,
    write_sets: Arc<AtomicU64>,
    backlog: Arc<AtomicU64>,
    /// In a cluster, where each group goes before it is committed here.
    log: Option<Arc<dyn CommitLog>>,
    /// A standby's store: written only by its owner's log (and its own index bookkeeping).
    standby: bool,
}

/// Space left under which a failed write is taken for a full disk even when the backend
/// reports it as something else: LMDB answers a write into a full filesystem with `EIO`.
const NEARLY_FULL: u64 = 64 << 20;

/// The bytes still free on `dir`'s disk when `e` comes from that disk being full: the
/// error says so (`ENOSPC`, `EDQUOT`), or it is an I/O error while almost nothing is free.
/// `None` for every other failure.
fn disk_full(dir: &Path, e: &Error) -> Option<u64> {
    let mut says_full = false;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let io = c
            .downcast_ref::<std::io::Error>()
            .or_else(|| match c.downcast_ref() {
                Some(heed::Error::Io(io)) => Some(io),
                _ => None,
            });
        if let Some(io) = io {
            says_full |= io.kind() == std::io::ErrorKind::StorageFull
                || io.kind() == std::io::ErrorKind::QuotaExceeded
                || matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
        }
        cause = c.source();
    }
    let free = free_bytes(dir)?;
    (says_full || free < NEARLY_FULL).then_some(free)
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stat` is written in full when the call succeeds.
    let stat = unsafe {
        if libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return None;
        }
        stat.assume_init()
    };
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// The id counters every commit persists (handed out in memory, ahead of the disk).
pub(super) struct Counters {
    /// Next record id.
    pub next_id: Arc<AtomicU32>,
    /// Next recall number.
    pub next_recall: Arc<AtomicU32>,
}

impl Committer {
    pub(super) fn start(
        kv: Arc<dyn Kv>,
        catalog: Arc<RwLock<Catalog>>,
        counters: Counters,
        next_seq: u64,
        dir: PathBuf,
        log: Option<Arc<dyn CommitLog>>,
        standby: bool,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let shared_seq = Arc::new(AtomicU64::new(next_seq));
        let commits = Arc::new(AtomicU64::new(0));
        let write_sets = Arc::new(AtomicU64::new(0));
        let backlog = Arc::new(AtomicU64::new(0));
        let mut worker = Worker {
            kv,
            dir,
            catalog,
            next_id: counters.next_id,
            next_recall: counters.next_recall,
            next_seq,
            shared_seq: shared_seq.clone(),
            stats: HashMap::new(),
            overlay: HashMap::new(),
            commits: commits.clone(),
            write_sets: write_sets.clone(),
            backlog: backlog.clone(),
            log,
            standby,
        };
        let thread = std::thread::Builder::new()
            .name("store-commit".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| Error::io("store-commit thread", e))?;
        Ok(Committer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            next_seq: shared_seq,
            commits,
            write_sets,
            backlog,
        })
    }

    pub(super) fn submit_blocking(&self, writes: WriteSet) -> Result<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit(writes, Reply::Blocking(tx))?;
        rx.recv().unwrap_or(Err(Error::Closed))
    }

    pub(super) async fn submit_async(&self, writes: WriteSet) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(writes, Reply::Async(tx))?;
        rx.await.unwrap_or(Err(Error::Closed))
    }

    pub(super) fn submit_detached(&self, writes: WriteSet) -> Result<()> {
        self.submit(writes, Reply::Detached)
    }

    /// Applies a cluster log's entries (see [`Worker::apply_logged`]); returns once they
    /// are durable.
    pub(super) fn apply_logged(&self, entries: Vec<(u64, Vec<u8>)>) -> Result<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Work::Logged(entries), Reply::Blocking(tx))?;
        rx.recv().unwrap_or(Err(Error::Closed))
    }

    fn submit(&self, writes: WriteSet, reply: Reply) -> Result<()> {
        self.send(Work::Writes(writes), reply)
    }

    fn send(&self, work: Work, reply: Reply) -> Result<()> {
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let tx = guard.as_ref().ok_or(Error::Closed)?;
        self.backlog.fetch_add(1, Ordering::Relaxed);
        tx.send(Request { work, reply }).map_err(|_| {
            self.backlog.fetch_sub(1, Ordering::Relaxed);
            Error::Closed
        })
    }

    /// Write sets waiting for the commit thread.
    pub(super) fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Relaxed)
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq.load(Ordering::SeqCst)
    }

    pub(super) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            write_sets: self.write_sets.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish what it holds and exit; joining makes
        // "the store is dropped" mean "every accepted write is on disk".
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Worker {
    fn run(&mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            // A group of detached writes only (recall's reinforcement and its memory for
            // feedback) keeps the door open a little: nobody waits for them, and a stream of
            // recalls then shares one flush instead of paying one each. A write somebody
            // waits for closes the group at once.
            let linger_until = Instant::now() + DETACHED_LINGER;
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {
                        let waited_on = group.iter().any(|r| !matches!(r.reply, Reply::Detached));
                        let left = linger_until.saturating_duration_since(Instant::now());
                        if waited_on || left.is_zero() {
                            break;
                        }
                        match rx.recv_timeout(left) {
                            Ok(r) => group.push(r),
                            Err(_) => break,
                        }
                    }
                }
            }
            self.commit_group(group);
        }
    }

    fn commit_group(&mut self, group: Vec<Request>) {
        let n = group.len() as u64;
        self.commit_group_inner(group);
        self.overlay.clear();
        self.backlog.fetch_sub(n, Ordering::Relaxed);
    }

    fn commit_group_inner(&mut self, group: Vec<Request>) {
        let seq_before = self.next_seq;
        let mut accepted: Vec<Accepted> = Vec::with_capacity(group.len());
        let mut local: Vec<Accepted> = Vec::new();
        let mut logged = Vec::new();
        for req in group {
            let writes = match req.work {
                Work::Writes(writes) => writes,
                Work::Logged(entries) => {
                    logged.push((entries, req.reply));
                    continue;
                }
            };
            // Truncating the change log is an index's bookkeeping, and every copy of a
            // store keeps indexes of its own: each truncates its own change log once its
            // indexes built it, so that never goes to a cluster's log. (Logged, it would
            // make a standby drop changes its own indexes had not built yet.)
            let own = writes
                .0
                .iter()
                .all(|m| matches!(m, Mutation::TruncateChanges(_)));
            if self.standby && !own {
                req.reply.send(Err(Error::invalid(
                    "write",
                    "this store is a standby copy of a cluster partition: it takes writes \
                     only from its owner's log; send the write to the partition's owner",
                )));
                continue;
            }
            match self.encode(writes) {
                Ok((ops, cat)) if own && self.log.is_some() => local.push((req.reply, ops, cat)),
                Ok((ops, cat)) => accepted.push((req.reply, ops, cat)),
                Err(e) => {
                    req.reply.send(Err(e));
                }
            }
        }
        if let Some(log) = self.log.clone().filter(|_| !accepted.is_empty()) {
            self.commit_logged(log.as_ref(), accepted, seq_before);
        } else if !accepted.is_empty() {
            let counters = self.counters();
            let mut batches: Vec<&[Op]> =
                accepted.iter().map(|(_, ops, _)| ops.as_slice()).collect();
            batches.push(&counters);
            let outcome = self.kv.commit(&batches);
            self.answer(accepted, outcome, Some(seq_before));
        }
        if !local.is_empty() {
            let batches: Vec<&[Op]> = local.iter().map(|(_, ops, _)| ops.as_slice()).collect();
            let outcome = self.kv.commit(&batches);
            self.answer(local, outcome, None);
        }
        for (entries, reply) in logged {
            let outcome = self.apply_logged(entries);
            if let Err(e) = &outcome {
                tracing::error!(error = %e, "cannot apply the cluster log's entries to this copy");
            }
            reply.send(outcome);
        }
    }

    /// Applies a cluster log's entries as they are, with the last one's position, in one
    /// transaction (entries at or below the applied position are skipped), then brings
    /// what lives in memory up to date: the counters from the entries' own, the cached
    /// session statistics, and the catalog of every record the entries touched, so that
    /// the store a standby took over answers like its owner's.
    fn apply_logged(&mut self, entries: Vec<(u64, Vec<u8>)>) -> Result<()> {
        let before = log::applied(self.kv.as_ref())?;
        let mut last = before;
        let mut ops = Vec::new();
        for (position, entry) in &entries {
            if *position <= last {
                continue;
            }
            ops.extend(log::decode_entry(entry)?);
            last = *position;
        }
        if ops.is_empty() {
            // Entries with nothing to write (a cluster skips those no node sealed) still
            // move the position, so they are not read again.
            if last > before {
                self.kv.commit(&[&[log::applied_op(last)]])?;
            }
            return Ok(());
        }
        // Each touched record's header as the catalog has it, read before the commit.
        let mut touched: HashMap<MemoryId, Option<Header>> = HashMap::new();
        let mut edges = false;
        for op in &ops {
            let (Op::Put(key, _) | Op::Delete(key)) = op;
            match key.first().copied() {
                Some(keys::family::RECORD | keys::family::PASSAGES | keys::layer::VALIDITY) => {
                    if let Some(id) = keys::id_from_key(key)
                        && !touched.contains_key(&id)
                    {
                        let before = self.header(id)?;
                        touched.insert(id, before);
                    }
                }
                Some(keys::layer::GRAPH_EDGE) => edges = true,
                Some(keys::family::SESSION_STATS) => {
                    self.stats.remove(key.as_slice());
                }
                _ => {}
            }
        }
        ops.push(log::applied_op(last));
        self.kv.commit(&[&ops])?;
        let kv = self.kv.as_ref();
        if let Some(seq) = super::read_u64(kv, meta::NEXT_SEQ)? {
            self.next_seq = seq;
        }
        if let Some(id) = super::read_u32(kv, meta::NEXT_ID)? {
            self.next_id.fetch_max(id, Ordering::SeqCst);
        }
        if let Some(n) = super::read_u32(kv, meta::NEXT_RECALL)? {
            self.next_recall.fetch_max(n, Ordering::SeqCst);
        }
        self.shared_seq.store(self.next_seq, Ordering::SeqCst);
        self.commits.fetch_add(1, Ordering::Relaxed);
        let mut after = Vec::with_capacity(touched.len());
        for id in touched.keys() {
            let validity = match self.kv.get(&keys::validity(*id))? {
                Some(v) => Some(codec::decode::<Validity>(&keys::validity(*id), &v)?),
                None => None,
            };
            let passages = self.kv.get(&keys::passages(*id))?.is_some();
            after.push((*id, self.header(*id)?, passages, validity));
        }
        let mut catalog = self.catalog.write().unwrap_or_else(|p| p.into_inner());
        for (id, header, passages, validity) in after {
            if let Some(Some(before)) = touched.get(&id) {
                catalog.remove(id, before);
            }
            if let Some(h) = header {
                catalog.insert(id, &h);
                catalog.set_passages(id, passages);
                if let Some(v) = validity {
                    catalog.set_validity(id, v.superseded(), !v.conflicts.is_empty());
                }
            }
        }
        if edges {
            catalog.edges_changed(None);
        }
        Ok(())
    }

    /// A stored record's header (`None`: no such record).
    fn header(&self, id: MemoryId) -> Result<Option<Header>> {
        let key = keys::record(id);
        match self.kv.get(&key)? {
            Some(v) => codec::decode_header(&key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// The operations that persist the id counters, committed with every group.
    fn counters(&self) -> Vec<Op> {
        vec![
            Op::Put(
                keys::meta(meta::NEXT_SEQ),
                self.next_seq.to_be_bytes().to_vec(),
            ),
            Op::Put(
                keys::meta(meta::NEXT_ID),
                self.next_id.load(Ordering::SeqCst).to_be_bytes().to_vec(),
            ),
            Op::Put(
                keys::meta(meta::NEXT_RECALL),
                self.next_recall
                    .load(Ordering::SeqCst)
                    .to_be_bytes()
                    .to_vec(),
            ),
        ]
    }

    /// A cluster's group: cut into entries of at most the log's size (whole write sets),
    /// each appended to the log and then committed here with its log position in the same
    /// transaction. An entry the log refuses is answered with the log's error, and so is
    /// every entry after it (the log refuses them too until its owner caught up).
    fn commit_logged(&mut self, log: &dyn CommitLog, accepted: Vec<Accepted>, seq_before: u64) {
        let limit = log.max_entry_bytes();
        let mut chunks: Vec<Vec<Accepted>> = Vec::new();
        let mut size = usize::MAX;
        for a in accepted {
            let bytes: usize = a.1.iter().map(log::op_bytes).sum();
            if size.saturating_add(bytes) > limit {
                chunks.push(Vec::new());
                size = 0;
            }
            size += bytes;
            chunks.last_mut().expect("pushed above").push(a);
        }
        // Sequences are only given back while nothing of the group was committed.
        let mut rollback = Some(seq_before);
        let mut failed: Option<String> = None;
        for chunk in chunks {
            if let Some(message) = &failed {
                for (reply, _, _) in chunk {
                    reply.send(Err(Error::Unavailable {
                        what: "the cluster log".into(),
                        message: format!("an earlier part of this commit group failed: {message}"),
                    }));
                }
                continue;
            }
            // One batch: the entry's operations, the counters (logged too, so a replica
            // hands out the same ids) and the log position commit atomically on either
            // backend.
            let mut ops: Vec<Op> = chunk
                .iter()
                .flat_map(|(_, ops, _)| ops.iter().cloned())
                .collect();
            ops.extend(self.counters());
            let entry = log::encode_entry(&ops);
            let outcome = match log.append(&entry) {
                Ok(position) => {
                    ops.push(log::applied_op(position));
                    let outcome = self.kv.commit(&[&ops]);
                    if let Err(e) = &outcome {
                        log.local_commit_failed(position, e);
                    }
                    outcome
                }
                Err(e) => Err(e),
            };
            match &outcome {
                Ok(()) => rollback = None,
                // Too large for one message: nothing was sent, the rest may go on.
                Err(Error::TooLarge { .. }) => {}
                Err(e) => failed = Some(e.to_string()),
            }
            self.answer(chunk, outcome, rollback);
        }
    }

    /// Updates the catalog and answers every writer of a committed group, or gives every
    /// writer the error of a failed one.
    /// `rollback`: the sequence to give back on failure, if nothing was committed yet.
    fn answer(&mut self, accepted: Vec<Accepted>, outcome: Result<()>, rollback: Option<u64>) {
        match outcome {
            Ok(()) => {
                self.shared_seq.store(self.next_seq, Ordering::SeqCst);
                self.commits.fetch_add(1, Ordering::Relaxed);
                self.write_sets
                    .fetch_add(accepted.len() as u64, Ordering::Relaxed);
                {
                    let mut catalog = self.catalog.write().unwrap_or_else(|p| p.into_inner());
                    for (_, _, cat) in &accepted {
                        for op in cat {
                            match op {
                                CatalogOp::Insert(id, h) => catalog.insert(*id, h),
                                CatalogOp::Status(id, s) => catalog.set_status(*id, *s),
                                CatalogOp::Remove(id, h) => catalog.remove(*id, h),
                                CatalogOp::Passages(id, has) => catalog.set_passages(*id, *has),
                                CatalogOp::Validity(id, superseded, conflicted) => {
                                    catalog.set_validity(*id, *superseded, *conflicted)
                                }
                                CatalogOp::Edges(ns) => catalog.edges_changed(Some(ns)),
                            }
                        }
                    }
                }
                for (reply, _, _) in accepted {
                    reply.send(Ok(()));
                }
            }
            Err(Error::TooLarge {
                field,
                size,
                limit,
                hint,
            }) => {
                // A write set larger than one cluster log message: nothing was sent.
                if let Some(seq) = rollback {
                    self.next_seq = seq;
                }
                self.stats.clear();
                for (reply, _, _) in accepted {
                    reply.send(Err(Error::TooLarge {
                        field: field.clone(),
                        size,
                        limit,
                        hint: hint.clone(),
                    }));
                }
            }
            Err(Error::Unavailable { what, message }) => {
                // The cluster log refused or did not confirm the entry: nothing was
                // committed here. The writers may retry (on the new owner).
                if let Some(seq) = rollback {
                    self.next_seq = seq;
                }
                self.stats.clear();
                tracing::warn!(%what, %message, "a commit group was not logged; nothing in it was committed");
                for (reply, _, _) in accepted {
                    reply.send(Err(Error::Unavailable {
                        what: what.clone(),
                        message: message.clone(),
                    }));
                }
            }
            Err(e) => {
                if let Some(seq) = rollback {
                    self.next_seq = seq;
                }
                self.stats.clear();
                let full = disk_full(&self.dir, &e);
                match full {
                    Some(free_bytes) => tracing::error!(
                        error = %e,
                        dir = %self.dir.display(),
                        free_bytes,
                        "the store's disk is full; nothing in this group was written, and \
                         writes are refused (507 storage_full) until space is freed"
                    ),
                    None => tracing::error!(
                        error = %e,
                        "store commit failed; nothing in this group was written"
                    ),
                }
                // Every writer of the group gets the backend's error, source and all.
                let (message, source) = match e {
                    Error::Storage {
                        message, source, ..
                    } => (message, source),
                    other => (
                        other.to_string(),
                        Some(Arc::new(other) as crate::error::Source),
                    ),
                };
                for (reply, _, _) in accepted {
                    reply.send(Err(match full {
                        Some(free_bytes) => Error::StorageFull {
                            dir: self.dir.clone(),
                            free_bytes,
                            message: message.clone(),
                            source: source.clone(),
                        },
                        None => Error::Storage {
                            backend: self.kv.backend().as_str(),
                            message: message.clone(),
                            source: source.clone(),
                        },
                    }));
                }
            }
        }
    }

    /// The stored entry of an idempotency key, if any.
    fn decoded_idempotent(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<families::Idempotent>> {
        let k = keys::idempotent(namespace, key);
        match self.kv.get(&k)? {
            Some(v) => codec::decode(&k, &v).map(Some),
            None => Ok(None),
        }
    }

    fn seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    fn stats_entry(&mut self, namespace: &str, session: &str) -> Result<&mut SessionStats> {
        let key = keys::session_stats(namespace, session);
        if !self.stats.contains_key(&key) {
            let current = match self.kv.get(&key)? {
                Some(v) => codec::decode(&key, &v)?,
                None => SessionStats {
                    session_id: session.to_string(),
                    events: 0,
                    memories: 0,
                    first_active: i64::MAX,
                    last_active: i64::MIN,
                },
            };
            // Bound the cache: session stats are small but sessions are many.
            if self.stats.len() > 100_000 {
                self.stats.clear();
            }
            self.stats.insert(key.clone(), current);
        }
        Ok(self.stats.get_mut(&key).expect("inserted above"))
    }

    fn encode(&mut self, writes: WriteSet) -> Result<(Vec<Op>, Vec<CatalogOp>)> {
        let mut touched: Vec<Vec<u8>> = Vec::new();
        let mut undo: Undo = Vec::new();
        let result = self.encode_into(writes, &mut touched, &mut undo);
        if result.is_err() {
            // The cached stats and the overlay were changed for a write set that will not be
            // committed: put them back.
            for key in &touched {
                self.stats.remove(key);
            }
            for (key, before) in undo.into_iter().rev() {
                match before {
                    Some(b) => self.overlay.insert(key, b),
                    None => self.overlay.remove(&key),
                };
            }
        }
        result
    }

    /// The record as this group will leave it: from the overlay, else from disk.
    fn current(&self, id: MemoryId) -> Result<Option<Vec<u8>>> {
        self.current_at(&keys::record(id))
    }

    /// The value under `key` as this group will leave it.
    fn current_at(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.overlay.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.kv.get(key),
        }
    }

    fn set_overlay(&mut self, undo: &mut Undo, key: Vec<u8>, v: Option<Vec<u8>>) {
        undo.push((key.clone(), self.overlay.insert(key, v)));
    }

    /// Lays the record's reinforced strength, as this group leaves it, over `r` (see
    /// [`codec::Strength`]); whether it had one.
    fn lay_strength_over(&self, r: &mut MemoryRecord) -> Result<bool> {
        let key = keys::strength(r.id);
        match self.current_at(&key)? {
            Some(bytes) => {
                codec::Strength::decode_over(&key, &bytes, r)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Drops a record's reinforced strength: the record's own bytes now carry it (or the
    /// record is gone).
    fn drop_strength(&mut self, id: MemoryId, ops: &mut Vec<Op>, undo: &mut Undo) {
        let key = keys::strength(id).to_vec();
        self.set_overlay(undo, key.clone(), None);
        ops.push(Op::Delete(key));
    }

    /// Applies a patch to the record as this group leaves it; `false` (nothing written)
    /// when the record is gone, or when `if_strength_at` is set and no longer matches.
    fn patch(
        &mut self,
        id: MemoryId,
        patch: &RecordPatch,
        if_strength_at: Option<Timestamp>,
        ops: &mut Vec<Op>,
        cat: &mut Vec<CatalogOp>,
        undo: &mut Undo,
    ) -> Result<bool> {
        let key = keys::record(id);
        // A record purged meanwhile has nothing left to patch.
        let Some(bytes) = self.current(id)? else {
            return Ok(false);
        };
        let mut r = codec::decode_record(id, &key, &bytes, None)?;
        let reinforced = self.lay_strength_over(&mut r)?;
        if if_strength_at.is_some_and(|at| at != r.strength_at) {
            return Ok(false);
        }
        let status_before = r.status;
        patch.apply(&mut r);
        let bytes = codec::encode_record(&r);
        self.set_overlay(undo, keys::record(id).to_vec(), Some(bytes.clone()));
        ops.push(Op::Put(key.to_vec(), bytes));
        if reinforced {
            self.drop_strength(id, ops, undo);
        }
        if r.status != status_before {
            cat.push(CatalogOp::Status(id, r.status));
        }
        Ok(true)
    }

    fn encode_into(
        &mut self,
        writes: WriteSet,
        touched: &mut Vec<Vec<u8>>,
        undo: &mut Undo,
    ) -> Result<(Vec<Op>, Vec<CatalogOp>)> {
        // An event's write is four mutations and eight operations (its record, vector,
        // listings, change and audit entries): sized for that, a batch of a thousand
        // events does not copy its operations over and over as they grow.
        let mut ops = Vec::with_capacity(writes.0.len() * 2);
        let mut cat = Vec::with_capacity(writes.0.len() / 4);
        let mut reinforced = ReinforcementLog::default();
        for m in writes.0 {
            match m {
                Mutation::Insert(r) => {
                    let id = r.id;
                    let bytes = codec::encode_record(&r);
                    self.set_overlay(undo, keys::record(id).to_vec(), Some(bytes.clone()));
                    ops.push(Op::Put(keys::record(id).to_vec(), bytes));
                    if let Some(e) = &r.embedding {
                        ops.push(Op::Put(
                            keys::embedding(id).to_vec(),
                            codec::encode_embedding(e),
                        ));
                    }
                    ops.push(Op::Put(
                        keys::session_entry(&r.namespace, &r.session_id, r.event_time, id),
                        Vec::new(),
                    ));
                    ops.push(Op::Put(
                        keys::namespace_entry(&r.namespace, r.event_time, id),
                        Vec::new(),
                    ));
                    let stats = self.stats_entry(&r.namespace, &r.session_id)?;
                    stats.memories += 1;
                    if r.tier == Tier::Episodic {
                        stats.events += 1;
                    }
                    stats.first_active = stats.first_active.min(r.recorded_time);
                    stats.last_active = stats.last_active.max(r.recorded_time);
                    touched.push(keys::session_stats(&r.namespace, &r.session_id));
                    let seq = self.seq();
                    ops.push(Op::Put(
                        keys::change(seq).to_vec(),
                        codec::encode(&Change::Upsert(id)),
                    ));
                    cat.push(CatalogOp::Insert(id, codec::header_of(&r)));
                }
                Mutation::Update { record: r, reindex } => {
                    let id = r.id;
                    let bytes = codec::encode_record(&r);
                    self.set_overlay(undo, keys::record(id).to_vec(), Some(bytes.clone()));
                    ops.push(Op::Put(keys::record(id).to_vec(), bytes));
                    // The caller read the record with its reinforced strength laid over it,
                    // so the bytes just written carry it.
                    if self.current_at(&keys::strength(id))?.is_some() {
                        self.drop_strength(id, &mut ops, undo);
                    }
                    if reindex {
                        match &r.embedding {
                            Some(e) => ops.push(Op::Put(
                                keys::embedding(id).to_vec(),
                                codec::encode_embedding(e),
                            )),
                            None => {
                                ops.push(Op::Delete(keys::embedding(id).to_vec()));
                                ops.push(Op::Delete(keys::passages(id).to_vec()));
                                cat.push(CatalogOp::Passages(id, false));
                            }
                        }
                        let seq = self.seq();
                        ops.push(Op::Put(
                            keys::change(seq).to_vec(),
                            codec::encode(&Change::Upsert(id)),
                        ));
                    }
                    cat.push(CatalogOp::Status(id, r.status));
                }
                Mutation::Purge(r) => {
                    let id = r.id;
                    self.set_overlay(undo, keys::record(id).to_vec(), None);
                    ops.push(Op::Delete(keys::record(id).to_vec()));
                    ops.push(Op::Delete(keys::embedding(id).to_vec()));
                    ops.push(Op::Delete(keys::passages(id).to_vec()));
                    ops.push(Op::Put(
                        keys::tombstone(id).to_vec(),
                        r.namespace.as_bytes().to_vec(),
                    ));
                    ops.push(families::purged_session_op(id, &r.session_id));
                    self.drop_strength(id, &mut ops, undo);
                    ops.push(Op::Delete(keys::session_entry(
                        &r.namespace,
                        &r.session_id,
                        r.event_time,
                        id,
                    )));
                    ops.push(Op::Delete(keys::namespace_entry(
                        &r.namespace,
                        r.event_time,
                        id,
                    )));
                    for q in [
                        Queue::Enrich,
                        Queue::Evaluate,
                        Queue::Condense,
                        Queue::Updates,
                        Queue::Promote,
                    ] {
                        ops.push(Op::Delete(keys::queue_item(q as u8, id).to_vec()));
                    }
                    // What was known against it goes with it; the records it named keep
                    // their own entries (and their history says who named them).
                    let key = keys::validity(id).to_vec();
                    self.set_overlay(undo, key.clone(), None);
                    ops.push(Op::Delete(key));
                    let stats = self.stats_entry(&r.namespace, &r.session_id)?;
                    stats.memories = stats.memories.saturating_sub(1);
                    if r.tier == Tier::Episodic {
                        stats.events = stats.events.saturating_sub(1);
                    }
                    touched.push(keys::session_stats(&r.namespace, &r.session_id));
                    let seq = self.seq();
                    ops.push(Op::Put(
                        keys::change(seq).to_vec(),
                        codec::encode(&Change::Remove(id)),
                    ));
                    cat.push(CatalogOp::Remove(id, codec::header_of(&r)));
                }
                Mutation::Patch(id, patch) => {
                    self.patch(id, &patch, None, &mut ops, &mut cat, undo)?;
                }
                Mutation::PatchIf {
                    id,
                    if_strength_at,
                    patch,
                    audit,
                } => {
                    if self.patch(id, &patch, Some(if_strength_at), &mut ops, &mut cat, undo)? {
                        let seq = self.seq();
                        ops.push(Op::Put(
                            keys::audit(id, seq).to_vec(),
                            codec::encode(&audit),
                        ));
                    }
                }
                Mutation::Reinforce {
                    id,
                    reinforcement,
                    by,
                } => {
                    let key = keys::record(id);
                    let Some(bytes) = self.current(id)? else {
                        continue;
                    };
                    // Only the strength changes, and it goes to the strength table: the
                    // record's own bytes (and page) are left as they are.
                    let (mut r, _) = codec::decode_deferred(id, &key, &bytes)?;
                    let stored = r.policy.clone();
                    self.lay_strength_over(&mut r)?;
                    let before = r.strength;
                    reinforcement
                        .curve
                        .apply(&mut r, reinforcement.at, reinforcement.amount);
                    let strength = codec::encode(&codec::Strength::of(&r, &stored));
                    let skey = keys::strength(id).to_vec();
                    self.set_overlay(undo, skey.clone(), Some(strength.clone()));
                    ops.push(Op::Put(skey, strength));
                    // Audited in the record's session's reinforcement log, one entry per
                    // recall and session, written after the loop.
                    let item = (id, before, r.strength);
                    reinforced.add(self, r.namespace, r.session_id, reinforcement.at, by, item);
                }
                Mutation::SetEmbedding(id, embedding) => {
                    if self.current(id)?.is_none() {
                        continue;
                    }
                    ops.push(Op::Put(
                        keys::embedding(id).to_vec(),
                        codec::encode_embedding(&embedding),
                    ));
                    let seq = self.seq();
                    ops.push(Op::Put(
                        keys::change(seq).to_vec(),
                        codec::encode(&Change::Embedded(id)),
                    ));
                }
                Mutation::SetPassages(id, passages) => {
                    if self.current(id)?.is_none() {
                        continue;
                    }
                    cat.push(CatalogOp::Passages(id, !passages.is_empty()));
                    ops.push(if passages.is_empty() {
                        Op::Delete(keys::passages(id).to_vec())
                    } else {
                        Op::Put(keys::passages(id).to_vec(), codec::encode(&passages))
                    });
                }
                Mutation::Audit(id, entry) => {
                    let seq = self.seq();
                    ops.push(Op::Put(
                        keys::audit(id, seq).to_vec(),
                        codec::encode(&entry),
                    ));
                }
                Mutation::Enqueue(q, id) => {
                    ops.push(Op::Put(keys::queue_item(q as u8, id).to_vec(), Vec::new()));
                }
                Mutation::Dequeue(q, id) => {
                    ops.push(Op::Delete(keys::queue_item(q as u8, id).to_vec()));
                }
                Mutation::TruncateChanges(upto) => {
                    let start = keys::change(0);
                    let end = keys::change(upto.saturating_add(1));
                    self.kv
                        .scan(Range::between(&start, &end), false, &mut |k, _| {
                            ops.push(Op::Delete(k.to_vec()));
                            Ok(Visit::Continue)
                        })?;
                    // Sequences are shared with the audit log, so an empty log alone does
                    // not say whether an index saw every change: remember how far it went.
                    ops.push(Op::Put(
                        keys::meta(keys::meta::CHANGES_TRUNCATED),
                        upto.to_be_bytes().to_vec(),
                    ));
                }
                Mutation::RememberRecall(n, recall) => ops.push(families::recall_op(n, &recall)),
                Mutation::RecallOutcome { recall, success } => {
                    let seq = self.seq();
                    ops.push(families::recall_outcome_op(recall, seq, success));
                }
                Mutation::RememberIdempotent {
                    namespace,
                    key,
                    entry,
                } => {
                    // A key written again (a retry after it expired) leaves no stale
                    // time entry behind to expire the new one early.
                    if let Some(old) = self.decoded_idempotent(&namespace, &key)? {
                        ops.push(Op::Delete(keys::idempotent_by_time(
                            old.at, &namespace, &key,
                        )));
                    }
                    ops.extend(families::idempotent_ops(&namespace, &key, &entry));
                }
                Mutation::ExpireIdempotent(before) => {
                    let start = keys::idempotent_by_time_from(Timestamp::MIN);
                    let end = keys::idempotent_by_time_from(before);
                    self.kv
                        .scan(Range::between(&start, &end), false, &mut |k, _| {
                            if let Some((namespace, key)) = keys::idempotent_by_time_parts(k) {
                                ops.push(Op::Delete(keys::idempotent(namespace, key)));
                            }
                            ops.push(Op::Delete(k.to_vec()));
                            Ok(Visit::Continue)
                        })?;
                }
                Mutation::PutEdge(namespace, edge) => {
                    ops.push(families::edge_op(&namespace, &edge));
                    cat.push(CatalogOp::Edges(namespace.clone()));
                }
                Mutation::DeleteEdge(namespace, edge) => {
                    cat.push(CatalogOp::Edges(namespace.clone()));
                    ops.push(Op::Delete(keys::graph_edge(
                        &namespace,
                        edge.from,
                        edge.relation as u8,
                        edge.to,
                    )));
                }
                Mutation::MarkPromoted {
                    condensed,
                    knowledge,
                } => ops.push(families::promoted_op(condensed, knowledge)),
                Mutation::SetStrikes(id, strikes) => {
                    ops.push(families::strikes_op(id, Some(&strikes)));
                }
                Mutation::ClearStrikes(id) => ops.push(families::strikes_op(id, None)),
                Mutation::Quarantine(entry) => ops.push(families::quarantine_op(&entry)),
                Mutation::SetCondensedUpto {
                    namespace,
                    session,
                    upto,
                } => ops.push(families::condensed_upto_op(&namespace, &session, upto)),
                Mutation::SetLastDecaySweep(at) => ops.push(families::last_decay_sweep_op(at)),
                Mutation::Validity(id, change) => {
                    if self.current(id)?.is_none() {
                        continue;
                    }
                    let key = keys::validity(id).to_vec();
                    let mut v: Validity = match self.current_at(&key)? {
                        Some(bytes) => codec::decode(&key, &bytes)?,
                        None => Validity::default(),
                    };
                    change.apply(&mut v);
                    cat.push(CatalogOp::Validity(
                        id,
                        v.superseded(),
                        !v.conflicts.is_empty(),
                    ));
                    let bytes = (!v.is_clear()).then(|| codec::encode(&v));
                    self.set_overlay(undo, key.clone(), bytes.clone());
                    ops.push(match bytes {
                        Some(b) => Op::Put(key, b),
                        None => Op::Delete(key),
                    });
                }
            }
        }
        for (namespace, session, seq, entry) in &reinforced.entries {
            ops.push(families::reinforcements_op(namespace, session, *seq, entry));
        }
        touched.sort();
        touched.dedup();
        for key in touched.iter() {
            if let Some(s) = self.stats.get(key) {
                ops.push(Op::Put(key.clone(), codec::encode(s)));
            }
        }
        Ok((ops, cat))
    }
}

//! A partition's write log on JetStream: the [`CommitLog`] its owner's store appends every
//! commit group to before committing it locally.
//!
//! Each append carries four headers: a message id (`Nats-Msg-Id`), so a retry after a lost
//! acknowledgement is dropped as a duplicate; the expected last sequence of the stream
//! (`Nats-Expected-Last-Sequence`), so a node that lost its lease can never append after
//! the new owner; the lease revision it holds (`Sb-Epoch`), which the harness checks
//! never goes backwards; and its seal under the cluster secret (`Sb-Seal`), bound to the
//! stream, the position and the epoch, so an entry that no node wrote, or one moved from
//! elsewhere, is never applied ([`checked_entry`]). Any failure whose outcome is unknown
//! fences the log: it refuses every later append, and the node gives the partition up and
//! catches up from the stream before it may own it again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishErrorKind};
use shadowbrain_runtime::{CommitLog, Error, Result};

use super::seal::{Kind, Sealer};

/// The header carrying the lease revision an entry was appended under.
pub(super) const EPOCH_HEADER: &str = "Sb-Epoch";

/// The header carrying an entry's seal ([`entry_seal`]).
pub(super) const SEAL_HEADER: &str = "Sb-Seal";

/// The seal of `entry` appended to `subject` at `position` under `epoch`.
fn entry_seal(sealer: &Sealer, subject: &str, position: u64, epoch: &str, entry: &[u8]) -> String {
    sealer.sign_hex(
        Kind::Log,
        &[
            subject.as_bytes(),
            &position.to_be_bytes(),
            epoch.as_bytes(),
        ],
        entry,
    )
}

/// The entry a standby applies for the stream message at `position`: its payload when its
/// seal verifies, else an empty commit group — the position is passed, nothing is written
/// — and the refusal is logged. Something that may publish to the log subject without the
/// cluster secret can then neither write a key nor stop the partition's replicas.
pub(super) fn checked_entry(
    sealer: &Sealer,
    message: &async_nats::jetstream::Message,
    position: u64,
) -> Vec<u8> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let epoch = header(EPOCH_HEADER).unwrap_or_default();
    let sealed = header(SEAL_HEADER).is_some_and(|tag| {
        let expected = &[
            message.subject.as_bytes(),
            &position.to_be_bytes()[..],
            epoch.as_bytes(),
        ];
        sealer
            .verify_hex(Kind::Log, expected, &message.payload, &tag)
            .is_ok()
    });
    if sealed {
        return message.payload.to_vec();
    }
    tracing::warn!(
        subject = %message.subject,
        position,
        "skipping a log entry without a valid seal of the cluster secret (not written by a \
         node of this cluster)"
    );
    shadowbrain_runtime::internals::encode_entry(&[])
}

/// How long one publish waits for its acknowledgement before it is sent again (with the
/// same message id, so it is stored once).
const ACK_WAIT: Duration = Duration::from_secs(2);

/// How long an append keeps retrying before it gives up (and fences the log). Longer than
/// JetStream's leader elections (up to ~9 s in nats-server): a retry under the same
/// message id and expected sequence is stored once, and the lease check in the loop still
/// stops a node that lost its lease, so waiting out an election is safe and cheaper than
/// fencing, stepping down and taking the partition back (a deadline shorter than an
/// election turns every leader change into a takeover).
const APPEND_DEADLINE: Duration = Duration::from_secs(20);

/// Fault injection for the cluster harness (scenario 6): the share of publish
/// acknowledgements this node treats as lost, as if the network had dropped them, so the
/// append is sent again under the same message id. Read from
/// `SHADOWBRAIN_FAULT_DROP_ACKS` (0 to 1); unset, nothing is dropped. Never set it in
/// production: it only slows appends down.
fn drop_acks() -> f64 {
    static SHARE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SHARE.get_or_init(|| {
        std::env::var("SHADOWBRAIN_FAULT_DROP_ACKS")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |share| share.clamp(0.0, 1.0))
    })
}

/// The lease a node holds on a partition: its revision (the fencing epoch) and until when
/// the node may act on it (measured from when the refresh was *sent*, so a node that was
/// paused longer than the TTL knows its lease is gone before it writes).
#[derive(Debug)]
pub(super) struct Lease {
    epoch: AtomicU64,
    valid_until: Mutex<Instant>,
}

impl Lease {
    pub(super) fn new(epoch: u64, valid_until: Instant) -> Self {
        Lease {
            epoch: AtomicU64::new(epoch),
            valid_until: Mutex::new(valid_until),
        }
    }

    pub(super) fn renew(&self, epoch: u64, valid_until: Instant) {
        self.epoch.store(epoch, Ordering::SeqCst);
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = valid_until;
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub(super) fn valid(&self) -> bool {
        Instant::now() < *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counters of what a node appended, for the cost figures.
#[derive(Debug, Default)]
pub(super) struct LogCounters {
    pub entries: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
    /// Appends JetStream answered as duplicates of an earlier try (its acknowledgement was
    /// lost): stored once.
    pub duplicates: AtomicU64,
}

/// A number in [0, 1) for fault injection; no generator needed for that.
fn rand_share() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[derive(Debug)]
struct State {
    /// The stream's last sequence as this owner knows it: the next append expects it.
    last: u64,
    /// Why appends are refused, once the log is fenced.
    fenced: Option<String>,
    /// The local store may lack an entry of the log (a local commit failed after its
    /// append): only catching up from the stream can mend that, never [`JetStreamLog::rearm`].
    resync: bool,
    /// The lease appends are made under.
    lease: std::sync::Arc<Lease>,
    /// Message ids start with this: node, partition and the revision the lease began
    /// with, so ids never repeat across owners or ownerships.
    id_prefix: String,
}

/// The write log of one partition, as its owner appends to it.
#[derive(Debug)]
pub(super) struct JetStreamLog {
    js: jetstream::Context,
    sealer: std::sync::Arc<Sealer>,
    handle: tokio::runtime::Handle,
    subject: String,
    max_entry: usize,
    state: Mutex<State>,
    counters: std::sync::Arc<LogCounters>,
}

impl JetStreamLog {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        js: jetstream::Context,
        sealer: std::sync::Arc<Sealer>,
        handle: tokio::runtime::Handle,
        subject: String,
        id_prefix: String,
        lease: std::sync::Arc<Lease>,
        last: u64,
        max_entry: usize,
        counters: std::sync::Arc<LogCounters>,
    ) -> Self {
        JetStreamLog {
            js,
            sealer,
            handle,
            subject,
            max_entry,
            state: Mutex::new(State {
                last,
                fenced: None,
                resync: false,
                lease,
                id_prefix,
            }),
            counters,
        }
    }

    /// Refuses every later append: the partition is being handed over or was lost.
    pub(super) fn fence(&self, why: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.resync = true;
        state.fenced.get_or_insert_with(|| why.to_string());
    }

    /// Makes appends go under a newer lease of this node (the old one lapsed while NATS
    /// elected a leader, say) and lifts a fence, when nothing can have been lost: the
    /// stream ends where this owner's store does (`stream_last`) and no local commit
    /// failed. Otherwise the owner must step down and catch up. The expected last sequence
    /// still guards every append, so a wrong `stream_last` can only make an append fail.
    pub(super) fn rearm(
        &self,
        lease: std::sync::Arc<Lease>,
        id_prefix: String,
        stream_last: u64,
    ) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.resync || state.last != stream_last || !lease.valid() {
            return false;
        }
        state.lease = lease;
        state.id_prefix = id_prefix;
        state.fenced = None;
        true
    }

    /// Why the log refuses appends, if it does.
    pub(super) fn fenced(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fenced
            .clone()
    }

    fn refuse(&self, why: &str) -> Error {
        Error::Unavailable {
            what: format!("the cluster log ({})", self.subject),
            message: format!(
                "{why}; the partition is moving to another node: retry in a moment (with an \
                 Idempotency-Key, a retry is stored once)"
            ),
        }
    }
}

impl CommitLog for JetStreamLog {
    fn append(&self, entry: &[u8]) -> Result<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &state.fenced {
            return Err(self.refuse(why));
        }
        let id = format!("{}-{}", state.id_prefix, state.last);
        let payload = bytes::Bytes::copy_from_slice(entry);
        let deadline = Instant::now() + APPEND_DEADLINE;
        loop {
            // A node paused past its lease (SIGSTOP, a long GC-like stall) must not write:
            // another node may own the partition by now.
            if !state.lease.valid() {
                let why = "this node's lease on the partition ran out before the write was logged";
                state.fenced = Some(why.into());
                return Err(self.refuse(why));
            }
            let epoch = state.lease.epoch().to_string();
            // Bound to where the entry lands: the expected last sequence guarantees it.
            let seal = entry_seal(&self.sealer, &self.subject, state.last + 1, &epoch, entry);
            let publish = jetstream::message::PublishMessage::build()
                .payload(payload.clone())
                .message_id(&id)
                .expected_last_sequence(state.last)
                .header(EPOCH_HEADER, epoch.as_str())
                .header(SEAL_HEADER, seal.as_str());
            let outcome = self.handle.block_on(async {
                let ack = self.js.send_publish(self.subject.clone(), publish).await?;
                match tokio::time::timeout(ACK_WAIT, ack).await {
                    Ok(acked) => acked,
                    Err(_) => Err(PublishErrorKind::TimedOut.into()),
                }
            });
            let dropped = drop_acks() > 0.0 && rand_share() < drop_acks();
            match outcome {
                Ok(_) if dropped => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(subject = %self.subject, "dropping an acknowledgement (fault injection)");
                }
                Ok(ack) => {
                    if ack.duplicate {
                        self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    }
                    state.last = ack.sequence;
                    self.counters.entries.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .bytes
                        .fetch_add(entry.len() as u64, Ordering::Relaxed);
                    return Ok(ack.sequence);
                }
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    let why = "another node appended to the partition's log (its lease moved)";
                    state.fenced = Some(why.into());
                    return Err(self.refuse(why));
                }
                Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    // Nothing was sent: the log is unchanged and stays usable.
                    return Err(Error::TooLarge {
                        field: "write".into(),
                        size: entry.len(),
                        limit: self.max_entry,
                        hint: "the cluster log's messages are limited by NATS max_payload; \
                               send fewer or smaller events per call, or raise max_payload"
                            .into(),
                    });
                }
                Err(e) => {
                    if Instant::now() >= deadline {
                        let why = format!("the cluster log did not confirm a write ({e})");
                        state.fenced = Some(why.clone());
                        return Err(self.refuse(&why));
                    }
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, subject = %self.subject, "retrying an append");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    fn max_entry_bytes(&self) -> usize {
        self.max_entry
    }

    fn local_commit_failed(&self, position: u64, error: &Error) {
        tracing::error!(position, %error, subject = %self.subject, "an entry in the cluster log could not be committed here; giving the partition up");
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.resync = true;
        state
            .fenced
            .get_or_insert_with(|| "this node could not commit an entry of its own log".into());
    }
}

//! Each partition's two tasks: the **keeper** holds (refreshes, takes, releases) the lease,
//! and the **role** task follows it — a standby catching up to the stream and applying it,
//! a takeover opening the runtime over the caught-up store, a step-down or hand-over closing
//! it (its last writes logged) before the lease goes — and keeps a copy here only while the
//! partition's replica set names this node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, kv};
use futures::{FutureExt, StreamExt};
use shadowbrain_actors::Runtime;
use shadowbrain_runtime::{Backend, IdBlock, Substrate};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::super::Placement;
use super::super::forward::{self};
use super::super::log::{self, JetStreamLog, Lease};
use super::super::parts::{OtherPartitions, answer_parts, parts_subject};
use super::super::seal::Sealer;
use super::operations::NodeHandle;
use super::state::*;
use crate::http::InCluster;
use crate::metrics::Totals;

/// Stops a standby and closes its substrate (its indexes saved), so that the partition's
/// files can be opened again.
pub(super) async fn stop_following(follower: Follower) {
    follower.stop.cancel();
    match follower.task.await {
        Ok(standby) => {
            let closed = tokio::task::spawn_blocking(move || standby.close()).await;
            if let Ok(Err(e)) = closed {
                tracing::warn!(error = %e, "the standby did not close cleanly");
            }
        }
        Err(e) => tracing::error!(error = %e, "the standby's task failed"),
    }
}

/// Holds, refreshes, takes and gives up a partition's lease (see the module doc).
pub(super) async fn keeper(node: Arc<Node>, part: Arc<Partition>, stop: CancellationToken) {
    let ttl = node.cfg.lease_ttl;
    let me = node.cfg.node.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ttl / 4) => {}
        }
        let holder = match node.leases.entry(&part.key).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => {
                Some((String::from_utf8_lossy(&e.value).into_owned(), e.revision))
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, partition = part.id, "cannot read the lease");
                continue;
            }
        };
        let members = node.live.borrow().clone();
        let held = part.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // An owner's copy is caught up by definition; a standby's as its follower says.
        let desired = members
            .owner_for(part.id, &me, held.is_some() || part.is_warm())
            .cloned();
        match held {
            Some(h) if holder.as_ref() == Some(&(me.clone(), h.revision)) => {
                // Only to a better-ranked node whose copy is caught up (one that just
                // joined, or came back, catches up first, so its takeover stays within the
                // bound): a partition only ever moves up its ranking, never back and forth.
                // Never to a node that is leaving itself (the whole cluster stopping).
                if desired.as_ref().is_some_and(|d| {
                    *d != me && members.is_warm(d, part.id) && !members.leaving.contains(d)
                }) {
                    part.hand_over.store(true, Ordering::SeqCst);
                    part.changed.notify_one();
                }
                let sent = Instant::now();
                match node
                    .leases
                    .update(&part.key, me.clone().into(), h.revision)
                    .await
                {
                    Ok(revision) => {
                        h.lease.renew(revision, sent + ttl * 3 / 4);
                        if let Some(held) =
                            part.held.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
                            && Arc::ptr_eq(&held.lease, &h.lease)
                        {
                            held.revision = revision;
                        }
                    }
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        node.retake(&part, &h, desired.as_ref() == Some(&me)).await;
                    }
                    // A slow answer: keep trying; the lease's own deadline stops writes.
                    Err(e) => {
                        tracing::warn!(error = %e, partition = part.id, "cannot refresh the lease")
                    }
                }
            }
            Some(h) => node.retake(&part, &h, desired.as_ref() == Some(&me)).await,
            None => {
                if holder.is_some() {
                    *part.vacant_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    continue;
                }
                let since = *part
                    .vacant_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(Instant::now);
                // Nobody took it: after three TTLs a node with a caught-up copy does, after
                // six any node (it catches up from the stream).
                let mine = desired.as_ref() == Some(&me)
                    || (since.elapsed() > ttl * 3 && part.is_warm())
                    || since.elapsed() > ttl * 6;
                if !mine {
                    continue;
                }
                let sent = Instant::now();
                if let Ok(revision) = node.leases.create(&part.key, me.clone().into()).await {
                    tracing::info!(partition = part.id, revision, "took the lease");
                    let lease = Arc::new(Lease::new(revision, sent + ttl * 3 / 4));
                    *part.held.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(HeldLease { revision, lease });
                    *part.vacant_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    part.changed.notify_one();
                }
            }
        }
    }
}

/// Makes the partition's role follow its lease (see the module doc).
pub(super) async fn role_task(node: Arc<Node>, part: Arc<Partition>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = part.changed.notified() => {}
            _ = tokio::time::sleep(node.cfg.lease_ttl / 4) => {}
        }
        let held = part.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut role = part.role.lock().await;
        let wanted = node.wants_copy(&part, held.is_some());
        if matches!(*role, Role::Standby(_)) && part.behind.load(Ordering::SeqCst) {
            node.catch_up_from_snapshot(&part, &mut role).await;
            continue;
        }
        match (&*role, held) {
            (Role::Absent, held) => {
                if held.is_some() || wanted == Some(true) {
                    match node.open_copy(&part).await {
                        Ok(standby) => {
                            tracing::info!(
                                partition = part.id,
                                "keeping a copy of the partition: its replica set names this node"
                            );
                            *role = Role::Standby(node.follow(&part, standby));
                            // Held: take it over at once.
                            part.changed.notify_one();
                        }
                        Err(e) => {
                            tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
                        }
                    }
                } else if node.may_drop(&part) && part.dir.exists() {
                    // A copy left by an earlier run that the replica set no longer names.
                    node.delete_copy(&part).await;
                }
            }
            (Role::Standby(_), Some(h)) => {
                if let Err(e) = node.take(&part, &mut role, &h).await {
                    tracing::warn!(error = %format!("{e:#}"), partition = part.id, "could not take the partition over; giving the lease back");
                    node.give_back(&part, &h).await;
                }
            }
            (Role::Owner(o), Some(h)) => {
                if part.hand_over.swap(false, Ordering::SeqCst) {
                    tracing::info!(
                        partition = part.id,
                        "handing the partition over to its rendezvous owner"
                    );
                    // The lease goes back as soon as the runtime is closed, before this
                    // node reopens its copy as a standby: the taker waits for nothing else.
                    if node.close_owned(&part, &mut role, true).await {
                        node.give_back(&part, &h).await;
                        node.follow_again(&part, &mut role).await;
                    }
                    continue;
                }
                let fenced = o.log.fenced();
                if fenced.is_none() && Arc::ptr_eq(&o.lease, &h.lease) {
                    continue;
                }
                // A newer lease of this node (the old one lapsed while NATS elected a
                // leader), or a fenced log: carry on under the held lease when the stream
                // ends where this store does, else catch up from the stream first (the
                // lease stays this node's while the keeper refreshes it).
                // Bounded: while JetStream elects a leader its API may not answer for
                // seconds, and stepping down then costs no more than waiting.
                let last = tokio::time::timeout(Duration::from_secs(2), node.stream_last(&part))
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the stream's state did not come")));
                let rearmed = last.as_ref().is_ok_and(|last| {
                    o.log
                        .rearm(h.lease.clone(), node.id_prefix(&part, &h), *last)
                });
                if rearmed {
                    tracing::info!(
                        partition = part.id,
                        epoch = h.revision,
                        "carrying on under a new lease"
                    );
                    if let Role::Owner(o) = &mut *role {
                        o.lease = h.lease.clone();
                        o.epoch = h.revision;
                    }
                } else if let Some(why) = fenced {
                    tracing::warn!(partition = part.id, %why, "the partition's log is fenced; catching up");
                    node.step_down(&part, &mut role, false).await;
                }
            }
            (Role::Owner(_), None) => node.step_down(&part, &mut role, false).await,
            (Role::Idle, _) => match node.open_copy(&part).await {
                Ok(standby) => *role = Role::Standby(node.follow(&part, standby)),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
                }
            },
            (Role::Standby(_), None) => {
                if node.may_drop(&part) {
                    tracing::info!(
                        partition = part.id,
                        "the partition's replica set goes on without this node"
                    );
                    node.drop_copy(&part, &mut role).await;
                } else if node.snapshot_due(&part).await {
                    node.snapshot(&part, &mut role).await;
                }
            }
        }
    }
}

/// Applies the stream to `standby` from its applied position on, in batches, until stopped;
/// returns the standby. An ordered consumer delivers every entry once and in order (it
/// restarts itself on a gap); a broken one is recreated from the applied position.
///
/// `warm` is set once the standby reaches where the stream ended when it began following:
/// from then on it can take the partition over within the takeover bound. `behind` is set
/// (and the standby returned) when the stream no longer holds the entries after its
/// position: a snapshot truncated them, and the copy must restore one.
#[allow(clippy::too_many_arguments)]
pub(super) async fn follow(
    js: jetstream::Context,
    sealer: Arc<Sealer>,
    stream: String,
    partition: u16,
    standby: Substrate,
    applied: watch::Sender<u64>,
    warm: Arc<AtomicBool>,
    behind: Arc<AtomicBool>,
    unbuilt: Arc<AtomicU64>,
    stop: CancellationToken,
) -> Substrate {
    // Counted no further than the snapshot's gate asks, and after an applied batch at
    // most once per idle check: the count reads the change log.
    let mut noted: Option<Instant> = None;
    let mut note_unbuilt = |standby: &Substrate, every_time: bool| {
        if !every_time && noted.is_some_and(|t| t.elapsed() < IDLE_CHECK) {
            return;
        }
        noted = Some(Instant::now());
        if let Ok(n) = standby.unbuilt(SNAPSHOT_UNBUILT as usize + 1) {
            unbuilt.store(n as u64, Ordering::SeqCst);
        }
    };
    // Where the stream ended when this standby began following (known once asked).
    let mut end_at_start: Option<u64> = None;
    let caught_up = |position: u64, target: Option<u64>| {
        if target.is_some_and(|t| position >= t) && !warm.swap(true, Ordering::Relaxed) {
            tracing::info!(partition, position, "the standby caught up with the stream");
        }
    };
    'outer: while !stop.is_cancelled() {
        let start = *applied.borrow() + 1;
        let messages = async {
            let mut s = js.get_stream(&stream).await?;
            let (first, last) = {
                let state = &s.info().await?.state;
                (state.first_sequence, state.last_sequence)
            };
            end_at_start.get_or_insert(last);
            if first > start {
                return Ok(None);
            }
            let c = s
                .create_consumer(consumer::pull::OrderedConfig {
                    deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: start,
                    },
                    ..Default::default()
                })
                .await?;
            anyhow::Ok(Some(c.messages().await?))
        };
        let messages = tokio::select! {
            _ = stop.cancelled() => break,
            m = messages => m,
        };
        caught_up(*applied.borrow(), end_at_start);
        let mut messages = match messages {
            Ok(Some(m)) => m,
            Ok(None) => {
                tracing::warn!(
                    partition,
                    applied = start - 1,
                    "the stream was truncated beyond this copy; it restores the latest snapshot"
                );
                behind.store(true, Ordering::SeqCst);
                break;
            }
            Err(e) => {
                tracing::debug!(error = %format!("{e:#}"), partition, "cannot follow the stream yet");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => break 'outer,
                m = tokio::time::timeout(IDLE_CHECK, messages.next()) => m,
            };
            let Ok(first) = first else {
                // Quiet for a while: fine if the stream has nothing new, but a consumer
                // whose server died can stay quiet for half a minute before it notices.
                // If the stream is ahead of the replica, follow it again at once.
                let applied_now = *applied.borrow();
                let ahead = match js.get_stream(&stream).await {
                    Ok(mut s) => s
                        .info()
                        .await
                        .is_ok_and(|i| i.state.last_sequence > applied_now),
                    Err(_) => true,
                };
                if !ahead {
                    caught_up(applied_now, Some(applied_now));
                }
                note_unbuilt(&standby, true);
                if ahead {
                    tracing::debug!(
                        partition,
                        "the stream's consumer went quiet behind the stream; following again"
                    );
                    continue 'outer;
                }
                continue;
            };
            let mut batch = match first {
                Some(Ok(m)) => vec![m],
                Some(Err(e)) => {
                    tracing::debug!(error = %e, partition, "the stream's consumer broke; following again");
                    continue 'outer;
                }
                None => continue 'outer,
            };
            // What else arrives within the linger joins this transaction: a standby's
            // commits then come at most once per linger whatever the event rate (an event
            // and its embedding are two entries a few ms apart), and each commit's flush
            // is a cost of its own besides its entries'.
            let linger = tokio::time::Instant::now() + STANDBY_LINGER;
            while batch.len() < APPLY_BATCH {
                let next = match messages.next().now_or_never() {
                    Some(next) => next,
                    None => tokio::select! {
                        _ = stop.cancelled() => None,
                        next = tokio::time::timeout_at(linger, messages.next()) => next.ok().flatten(),
                    },
                };
                match next {
                    Some(Ok(m)) => batch.push(m),
                    _ => break,
                }
            }
            let entries: Vec<(u64, Vec<u8>)> = batch
                .iter()
                .filter_map(|m| {
                    let position = m.info().ok()?.stream_sequence;
                    Some((position, log::checked_entry(&sealer, m, position)))
                })
                .collect();
            if entries
                .first()
                .is_some_and(|(position, _)| *position > *applied.borrow() + 1)
            {
                // The consumer skipped what a truncation removed while it was created.
                tracing::warn!(
                    partition,
                    applied = *applied.borrow(),
                    "the stream was truncated beyond this copy; it restores the latest snapshot"
                );
                behind.store(true, Ordering::SeqCst);
                break 'outer;
            }
            let target = standby.clone();
            let done = tokio::task::spawn_blocking(move || target.apply_logged(entries)).await;
            match done {
                Ok(Ok(position)) => {
                    applied.send_replace(position);
                    caught_up(position, end_at_start);
                    note_unbuilt(&standby, false);
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, partition, "cannot apply the stream to the standby store");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue 'outer;
                }
                Err(e) => {
                    tracing::error!(error = %e, partition, "the standby's apply task failed");
                    continue 'outer;
                }
            }
        }
    }
    standby
}
impl Node {
    pub(super) fn id_prefix(&self, part: &Partition, held: &HeldLease) -> String {
        format!("{}-{}-{}", self.cfg.node, part.id, held.revision)
    }

    /// The last sequence of the partition's stream.
    pub(super) async fn stream_last(&self, part: &Partition) -> anyhow::Result<u64> {
        let mut stream = self.js.get_stream(&part.stream).await?;
        Ok(stream.info().await?.state.last_sequence)
    }

    /// Where the partition's stream ends, asked again while the lease is held: after a
    /// NATS restart the stream's API answers only once JetStream elected its leader
    /// (seconds), and giving the lease back meanwhile only started the takeover over.
    pub(super) async fn stream_end_while_held(
        &self,
        part: &Partition,
        held: &HeldLease,
    ) -> anyhow::Result<u64> {
        let started = Instant::now();
        loop {
            let asked = tokio::time::timeout(Duration::from_secs(2), self.stream_last(part)).await;
            match asked {
                Ok(Ok(end)) => return Ok(end),
                _ if held.lease.valid() && started.elapsed() < CATCH_UP_LIMIT => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err(e)) => return Err(e.context("reading where the partition's stream ends")),
                Err(_) => anyhow::bail!("the partition's stream did not say where it ends"),
            }
        }
    }

    /// The held lease expired in NATS (it could not be refreshed for a TTL: a leader
    /// election, a NATS outage) or moved: take it again at once if it is vacant, so the
    /// partition's runtime carries on under the new lease (see `JetStreamLog::rearm`)
    /// instead of closing; otherwise give it up. Only the partition's rendezvous owner takes
    /// it again: a node handing it over (its lease just deleted) must not.
    pub(super) async fn retake(&self, part: &Partition, held: &HeldLease, rendezvous_owner: bool) {
        if !rendezvous_owner {
            tracing::info!(partition = part.id, "the lease expired or moved");
            self.lose(part, held);
            return;
        }
        let ttl = self.cfg.lease_ttl;
        let sent = Instant::now();
        match self
            .leases
            .create(&part.key, self.cfg.node.clone().into())
            .await
        {
            Ok(revision) => {
                tracing::info!(
                    partition = part.id,
                    revision,
                    "the lease lapsed in NATS; took it again"
                );
                held.lease.renew(held.lease.epoch(), Instant::now());
                let lease = Arc::new(Lease::new(revision, sent + ttl * 3 / 4));
                *part.held.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(HeldLease { revision, lease });
                part.changed.notify_one();
            }
            Err(_) => {
                tracing::warn!(
                    partition = part.id,
                    "the lease expired or moved to another node"
                );
                self.lose(part, held);
            }
        }
    }

    /// The lease is gone: writes stop at once (the lease's deadline), and the role task
    /// steps down.
    pub(super) fn lose(&self, part: &Partition, held: &HeldLease) {
        held.lease.renew(held.lease.epoch(), Instant::now());
        let mut slot = part.held.lock().unwrap_or_else(|p| p.into_inner());
        if slot
            .as_ref()
            .is_some_and(|h| Arc::ptr_eq(&h.lease, &held.lease))
        {
            *slot = None;
        }
        drop(slot);
        part.changed.notify_one();
    }

    /// Deletes a lease this node holds, so another node may take it at once. The entry is
    /// read first: a refresh the keeper had in flight may have moved its revision on.
    pub(super) async fn give_back(&self, part: &Partition, held: &HeldLease) {
        self.lose(part, held);
        for _ in 0..3 {
            let revision = match self.leases.entry(&part.key).await {
                Ok(Some(e))
                    if e.operation == kv::Operation::Put
                        && *e.value == *self.cfg.node.as_bytes() =>
                {
                    e.revision
                }
                Ok(_) => return,
                Err(_) => continue,
            };
            match self
                .leases
                .delete_expect_revision(&part.key, Some(revision))
                .await
            {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(error = %e, partition = part.id, "the lease was not deleted yet")
                }
            }
        }
    }

    /// The ids the partition's store hands out: its own block, so that an id names its
    /// partition (docs/cluster-placement.md).
    fn id_block(&self, part: &Partition) -> IdBlock {
        IdBlock::of_partition(part.id, self.cfg.partitions)
    }

    /// Opens the partition's files as a standby: its store written only from the stream,
    /// its indexes built as the entries arrive by threads of its own, so that a takeover
    /// builds only the last changes (building all of a big partition's took a minute).
    pub(super) async fn open_standby(&self, part: &Partition) -> anyhow::Result<Substrate> {
        let mut opts = self.rt_config.substrate.clone();
        opts.backend = Backend::Lmdb;
        opts.log = None;
        opts.standby = true;
        opts.ids = Some(self.id_block(part));
        opts.indexing.background = true;
        // Nobody searches a standby: it builds three times less often than an owner (each
        // build has a cost of its own besides its items'), and what it has not built when
        // it takes over is built in the background after the takeover.
        opts.indexing.max_delay = STANDBY_BUILD_DELAY;
        // Nor does a quiet moment make a build worth its cost: a partition written every
        // few hundred ms would otherwise build after each write.
        opts.indexing.debounce = STANDBY_QUIET;
        let dir = part.dir.clone();
        tokio::task::spawn_blocking(move || Substrate::open(&dir, opts))
            .await?
            .with_context(|| format!("opening the standby of {}", part.dir.display()))
    }

    /// [`Node::open_standby`], retried for up to [`RELEASE_WAIT`] while the files are
    /// still held: the last requests of a runtime that just closed may hold it for a moment
    /// (up to 2.5 s seen under a saturating bulk load).
    pub(super) async fn open_standby_patiently(
        &self,
        part: &Partition,
    ) -> anyhow::Result<Substrate> {
        let started = Instant::now();
        let mut said = false;
        loop {
            let attempt = Instant::now();
            match self.open_standby(part).await {
                Ok(standby) => {
                    if said {
                        // The open itself apart: it takes the change log's tail, which
                        // once passed for a long hold of the files.
                        tracing::info!(
                            partition = part.id,
                            waited_ms = (attempt - started).as_millis() as u64,
                            opened_ms = attempt.elapsed().as_millis() as u64,
                            "the partition's files were released; following it"
                        );
                    }
                    return Ok(standby);
                }
                Err(e) if started.elapsed() < RELEASE_WAIT => {
                    if !said {
                        said = true;
                        let closed = part
                            .closed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .clone();
                        tracing::info!(
                            error = %format!("{e:#}"),
                            partition = part.id,
                            runtimes = closed.as_ref().map(|w| w.runtimes()),
                            substrates = closed.as_ref().map(|w| w.substrates()),
                            "the partition's files are not free yet; waiting"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts applying the partition's stream to `standby`.
    pub(super) fn follow(&self, part: &Partition, standby: Substrate) -> Follower {
        let stop = CancellationToken::new();
        let position = match standby.store().log_applied() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, partition = part.id, "cannot read the standby's position");
                0
            }
        };
        let (tx, applied) = watch::channel(position);
        part.set_warm(false);
        part.behind.store(false, Ordering::SeqCst);
        let task = tokio::spawn(follow(
            self.js.clone(),
            self.sealer.clone(),
            part.stream.clone(),
            part.id,
            standby,
            tx,
            part.warm.clone(),
            part.behind.clone(),
            part.unbuilt.clone(),
            stop.clone(),
        ));
        Follower {
            stop,
            task,
            applied,
        }
    }

    /// Standby → owner: catch up to the stream's end, open the runtime over the store with
    /// the log, and answer the partition's forwarded requests.
    pub(super) async fn take(
        &self,
        part: &Partition,
        role: &mut Role,
        held: &HeldLease,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let Role::Standby(follower) = role else {
            return Ok(());
        };
        let end = self.stream_end_while_held(part, held).await?;
        let mut applied = follower.applied.clone();
        tokio::time::timeout(CATCH_UP_LIMIT, applied.wait_for(|a| *a >= end))
            .await
            .context("the standby did not catch up in time")??;
        let caught_up = started.elapsed();
        let Role::Standby(follower) = std::mem::replace(role, Role::Idle) else {
            unreachable!()
        };
        follower.stop.cancel();
        let standby = follower.task.await.context("the standby's task failed")?;
        let last = standby.store().log_applied()?;
        // Closing saves the standby's indexes (building a small unbuilt tail); the runtime
        // opens on them and takes the rest of the change log's tail (`reconcile`).
        tokio::task::spawn_blocking(move || standby.close())
            .await
            .context("closing the standby")??;
        let closed = started.elapsed();
        let log = Arc::new(JetStreamLog::new(
            self.js.clone(),
            self.sealer.clone(),
            self.io.clone(),
            part.subject.clone(),
            self.id_prefix(part, held),
            held.lease.clone(),
            last,
            self.max_entry,
            self.counters.clone(),
        ));
        let mut config = self.rt_config.clone();
        if let Some(loaded) = self.reloaded_policies() {
            config.substrate.policy = loaded.default;
            config.substrate.namespace_policies = loaded.namespaces;
        }
        config.data_dir = part.dir.clone();
        config.substrate.backend = Backend::Lmdb;
        config.substrate.log = Some(log.clone());
        config.substrate.ids = Some(self.id_block(part));
        let spread = self.cfg.placement == Placement::Session;
        if spread {
            config.substrate.spread = Some(Arc::new(OtherPartitions {
                asker: self.asker.clone(),
                me: part.id,
            }));
        }
        let rt = match Runtime::open(config).await {
            Ok(rt) => rt,
            Err(e) => {
                *role = Role::Standby(self.follow(part, self.open_standby(part).await?));
                return Err(e).context("opening the partition's runtime");
            }
        };
        let closing = self.closing.child_token();
        let options = crate::http::Options {
            limits: self.limits,
            auth: self.auth.clone(),
            server: self.edge.clone(),
        };
        let wiring = crate::http::Wiring {
            work: Some(self.work.clone()),
            metrics: Some(self.metrics.clone()),
            closing: closing.clone(),
            cluster: Some(InCluster {
                logins: self.door.logins(),
                node: Arc::new(NodeHandle(self.me.clone(), self.cfg.node.clone())),
                partition: part.id,
            }),
        };
        let router = crate::http::router_with(rt.clone(), options, wiring);
        let requests = self
            .client
            .queue_subscribe(part.rpc_subject.clone(), "owners".into())
            .await?;
        let rpc = tokio::spawn(forward::answer_forwarded(
            forward::Answerer {
                client: self.client.clone(),
                node: self.cfg.node.clone(),
                sealer: self.sealer.clone(),
                seen: self.seen.clone(),
            },
            requests,
            router.clone(),
        ));
        // Placed by session, the other partitions' owners ask this one for its records.
        let parts = match spread {
            true => {
                let asks = self
                    .client
                    .queue_subscribe(parts_subject(&self.cfg.prefix, part.id), "owners".into())
                    .await?;
                Some(tokio::spawn(answer_parts(
                    self.client.clone(),
                    self.sealer.clone(),
                    self.seen.clone(),
                    asks,
                    rt.substrate().clone(),
                )))
            }
            false => None,
        };
        *part.router.write().unwrap_or_else(|p| p.into_inner()) = Some(router);
        tracing::info!(
            partition = part.id,
            epoch = held.revision,
            log_end = last,
            caught_up_ms = caught_up.as_millis() as u64,
            closed_ms = closed.as_millis() as u64,
            took_ms = started.elapsed().as_millis() as u64,
            "owning the partition"
        );
        part.set_warm(true);
        *role = Role::Owner(Owned {
            rt,
            log,
            lease: held.lease.clone(),
            rpc,
            parts,
            closing,
            epoch: held.revision,
        });
        Ok(())
    }

    /// Owner → standby: [`Node::close_owned`], then follow the stream again.
    pub(super) async fn step_down(&self, part: &Partition, role: &mut Role, graceful: bool) {
        if self.close_owned(part, role, graceful).await {
            self.follow_again(part, role).await;
        }
    }

    /// Idle after owning → standby: reopens this node's copy and follows the stream.
    pub(super) async fn follow_again(&self, part: &Partition, role: &mut Role) {
        tracing::info!(partition = part.id, "following the partition as a standby");
        match self.open_standby_patiently(part).await {
            Ok(standby) => *role = Role::Standby(self.follow(part, standby)),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
            }
        }
    }

    /// Owner → idle: stops answering for the partition and closes its runtime; whether it
    /// was owned. `graceful`: the runtime's last writes are logged before the log is
    /// fenced (a handover); otherwise the log is fenced first (the lease is gone).
    pub(super) async fn close_owned(
        &self,
        part: &Partition,
        role: &mut Role,
        graceful: bool,
    ) -> bool {
        let Role::Owner(owned) = std::mem::replace(role, Role::Idle) else {
            return false;
        };
        part.set_warm(false);
        *part.router.write().unwrap_or_else(|p| p.into_inner()) = None;
        owned.rpc.abort();
        if let Some(parts) = &owned.parts {
            parts.abort();
        }
        owned.closing.cancel();
        if !graceful {
            owned
                .log
                .fence("this node no longer holds the partition's lease");
        }
        if let Err(e) = owned.rt.shutdown().await {
            tracing::warn!(error = %e, partition = part.id, "the partition's runtime did not close cleanly");
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&Totals::of(&owned.rt));
        *part.closed.lock().unwrap_or_else(|p| p.into_inner()) = Some(owned.rt.downgrade());
        owned.log.fence("the partition was handed over");
        true
    }
}

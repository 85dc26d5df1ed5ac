//! Which partitions a node keeps and how it gets and lets go of a copy: a copy is kept
//! while the partition's replica set names the node (or it holds the lease); a new copy
//! restores the partition's latest snapshot and replays the stream's tail; a copy the
//! stream was truncated beyond restores one again; the standby a snapshot falls to takes
//! it and truncates the stream beneath it; a copy no longer named is deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use shadowbrain_runtime::Substrate;

use super::super::snapshot::{self, Snapshots};
use super::roles::stop_following;
use super::state::*;

impl Node {
    /// Whether this node should keep a copy of the partition: it holds the lease, or the
    /// partition's replica set among the live members names it (`None` while the members
    /// are not known yet). Notes since when it has not been wanted.
    pub(super) fn wants_copy(&self, part: &Partition, holding: bool) -> Option<bool> {
        let members = self.live.borrow();
        let wanted = if members.names.is_empty() {
            None
        } else {
            Some(
                holding
                    || members
                        .replica_set(part.id, self.cfg.copies)
                        .contains(&&self.cfg.node),
            )
        };
        let mut since = part
            .unwanted_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match wanted {
            Some(false) => {
                since.get_or_insert_with(Instant::now);
            }
            _ => *since = None,
        }
        wanted
    }

    /// Leaves the cluster gracefully: says so in its heartbeat, so every replica set it is
    /// in goes on without it where another node can take its place, and waits (at most
    /// `leave_timeout`) until it owns nothing and every copy it keeps has caught up on
    /// the nodes replacing it. A partition keeps its copies and is served throughout;
    /// past the timeout (a cluster with nobody to take over, a copy still catching up)
    /// the node stops anyway, its leases given back as before.
    pub(super) async fn hand_on(&self) {
        self.leaving.store(true, Ordering::SeqCst);
        let started = Instant::now();
        tracing::info!("leaving the cluster: handing this node's partitions and copies on");
        // The others must see the leave in a heartbeat before anything moves.
        let mut seen = self.live.clone();
        loop {
            let pending = self.not_handed_on();
            if pending.is_empty() {
                tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "handed every partition and copy on"
                );
                return;
            }
            if started.elapsed() >= self.cfg.leave_timeout {
                tracing::warn!(
                    ?pending,
                    "leaving with partitions not handed on (leave_timeout passed): their \
                     leases go back now and other nodes take them from their copies or the stream"
                );
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(250), seen.changed()).await;
        }
    }

    /// The partitions this node has not handed on yet: those it still owns, and those it
    /// keeps a copy of whose replica set has gone on without it but not every node of
    /// which has caught up (while the members still list it as leaving).
    fn not_handed_on(&self) -> Vec<u16> {
        let members = self.live.borrow();
        if !members.leaving.contains(&self.cfg.node) {
            return self.partitions.iter().map(|p| p.id).collect();
        }
        // Nobody stays to take anything (the whole cluster is stopping, or this is its
        // last node): there is nothing to hand on.
        let staying = members
            .names
            .iter()
            .any(|n| *n != self.cfg.node && !members.leaving.contains(n));
        if !staying {
            return Vec::new();
        }
        self.partitions
            .iter()
            .filter(|p| {
                let owned = p.router.read().unwrap_or_else(|p| p.into_inner()).is_some()
                    || p.held.lock().unwrap_or_else(|p| p.into_inner()).is_some();
                if owned {
                    return true;
                }
                let set = members.replica_set(p.id, self.cfg.copies);
                // Still named: nobody else can take this copy (a small cluster).
                let kept_elsewhere =
                    set.contains(&&self.cfg.node) || set.iter().all(|n| members.is_warm(n, p.id));
                p.dir.exists() && !kept_elsewhere
            })
            .map(|p| p.id)
            .collect()
    }

    /// Whether this node may delete its copy of the partition: the replica set has gone on
    /// without it for [`DROP_AFTER`] and every node in the set says its copy is caught up,
    /// so the partition keeps its copies (and its owner a caught-up successor) without
    /// this one; never while this node is leaving.
    pub(super) fn may_drop(&self, part: &Partition) -> bool {
        // A node leaving keeps its copies on disk: restarted, it follows only what it
        // missed instead of restoring them.
        if self.leaving.load(Ordering::SeqCst) {
            return false;
        }
        let unwanted = *part
            .unwanted_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if unwanted.is_none_or(|since| since.elapsed() < DROP_AFTER) {
            return false;
        }
        let members = self.live.borrow();
        let set = members.replica_set(part.id, self.cfg.copies);
        !set.is_empty() && set.iter().all(|n| members.is_warm(n, part.id))
    }

    /// Standby → absent: stops following, closes the standby and deletes its copy;
    /// whether there was a standby.
    pub(super) async fn drop_copy(&self, part: &Partition, role: &mut Role) -> bool {
        if !matches!(role, Role::Standby(_)) {
            return false;
        }
        let Role::Standby(follower) = std::mem::replace(role, Role::Absent) else {
            unreachable!("checked above")
        };
        part.set_warm(false);
        stop_following(follower).await;
        self.delete_copy(part).await;
        true
    }

    /// Deletes this node's (closed) copy of the partition.
    pub(super) async fn delete_copy(&self, part: &Partition) {
        let dir = part.dir.clone();
        match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await {
            Ok(Ok(())) => tracing::info!(partition = part.id, "deleted this node's copy"),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, partition = part.id, "cannot delete this node's copy")
            }
            Err(e) => {
                tracing::warn!(error = %e, partition = part.id, "cannot delete this node's copy")
            }
        }
    }

    /// Opens this node's copy of the partition as a standby. Without one on disk, the
    /// partition's latest snapshot is restored first (when one is stored), so only the
    /// stream's tail is replayed.
    pub(super) async fn open_copy(&self, part: &Partition) -> anyhow::Result<Substrate> {
        if !part.dir.exists() {
            self.restore(part).await?;
        }
        self.open_standby_patiently(part).await
    }

    /// Restores the partition's latest snapshot into its directory (which must not
    /// exist); its log position, or `None` when no sealed snapshot is stored or the one
    /// stored is refused — the copy then follows the stream from its start, which works
    /// while the stream was never truncated and otherwise says the copy is behind, to be
    /// restored again once a snapshot is stored (a truncated stream without one is
    /// snapshotted again, see [`Node::snapshot_due`]).
    async fn restore(&self, part: &Partition) -> anyhow::Result<Option<u64>> {
        if self.snapshots.latest(&part.stream).await?.is_none() {
            return Ok(None);
        }
        let _turn = self.restore_turn(part).await;
        let started = Instant::now();
        let (position, bytes) = match self.snapshots.restore(&part.stream, &part.dir).await {
            Ok(Some(restored)) => restored,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), partition = part.id, "cannot restore the partition's snapshot; following its stream from the start");
                return Ok(None);
            }
        };
        tracing::info!(
            partition = part.id,
            position,
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "restored the partition's latest snapshot"
        );
        Ok(Some(position))
    }

    /// A turn to restore a snapshot: [`RESTORES_AT_ONCE`] at a time, the partitions this
    /// node is to own first, so a joining node serves its share soonest; a copy it will
    /// keep only as a standby waits (at most [`OWNED_FIRST_FOR`]) until this node owns
    /// those, its restores and their index builds taking no time from theirs.
    async fn restore_turn(&self, part: &Partition) -> tokio::sync::SemaphorePermit<'_> {
        let waited = Instant::now();
        let owned = |p: &Partition| p.router.read().unwrap_or_else(|p| p.into_inner()).is_some();
        while !self.first_in_ranking(part.id)
            && waited.elapsed() < OWNED_FIRST_FOR
            && self
                .partitions
                .iter()
                .any(|p| self.first_in_ranking(p.id) && !owned(p))
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.restores
            .acquire()
            .await
            .expect("the restore turns are never closed")
    }

    /// Whether this node comes first in the partition's ranking among the live members:
    /// it is to own the partition once its copy has caught up.
    fn first_in_ranking(&self, partition: u16) -> bool {
        self.live
            .borrow()
            .replica_set(partition, 1)
            .first()
            .is_some_and(|n| **n == self.cfg.node)
    }

    /// This node's copy fell behind a truncated stream: it is deleted and the latest
    /// snapshot restored in its place, then followed.
    pub(super) async fn catch_up_from_snapshot(&self, part: &Partition, role: &mut Role) {
        if !self.drop_copy(part, role).await {
            return;
        }
        match self.open_copy(part).await {
            Ok(standby) => *role = Role::Standby(self.follow(part, standby)),
            // Idle: the role task tries again.
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot restore the partition's snapshot")
            }
        }
    }

    /// Whether this node should snapshot the partition now: it keeps a caught-up standby,
    /// it is the best-ranked node of the replica set after the owner, its last snapshot
    /// is [`SNAPSHOT_GAP`] old, and the stream holds at least `snapshot_tail_mib` or was
    /// truncated beneath a snapshot that is no longer stored (asked every
    /// [`SNAPSHOT_ASK_EVERY`]).
    pub(super) async fn snapshot_due(&self, part: &Partition) -> bool {
        if self.cfg.snapshot_tail == 0 || !part.is_warm() || part.storing.load(Ordering::SeqCst) {
            return false;
        }
        {
            let members = self.live.borrow();
            let owner = members.owner_for(part.id, &self.cfg.node, false);
            let taker = members
                .replica_set(part.id, self.cfg.copies)
                .into_iter()
                .find(|n| Some(*n) != owner);
            if taker != Some(&self.cfg.node) {
                return false;
            }
        }
        {
            let mut clock = part
                .snapshot_clock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (asked, taken) = &mut *clock;
            if asked.is_some_and(|t| t.elapsed() < SNAPSHOT_ASK_EVERY)
                || taken.is_some_and(|t| t.elapsed() < SNAPSHOT_GAP)
            {
                return false;
            }
            *asked = Some(Instant::now());
        }
        let state = match self.js.get_stream(&part.stream).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => info.state.clone(),
                Err(_) => return false,
            },
            Err(_) => return false,
        };
        if state.bytes >= self.cfg.snapshot_tail {
            // A copy restored from the snapshot should open on built indexes. While the
            // standby's are far behind (a vector build of a big partition takes minutes
            // on a loaded machine), the snapshot waits for them: closing the standby
            // would cancel the build under way, so a partition snapshotted every gap
            // would never hold a vector index and every copy restored would build it
            // whole before it opens. Past four times the threshold it goes ahead.
            let unbuilt = part.unbuilt.load(Ordering::SeqCst);
            if unbuilt > SNAPSHOT_UNBUILT && state.bytes < self.cfg.snapshot_tail * 4 {
                tracing::debug!(
                    partition = part.id,
                    unbuilt,
                    "the snapshot waits for the standby's indexes"
                );
                return false;
            }
            return true;
        }
        // A truncated stream needs a snapshot beneath it, or a new copy has nothing to
        // start from: one deleted or spoiled (by whoever holds a node's NATS credential)
        // is taken again.
        state.first_sequence > 1 && matches!(self.snapshots.latest(&part.stream).await, Ok(None))
    }

    /// Snapshots the partition from this node's standby: the standby is closed (its
    /// indexes saved), its directory packed into an archive and the standby reopened; the
    /// archive is then stored and the stream truncated beneath it in the background.
    pub(super) async fn snapshot(&self, part: &Partition, role: &mut Role) {
        if !matches!(role, Role::Standby(_)) {
            return;
        }
        let Role::Standby(follower) = std::mem::replace(role, Role::Idle) else {
            unreachable!("checked above")
        };
        // Paused, this copy could not take the partition over within the takeover bound:
        // another caught-up copy is preferred until it has caught up again.
        part.set_warm(false);
        part.snapshot_clock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1 = Some(Instant::now());
        let started = Instant::now();
        follower.stop.cancel();
        let packed = match follower.task.await {
            Ok(standby) => self.pack(part, standby).await,
            Err(e) => Err(anyhow::anyhow!("the standby's task failed: {e}")),
        };
        let paused = started.elapsed();
        match self.open_standby_patiently(part).await {
            Ok(standby) => *role = Role::Standby(self.follow(part, standby)),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), partition = part.id, "cannot open the standby store")
            }
        }
        let (position, file, digest, bytes) = match packed {
            Ok(packed) => packed,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), partition = part.id, "could not snapshot the partition");
                return;
            }
        };
        tracing::info!(
            partition = part.id,
            position,
            bytes,
            paused_ms = paused.as_millis() as u64,
            "packed a snapshot of the partition; storing it"
        );
        part.storing.store(true, Ordering::SeqCst);
        tokio::spawn(store_snapshot(
            self.snapshots.clone(),
            self.js.clone(),
            part.stream.clone(),
            part.id,
            (position, file, digest),
            part.storing.clone(),
        ));
    }

    /// Closes `standby` and packs the partition's directory: its position, the archive,
    /// its SHA-256 and size.
    async fn pack(
        &self,
        part: &Partition,
        standby: Substrate,
    ) -> anyhow::Result<(u64, std::path::PathBuf, [u8; 32], u64)> {
        let position = standby.store().log_applied()?;
        tokio::task::spawn_blocking(move || standby.close())
            .await
            .context("closing the standby")??;
        let file = self.scratch.join(format!("{}.tar", part.stream));
        let (dir, archive) = (part.dir.clone(), file.clone());
        let (digest, bytes) = tokio::task::spawn_blocking(move || snapshot::pack(&dir, &archive))
            .await
            .context("packing the snapshot")?
            .with_context(|| format!("packing {}", part.dir.display()))?;
        Ok((position, file, digest, bytes))
    }
}

/// Stores a packed snapshot (unless one at or past it is stored already) and truncates
/// the stream beneath the snapshot stored then, whichever node stored it: a truncation
/// that failed after an earlier upload is done by the next attempt. The archive is
/// deleted either way.
async fn store_snapshot(
    snapshots: Arc<Snapshots>,
    js: jetstream::Context,
    stream: String,
    partition: u16,
    (position, file, digest): (u64, std::path::PathBuf, [u8; 32]),
    storing: Arc<AtomicBool>,
) {
    let started = Instant::now();
    let outcome = async {
        let uploaded = snapshots.upload(&stream, position, &file, digest).await?;
        // Beneath what is stored now: this snapshot, or a newer one covering more.
        let stored = snapshots
            .latest(&stream)
            .await?
            .context("the stored snapshot is not visible yet; truncating at the next one")?;
        let purged = js
            .get_stream(&stream)
            .await?
            .purge()
            .sequence(stored + 1)
            .await?
            .purged;
        anyhow::Ok((uploaded, stored, purged))
    }
    .await;
    let _ = tokio::fs::remove_file(&file).await;
    match outcome {
        Ok((uploaded, stored, purged)) => tracing::info!(
            partition,
            position,
            uploaded,
            stored,
            purged,
            took_ms = started.elapsed().as_millis() as u64,
            "stored the snapshot (unless one at or past it was) and truncated the stream beneath it"
        ),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), partition, "could not store the snapshot or truncate the stream")
        }
    }
    storing.store(false, Ordering::SeqCst);
}

//! Giving the pages of an LMDB memory map back to the kernel: used by the store's LMDB
//! backend and by the vector index (arroy on LMDB), the two maps a large store reads.
//!
//! A page LMDB reads stays mapped, and counted in the process's RSS, until the process
//! unmaps it. On a kernel with large page-cache folios (ext4 on Linux 6.x) one read of a
//! cached file maps the whole folio around it, up to 2 MB: random reads (a recall reads a
//! few records of one session; a tree build reads every node) map a multi-GB store within
//! seconds, though each folio is read for a few KB. The RSS then reports the size of the
//! store, not what the process holds.
//!
//! [`MapRelease`] drops the map's pages from the process with `madvise(MADV_DONTNEED)`:
//! every [`RELEASE_INTERVAL`] of activity, and, once the file is larger than
//! [`MAP_BUDGET`], every [`RELEASE_EVERY_READS`] page-reading operations. As each random
//! read can map 2 MB, only a count of reads bounds what is mapped (a burst of recalls can
//! map a gigabyte within half a second). That has a price: reads after a release fault
//! their pages in again, which shows in session recall's median latency, so a file within
//! the budget is only ever released by time.
//!
//! It is safe for LMDB's map, a shared read-only mapping of the file: LMDB writes with
//! `pwrite`, never through the map, so a dropped page is read again from the page cache,
//! with the same bytes, on its next access (a minor fault of a few µs, not a disk read).
//! Nothing is written and no transaction is disturbed. The kernel keeps the pages cached
//! while memory is free; under a memory limit it can drop them without first unmapping
//! them from this process.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a busy map's pages are given back, at the latest.
pub(crate) const RELEASE_INTERVAL: Duration = Duration::from_millis(500);

/// Bytes of a map the process may keep mapped between two releases.
pub(crate) const MAP_BUDGET: u64 = 384 << 20;

/// Page-reading operations (a get, a scan, a write of a commit, a search) between two
/// releases of a map larger than [`MAP_BUDGET`]: each may map a 2 MB folio.
pub(crate) const RELEASE_EVERY_READS: u64 = MAP_BUDGET / (2 << 20);

/// Drops the pages of one LMDB environment's map now and then (module docs say why).
///
/// A due release runs on a thread of its own, not on the thread whose read made it due: a
/// `madvise` of a large map takes milliseconds, which that thread — the store's commit
/// thread, a runtime worker answering requests — would otherwise spend while every request
/// behind it waits. The owner calls [`MapRelease::stop`] before it closes the environment (in its
/// `Drop`), so no release ever touches a map that is gone.
#[derive(Debug)]
pub(crate) struct MapRelease {
    shared: Arc<Shared>,
    /// The releasing thread, until [`MapRelease::stop`].
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    /// The environment's `data.mdb`, as `/proc/self/maps` names it.
    file: PathBuf,
    /// The environment's resize gate: held shared while pages are dropped, so the map
    /// cannot move or close meanwhile.
    gate: Arc<RwLock<()>>,
    started: Instant,
    /// Milliseconds after `started` of the last release.
    last_ms: AtomicU64,
    /// Page-reading operations since the last release.
    reads: AtomicU64,
    /// The file's length when last looked at (each [`RELEASE_INTERVAL`]).
    file_len: AtomicU64,
    /// Where the map is, found once in `/proc/self/maps`; forgotten when it moves.
    ranges: Mutex<Option<Vec<(usize, usize)>>>,
    /// What the releasing thread is asked to do.
    asked: Mutex<Asked>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Asked {
    release: bool,
    stop: bool,
}

impl MapRelease {
    /// For the environment in `dir`, whose resize gate is `gate`.
    pub(crate) fn new(dir: &Path, gate: Arc<RwLock<()>>) -> Self {
        let file = dir.join("data.mdb");
        let file = std::fs::canonicalize(&file).unwrap_or(file);
        let len = std::fs::metadata(&file).map_or(0, |m| m.len());
        let shared = Arc::new(Shared {
            file,
            gate,
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            file_len: AtomicU64::new(len),
            ranges: Mutex::new(None),
            asked: Mutex::new(Asked::default()),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        // Without the thread (the process's thread limit), due releases are skipped: a
        // page left mapped only costs memory.
        let thread = std::thread::Builder::new()
            .name("shadowbrain-map-release".into())
            .spawn(move || worker.serve())
            .map_err(|e| tracing::warn!(error = %e, "cannot start the map release thread"))
            .ok();
        MapRelease {
            shared,
            thread: Mutex::new(thread),
        }
    }

    /// After `reads` page-reading operations: has the releasing thread drop the pages if a
    /// release is due. Never waits for it.
    pub(crate) fn tick(&self, reads: u64) {
        if self.shared.due(reads) {
            lock(&self.shared.asked).release = true;
            self.shared.wake.notify_one();
        }
    }

    /// Drops the map's pages from this process now, on the calling thread, and returns the
    /// bytes advised. The caller holds the environment's resize gate (shared is enough).
    pub(crate) fn release_now(&self) -> usize {
        self.shared.release_now()
    }

    /// Stops the releasing thread and waits for a release in progress; later ticks do
    /// nothing. The owner calls it before the environment closes.
    pub(crate) fn stop(&self) {
        lock(&self.shared.asked).stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }

    /// Holds up every release, on any thread, until the guard is dropped (tests).
    #[cfg(test)]
    pub(crate) fn block_releases(&self) -> std::sync::MutexGuard<'_, Option<Vec<(usize, usize)>>> {
        lock(&self.shared.ranges)
    }

    /// No release by time from now on (tests that count mapped pages).
    #[cfg(test)]
    pub(crate) fn hold(&self) {
        self.shared.last_ms.store(u64::MAX, Ordering::Relaxed);
    }

    /// Forgets where the map is; call it after a resize (which moves the map), holding
    /// the resize gate exclusively.
    pub(crate) fn map_moved(&self) {
        *lock(&self.shared.ranges) = None;
    }
}

impl Drop for MapRelease {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// The releasing thread: one release each time one is asked for, until stopped.
    fn serve(&self) {
        let mut asked = lock(&self.asked);
        loop {
            if asked.stop {
                return;
            }
            if std::mem::take(&mut asked.release) {
                drop(asked);
                // Skipped, not waited for, when a resize holds or wants the gate.
                if let Ok(_shared) = self.gate.try_read() {
                    self.release_now();
                }
                asked = lock(&self.asked);
                continue;
            }
            asked = self.wake.wait(asked).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Counts `reads` page-reading operations and says whether a release is due; `true` to
    /// one caller at a time.
    fn due(&self, reads: u64) -> bool {
        let count = self.reads.fetch_add(reads, Ordering::Relaxed) + reads;
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ms.load(Ordering::Relaxed);
        let timed = now.saturating_sub(last) >= RELEASE_INTERVAL.as_millis() as u64;
        let over =
            count >= RELEASE_EVERY_READS && self.file_len.load(Ordering::Relaxed) > MAP_BUDGET;
        if !(timed || over)
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        self.reads.store(0, Ordering::Relaxed);
        if timed && let Ok(meta) = std::fs::metadata(&self.file) {
            self.file_len.store(meta.len(), Ordering::Relaxed);
        }
        true
    }

    /// Drops the map's pages from this process and returns the bytes advised. The caller
    /// holds the resize gate (shared is enough) and the environment is open. A failure is
    /// logged, never returned: the operation that led here succeeded, and a page left
    /// mapped only costs memory.
    fn release_now(&self) -> usize {
        let mut ranges = lock(&self.ranges);
        if ranges.is_none() {
            match map_ranges(&self.file) {
                Ok(found) => {
                    if found.is_empty() {
                        tracing::debug!(file = %self.file.display(), "no mapping of the file in /proc/self/maps");
                    }
                    *ranges = Some(found)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read /proc/self/maps");
                    return 0;
                }
            }
        }
        match drop_mapped_pages(ranges.as_deref().unwrap_or_default()) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(error = %e, file = %self.file.display(), "could not release an LMDB map's pages");
                0
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The address ranges that map `file` in this process.
#[cfg(target_os = "linux")]
fn map_ranges(file: &Path) -> io::Result<Vec<(usize, usize)>> {
    Ok(mappings_of(
        &std::fs::read_to_string("/proc/self/maps")?,
        file,
    ))
}

#[cfg(not(target_os = "linux"))]
fn map_ranges(_file: &Path) -> io::Result<Vec<(usize, usize)>> {
    Ok(Vec::new())
}

/// `madvise(MADV_DONTNEED)` on each range.
#[cfg(target_os = "linux")]
fn drop_mapped_pages(ranges: &[(usize, usize)]) -> io::Result<usize> {
    let mut advised = 0;
    for &(start, end) in ranges {
        // SAFETY: the range is a mapping of `file` that the caller keeps mapped (it holds
        // the resize gate of the open environment). It is shared and read-only, so
        // dropping its pages loses nothing: the next access reads them from the file.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        advised += end - start;
    }
    Ok(advised)
}

/// Other systems keep their pages mapped (they count them differently anyway).
#[cfg(not(target_os = "linux"))]
fn drop_mapped_pages(_ranges: &[(usize, usize)]) -> io::Result<usize> {
    Ok(0)
}

/// The `(start, end)` address ranges that map `file`, from the text of `/proc/self/maps`:
/// `start-end perms offset dev inode path`, the path padded and possibly with spaces.
fn mappings_of(maps: &str, file: &Path) -> Vec<(usize, usize)> {
    let Some(file) = file.to_str() else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            let mut rest = line;
            let mut fields = [""; 5];
            for field in &mut fields {
                rest = rest.trim_start();
                let end = rest.find(' ')?;
                *field = &rest[..end];
                rest = &rest[end..];
            }
            if rest.trim_start() != file {
                return None;
            }
            let (start, end) = fields[0].split_once('-')?;
            Some((
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
            ))
        })
        .collect()
}

/// Bytes of `file` this process has resident in its mappings (`Rss` in
/// `/proc/self/smaps`).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn mapped_bytes(file: &Path) -> usize {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let ranges = mappings_of(&smaps, file);
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((start, _)) = range.split_once('-')
            && !line.starts_with(|c: char| c.is_ascii_uppercase())
        {
            let start = usize::from_str_radix(start, 16).unwrap_or(usize::MAX);
            inside = ranges.iter().any(|&(s, _)| s == start);
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            total += kb
                .trim()
                .trim_end_matches(" kB")
                .parse::<usize>()
                .unwrap_or(0)
                * 1024;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_found_by_path_even_with_spaces() {
        let maps = "\
7f00a0000000-7f00b0000000 r--s 00000000 fd:01 1234                       /data/my store/data.mdb
7f00b0000000-7f00b0001000 rw-p 00000000 00:00 0 
7f00c0000000-7f00c0002000 r--s 00000000 fd:01 99                         /data/my store/data.mdb.bak
55d0e0000000-55d0e0021000 r-xp 00000000 fd:01 7                          /usr/bin/x
";
        assert_eq!(
            mappings_of(maps, Path::new("/data/my store/data.mdb")),
            vec![(0x7f00a0000000, 0x7f00b0000000)]
        );
        assert!(mappings_of(maps, Path::new("/elsewhere/data.mdb")).is_empty());
    }

    /// Reads release a map only once its file outgrows the budget; time releases any.
    #[test]
    fn reads_count_only_past_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("data.mdb")).unwrap();
        file.set_len(MAP_BUDGET / 2).unwrap();
        let gate = Arc::new(RwLock::new(()));
        let small = MapRelease::new(dir.path(), gate.clone());
        assert!(!small.shared.due(RELEASE_EVERY_READS * 10));
        // Sparse: no disk is used.
        file.set_len(MAP_BUDGET * 2).unwrap();
        let large = MapRelease::new(dir.path(), gate);
        assert!(!large.shared.due(RELEASE_EVERY_READS - 1));
        assert!(large.shared.due(1));
        assert!(
            !large.shared.due(1),
            "the count starts again after a release"
        );
        std::thread::sleep(RELEASE_INTERVAL);
        assert!(
            small.shared.due(1),
            "activity after the interval releases any map"
        );
    }
}

//! Giving the pages of an LMDB memory map back to the kernel.
//!
//! A page LMDB reads stays mapped, and counted in the process's RSS, until the process
//! unmaps it. On a kernel with large page-cache folios (ext4 on Linux 6.x) one read of a
//! cached file maps the whole folio around it, up to 2 MB: random reads (a recall reads a
//! few records of one session; a tree build reads every node) map a multi-GB store within
//! seconds, though each folio is read for a few KB. The RSS then reports the size of the
//! store, not what the process holds.
//!
//! [`MapRelease`] drops the map's pages from the process every [`RELEASE_INTERVAL`] of
//! activity with `madvise(MADV_DONTNEED)`. That is safe for LMDB's map: it is a shared,
//! read-only mapping of the file (LMDB writes with `pwrite`, never through the map), so a
//! dropped page is read again from the page cache, with the same bytes, on its next
//! access — a minor fault of a few µs, not a disk read. The kernel keeps the pages cached
//! while memory is free; under a memory limit it can drop them without first unmapping
//! them from this process. Nothing is written, and no transaction is disturbed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a busy map's pages are given back.
pub(crate) const RELEASE_INTERVAL: Duration = Duration::from_millis(500);

/// Drops the pages of one LMDB environment's map now and then (module docs say why).
#[derive(Debug)]
pub(crate) struct MapRelease {
    /// The environment's `data.mdb`, as `/proc/self/maps` names it.
    file: PathBuf,
    started: Instant,
    /// Milliseconds after `started` of the last release.
    last_ms: AtomicU64,
}

impl MapRelease {
    /// For the environment in `dir`.
    pub(crate) fn new(dir: &Path) -> Self {
        let file = dir.join("data.mdb");
        MapRelease {
            file: std::fs::canonicalize(&file).unwrap_or(file),
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Whether a release is due; `true` to one caller per interval.
    pub(crate) fn due(&self) -> bool {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) >= RELEASE_INTERVAL.as_millis() as u64
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Releases the pages if one is due. `gate` is the environment's resize gate: held
    /// shared meanwhile, so the map cannot move or close under the `madvise`. Skipped, not
    /// waited for, when a resize holds or wants it.
    pub(crate) fn tick(&self, gate: &RwLock<()>) {
        if !self.due() {
            return;
        }
        let Ok(_shared) = gate.try_read() else {
            return;
        };
        self.release_now();
    }

    /// Drops the map's pages from this process now and returns the bytes advised.
    /// The caller holds the environment's resize gate (shared is enough) and keeps the
    /// environment open meanwhile. A failure is logged, never returned: the operation
    /// that led here succeeded, and a page left mapped only costs memory.
    pub(crate) fn release_now(&self) -> usize {
        match drop_mapped_pages(&self.file) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(error = %e, file = %self.file.display(), "could not release an LMDB map's pages");
                0
            }
        }
    }
}

/// `madvise(MADV_DONTNEED)` on every mapping of `file` in this process.
#[cfg(target_os = "linux")]
fn drop_mapped_pages(file: &Path) -> io::Result<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut advised = 0;
    for (start, end) in mappings_of(&maps, file) {
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
fn drop_mapped_pages(_file: &Path) -> io::Result<usize> {
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
}

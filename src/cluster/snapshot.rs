//! Snapshots of partitions, kept in a JetStream object store, so that a copy that is new,
//! or fell behind a truncated stream, restores the latest snapshot and replays only the
//! stream's tail (docs/cluster.md, "Snapshots").
//!
//! A snapshot is a partition's closed data directory — its store at a log position, with
//! the indexes its standby had built and the change log they still lack — as one tar
//! archive, stored as the object named after the partition's stream. Its position, the
//! archive's SHA-256 and a seal under the cluster secret over the stream, the position and
//! the SHA-256 are the object's metadata: the object store is writable by every NATS user
//! with a node's permissions, so a node believes only a snapshot a node sealed — as it
//! applies only sealed log entries —, restores only an archive whose SHA-256 is the sealed
//! one, and overwrites an unsealed object as if there were none. Once the snapshot is
//! stored, the stream is purged beneath its position.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream::object_store::{ObjectMetadata, ObjectStore};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::seal::{Kind, Sealer, unhex};

/// The metadata keys of a snapshot object.
const POSITION: &str = "position";
const SHA256: &str = "sha256";
const SEAL: &str = "seal";

/// Chunks of the object store's messages: larger than its default 128 KiB, so a big
/// partition takes fewer messages, and well under a NATS message's 1 MiB default limit.
const CHUNK: usize = 512 * 1024;

/// The cluster's snapshots, in one object-store bucket.
pub(super) struct Snapshots {
    pub(super) store: ObjectStore,
    pub(super) sealer: Arc<Sealer>,
}

impl Snapshots {
    /// The log position of `stream`'s partition's latest snapshot, if one is stored and
    /// sealed (an object without a valid seal is not a snapshot: the next one overwrites
    /// it).
    pub(super) async fn latest(&self, stream: &str) -> anyhow::Result<Option<u64>> {
        let info = match self.store.info(stream).await {
            Ok(info) if !info.deleted => info,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == async_nats::jetstream::object_store::InfoErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e).context("reading the snapshot's description"),
        };
        match self.sealed(stream, &info.metadata) {
            Ok((position, _)) => Ok(Some(position)),
            Err(e) => {
                tracing::warn!(error = %e, stream, "passing over an object that is not a sealed snapshot");
                Ok(None)
            }
        }
    }

    /// The position and SHA-256 a snapshot's metadata names, if a node sealed them.
    fn sealed(
        &self,
        stream: &str,
        metadata: &std::collections::HashMap<String, String>,
    ) -> anyhow::Result<(u64, [u8; 32])> {
        let position: u64 = metadata
            .get(POSITION)
            .and_then(|p| p.parse().ok())
            .context("it names no log position")?;
        let digest: [u8; 32] = metadata
            .get(SHA256)
            .and_then(|d| unhex(d)?.try_into().ok())
            .context("it names no SHA-256")?;
        let seal = metadata.get(SEAL).context("it carries no seal")?;
        self.sealer
            .verify_hex(
                Kind::Snapshot,
                &[stream.as_bytes(), &position.to_be_bytes()],
                &digest,
                seal,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((position, digest))
    }

    /// Stores the archive `file` (its SHA-256 `digest`) as `stream`'s snapshot at
    /// `position`, unless a snapshot at or past it is stored already; whether it stored it.
    pub(super) async fn upload(
        &self,
        stream: &str,
        position: u64,
        file: &Path,
        digest: [u8; 32],
    ) -> anyhow::Result<bool> {
        if self
            .latest(stream)
            .await?
            .is_some_and(|stored| stored >= position)
        {
            return Ok(false);
        }
        let seal = seal(&self.sealer, stream, position, &digest);
        let meta = ObjectMetadata {
            name: stream.to_string(),
            description: Some(format!(
                "shadowbrain partition snapshot at log position {position}"
            )),
            chunk_size: Some(CHUNK),
            metadata: [
                (POSITION.to_string(), position.to_string()),
                (SHA256.to_string(), crate::auth::hex(&digest)),
                (SEAL.to_string(), seal),
            ]
            .into(),
            headers: None,
        };
        let mut reader = tokio::fs::File::open(file)
            .await
            .with_context(|| format!("opening {}", file.display()))?;
        self.store
            .put(meta, &mut reader)
            .await
            .context("storing the snapshot in the object store")?;
        Ok(true)
    }

    /// Restores `stream`'s latest snapshot into `dir` (which must not exist), unpacking
    /// the archive as it arrives — no copy of it lands on disk first — into a directory
    /// beside `dir` that is renamed into place only once the whole archive has the sealed
    /// SHA-256; its position and the archive's size, or `None` when there is no snapshot.
    pub(super) async fn restore(
        &self,
        stream: &str,
        dir: &Path,
    ) -> anyhow::Result<Option<(u64, u64)>> {
        let mut object = match self.store.get(stream).await {
            Ok(object) => object,
            Err(e) if e.kind() == async_nats::jetstream::object_store::GetErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e).context("reading the snapshot"),
        };
        let (position, sealed) = self
            .sealed(stream, &object.info.metadata)
            .map_err(|e| anyhow::anyhow!("the snapshot of {stream} was refused: {e}"))?;
        // The archive goes chunk by chunk to a blocking thread that unpacks it; a few
        // chunks in flight keep both sides busy.
        let (chunks, arriving) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let target = dir.to_path_buf();
        let unpacking = tokio::task::spawn_blocking(move || {
            unpack_from(
                Hashing {
                    inner: Arriving {
                        chunks: arriving,
                        chunk: Vec::new(),
                        at: 0,
                    },
                    hash: Sha256::new(),
                    bytes: 0,
                },
                &target,
                sealed,
            )
        });
        let read = async {
            loop {
                let mut buffer = vec![0u8; CHUNK];
                let n = object
                    .read(&mut buffer)
                    .await
                    .context("reading the snapshot")?;
                if n == 0 {
                    return anyhow::Ok(());
                }
                buffer.truncate(n);
                if chunks.send(buffer).await.is_err() {
                    // The unpacking stopped (its error says why).
                    return Ok(());
                }
            }
        }
        .await;
        drop(chunks);
        // The unpacking's error first: a read that stopped early only shows there as an
        // archive cut short.
        let unpacked = unpacking.await.context("unpacking the snapshot")?;
        let bytes = unpacked
            .map_err(anyhow::Error::from)
            .and_then(|bytes| read.map(|()| bytes))
            .with_context(|| format!("restoring the snapshot of {stream}"))?;
        Ok(Some((position, bytes)))
    }
}

/// Seals `digest` as `stream`'s snapshot at `position` (bound to both).
fn seal(sealer: &Sealer, stream: &str, position: u64, digest: &[u8; 32]) -> String {
    sealer.sign_hex(
        Kind::Snapshot,
        &[stream.as_bytes(), &position.to_be_bytes()],
        digest,
    )
}

/// Writes the (closed) partition directory `dir` into the archive `file`; the archive's
/// SHA-256 and size.
pub(super) fn pack(dir: &Path, file: &Path) -> std::io::Result<([u8; 32], u64)> {
    let out = std::fs::File::create(file)?;
    let mut builder = tar::Builder::new(Hashing {
        inner: std::io::BufWriter::with_capacity(1 << 20, out),
        hash: Sha256::new(),
        bytes: 0,
    });
    builder.follow_symlinks(false);
    builder.append_dir_all(".", dir)?;
    let mut hashing = builder.into_inner()?;
    hashing.flush()?;
    let Hashing { inner, hash, bytes } = hashing;
    inner.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok((hash.finalize().into(), bytes))
}

/// Unpacks the archive `file` into `dir`, which must not exist (tests; a node restores
/// with [`Snapshots::restore`]).
#[cfg(test)]
fn unpack(file: &Path, dir: &Path) -> std::io::Result<()> {
    let digest = sha256_of(file)?;
    let reader = Hashing {
        inner: std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?),
        hash: Sha256::new(),
        bytes: 0,
    };
    unpack_from(reader, dir, digest).map(|_| ())
}

/// Unpacks the archive `reader` reads into `dir`, which must not exist: into a directory
/// beside it first, renamed into place only once the archive is whole and has the SHA-256
/// `sealed`, so neither a crash nor a forged archive leaves a copy behind; the archive's
/// size.
fn unpack_from<R: std::io::Read>(
    reader: Hashing<R>,
    dir: &Path,
    sealed: [u8; 32],
) -> std::io::Result<u64> {
    if dir.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists already", dir.display()),
        ));
    }
    let partial = dir.with_extension("restoring");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::create_dir_all(&partial)?;
    let whole = (|| {
        // `unpack` refuses entries that would land outside `partial` (`..`, absolute
        // paths).
        let mut archive = tar::Archive::new(reader);
        archive.unpack(&partial)?;
        // The archive's end (its padding) is hashed too.
        let mut reader = archive.into_inner();
        std::io::copy(&mut reader, &mut std::io::sink())?;
        let digest: [u8; 32] = reader.hash.finalize().into();
        if digest != sealed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "its archive is not the one its seal names",
            ));
        }
        Ok(reader.bytes)
    })();
    match whole {
        Ok(bytes) => std::fs::rename(&partial, dir).map(|()| bytes),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// The chunks of an archive arriving from the object store, read as one stream.
struct Arriving {
    chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl std::io::Read for Arriving {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.chunks.blocking_recv() {
                Some(chunk) => (self.chunk, self.at) = (chunk, 0),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A writer or reader that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: std::io::Read> std::io::Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The SHA-256 of a file (tests).
#[cfg(test)]
fn sha256_of(file: &Path) -> std::io::Result<[u8; 32]> {
    use std::io::Read;
    let mut f = std::fs::File::open(file)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hash.finalize().into());
        }
        hash.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_directory_unpacks_whole_with_its_digest() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("p003");
        std::fs::create_dir_all(dir.join("store")).unwrap();
        std::fs::create_dir_all(dir.join("keywords/segments")).unwrap();
        std::fs::write(dir.join("store/data.mdb"), vec![7u8; 300_000]).unwrap();
        std::fs::write(dir.join("keywords/segments/a.idx"), b"terms").unwrap();
        let file = scratch.path().join("p003.tar");
        let (digest, bytes) = pack(&dir, &file).unwrap();
        assert_eq!(bytes, std::fs::metadata(&file).unwrap().len());
        assert_eq!(digest, sha256_of(&file).unwrap());
        let restored = scratch.path().join("restored/p003");
        std::fs::create_dir_all(restored.parent().unwrap()).unwrap();
        unpack(&file, &restored).unwrap();
        assert_eq!(
            std::fs::read(restored.join("store/data.mdb")).unwrap(),
            vec![7u8; 300_000]
        );
        assert_eq!(
            std::fs::read(restored.join("keywords/segments/a.idx")).unwrap(),
            b"terms"
        );
        assert!(!restored.with_extension("restoring").exists());
        // Into a directory that exists: refused, nothing overwritten.
        assert!(unpack(&file, &dir).is_err());
        // An archive that is not the sealed one: unpacked beside, then thrown away.
        let forged = scratch.path().join("forged/p003");
        let reader = Hashing {
            inner: std::fs::File::open(&file).unwrap(),
            hash: Sha256::new(),
            bytes: 0,
        };
        let mut other = digest;
        other[0] ^= 1;
        let refused = unpack_from(reader, &forged, other).unwrap_err();
        assert!(refused.to_string().contains("not the one its seal names"));
        assert!(!forged.exists());
        assert!(!forged.with_extension("restoring").exists());
    }
}

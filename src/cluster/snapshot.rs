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
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    /// Downloads `stream`'s latest snapshot into `file` and checks its seal; its position,
    /// or `None` when there is no snapshot.
    pub(super) async fn download(&self, stream: &str, file: &Path) -> anyhow::Result<Option<u64>> {
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
        let mut out = tokio::fs::File::create(file)
            .await
            .with_context(|| format!("creating {}", file.display()))?;
        let mut hash = Sha256::new();
        let mut buffer = vec![0u8; CHUNK];
        loop {
            let n = object
                .read(&mut buffer)
                .await
                .context("reading the snapshot")?;
            if n == 0 {
                break;
            }
            hash.update(&buffer[..n]);
            out.write_all(&buffer[..n]).await?;
        }
        out.sync_all().await?;
        let digest: [u8; 32] = hash.finalize().into();
        anyhow::ensure!(
            digest == sealed,
            "the snapshot of {stream} was refused: its archive is not the one its seal names"
        );
        Ok(Some(position))
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

/// Unpacks the archive `file` into `dir`, which must not exist: into a directory beside
/// it first, renamed into place once whole, so a crash never leaves half a copy.
pub(super) fn unpack(file: &Path, dir: &Path) -> std::io::Result<()> {
    let partial = dir.with_extension("restoring");
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    let reader = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file)?);
    // `unpack` refuses entries that would land outside `partial` (`..`, absolute paths).
    tar::Archive::new(reader).unpack(&partial)?;
    std::fs::rename(&partial, dir)
}

/// A writer that hashes and counts what passes through it.
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
    }
}

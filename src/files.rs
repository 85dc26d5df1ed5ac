//! Export files: a store written out as the JSON lines of [`crate::transfer`] (a header,
//! then one line per record, tombstone, quarantine entry and recall), and such a file
//! read back into a data directory. `shadowbrain export` and `import` (src/cli/transfer.rs)
//! and the Python package's `Memory.export` and `import_` (through [`crate::embedded`])
//! both come here, so a file one writes the other reads, and both refuse the same lines with
//! the same words.
//!
//! An import commits in batches: a bad line stops it with every line before it durable,
//! and running the same import again skips what is there. A failed write is reported as
//! such, not blamed on the line.

use std::fs::File;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::Substrate;
use crate::internals::Store;
use crate::transfer::{self, Extra, ImportError, Importer, Line, Outcome};

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exported {
    /// Records (every tier and status).
    pub records: u64,
    /// Tombstones of purged records.
    pub purged: u64,
    /// Quarantine entries.
    pub quarantined: u64,
    /// Remembered recalls (so feedback on an old recall id still works after a move).
    pub recalls: u64,
}

/// Writes `namespace`'s lines (every namespace's with `None`) from `store` to `sink`;
/// `progress(done, total)` after each line.
pub fn export(
    store: &Store,
    namespace: Option<&str>,
    sink: &mut dyn Write,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<Exported> {
    let header = transfer::export_header(store, namespace)?;
    let ids = transfer::export_ids(store, namespace)?;
    let extras = transfer::export_extras(store, namespace)?;
    let total = (ids.len() + extras.len()) as u64;
    let mut done = 0;
    let mut counts = Exported::default();
    let mut write = |line: &Line| -> anyhow::Result<()> {
        sink.write_all(line.to_json()?.as_bytes())?;
        sink.write_all(b"\n")?;
        Ok(())
    };
    write(&Line::Header(header))?;
    for id in &ids {
        if let Some(line) = transfer::export_record(store, *id)? {
            write(&Line::Record(Box::new(line)))?;
            counts.records += 1;
        }
        done += 1;
        progress(done, total);
    }
    for extra in &extras {
        if let Some(line) = transfer::export_extra(store, *extra)? {
            write(&line)?;
            *match extra {
                Extra::Purged(_) => &mut counts.purged,
                Extra::Quarantine(_) => &mut counts.quarantined,
                Extra::Recall(_) => &mut counts.recalls,
            } += 1;
        }
        done += 1;
        progress(done, total);
    }
    sink.flush()?;
    Ok(counts)
}

/// [`export`] into the file `path`: written as `path.partial` and renamed when complete,
/// so a failed export never leaves a file that looks complete, nor a partial one behind.
pub fn export_to_file(
    store: &Store,
    namespace: Option<&str>,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<Exported> {
    if path.is_dir() {
        anyhow::bail!(
            "{} is a directory; name a file, e.g. {}",
            path.display(),
            path.join("shadowbrain-export.jsonl").display()
        );
    }
    let partial = partial_path(path);
    let written = (|| -> anyhow::Result<Exported> {
        let file =
            File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        let counts = export(store, namespace, &mut BufWriter::new(file), progress)?;
        std::fs::rename(&partial, path)
            .with_context(|| format!("moving {} to {}", partial.display(), path.display()))?;
        Ok(counts)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// The embedder an export's header names (the first line of `first_line`), if any: with
/// `auto`, a new directory takes that one, so an export moves to a fresh machine as it was.
pub fn source_embedder(first_line: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(first_line)
        .ok()
        .and_then(|v| v["header"]["embedder"].as_str().map(str::to_string))
}

/// The longest line import reads: far above any record the input limits let in (a record's
/// JSON, embedding and history included), low enough that a file without newlines cannot
/// exhaust memory.
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// How many ids of "present but different" lines, or of dangling references, a report
/// lists.
const SHOWN: usize = 5;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    /// Lines written into the directory.
    pub imported: u64,
    /// Lines the directory already held as they are: skipped.
    pub present: u64,
    /// Ids the directory holds in another state (a newer or older export): its version
    /// kept.
    pub different: Vec<String>,
    /// References to records neither in the file nor in the directory.
    pub dangling: Vec<String>,
}

impl Imported {
    /// What is wrong with the file although everything else was imported (`None`: nothing),
    /// said so that the reader knows what to do; `name` names the file.
    pub fn problems(&self, name: &str) -> Option<String> {
        let mut problems = Vec::new();
        if !self.different.is_empty() {
            problems.push(format!(
                "present but different: {} ({}); this data directory holds those ids in \
                 another state (the file is a newer or older export), and import never \
                 overwrites, so its versions were kept. To take the file's versions, import it \
                 into an empty data directory",
                self.different.len(),
                shown(&self.different)
            ));
        }
        if !self.dangling.is_empty() {
            problems.push(format!(
                "dangling references: {} ({}); they name records that are neither in {name} \
                 nor in the data directory, so the export is incomplete (edited, or cut short). \
                 Import the missing records from a complete export of the source",
                self.dangling.len(),
                shown(&self.dangling)
            ));
        }
        (!problems.is_empty()).then(|| problems.join("\n"))
    }
}

/// The first few of `items`, and how many more.
fn shown(items: &[String]) -> String {
    let mut text = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// Why an import stopped early.
enum Failure {
    /// The line is wrong.
    Line(anyhow::Error),
    /// The input could not be read.
    Read(anyhow::Error),
    /// Writing into the data directory failed.
    Write(anyhow::Error),
}

/// Reads the lines of `input` (named `name` in errors) into `sub`, the data directory
/// `data`, opened with no background indexing or enrichment (nothing may change a record
/// while it is imported: the round trip must be exact; the importer runs index passes
/// itself). `progress` gets the counts so far after each line. A stop names the line, says
/// which lines are durable and what to do; the caller closes `sub` either way.
pub fn import(
    sub: &Substrate,
    data: &Path,
    input: &mut dyn BufRead,
    name: &str,
    progress: &mut dyn FnMut(&Imported),
) -> anyhow::Result<Imported> {
    let mut importer = Importer::new(sub);
    let mut report = Imported::default();
    let mut buf = Vec::new();
    let mut number = 0u64;
    let failure = loop {
        buf.clear();
        number += 1;
        match Read::take(&mut *input, MAX_LINE_BYTES + 1).read_until(b'\n', &mut buf) {
            Ok(0) => break None,
            Ok(n) if n as u64 > MAX_LINE_BYTES && buf.last() != Some(&b'\n') => {
                break Some(Failure::Line(anyhow::anyhow!(
                    "line {number} of {name} is over {} MiB; an export's lines are far \
                     shorter, so this is not (or no longer) a file `shadowbrain export` wrote",
                    MAX_LINE_BYTES >> 20
                )));
            }
            Ok(_) => {}
            Err(e) => {
                break Some(Failure::Read(anyhow::anyhow!(
                    "reading line {number} of {name} failed: {e}"
                )));
            }
        }
        let Ok(line) = std::str::from_utf8(&buf) else {
            break Some(Failure::Line(anyhow::anyhow!(
                "line {number} of {name} is not UTF-8 text; an export is UTF-8, one JSON \
                 object per line"
            )));
        };
        if line.trim().is_empty() {
            continue;
        }
        let added = transfer::parse_line(line)
            .map_err(ImportError::Line)
            .and_then(|l| importer.add(l, number));
        match added {
            Ok(Outcome::Imported) => report.imported += 1,
            Ok(Outcome::AlreadyPresent) => report.present += 1,
            Ok(Outcome::Different(id)) => report.different.push(id),
            Ok(Outcome::Header) => {}
            Err(ImportError::Line(e)) => {
                break Some(Failure::Line(anyhow::anyhow!(
                    "line {number} of {name}: {e}"
                )));
            }
            Err(ImportError::Store(e)) => {
                break Some(Failure::Write(anyhow::anyhow!(
                    "writing into {} failed at line {number} of {name}: {e}",
                    data.display()
                )));
            }
        }
        progress(&report);
    };
    if let Some(failure) = failure {
        // What was added before a bad line is committed and indexed: a bad line never
        // costs the lines before it. After a failed write, only what was committed before
        // counts, and writing more would likely fail the same way.
        let flushed = match &failure {
            Failure::Write(_) => Ok(()),
            Failure::Line(_) | Failure::Read(_) => importer.flush(),
        };
        let durable = importer.committed();
        let (e, advice) = match failure {
            Failure::Line(e) => (
                e,
                "Fix or remove the line and run the same import again: lines already \
                 imported are skipped",
            ),
            Failure::Read(e) => (
                e,
                "Check the file (or the pipe feeding it) and run the same import again: lines \
                 already imported are skipped",
            ),
            Failure::Write(e) => (
                e,
                "Nothing is wrong with the line as far as import can tell; fix the cause (disk \
                 space, permissions, the disk itself) and run the same import again: lines \
                 already imported are skipped",
            ),
        };
        let state = match flushed {
            Ok(()) => format!("the {durable} lines imported before it are durable"),
            Err(e2) => format!(
                "only the {durable} lines committed before it are durable (writing the rest \
                 failed too: {e2})"
            ),
        };
        // The line comes first: it is what the user has to fix.
        anyhow::bail!(
            "{e}\n  import stopped there; {state} in {} ({} already present were skipped). \
             {advice}",
            data.display(),
            report.present
        );
    }
    let dangling = importer.finish().map_err(|e| match e {
        ImportError::Line(e) => anyhow::anyhow!("{name}: {e}"),
        ImportError::Store(e) => anyhow::anyhow!(
            "writing the last imported lines into {} failed: {e}; fix the cause (disk space, \
             permissions) and run the same import again: lines already imported are skipped",
            data.display()
        ),
    })?;
    report.dangling = dangling.iter().map(ToString::to_string).collect();
    Ok(report)
}

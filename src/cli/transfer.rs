//! The whole-directory commands: `export` (every record as JSON lines), `import` (those
//! lines into a data directory) and `reindex` (re-embed and rebuild the indexes), each
//! with a progress bar on stderr that stays hidden when stderr is not a terminal.
//!
//! The line format and the rules for writing records back with their own ids live in
//! `shadowbrain::transfer`; this module reads and writes files, counts, and turns
//! a bad line into an error that names it. An import commits in batches, so a bad line
//! stops it with every line before it durable, and running it again skips what is there; a
//! failed write is reported as such, not blamed on the line. Summaries go to stderr, data
//! (the export's lines) to stdout.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use shadowbrain::files::{self, Exported};
use shadowbrain::internals::{Store, StoreOptions};
use shadowbrain::setup::{Choice, backend_of, embedder_for};
use shadowbrain::{Backend, IndexingOptions, Substrate, SubstrateOptions};

use super::{DataDir, StoreArgs, load_config, refuse_if_in_use, require_store};

/// `shadowbrain export`.
#[derive(Debug, Args)]
#[command(after_long_help = "\
The first line is a header naming the embedder (and dimension) that made the vectors and \
the next id the store would hand out; then one line per record of every tier and status \
(with its embedding, audit history, knowledge-graph links, promotion and waiting queues), \
one per purged record (its tombstone, history and remaining links), one per quarantine \
entry, and one per recall (so feedback on an old recall id still works after a move).

Not exported: the vector and keyword indexes (import rebuilds them from the records), the \
index change log, strike counts of records not quarantined, and the time of the last decay \
sweep. Exporting, importing into an empty directory and exporting again gives the same \
bytes.")]
pub struct ExportArgs {
    #[command(flatten)]
    dir: DataDir,
    /// Where to write the lines: a file (written as FILE.partial and renamed when
    /// complete), or `-` (the default) for stdout.
    #[arg(long, short, default_value = "-")]
    output: PathBuf,
    /// Only this namespace's records, tombstones, quarantine entries and recalls (default:
    /// every namespace).
    #[arg(long)]
    namespace: Option<String>,
}

/// `shadowbrain import`.
#[derive(Debug, Args)]
#[command(after_long_help = "\
The file must start with the header `export` writes; an export made with another embedder \
(or dimension) is refused: import it with a --config naming the source's embedder, then \
run `shadowbrain reindex` with the new one. Every id is kept, and ids below the source's \
next id are never handed out here.

Import never overwrites. A line whose id the directory already holds is skipped when it is \
the same, and counted as \"present but different\" when it is the same record in another \
state (a newer or older export): the directory's version is kept, the first few ids are \
listed, and the command exits 1 after importing everything else. A line that is invalid or \
whose id means something else here stops the import; the lines before it stay imported, \
and running the same import again after fixing the line skips them. At the end, references \
(sources, links, promoted_into) to records that are neither in the file nor in the \
directory are listed, and the command exits 1.

Limits: each line at most 64 MiB; text, content and metadata within the --config file's \
[limits] (as for `record`).")]
pub struct ImportArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The file `shadowbrain export` wrote; `-` is stdin.
    file: PathBuf,
}

/// `shadowbrain reindex`.
#[derive(Debug, Args)]
pub struct ReindexArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The store backend the directory was created with (found out when left out).
    #[arg(long)]
    backend: Option<Backend>,
}

/// A bar over `total` units on stderr. When stderr is not a terminal (a log, CI) the bar
/// becomes a plain line every [`LOG_EVERY`], with no control characters, so a long run
/// still shows that it moves.
pub(super) fn bar(total: Option<u64>, what: &'static str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::term_like(Box::new(LogLines::default()))
    };
    let bar = ProgressBar::with_draw_target(total, target);
    let template = match total {
        Some(_) => "{prefix} [{wide_bar}] {percent:>3}% {msg} ({eta} left)",
        None => "{prefix} {spinner} {msg} ({elapsed})",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what);
    bar
}

/// How often a bar writes its line when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(20);

/// indicatif's terminal for a log: cursor moves and clears do nothing, and a frame is
/// written as a line at most every [`LOG_EVERY`] (the first at once).
#[derive(Debug, Default)]
struct LogLines {
    last: Mutex<Option<Instant>>,
}

impl LogLines {
    fn line(&self, s: &str) -> std::io::Result<()> {
        let s = s.trim_end();
        if s.is_empty() {
            return Ok(());
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return Ok(());
        }
        *last = Some(Instant::now());
        writeln!(std::io::stderr(), "{s}")
    }
}

impl TermLike for LogLines {
    fn width(&self) -> u16 {
        80
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.line(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.line(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(super) fn export(args: ExportArgs) -> anyhow::Result<()> {
    let data = &args.dir.data;
    require_store(data)?;
    refuse_if_in_use(data)?;
    if let Some(ns) = &args.namespace {
        shadowbrain::validate_id("namespace", ns)?;
    }
    let to_stdout = args.output.as_os_str() == "-";
    if !to_stdout && args.output.is_dir() {
        anyhow::bail!(
            "--output {} is a directory; name a file, e.g. --output {}",
            args.output.display(),
            args.output.join("shadowbrain-export.jsonl").display()
        );
    }
    // The store alone: exporting needs no embedder and no index, so it works with any
    // config and whatever state the indexes are in.
    let store = Store::open(
        &data.join("store"),
        StoreOptions {
            backend: backend_of(data),
            ..Default::default()
        },
    )
    .with_context(|| format!("opening the data directory {}", data.display()))?;
    let namespace = args.namespace.as_deref();
    // Made at the first line, when the total is known.
    let mut progress: Option<ProgressBar> = None;
    let mut tick = |done: u64, total: u64| {
        progress
            .get_or_insert_with(|| bar(Some(total), "export"))
            .set_position(done);
    };
    let written = if to_stdout {
        files::export(
            &store,
            namespace,
            &mut BufWriter::new(std::io::stdout().lock()),
            &mut tick,
        )
        .context("writing stdout")
    } else {
        files::export_to_file(&store, namespace, &args.output, &mut tick)
    };
    if let Some(progress) = progress {
        progress.finish_and_clear();
    }
    let counts = match written {
        Ok(counts) => counts,
        // `export | head`: the reader has what it wanted; a closed pipe is not a failure.
        Err(e)
            if to_stdout
                && e.chain().any(|c| {
                    c.downcast_ref::<std::io::Error>()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                }) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let Exported {
        records,
        purged,
        quarantined,
        recalls,
    } = counts;
    super::say(format_args!(
        "exported {records} records, {purged} purged, {quarantined} quarantined and {recalls} \
         recalls from {} to {}",
        data.display(),
        if to_stdout {
            "stdout".into()
        } else {
            args.output.display().to_string()
        }
    ));
    Ok(())
}

/// Counts bytes as they are read, for the import's progress bar.
struct Counting<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

pub(super) fn import(args: ImportArgs) -> anyhow::Result<()> {
    let data = &args.store.dir.data;
    refuse_if_in_use(data)?;
    let from_stdin = args.file.as_os_str() == "-";
    let (input, progress): (Box<dyn Read>, ProgressBar) = if from_stdin {
        (Box::new(std::io::stdin().lock()), bar(None, "import"))
    } else {
        let file = File::open(&args.file)
            .with_context(|| format!("opening {}; check the path", args.file.display()))?;
        let len = file.metadata().map(|m| m.len()).ok();
        (Box::new(file), bar(len, "import"))
    };
    let name = if from_stdin {
        "stdin".to_string()
    } else {
        args.file.display().to_string()
    };
    // The header names the embedder that made the export's vectors: with `auto`, a new
    // directory takes that one, so an export moves to a fresh machine as it was.
    let mut counted = BufReader::new(Counting {
        inner: input,
        bar: progress.clone(),
    });
    let mut first = Vec::new();
    let peeked = (&mut counted)
        .take(files::MAX_LINE_BYTES + 1)
        .read_until(b'\n', &mut first);
    let source = files::source_embedder(&first);
    let cfg = load_config(args.store.config.as_deref())?;
    let embedder = embedder_for(&cfg.embedder, data, Choice::Keep(source))?.0;
    let sub = Substrate::open(
        data,
        SubstrateOptions {
            backend: backend_of(data),
            embedder,
            limits: cfg.limits,
            // No enricher or indexer threads: nothing may change a record while it is being
            // imported (the round trip must be exact); the importer runs index passes itself.
            indexing: IndexingOptions {
                background: false,
                ..IndexingOptions::default()
            },
            ..SubstrateOptions::default()
        },
    )
    .with_context(|| format!("opening the data directory {}", data.display()))?;
    // A failed first read is met again, and reported, by the import below.
    if peeked.is_err() {
        first.clear();
    }
    let mut reader = BufReader::new(std::io::Cursor::new(first).chain(counted));
    let imported = files::import(&sub, data, &mut reader, &name, &mut |so_far| {
        progress.set_message(format!(
            "{} imported, {} present, {} different",
            so_far.imported,
            so_far.present,
            so_far.different.len()
        ));
    });
    progress.finish_and_clear();
    let closed = sub
        .close()
        .with_context(|| format!("closing the data directory {}", data.display()));
    let report = match (imported, closed) {
        (Ok(report), Ok(())) => report,
        (Err(e), Ok(())) => return Err(e),
        (Ok(_), Err(closing)) => return Err(closing),
        (Err(e), Err(closing)) => return Err(e.context(format!("{closing:#}"))),
    };
    super::say(format_args!(
        "{} lines imported, {} already present and skipped, {} present but different, into {}",
        report.imported,
        report.present,
        report.different.len(),
        data.display()
    ));
    match report.problems(&name) {
        Some(problems) => anyhow::bail!("{problems}"),
        None => Ok(()),
    }
}

pub(super) fn reindex(args: ReindexArgs) -> anyhow::Result<()> {
    let data = &args.store.dir.data;
    require_store(data)?;
    refuse_if_in_use(data)?;
    let embedder = embedder_for(
        &load_config(args.store.config.as_deref())?.embedder,
        data,
        Choice::Best,
    )?
    .0;
    let opts = SubstrateOptions {
        backend: args.backend.unwrap_or_else(|| backend_of(data)),
        embedder: Arc::clone(&embedder),
        ..SubstrateOptions::default()
    };
    let rt = tokio::runtime::Runtime::new()?;
    let started = std::time::Instant::now();
    let progress = bar(None, "reindex");
    let sub = rt.block_on(Substrate::reindex(data, opts, |done, total| {
        if progress.length() != Some(total) {
            progress.set_length(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{wide_bar}] {pos}/{len} re-embedded {msg} ({eta} left)",
            ) {
                progress.set_style(style.progress_chars("=> "));
            }
        }
        progress.set_position(done);
        if done == total {
            // Rebuilding the indexes from the store follows; say so while it runs.
            progress.set_message("rebuilding the indexes");
        }
    }));
    progress.finish_and_clear();
    let sub = sub?;
    let n = sub.store().len();
    sub.close()?;
    // A summary, not data: stderr, as for export and import.
    super::say(format_args!(
        "reindexed {n} records in {} with `{}` ({} dimensions) in {:.1} s",
        data.display(),
        embedder.name(),
        embedder.dimensions(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

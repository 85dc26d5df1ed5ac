//! The whole-directory commands: `export` (every record as JSON lines), `import` (those
//! lines into a data directory) and `reindex` (re-embed and rebuild the indexes), each
//! with a progress bar on stderr that stays hidden when stderr is not a terminal.
//!
//! The line format and the rules for writing records back with their own ids live in
//! `shadowbrain_runtime::transfer`; this module reads and writes files, counts, and turns
//! a bad line into an error that names it. An import commits in batches, so a bad line
//! stops it with every line before it durable, and running it again skips what is there.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shadowbrain_runtime::embed::build_embedder;
use shadowbrain_runtime::kv::Backend;
use shadowbrain_runtime::store::{Store, StoreOptions};
use shadowbrain_runtime::substrate::{IndexingOptions, Substrate, SubstrateOptions};
use shadowbrain_runtime::transfer::{self, Importer, Outcome};

use super::{
    DataDir, StoreArgs, backend_of, embedder_config, load_config, out, refuse_if_in_use,
    require_store,
};

/// `shadowbrain export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    dir: DataDir,
    /// Where to write the lines; `-` (the default) is stdout.
    #[arg(long, short, default_value = "-")]
    output: PathBuf,
    /// Only this namespace's records (default: every namespace).
    #[arg(long)]
    namespace: Option<String>,
}

/// `shadowbrain import`.
#[derive(Debug, Args)]
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

/// A bar over `total` units on stderr; indicatif hides it when stderr is not a terminal,
/// so logs and pipes get no control characters.
fn bar(total: Option<u64>, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
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

pub(super) fn export(args: ExportArgs) -> anyhow::Result<()> {
    let data = &args.dir.data;
    require_store(data)?;
    refuse_if_in_use(data)?;
    if let Some(ns) = &args.namespace {
        shadowbrain_runtime::model::validate_id("namespace", ns)?;
    }
    // The store alone: exporting needs no embedder and no index, so it works with any
    // config and whatever state the indexes are in.
    let store = Store::open(
        &data.join("store"),
        StoreOptions {
            backend: backend_of(data),
        },
    )
    .with_context(|| format!("opening the data directory {}", data.display()))?;
    let ids = transfer::export_ids(&store, args.namespace.as_deref())?;
    let to_stdout = args.output.as_os_str() == "-";
    // A file is written beside its final name and renamed at the end, so a failed export
    // never leaves a file that looks complete.
    let partial = partial_path(&args.output);
    let sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(File::create(&partial).with_context(|| format!("creating {}", partial.display()))?)
    };
    let mut sink = BufWriter::new(sink);
    let progress = bar(Some(ids.len() as u64), "export");
    let mut written = 0u64;
    let result = (|| -> anyhow::Result<()> {
        for id in &ids {
            if let Some(line) = transfer::export_record(&store, *id)? {
                serde_json::to_writer(&mut sink, &line)?;
                sink.write_all(b"\n")?;
                written += 1;
            }
            progress.inc(1);
        }
        sink.flush()?;
        Ok(())
    })();
    progress.finish_and_clear();
    drop(sink);
    if let Err(e) = result {
        if !to_stdout {
            let _ = std::fs::remove_file(&partial);
        }
        return Err(e.context(format!("writing {}", args.output.display())));
    }
    if !to_stdout {
        std::fs::rename(&partial, &args.output)
            .with_context(|| format!("moving {} into place", partial.display()))?;
    }
    super::say(format_args!(
        "exported {written} records from {} to {}",
        data.display(),
        if to_stdout {
            "stdout".into()
        } else {
            args.output.display().to_string()
        }
    ));
    Ok(())
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
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
    let embedder = build_embedder(&embedder_config(&load_config(
        args.store.config.as_deref(),
    )?)?)?;
    let sub = Substrate::open(
        data,
        SubstrateOptions {
            backend: backend_of(data),
            embedder,
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
    let mut reader = BufReader::new(Counting {
        inner: input,
        bar: progress.clone(),
    });
    let mut importer = Importer::new(&sub);
    let (mut imported, mut skipped) = (0u64, 0u64);
    let mut line = String::new();
    let mut number = 0u64;
    let failure = loop {
        line.clear();
        number += 1;
        match reader.read_line(&mut line) {
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) => {
                break Some(anyhow::anyhow!(
                    "line {number} of {name} cannot be read ({e}); an export is UTF-8 text, \
                     one JSON object per line"
                ));
            }
        }
        if line.trim().is_empty() {
            continue;
        }
        match transfer::parse_line(&line).and_then(|l| importer.add(l)) {
            Ok(Outcome::Imported) => imported += 1,
            Ok(Outcome::AlreadyPresent) => skipped += 1,
            Err(e) => break Some(anyhow::anyhow!("line {number} of {name}: {e}")),
        }
        progress.set_message(format!("{imported} imported, {skipped} skipped"));
    };
    progress.finish_and_clear();
    // Whatever happened, what was added before is committed and indexed: a bad line never
    // costs the lines before it.
    let flushed = importer
        .flush()
        .and_then(|()| sub.close())
        .with_context(|| format!("writing the imported records into {}", data.display()));
    if let Some(e) = failure {
        flushed?;
        // The line comes first: it is what the user has to fix.
        anyhow::bail!(
            "{e}\n  import stopped there; the {imported} records before it are imported \
             ({skipped} already present were skipped) into {}. Fix or remove the line and run \
             the same import again: records already imported are skipped",
            data.display()
        );
    }
    flushed?;
    out(&format!(
        "{imported} records imported, {skipped} already present and skipped, into {}",
        data.display()
    ))
}

pub(super) fn reindex(args: ReindexArgs) -> anyhow::Result<()> {
    let data = &args.store.dir.data;
    require_store(data)?;
    refuse_if_in_use(data)?;
    let embedder = build_embedder(&embedder_config(&load_config(
        args.store.config.as_deref(),
    )?)?)?;
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
    out(&format!(
        "reindexed {n} records in {} with `{}` ({} dimensions) in {:.1} s",
        data.display(),
        embedder.name(),
        embedder.dimensions(),
        started.elapsed().as_secs_f64()
    ))
}

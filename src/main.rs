//! The `shadowbrain` binary: thin edges over the library. It carries `serve` (the HTTP
//! server of [`shadowbrain::http`]), `mcp` (the MCP server over stdio of
//! [`shadowbrain::mcp`]), the one-shot commands over a data directory
//! (`record`, `recall`, `timeline`, `inspect`, `policy check`, `export`, `import`,
//! `reindex`), the policy lab (`simulate`), the evaluations (`eval locomo`, `eval beam`)
//! and `cluster init`; see `cli`. `main` only parses, runs and maps the error chain to an exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser;

// mimalloc instead of glibc's malloc: the actor runtime allocates many small, short-lived
// buffers from many threads, where glibc's per-thread arenas spend a tenth of ingest's CPU
// growing and consolidating arenas (perf on `examples/sessions_scale.rs` shows it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // SAFETY: first thing in main: no other thread has started.
    unsafe { shadowbrain_runtime::embed::settle_model_threads() };
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shadowbrain: {e}");
            // Errors keep their sources, and many already quote their source's text: print
            // a cause only when it says something the lines above did not.
            let mut said = e.to_string();
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !said.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                    said.push_str(&cause);
                }
            }
            ExitCode::from(1)
        }
    }
}

//! The Python package (`python/`) as a Python developer meets it: built with maturin into
//! the throwaway virtualenv of `scripts/install-python-tools` (`maturin develop`, the
//! package's native module on this checkout's code), then its own tests run with pytest
//! (`python/tests`: every method embedded and against this package's `serve` binary,
//! errors, threads, asyncio, and the LangGraph and Agents SDK adapters against the real
//! frameworks), its examples, and mypy over the package, its examples and its tests. CI sets
//! `SHADOWBRAIN_REQUIRE_PYTHON_PACKAGE=1`, so there a missing virtualenv fails instead of
//! skipping.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The virtualenv's interpreter, when `scripts/install-python-tools` made it.
fn venv() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-venv");
    if venv.join("bin/python").is_file() {
        return Some(venv);
    }
    assert!(
        std::env::var_os("SHADOWBRAIN_REQUIRE_PYTHON_PACKAGE").is_none(),
        "SHADOWBRAIN_REQUIRE_PYTHON_PACKAGE is set but {} is missing: run \
         scripts/install-python-tools",
        venv.display()
    );
    eprintln!(
        "skipped: the Python package's tools are not installed (scripts/install-python-tools)"
    );
    None
}

/// Runs `command`, failing the test with everything it printed when it fails.
fn run(what: &str, command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_python_package_builds_and_passes_its_tests() {
    let Some(venv) = venv() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("python");
    run(
        "maturin develop",
        Command::new(venv.join("bin/maturin"))
            .args(["develop", "--quiet", "--manifest-path"])
            .arg(python.join("Cargo.toml"))
            .env("VIRTUAL_ENV", &venv)
            .env_remove("CONDA_PREFIX"),
    );
    run(
        "pytest python/tests",
        Command::new(venv.join("bin/python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(python.join("tests"))
            .current_dir(&python)
            .env("SHADOWBRAIN_BIN", env!("CARGO_BIN_EXE_shadowbrain")),
    );
    // The adapters' examples as a reader runs them: the default configuration (the local
    // model when installed), a data directory of their own.
    for example in ["agents_session.py", "langgraph_store.py"] {
        let data = tempfile::tempdir().unwrap();
        run(
            &format!("python examples/{example}"),
            Command::new(venv.join("bin/python"))
                .arg(python.join("examples").join(example))
                .arg(data.path().join("data"))
                .current_dir(&python)
                .env_remove("OPENAI_API_KEY"),
        );
    }
    run(
        "mypy --strict (the package, its examples and tests)",
        Command::new(venv.join("bin/python"))
            .args(["-m", "mypy", "--strict", "--no-incremental"])
            .args(["shadowbrain", "examples", "tests"])
            .current_dir(&python),
    );
}

//! The Python of `scripts/install-mcp-sdk`'s virtualenv (the MCP SDK, and `requests` for
//! plain HTTP clients), and the SDK's client (tests/python/mcp_client.py), run against the
//! stdio server, a single `serve` or a cluster node alike.

use std::process::{Command, Stdio};

use serde_json::Value;

/// The interpreter of the virtualenv `scripts/install-mcp-sdk` makes, if it is there. CI
/// sets `SHADOWBRAIN_REQUIRE_PYTHON_MCP=1`, so there a missing SDK fails the test instead
/// of skipping it.
pub(crate) fn python_sdk() -> Option<std::path::PathBuf> {
    let python =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcp-venv/bin/python");
    if python.is_file() {
        return Some(python);
    }
    assert!(
        std::env::var_os("SHADOWBRAIN_REQUIRE_PYTHON_MCP").is_none(),
        "SHADOWBRAIN_REQUIRE_PYTHON_MCP is set but {} is missing: run scripts/install-mcp-sdk",
        python.display()
    );
    eprintln!("skipped: the Python MCP SDK is not installed (scripts/install-mcp-sdk)");
    None
}

/// Runs tests/python/mcp_client.py with `args`: one JSON object per connection mode.
pub(crate) fn python_client(python: &std::path::Path, args: &[&str]) -> Vec<Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_client.py");
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("WARNING") && !stderr.contains("failed"),
        "the Python SDK complained:\n{stderr}"
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

//! What the tests write into config files: the hashes `[[auth.keys]]` holds, and the
//! `[embedder]` of a scripted remote endpoint.

use std::path::{Path, PathBuf};

use shadowbrain_test_support::Endpoint;

/// The hex SHA-256 of a key, as the config file's `[[auth.keys]]` holds it.
pub(crate) fn sha256_hex(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A config file for the remote embedder at `endpoint`.
pub(crate) fn remote_config(dir: &Path, endpoint: &Endpoint) -> PathBuf {
    let path = dir.join("remote.toml");
    std::fs::write(
        &path,
        format!(
            "[embedder]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"concepts\"\n\
             dimensions = 16\nbatch_size = 8\nmax_concurrency = 2\nmax_retries = 1\n\
             timeout = \"5s\"\n",
            endpoint.base_url()
        ),
    )
    .unwrap();
    path
}

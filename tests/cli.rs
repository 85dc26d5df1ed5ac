//! The binary, run as a user would: `shadowbrain reindex` after an embedder change.

use std::process::Command;
use std::sync::Arc;

use shadowbrain_runtime::embed::hash::HashEmbedder;
use shadowbrain_runtime::model::NewMemory;
use shadowbrain_runtime::retrieval::Scope;
use shadowbrain_runtime::substrate::{RecallRequest, Substrate, SubstrateOptions};

#[tokio::test]
async fn reindex_moves_a_store_to_another_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sub = Substrate::open(&data, SubstrateOptions::default()).unwrap();
    let id = sub
        .record(
            "default",
            "s",
            vec![NewMemory::new(
                "observation",
                "the nightly backup job timed out",
            )],
        )
        .await
        .unwrap()[0];
    sub.close().unwrap();
    drop(sub);

    let small = || SubstrateOptions {
        embedder: Arc::new(HashEmbedder::new(128).unwrap()),
        ..SubstrateOptions::default()
    };
    let err = Substrate::open(&data, small()).unwrap_err().to_string();
    assert!(err.contains("shadowbrain reindex"), "{err}");

    let config = dir.path().join("shadowbrain.toml");
    std::fs::write(&config, "[embedder]\nkind = \"hash\"\ndimensions = 128\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["reindex", "--data"])
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("reindexed 1 records") && stdout.contains("128 dimensions"),
        "{stdout}"
    );

    let sub = Substrate::open(&data, small()).unwrap();
    let mut req = RecallRequest::new("default", "elsewhere", "backup job timed out");
    req.scope = Scope::Namespace;
    let res = sub.recall(&req).await.unwrap();
    assert_eq!(res.memories.first().map(|m| m.record.id), Some(id));
    assert_eq!(
        sub.store()
            .get(id)
            .unwrap()
            .unwrap()
            .embedding
            .unwrap()
            .len(),
        128
    );
    sub.close().unwrap();
}

#[test]
fn reindex_of_a_missing_directory_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["reindex", "--backend", "nope", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("use `lmdb` or `sled`"), "{stderr}");
}

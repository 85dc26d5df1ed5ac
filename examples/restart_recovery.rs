//! Nothing acknowledged is lost across a restart, and the derived indexes heal themselves.
//!
//! Records a session, shuts the runtime down, deletes both index directories (as if a
//! disk had lost them), and opens again: the store is the system of record, so the vector
//! and keyword indexes are rebuilt from it and recall finds everything. (The kill -9 crash
//! test in `runtime/tests/it/crash.rs` covers abrupt stops.) Runs offline.
//!
//! ```text
//! cargo run --example restart_recovery
//! ```

use shadowbrain::NewMemory;
use shadowbrain::{Runtime, RuntimeConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let rt = Runtime::open(RuntimeConfig::new(dir.path())).await?;
    let s = rt.session("default", "long-running")?;
    let mut ids = Vec::new();
    for i in 0..50 {
        let text = if i == 17 {
            "the staging database password rotates every 30 days".to_string()
        } else {
            format!("routine step {i} of the migration done")
        };
        ids.push(s.record(NewMemory::new("observation", text)).await?);
    }
    println!("recorded {} events; shutting down", ids.len());
    rt.shutdown().await?;
    // Every handle (the runtime's clones and the session handles) holds the store open.
    drop((s, rt));

    for derived in ["vectors", "keywords"] {
        std::fs::remove_dir_all(dir.path().join(derived))?;
        println!("deleted {derived}/");
    }

    let rt = Runtime::open(RuntimeConfig::new(dir.path())).await?;
    let s = rt.session("default", "long-running")?;
    let timeline = s.timeline(100).await?;
    let kept = ids
        .iter()
        .filter(|id| timeline.iter().any(|r| r.id == **id))
        .count();
    println!(
        "reopened: the timeline holds {} records ({kept} of the {} events, and what the policy's condensation trigger wrote at the 50th)",
        timeline.len(),
        ids.len()
    );
    if kept != ids.len() {
        return Err("records were lost".into());
    }
    let res = s.recall("when does the staging password rotate?").await?;
    let top = res.memories.first().ok_or("recall found nothing")?;
    println!(
        "recall after the rebuild: {} {}",
        top.record.id, top.record.text
    );
    if top.record.id != ids[17] {
        return Err("the rebuilt indexes did not find the password note first".into());
    }
    rt.shutdown().await?;
    Ok(())
}

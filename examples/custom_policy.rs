//! Memory policies are data: the same events under two policies, and what a broken policy
//! file says.
//!
//! A custom policy rates failed observations 9 and weighs importance more in recall; the
//! shipped `policies/generative-agents.toml` ranks by recency, importance and relevance as
//! in Park et al. (2023). Every result says which policy ranked it (name and content hash)
//! and why (the score breakdown). Runs offline in temporary directories.
//!
//! ```text
//! cargo run --example custom_policy
//! ```

use std::path::Path;

use shadowbrain::NewMemory;
use shadowbrain::policy::Policy;
use shadowbrain::{Runtime, RuntimeConfig};

const CUSTOM: &str = r#"
name = "failures-first"

[scoring]
importance = 1.5
recency = 0.2

[evaluation]
default_importance = 2
[[evaluation.rules]]
kinds = ["observation"]
matches = "(?i)fail|error|timeout"
importance = 9
"#;

async fn run(policy: Policy) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = RuntimeConfig::new(dir.path());
    config.substrate.policy = policy;
    let rt = Runtime::open(config).await?;
    let s = rt.session("default", "ops")?;
    s.record_batch(vec![
        NewMemory::new("observation", "nightly backup finished in 12 minutes"),
        NewMemory::new(
            "observation",
            "the nightly backup to the eu bucket failed with a timeout",
        ),
        NewMemory::new("observation", "backup dashboard colours changed"),
    ])
    .await?;
    let res = s.recall("nightly backup").await?;
    println!("policy {} ({})", res.policy.name, res.policy.hash);
    for m in &res.memories {
        println!(
            "  {:.3} = relevance {:.2} recency {:.2} importance {:.2} utility {:.2}  [importance {}] {}",
            m.score,
            m.why.relevance,
            m.why.recency,
            m.why.importance,
            m.why.utility,
            m.record.importance,
            m.record.text
        );
    }
    rt.shutdown().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(Policy::from_toml("custom.toml", CUSTOM)?).await?;
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/generative-agents.toml");
    run(Policy::load(&shipped)?).await?;

    // A broken file: every error at once, each with the file and the key.
    let broken =
        "[scoring]\nrecency = -1\nhalf_life = \"soon\"\n[forgetting]\nhalf_life = \"fortnight\"\n";
    match Policy::from_toml("broken.toml", broken) {
        Ok(_) => return Err("a broken policy was accepted".into()),
        Err(errors) => println!("\nbroken.toml is refused:\n{errors}"),
    }
    Ok(())
}

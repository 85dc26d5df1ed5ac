//! The embedded quick start: opens `./shadowbrain-data` with the defaults (LMDB, the
//! in-process hash embedder, the default policy), records a short agent episode, asks what
//! to remember, and prints the ranked memories with their score breakdown and the context
//! block. Runs offline, no keys. Run it twice: the second run remembers the first.

use shadowbrain::{NewMemory, RecallRequest, Substrate, SubstrateOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::var("SHADOWBRAIN_DATA").unwrap_or_else(|_| "./shadowbrain-data".into());
    let sub = Substrate::open(dir.as_ref(), SubstrateOptions::default())?;
    let ids = sub
        .record(
            "default",
            "quickstart",
            vec![
                NewMemory::new("goal", "Ship the billing migration by Friday"),
                NewMemory::new("action", "Ran the migration dry-run against staging"),
                NewMemory::new(
                    "observation",
                    "Dry-run failed: the billing queue consumer exception says TLS handshake error",
                ),
                NewMemory::new(
                    "thought",
                    "The staging load balancer certificate probably expired",
                ),
                NewMemory::new(
                    "user_message",
                    "Please keep the old queue running until the migration is verified",
                ),
            ],
        )
        .await?;
    println!(
        "recorded {} events durably: {} .. {}",
        ids.len(),
        ids[0],
        ids[ids.len() - 1]
    );
    let mut req = RecallRequest::new("default", "quickstart", "why did the billing dry-run fail?");
    req.k = 3;
    let res = sub.recall(&req).await?;
    println!("\npolicy {} ({})", res.policy.name, res.policy.hash);
    for m in &res.memories {
        println!(
            "{}  score {:.3}  (relevance {:.3}, recency {:.3}, importance {:.3}, utility {:.3})  {}",
            m.record.id,
            m.score,
            m.why.relevance,
            m.why.recency,
            m.why.importance,
            m.why.utility,
            m.record.text
        );
    }
    println!("\n{}", res.context);
    sub.close()?;
    Ok(())
}

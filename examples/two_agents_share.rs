//! Agent A's proven lesson reaches agent B through the namespace knowledge pool.
//!
//! Agent A works through a payment-gateway problem, its session is condensed, it recalls
//! the lesson, uses it, and reports success; the promotion policy admits the lesson into
//! the knowledge pool. Agent B, in a fresh session that never saw any of it, asks how to
//! handle the gateway and gets the lesson back. Runs offline in a temporary directory.
//!
//! ```text
//! cargo run --example two_agents_share
//! ```

use std::time::{Duration, Instant};

use shadowbrain::{FeedbackTarget, NewMemory, Outcome, Tier};
use shadowbrain::{Runtime, RuntimeConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let rt = Runtime::open(RuntimeConfig::new(dir.path())).await?;

    let a = rt.session("acme", "agent-a")?;
    let lesson = |text: &str| NewMemory {
        importance: Some(8.0),
        ..NewMemory::new("observation", text)
    };
    a.record_batch(vec![
        NewMemory::new(
            "goal",
            "make card payments succeed during the bank's peak hours",
        ),
        lesson("payment gateway calls time out at peak; the bank throttles bursts"),
        lesson("retrying payment gateway calls immediately makes the throttling worse"),
        lesson("retrying payment gateway calls with exponential backoff and jitter succeeds"),
        lesson("payment gateway error rate fell to 0.2% with backoff and jitter"),
        NewMemory::new("observation", "lunch menu posted in the team channel"),
    ])
    .await?;
    let condensed = a
        .condense()
        .await?
        .ok_or("agent A's session had nothing to condense")?;
    println!(
        "agent A's session condensed into {}:\n  {}\n",
        condensed.id, condensed.text
    );

    // A uses what it remembers, and it works.
    let recalled = a
        .recall("how do I get payment gateway calls through at peak?")
        .await?;
    let recall_id = recalled
        .recall_id
        .clone()
        .ok_or("recall gave no recall_id")?;
    let report = a
        .feedback(FeedbackTarget::Recall(recall_id), Outcome::Success)
        .await?;
    println!(
        "agent A reported success on {} memories; promotable now: {:?}",
        report.updated, report.promotable
    );

    // The knowledge graph promotes in the background; wait for it (a few milliseconds).
    let knowledge = rt.knowledge("acme")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while knowledge
        .search("payment gateway", 1)
        .await?
        .memories
        .is_empty()
    {
        if Instant::now() > deadline {
            return Err("the lesson was not promoted into the knowledge pool".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // B has never seen any of this.
    let b = rt.session("acme", "agent-b")?;
    let answer = b
        .recall("the payment gateway keeps timing out, what should I do?")
        .await?;
    let top = answer.memories.first().ok_or("agent B recalled nothing")?;
    println!(
        "\nagent B asks and gets, first, a {:?} memory (score {:.3}):\n  {}",
        top.record.tier, top.score, top.record.text
    );
    if top.record.tier != Tier::Knowledge {
        return Err("agent B's best memory should be the shared lesson".into());
    }
    println!("\ncontext for agent B's prompt:\n{}", answer.context);

    // Another organisation's agents never see it.
    let outsider = rt.session("globex", "agent-z")?;
    let theirs = outsider.recall("payment gateway timing out").await?;
    assert!(
        theirs.memories.is_empty(),
        "namespaces never share knowledge"
    );
    rt.shutdown().await?;
    Ok(())
}

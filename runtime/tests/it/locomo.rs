//! Regression guard for retrieval quality: LoCoMo's first conversation through the real
//! recall path with the defaults (hash embedder + BM25, default policy). The bounds sit a
//! little under the measured figures (R@5 0.49, R@10 0.60 on this conversation at the time of
//! writing), so a change that hurts retrieval fails here before it reaches a benchmark run.

use std::path::PathBuf;

use shadowbrain_runtime::eval::locomo;
use shadowbrain_runtime::substrate::{Substrate, SubstrateOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_conversation_recall_stays_in_range() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/locomo/locomo10.json");
    assert!(
        path.exists(),
        "LoCoMo data missing at {} (it ships in ../shared/data)",
        path.display()
    );
    let convs = locomo::load(&path).unwrap();
    assert_eq!(convs.len(), 10);
    assert_eq!(convs.iter().map(|c| c.turns.len()).sum::<usize>(), 5882);
    let dir = tempfile::tempdir().unwrap();
    let sub = Substrate::open(dir.path(), SubstrateOptions::default()).unwrap();
    let report = locomo::run(&sub, &convs[..1], &[5, 10], |_, _| {})
        .await
        .unwrap();
    sub.close().unwrap();
    let f = &report.cats_1_4;
    eprintln!(
        "conv 0: {} questions, R@5 {:.3}, R@10 {:.3}",
        f.questions, f.recall[&5], f.recall[&10]
    );
    assert!(f.questions > 100, "{}", f.questions);
    assert!(
        f.recall[&10] >= 0.55 && f.recall[&10] <= 0.95,
        "R@10 {}",
        f.recall[&10]
    );
    assert!(
        f.recall[&5] >= 0.44 && f.recall[&5] <= f.recall[&10],
        "R@5 {}",
        f.recall[&5]
    );
    assert_eq!(
        report.ranked.len(),
        report
            .per_category
            .values()
            .map(|c| c.questions)
            .sum::<usize>()
    );
}

//! Writes with an idempotency key on a real store: a retry answers the first write's ids
//! and stores nothing, across a restart; a different request under the key is refused;
//! after the window the key is forgotten, and expired keys are removed from the store.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shadowbrain_runtime::{
    Clock, Error, IDEMPOTENCY_WINDOW, Idempotency, IndexingOptions, NewMemory, Substrate,
    SubstrateOptions, VirtualClock,
};

const T0: i64 = 1_780_000_000_000;

fn open(dir: &Path, clock: &Arc<VirtualClock>) -> Substrate {
    let opts = SubstrateOptions {
        clock: clock.clone(),
        indexing: IndexingOptions {
            background: false,
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    };
    Substrate::open(dir, opts).unwrap()
}

fn once(key: &str, fingerprint: &str) -> Idempotency {
    Idempotency {
        key: key.into(),
        fingerprint: fingerprint.into(),
    }
}

fn events(texts: &[&str]) -> Vec<NewMemory> {
    texts
        .iter()
        .map(|t| NewMemory::new("observation", *t))
        .collect()
}

/// One write of `texts` to `session` under `key`, carrying `digest`.
async fn keyed(
    sub: &Substrate,
    session: &str,
    texts: &[&str],
    key: &str,
    digest: &str,
) -> shadowbrain_runtime::Result<shadowbrain_runtime::Recorded> {
    sub.record_once("default", session, events(texts), Some(&once(key, digest)))
        .await
}

async fn stored(sub: &Substrate, session: &str) -> usize {
    sub.store()
        .session_ids("default", session, None, 1000)
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_retry_answers_the_first_ids_and_stores_nothing_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let sub = open(dir.path(), &clock);
    let batch = [
        "the deploy runner moved to eu-2",
        "the backup now runs at 03:00",
    ];
    let first = keyed(&sub, "s1", &batch, "k-1", "digest-a").await.unwrap();
    assert!(!first.replayed);
    assert_eq!(first.ids.len(), 2);
    let again = keyed(&sub, "s1", &batch, "k-1", "digest-a").await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.ids, first.ids);
    assert_eq!(stored(&sub, "s1").await, 2);

    // Another request under the same key: refused, naming the key, nothing stored.
    for (session, digest) in [("s1", "digest-b"), ("s2", "digest-a")] {
        let err = keyed(&sub, session, &["other"], "k-1", digest)
            .await
            .unwrap_err();
        let Error::Invalid { field, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(field, "idempotency_key");
        assert!(err.to_string().contains("`k-1`"), "{err}");
    }
    assert_eq!(stored(&sub, "s1").await, 2);
    assert_eq!(stored(&sub, "s2").await, 0);
    // Keys are per namespace: another tenant's identical key is its own.
    let theirs = sub
        .record_once(
            "other-ns",
            "s1",
            events(&batch),
            Some(&once("k-1", "digest-a")),
        )
        .await
        .unwrap();
    assert!(!theirs.replayed);
    // A bad key is refused before anything is written.
    for bad in ["", "has space", &"k".repeat(256)] {
        let err = keyed(&sub, "s1", &["x"], bad, "d").await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid { field, .. } if field == "idempotency_key"),
            "{err:?}"
        );
    }
    sub.close().unwrap();
    drop(sub);

    // The key was committed with the events: a retry after a restart still replays.
    let sub = open(dir.path(), &clock);
    let after = keyed(&sub, "s1", &batch, "k-1", "digest-a").await.unwrap();
    assert!(after.replayed);
    assert_eq!(after.ids, first.ids);
    assert_eq!(stored(&sub, "s1").await, 2);
    sub.close().unwrap();
}

#[tokio::test]
async fn keys_are_forgotten_after_the_window_and_removed_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(VirtualClock::new(T0));
    let sub = open(dir.path(), &clock);
    let first = keyed(&sub, "s1", &["one"], "old", "d1").await.unwrap();
    let window = Duration::from_millis(IDEMPOTENCY_WINDOW as u64);
    clock.advance(window - Duration::from_secs(60));
    // Still inside the window.
    let inside = keyed(&sub, "s1", &["one"], "old", "d1").await.unwrap();
    assert!(inside.replayed);
    clock.advance(Duration::from_secs(120));
    assert!(clock.now() - T0 > IDEMPOTENCY_WINDOW);
    // Past it, another key's write expires `old`; `old`'s entry is gone from the store.
    keyed(&sub, "s1", &["two"], "new", "d2").await.unwrap();
    assert_eq!(sub.store().idempotent("default", "old").unwrap(), None);
    assert!(sub.store().idempotent("default", "new").unwrap().is_some());
    // And the expired key makes a new write again.
    let reused = keyed(&sub, "s1", &["one"], "old", "d1").await.unwrap();
    assert!(!reused.replayed);
    assert_ne!(reused.ids, first.ids);
    assert_eq!(stored(&sub, "s1").await, 3);
    sub.close().unwrap();
}

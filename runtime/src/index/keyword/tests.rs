//! Tests of the keyword index against a real tantivy index in a temporary directory. Every
//! query word appears verbatim in the documents it must find, so the tests hold whatever the
//! shared analyzer does (stemming, stop words, CJK bigrams).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use roaring::RoaringBitmap;
use tempfile::TempDir;

use super::KeywordIndex;
use crate::index::text::analyze;

fn open() -> (TempDir, KeywordIndex) {
    let dir = TempDir::new().expect("temp dir");
    let index = KeywordIndex::open(&dir.path().join("keyword")).expect("open keyword index");
    (dir, index)
}

fn docs(items: &[(u32, &str)]) -> Vec<(u32, String)> {
    items.iter().map(|(id, t)| (*id, t.to_string())).collect()
}

fn ids(hits: &[(u32, f32)]) -> Vec<u32> {
    hits.iter().map(|(id, _)| *id).collect()
}

fn corpus() -> Vec<(u32, String)> {
    docs(&[
        (
            1,
            "the deploy pipeline failed with a timeout on the database migration",
        ),
        (2, "user asked about the weather in Paris tomorrow"),
        (
            3,
            "database migration finished, the database is healthy again",
        ),
        (4, "agent wrote a poem about autumn leaves"),
        (5, "remember to rotate the database credentials every month"),
    ])
}

#[test]
fn bm25_ranks_the_relevant_doc_first() {
    let (_dir, index) = open();
    index.upsert(&corpus());
    index.commit(5).unwrap();

    let hits = index.search("database migration", 10, None).unwrap();
    assert_eq!(
        ids(&hits)[..2],
        [3, 1],
        "both words, `database` twice, wins: {hits:?}"
    );
    assert_eq!(ids(&hits)[2], 5, "one word only ranks last: {hits:?}");
    assert_eq!(
        hits.len(),
        3,
        "docs without either word are not results: {hits:?}"
    );
    assert!(
        hits.windows(2).all(|w| w[0].1 >= w[1].1),
        "best first: {hits:?}"
    );
    assert!(hits.iter().all(|(_, s)| s.is_finite() && *s > 0.0));

    assert_eq!(ids(&index.search("poem", 10, None).unwrap()), [4]);
    assert!(
        index
            .search("nonexistentword", 10, None)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        index.search("database", 1, None).unwrap().len(),
        1,
        "k is honoured"
    );
}

#[test]
fn staged_writes_are_searchable_before_commit() {
    let (_dir, index) = open();
    index.upsert(&corpus());
    assert_eq!(index.pending(), 5);
    assert_eq!(index.len().unwrap(), 5);

    let hits = index.search("database migration", 10, None).unwrap();
    assert_eq!(ids(&hits), [3, 1, 5], "the tail alone ranks like the index");

    index.commit(1).unwrap();
    assert_eq!(index.pending(), 0);
    let committed = index.search("database migration", 10, None).unwrap();
    assert_eq!(ids(&committed), [3, 1, 5]);
    for ((_, staged), (_, committed)) in hits.iter().zip(&committed) {
        assert!(
            (staged - committed).abs() < 1e-4,
            "a staged doc scores as it will once committed: {hits:?} vs {committed:?}"
        );
    }
}

#[test]
fn staged_and_committed_docs_rank_together() {
    let (_dir, index) = open();
    let text = "kubernetes pod restarted after an out of memory kill";
    index.upsert(&docs(&[
        (10, text),
        (11, "kubernetes dashboard colour theme"),
        (12, "lunch menu for friday"),
    ]));
    index.commit(3).unwrap();
    // Same text as a committed doc, a better staged one, and a weaker staged one.
    index.upsert(&docs(&[
        (20, text),
        (21, "kubernetes pod memory kill"),
        (22, "kubernetes"),
    ]));

    let hits = index
        .search("kubernetes pod memory kill", 10, None)
        .unwrap();
    let order = ids(&hits);
    assert_eq!(order.len(), 5, "{hits:?}");
    assert_eq!(
        order[0], 21,
        "the best staged doc beats every committed one: {hits:?}"
    );
    let score = |id: u32| hits.iter().find(|(h, _)| *h == id).unwrap().1;
    assert!(
        (score(10) - score(20)).abs() < 1e-4,
        "identical text scores the same staged or committed: {hits:?}"
    );
    assert!(score(20) > score(11), "{hits:?}");
    assert!(!order.contains(&12));
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[test]
fn removal_hides_at_once_after_commit_and_after_reopen() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("kw");
    {
        let index = KeywordIndex::open(&path).unwrap();
        index.upsert(&corpus());
        index.commit(5).unwrap();
        index.remove(&[3, 99]);
        let hits = index.search("database", 10, None).unwrap();
        assert_eq!(sorted(ids(&hits)), [1, 5], "hidden before commit: {hits:?}");
        assert_eq!(index.len().unwrap(), 4);
        index.commit(6).unwrap();
        let hits = index.search("database", 10, None).unwrap();
        assert_eq!(sorted(ids(&hits)), [1, 5], "gone after commit: {hits:?}");
        assert_eq!(index.len().unwrap(), 4);
        assert_eq!(index.pending(), 0);

        // A staged removal also hides a staged upsert of the same id.
        index.upsert(&docs(&[(7, "database replica lag")]));
        index.remove(&[7]);
        assert_eq!(
            sorted(ids(&index.search("database", 10, None).unwrap())),
            [1, 5]
        );
        index.commit(7).unwrap();
    }
    let index = KeywordIndex::open(&path).unwrap();
    let hits = index.search("database", 10, None).unwrap();
    assert_eq!(sorted(ids(&hits)), [1, 5], "gone after reopen: {hits:?}");
    assert_eq!(index.len().unwrap(), 4);
}

#[test]
fn upsert_replaces_the_previous_text() {
    let (_dir, index) = open();
    index.upsert(&docs(&[
        (1, "postgres connection refused"),
        (2, "postgres vacuum"),
    ]));
    index.commit(1).unwrap();

    index.upsert(&docs(&[(1, "redis eviction storm")]));
    assert_eq!(
        ids(&index.search("refused", 10, None).unwrap()),
        Vec::<u32>::new()
    );
    assert_eq!(ids(&index.search("postgres", 10, None).unwrap()), [2]);
    assert_eq!(ids(&index.search("redis", 10, None).unwrap()), [1]);
    assert_eq!(index.len().unwrap(), 2, "a replaced doc is counted once");

    index.commit(2).unwrap();
    assert_eq!(
        ids(&index.search("postgres refused", 10, None).unwrap()),
        [2]
    );
    assert_eq!(ids(&index.search("redis", 10, None).unwrap()), [1]);
    assert_eq!(index.len().unwrap(), 2);

    // Within one call the last version wins.
    index.upsert(&docs(&[(3, "first draft"), (3, "final version")]));
    assert!(index.search("draft", 10, None).unwrap().is_empty());
    assert_eq!(ids(&index.search("final", 10, None).unwrap()), [3]);
    index.commit(3).unwrap();
    assert!(index.search("draft", 10, None).unwrap().is_empty());
    assert_eq!(ids(&index.search("final", 10, None).unwrap()), [3]);
}

/// Fresh ids skip the delete; an id committed before a reopen (including the largest and
/// id 0) is still replaced, not duplicated.
#[test]
fn replacing_after_a_reopen_never_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    {
        let index = KeywordIndex::open(dir.path()).unwrap();
        index.upsert(&docs(&[(0, "alpha zero"), (5, "alpha five")]));
        index.commit(1).unwrap();
    }
    let index = KeywordIndex::open(dir.path()).unwrap();
    index.upsert(&docs(&[
        (0, "beta zero"),
        (5, "beta five"),
        (6, "alpha six"),
    ]));
    index.commit(2).unwrap();
    assert_eq!(sorted(ids(&index.search("alpha", 10, None).unwrap())), [6]);
    assert_eq!(
        sorted(ids(&index.search("beta", 10, None).unwrap())),
        [0, 5]
    );
    assert_eq!(index.len().unwrap(), 3);
    // And in the same process, after the commit that made 6 known.
    index.upsert(&docs(&[(6, "gamma six")]));
    index.commit(3).unwrap();
    assert!(index.search("alpha", 10, None).unwrap().is_empty());
    assert_eq!(index.len().unwrap(), 3);
}

#[test]
fn candidate_filter_never_leaks() {
    let (_dir, index) = open();
    // 3,000 docs outside the bitmap match far better than the few inside it.
    let mut all: Vec<(u32, String)> = (0..3_000u32)
        .map(|i| (i, format!("latency latency latency spike in service s{i}")))
        .collect();
    all.extend(docs(&[
        (
            5_000,
            "a long note that mentions latency once among many other words here",
        ),
        (5_001, "latency budget for the session"),
        (5_002, "nothing relevant in this one"),
    ]));
    index.upsert(&all);
    index.commit(1).unwrap();
    // ...and staged ones too, inside and outside.
    index.upsert(&docs(&[
        (5_003, "latency regression after the upgrade"),
        (6_000, "latency latency latency latency"),
    ]));

    let session: RoaringBitmap = [5_000u32, 5_001, 5_002, 5_003].into_iter().collect();
    let hits = index.search("latency", 3, Some(&session)).unwrap();
    assert_eq!(hits.len(), 3, "the session's own top-k is found: {hits:?}");
    assert!(hits.iter().all(|(id, _)| session.contains(*id)), "{hits:?}");
    assert_eq!(
        sorted(ids(&hits)),
        [5_000, 5_001, 5_003],
        "every matching candidate, committed or staged: {hits:?}"
    );

    let hits = index
        .search("latency", 10, Some(&RoaringBitmap::new()))
        .unwrap();
    assert!(hits.is_empty(), "an empty scope has no results");

    let unfiltered = index.search("latency", 3, None).unwrap();
    assert!(unfiltered.iter().all(|(id, _)| !session.contains(*id)));
    assert_eq!(unfiltered[0].0, 6_000, "{unfiltered:?}");
}

#[test]
fn watermark_persists_across_reopen_and_the_tail_does_not() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("kw");
    {
        let index = KeywordIndex::open(&path).unwrap();
        assert_eq!(index.watermark().unwrap(), 0, "a new index has watermark 0");
        index.upsert(&docs(&[(1, "committed text")]));
        index.commit(42).unwrap();
        assert_eq!(index.watermark().unwrap(), 42);
        // Staged after the last commit: lost with the process, replayed by the store.
        index.upsert(&docs(&[(2, "staged text")]));
    }
    let index = KeywordIndex::open(&path).unwrap();
    assert_eq!(index.watermark().unwrap(), 42);
    assert_eq!(ids(&index.search("committed", 10, None).unwrap()), [1]);
    assert!(index.search("staged", 10, None).unwrap().is_empty());
    assert_eq!(index.pending(), 0);

    // A commit with nothing staged still moves the watermark durably.
    index.commit(43).unwrap();
    drop(index);
    assert_eq!(KeywordIndex::open(&path).unwrap().watermark().unwrap(), 43);
}

#[test]
fn query_syntax_characters_are_plain_text() {
    let (_dir, index) = open();
    index.upsert(&docs(&[(1, "foo bar baz"), (2, "quux")]));
    for q in [
        r#""foo:bar (baz" AND"#,
        "foo:",
        "(((",
        "bar^2 OR -baz +[a TO z]",
        "\"*?~",
    ] {
        let hits = index
            .search(q, 10, None)
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        let expect_match = q.contains("foo") || q.contains("bar") || q.contains("baz");
        assert_eq!(
            ids(&hits),
            if expect_match { vec![1] } else { vec![] },
            "query {q:?}"
        );
    }
    index.commit(1).unwrap();
    let hits = index.search(r#""foo:bar (baz" AND"#, 10, None).unwrap();
    assert_eq!(ids(&hits), [1]);
}

#[test]
fn a_query_without_index_terms_has_no_results() {
    let (_dir, index) = open();
    index.upsert(&docs(&[(1, "the cat and the hat"), (2, "a dog is of it")]));
    index.commit(1).unwrap();
    for q in ["", "   ", "?! ... ---", "«»"] {
        assert!(index.search(q, 10, None).unwrap().is_empty(), "{q:?}");
    }
    // Whether these are stop words is the analyzer's call; the index must follow it.
    let stop_words = "the and a of is it";
    let hits = index.search(stop_words, 10, None).unwrap();
    assert_eq!(hits.is_empty(), analyze(stop_words).is_empty(), "{hits:?}");
}

#[test]
fn cjk_text_is_found_by_a_cjk_query() {
    let (_dir, index) = open();
    index.upsert(&docs(&[
        (1, "会议 记录：東京 オフィス の 移転"),
        (2, "会议 记录：大阪 支店"),
        (3, "我喜欢吃苹果"),
    ]));
    for round in ["staged", "committed"] {
        let hits = index.search("東京", 10, None).unwrap();
        assert_eq!(ids(&hits), [1], "{round}: {hits:?}");
        let hits = index.search("大阪", 10, None).unwrap();
        assert_eq!(ids(&hits), [2], "{round}: {hits:?}");

        // Unsegmented Chinese is found exactly when the analyzer splits it into terms the
        // query shares (CJK bigrams do; a whitespace tokenizer does not).
        let doc_terms = analyze("我喜欢吃苹果");
        let shared = analyze("苹果").iter().all(|t| doc_terms.contains(t));
        let hits = index.search("苹果", 10, None).unwrap();
        assert_eq!(ids(&hits), if shared { vec![3] } else { vec![] }, "{round}");
        index.commit(1).unwrap();
    }
}

#[test]
fn len_counts_committed_and_staged_docs_once() {
    let (_dir, index) = open();
    assert_eq!(index.len().unwrap(), 0);
    assert!(index.is_empty().unwrap());
    index.upsert(&docs(&[(1, "a1"), (2, "a2"), (3, "a3")]));
    index.commit(1).unwrap();
    index.upsert(&docs(&[(3, "b3"), (4, "b4")]));
    index.remove(&[1, 77]);
    assert_eq!(index.pending(), 4);
    assert_eq!(index.len().unwrap(), 3, "2, 3 (replaced) and 4");
    index.commit(2).unwrap();
    assert_eq!(index.len().unwrap(), 3);
    assert_eq!(index.pending(), 0);
}

#[test]
fn clear_empties_the_index_and_resets_the_watermark() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("kw");
    {
        let index = KeywordIndex::open(&path).unwrap();
        index.upsert(&corpus());
        index.commit(9).unwrap();
        index.upsert(&docs(&[(8, "database staged")]));
        index.clear().unwrap();
        assert_eq!(index.len().unwrap(), 0);
        assert_eq!(index.pending(), 0);
        assert_eq!(index.watermark().unwrap(), 0);
        assert!(index.search("database", 10, None).unwrap().is_empty());

        index.upsert(&docs(&[(1, "rebuilt database")]));
        index.commit(3).unwrap();
        assert_eq!(ids(&index.search("database", 10, None).unwrap()), [1]);
    }
    let index = KeywordIndex::open(&path).unwrap();
    assert_eq!(index.watermark().unwrap(), 3);
    assert_eq!(index.len().unwrap(), 1);
}

#[test]
fn odd_k_values_do_not_panic() {
    let (_dir, index) = open();
    index.upsert(&corpus());
    assert!(index.search("database", 0, None).unwrap().is_empty());
    assert_eq!(index.search("database", usize::MAX, None).unwrap().len(), 3);
    index.commit(1).unwrap();
    assert_eq!(index.search("database", usize::MAX, None).unwrap().len(), 3);
}

#[test]
fn a_second_open_of_the_same_directory_is_a_clear_error() {
    let (dir, _index) = open();
    let err = KeywordIndex::open(&dir.path().join("keyword")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("already open"), "{msg}");
}

#[test]
fn the_index_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KeywordIndex>();
}

/// Writes racing commits: every staged doc is visible exactly once at every moment, and
/// entries staged while a commit runs survive it.
#[test]
fn concurrent_upserts_and_commits_never_lose_or_duplicate_a_doc() {
    use std::sync::atomic::AtomicU64;
    let (_dir, index) = open();
    let index = Arc::new(index);
    let done = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let committer = {
        let (index, done, commits) = (index.clone(), done.clone(), commits.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let n = commits.fetch_add(1, Ordering::AcqRel) + 1;
                index.commit(n).unwrap();
            }
        })
    };
    let mut written = 0u32;
    // Keep writing until several commits have raced the writes (bounded, in case a commit
    // hangs: the assertion below then reports it).
    while (written < 400 || commits.load(Ordering::Acquire) < 5) && written < 20_000 {
        let i = written;
        let word = format!("uniq{i}");
        index.upsert(&[(i, format!("{word} shared"))]);
        let hits = index.search(&word, 10, None).unwrap();
        assert_eq!(ids(&hits), [i], "doc {i} just written");
        if i.is_multiple_of(97) {
            let hits = index.search("shared", 100_000, None).unwrap();
            assert_eq!(sorted(ids(&hits)), (0..=i).collect::<Vec<_>>(), "after {i}");
        }
        written += 1;
    }
    done.store(true, Ordering::Release);
    committer.join().unwrap();
    assert!(
        commits.load(Ordering::Acquire) >= 5,
        "commits raced the writes"
    );
    index.commit(u64::MAX).unwrap();
    assert_eq!(index.pending(), 0);
    assert_eq!(index.len().unwrap(), u64::from(written));
    let all = index.search("shared", 100_000, None).unwrap();
    assert_eq!(sorted(ids(&all)), (0..written).collect::<Vec<_>>());
}

/// Run with `cargo test -p shadowbrain-runtime --release keyword::tests::speed -- --ignored
/// --nocapture` to see commit and search times over 100k short docs.
#[test]
#[ignore = "timing, not correctness"]
fn speed() {
    use std::time::Instant;
    let (_dir, index) = open();
    let words = [
        "agent", "deploy", "database", "timeout", "memory", "user", "session", "error", "retry",
        "cache", "latency", "token", "vector", "search", "policy", "queue", "actor", "graph",
        "summary", "feedback", "budget", "network", "disk", "cpu", "shard", "replica", "lease",
        "schema", "index", "metric",
    ];
    let n = 100_000u32;
    // xorshift: a fixed, well-mixed word sequence.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next_word = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        words[(state % words.len() as u64) as usize]
    };
    let docs: Vec<(u32, String)> = (0..n)
        .map(|i| {
            let text: Vec<&str> = (0..25).map(|_| next_word()).collect();
            (i, format!("{} doc{i}", text.join(" ")))
        })
        .collect();
    let t = Instant::now();
    index.upsert(&docs);
    let staged = t.elapsed();
    let t = Instant::now();
    index.commit(u64::from(n)).unwrap();
    let committed = t.elapsed();
    let queries = [
        "database timeout",
        "agent memory retry",
        "doc777 latency",
        "shard",
    ];
    let rounds = 200;
    let t = Instant::now();
    for _ in 0..rounds {
        for q in queries {
            assert!(!index.search(q, 10, None).unwrap().is_empty());
        }
    }
    let per_query = t.elapsed() / (rounds * queries.len() as u32);
    let scope: RoaringBitmap = (0..n).step_by(1000).collect();
    let t = Instant::now();
    for _ in 0..rounds {
        assert!(
            !index
                .search("database", 10, Some(&scope))
                .unwrap()
                .is_empty()
        );
    }
    let scoped = t.elapsed() / rounds;
    println!(
        "upsert {n}: {staged:?}, commit: {committed:?}, search: {per_query:?}/query, \
         scoped: {scoped:?}/query"
    );
}

/// A long text of unrelated sentences with `detail` two thirds of the way in.
fn long_text(detail: &str) -> String {
    let filler: Vec<String> = (0..120)
        .map(|i| format!("Sentence {i} reports the rainfall in the valley and the price of bread."))
        .collect();
    format!(
        "{} {detail} {}",
        filler[..80].join(" "),
        filler[80..].join(" ")
    )
}

#[test]
fn a_long_record_is_one_document_per_passage_and_scores_as_its_best() {
    let detail = "The quokka escaped from the enclosure near the north gate.";
    let text = long_text(detail);
    let passages = crate::index::passage::split(&text);
    assert!(passages.len() > 10);
    let best = passages
        .iter()
        .find(|r| text[(*r).clone()].contains(detail))
        .expect("a passage holds the detail whole")
        .clone();
    let (_dir, index) = open();
    // The long record, and the passage that holds the detail as a record of its own: the
    // same document, so the same score, staged or committed.
    index.upsert(&[(101, text.clone()), (102, text[best].to_string())]);
    index.upsert(&corpus());
    let check = |when: &str| {
        let hits = index.search("quokka enclosure gate", 10, None).unwrap();
        assert_eq!(
            ids(&hits).len(),
            2,
            "{when}: the long record once: {hits:?}"
        );
        assert!(
            (hits[0].1 - hits[1].1).abs() < 1e-4,
            "{when}: scored as its best passage: {hits:?}"
        );
        let scoped: RoaringBitmap = [101u32, 102, 3].into_iter().collect();
        let hits = index
            .search("quokka enclosure gate", 10, Some(&scoped))
            .unwrap();
        assert_eq!(ids(&hits).len(), 2, "{when}, scoped: {hits:?}");
        assert!(
            (hits[0].1 - hits[1].1).abs() < 1e-4,
            "{when}, scoped: {hits:?}"
        );
        // Each passage is a document of the statistics.
        let stats = index.query_stats("rainfall").unwrap();
        assert_eq!(
            stats.docs as usize,
            passages.len() + 1 + corpus().len(),
            "{when}"
        );
    };
    check("staged");
    index.commit(7).unwrap();
    check("committed");
    // Removing the record removes every passage.
    index.remove(&[101]);
    index.commit(8).unwrap();
    let hits = index.search("quokka", 10, None).unwrap();
    assert_eq!(ids(&hits), [102]);
    assert_eq!(index.len().unwrap() as usize, 1 + corpus().len());
}

#[test]
fn the_top_k_holds_each_record_once_at_its_best() {
    let mut top = super::TopK::new(2, 10, false);
    top.push(1.0, 7);
    top.push(3.0, 7);
    top.push(2.0, 8);
    top.push(0.5, 7);
    top.push(1.5, 9);
    assert_eq!(top.threshold(), 2.0);
    top.push(2.5, 9);
    assert_eq!(top.into_sorted(), vec![(7, 3.0), (9, 2.5)]);
}

/// Keeping ties, records scoring the same as the `k`-th stay (a record tied then beaten
/// goes), whichever order they came in, and a record's better passage leaves the ties.
#[test]
fn the_top_k_keeps_the_records_tied_with_its_last() {
    let mut top = super::TopK::new(2, 10, true);
    top.push(2.0, 5);
    top.push(1.0, 6);
    top.push(1.0, 4);
    top.push(1.0, 8);
    assert_eq!(
        top.threshold(),
        1.0f32.next_down(),
        "a tie must still enter"
    );
    top.push(0.5, 9);
    assert_eq!(
        top.into_sorted(),
        vec![(5, 2.0), (4, 1.0), (6, 1.0), (8, 1.0)]
    );
    let mut top = super::TopK::new(2, 10, true);
    for (score, id) in [(1.0, 1), (1.0, 2), (1.0, 3), (1.5, 4), (1.0, 5)] {
        top.push(score, id);
    }
    // 4 pushed one of the three tied out of the set: all of them stay as ties.
    assert_eq!(
        top.into_sorted(),
        vec![(4, 1.5), (1, 1.0), (2, 1.0), (3, 1.0), (5, 1.0)]
    );
    let mut top = super::TopK::new(1, 10, true);
    for (score, id) in [(1.0, 1), (1.0, 2), (2.0, 3), (1.5, 2)] {
        top.push(score, id);
    }
    // 3 beat the tie of 1 and 2; then 2's better passage is still below 3.
    assert_eq!(top.into_sorted(), vec![(3, 2.0)]);
    let mut top = super::TopK::new(2, 10, true);
    for (score, id) in [(2.0, 1), (1.0, 2), (1.0, 3), (1.5, 2)] {
        top.push(score, id);
    }
    // 2's better passage raised the worst: 3 is no longer tied with it.
    assert_eq!(top.into_sorted(), vec![(1, 2.0), (2, 1.5)]);
}

#[test]
fn term_counts_from_the_index_equal_the_analysed_texts_before_and_after_a_commit() {
    let (_d, index) = open();
    // 45 analysed terms: past the 40 a field norm holds exactly, so the rounding shows.
    let wordy = "database ".repeat(3) + &"migration timeout rollback ".repeat(14);
    let long = long_text("the database migration timed out at noon");
    let texts = docs(&[
        (
            1,
            "the deploy pipeline failed with a timeout on the database migration",
        ),
        (2, "user asked about the weather in Paris tomorrow"),
        (3, &wordy),
        (4, &long),
    ]);
    index.upsert(&texts);
    let stats = index.query_stats("database migration timeout").unwrap();
    assert_eq!(stats.terms.len(), 3);
    let expected = |text: &str| -> Vec<super::TermCounts> {
        crate::index::passage::split(text)
            .into_iter()
            .map(|r| super::TermCounts::of(&stats, &analyze(&text[r])))
            .collect()
    };
    let sorted_counts = |ids: &[u32]| {
        let mut all = index.term_counts(&stats, ids).unwrap();
        for counts in all.values_mut() {
            counts.sort_by_key(|c| (c.len, c.tf.clone()));
        }
        all
    };
    for committed in [false, true] {
        let counts = sorted_counts(&[1, 2, 3, 4, 99]);
        assert_eq!(
            counts.len(),
            4,
            "99 is not in the index (committed: {committed})"
        );
        for (id, text) in &texts {
            let mut want = expected(text);
            want.sort_by_key(|c| (c.len, c.tf.clone()));
            assert_eq!(counts[id], want, "record {id} (committed: {committed})");
        }
        assert_eq!(counts[&2][0].tf, vec![0, 0, 0]);
        assert!(
            counts[&3][0].len < 45 && counts[&3][0].len > 40,
            "rounded as tantivy rounds"
        );
        assert!(
            counts[&4].len() > 1,
            "a long record has a document per passage"
        );
        index.commit(1).unwrap();
    }
    // A removal staged after the commit hides the record at once.
    index.remove(&[1]);
    assert!(!sorted_counts(&[1, 2]).contains_key(&1));
}

#[test]
fn a_scoped_search_counts_what_term_counts_reads_and_scores_as_the_full_search() {
    let (_d, index) = open();
    let long = long_text("the database migration timed out at noon");
    let mut texts = corpus();
    texts.push((40, long));
    index.upsert(&texts[..4]);
    index.commit(1).unwrap();
    // Staged beside committed: both kinds are counted and scored.
    index.upsert(&texts[4..]);
    let query = "database migration timeout";
    let scope: RoaringBitmap = [1u32, 3, 4, 5, 40, 77].into_iter().collect();
    let (hits, counts) = index.search_with_counts(query, 10, &scope).unwrap();
    let counts = counts.expect("a small scope is looked up doc by doc");
    assert_eq!(counts.stats, index.query_stats(query).unwrap());
    let scope_ids: Vec<u32> = scope.iter().collect();
    let read = counts.term_counts(&scope_ids);
    let mut want = index.term_counts(&counts.stats, &scope_ids).unwrap();
    let mut got = read.clone();
    for all in [&mut want, &mut got] {
        for c in all.values_mut() {
            c.sort_by_key(|c| (c.len, c.tf.clone()));
        }
    }
    assert_eq!(got, want);
    assert!(!read.contains_key(&77), "77 is not in the index");
    assert!(
        read[&40].len() > 1,
        "a long record has a document per passage"
    );
    // The same hits and scores as the search over everything, filtered to the scope.
    let everything = index.search(query, 100, None).unwrap();
    let filtered: Vec<(u32, f32)> = everything
        .into_iter()
        .filter(|(id, _)| scope.contains(*id))
        .collect();
    assert_eq!(ids(&hits), ids(&filtered));
    for ((_, a), (_, b)) in hits.iter().zip(&filtered) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
    }
    // A scope too wide to look up doc by doc is searched without counts.
    let wide: RoaringBitmap = (0..super::SCOPED_LOOKUP_MAX as u32 + 1).collect();
    let (wide_hits, none) = index.search_with_counts(query, 10, &wide).unwrap();
    assert!(none.is_none());
    assert!(!wide_hits.is_empty());
}

/// Two indexes that share their statistics score each document as one index holding both
/// does, committed or staged: what lets a namespace spread over several stores rank as one.
#[test]
fn summed_corpus_statistics_score_as_one_index() {
    let all = corpus();
    let (_a, one) = open();
    let (_b, left) = open();
    let (_c, right) = open();
    one.upsert(&all);
    let (l, r) = all.split_at(all.len() / 2);
    left.upsert(l);
    right.upsert(r);
    for stage in ["staged", "committed"] {
        let everything: RoaringBitmap = all.iter().map(|(id, _)| *id).collect();
        for query in ["database migration", "weather paris", "the deploy failed"] {
            let mut corpus = left.corpus_stats(query).unwrap();
            corpus.add(&right.corpus_stats(query).unwrap());
            assert_eq!(corpus, one.corpus_stats(query).unwrap(), "{stage} {query}");
            let want = one.search(query, 50, Some(&everything)).unwrap();
            let mut got = left
                .search_in_corpus(query, 50, &everything, &corpus)
                .unwrap();
            got.extend(
                right
                    .search_in_corpus(query, 50, &everything, &corpus)
                    .unwrap(),
            );
            got.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            assert_eq!(got, want, "{stage} {query}");
            // Alone, a half scores with its own statistics, which differ.
            let alone = left.search(query, 50, Some(&everything)).unwrap();
            let shared: Vec<_> = got
                .iter()
                .filter(|h| alone.iter().any(|a| a.0 == h.0))
                .collect();
            assert!(
                alone.iter().zip(shared).any(|(a, s)| a.1 != s.1),
                "{stage} {query}: the statistics made no difference"
            );
        }
        for (i, index) in [&one, &left, &right].into_iter().enumerate() {
            index.commit(10 + i as u64).unwrap();
        }
    }
}

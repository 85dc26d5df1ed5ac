//! The vector index's tests: builds, search against exact scoring, the tail's budget,
//! format upgrades, growth and cancellation, on real LMDB.

use std::collections::{BTreeMap, HashSet};

use rand::RngExt;
use tempfile::{TempDir, tempdir};

use super::search::keep_best;
use super::*;

/// `n` vectors around `centroids` random directions: the shape of real embeddings
/// (topics), which is what tree partitioning has to cope with.
fn clustered(n: usize, dims: usize, centroids: usize, noise: f32, seed: u64) -> Vec<Vec<f32>> {
    around(n, dims, centroids, noise, seed, seed)
}

/// Queries drawn from the same clusters as `clustered(.., seed)`, with fresh noise.
fn queries(n: usize, dims: usize, centroids: usize, noise: f32, seed: u64) -> Vec<Vec<f32>> {
    around(n, dims, centroids, noise, seed, seed ^ 0x9e37_79b9)
}

fn around(
    n: usize,
    dims: usize,
    centroids: usize,
    noise: f32,
    centre_seed: u64,
    point_seed: u64,
) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(centre_seed);
    let centres: Vec<Vec<f32>> = (0..centroids)
        .map(|_| unit(gaussian(&mut rng, dims, 1.0)))
        .collect();
    let mut rng = StdRng::seed_from_u64(point_seed.wrapping_add(1));
    let sigma = noise / (dims as f32).sqrt();
    (0..n)
        .map(|_| {
            let c = &centres[rng.random_range(0..centroids)];
            let e = gaussian(&mut rng, dims, sigma);
            c.iter().zip(e).map(|(c, e)| c + e).collect()
        })
        .collect()
}

fn gaussian(rng: &mut StdRng, dims: usize, sigma: f32) -> Vec<f32> {
    (0..dims)
        .map(|_| {
            // Box–Muller: rand 0.10 has no normal distribution without rand_distr.
            let u1: f32 = rng.random::<f32>().max(f32::MIN_POSITIVE);
            let u2: f32 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

fn unit(v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Brute force over `(id, vector)` pairs, the reference every search is checked against.
fn brute_force(
    items: &[(u32, Vec<f32>)],
    query: &[f32],
    k: usize,
    candidates: Option<&RoaringBitmap>,
) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = items
        .iter()
        .filter(|(id, _)| candidates.is_none_or(|c| c.contains(*id)))
        .map(|(id, v)| (*id, crate::index::cosine(query, v)))
        .collect();
    keep_best(&mut all, k);
    all
}

fn ids(hits: &[(u32, f32)]) -> Vec<u32> {
    hits.iter().map(|(id, _)| *id).collect()
}

fn with_ids(vectors: Vec<Vec<f32>>) -> Vec<(u32, Vec<f32>)> {
    vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| (i as u32, v))
        .collect()
}

fn open(dir: &TempDir, dims: usize) -> VectorIndex {
    VectorIndex::open(dir.path(), dims, VectorOptions::default()).unwrap()
}

fn axis(dims: usize, i: usize) -> Vec<f32> {
    let mut v = vec![0.0; dims];
    v[i] = 1.0;
    v
}

#[test]
fn the_index_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<VectorIndex>();
}

#[test]
fn staged_vectors_are_searchable_before_any_build() {
    let dir = TempDir::new().unwrap();
    let index = open(&dir, 4);
    index.upsert(&[
        (7, axis(4, 0)),
        (8, axis(4, 1)),
        (9, vec![1.0, 1.0, 0.0, 0.0]),
    ]);
    assert_eq!(index.pending(), 3);
    assert_eq!(index.len().unwrap(), 0);

    let hits = index.search(&axis(4, 0), 2, None).unwrap();
    assert_eq!(ids(&hits), vec![7, 9]);
    assert!((hits[0].1 - 1.0).abs() < 1e-6);
    assert!((hits[1].1 - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-5);

    let stats = index.build(3).unwrap();
    assert_eq!((stats.upserted, stats.removed, stats.items), (3, 0, 3));
    assert_eq!(index.pending(), 0);
    assert_eq!(index.len().unwrap(), 3);
    let after = index.search(&axis(4, 0), 2, None).unwrap();
    assert_eq!(ids(&after), vec![7, 9]);
    assert!((after[1].1 - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-5);
    assert_eq!(index.get(8).unwrap(), Some(axis(4, 1)));
}

#[test]
fn a_removal_hides_the_item_at_once_and_after_the_build() {
    let dir = TempDir::new().unwrap();
    let index = open(&dir, 4);
    index.upsert(&[
        (1, axis(4, 0)),
        (2, vec![0.9, 0.1, 0.0, 0.0]),
        (3, axis(4, 2)),
    ]);
    index.build(1).unwrap();

    index.remove(&[1]);
    // Also remove something only staged, and something that never existed.
    index.upsert(&[(4, vec![0.8, 0.2, 0.0, 0.0])]);
    index.remove(&[4, 99]);
    let hits = index.search(&axis(4, 0), 10, None).unwrap();
    assert_eq!(ids(&hits), vec![2, 3]);
    assert_eq!(index.get(1).unwrap(), None);
    let scoped = index
        .search(&axis(4, 0), 10, Some(&RoaringBitmap::from_iter([1, 2])))
        .unwrap();
    assert_eq!(ids(&scoped), vec![2]);

    let stats = index.build(2).unwrap();
    assert_eq!(stats.removed, 3);
    assert_eq!(index.len().unwrap(), 2);
    assert_eq!(
        ids(&index.search(&axis(4, 0), 10, None).unwrap()),
        vec![2, 3]
    );
    assert_eq!(index.get(1).unwrap(), None);
}

#[test]
fn a_re_upsert_replaces_the_vector_before_and_after_the_build() {
    let dir = TempDir::new().unwrap();
    let index = open(&dir, 4);
    index.upsert(&[(1, axis(4, 0)), (2, axis(4, 1))]);
    index.build(1).unwrap();

    index.upsert(&[(1, axis(4, 3))]);
    let hits = index.search(&axis(4, 3), 10, None).unwrap();
    assert_eq!(hits.iter().filter(|(id, _)| *id == 1).count(), 1);
    assert_eq!(hits[0].0, 1);
    assert!((hits[0].1 - 1.0).abs() < 1e-6);
    let old_direction = index.search(&axis(4, 0), 1, None).unwrap();
    assert!(
        old_direction[0].1 < 0.5,
        "the old vector still answers: {old_direction:?}"
    );
    assert_eq!(index.get(1).unwrap(), Some(axis(4, 3)));

    index.build(2).unwrap();
    assert_eq!(index.len().unwrap(), 2);
    let hits = index.search(&axis(4, 3), 10, None).unwrap();
    assert_eq!(hits[0].0, 1);
    assert!((hits[0].1 - 1.0).abs() < 1e-6);
    assert_eq!(index.get(1).unwrap(), Some(axis(4, 3)));
}

#[test]
fn candidates_never_leak_on_the_exact_or_the_tree_path() {
    let dims = 16;
    let items = with_ids(clustered(3000, dims, 20, 0.6, 1));
    let qs = queries(20, dims, 20, 0.6, 1);
    for exact_threshold in [u64::MAX, 0] {
        let dir = TempDir::new().unwrap();
        let opts = VectorOptions {
            exact_threshold,
            ..VectorOptions::default()
        };
        let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
        index.upsert(&items[..2500]);
        index.build(1).unwrap();
        // A staged tail inside and outside the candidates, and a staged removal.
        index.upsert(&items[2500..]);
        index.remove(&[0, 2]);
        let live: Vec<(u32, Vec<f32>)> = items
            .iter()
            .filter(|(id, _)| *id != 0 && *id != 2)
            .cloned()
            .collect();

        // Small scopes, and one over half the index so arroy walks its trees.
        let small = RoaringBitmap::from_iter((0..3000).step_by(37));
        let half: RoaringBitmap = (0..3000u32).filter(|i| i % 3 != 1).collect();
        for scope in [&small, &half] {
            for q in &qs {
                let hits = index.search(q, 10, Some(scope)).unwrap();
                assert_eq!(hits.len(), 10);
                for (id, _) in &hits {
                    assert!(scope.contains(*id), "id {id} is outside the candidates");
                    assert!(*id != 0 && *id != 2, "removed id {id} came back");
                }
                if scope.len() <= exact_threshold {
                    assert_eq!(ids(&hits), ids(&brute_force(&live, q, 10, Some(scope))));
                }
            }
        }
    }
}

/// The hot cache must never change an answer: random upserts, re-upserts, removals,
/// builds, clears and reopens, with a cache too small for the data (so it evicts all the
/// time) and with none, against a brute-force reference.
#[test]
fn the_hot_cache_never_changes_an_answer() {
    let dims = 8;
    let budget = 5 * Hot::cost(&StagedVector::new(&axis(dims, 0), 1.0));
    let (dir_hot, dir_cold) = (tempdir().unwrap(), tempdir().unwrap());
    let opts = |hot_cache_bytes| VectorOptions {
        hot_cache_bytes,
        build_threads: 1,
        ..VectorOptions::default()
    };
    let mut hot = VectorIndex::open(dir_hot.path(), dims, opts(budget)).unwrap();
    let mut cold = VectorIndex::open(dir_cold.path(), dims, opts(0)).unwrap();
    let mut reference: BTreeMap<u32, Vec<f32>> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(11);
    for step in 0..400u64 {
        match rng.random_range(0..20) {
            0..=7 => {
                let id = rng.random_range(0..40);
                let v = gaussian(&mut rng, dims, 1.0);
                hot.upsert(&[(id, v.clone())]);
                cold.upsert(&[(id, v.clone())]);
                reference.insert(id, v);
            }
            8..=9 => {
                let id = rng.random_range(0..40);
                hot.remove(&[id]);
                cold.remove(&[id]);
                reference.remove(&id);
            }
            10..=13 => {
                hot.build(step).unwrap();
                cold.build(step).unwrap();
            }
            14 if step % 7 == 0 => {
                hot.clear().unwrap();
                cold.clear().unwrap();
                reference.clear();
            }
            15 => {
                // Reopening drops the tail and the cache; rebuild like the substrate does.
                hot.build(step).unwrap();
                cold.build(step).unwrap();
                drop((hot, cold));
                hot = VectorIndex::open(dir_hot.path(), dims, opts(budget)).unwrap();
                cold = VectorIndex::open(dir_cold.path(), dims, opts(0)).unwrap();
            }
            _ => {
                let candidates: RoaringBitmap = (0..40).filter(|_| rng.random_bool(0.5)).collect();
                let query = gaussian(&mut rng, dims, 1.0);
                let items: Vec<(u32, Vec<f32>)> =
                    reference.iter().map(|(&id, v)| (id, v.clone())).collect();
                let want = ids(&brute_force(&items, &query, 5, Some(&candidates)));
                let from_hot = hot.search(&query, 5, Some(&candidates)).unwrap();
                let from_cold = cold.search(&query, 5, Some(&candidates)).unwrap();
                assert_eq!(ids(&from_hot), want, "step {step}: hot cache");
                assert_eq!(ids(&from_cold), want, "step {step}: no cache");
                for id in 0..40 {
                    assert_eq!(
                        hot.get(id).unwrap(),
                        reference.get(&id).cloned(),
                        "get {id}"
                    );
                }
            }
        }
        let tail = hot.tail_read();
        assert!(
            tail.hot.bytes <= budget,
            "step {step}: {} bytes cached",
            tail.hot.bytes
        );
        assert!(tail.hot.map.len() <= 5);
    }
    assert!(hot.tail_read().hot.inserted > 0, "the cache was never used");
}

/// The store's side of a spilled tail in these tests: the current vector of every id.
#[derive(Default)]
struct MapSource(Mutex<BTreeMap<u32, Vec<f32>>>);

impl VectorSource for MapSource {
    fn vector(&self, id: u32) -> Result<Option<Vec<f32>>> {
        Ok(self.0.lock().unwrap().get(&id).cloned())
    }
}

#[test]
fn a_tail_over_budget_reads_vectors_back_and_answers_the_same() {
    let dims = 8;
    let budget = 3 * Hot::cost(&StagedVector::new(&axis(dims, 0), 1.0));
    let source = Arc::new(MapSource::default());
    let dirs = [tempdir().unwrap(), tempdir().unwrap()];
    // Session-sized scopes take the exact path; a zero threshold forces the tail scan
    // plus the trees.
    let indexes: Vec<VectorIndex> = [2_000, 0]
        .into_iter()
        .zip(&dirs)
        .map(|(exact_threshold, dir)| {
            let index = VectorIndex::open(
                dir.path(),
                dims,
                VectorOptions {
                    exact_threshold,
                    tail_memory_bytes: budget,
                    build_threads: 1,
                    ..VectorOptions::default()
                },
            )
            .unwrap();
            index.read_back_from(source.clone());
            index
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(12);
    let mut spilled = 0;
    for step in 0..300u64 {
        match rng.random_range(0..12) {
            0..=5 => {
                let id = rng.random_range(0..40);
                let v = gaussian(&mut rng, dims, 1.0);
                source.0.lock().unwrap().insert(id, v.clone());
                for index in &indexes {
                    index.upsert(&[(id, v.clone())]);
                }
            }
            6 => {
                let id = rng.random_range(0..40);
                source.0.lock().unwrap().remove(&id);
                for index in &indexes {
                    index.remove(&[id]);
                }
            }
            7 => {
                for index in &indexes {
                    index.build(step).unwrap();
                }
            }
            _ => {
                let scope: RoaringBitmap = (0..40).filter(|_| rng.random_bool(0.6)).collect();
                let candidates = [None, Some(&scope)][rng.random_range(0..2)];
                let query = gaussian(&mut rng, dims, 1.0);
                let items: Vec<(u32, Vec<f32>)> = source
                    .0
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(&id, v)| (id, v.clone()))
                    .collect();
                let want = ids(&brute_force(&items, &query, 5, candidates));
                for (n, index) in indexes.iter().enumerate() {
                    let got = index.search(&query, 5, candidates).unwrap();
                    assert_eq!(ids(&got), want, "step {step}, index {n}");
                }
                for id in 0..40 {
                    let want = source.0.lock().unwrap().get(&id).cloned();
                    assert_eq!(indexes[0].get(id).unwrap(), want, "get {id}");
                }
            }
        }
        for index in &indexes {
            let tail = index.tail_read();
            assert!(tail.bytes <= budget, "step {step}: {} bytes", tail.bytes);
            spilled += tail
                .entries
                .values()
                .filter(|s| matches!(s.change, Change::Stored))
                .count();
        }
    }
    assert!(spilled > 0, "nothing was ever staged past the budget");
    // A build empties the tail and gives its bytes back.
    for index in &indexes {
        index.build(1_000).unwrap();
        assert_eq!((index.pending(), index.tail_bytes()), (0, 0));
    }
}

/// Ids spread over many shards answer like one index: exact and tree paths against
/// brute force through upserts, removals, builds and a reopen.
#[test]
fn shards_answer_like_one_index_and_survive_a_reopen() {
    let dims = 8;
    let dirs = [tempdir().unwrap(), tempdir().unwrap()];
    let opts = |exact_threshold| VectorOptions {
        exact_threshold,
        shard_items: 16,
        max_build_items: 30,
        build_threads: 1,
        ..VectorOptions::default()
    };
    let mut indexes: Vec<VectorIndex> = [2_000, 0]
        .into_iter()
        .zip(&dirs)
        .map(|(t, dir)| VectorIndex::open(dir.path(), dims, opts(t)).unwrap())
        .collect();
    let mut rng = StdRng::seed_from_u64(21);
    let mut truth: HashMap<u32, Vec<f32>> = HashMap::new();
    for step in 0..400u64 {
        match rng.random_range(0..12) {
            0..=5 => {
                let id = rng.random_range(0..100);
                let v = gaussian(&mut rng, dims, 1.0);
                truth.insert(id, v.clone());
                for index in &indexes {
                    index.upsert(&[(id, v.clone())]);
                }
            }
            6 => {
                let id = rng.random_range(0..100);
                truth.remove(&id);
                for index in &indexes {
                    index.remove(&[id]);
                }
            }
            7 => {
                for index in &indexes {
                    index.build(step).unwrap();
                }
            }
            8 if step % 5 == 0 => {
                for index in &indexes {
                    index.build(step).unwrap();
                }
                // Closed before reopening: LMDB refuses a second open of a directory.
                indexes.clear();
                indexes = [2_000, 0]
                    .into_iter()
                    .zip(&dirs)
                    .map(|(t, dir)| VectorIndex::open(dir.path(), dims, opts(t)).unwrap())
                    .collect();
                for index in &indexes {
                    assert_eq!(index.len().unwrap(), truth.len() as u64, "step {step}");
                }
            }
            _ => {
                let scope: RoaringBitmap = (0..100).filter(|_| rng.random_bool(0.3)).collect();
                let candidates = [None, Some(&scope)][rng.random_range(0..2)];
                let query = gaussian(&mut rng, dims, 1.0);
                let items: Vec<(u32, Vec<f32>)> =
                    truth.iter().map(|(&id, v)| (id, v.clone())).collect();
                let want = ids(&brute_force(&items, &query, 5, candidates));
                for (n, index) in indexes.iter().enumerate() {
                    let got = index.search(&query, 5, candidates).unwrap();
                    assert_eq!(ids(&got), want, "step {step}, index {n}");
                }
                for id in 0..100 {
                    assert_eq!(indexes[1].get(id).unwrap(), truth.get(&id).cloned());
                }
            }
        }
    }
    for index in &indexes {
        index.build(1_000).unwrap();
        assert_eq!(index.len().unwrap(), truth.len() as u64);
        let shards = index.shards();
        assert!(shards.len() >= 6, "ids 0..100 in shards of 16");
        // Removing an id of an empty shard creates no forest there.
        index.remove(&[50_000]);
        index.build(1_001).unwrap();
        assert_eq!(index.shards(), shards);
    }
}

/// An index written before shards keeps every id in its one forest.
#[test]
fn an_index_from_before_shards_stays_one_shard() {
    let dir = tempdir().unwrap();
    let dims = 4;
    {
        let index = open(&dir, dims);
        index.upsert(
            &(0..10)
                .map(|i| (i, axis(dims, i as usize % dims)))
                .collect::<Vec<_>>(),
        );
        index.build(1).unwrap();
        // What an index of the first format holds: format 1, no shard keys.
        index
            .write_with_growth(|wtxn| {
                index.meta.delete(wtxn, META_SHARD_ITEMS)?;
                index.meta.delete(wtxn, META_SHARDS)?;
                write_u64(index.meta, wtxn, META_FORMAT, FORMAT_ONE_FOREST)?;
                Ok(Ok(()))
            })
            .unwrap();
    }
    let opts = VectorOptions {
        shard_items: 4,
        ..VectorOptions::default()
    };
    let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
    assert_eq!(index.len().unwrap(), 10);
    index.upsert(&[(50, axis(dims, 1))]);
    index.build(2).unwrap();
    assert_eq!(index.shard_of(50), 0);
    assert_eq!(index.len().unwrap(), 11);
    assert_eq!(index.get(7).unwrap(), Some(axis(dims, 3)));
    // Recorded as the current format: a binary from before shards refuses it.
    assert_eq!(index.watermark().unwrap(), 2);
    let rtxn = index.env.read_txn().unwrap();
    let format = read_u64(index.meta, &rtxn, META_FORMAT).unwrap();
    assert_eq!(format, Some(u64::from(FORMAT_VERSION)));
}

#[test]
fn builds_go_in_bounded_transactions_and_record_the_watermark_with_the_last() {
    let dir = tempdir().unwrap();
    let index = VectorIndex::open(
        dir.path(),
        4,
        VectorOptions {
            max_build_items: 3,
            build_threads: 1,
            ..VectorOptions::default()
        },
    )
    .unwrap();
    let items: Vec<(u32, Vec<f32>)> = (0..10).map(|i| (i, axis(4, i as usize % 4))).collect();
    index.upsert(&items);
    let first = index.build_with(7, true).unwrap();
    assert_eq!((first.upserted, first.remaining), (3, 7));
    assert_eq!(
        first.watermark, 0,
        "a partial build keeps the old watermark"
    );
    assert_eq!((index.pending(), index.len().unwrap()), (7, 3));
    assert_eq!(index.watermark().unwrap(), 0);
    // Built or staged, every item is found.
    let all: RoaringBitmap = (0..10).collect();
    assert_eq!(index.search(&axis(4, 1), 10, Some(&all)).unwrap().len(), 10);
    let rest = index.build(7).unwrap();
    assert_eq!((rest.upserted, rest.remaining, rest.watermark), (7, 0, 7));
    assert_eq!((index.pending(), index.len().unwrap()), (0, 10));
    assert_eq!(index.watermark().unwrap(), 7);
}

#[test]
fn search_equals_exact_search_on_small_data() {
    let dims = 32;
    let items = with_ids(clustered(600, dims, 8, 0.7, 2));
    let dir = TempDir::new().unwrap();
    let opts = VectorOptions {
        exact_threshold: 0,
        ..VectorOptions::default()
    };
    let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
    index.upsert(&items);
    index.build(1).unwrap();
    for q in queries(30, dims, 8, 0.7, 2) {
        let got = index.search(&q, 10, None).unwrap();
        let want = brute_force(&items, &q, 10, None);
        assert_eq!(ids(&got), ids(&want));
        for ((_, g), (_, w)) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "similarity {g} vs exact {w}");
        }
    }
}

#[test]
fn the_watermark_and_items_survive_a_reopen() {
    let dir = TempDir::new().unwrap();
    let items = with_ids(clustered(300, 8, 4, 0.5, 3));
    {
        let index = open(&dir, 8);
        assert_eq!(index.watermark().unwrap(), 0);
        index.upsert(&items);
        let stats = index.build(42).unwrap();
        assert_eq!(stats.watermark, 42);
        // Staged but never built: lost on close by design, the store replays it.
        index.upsert(&[(1000, axis(8, 0))]);
    }
    let index = open(&dir, 8);
    assert_eq!(index.watermark().unwrap(), 42);
    assert_eq!(index.len().unwrap(), 300);
    assert_eq!(index.pending(), 0);
    assert_eq!(index.get(5).unwrap(), Some(items[5].1.clone()));
    let hits = index.search(&items[17].1, 1, None).unwrap();
    assert_eq!(hits[0].0, 17);

    index.clear().unwrap();
    assert_eq!(index.watermark().unwrap(), 0);
    assert_eq!(index.len().unwrap(), 0);
    assert!(index.search(&items[17].1, 5, None).unwrap().is_empty());
    drop(index);
    assert_eq!(open(&dir, 8).len().unwrap(), 0);
}

#[test]
fn another_dimension_on_reopen_names_shadowbrain_reindex() {
    let dir = TempDir::new().unwrap();
    {
        let index = open(&dir, 8);
        index.upsert(&[(1, axis(8, 0))]);
        index.build(1).unwrap();
    }
    let err = VectorIndex::open(dir.path(), 16, VectorOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DimensionMismatch {
                got: 16,
                expected: 8
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("shadowbrain reindex"), "{err}");

    // The reindex path: recreate with the new dimension, then it opens normally.
    let index = VectorIndex::recreate(dir.path(), 16, VectorOptions::default()).unwrap();
    assert_eq!(index.len().unwrap(), 0);
    assert_eq!(index.watermark().unwrap(), 0);
    index.upsert(&[(1, axis(16, 9))]);
    index.build(5).unwrap();
    drop(index);
    let index = VectorIndex::open(dir.path(), 16, VectorOptions::default()).unwrap();
    assert_eq!(index.get(1).unwrap(), Some(axis(16, 9)));
}

#[test]
fn opening_the_same_directory_twice_is_an_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    let _first = open(&dir, 4);
    let err = VectorIndex::open(dir.path(), 4, VectorOptions::default()).unwrap_err();
    assert!(err.to_string().contains("already open"), "{err}");
}

#[test]
fn a_full_map_grows_and_the_build_is_retried() {
    let dir = TempDir::new().unwrap();
    let dims = 64;
    let opts = VectorOptions {
        initial_map_size: 64 << 10,
        ..VectorOptions::default()
    };
    let items = with_ids(clustered(3000, dims, 10, 0.5, 4));
    {
        let mut index = VectorIndex::open(dir.path(), dims, opts.clone()).unwrap();
        index.grow_ahead = false;
        index.upsert(&items[..2000]);
        let stats = index.build(1).unwrap();
        assert!(stats.map_resizes > 0, "{stats:?}");
        assert!(index.env.info().map_size > 64 << 10);
        assert_eq!(stats.items, 2000);
        index.upsert(&items[2000..]);
        assert_eq!(index.build(2).unwrap().items, 3000);
    }
    // Reopening with the tiny initial size still fits the grown file.
    let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
    assert_eq!(index.len().unwrap(), 3000);
    assert_eq!(index.watermark().unwrap(), 2);
    assert_eq!(index.search(&items[2999].1, 1, None).unwrap()[0].0, 2999);
}

#[test]
fn bad_queries_and_vectors_are_clear_errors() {
    let dir = TempDir::new().unwrap();
    let index = open(&dir, 4);
    index.upsert(&[(1, axis(4, 0))]);

    let invalid = |r: Result<Vec<(u32, f32)>>| match r {
        Err(Error::Invalid { field, reason }) => {
            assert_eq!(field, "query");
            reason
        }
        other => panic!("expected Error::Invalid, got {other:?}"),
    };
    let reason = invalid(index.search(&[1.0, 0.0], 5, None));
    assert!(reason.contains("has 2 dimensions") && reason.contains("4-dimensional"));
    let reason = invalid(index.search(&[1.0, f32::NAN, 0.0, 0.0], 5, None));
    assert!(reason.contains("component 1 is NaN"), "{reason}");
    invalid(index.search(&[f32::INFINITY, 0.0, 0.0, 0.0], 5, None));
    let reason = invalid(index.search(&[0.0; 4], 5, None));
    assert!(reason.contains("non-zero"), "{reason}");
    assert!(index.search(&axis(4, 0), 0, None).unwrap().is_empty());
    let none = RoaringBitmap::new();
    assert!(
        index
            .search(&axis(4, 0), 5, Some(&none))
            .unwrap()
            .is_empty()
    );

    // try_upsert is all or nothing and names the item.
    let err = index
        .try_upsert(&[(2, axis(4, 1)), (3, vec![f32::NAN; 4])])
        .unwrap_err();
    assert!(err.to_string().contains("item 3"), "{err}");
    assert_eq!(index.pending(), 1);
    // upsert skips what it cannot index and keeps the rest.
    index.upsert(&[(4, vec![1.0; 3]), (5, axis(4, 2)), (1, vec![0.0; 4])]);
    assert_eq!(index.pending(), 2);
    assert_eq!(index.get(1).unwrap(), Some(axis(4, 0)));
    assert_eq!(index.get(4).unwrap(), None);
    assert!(matches!(
        VectorIndex::open(&dir.path().join("zero"), 0, VectorOptions::default()),
        Err(Error::Invalid { .. })
    ));
}

#[test]
fn builds_are_deterministic() {
    let dims = 24;
    let items = with_ids(clustered(2500, dims, 15, 0.8, 5));
    let qs = queries(20, dims, 15, 0.8, 5);
    let opts = VectorOptions {
        n_trees: Some(4),
        search_k_factor: 1,
        exact_threshold: 0,
        build_threads: 1,
        ..VectorOptions::default()
    };
    let run = || {
        let dir = TempDir::new().unwrap();
        let index = VectorIndex::open(dir.path(), dims, opts.clone()).unwrap();
        index.upsert(&items[..2000]);
        index.build(10).unwrap();
        index.upsert(&items[2000..]);
        index.build(20).unwrap();
        qs.iter()
            .map(|q| index.search(q, 10, None).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn changes_staged_during_builds_are_never_lost() {
    let dims = 16;
    let dir = TempDir::new().unwrap();
    let index = open(&dir, dims);
    let items = with_ids(clustered(4000, dims, 10, 0.5, 6));
    let replacements = clustered(40, dims, 10, 0.5, 60);
    index.upsert(&items[..2000]);
    std::thread::scope(|s| {
        s.spawn(|| {
            for (i, chunk) in items[2000..].chunks(50).enumerate() {
                index.upsert(chunk);
                // Replace an id a running build may be writing with its old vector.
                index.upsert(&[(i as u32, replacements[i].clone())]);
            }
        });
        s.spawn(|| {
            for wm in 1..=20 {
                index.build(wm).unwrap();
            }
        });
    });
    index.build(100).unwrap();
    assert_eq!(index.pending(), 0);
    assert_eq!(index.len().unwrap(), 4000);
    for (i, v) in replacements.iter().enumerate() {
        assert_eq!(index.get(i as u32).unwrap().as_ref(), Some(v), "item {i}");
    }
    for (id, v) in items.iter().skip(40).step_by(97) {
        assert_eq!(index.get(*id).unwrap().as_ref(), Some(v), "item {id}");
    }
}

#[test]
fn searches_during_a_build_always_see_every_item() {
    let dims = 32;
    let dir = TempDir::new().unwrap();
    let index = open(&dir, dims);
    let items = with_ids(clustered(6000, dims, 30, 0.5, 7));
    index.upsert(&items[..3000]);
    index.build(1).unwrap();
    index.upsert(&items[3000..]);
    let probes: Vec<usize> = (3000..6000).step_by(211).collect();
    let scope: RoaringBitmap = probes.iter().map(|&i| i as u32).collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            index.build(2).unwrap();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        s.spawn(|| {
            let mut rounds = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || rounds < 3 {
                for &i in &probes {
                    let hits = index.search(&items[i].1, 1, Some(&scope)).unwrap();
                    assert_eq!(hits[0].0, i as u32, "item {i} vanished mid-build");
                }
                rounds += 1;
            }
        });
    });
    assert_eq!(index.pending(), 0);
    assert_eq!(index.len().unwrap(), 6000);
}

/// Recall and latency on synthetic clustered data, run once in release to pick the
/// defaults:
/// `cargo test --release -p shadowbrain-runtime --lib vector -- --ignored --nocapture`.
/// `SB_BENCH_N`, `SB_BENCH_TREES` (e.g. `8,16`) and `SB_BENCH_FACTORS` override the grid.
#[test]
#[ignore = "measurement: run in release"]
fn measure_recall_and_latency() {
    let env_list = |name: &str, default: &str| -> Vec<usize> {
        std::env::var(name)
            .unwrap_or_else(|_| default.to_string())
            .split(',')
            .map(|s| s.trim().parse().unwrap())
            .collect()
    };
    let n = env_list("SB_BENCH_N", "100000")[0];
    let trees = env_list("SB_BENCH_TREES", "16");
    let factors = env_list("SB_BENCH_FACTORS", "2,4,8,16");
    let (dims, centroids, noise, k, nq) = (384, 200, 0.75, 10, 200);
    let items = with_ids(clustered(n, dims, centroids, noise, 11));
    let qs = queries(nq, dims, centroids, noise, 11);
    let truth: Vec<HashSet<u32>> = qs
        .iter()
        .map(|q| ids(&brute_force(&items, q, k, None)).into_iter().collect())
        .collect();
    let p50 = |mut t: Vec<Duration>| {
        t.sort();
        t[t.len() / 2]
    };
    for &n_trees in &trees {
        let dir = TempDir::new().unwrap();
        let opts = VectorOptions {
            n_trees: Some(n_trees),
            ..VectorOptions::default()
        };
        let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
        index.upsert(&items);
        let stats = index.build(1).unwrap();
        println!(
            "n={n} dims={dims} n_trees={n_trees}: full build {:?}",
            stats.elapsed
        );
        let more: Vec<(u32, Vec<f32>)> = clustered(1000, dims, centroids, noise, 12)
            .into_iter()
            .enumerate()
            .map(|(i, v)| ((n + i) as u32, v))
            .collect();
        index.upsert(&more);
        let incremental = index.build(2).unwrap().elapsed;
        println!("  incremental build of 1000: {incremental:?}");
        index.remove(&more.iter().map(|(id, _)| *id).collect::<Vec<_>>());
        index.build(3).unwrap();
        drop(index);
        for &factor in &factors {
            let opts = VectorOptions {
                n_trees: Some(n_trees),
                search_k_factor: factor,
                ..VectorOptions::default()
            };
            let started = Instant::now();
            let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
            let reopen = started.elapsed();
            let (mut hit, mut times) = (0usize, Vec::new());
            for (q, want) in qs.iter().zip(&truth) {
                let t = Instant::now();
                let got = index.search(q, k, None).unwrap();
                times.push(t.elapsed());
                hit += got.iter().filter(|(id, _)| want.contains(id)).count();
            }
            let recall = hit as f64 / (nq * k) as f64;
            println!(
                "  search_k_factor={factor}: recall@10 {recall:.4}, p50 {:?} (reopen {reopen:?})",
                p50(times)
            );
        }
    }
    // Session scope: 100 candidates, exact path.
    let dir = TempDir::new().unwrap();
    let index = VectorIndex::open(dir.path(), dims, VectorOptions::default()).unwrap();
    index.upsert(&items[..20_000]);
    index.build(1).unwrap();
    let scope: RoaringBitmap = (0..20_000u32).step_by(200).collect();
    let mut times = Vec::new();
    for q in qs.iter().cycle().take(1000) {
        let t = Instant::now();
        let got = index.search(q, 10, Some(&scope)).unwrap();
        times.push(t.elapsed());
        assert_eq!(
            ids(&got),
            ids(&brute_force(&items[..20_000], q, 10, Some(&scope)))
        );
    }
    println!("scoped top-10 over 100 candidates: p50 {:?}", p50(times));
}

#[test]
fn the_dot_alone_has_the_bits_of_the_dot_beside_the_norm() {
    let mut rng = rand::rng();
    for len in [1, 7, 8, 9, 383, 384, 385] {
        let a: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let b: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        assert_eq!(dot(&a, &b).to_bits(), dot_and_norm2(&a, &b).0.to_bits());
    }
}

#[test]
fn a_stored_vector_is_held_at_half_precision_and_scores_with_the_same_bits() {
    let mut rng = rand::rng();
    for len in [1, 7, 8, 63, 64, 65, 383, 384, 385] {
        let raw: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let stored = crate::store::stored_embedding(&raw);
        let query: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
        for (values, half) in [(&stored, true), (&raw, false)] {
            let v = StagedVector::new(values, 1.0);
            assert_eq!(matches!(v.values, Values::Half { .. }), half, "{len}");
            assert_eq!(&v.to_vec(), values);
            assert_eq!(v.dot(&query).to_bits(), dot(&query, values).to_bits());
        }
        // Both ways of widening, whichever this CPU takes, give those bits too, down to
        // vectors whose products are subnormal.
        for magnitude in [1.0, 1e-38, 1e30] {
            let scaled: Vec<f32> = raw.iter().map(|x| x * magnitude).collect();
            let stored = crate::store::stored_embedding(&scaled);
            let (exp, halves) = codec::half_precision(&stored);
            let scale = codec::pow2(exp);
            let want = dot(&query, &stored).to_bits();
            let widened = dot_half_widened(&query, &halves, scale);
            assert_eq!(widened.to_bits(), want, "{len} {magnitude}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("f16c")
                && std::arch::is_x86_feature_detected!("avx")
            {
                // SAFETY: the features were just checked.
                let got = unsafe { dot_half_f16c(&query, &halves, scale) };
                assert_eq!(got.to_bits(), want, "{len} {magnitude}");
            }
        }
        let (full, halved) = (
            StagedVector::new(&raw, 1.0),
            StagedVector::new(&stored, 1.0),
        );
        assert_eq!(halved.bytes() * 2, full.bytes());
    }
}

/// Ids that start high (a cluster partition's block) make forests only where they are:
/// builds and a reopen know those shards and no empty one beneath them, and a search
/// finds the items.
#[test]
fn ids_that_start_high_make_only_their_own_shards() {
    let dims = 8;
    let dir = tempdir().unwrap();
    let opts = VectorOptions {
        exact_threshold: 0,
        shard_items: 1 << 16,
        build_threads: 1,
        ..VectorOptions::default()
    };
    let first = 3u32 << 29;
    let mut rng = StdRng::seed_from_u64(5);
    let vectors: Vec<(u32, Vec<f32>)> = (0..40u32)
        .map(|i| (first + i * 4_000, gaussian(&mut rng, dims, 1.0)))
        .collect();
    let index = VectorIndex::open(dir.path(), dims, opts.clone()).unwrap();
    index.upsert(&vectors);
    index.build(1).unwrap();
    let want: Vec<u16> = vec![
        (first >> 16) as u16,
        (first >> 16) as u16 + 1,
        (first >> 16) as u16 + 2,
    ];
    assert_eq!(
        index.shards().to_vec(),
        want,
        "40 ids 4,000 apart from {first}"
    );
    drop(index);
    let index = VectorIndex::open(dir.path(), dims, opts).unwrap();
    assert_eq!(
        index.shards().to_vec(),
        want,
        "the same shards found at open"
    );
    assert_eq!(index.len().unwrap(), 40);
    let (id, v) = &vectors[17];
    let got = index.search(v, 1, None).unwrap();
    assert_eq!(got.first().map(|h| h.0), Some(*id));
}

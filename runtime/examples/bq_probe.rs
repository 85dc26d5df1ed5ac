//! A probe, not part of the runtime: can arroy's one-bit index (`BinaryQuantizedCosine`, 48
//! bytes a 384-d vector) find W1's global top-10 (Q2) when its candidates are rescored with
//! the full vectors? That would keep each embedding once in full (the store's copy) and shrink
//! arroy's items from 1,536 to 48 bytes. `bench/bq_bound.py` gives the best case (exact
//! Hamming top-N); this measures arroy's approximate one.
//!
//! Builds one arroy forest over W1's 100,000 vectors in a temporary LMDB, then for each
//! (candidates asked, leaves inspected) pair runs the 1,000 Q2 queries one at a time and
//! prints p50 / p99 latency (arroy's search plus the rescoring) and recall@10 against W1's
//! exact ground truth, and the index's size on disk. The rescoring reads the float32 vectors
//! from memory, as the hot cache holds them (at half precision) in a server. The anchor,
//! built and queried the same way in the same run, is the float32 forest with the vector
//! index's own setting (10 asked, 10 × trees × 8 leaves inspected).
//!
//! ```text
//! cargo run --release -p shadowbrain-runtime --example bq_probe -- /tmp/w1-data [TREES]
//! ```

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arroy::distances::{BinaryQuantizedCosine, Cosine};
use arroy::{Database, Distance, Reader, Writer};
use clap::Parser;
use heed::{CommitOrAbort, EnvOpenOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;
use shadowbrain_test_support::stats::percentile;

const DIM: usize = 384;

/// arroy's one-bit forest over W1's vectors, rescored, beside the float32 forest: latency
/// and recall@10 of the Q2 queries per candidate setting.
#[derive(Parser)]
#[command(name = "bq_probe")]
struct Args {
    /// W1's data directory (emb.f32, q2.f32, q2_gt.i64).
    #[arg(value_name = "W1_DATA")]
    data: PathBuf,
    /// Trees in each forest.
    #[arg(default_value_t = 24)]
    trees: usize,
}

fn read<T: Copy>(path: &Path, decode: fn(&[u8]) -> T, width: usize) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(width).map(decode).collect()
}

fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter().map(|x| x / norm).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args { data, trees } = Args::parse();
    let f32le = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let emb = read(&data.join("emb.f32"), f32le, 4);
    let queries = read(&data.join("q2.f32"), f32le, 4);
    let truth = read(
        &data.join("q2_gt.i64"),
        |c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
        8,
    );
    let n = emb.len() / DIM;
    let nq = queries.len() / DIM;
    let per_query = truth.len() / nq;
    let vectors: Vec<Vec<f32>> = emb.chunks_exact(DIM).map(unit).collect();

    let w1 = W1 {
        vectors: &vectors,
        queries: &queries,
        truth: &truth,
        per_query,
    };
    // The anchor, in the same run: the float32 forest as the vector index searches it
    // (10 asked, k × trees × 8 leaves), no rescoring.
    let float = forest::<Cosine>(&w1, trees, &[(10, 10 * trees * 8)], false)?;
    let one_bit_grid: Vec<(usize, usize)> = [200usize, 400, 800]
        .into_iter()
        .flat_map(|asked| [2_000usize, 4_000, 8_000, 16_000].map(|inspected| (asked, inspected)))
        .collect();
    let one_bit = forest::<BinaryQuantizedCosine>(&w1, trees, &one_bit_grid, true)?;
    println!("{{\"vectors\":{n},\"trees\":{trees},\"float32\":{float},\"one_bit\":{one_bit}}}");
    Ok(())
}

/// W1's unit vectors, its Q2 queries and their exact top ids.
struct W1<'a> {
    vectors: &'a [Vec<f32>],
    queries: &'a [f32],
    truth: &'a [i64],
    per_query: usize,
}

/// Builds one forest of `D` over every vector in a temporary LMDB and runs the queries for
/// each (asked, inspected) setting; with `rescore`, the asked candidates are ranked again by
/// their exact cosine. Returns a JSON object of the build and the rows.
fn forest<D: Distance>(
    w1: &W1<'_>,
    trees: usize,
    settings: &[(usize, usize)],
    rescore: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // SAFETY: a fresh directory of our own, opened once.
    let env = unsafe {
        EnvOpenOptions::new()
            .map_size(4 << 30)
            .max_dbs(1)
            .open(dir.path())?
    };
    let db: Database<D> = env
        .create_databases_and_commit(env.write_txn()?, |opener, wtxn| -> heed::Result<_> {
            Ok(CommitOrAbort::<_, ()>::Commit(
                opener.create_database(wtxn, None)?,
            ))
        })?
        .unwrap_commit();
    let mut wtxn = env.write_txn()?;
    let started = Instant::now();
    let writer = Writer::new(db, 0, DIM);
    for (id, v) in w1.vectors.iter().enumerate() {
        writer.append_item(&mut wtxn, id as u32, v)?;
    }
    let mut rng = StdRng::seed_from_u64(7);
    writer.builder(&mut rng).n_trees(trees).build(&mut wtxn)?;
    wtxn.commit()?;
    let build_s = started.elapsed().as_secs_f64();
    let disk = std::fs::metadata(dir.path().join("data.mdb"))?.len();
    let name = D::name();
    eprintln!("bq_probe: {name}: {trees} trees, built in {build_s:.1} s, {disk} bytes on disk");

    let rtxn = env.read_txn()?;
    let reader = Reader::open(&rtxn, 0, db)?;
    let nq = w1.queries.len() / DIM;
    let mut rows = Vec::new();
    for &(asked, inspected) in settings {
        let mut times = Vec::with_capacity(nq);
        let mut hits = 0usize;
        for (q, query) in w1.queries.chunks_exact(DIM).enumerate() {
            let query = unit(query);
            let t = Instant::now();
            let mut nns = reader.nns(asked);
            nns.search_k(NonZeroUsize::new(inspected).unwrap_or(NonZeroUsize::MIN))
                .oversampling(NonZeroUsize::MIN);
            let found = nns.by_vector(&rtxn, &query)?;
            let mut top: Vec<(f32, u32)> = if rescore {
                found
                    .iter()
                    .map(|&(id, _)| (dot(&w1.vectors[id as usize], &query), id))
                    .collect()
            } else {
                // Ascending distance is descending similarity.
                found.iter().map(|&(id, d)| (-d, id)).collect()
            };
            top.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
            top.truncate(10);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            let expected = &w1.truth[q * w1.per_query..q * w1.per_query + 10];
            hits += top
                .iter()
                .filter(|(_, id)| expected.contains(&i64::from(*id)))
                .count();
        }
        times.sort_unstable_by(f64::total_cmp);
        let recall = hits as f64 / (10 * nq) as f64;
        let at = |q| percentile(&times, q).expect("W1 has Q2 queries");
        let (p50, p99) = (at(0.5), at(0.99));
        eprintln!(
            "bq_probe: {name}: {asked} asked, {inspected} inspected: p50 {p50:.3} ms p99 {p99:.3} ms recall@10 {recall:.4}"
        );
        rows.push(format!(
            "{{\"asked\":{asked},\"inspected\":{inspected},\"p50_ms\":{p50:.3},\"p99_ms\":{p99:.3},\"recall_at_10\":{recall:.4}}}"
        ));
    }
    Ok(format!(
        "{{\"build_s\":{build_s:.1},\"disk_bytes\":{disk},\"rows\":[{}]}}",
        rows.join(",")
    ))
}

//! Crash test: a child process (this test binary, re-run as a writer) records events
//! continuously from several threads and prints every acknowledged id; the parent SIGKILLs
//! it at a random moment, reopens the data directory and checks that the store opens, that
//! every acknowledged record is there, and that both the vector and the keyword index find
//! it. Five kills per backend here; `SHADOWBRAIN_CRASH_ROUNDS=50` for the long run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use shadowbrain_runtime::internals::Filter;
use shadowbrain_runtime::{
    Backend, IndexingOptions, MemoryId, NewMemory, Substrate, SubstrateOptions,
};

const DIR_VAR: &str = "SHADOWBRAIN_CRASH_DIR";
const BACKEND_VAR: &str = "SHADOWBRAIN_CRASH_BACKEND";
const START_VAR: &str = "SHADOWBRAIN_CRASH_START";

fn options(backend: Backend, background: bool) -> SubstrateOptions {
    SubstrateOptions {
        backend,
        indexing: IndexingOptions {
            background,
            // Small builds so kills land during index builds too.
            build_every: 300,
            debounce: Duration::from_millis(50),
            ..IndexingOptions::default()
        },
        ..SubstrateOptions::default()
    }
}

/// A unique word per record, so the keyword index can be asked for exactly that record.
fn token(n: u64) -> String {
    // Letters only: the analyzer keeps it whole and stemming leaves it alone.
    let mut s = String::from("zq");
    let mut n = n;
    loop {
        s.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    s.push_str("xq");
    s
}

/// The writer, run only by the crash tests (re-invoked test binary with `--ignored`).
#[test]
#[ignore = "the crash tests run this as their child process"]
fn crash_writer_child() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let backend: Backend = std::env::var(BACKEND_VAR).unwrap().parse().unwrap();
    let start: u64 = std::env::var(START_VAR).unwrap().parse().unwrap();
    let sub = Substrate::open(Path::new(&dir), options(backend, true)).unwrap();
    let out = Arc::new(Mutex::new(std::io::stdout()));
    println!("READY");
    for t in 0..4u64 {
        let sub = sub.clone();
        let out = out.clone();
        std::thread::spawn(move || {
            let mut n = start + t * 1_000_000;
            loop {
                let batch = 1 + (n % 7) as usize;
                let events: Vec<NewMemory> = (0..batch as u64)
                    .map(|i| {
                        NewMemory::new(
                            "observation",
                            format!("crash event {} {}", n + i, token(n + i)),
                        )
                    })
                    .collect();
                let ids = sub
                    .record_blocking("default", &format!("crash-{t}"), events)
                    .unwrap();
                let mut o = out.lock().unwrap();
                for (i, id) in ids.iter().enumerate() {
                    writeln!(o, "ACK {} {}", id, n + i as u64).unwrap();
                }
                o.flush().unwrap();
                n += batch as u64;
            }
        });
    }
    // The writers never stop: the parent kills this process.
    loop {
        std::thread::park();
    }
}

fn run_child(
    dir: &Path,
    backend: Backend,
    start: u64,
    kill_after: Duration,
) -> Vec<(MemoryId, u64)> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "crash::crash_writer_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(DIR_VAR, dir)
        .env(BACKEND_VAR, backend.as_str())
        .env(START_VAR, start.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(Mutex::new(None::<Instant>));
    let reader = {
        let acked = acked.clone();
        let ready = ready.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.ends_with("READY") {
                    *ready.lock().unwrap() = Some(Instant::now());
                }
                if let Some(rest) = line.strip_prefix("ACK ") {
                    let mut parts = rest.split(' ');
                    let id: MemoryId = parts.next().unwrap().parse().unwrap();
                    let n: u64 = parts.next().unwrap().parse().unwrap();
                    acked.lock().unwrap().push((id, n));
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready.lock().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the writer child never started");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the writer child exited early: {status}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(kill_after);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    Arc::try_unwrap(acked).unwrap().into_inner().unwrap()
}

fn verify(
    dir: &Path,
    backend: Backend,
    acked: &BTreeMap<MemoryId, u64>,
    newest: &[(MemoryId, u64)],
    rng: &mut rand::rngs::StdRng,
) {
    let sub =
        Substrate::open(dir, options(backend, false)).expect("the store reopens after kill -9");
    let store = sub.store();
    // Every acknowledged record ever is in the store, with its own text...
    for (id, n) in acked {
        let r = store
            .get(*id)
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged {id} lost"));
        assert!(
            r.text.ends_with(&token(*n)),
            "{id} holds another record's text: {}",
            r.text
        );
        assert!(r.embedding.is_some(), "{id} lost its embedding");
    }
    // ...and both indexes find those of the last round and a sample of the older ones.
    let all = store.candidates(&Filter {
        namespace: "default",
        ..Default::default()
    });
    let older: Vec<(&MemoryId, &u64)> = acked.iter().collect();
    let sample = (0..200.min(older.len())).map(|_| older[rng.random_range(0..older.len())]);
    for (id, n) in newest.iter().map(|(i, n)| (i, n)).chain(sample) {
        let emb = store.get(*id).unwrap().unwrap().embedding.unwrap();
        let hits = sub.vectors().search(&emb, 3, Some(&all)).unwrap();
        assert!(
            hits.iter().any(|(h, _)| *h == id.0),
            "{id} not found by vector search: {hits:?}"
        );
        let hits = sub.keywords().search(&token(*n), 3, Some(&all)).unwrap();
        assert_eq!(
            hits.first().map(|h| h.0),
            Some(id.0),
            "{id} not found by keyword search"
        );
    }
    sub.close().unwrap();
}

fn crash_rounds(backend: Backend) {
    let rounds: usize = std::env::var("SHADOWBRAIN_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let seed = std::env::var("SHADOWBRAIN_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7u64);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut acked = BTreeMap::new();
    for round in 0..rounds {
        let kill_after = Duration::from_millis(rng.random_range(30..600));
        let got = run_child(dir.path(), backend, round as u64 * 10_000_000, kill_after);
        assert!(
            !got.is_empty() || round > 0,
            "round {round}: the writer acknowledged nothing"
        );
        acked.extend(got.iter().copied());
        verify(dir.path(), backend, &acked, &got, &mut rng);
        eprintln!(
            "{} round {round}: killed after {kill_after:?}; {} acknowledged records all present and searchable",
            backend.as_str(),
            acked.len()
        );
    }
}

#[test]
fn kill_dash_nine_loses_nothing_lmdb() {
    crash_rounds(Backend::Lmdb);
}

#[test]
fn kill_dash_nine_loses_nothing_sled() {
    crash_rounds(Backend::Sled);
}

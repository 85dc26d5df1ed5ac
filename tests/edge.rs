//! The server's edge as an operator meets it: the `serve` binary with a `[server]` section,
//! driven by raw TCP clients that stall, trickle, overstate their bodies or crowd the
//! server, and stopped with SIGTERM while they do.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::http::{Answer, answer, code, header, parse_head};
use crate::common::serve;

/// Whether the server closed `s` within `limit` (a read returns end of stream or a reset).
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => closed_within(s, limit),
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn post_event(addr: SocketAddr, session: &str, text: &str) -> u16 {
    let body = json!({"kind": "observation", "text": text}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/sessions/{session}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    answer(&mut s).0
}

#[test]
fn sigterm_completes_while_clients_hold_half_sent_headers_and_stalled_bodies() {
    // Generous read timeouts, so only the drain deadline can end these connections.
    let mut served = serve::with_server(
        "header_timeout = \"5m\"\nbody_timeout = \"5m\"\ndrain_timeout = \"2s\"",
    )
    .start();
    assert_eq!(
        post_event(served.addr, "s1", "accepted before the stop"),
        201
    );
    let mut half_headers = served.connect();
    half_headers
        .write_all(b"POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Le")
        .unwrap();
    let mut stalled_body = served.connect();
    stalled_body
        .write_all(
            b"POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 200\r\n\r\n{\"kind\": \"observation\", \"te",
        )
        .unwrap();
    // Both are being read by the server before the signal.
    std::thread::sleep(Duration::from_millis(300));
    served.terminate();
    let status = served
        .exit_within(Duration::from_secs(30))
        .expect("SIGTERM completes despite the stalled clients");
    assert!(status.success(), "{status:?}");
    let said = served.said();
    assert!(
        said.contains("were still open at the drain deadline"),
        "{said}"
    );
    assert!(closed_within(&mut half_headers, Duration::from_secs(5)));
    assert!(closed_within(&mut stalled_body, Duration::from_secs(5)));

    // What was acknowledged is there after the stop; the cut request stored nothing.
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(["timeline", "--session", "s1", "--json", "--data"])
        .arg(&served.data)
        .output()
        .unwrap();
    let timeline: Value = serde_json::from_slice(&out.stdout).unwrap();
    let texts: Vec<&str> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["text"].as_str())
        .collect();
    assert_eq!(texts, ["accepted before the stop"]);
}

#[test]
fn a_stop_with_nothing_stalled_answers_what_is_in_flight_and_drains_cleanly() {
    let mut served = serve::with_server("drain_timeout = \"30s\"").start();
    // An idle keep-alive connection does not hold the stop up.
    let mut idle = served.connect();
    write!(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(answer(&mut idle).0, 200);
    served.terminate();
    let status = served
        .exit_within(Duration::from_secs(20))
        .expect("an idle connection is closed at once on a stop");
    assert!(status.success(), "{status:?}");
    let said = served.said();
    assert!(said.contains("drained and flushed; bye"), "{said}");
}

#[test]
fn headers_sent_a_byte_at_a_time_and_idle_connections_are_cut_off() {
    let served = serve::with_server("header_timeout = \"1s\"").start();
    let mut trickle = served.connect();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let started = Instant::now();
    let mut cut = false;
    for byte in request.iter().take(request.len() - 1) {
        if trickle.write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    assert!(
        cut || closed_within(&mut trickle, Duration::from_secs(5)),
        "headers trickled for {:?} and the connection is still open",
        started.elapsed()
    );

    // A keep-alive connection left idle after its answer is closed too.
    let mut idle = served.connect();
    write!(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(answer(&mut idle).0, 200);
    assert!(closed_within(&mut idle, Duration::from_secs(10)));

    // The server still answers everyone else.
    let mut fresh = served.connect();
    write!(
        fresh,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    assert_eq!(answer(&mut fresh).0, 200);
}

#[test]
fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
    let served = serve::with_server("").start();
    let mut s = served.connect();
    // 100 GB announced, nothing sent, and a client that waits for 100 Continue first.
    write!(
        s,
        "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 99999999999\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let (status, headers, body) = answer(&mut s);
    assert_eq!(status, 413, "no 100 Continue, the refusal itself: {body}");
    assert_eq!(code(&body), "body_too_large", "{body}");
    assert!(body.contains("99999999999"), "{body}");
    assert_eq!(header(&headers, "connection"), Some("close"));
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
}

#[test]
fn a_body_that_stops_arriving_is_answered_408() {
    let served = serve::with_server("body_timeout = \"1s\"").start();
    let mut s = served.connect();
    s.write_all(
        b"POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 60\r\n\r\n{\"kind\": \"observation\",",
    )
    .unwrap();
    let (status, _, body) = answer(&mut s);
    assert_eq!(status, 408, "{body}");
    assert_eq!(code(&body), "body_timeout", "{body}");
    // Nothing half-read was stored, and the server goes on.
    assert_eq!(post_event(served.addr, "s1", "after the stalled one"), 201);
}

#[test]
fn connections_past_the_bound_are_refused_at_once_when_all_are_busy_and_slots_come_back() {
    let served = serve::with_server(
        "max_connections = 2\nmax_connections_per_address = 2\nheader_timeout = \"5m\"\n\
         body_timeout = \"5m\"",
    )
    .start();
    // Both connections are answering a request: each body is still arriving.
    let holders: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = served.connect();
            s.write_all(
                b"POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\n\
                  Content-Type: application/json\r\nContent-Length: 60\r\n\r\n{\"kind\"",
            )
            .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut third = served.connect();
    write!(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (status, headers, body) = answer(&mut third);
    assert_eq!(status, 503, "{body}");
    assert_eq!(code(&body), "overloaded", "{body}");
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert!(body.contains("max_connections"), "{body}");
    drop(holders);
    // Once the holders are gone their slots serve again.
    let started = Instant::now();
    loop {
        let mut s = served.connect();
        write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        match answer(&mut s).0 {
            200 => break,
            503 if started.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => panic!("a freed slot answers {other}"),
        }
    }
    // The refusal is counted, and the connection asking is open (a closed one before it
    // may not be reaped yet).
    let (status, _, metrics) = get(served.addr, "/metrics");
    assert_eq!(status, 200);
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} is missing: {metrics}"))
            .to_string()
    };
    assert!(
        value("shadowbrain_http_connections_refused_total")
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let open: u64 = value("shadowbrain_http_connections_open").parse().unwrap();
    assert!((1..=2).contains(&open), "{open}");
    assert_eq!(value("shadowbrain_http_connections_cut_total"), "0");
}

/// `serve` with `config` as its config file: it must refuse to start; its stderr.
fn refused_at_start(config_text: &str) -> String {
    let out = serve::new().config(config_text).output();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_server_section_is_refused_at_start_with_the_key() {
    let err = refused_at_start("[server]\ndrain_timeout = \"soon\"\nmax_connectionz = 3\n");
    assert!(
        err.contains("[server]") && err.contains("max_connectionz"),
        "{err}"
    );
    let err = refused_at_start("[server]\ndrain_timeout = \"soon\"\n");
    assert!(
        err.contains("server.drain_timeout = \"soon\" is not a duration"),
        "{err}"
    );
}

#[test]
fn every_error_answer_has_the_contract_shape() {
    let served = serve::with_server("").start();
    let ask = |request: &str| {
        let mut s = served.connect();
        s.write_all(request.as_bytes()).unwrap();
        answer(&mut s)
    };
    // A method the route does not have: 405 with its Allow header, in the error shape.
    let (status, headers, body) = ask(
        "PUT /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405, "{body}");
    assert_eq!(code(&body), "method_not_allowed", "{body}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert!(
        header(&headers, "allow").is_some_and(|a| a.contains("POST")),
        "{headers:?}"
    );
    // A path segment that is not UTF-8.
    let (status, headers, body) =
        ask("GET /v1/memories/%FF HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "bad_request", "{body}");
    assert!(body.contains("UTF-8"), "{body}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    // A bad query parameter.
    let (status, _, body) = ask(
        "GET /v1/sessions/s1/timeline?limit=many HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!((400..500).contains(&status), "{status} {body}");
    assert!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["message"].is_string(),
        "{body}"
    );
    // Requests hyper refuses before any route sees them.
    let many_headers: String = (0..200).map(|i| format!("X-{i}: y\r\n")).collect();
    for (request, status, expected) in [
        ("GARBAGE\r\n\r\n".to_string(), 400, "bad_request"),
        (
            "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\
             Content-Length: 6\r\n\r\nhello"
                .to_string(),
            400,
            "bad_request",
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)),
            414,
            "uri_too_long",
        ),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n"),
            431,
            "headers_too_large",
        ),
    ] {
        let (got, headers, body) = ask(&request);
        assert_eq!(got, status, "{body}");
        assert_eq!(code(&body), expected, "{body}");
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert_eq!(header(&headers, "connection"), Some("close"));
    }
}

/// Sends a keyed write on a fresh connection; with `read`, returns its answer.
fn keyed_write(addr: SocketAddr, key: &str, body: &str, read: bool) -> Option<Answer> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    read.then(|| answer(&mut s))
}

/// What a one-shot command prints on stdout for `args` then `--data DATA`; it must succeed.
fn command_output(args: &[&str], data: &std::path::Path) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_shadowbrain"))
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn session_texts(data: &std::path::Path) -> Vec<String> {
    let out = command_output(
        &["timeline", "--session", "s1", "--limit", "1000", "--json"],
        data,
    );
    let timeline: Value = serde_json::from_slice(&out).unwrap();
    let mut texts: Vec<String> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["text"].as_str().map(String::from))
        .collect();
    texts.sort();
    texts
}

#[test]
fn a_write_retried_under_its_idempotency_key_is_stored_once_even_across_a_cut_and_a_restart() {
    let served = serve::with_server("").start();
    let body =
        |i: usize| json!({"kind": "observation", "text": format!("event {i:02}")}).to_string();

    // Answered, then retried: the same ids, marked as a replay.
    let (status, _, first) = keyed_write(served.addr, "key-00", &body(0), true).unwrap();
    assert_eq!(status, 201, "{first}");
    let (status, headers, again) = keyed_write(served.addr, "key-00", &body(0), true).unwrap();
    assert_eq!(status, 201, "{again}");
    assert_eq!(again, first);
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    // The key with another request: refused.
    let (status, _, other) = keyed_write(served.addr, "key-00", &body(99), true).unwrap();
    assert_eq!(
        (status, code(&other).as_str()),
        (422, "invalid_idempotency_key"),
        "{other}"
    );

    // Which writes of session s1 have committed, by text (read over HTTP: the server
    // holds the directory).
    let committed_now = |addr: SocketAddr| -> std::collections::HashSet<String> {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET /v1/sessions/s1/timeline?limit=100 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let timeline: Value = serde_json::from_str(&answer(&mut s).2).unwrap();
        timeline["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["text"].as_str().map(String::from))
            .collect()
    };
    // Keys 1-5: the connection is cut just after the commit, before the answer is read.
    // Keys 6-10: cut at once, so the write may or may not have committed. Half are
    // retried on this server, half after a restart.
    for i in 1..=10 {
        let mut s = TcpStream::connect(served.addr).unwrap();
        let body = body(i);
        write!(
            s,
            "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Idempotency-Key: key-{i:02}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        if i <= 5 {
            let started = Instant::now();
            while !committed_now(served.addr).contains(&format!("event {i:02}")) {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "event {i:02} never committed"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        drop(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let committed = committed_now(served.addr);
    let mut answers = Vec::new();
    let mut replays = Vec::new();
    let mut retry = |addr: SocketAddr, i: usize| {
        let (status, headers, ids) =
            keyed_write(addr, &format!("key-{i:02}"), &body(i), true).unwrap();
        assert_eq!(status, 201, "{ids}");
        replays.push((i, header(&headers, "idempotent-replayed") == Some("true")));
        answers.push(ids);
    };
    for i in 1..=5 {
        retry(served.addr, i);
    }
    let served = served.restart();
    for i in 6..=10 {
        retry(served.addr, i);
    }
    // A retry of a write that committed is a replay (keys 1-5 always are); one whose write
    // was lost with its connection writes it now. (A write still in flight when
    // `committed` was read may go either way.)
    for (i, replayed) in replays {
        let was_committed = committed.contains(&format!("event {i:02}"));
        assert!(
            replayed || !was_committed,
            "key-{i:02}: committed, yet not replayed"
        );
        assert!(replayed || i > 5, "key-{i:02}");
    }
    // Retrying again after the restart answers what the first retries answered.
    for i in 1..=5 {
        let (_, headers, ids) =
            keyed_write(served.addr, &format!("key-{i:02}"), &body(i), true).unwrap();
        assert_eq!(ids, answers[i - 1]);
        assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    }
    // Read once the server has let go of the directory, before the directory goes.
    let mut served = served;
    served.terminate();
    served
        .exit_within(Duration::from_secs(60))
        .expect("the server stops");
    let expected: Vec<String> = (0..=10).map(|i| format!("event {i:02}")).collect();
    assert_eq!(
        session_texts(&served.data),
        expected,
        "each write stored exactly once"
    );
}

#[test]
fn a_body_that_is_not_json_is_refused_with_415() {
    let served = serve::with_server("").start();
    let send = |content_type: &str| {
        let body = r#"{"kind": "observation", "text": "typed"}"#;
        let mut s = served.connect();
        write!(
            s,
            "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\n{content_type}\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        answer(&mut s)
    };
    for refused in [
        "Content-Type: text/plain\r\n",
        "Content-Type: application/x-www-form-urlencoded\r\n",
    ] {
        let (status, _, body) = send(refused);
        assert_eq!(status, 415, "{refused}: {body}");
        assert_eq!(code(&body), "unsupported_media_type", "{body}");
        assert!(body.contains("application/json"), "{body}");
    }
    for accepted in [
        "Content-Type: application/json\r\n",
        "Content-Type: Application/JSON; charset=utf-8\r\n",
        "Content-Type: application/merge-patch+json\r\n",
        "",
    ] {
        let (status, _, body) = send(accepted);
        assert_eq!(status, 201, "{accepted:?}: {body}");
    }
    // A body-less POST is not asked for a type.
    let mut s = served.connect();
    write!(
        s,
        "POST /v1/sessions/s1/condense HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    assert_eq!(answer(&mut s).0, 200);
}

#[test]
fn guessing_keys_from_one_address_is_throttled() {
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(b"the-good-key")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let served = serve::with_server(&format!(
        "\n[[auth.keys]]\nsha256 = \"{hash}\"\nnamespace = \"acme\""
    ))
    .start();
    let ask = |s: &mut TcpStream, key: &str| {
        write!(
            s,
            "GET /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
        )
        .unwrap();
        answer(s)
    };
    let mut s = served.connect();
    assert_eq!(ask(&mut s, "the-good-key").0, 200);
    // One keep-alive connection guessing as fast as it can.
    let statuses: Vec<u16> = (0..30)
        .map(|i| ask(&mut s, &format!("guess-{i}")).0)
        .collect();
    assert_eq!(statuses[..20], [401; 20], "{statuses:?}");
    assert_eq!(statuses[20..], [429; 10], "{statuses:?}");
    // Blocked for the window, whatever the wrong key and the connection; the server is fine.
    let mut other = served.connect();
    let (status, headers, body) = ask(&mut other, "another-guess");
    assert_eq!(status, 429, "{body}");
    assert_eq!(code(&body), "too_many_failed_auth", "{body}");
    let wait: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let mut health = served.connect();
    write!(
        health,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    assert_eq!(
        answer(&mut health).0,
        200,
        "what needs no key still answers"
    );
}

#[test]
fn a_client_trickling_its_body_holds_no_admission_slot() {
    // One slot each; a write and a recall whose bodies trickle.
    let served =
        serve::with_server("max_writes = 1\nmax_recalls = 1\nbody_timeout = \"30s\"").start();
    let event = r#"{"kind": "observation", "text": "the slow one"}"#;
    let recall = r#"{"query": "the slow one"}"#;
    let mut trickling = Vec::new();
    for (path, body) in [("events", event), ("recall", recall)] {
        let mut s = served.connect();
        write!(
            s,
            "POST /v1/sessions/s1/{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.len(),
            &body[..5]
        )
        .unwrap();
        trickling.push((s, &body[5..]));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Others are answered meanwhile: the slots are free until a body has arrived whole.
    for (path, body, status) in [("events", event, 201), ("recall", recall, 200)] {
        let mut s = served.connect();
        write!(
            s,
            "POST /v1/sessions/s1/{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let (got, _, answer_body) = answer(&mut s);
        assert_eq!(got, status, "{path}: {answer_body}");
    }
    let mut statuses = Vec::new();
    for (mut s, rest) in trickling {
        s.write_all(rest.as_bytes()).unwrap();
        statuses.push(answer(&mut s).0);
    }
    assert_eq!(statuses, [201, 200]);
}

/// Whether this machine lets a test mount a small filesystem of its own (`unshare` into
/// new user and mount namespaces). CI sets `SHADOWBRAIN_REQUIRE_TMPFS=1`, so there a
/// machine that cannot fails the test instead of skipping it.
fn can_mount_tmpfs() -> bool {
    let ok = Command::new("unshare")
        .args(["--map-root-user", "--mount", "sh", "-c"])
        .arg(
            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs \"$d\"; s=$?; rmdir \"$d\"; exit $s",
        )
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var_os("SHADOWBRAIN_REQUIRE_TMPFS").is_some() {
        panic!(
            "SHADOWBRAIN_REQUIRE_TMPFS is set but `unshare --map-root-user --mount` cannot mount a tmpfs here"
        );
    }
    ok
}

/// Posts a batch of `n` events of about 1 KiB; the status, the body and the ids written.
fn post_batch(addr: SocketAddr, session: &str, tag: &str, n: usize) -> (u16, String, Vec<String>) {
    let filler = "the deploy runner moved regions and the lesson was written down ".repeat(16);
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"kind": "observation", "text": format!("{tag} {i} {filler}")}))
        .collect();
    let body = json!({ "events": events }).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/sessions/{session}/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (status, _, body) = answer(&mut s);
    let ids = match status {
        201 => serde_json::from_str::<Value>(&body).unwrap()["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_str().unwrap().to_string())
            .collect(),
        _ => Vec::new(),
    };
    (status, body, ids)
}

/// A plain GET on a fresh connection.
fn get(addr: SocketAddr, path: &str) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    answer(&mut s)
}

/// Writes batches until one is refused; the ids acknowledged before, and that answer.
fn fill(addr: SocketAddr, tag: &str, acked: &mut Vec<String>) -> (u16, String) {
    for round in 0..10_000 {
        let (status, body, ids) = post_batch(addr, &format!("s{}", round % 4), tag, 50);
        if status != 201 {
            return (status, body);
        }
        acked.extend(ids);
    }
    panic!("the disk never filled");
}

#[test]
fn a_full_disk_answers_507_keeps_serving_reads_and_resumes_when_space_returns() {
    if !can_mount_tmpfs() {
        eprintln!("skipped: this machine cannot mount a tmpfs in a user namespace");
        return;
    }
    let serve = serve::new();
    let disk = serve.dir().join("disk");
    std::fs::create_dir(&disk).unwrap();
    // The server runs on a 24 MiB filesystem of its own, in a mount namespace that ends
    // with it; `exec` makes the child's pid the server's.
    let mut unshare = Command::new("unshare");
    unshare
        .args(["--map-root-user", "--mount", "sh", "-c"])
        .arg("mount -t tmpfs -o size=24m tmpfs \"$1\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(&disk);
    let mut served = serve
        .config("[embedder]\nkind = \"hash\"\n")
        .data(disk.join("data"))
        .within(&unshare)
        .start();
    let addr = served.addr;
    let resize = |size: &str| {
        let status = Command::new("nsenter")
            .args([
                "-t",
                &served.child.id().to_string(),
                "-U",
                "-m",
                "--preserve-credentials",
            ])
            .args(["mount", "-o", &format!("remount,size={size}")])
            .arg(&disk)
            .status()
            .unwrap();
        assert!(status.success(), "resizing the server's filesystem");
    };

    let mut acked = Vec::new();
    let (status, body) = fill(addr, "first", &mut acked);
    assert_eq!(status, 507, "{body}");
    assert_eq!(code(&body), "storage_full", "{body}");
    assert!(body.contains("free space"), "says what to do: {body}");
    assert!(acked.len() >= 50, "some writes fit first: {}", acked.len());
    // Still full (what fits in the space a refused commit left is taken): refused the
    // same way, never a 500; reads keep working.
    let (status, body) = fill(addr, "again", &mut acked);
    assert_eq!(
        (status, code(&body).as_str()),
        (507, "storage_full"),
        "{body}"
    );
    let (status, _, body) = get(addr, &format!("/v1/memories/{}", acked[0]));
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = get(addr, "/v1/sessions");
    assert_eq!(status, 200, "{body}");

    // Space returns: writes resume by themselves, without a restart.
    resize("32m");
    let started = Instant::now();
    let resumed = loop {
        let (status, body, ids) = post_batch(addr, "s9", "resumed", 5);
        if status == 201 {
            acked.extend(ids);
            break started.elapsed();
        }
        assert_eq!(status, 507, "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "writes never resumed: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Full again, then stopped while full: a clean drain and exit 0, whatever the indexes
    // could not save (the next start builds it from the store).
    let (status, body) = fill(addr, "second", &mut acked);
    assert_eq!(
        (status, code(&body).as_str()),
        (507, "storage_full"),
        "{body}"
    );
    // Nothing acknowledged was lost: every id reads back.
    for id in &acked {
        let (status, _, body) = get(addr, &format!("/v1/memories/{id}"));
        assert_eq!(status, 200, "{id}: {body}");
    }
    served.terminate();
    let status = served
        .exit_within(Duration::from_secs(60))
        .expect("the server stops on a full disk");
    let said = served.said();
    assert!(status.success(), "{status:?}: {said}");
    eprintln!(
        "{} events acknowledged, writes resumed {resumed:?} after space returned",
        acked.len()
    );
}

/// One request on a keep-alive connection (opened again when the server closed it); the
/// answer, or the I/O error.
fn keep_alive(
    conn: &mut Option<TcpStream>,
    addr: SocketAddr,
    request: &str,
) -> std::io::Result<Answer> {
    if conn.is_none() {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        *conn = Some(s);
    }
    let s = conn.as_mut().expect("connected above");
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let (head_len, length) = loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            *conn = None;
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            break (at + 4, length);
        }
    };
    while raw.len() < head_len + length {
        let n = s.read(&mut buf)?;
        if n == 0 {
            *conn = None;
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_at(head_len);
    let (status, headers) = parse_head(head.trim_end());
    if header(&headers, "connection") == Some("close") {
        *conn = None;
    }
    Ok((status, headers, body.to_string()))
}

/// The ids of every record in an exported data directory.
fn exported_ids(data: &std::path::Path) -> std::collections::HashSet<String> {
    let out = command_output(&["export"], data);
    String::from_utf8(out)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["record"]["id"].as_str().map(str::to_string))
        .collect()
}

/// A small soak, run by CI: writers, recallers, slow and idle clients at once, then SIGTERM.
/// No answer but 200/201 before the stop, a drain within its deadline, exit 0, and every
/// acknowledged event in the store afterwards. `SHADOWBRAIN_SOAK_SECS` makes it longer
/// (default 5).
#[test]
fn soak_mixed_load_with_slow_clients_then_sigterm_loses_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let secs: u64 = std::env::var("SHADOWBRAIN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut served = serve::with_server("drain_timeout = \"2s\"").start();
    let addr = served.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut clients = Vec::new();
    for writer in 0..6u64 {
        let (stop, acked, wrong, answered) =
            (stop.clone(), acked.clone(), wrong.clone(), answered.clone());
        clients.push(std::thread::spawn(move || {
            let mut conn = None;
            let mut n = writer;
            while !stop.load(Ordering::Relaxed) {
                n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let (session, size) = ((n >> 33) % 200, 1 + (n >> 17) % 20);
                let events: Vec<Value> = (0..size)
                    .map(|i| json!({"kind": "observation", "text": format!("writer {writer} wrote {i} of {n} about runner regions")}))
                    .collect();
                let body = json!({ "events": events }).to_string();
                let request = format!(
                    "POST /v1/sessions/s{session}/events HTTP/1.1\r\nHost: x\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                match keep_alive(&mut conn, addr, &request) {
                    Ok((201, _, body)) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                        let ids = serde_json::from_str::<Value>(&body).unwrap()["ids"].clone();
                        let mut acked = acked.lock().unwrap();
                        for id in ids.as_array().unwrap() {
                            acked.push(id.as_str().unwrap().to_string());
                        }
                    }
                    Ok((status, _, body)) if !stop.load(Ordering::Relaxed) => {
                        wrong.lock().unwrap().push(format!("write {status}: {body}"));
                    }
                    Err(e) if !stop.load(Ordering::Relaxed) => {
                        wrong.lock().unwrap().push(format!("write: {e}"));
                    }
                    // After the stop: refusals and cut connections are expected.
                    _ => conn = None,
                }
            }
        }));
    }
    for reader in 0..3u64 {
        let (stop, wrong, answered) = (stop.clone(), wrong.clone(), answered.clone());
        clients.push(std::thread::spawn(move || {
            let mut conn = None;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let body = json!({"query": format!("where did writer {} put the runner?", n % 6), "k": 8, "scope": "namespace"}).to_string();
                let request = format!(
                    "POST /v1/sessions/s{}/recall HTTP/1.1\r\nHost: x\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    (n + reader) % 200,
                    body.len()
                );
                match keep_alive(&mut conn, addr, &request) {
                    Ok((200, _, _)) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((status, _, body)) if !stop.load(Ordering::Relaxed) => {
                        wrong.lock().unwrap().push(format!("recall {status}: {body}"));
                    }
                    Err(e) if !stop.load(Ordering::Relaxed) => {
                        wrong.lock().unwrap().push(format!("recall: {e}"));
                    }
                    _ => conn = None,
                }
            }
        }));
    }
    // Slow clients: bodies trickled a byte at a time, and connections left idle.
    let mut slow = Vec::new();
    for i in 0..4 {
        let mut s = served.connect();
        let body = json!({"kind": "observation", "text": format!("slow client {i}")}).to_string();
        write!(
            s,
            "POST /v1/sessions/slow/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        slow.push((s, body));
    }
    let idle: Vec<TcpStream> = (0..4).map(|_| served.connect()).collect();
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        for (s, body) in &mut slow {
            if let Some(b) = body.as_bytes().get(sent..sent + 1) {
                let _ = s.write_all(b);
            }
        }
        // Never the last byte: these requests are in flight when the stop comes.
        sent = (sent + 1).min(10);
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let stopping = Instant::now();
    served.terminate();
    let status = served
        .exit_within(Duration::from_secs(30))
        .expect("the drain ends");
    let drained = stopping.elapsed();
    for client in clients {
        client.join().unwrap();
    }
    drop((slow, idle));
    let said = served.said();
    assert!(status.success(), "{status:?}: {said}");
    // The drain deadline (2 s), then the actors finish their mailboxes (bounded by the
    // runtime's call timeout) and the store closes (a tree build in progress gives up):
    // measured 8-10 s in a debug build after 23k events.
    assert!(
        drained < Duration::from_secs(30),
        "the drain took {drained:?}: {said}"
    );
    let wrong = wrong.lock().unwrap();
    assert!(
        wrong.is_empty(),
        "{} wrong answers, first: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    let acked = acked.lock().unwrap();
    let stored = exported_ids(&served.data);
    let lost: Vec<&String> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged events lost: {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        acked.len() > 100,
        "the writers got through: {}",
        acked.len()
    );
    eprintln!(
        "soak {secs}s: {} answers, {} events acknowledged and all stored, drained in {drained:?}",
        answered.load(Ordering::Relaxed),
        acked.len()
    );
}

#[test]
fn a_request_past_its_deadline_is_abandoned_with_503() {
    let served = serve::with_server("request_timeout = \"300ms\"").start();
    // A write whose body stops half way (well within body_timeout's 30 s between chunks):
    // the deadline, not the body timeout, ends it.
    let body = r#"{"kind": "observation", "text": "half of it"}"#;
    let mut s = served.connect();
    write!(
        s,
        "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..10]
    )
    .unwrap();
    let started = Instant::now();
    let (status, headers, answer_body) = answer(&mut s);
    assert_eq!(
        (status, code(&answer_body).as_str()),
        (503, "timeout"),
        "{answer_body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        answer_body.contains("server.request_timeout"),
        "{answer_body}"
    );
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(header(&headers, "connection"), Some("close"));
    // Its admission slot is free again, and a whole request fits in the deadline (retried:
    // other tests may be loading the machine).
    let started = Instant::now();
    while post_event(served.addr, "s1", "a short one") != 201 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "writes never fit again"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The scheduling policy of the thread at `task` (`/proc/PID/task/TID`): `stat` field 41,
/// 0 normal, 1 `SCHED_FIFO`.
fn policy_of(task: &std::path::Path) -> Option<u32> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // Fields from the third on follow the command's closing parenthesis.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(41 - 3)?.parse().ok()
}

/// The scheduling policy of the thread of `pid` named `name`, once it exists.
fn thread_policy(pid: u32, name: &str) -> u32 {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                return policy_of(&task).expect("a readable stat");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no thread {name} in process {pid}");
}

#[test]
fn the_edge_thread_runs_at_real_time_priority_only_when_asked() {
    // Whether this process may: the server, its child, may then too.
    let allowed = std::thread::spawn(|| shadowbrain::http::raise_to_realtime().is_ok())
        .join()
        .unwrap();
    let plain = serve::with_server("").start();
    assert_eq!(thread_policy(plain.child.id(), "shadowbrain-edg"), 0);
    drop(plain);

    let asked = serve::with_server("edge_realtime = true").start();
    let policy = thread_policy(asked.child.id(), "shadowbrain-edg");
    if allowed {
        assert_eq!(policy, 1, "SCHED_FIFO");
        // No other thread is: not the workers that answer requests, nor any it started.
        assert_eq!(post_event(asked.addr, "s", "first"), 201);
        let realtime = std::fs::read_dir(format!("/proc/{}/task", asked.child.id()))
            .unwrap()
            .filter(|t| policy_of(&t.as_ref().unwrap().path()).is_some_and(|p| p != 0))
            .count();
        assert_eq!(realtime, 1);
    } else {
        assert_eq!(policy, 0);
        let said = asked.said();
        assert!(
            said.contains("real-time priority was refused") && said.contains("CAP_SYS_NICE"),
            "{said}"
        );
    }
    // It serves as ever.
    assert_eq!(post_event(asked.addr, "s", "hello"), 201);
}

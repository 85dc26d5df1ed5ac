//! Real use and abuse of `serve`, each through the binary: bursts past the admission slots,
//! idle keep-alive pools past the connection bound, one client's wrong keys beside another's
//! right ones, an oversized body from Python's usual HTTP clients, and what one tenant or
//! visitor could do to another (sign-in floods, open redirects, MCP sessions, a proxy's
//! forwarded address and scheme).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::config::sha256_hex;
use crate::common::http::{Answer, answer, code, header};
use crate::common::python::python_sdk;
use crate::common::serve;

/// One request on `s` (kept open), its answer.
fn exchange(s: &mut TcpStream, method: &str, path: &str, extra: &str, body: &str) -> Answer {
    // JSON unless the extra headers say otherwise (a form).
    let json = match extra.to_ascii_lowercase().contains("content-type:") {
        true => "",
        false => "Content-Type: application/json\r\n",
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{json}{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    answer(s)
}

/// `GET /v1/sessions` on `s` with `key`: its status.
fn sessions_as(s: &mut TcpStream, key: &str) -> u16 {
    let auth = format!("Authorization: Bearer {key}\r\n");
    exchange(s, "GET", "/v1/sessions", &auth, "").0
}

fn keys(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(key, ns)| {
            format!(
                "\n[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"{ns}\"",
                sha256_hex(key)
            )
        })
        .collect()
}

#[test]
fn a_burst_of_recalls_past_the_slots_waits_its_turn_instead_of_being_refused() {
    // Two slots; 24 recalls at once, each from its own connection. The wait allowed is
    // long: this debug build ranks far slower than a release one, and the point here is
    // that a burst waits (with `queue_wait = "0s"`, as before, 22 of them were refused).
    let served = serve::with_server("max_recalls = 2\nqueue_wait = \"10s\"").start();
    let mut s = served.connect();
    let events: Vec<Value> = (0..50)
        .map(|i| json!({"kind": "observation", "text": format!("note {i} about the deploy")}))
        .collect();
    let (status, _, body) = exchange(
        &mut s,
        "POST",
        "/v1/sessions/s1/events",
        "",
        &json!({"events": events}).to_string(),
    );
    assert_eq!(status, 201, "{body}");
    let addr = served.addr;
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..24)
            .map(|_| {
                scope.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let body = json!({"query": "the deploy", "k": 10}).to_string();
                    exchange(&mut s, "POST", "/v1/sessions/s1/recall", "", &body).0
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(
        statuses,
        vec![200; 24],
        "every recall of the burst is answered"
    );
}

/// `n` requests sent together, each on its own keep-alive connection; each one's answer,
/// and then the answer to the same request sent again on its connection.
fn burst(addr: SocketAddr, n: usize, path: &str, body: &str) -> Vec<(Answer, u16)> {
    let start = std::sync::Barrier::new(n);
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..n)
            .map(|_| {
                let start = &start;
                scope.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    start.wait();
                    let first = exchange(&mut s, "POST", path, "", body);
                    let again = exchange(&mut s, "POST", path, "", body).0;
                    (first, again)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn at_saturation_a_refusal_says_how_long_the_wait_is_and_keeps_the_connection() {
    // One slot and no queue: a burst is refused past the one being answered.
    let served = serve::with_server("max_recalls = 1\nmax_queued = 0").start();
    let recall = r#"{"query": "anything"}"#;
    let answers = burst(served.addr, 32, "/v1/sessions/s1/recall", recall);
    let refused: Vec<_> = answers
        .iter()
        .filter(|((status, _, _), _)| *status == 503)
        .collect();
    assert!(
        !refused.is_empty(),
        "32 recalls at once on one slot: none refused?"
    );
    for ((_, headers, body), again) in &refused {
        assert_eq!(code(body), "overloaded", "{body}");
        assert!(
            body.contains("queue is full") && body.contains("max_recalls"),
            "{body}"
        );
        let v: Value = serde_json::from_str(body).unwrap();
        assert!(
            v["error"]["retry_after_ms"]
                .as_u64()
                .is_some_and(|ms| ms >= 1),
            "{body}"
        );
        let seconds: u64 = header(headers, "retry-after").unwrap().parse().unwrap();
        assert!(seconds >= 1, "{seconds}");
        // The body was read before the refusal: the connection carries the next request.
        assert_ne!(header(headers, "connection"), Some("close"));
        assert!(
            *again == 200 || *again == 503,
            "the connection was reused: {again}"
        );
    }
    assert!(answers.iter().any(|((status, _, _), _)| *status == 200));
}

#[test]
fn idle_keep_alive_connections_past_the_bound_make_room_for_working_clients() {
    // 2,000 idle keep-alive connections (each answered once, then silent) against a bound
    // of 1,024, then 20 working clients: none of them sees an error. What is tested is the
    // connection bound, not admission: a recall waits for a slot as long as it takes, or a
    // machine busy with other suites would have it refused with `overloaded`, as designed.
    let served =
        serve::with_server("max_connections = 1024\nheader_timeout = \"5m\"\nqueue_wait = \"60s\"")
            .start();
    let mut idle = Vec::new();
    for _ in 0..2_000 {
        let mut s = served.connect();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        // An evicted connection may have been closed before it was answered: it is only
        // held, as a pool would, and its answer does not matter here.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf);
        idle.push(s);
    }
    let addr = served.addr;
    let failures: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..20)
            .map(|c| {
                scope.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    let mut failed = Vec::new();
                    for i in 0..25 {
                        let (path, body) = match i % 2 {
                            0 => ("events", json!({"kind": "observation", "text": format!("client {c} step {i}")})),
                            _ => ("recall", json!({"query": format!("client {c}")})),
                        };
                        let (status, _, answer) =
                            exchange(&mut s, "POST", &format!("/v1/sessions/w{c}/{path}"), "", &body.to_string());
                        if status >= 400 {
                            failed.push(format!("{status} {answer}"));
                        }
                    }
                    failed
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "working clients failed: {failures:?}");
    let (_, _, metrics) = {
        let mut s = served.connect();
        exchange(&mut s, "GET", "/metrics", "", "")
    };
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("shadowbrain_http_connections_evicted_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the eviction counter");
    assert!(evicted >= 976, "idle connections made room: {evicted}");
    drop(idle);
}

#[test]
fn wrong_keys_from_an_address_never_lock_out_a_valid_key_from_it() {
    let served = serve::with_server(&keys(&[("good-key", "acme")])).start();
    let mut good = served.connect();
    assert_eq!(sessions_as(&mut good, "good-key"), 200);
    // A misconfigured agent on the same host: 270 wrong keys.
    let mut bad = served.connect();
    let statuses: Vec<u16> = (0..270)
        .map(|i| sessions_as(&mut bad, &format!("wrong-{i}")))
        .collect();
    assert_eq!(statuses[..20], [401; 20]);
    assert!(statuses[20..].iter().all(|&s| s == 429), "{statuses:?}");
    // The valid key keeps working, on the old connection and on a new one.
    assert_eq!(sessions_as(&mut good, "good-key"), 200);
    let mut fresh = served.connect();
    assert_eq!(sessions_as(&mut fresh, "good-key"), 200);
    // And the dashboard's sign-in with it too, while wrong ones stay refused.
    let (status, _, _) = exchange(
        &mut fresh,
        "POST",
        "/ui/login",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        "key=good-key&next=%2F",
    );
    assert_eq!(status, 303);
}

/// Python's `http.client` (what `urllib` uses) and `requests` send a 9 MiB body without
/// waiting for `100 Continue`: each must read the 413 and its JSON error.
#[test]
fn an_oversized_body_from_python_clients_gets_its_413_not_a_reset() {
    let Some(python) = python_sdk() else { return };
    let served = serve::with_server("").start();
    let script = r#"
import http.client, json, sys, requests
host, port = sys.argv[1], int(sys.argv[2])
body = b'{"kind": "observation", "text": "' + b"x" * (9 << 20) + b'"}'
out = {}
c = http.client.HTTPConnection(host, port, timeout=30)
c.request("POST", "/v1/sessions/s1/events", body=body, headers={"Content-Type": "application/json"})
r = c.getresponse()
out["http.client"] = [r.status, json.loads(r.read())["error"]["code"]]
r = requests.post(f"http://{host}:{port}/v1/sessions/s1/events", data=body, headers={"Content-Type": "application/json"}, timeout=30)
out["requests"] = [r.status_code, r.json()["error"]["code"]]
print(json.dumps(out))
"#;
    for round in 0..3 {
        let out = Command::new(&python)
            .args(["-c", script, "127.0.0.1", &served.addr.port().to_string()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "round {round}: the Python client failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answers: Value = serde_json::from_slice(&out.stdout).unwrap();
        for client in ["http.client", "requests"] {
            assert_eq!(
                answers[client],
                json!([413, "body_too_large"]),
                "{client}: {answers}"
            );
        }
    }
    // Raw TCP, the whole body written before reading: the answer is there to read.
    let mut s = served.connect();
    let body = vec![b'x'; 9 << 20];
    write!(
        s,
        "POST /v1/sessions/s1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(&body)
        .expect("the server reads what it refuses instead of resetting");
    let (status, _, answer_body) = answer(&mut s);
    assert_eq!(
        (status, code(&answer_body)),
        (413, "body_too_large".to_string())
    );
}

#[test]
fn a_flood_of_sign_ins_with_one_key_signs_nobody_else_out() {
    let served = serve::with_server(&keys(&[("key-a", "alpha"), ("key-b", "beta")])).start();
    let sign_in = |key: &str| {
        let mut s = served.connect();
        exchange(
            &mut s,
            "POST",
            "/ui/login",
            "Content-Type: application/x-www-form-urlencoded\r\n",
            &format!("key={key}&next=%2F"),
        )
    };
    let (status, headers, _) = sign_in("key-b");
    assert_eq!(status, 303);
    let cookie = header(&headers, "set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let statuses: Vec<u16> = (0..40).map(|_| sign_in("key-a").0).collect();
    assert_eq!(statuses[..20], [303; 20]);
    assert!(statuses[20..].iter().all(|&s| s == 429), "{statuses:?}");
    let mut s = served.connect();
    let (status, _, _) = exchange(
        &mut s,
        "GET",
        "/ui/sessions",
        &format!("Cookie: {cookie}\r\n"),
        "",
    );
    assert_eq!(status, 200, "the other tenant's visitor is still signed in");
}

#[test]
fn after_sign_in_the_next_page_is_always_on_this_server() {
    let served = serve::with_server(&keys(&[("key-a", "alpha")])).start();
    for next in [
        "%2F%09%2Fevil.example",
        "%2F%2Fevil.example",
        "%2F%5Cevil.example",
        "%2F%0A%2Fevil.example",
        "https%3A%2F%2Fevil.example",
        "https:evil.example",
        "%5C%5Cevil.example",
        "%2F%E3%80%82%2Fevil.example",
        "%2F%20%2Fevil.example",
    ] {
        let mut s = served.connect();
        let (status, headers, _) = exchange(
            &mut s,
            "POST",
            "/ui/login",
            "Content-Type: application/x-www-form-urlencoded\r\n",
            &format!("key=key-a&next={next}"),
        );
        assert_eq!(status, 303, "{next}");
        assert_eq!(header(&headers, "location"), Some("/"), "{next}");
    }
    let mut s = served.connect();
    let (_, headers, _) = exchange(
        &mut s,
        "POST",
        "/ui/login",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        "key=key-a&next=%2Fui%2Fsearch%3Fq%3Dx",
    );
    assert_eq!(header(&headers, "location"), Some("/ui/search?q=x"));
}

/// The MCP handshake over raw HTTP: initialize, then the `initialized` notification.
fn mcp_session(addr: SocketAddr, key: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "abuse-test", "version": "0"}}});
    let extra = format!(
        "Authorization: Bearer {key}\r\nAccept: application/json, text/event-stream\r\n\
         Connection: close\r\n"
    );
    let (status, headers, body) = exchange(&mut s, "POST", "/mcp", &extra, &init.to_string());
    assert_eq!(status, 200, "{body}");
    header(&headers, "mcp-session-id")
        .expect("a session id")
        .to_string()
}

#[test]
fn an_mcp_session_answers_only_the_key_that_opened_it() {
    let served = serve::with_server(&keys(&[("key-a", "alpha"), ("key-b", "beta")])).start();
    let session = mcp_session(served.addr, "key-a");
    let mut s = served.connect();
    let (status, _, body) = exchange(
        &mut s,
        "DELETE",
        "/mcp",
        &format!("Authorization: Bearer key-b\r\nMcp-Session-Id: {session}\r\n"),
        "",
    );
    assert_eq!(status, 404, "another tenant's key cannot end it: {body}");
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string();
    let extra = |key: &str| {
        format!(
            "Authorization: Bearer {key}\r\nAccept: application/json, text/event-stream\r\n\
             Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-06-18\r\nConnection: close\r\n"
        )
    };
    let mut s = served.connect();
    assert_eq!(
        exchange(&mut s, "POST", "/mcp", &extra("key-b"), &ping).0,
        404,
        "nor use it"
    );
    let mut s = served.connect();
    let (status, _, body) = exchange(&mut s, "POST", "/mcp", &extra("key-a"), &ping);
    assert_eq!(status, 200, "its own key still can: {body}");
    let mut s = served.connect();
    let (status, _, _) = exchange(
        &mut s,
        "DELETE",
        "/mcp",
        &format!("Authorization: Bearer key-a\r\nMcp-Session-Id: {session}\r\n"),
        "",
    );
    assert_eq!(status, 204);
}

#[test]
fn behind_a_trusted_proxy_the_cookie_is_secure_and_the_throttle_counts_the_forwarded_client() {
    let served = serve::with_server(&format!(
        "trusted_proxies = [\"127.0.0.1\"]{}",
        keys(&[("key-a", "alpha")])
    ))
    .start();
    let mut s = served.connect();
    let form = "Content-Type: application/x-www-form-urlencoded\r\n";
    let (status, headers, _) = exchange(
        &mut s,
        "POST",
        "/ui/login",
        &format!("{form}X-Forwarded-Proto: https\r\nX-Forwarded-For: 203.0.113.9\r\n"),
        "key=key-a&next=%2F",
    );
    assert_eq!(status, 303);
    let cookie = header(&headers, "set-cookie").unwrap();
    assert!(
        cookie.starts_with("__Host-shadowbrain_ui=") && cookie.contains("; Secure"),
        "{cookie}"
    );
    let mut s = served.connect();
    let (_, headers, _) = exchange(&mut s, "POST", "/ui/login", form, "key=key-a&next=%2F");
    let cookie = header(&headers, "set-cookie").unwrap();
    assert!(
        cookie.starts_with("shadowbrain_ui=") && !cookie.contains("Secure"),
        "{cookie}"
    );
    // Wrong keys from one forwarded client block that client, not the proxy's others.
    let from = |ip: &str, key: &str| {
        let mut s = served.connect();
        exchange(
            &mut s,
            "GET",
            "/v1/sessions",
            &format!("X-Forwarded-For: {ip}\r\nAuthorization: Bearer {key}\r\n"),
            "",
        )
        .0
    };
    let statuses: Vec<u16> = (0..25)
        .map(|i| from("198.51.100.7", &format!("wrong-{i}")))
        .collect();
    assert_eq!(statuses[20..], [429; 5]);
    assert_eq!(
        from("198.51.100.8", "wrong"),
        401,
        "another client behind the proxy is not blocked"
    );
}

//! HTTP/1.1 over plain sockets, as the tests speak to a server: whole exchanges with the
//! body read as JSON ([`http`], [`post`]) for what the API answers, and answers read off a
//! connection the test drives itself ([`answer`]) for the requests no client library would
//! send (half-sent, trickled, oversized, repeated on one keep-alive connection).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// One HTTP/1.1 exchange: the status and the body as JSON (`Null` when it is not JSON).
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> (u16, Value) {
    http_as(addr, None, method, path, body)
}

/// The same, with `Authorization: Bearer <key>` when a key is given.
pub(crate) fn http_as(
    addr: SocketAddr,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> (u16, Value) {
    let (status, body) = exchange(addr, key, method, path, body).expect("an answer");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The raw exchange: the status and the body text, or the I/O error (a killed server).
pub(crate) fn exchange(
    addr: SocketAddr,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> std::io::Result<(u16, String)> {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         {auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    // A server may answer (413) before reading the whole body and close: that is fine.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let broken = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer");
    let (head, rest) = text.split_once("\r\n\r\n").ok_or_else(broken)?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(broken)?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((status, body))
}

/// The body of a chunked answer.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

/// A POST of `body` as JSON: the status and the answer as JSON.
pub(crate) fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    http(addr, "POST", path, Some(body.to_string().as_bytes()))
}

/// The raw body of a GET (for the Prometheus text).
pub(crate) fn http_text(addr: SocketAddr, path: &str) -> String {
    let (status, body) = exchange(addr, None, "GET", path, None).expect("an answer");
    assert_eq!(status, 200, "{body}");
    body
}

/// An HTTP answer: status, headers (lower-case names) and body.
pub(crate) type Answer = (u16, Vec<(String, String)>, String);

/// One whole HTTP/1.1 answer read from `s`.
pub(crate) fn answer(s: &mut TcpStream) -> Answer {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            });
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let (status, headers) = parse_head(head);
    (status, headers, body.to_string())
}

/// An answer's status line and headers (lower-case names).
pub(crate) fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

/// The value of header `name` (lower-case) among `headers`.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The `error.code` of an error body, or `<no error code>`.
pub(crate) fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["error"]["code"]
        .as_str()
        .unwrap_or("<no error code>")
        .to_string()
}

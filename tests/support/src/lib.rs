//! The one scripted OpenAI-compatible endpoint of shadowbrain's tests: a real HTTP server
//! on 127.0.0.1, port 0, serving `POST /v1/embeddings` and `POST /v1/chat/completions` the
//! way OpenAI, Ollama, vLLM or LM Studio would, answering each request with what the test's
//! script says — vectors, a chat answer, an error status with headers, or any of those
//! after a delay (a slow or hanging provider). It records what arrived (bodies,
//! `Authorization` headers, arrival times) and how many requests were in flight at once.
//!
//! Every test that needs a provider starts one of these instead of writing a server of its
//! own, so the provider's wire format is written once. It knows the OpenAI-compatible wire
//! format and the shape of shadowbrain's judge prompts (numbered records), nothing else.
//!
//! Beside it: [`serve`], the one way the package's tests and the examples start `shadowbrain
//! serve` (a child process, its ready line awaited); and for the examples [`stats`], the one
//! percentile their benchmark figures are read with, and [`flags`], the checks of their
//! numeric flags.
#![warn(missing_docs)]

pub mod concepts;
pub mod flags;
pub mod serve;
pub mod stats;
pub mod words;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/embeddings`.
    Embeddings,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// One request, as the script sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Its arrival number, from 0, over both routes.
    pub n: usize,
    /// The endpoint it came to.
    pub route: Route,
    /// Its JSON body.
    pub body: Value,
    /// Its `Authorization` header, if any.
    pub authorization: Option<String>,
}

impl Request {
    /// The texts of an embeddings request (`input` as one string or an array).
    pub fn inputs(&self) -> Vec<String> {
        match &self.body["input"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The answer to an embeddings request: `model`'s vector of every input, in order (a
    /// deterministic "model" a test brings, such as shadowbrain's hash embedder).
    pub fn embedded_by(&self, model: impl Fn(&str) -> Vec<f32>) -> Reply {
        let vectors = self
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, t)| (i, model(t)))
            .collect();
        Reply::embeddings(&self.body["model"], vectors)
    }

    /// The system message of a chat request.
    pub fn system(&self) -> &str {
        self.body["messages"][0]["content"].as_str().unwrap_or("")
    }

    /// The user message of a chat request.
    pub fn user(&self) -> &str {
        self.body["messages"][1]["content"].as_str().unwrap_or("")
    }

    /// The records a judge prompt numbers (`0. [kind] text` lines of the user message).
    pub fn numbered_records(&self) -> Vec<&str> {
        self.user()
            .lines()
            .filter(|l| {
                l.split_once(". [")
                    .is_some_and(|(n, _)| n.parse::<usize>().is_ok())
            })
            .collect()
    }
}

/// What the endpoint answers one request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this JSON body.
    Json(Value),
    /// This status, JSON body and headers.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body.
        body: Value,
        /// Extra headers (`Retry-After` …).
        headers: Vec<(String, String)>,
    },
    /// Waits this long, then answers with the inner reply (a slow or hanging provider).
    After(Duration, Box<Reply>),
}

impl Reply {
    /// `status` with an OpenAI-style error body whose message is `message`.
    pub fn error(status: u16, message: &str) -> Reply {
        Reply::error_typed(status, message, "scripted")
    }

    /// `status` with an OpenAI-style error body of this `type` (`insufficient_quota` …).
    pub fn error_typed(status: u16, message: &str, kind: &str) -> Reply {
        Reply::Status {
            status,
            body: json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
            headers: Vec::new(),
        }
    }

    /// `status` with this body as it is (error bodies of other shapes).
    pub fn raw(status: u16, body: Value) -> Reply {
        Reply::Status {
            status,
            body,
            headers: Vec::new(),
        }
    }

    /// The same reply with a header added (an error reply; a 200 becomes one with headers).
    pub fn with_header(self, name: &str, value: &str) -> Reply {
        match self {
            Reply::Json(body) => Reply::Status {
                status: 200,
                body,
                headers: vec![(name.into(), value.into())],
            },
            Reply::Status {
                status,
                body,
                mut headers,
            } => {
                headers.push((name.into(), value.into()));
                Reply::Status {
                    status,
                    body,
                    headers,
                }
            }
            Reply::After(d, inner) => Reply::After(d, Box::new(inner.with_header(name, value))),
        }
    }

    /// This reply after `delay`.
    pub fn after(delay: Duration, reply: Reply) -> Reply {
        Reply::After(delay, Box::new(reply))
    }

    /// A chat completion whose answer is `content`, reporting `prompt` + `completion`
    /// tokens of usage (`None`: no `usage` object at all).
    pub fn chat(content: &str, usage: Option<(u64, u64)>) -> Reply {
        let mut answer = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": content}}],
        });
        if let Some((prompt, completion)) = usage {
            answer["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion});
        }
        Reply::Json(answer)
    }

    /// An embeddings response: `(index, vector)` pairs, in the order given (a client must
    /// sort by index, so a test may give them shuffled).
    pub fn embeddings(model: &Value, vectors: Vec<(usize, Vec<f32>)>) -> Reply {
        let count = vectors.len();
        let data: Vec<Value> = vectors
            .into_iter()
            .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
            .collect();
        Reply::Json(json!({
            "object": "list",
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }))
    }
}

/// A judge answer: one verdict per record, `(importance, reusability, reason)`.
pub fn verdicts(items: impl IntoIterator<Item = (f64, u32, String)>) -> String {
    let items: Vec<Value> = items
        .into_iter()
        .enumerate()
        .map(|(i, (importance, reusability, reason))| {
            json!({"index": i, "importance": importance, "reusability": reusability,
                   "reason": reason})
        })
        .collect();
    json!({ "items": items }).to_string()
}

type Script = dyn Fn(&Request) -> Reply + Send + Sync;

struct Shared {
    script: Box<Script>,
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    seen: Mutex<Vec<(Request, Instant)>>,
}

/// A running scripted endpoint (see the crate docs). Stops with the runtime it was started
/// on (or, from [`Endpoint::start_in_thread`], with the process).
pub struct Endpoint {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

/// Lowers the in-flight count when a request ends, answered or dropped.
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(shared: Arc<Shared>, route: Route, headers: HeaderMap, body: Value) -> Response {
    let n = shared.requests.fetch_add(1, Ordering::SeqCst);
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _guard = InFlight(shared.clone());
    let request = Request {
        n,
        route,
        body,
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    let mut reply = (shared.script)(&request);
    shared
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((request, Instant::now()));
    while let Reply::After(delay, inner) = reply {
        tokio::time::sleep(delay).await;
        reply = *inner;
    }
    match reply {
        Reply::Json(body) => Json(body).into_response(),
        Reply::Status {
            status,
            body,
            headers,
        } => {
            let mut response = (
                StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT),
                Json(body),
            )
                .into_response();
            for (name, value) in headers {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::try_from(name.as_str()),
                    HeaderValue::try_from(value.as_str()),
                ) {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
        Reply::After(..) => unreachable!("delays are waited out above"),
    }
}

impl Endpoint {
    /// Starts an endpoint on the current tokio runtime.
    pub async fn start(script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Endpoint {
        let shared = Arc::new(Shared {
            script: Box::new(script),
            requests: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let route = |route: Route| {
            post(
                move |State(s): State<Arc<Shared>>, headers: HeaderMap, Json(body): Json<Value>| {
                    handle(s, route, headers, body)
                },
            )
        };
        let app = axum::Router::new()
            .route("/v1/embeddings", route(Route::Embeddings))
            .route("/v1/chat/completions", route(Route::Chat))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the scripted endpoint on 127.0.0.1");
        let addr = listener.local_addr().expect("the endpoint's address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Endpoint { shared, addr }
    }

    /// Starts an endpoint on a thread and runtime of its own, for synchronous tests (those
    /// that drive the `shadowbrain` binary).
    pub fn start_in_thread(script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Endpoint {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the scripted endpoint");
            runtime.block_on(async move {
                let endpoint = Endpoint::start(script).await;
                let _ = tx.send(Endpoint {
                    shared: endpoint.shared.clone(),
                    addr: endpoint.addr,
                });
                std::future::pending::<()>().await;
            });
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the scripted endpoint started")
    }

    /// Its API root, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests received (every attempt counts).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests ever answered at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Request> {
        self.lock().iter().map(|(r, _)| r.clone()).collect()
    }

    /// The body of request `i`.
    pub fn body(&self, i: usize) -> Value {
        self.lock()[i].0.body.clone()
    }

    /// The `Authorization` header of every request, in arrival order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.lock()
            .iter()
            .map(|(r, _)| r.authorization.clone())
            .collect()
    }

    /// When each request arrived.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.lock().iter().map(|(_, at)| *at).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Request, Instant)>> {
        self.shared.seen.lock().unwrap_or_else(|p| p.into_inner())
    }
}

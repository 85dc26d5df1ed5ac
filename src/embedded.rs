//! A data directory opened in this process as `serve` opens it ([`crate::setup`]), answering
//! the requests of docs/http-api.md without a socket: the Python package's `Memory(path)`
//! (`python/`), and any application that wants the server's exact answers, errors and limits
//! without running one. The router is the server's ([`crate::http::router`]), so a request
//! embedded and the same request over HTTP get the same answer byte for byte.
//!
//! A request names its namespace and is taken as from a caller already verified, with no
//! key: the process that opened the directory holds its store and could read every
//! namespace in it anyway. Nothing listens on a socket. Calls block the calling thread on a
//! runtime of the handle's own, and may come from many threads at once; they are for
//! threads outside any async runtime (async code serves `http::router` itself).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard};

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use tower::ServiceExt as _;

use crate::api::{ApiResult, Ids, RecallIn, RecallOut, from_json};
use crate::auth::{Auth, Verified};
use crate::files::{self, Exported, Imported};
use crate::http;
use crate::setup::{HOLDER, SERVE_URL, refuse_if_held, server_config};
use crate::{Limits, NewMemory, Runtime, Substrate, SubstrateOptions};

/// An open data directory answering the HTTP contract in-process; closed by
/// [`Embedded::close`] or when dropped.
pub struct Embedded {
    data: PathBuf,
    /// The policy and config files it was opened with, to open it again after an import.
    policy: Option<PathBuf>,
    config: Option<PathBuf>,
    /// The runtime and the router over it while open; both dropped at close, for the
    /// directory to be opened again (by this process or another).
    open: RwLock<Option<Open>>,
    /// Runs the requests and the runtime's actors; outlives [`Embedded::close`] so that a
    /// request racing it ends with an answer, not a panic. Taken only when dropped.
    tokio: Option<tokio::runtime::Runtime>,
}

struct Open {
    rt: Runtime,
    app: Router,
    /// The config file's `[limits]`, for the requests answered without the router.
    limits: Limits,
}

/// An answer: the HTTP status and the JSON body, as `serve` would send them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code (200, 422, …).
    pub status: u16,
    /// The body: the route's JSON, or the error shape `{"error":{"code","message"}}`.
    pub body: Vec<u8>,
}

/// What [`Embedded::request`] refuses before the router sees the request.
#[derive(Debug)]
pub enum RequestError {
    /// [`Embedded::close`] ran.
    Closed(PathBuf),
    /// The method or the path is not one HTTP could carry.
    Malformed(String),
}

impl Answer {
    /// A response's status and whole body.
    async fn read(answer: Response) -> Answer {
        let status = answer.status().as_u16();
        // The server's own answers are whole JSON documents well under the body limit.
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        Answer { status, body }
    }

    /// `ok` and the JSON of a route's result, or its error as the route answers it.
    async fn of<T: serde::Serialize>(ok: StatusCode, result: ApiResult<T>) -> Answer {
        match result {
            Ok(value) => Answer {
                status: ok.as_u16(),
                // The contract's answers are plain data: they always serialise.
                body: serde_json::to_vec(&value).unwrap_or_default(),
            },
            Err(e) => Answer::read(e.into_response()).await,
        }
    }
}

/// The read guard of an open handle (never `None` while held).
struct OpenGuard<'a>(RwLockReadGuard<'a, Option<Open>>);

impl std::ops::Deref for OpenGuard<'_> {
    type Target = Open;

    fn deref(&self) -> &Open {
        // `enter` made it only over an open handle, and a writer cannot change it while
        // the guard is held.
        self.0.as_ref().expect("an open handle")
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Closed(data) => write!(
                f,
                "the data directory {} was closed; open it again to go on",
                data.display()
            ),
            RequestError::Malformed(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for RequestError {}

impl Embedded {
    /// Opens `data` with the policy file `policy` and the config file `config` (each
    /// optional, as `serve --policy --config`), creating it when new. `holder` says who
    /// holds the directory (written in it, so that another process refused it can name
    /// the holder). Answers the handle and the line saying which embedder is in force.
    pub fn open(
        data: &Path,
        policy: Option<&Path>,
        config: Option<&Path>,
        holder: &str,
    ) -> anyhow::Result<(Embedded, String)> {
        refuse_if_held(data, |url| {
            format!(
                "stop it, or talk to it at {url} instead (Memory.connect(\"{url}\") in \
                 Python)"
            )
        })?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("shadowbrain")
            .build()
            .context("starting the runtime's threads")?;
        let (open, note) = Self::start(&tokio, data, policy, config)?;
        // A `serve` that held the directory before and crashed left its URL behind.
        let _ = std::fs::remove_file(data.join(SERVE_URL));
        if let Err(e) = std::fs::write(data.join(HOLDER), holder) {
            tracing::warn!(error = %e, "cannot write {HOLDER} in the data directory");
        }
        let embedded = Embedded {
            data: data.to_path_buf(),
            policy: policy.map(Path::to_path_buf),
            config: config.map(Path::to_path_buf),
            open: RwLock::new(Some(open)),
            tokio: Some(tokio),
        };
        Ok((embedded, note))
    }

    /// The runtime and its router over `data`, as `serve` starts them.
    fn start(
        tokio: &tokio::runtime::Runtime,
        data: &Path,
        policy: Option<&Path>,
        config: Option<&Path>,
    ) -> anyhow::Result<(Open, String)> {
        let setup = server_config(data, policy, config)?;
        let rt = tokio
            .block_on(Runtime::open(setup.runtime))
            .with_context(|| format!("opening the data directory {}", data.display()))?;
        let limits = setup.file.limits;
        let options = http::Options {
            limits,
            auth: Auth::open(),
            server: setup.file.server,
        };
        let app = http::router(rt.clone(), options);
        Ok((Open { rt, app, limits }, setup.embedder_note))
    }

    /// Writes `namespace`'s records (and its tombstones, quarantine entries and recalls)
    /// to the file `path` in the format of `shadowbrain export`, while the directory stays
    /// open: each line is a record as it was when read.
    pub fn export(&self, namespace: &str, path: &Path) -> anyhow::Result<Exported> {
        crate::validate_id("namespace", namespace)?;
        // Held while it writes: a close waits for the export instead of closing the store
        // under it.
        let open = self.enter()?;
        files::export_to_file(
            open.rt.substrate().store(),
            Some(namespace),
            path,
            &mut |_, _| {},
        )
    }

    /// Reads the file `path` that `shadowbrain export` (or [`Embedded::export`]) wrote into
    /// the directory, as `shadowbrain import` does: the runtime is drained and closed, the
    /// file imported with nothing else writing, and the runtime opened again. Requests
    /// made meanwhile wait for it. The import's errors are the CLI's; a file whose lines
    /// conflict with the directory is imported as far as it can be and its problems are in
    /// [`Imported::problems`].
    pub fn import(&self, path: &Path) -> anyhow::Result<Imported> {
        // It blocks its thread on the handle's runtime, as a request does.
        drop(self.enter()?);
        let mut open = self.open.write().unwrap_or_else(|p| p.into_inner());
        let Some(Open { rt, app, .. }) = open.take() else {
            return Err(RequestError::Closed(self.data.clone()).into());
        };
        drop(app);
        let shut = self.threads().block_on(rt.shutdown());
        drop(rt);
        let imported = shut
            .with_context(|| {
                format!(
                    "closing the data directory {} to import",
                    self.data.display()
                )
            })
            .and_then(|()| {
                // The substrate as `serve` would open it (the same embedder and limits).
                let setup =
                    server_config(&self.data, self.policy.as_deref(), self.config.as_deref())?;
                self.import_closed(path, setup.runtime.substrate)
            });
        // Opened again whatever the import did: what it committed is durable either way.
        match Self::start(
            self.threads(),
            &self.data,
            self.policy.as_deref(),
            self.config.as_deref(),
        ) {
            Ok((again, _)) => *open = Some(again),
            Err(e) => {
                let e =
                    e.context("opening the data directory again after the import; open it anew");
                return Err(match imported {
                    Ok(_) => e,
                    Err(first) => first.context(format!("{e:#}")),
                });
            }
        }
        imported
    }

    fn import_closed(
        &self,
        path: &Path,
        mut options: SubstrateOptions,
    ) -> anyhow::Result<Imported> {
        let file = File::open(path)
            .with_context(|| format!("opening {}; check the path", path.display()))?;
        // Nothing may change a record while it is imported: no background indexing.
        options.indexing.background = false;
        let sub = Substrate::open(&self.data, options)
            .with_context(|| format!("opening the data directory {}", self.data.display()))?;
        let imported = files::import(
            &sub,
            &self.data,
            &mut BufReader::new(file),
            &path.display().to_string(),
            &mut |_| {},
        );
        let closed = sub
            .close()
            .with_context(|| format!("closing the data directory {}", self.data.display()));
        match (imported, closed) {
            (Ok(report), Ok(())) => Ok(report),
            (Err(e), Ok(())) | (Ok(_), Err(e)) => Err(e),
            (Err(e), Err(closing)) => Err(e.context(format!("{closing:#}"))),
        }
    }

    /// The data directory.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// The runtime's handle, for the library's own calls beside the contract's (the Python
    /// package's benchmark measures recall through it as the anchor).
    pub fn runtime(&self) -> Result<Runtime, RequestError> {
        match &*self.open.read().unwrap_or_else(|p| p.into_inner()) {
            Some(open) => Ok(open.rt.clone()),
            None => Err(RequestError::Closed(self.data.clone())),
        }
    }

    /// Runs `work` on the handle's runtime, blocking the calling thread until it is done.
    pub fn block_on<F: std::future::Future>(&self, work: F) -> F::Output {
        self.threads().block_on(work)
    }

    fn threads(&self) -> &tokio::runtime::Runtime {
        // Present from `open` until `drop`.
        self.tokio
            .as_ref()
            .expect("the handle's runtime lives until it is dropped")
    }

    /// Answers `method path` (the path with its query, as docs/http-api.md names it) with
    /// the JSON `body` (empty for none) and `headers` (an `Idempotency-Key`, say), in
    /// `namespace`, as `serve` would. Blocks the calling thread until the answer.
    pub fn request(
        &self,
        namespace: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<Answer, RequestError> {
        let open = self.enter()?;
        let app = open.app.clone();
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| RequestError::Malformed(format!("`{method}` is not an HTTP method")))?;
        let mut request = Request::builder().method(method).uri(path);
        if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request
            .body(Body::from(body))
            .map_err(|e| RequestError::Malformed(format!("`{path}`: {e}")))?;
        request.extensions_mut().insert(Verified {
            namespace: namespace.to_string(),
            admin: true,
            key: String::new(),
            client: None,
            viewer: None,
        });
        let answer = self.threads().block_on(async move {
            match app.oneshot(request).await {
                Ok(answer) => Answer::read(answer).await,
                Err(never) => match never {},
            }
        });
        drop(open);
        Ok(answer)
    }

    /// The open runtime, held until the guard is dropped: an import or a close (which take
    /// it to write) waits for the requests under way, and the requests after it wait for
    /// the import.
    fn enter(&self) -> Result<OpenGuard<'_>, RequestError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking a runtime's worker on another runtime would panic.
            return Err(RequestError::Malformed(
                "Embedded's requests block their thread and this one was called from async \
                 code; call it from a plain thread (tokio::task::spawn_blocking), or serve \
                 shadowbrain::http::router from the async code itself"
                    .into(),
            ));
        }
        let guard = self.open.read().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            return Err(RequestError::Closed(self.data.clone()));
        }
        Ok(OpenGuard(guard))
    }

    /// `POST /v1/sessions/{session_id}/recall` with the JSON `body`, in `namespace`: the
    /// route's own work and answer, without the router (and so without the server's
    /// admission queue: in-process, the caller's threads are the only callers).
    pub fn recall(
        &self,
        namespace: &str,
        session_id: &str,
        body: Vec<u8>,
    ) -> Result<Answer, RequestError> {
        let answer = match self.recall_out(namespace, session_id, body)? {
            Ok(recalled) => self
                .threads()
                .block_on(Answer::of(StatusCode::OK, Ok(recalled))),
            Err(refused) => refused,
        };
        Ok(answer)
    }

    /// [`Embedded::recall`]'s answer as the contract's struct, not its JSON (a caller that
    /// builds its own objects from it skips writing and reading the JSON); a refusal is the
    /// route's answer, as from [`Embedded::recall`].
    pub fn recall_out(
        &self,
        namespace: &str,
        session_id: &str,
        body: Vec<u8>,
    ) -> Result<Result<RecallOut, Answer>, RequestError> {
        // The route's own reading of the body, then its work as for a body already read.
        match from_json::<RecallIn>("recall", Ok(body.into())) {
            Ok(body) => self.recall_read(namespace, session_id, body),
            Err(refused) => {
                drop(self.enter()?);
                let answer = Answer::of::<RecallOut>(StatusCode::OK, Err(refused));
                Ok(Err(self.threads().block_on(answer)))
            }
        }
    }

    /// [`Embedded::recall_out`] with the body already read: a caller that holds the
    /// request's fields as typed values (the Python package's plain arguments) skips
    /// writing and parsing their JSON. The same checks (`k`, `token_budget`, the session
    /// id) and the same refusals follow.
    pub fn recall_read(
        &self,
        namespace: &str,
        session_id: &str,
        body: RecallIn,
    ) -> Result<Result<RecallOut, Answer>, RequestError> {
        let open = self.enter()?;
        let answer = self.threads().block_on(async {
            let recalled = http::recall(&open.rt, &open.limits, namespace, session_id, body).await;
            match recalled {
                Ok(recalled) => Ok(recalled),
                Err(refused) => Err(Answer::of::<RecallOut>(StatusCode::OK, Err(refused)).await),
            }
        });
        drop(open);
        Ok(answer)
    }

    /// `POST /v1/sessions/{session_id}/events` with the JSON `body` and the
    /// `Idempotency-Key` `key`, in `namespace`: the route's own work and answer (201 and
    /// the ids), without the router, as for [`Embedded::recall`].
    pub fn record(
        &self,
        namespace: &str,
        session_id: &str,
        key: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Answer, RequestError> {
        let open = self.enter()?;
        let answer = self.threads().block_on(async {
            let recorded = http::record(&open.rt, namespace, session_id, key, body.into())
                .await
                .map(|r| Ids {
                    ids: r.ids.iter().map(ToString::to_string).collect(),
                });
            Answer::of(StatusCode::CREATED, recorded).await
        });
        drop(open);
        Ok(answer)
    }

    /// [`Embedded::record`] with the events already read and no idempotency key (the
    /// Python package reads plain events straight into them): the ids once durable, or the
    /// route's refusal.
    pub fn record_read(
        &self,
        namespace: &str,
        session_id: &str,
        events: Vec<NewMemory>,
    ) -> Result<Result<Vec<String>, Answer>, RequestError> {
        let open = self.enter()?;
        let answer = self.threads().block_on(async {
            match http::record_read(&open.rt, namespace, session_id, events, None).await {
                Ok(recorded) => Ok(recorded.ids.iter().map(ToString::to_string).collect()),
                Err(refused) => Err(Answer::of::<Ids>(StatusCode::CREATED, Err(refused)).await),
            }
        });
        drop(open);
        Ok(answer)
    }

    /// Drains and flushes as `serve` does at SIGTERM: every actor finishes what it holds,
    /// the indexes are flushed and the store is closed. Later requests answer
    /// [`RequestError::Closed`]; closing again does nothing.
    pub fn close(&self) -> anyhow::Result<()> {
        let open = self.open.write().unwrap_or_else(|p| p.into_inner()).take();
        let Some(Open { rt, app, .. }) = open else {
            return Ok(());
        };
        drop(app);
        let shutdown = || {
            self.threads()
                .block_on(rt.shutdown())
                .with_context(|| format!("closing the data directory {}", self.data.display()))
        };
        // Dropped inside async code, the blocking wait runs on a thread of its own: a
        // runtime's worker may not block on another runtime.
        let closed = match tokio::runtime::Handle::try_current() {
            Ok(_) => std::thread::scope(|s| s.spawn(shutdown).join())
                .unwrap_or_else(|_| Err(anyhow::anyhow!("closing the data directory panicked"))),
            Err(_) => shutdown(),
        };
        drop(rt);
        let _ = std::fs::remove_file(self.data.join(HOLDER));
        closed
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        // A handle dropped without `close` still flushes what it accepted.
        if let Err(e) = self.close() {
            tracing::warn!(error = %format!("{e:#}"), "closing the data directory");
        }
        // Inside async code a runtime may only be let go of without waiting for it.
        if let (Some(threads), Ok(_)) = (self.tokio.take(), tokio::runtime::Handle::try_current()) {
            threads.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> Embedded {
        let config = dir.join("shadowbrain.toml");
        std::fs::write(&config, "[embedder]\nkind = \"hash\"\n").unwrap();
        Embedded::open(&dir.join("data"), None, Some(&config), "this test")
            .unwrap()
            .0
    }

    fn json(answer: &Answer) -> serde_json::Value {
        serde_json::from_slice(&answer.body).unwrap()
    }

    #[test]
    fn answers_the_contract_in_each_namespace_and_refuses_a_second_holder() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = open(dir.path());
        let event = br#"{"kind":"observation","text":"the runner is in eu-1"}"#.to_vec();
        let written = embedded
            .request("acme", "POST", "/v1/sessions/s/events", &[], event)
            .unwrap();
        assert_eq!(written.status, 201, "{}", json(&written));
        let id = json(&written)["ids"][0].as_str().unwrap().to_string();
        let mine = embedded
            .request(
                "acme",
                "GET",
                &format!("/v1/memories/{id}"),
                &[],
                Vec::new(),
            )
            .unwrap();
        assert_eq!(json(&mine)["namespace"], "acme");
        let theirs = embedded
            .request(
                "globex",
                "GET",
                &format!("/v1/memories/{id}"),
                &[],
                Vec::new(),
            )
            .unwrap();
        assert_eq!(theirs.status, 404);
        let bad = br#"{"query":"runner","k":0}"#.to_vec();
        let refused = embedded
            .request("acme", "POST", "/v1/sessions/s/recall", &[], bad)
            .unwrap();
        assert_eq!(refused.status, 422);
        assert_eq!(json(&refused)["error"]["code"], "invalid_k");

        let again = Embedded::open(&dir.path().join("data"), None, None, "another");
        let why = format!("{:#}", again.err().unwrap());
        assert!(why.contains("in use by this test"), "{why}");

        embedded.close().unwrap();
        let closed = embedded.request("acme", "GET", "/v1/sessions", &[], Vec::new());
        assert!(matches!(closed, Err(RequestError::Closed(_))));
        drop(embedded);
        // Released: it opens again, with what was written.
        let reopened = open(dir.path());
        let timeline = reopened
            .request("acme", "GET", "/v1/sessions/s/timeline", &[], Vec::new())
            .unwrap();
        assert_eq!(json(&timeline)["items"][0]["text"], "the runner is in eu-1");
    }

    /// `recall` and `record` without the router answer as the routes do: the same bytes
    /// for every refusal, the same memories for a recall, the same ids for a retried write.
    #[test]
    fn the_direct_recall_and_record_answer_as_the_routes() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = open(dir.path());
        let routed = |path: &str, key: Option<&str>, body: &[u8]| {
            let headers: Vec<(&str, &str)> = key
                .map(|k| vec![("idempotency-key", k)])
                .unwrap_or_default();
            embedded
                .request("acme", "POST", path, &headers, body.to_vec())
                .unwrap()
        };
        let events = br#"{"events":[{"kind":"observation","text":"the runner is in eu-1"},
            {"kind":"observation","text":"the cache is warm"}]}"#;
        let direct = embedded
            .record("acme", "s", Some("k-1"), events.to_vec())
            .unwrap();
        assert_eq!(direct.status, 201);
        // The same key and body by the route: the first write's ids, nothing stored again.
        assert_eq!(
            routed("/v1/sessions/s/events", Some("k-1"), events).body,
            direct.body
        );
        for body in [
            &br#"{"kind":"observation"}"#[..],
            br#"{"kind":"Observation","text":"x"}"#,
            br#"{"kind":"observation","text":"x""#,
            br#"{"events":[]}"#,
        ] {
            let direct = embedded.record("acme", "s", None, body.to_vec()).unwrap();
            assert!(direct.status >= 400);
            assert_eq!(routed("/v1/sessions/s/events", None, body), direct);
        }
        let bad_session = embedded
            .record("acme", "no spaces", None, events.to_vec())
            .unwrap();
        assert_eq!(bad_session.status, 422);
        for body in [
            &br#"{"query":"runner","k":0}"#[..],
            br#"{"query":"runner","scope":"galaxy"}"#,
            br#"{"query":"runner","surprise":1}"#,
            br#"{"query":"#,
        ] {
            let direct = embedded.recall("acme", "s", body.to_vec()).unwrap();
            assert!(direct.status >= 400);
            assert_eq!(routed("/v1/sessions/s/recall", None, body), direct);
        }
        let query = br#"{"query":"where is the runner?","k":5}"#;
        let ids = |answer: &Answer| -> Vec<String> {
            json(answer)["memories"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect()
        };
        let direct = embedded.recall("acme", "s", query.to_vec()).unwrap();
        let route = routed("/v1/sessions/s/recall", None, query);
        assert_eq!(direct.status, 200);
        assert_eq!(ids(&direct), ids(&route));
        assert!(!ids(&direct).is_empty());
        let keys = |answer: &Answer| -> Vec<String> {
            json(answer).as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(keys(&direct), keys(&route));
        embedded.close().unwrap();
        assert!(matches!(
            embedded.recall("acme", "s", query.to_vec()),
            Err(RequestError::Closed(_))
        ));
    }

    #[test]
    fn async_code_gets_an_error_not_a_panic_and_may_drop_it() {
        let dir = tempfile::tempdir().unwrap();
        let embedded = open(dir.path());
        let outer = tokio::runtime::Runtime::new().unwrap();
        outer.block_on(async move {
            let refused = embedded.request("acme", "GET", "/v1/sessions", &[], Vec::new());
            assert!(
                matches!(&refused, Err(RequestError::Malformed(m)) if m.contains("async code")),
                "{refused:?}"
            );
            drop(embedded);
        });
    }
}

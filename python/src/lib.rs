//! `shadowbrain._native`: the Rust half of the Python package. `Native`, over
//! [`shadowbrain::embedded::Embedded`]: a data directory opened in this process as `serve`
//! opens it, answering the HTTP contract's requests without a socket; and the answers'
//! objects ([`answers`]: a record, a recall), built from the runtime's structs in-process
//! and from a server's JSON by a client. The Python half (`python/shadowbrain/`) turns
//! error bodies into exceptions and the other answers into typed objects, the same way for
//! this and for a server reached over HTTP, so both speak one protocol.
//!
//! Every call releases the GIL while the runtime works, so Python threads sharing one
//! `Native` run their requests at once.

mod answers;

// The server binary's allocator: the runtime embedded in Python allocates as under `serve`
// (Python's own objects keep Python's allocator; only Rust's allocations use it).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};
use shadowbrain::api::RecallIn;
use shadowbrain::embedded::{Answer, Embedded, RequestError};
use shadowbrain::setup::DirectoryHeld;
use shadowbrain::{NewMemory, RecallRequest, Scope, SessionHandle};

create_exception!(
    _native,
    NativeError,
    PyException,
    "A refusal of the native module: args are (code, message)."
);

/// The error for Python: the contract's code and a message saying how to fix it.
fn native_error(code: &str, message: String) -> PyErr {
    NativeError::new_err((code.to_string(), message))
}

/// An answer for Python: the status and the body, or the refusal before the request ran.
fn answered<'py>(
    py: Python<'py>,
    answer: Result<Answer, RequestError>,
) -> PyResult<(u16, Bound<'py, PyBytes>)> {
    let answer = answer.map_err(unanswered)?;
    Ok((answer.status, PyBytes::new(py, &answer.body)))
}

/// A route's work run without the router: its value, or its refusal raised as the
/// package's error (the route's code and message), or the request refused before it ran.
fn ran<T>(py: Python<'_>, answer: Result<Result<T, Answer>, RequestError>) -> PyResult<T> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(refused)) => Err(raised(
            py,
            "from_answer",
            (refused.status, PyBytes::new(py, &refused.body)),
        )),
        Err(e) => Err(raised(py, "error_from", (request_code(&e), e.to_string()))),
    }
}

/// A request refused before it ran, as Python sees it.
fn unanswered(e: RequestError) -> PyErr {
    native_error(request_code(&e), e.to_string())
}

/// The code of a request refused before it ran.
fn request_code(e: &RequestError) -> &'static str {
    match e {
        RequestError::Closed(_) => "closed",
        RequestError::Malformed(_) => "bad_request",
    }
}

/// The package's own error (`shadowbrain.errors`), made by its function `make` from
/// `args`: what the Python half raises for the same refusal.
pub(crate) fn raised<'py>(
    py: Python<'py>,
    make: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyErr {
    let error = py
        .import("shadowbrain.errors")
        .and_then(|m| m.getattr(make))
        .and_then(|make| make.call1(args));
    match error {
        Ok(error) => PyErr::from_value(error),
        Err(e) => e,
    }
}

/// What a recall argument takes, for the message refusing another.
fn kind_of(name: &str) -> &'static str {
    match name {
        "k" | "token_budget" => "number",
        "include_knowledge" | "include_superseded" => "bool",
        "kinds" => "list of kind names",
        "since" | "until" => "datetime or an RFC 3339 string",
        _ => "string",
    }
}

/// A failed whole-directory operation as Python sees it: `closed` when the directory was
/// closed, else `code` with the whole chain of causes.
fn refusal(code: &str, e: anyhow::Error) -> PyErr {
    match e.downcast_ref::<RequestError>() {
        Some(closed @ RequestError::Closed(_)) => native_error("closed", closed.to_string()),
        _ => native_error(code, format!("{e:#}")),
    }
}

/// A data directory opened in this process.
#[pyclass(frozen, module = "shadowbrain._native")]
struct Native {
    inner: Embedded,
    note: String,
}

#[pymethods]
impl Native {
    /// Opens `path` as `serve --data path --policy policy --config config` would; `holder`
    /// names this process to another one refused the directory.
    #[new]
    #[pyo3(signature = (path, policy=None, config=None, holder=String::from("a Python process")))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        policy: Option<PathBuf>,
        config: Option<PathBuf>,
        holder: String,
    ) -> PyResult<Native> {
        let opened =
            py.detach(|| Embedded::open(&path, policy.as_deref(), config.as_deref(), &holder));
        match opened {
            Ok((inner, note)) => Ok(Native { inner, note }),
            Err(e) => {
                let code = match e.downcast_ref::<DirectoryHeld>() {
                    Some(_) => "directory_in_use",
                    None => "cannot_open",
                };
                Err(native_error(code, format!("{e:#}")))
            }
        }
    }

    /// Which embedder is in force, and why (the line `serve` prints at start-up).
    #[getter]
    fn embedder(&self) -> &str {
        &self.note
    }

    /// Answers `method path` with the JSON `body` and `headers` in `namespace`: the status
    /// and the JSON body `serve` would send.
    #[pyo3(signature = (namespace, method, path, body=None, headers=Vec::new()))]
    fn request<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: Vec<(String, String)>,
    ) -> PyResult<(u16, Bound<'py, PyBytes>)> {
        let body = body.map(<[u8]>::to_vec).unwrap_or_default();
        let answer = py.detach(|| {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.inner.request(namespace, method, path, &headers, body)
        });
        answered(py, answer)
    }

    /// `POST /v1/sessions/{session_id}/recall` without the router (the route's own work),
    /// its body made of the arguments that are not `None`: the answer's `Recall`, made
    /// from the runtime's answer without JSON, or the package's error for a refusal (the
    /// route's code and message). `Memory.recall` calls it straight: the less Python runs
    /// around a recall, the less it adds to it.
    #[pyo3(signature = (
        namespace, session_id, query, k=None, scope=None, agent_id=None,
        include_knowledge=None, kinds=None, since=None, until=None, token_budget=None,
        include_superseded=None,
    ))]
    #[allow(clippy::too_many_arguments)] // `Memory.recall`'s keywords, one by one.
    fn recall(
        &self,
        py: Python<'_>,
        namespace: &str,
        session_id: &str,
        query: &Bound<'_, PyAny>,
        k: Option<&Bound<'_, PyAny>>,
        scope: Option<&Bound<'_, PyAny>>,
        agent_id: Option<&Bound<'_, PyAny>>,
        include_knowledge: Option<&Bound<'_, PyAny>>,
        kinds: Option<&Bound<'_, PyAny>>,
        since: Option<&Bound<'_, PyAny>>,
        until: Option<&Bound<'_, PyAny>>,
        token_budget: Option<&Bound<'_, PyAny>>,
        include_superseded: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<answers::Recall> {
        let fields = [
            ("query", Some(query)),
            ("k", k),
            ("scope", scope),
            ("agent_id", agent_id),
            ("include_knowledge", include_knowledge),
            ("kinds", kinds),
            ("since", since),
            ("until", until),
            ("token_budget", token_budget),
            ("include_superseded", include_superseded),
        ];
        // Plain arguments (what nearly every call passes) are read straight into the
        // request; anything else goes as JSON, for the route to judge in its own words.
        let answer = match plain_recall(&fields) {
            Some(body) => py.detach(|| self.inner.recall_read(namespace, session_id, body)),
            None => {
                let body = recall_json(py, &fields)?;
                py.detach(|| self.inner.recall_out(namespace, session_id, body))
            }
        };
        answers::Recall::new(py, ran(py, answer)?)
    }

    /// `POST /v1/sessions/{session_id}/events` with the `Idempotency-Key` `key`, without
    /// the router: the status and JSON body.
    #[pyo3(signature = (namespace, session_id, body, key=None))]
    fn record<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        session_id: &str,
        body: &[u8],
        key: Option<&str>,
    ) -> PyResult<(u16, Bound<'py, PyBytes>)> {
        let body = body.to_vec();
        let answer = py.detach(|| self.inner.record(namespace, session_id, key, body));
        answered(py, answer)
    }

    /// `POST /v1/sessions/{session_id}/events` without a key, for `events` that are plain
    /// (see [`plain_event`]), read straight into the runtime's events: the new ids, or the
    /// route's refusal raised. `None` when one of them is not plain: send them as JSON.
    fn record_plain(
        &self,
        py: Python<'_>,
        namespace: &str,
        session_id: &str,
        events: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<String>>> {
        let Ok(list) = events.cast_exact::<PyList>() else {
            return Ok(None);
        };
        let Some(events) = list
            .iter()
            .map(|e| plain_event(&e))
            .collect::<Option<Vec<_>>>()
            .filter(|events| !events.is_empty())
        else {
            return Ok(None);
        };
        let answer = py.detach(|| self.inner.record_read(namespace, session_id, events));
        ran(py, answer).map(Some)
    }

    /// The benchmark's anchor: `repeats` recalls of `query` in `session_id` through the
    /// Rust facade (`SessionHandle::recall_with`, no JSON, no router), as `recall` asks
    /// them (scope session, the knowledge pool included); each one's nanoseconds.
    fn _facade_recall(
        &self,
        py: Python<'_>,
        namespace: &str,
        session_id: &str,
        query: &str,
        k: usize,
        repeats: usize,
    ) -> PyResult<Vec<u64>> {
        self.timed(py, namespace, session_id, async |session| {
            let mut took = Vec::with_capacity(repeats);
            for _ in 0..repeats {
                let mut request = RecallRequest::new(namespace, session_id, query);
                request.k = k;
                let started = std::time::Instant::now();
                session.recall_with(request).await?;
                took.push(started.elapsed().as_nanos() as u64);
            }
            Ok(took)
        })
    }

    /// The benchmark's anchor for writes: `texts` recorded in `session_id` in batches of
    /// `batch` observations through the Rust facade (`SessionHandle::record_batch`, no
    /// JSON, no router); each batch's nanoseconds.
    fn _facade_record(
        &self,
        py: Python<'_>,
        namespace: &str,
        session_id: &str,
        texts: Vec<String>,
        batch: usize,
    ) -> PyResult<Vec<u64>> {
        self.timed(py, namespace, session_id, async |session| {
            let mut took = Vec::new();
            for chunk in texts.chunks(batch.max(1)) {
                let events = chunk
                    .iter()
                    .map(|t| NewMemory::new("observation", t.as_str()))
                    .collect();
                let started = std::time::Instant::now();
                session.record_batch(events).await?;
                took.push(started.elapsed().as_nanos() as u64);
            }
            Ok(took)
        })
    }

    /// The benchmark's wait before it measures recall: the background actors' work done and
    /// both indexes caught up with every write (as a server is once a burst of writes has
    /// been absorbed).
    fn _settle(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let rt = self.inner.runtime().map_err(|e| e.to_string())?;
            self.inner.block_on(async {
                rt.settle().await.map_err(|e| e.to_string())?;
                while !rt
                    .substrate()
                    .indexes_caught_up()
                    .map_err(|e| e.to_string())?
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Ok(())
            })
        })
        .map_err(|e: String| native_error("benchmark", e))
    }

    /// The vectors the runtime's embedder gives `texts` (the benchmark hands the same ones
    /// to its anchor).
    fn _embed(&self, py: Python<'_>, texts: Vec<String>) -> PyResult<Vec<Vec<f32>>> {
        py.detach(|| {
            let rt = self.inner.runtime().map_err(|e| e.to_string())?;
            let embedder = rt.substrate().embedder().clone();
            self.inner
                .block_on(async move { embedder.embed(&texts).await })
                .map_err(|e| e.to_string())
        })
        .map_err(|e: String| native_error("benchmark", e))
    }

    /// Writes `namespace`'s records to the file `path` as `shadowbrain export --namespace`
    /// would: `(records, purged, quarantined, recalls)`.
    fn export(
        &self,
        py: Python<'_>,
        namespace: &str,
        path: PathBuf,
    ) -> PyResult<(u64, u64, u64, u64)> {
        let exported = py
            .detach(|| self.inner.export(namespace, &path))
            .map_err(|e| refusal("export_failed", e))?;
        Ok((
            exported.records,
            exported.purged,
            exported.quarantined,
            exported.recalls,
        ))
    }

    /// Reads the export file `path` into the directory as `shadowbrain import` would:
    /// `(imported, present, different ids, dangling references, problems or None)`.
    #[allow(clippy::type_complexity)] // The tuple `_native.pyi` names, field by field.
    fn import_(
        &self,
        py: Python<'_>,
        path: PathBuf,
    ) -> PyResult<(u64, u64, Vec<String>, Vec<String>, Option<String>)> {
        let imported = py
            .detach(|| self.inner.import(&path))
            .map_err(|e| refusal("import_failed", e))?;
        let problems = imported.problems(&path.display().to_string());
        Ok((
            imported.imported,
            imported.present,
            imported.different,
            imported.dangling,
            problems,
        ))
    }

    /// Drains and flushes as `serve` does at SIGTERM; later requests raise `closed`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close())
            .map_err(|e| native_error("cannot_close", format!("{e:#}")))
    }
}

impl Native {
    /// Runs a benchmark's `work` on the facade's handle of `session_id`, the GIL released.
    fn timed(
        &self,
        py: Python<'_>,
        namespace: &str,
        session_id: &str,
        work: impl AsyncFnOnce(SessionHandle) -> shadowbrain::Result<Vec<u64>> + Send,
    ) -> PyResult<Vec<u64>> {
        py.detach(|| {
            let rt = self.inner.runtime().map_err(|e| e.to_string())?;
            let session = rt
                .session(namespace, session_id)
                .map_err(|e| e.to_string())?;
            self.inner
                .block_on(work(session))
                .map_err(|e| e.to_string())
        })
        .map_err(|e: String| native_error("benchmark", e))
    }
}

/// A `str` exactly (not a subclass, which the JSON path judges), as Rust's.
fn plain_str(v: &Bound<'_, PyAny>) -> Option<String> {
    Some(v.cast_exact::<PyString>().ok()?.to_str().ok()?.to_owned())
}

/// A recall's arguments, by the contract's field names (`None`: left out).
type RecallFields<'a, 'py> = [(&'static str, Option<&'a Bound<'py, PyAny>>); 10];

/// The recall's body read straight from its arguments when each is plain — a `str` query,
/// scope and agent, an exact `int` k and token budget, `bool` flags, no kinds and no times —
/// and `None` otherwise. Checking these types is all the JSON path would add for them; what
/// is left (ranges, the session id) the route's own checks judge either way.
fn plain_recall(fields: &RecallFields<'_, '_>) -> Option<RecallIn> {
    let count = |v: &Bound<'_, PyAny>| v.cast_exact::<PyInt>().ok()?.extract::<usize>().ok();
    let flag = |v: &Bound<'_, PyAny>| Some(v.cast_exact::<PyBool>().ok()?.is_true());
    let mut query = None;
    let mut body = RecallIn {
        query: String::new(),
        k: None,
        scope: None,
        agent_id: None,
        kinds: None,
        since: None,
        until: None,
        include_knowledge: None,
        token_budget: None,
        include_superseded: None,
    };
    for &(name, value) in fields {
        let Some(value) = value.filter(|v| !v.is_none()) else {
            continue;
        };
        match name {
            "query" => query = Some(plain_str(value)?),
            "k" => body.k = Some(count(value)?),
            // The scope's names as the route reads them (an unknown one goes as JSON).
            "scope" => {
                let name = serde_json::Value::String(plain_str(value)?);
                body.scope = Some(serde_json::from_value::<Scope>(name).ok()?);
            }
            "agent_id" => body.agent_id = Some(plain_str(value)?),
            "include_knowledge" => body.include_knowledge = Some(flag(value)?),
            "token_budget" => body.token_budget = Some(count(value)?),
            "include_superseded" => body.include_superseded = Some(flag(value)?),
            // Kinds and times: the route reads them.
            _ => return None,
        }
    }
    body.query = query?;
    Some(body)
}

/// One event read straight from a plain `dict`: `str` keys among `kind` (required),
/// `text`, `agent_id` and `parent_id` (each a `str` or `None`), `importance` (a finite
/// `float` or an `int`, or `None`) and `pinned` (a `bool`). `None` for anything else —
/// content, metadata, times, vectors, other types — which goes as JSON, so the route reads
/// it (and refuses it) in its own words. What it reads is what the JSON would have carried.
fn plain_event(event: &Bound<'_, PyAny>) -> Option<NewMemory> {
    let text = |v: &Bound<'_, PyAny>| {
        if v.is_none() {
            Some(None)
        } else {
            plain_str(v).map(Some)
        }
    };
    let mut out = NewMemory::default();
    let mut kind = None;
    for (key, value) in event.cast_exact::<PyDict>().ok()?.iter() {
        match key.cast_exact::<PyString>().ok()?.to_str().ok()? {
            "kind" => kind = Some(plain_str(&value)?),
            "text" => out.text = text(&value)?,
            "agent_id" => out.agent_id = text(&value)?,
            "parent_id" => out.parent_id = text(&value)?,
            "importance" if value.is_none() => out.importance = None,
            "importance" => {
                let number = if let Ok(f) = value.cast_exact::<PyFloat>() {
                    f.value()
                } else {
                    // Exact in every float type; larger ones (refused as importance
                    // anyway) go as JSON, whose words name them as sent.
                    let n = value.cast_exact::<PyInt>().ok()?.extract::<i32>().ok()?;
                    f64::from(n)
                        .abs()
                        .le(&16_777_216.0)
                        .then_some(f64::from(n))?
                };
                // JSON has no NaN or infinity: the route refuses the body that holds one.
                out.importance = Some(number.is_finite().then_some(number as f32)?);
            }
            "pinned" => out.pinned = value.cast_exact::<PyBool>().ok()?.is_true(),
            _ => return None,
        }
    }
    out.kind = kind?;
    Some(out)
}

/// The recall's body as the route reads it: the arguments that are not `None`, as JSON.
fn recall_json(py: Python<'_>, fields: &RecallFields<'_, '_>) -> PyResult<Vec<u8>> {
    let mut body = serde_json::Map::new();
    for &(name, value) in fields {
        let Some(value) = value.filter(|v| !v.is_none()) else {
            continue;
        };
        let json = pythonize::depythonize::<serde_json::Value>(value).map_err(|e| {
            raised(
                py,
                "error_from",
                (
                    format!("invalid_{name}"),
                    format!(
                        "`{name}` cannot be sent as JSON ({e}); pass a {}",
                        kind_of(name)
                    ),
                ),
            )
        })?;
        body.insert(name.to_string(), json);
    }
    // The route reads its body as JSON: the same bytes, the same refusals, word for word.
    Ok(serde_json::to_vec(&serde_json::Value::Object(body)).unwrap_or_default())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Native>()?;
    m.add_class::<answers::Record>()?;
    m.add_class::<answers::Recalled>()?;
    m.add_class::<answers::Recall>()?;
    m.add_class::<answers::Why>()?;
    m.add_class::<answers::Passage>()?;
    m.add_class::<answers::PolicyRef>()?;
    m.add_class::<answers::Utility>()?;
    m.add_class::<answers::Chain>()?;
    m.add_function(wrap_pyfunction!(answers::records, m)?)?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    Ok(())
}

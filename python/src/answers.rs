//! The answers' objects: a record, a recall and its ranked memories, and their parts, as
//! Python classes over the contract's own structs (`shadowbrain::api`, docs/http-api.md).
//!
//! Each object holds the Rust struct and converts a field to Python when it is read, so an
//! answer costs Python nothing until it is used: an embedded recall hands the runtime's
//! answer over as is, with no JSON written or read (docs/python.md, "Speed"). A client
//! builds the same objects from a server's JSON (`from_json`), so both modes answer alike.
//! They compare by value, pickle (as their JSON), and `to_dict()` gives the contract's
//! JSON as Python data.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use serde::Serialize;
use serde::de::DeserializeOwned;
use shadowbrain::api;

use crate::raised;

/// `value` (JSON) as Python data: objects as dicts, arrays as lists.
fn data<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(pythonize::pythonize(py, value)?)
}

/// `value`'s JSON as Python data, as `json.loads` reads it: a 32-bit score is the float
/// its JSON spells, as everywhere else (see [`float`]).
fn whole<'py>(py: Python<'py>, value: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    // The contract's structs are plain data: they always serialise.
    let json = serde_json::to_vec(value).unwrap_or_default();
    data(py, &serde_json::from_slice(&json).unwrap_or_default())
}

/// A 32-bit score as the float its JSON spells (`0.731`, not `0.7310000061988831`), so an
/// embedded answer and a server's read the same.
fn float(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// `T` from a server's JSON `answer`, or `unexpected_answer` saying which part did not fit.
pub(crate) fn parsed<T: DeserializeOwned>(py: Python<'_>, answer: &[u8]) -> PyResult<T> {
    serde_json::from_slice(answer).map_err(|e| {
        unexpected(
            py,
            format!(
                "the answer does not have the shape this package reads ({e}); is the server \
                 a different version of shadowbrain?"
            ),
        )
    })
}

/// The package's own `ShadowbrainError` (code `unexpected_answer`): a caller of
/// `Recall.from_json` catches the one error class every other call raises.
fn unexpected(py: Python<'_>, message: String) -> PyErr {
    raised(py, "error_from", ("unexpected_answer", message))
}

/// `obj`'s class and `from_json`, and its JSON: what `pickle` calls to make it again.
fn reduce<'py>(obj: &Bound<'py, PyAny>, value: &impl Serialize) -> PyResult<Bound<'py, PyTuple>> {
    let py = obj.py();
    // The contract's structs are plain data: they always serialise.
    let json = serde_json::to_vec(value).unwrap_or_default();
    let rebuild = obj.get_type().getattr("from_json")?;
    PyTuple::new(
        py,
        [
            rebuild,
            PyTuple::new(py, [PyBytes::new(py, &json)])?.into_any(),
        ],
    )
}

/// `'text'`, as Python's `repr` writes a string.
fn quoted(py: Python<'_>, text: &str) -> PyResult<String> {
    Ok(PyString::new(py, text).repr()?.to_string())
}

/// The policy that ranked an answer or decided about a record.
#[pyclass(frozen, eq, module = "shadowbrain._native")]
#[derive(PartialEq)]
pub(crate) struct PolicyRef(api::PolicyRef);

#[pymethods]
impl PolicyRef {
    /// Its name.
    #[getter]
    fn name(&self) -> &str {
        &self.0.name
    }

    /// The hex hash of its compiled form.
    #[getter]
    fn hash(&self) -> &str {
        &self.0.hash
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "PolicyRef(name={}, hash={})",
            quoted(py, &self.0.name)?,
            quoted(py, &self.0.hash)?
        ))
    }
}

/// Feedback counts: recalls that helped and that did not.
#[pyclass(frozen, eq, module = "shadowbrain._native")]
#[derive(PartialEq)]
pub(crate) struct Utility(api::UtilityOut);

#[pymethods]
impl Utility {
    #[getter]
    fn successes(&self) -> u32 {
        self.0.successes
    }

    #[getter]
    fn failures(&self) -> u32 {
        self.0.failures
    }

    fn __repr__(&self) -> String {
        format!(
            "Utility(successes={}, failures={})",
            self.0.successes, self.0.failures
        )
    }
}

/// A record's place among the values of its fact (on `get`, `mark`, `resolve`, `forget`).
#[pyclass(frozen, eq, module = "shadowbrain._native")]
#[derive(PartialEq)]
pub(crate) struct Chain(api::ChainOut);

#[pymethods]
impl Chain {
    /// The records it superseded.
    #[getter]
    fn supersedes(&self) -> Vec<String> {
        self.0.supersedes.clone()
    }

    /// The newer values after it, oldest first, ending with the current one.
    #[getter]
    fn newer(&self) -> Vec<String> {
        self.0.newer.clone()
    }

    #[getter]
    fn learned_at(&self) -> Option<i64> {
        self.0.learned_at
    }

    #[getter]
    fn duplicate_of(&self) -> Option<&str> {
        self.0.duplicate_of.as_deref()
    }

    fn __repr__(&self) -> String {
        format!(
            "Chain(supersedes={:?}, newer={:?}, learned_at={}, duplicate_of={})",
            self.0.supersedes,
            self.0.newer,
            optional(self.0.learned_at),
            self.0
                .duplicate_of
                .as_deref()
                .map_or("None".into(), |d| format!("'{d}'"))
        )
    }
}

/// `Some(x)` as `x`, `None` as `None`, as Python writes them.
fn optional(x: Option<i64>) -> String {
    x.map_or("None".into(), |x| x.to_string())
}

/// A stored memory: every field of the contract's record.
#[pyclass(frozen, subclass, module = "shadowbrain._native")]
pub(crate) struct Record(api::Memory);

impl Record {
    fn describe(&self, py: Python<'_>, extra: &str) -> PyResult<String> {
        let m = &self.0;
        Ok(format!(
            "id={}{extra}, kind={}, tier={}, status={}, session_id={}, text={}",
            quoted(py, &m.id)?,
            quoted(py, m.kind.as_str())?,
            quoted(py, m.tier.as_str())?,
            quoted(py, m.status.as_str())?,
            quoted(py, &m.session_id)?,
            quoted(py, &m.text)?,
        ))
    }
}

#[pymethods]
impl Record {
    /// A record from the contract's JSON (a server's answer, or `pickle`'s).
    #[staticmethod]
    fn from_json(py: Python<'_>, data: &[u8]) -> PyResult<Record> {
        Ok(Record(parsed(py, data)?))
    }

    /// The contract's JSON of the record, as Python data.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        whole(py, &self.0)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        reduce(slf.as_any(), &slf.get().0)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Record({})", self.describe(py, "")?))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        // `Recalled` has its own: a record equals a record, not a recalled memory of it.
        match other.cast::<Record>() {
            Ok(other) => other.is_exact_instance_of::<Record>() && self.0 == other.get().0,
            Err(_) => false,
        }
    }

    /// `mem-…`.
    #[getter]
    fn id(&self) -> &str {
        &self.0.id
    }

    #[getter]
    fn namespace(&self) -> &str {
        &self.0.namespace
    }

    #[getter]
    fn session_id(&self) -> &str {
        &self.0.session_id
    }

    #[getter]
    fn agent_id(&self) -> Option<&str> {
        self.0.agent_id.as_deref()
    }

    /// `episodic`, `condensed` or `knowledge`.
    #[getter]
    fn tier(&self) -> &'static str {
        self.0.tier.as_str()
    }

    #[getter]
    fn kind(&self) -> &str {
        self.0.kind.as_str()
    }

    #[getter]
    fn text(&self) -> &str {
        &self.0.text
    }

    /// Structured content (`None` when none).
    #[getter]
    fn content<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        data(py, &self.0.content)
    }

    /// Free-form metadata (`None` when none).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        data(py, &self.0.metadata)
    }

    #[getter]
    fn parent_id(&self) -> Option<&str> {
        self.0.parent_id.as_deref()
    }

    /// When it happened, milliseconds since the epoch (`timestamp` in RFC 3339).
    #[getter]
    fn event_time(&self) -> i64 {
        self.0.event_time
    }

    #[getter]
    fn timestamp(&self) -> &str {
        &self.0.timestamp
    }

    #[getter]
    fn recorded_time(&self) -> i64 {
        self.0.recorded_time
    }

    #[getter]
    fn importance(&self) -> f64 {
        float(self.0.importance)
    }

    #[getter]
    fn strength(&self) -> f64 {
        float(self.0.strength)
    }

    #[getter]
    fn strength_at(&self) -> i64 {
        self.0.strength_at
    }

    #[getter]
    fn reinforcements(&self) -> u32 {
        self.0.reinforcements
    }

    #[getter]
    fn utility(&self) -> Utility {
        Utility(self.0.utility.clone())
    }

    /// `active`, `pinned`, `obsolete`, `archived` or `wrong`.
    #[getter]
    fn status(&self) -> &'static str {
        self.0.status.as_str()
    }

    #[getter]
    fn status_at(&self) -> i64 {
        self.0.status_at
    }

    #[getter]
    fn sources(&self) -> Vec<String> {
        self.0.sources.clone()
    }

    #[getter]
    fn policy(&self) -> PolicyRef {
        PolicyRef(self.0.policy.clone())
    }

    #[getter]
    fn superseded_by(&self) -> Option<&str> {
        self.0.superseded_by.as_deref()
    }

    #[getter]
    fn valid_until(&self) -> Option<i64> {
        self.0.valid_until
    }

    #[getter]
    fn conflicts(&self) -> Vec<String> {
        self.0.conflicts.clone()
    }

    #[getter]
    fn chain(&self) -> Option<Chain> {
        self.0.chain.clone().map(Chain)
    }
}

/// Which passage of a long memory matched: byte offsets into its `text`.
#[pyclass(frozen, eq, module = "shadowbrain._native")]
#[derive(PartialEq)]
pub(crate) struct Passage(api::PassageOut);

#[pymethods]
impl Passage {
    #[getter]
    fn index(&self) -> u32 {
        self.0.index
    }

    #[getter]
    fn of(&self) -> u32 {
        self.0.of
    }

    #[getter]
    fn start(&self) -> u32 {
        self.0.start
    }

    #[getter]
    fn end(&self) -> u32 {
        self.0.end
    }

    fn __repr__(&self) -> String {
        let p = &self.0;
        format!(
            "Passage(index={}, of={}, start={}, end={})",
            p.index, p.of, p.start, p.end
        )
    }
}

/// The parts of a recalled memory's score, and what is known against it.
#[pyclass(frozen, eq, module = "shadowbrain._native")]
#[derive(PartialEq)]
pub(crate) struct Why(api::WhyOut);

#[pymethods]
impl Why {
    #[getter]
    fn relevance(&self) -> f64 {
        float(self.0.relevance)
    }

    #[getter]
    fn recency(&self) -> f64 {
        float(self.0.recency)
    }

    #[getter]
    fn importance(&self) -> f64 {
        float(self.0.importance)
    }

    #[getter]
    fn utility(&self) -> f64 {
        float(self.0.utility)
    }

    #[getter]
    fn passage(&self) -> Option<Passage> {
        self.0.passage.clone().map(Passage)
    }

    #[getter]
    fn superseded_by(&self) -> Option<&str> {
        self.0.superseded_by.as_deref()
    }

    #[getter]
    fn valid_until(&self) -> Option<i64> {
        self.0.valid_until
    }

    #[getter]
    fn conflicts_with(&self) -> Vec<String> {
        self.0.conflicts_with.clone()
    }

    fn __repr__(&self) -> String {
        let w = &self.0;
        format!(
            "Why(relevance={}, recency={}, importance={}, utility={})",
            float(w.relevance),
            float(w.recency),
            float(w.importance),
            float(w.utility)
        )
    }
}

/// A recalled memory: the record, its score under the policy, and why.
#[pyclass(frozen, extends = Record, module = "shadowbrain._native")]
pub(crate) struct Recalled {
    score: f32,
    why: api::WhyOut,
}

impl Recalled {
    fn create(py: Python<'_>, recalled: api::Recalled) -> PyResult<Py<Recalled>> {
        let init = PyClassInitializer::from(Record(recalled.memory)).add_subclass(Recalled {
            score: recalled.score,
            why: recalled.why,
        });
        Py::new(py, init)
    }

    /// The contract's struct again (for its JSON).
    fn whole(slf: &Bound<'_, Self>) -> api::Recalled {
        let this = slf.get();
        api::Recalled {
            memory: slf.as_super().get().0.clone(),
            score: this.score,
            why: this.why.clone(),
        }
    }
}

#[pymethods]
impl Recalled {
    /// A recalled memory from the contract's JSON.
    #[staticmethod]
    fn from_json(py: Python<'_>, data: &[u8]) -> PyResult<Py<Recalled>> {
        Recalled::create(py, parsed(py, data)?)
    }

    /// The contract's JSON of the recalled memory, as Python data.
    fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        whole(slf.py(), &Recalled::whole(slf))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        reduce(slf.as_any(), &Recalled::whole(slf))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let extra = format!(", score={}", float(slf.get().score));
        Ok(format!(
            "Recalled({})",
            slf.as_super().get().describe(slf.py(), &extra)?
        ))
    }

    fn __eq__(slf: &Bound<'_, Self>, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<Recalled>() {
            Ok(other) => {
                let (a, b) = (slf.get(), other.get());
                a.score == b.score
                    && a.why == b.why
                    && slf.as_super().get().0 == other.as_super().get().0
            }
            Err(_) => false,
        }
    }

    /// The policy's total score.
    #[getter]
    fn score(&self) -> f64 {
        float(self.score)
    }

    /// The score's parts.
    #[getter]
    fn why(&self) -> Why {
        Why(self.why.clone())
    }
}

/// A recall's answer: the memories best first, and `context`, the same memories rendered
/// for a prompt in time order within the token budget.
#[pyclass(frozen, module = "shadowbrain._native")]
pub(crate) struct Recall {
    recall_id: Option<String>,
    policy: api::PolicyRef,
    memories: Vec<Py<Recalled>>,
    context: String,
    notes: Vec<String>,
}

impl Recall {
    /// The answer's objects, built as the runtime gave them (nothing converted yet).
    pub(crate) fn new(py: Python<'_>, out: api::RecallOut) -> PyResult<Recall> {
        let memories = out
            .memories
            .into_iter()
            .map(|m| Recalled::create(py, m))
            .collect::<PyResult<_>>()?;
        Ok(Recall {
            recall_id: out.recall_id,
            policy: out.policy,
            memories,
            context: out.context,
            notes: out.notes,
        })
    }

    fn whole(&self, py: Python<'_>) -> api::RecallOut {
        api::RecallOut {
            recall_id: self.recall_id.clone(),
            policy: self.policy.clone(),
            memories: self
                .memories
                .iter()
                .map(|m| Recalled::whole(m.bind(py)))
                .collect(),
            context: self.context.clone(),
            notes: self.notes.clone(),
        }
    }
}

#[pymethods]
impl Recall {
    /// A recall's answer from the contract's JSON (a server's answer, or `pickle`'s).
    #[staticmethod]
    fn from_json(py: Python<'_>, data: &[u8]) -> PyResult<Recall> {
        Recall::new(py, parsed(py, data)?)
    }

    /// The contract's JSON of the answer, as Python data.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        whole(py, &self.whole(py))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        reduce(slf.as_any(), &slf.get().whole(slf.py()))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let memories = self
            .memories
            .iter()
            .map(|m| Ok(m.bind(py).repr()?.to_string()))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(format!(
            "Recall(recall_id={}, memories=[{}], context={} characters)",
            self.recall_id
                .as_deref()
                .map_or(Ok("None".into()), |id| quoted(py, id))?,
            memories.join(", "),
            self.context.chars().count()
        ))
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Recall>() {
            Ok(other) => Ok(self.whole(py) == other.get().whole(py)),
            Err(_) => Ok(false),
        }
    }

    /// Give it to `feedback` to credit every memory of this answer (`None` when the
    /// answer was not kept).
    #[getter]
    fn recall_id(&self) -> Option<&str> {
        self.recall_id.as_deref()
    }

    /// The policy that ranked it.
    #[getter]
    fn policy(&self) -> PolicyRef {
        PolicyRef(self.policy.clone())
    }

    /// The memories, best first.
    #[getter]
    fn memories<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.memories.iter().map(|m| m.bind(py)))
    }

    /// The memories rendered for a prompt, in time order, within the token budget.
    #[getter]
    fn context(&self) -> &str {
        &self.context
    }

    /// What the answer went without and why (an unreachable embedder, say).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// The records of a server's answer: the array at `field` of its JSON object, or the
/// answer itself, one record, when `field` is `None`.
#[pyfunction]
#[pyo3(signature = (answer, field=None))]
pub(crate) fn records(py: Python<'_>, answer: &[u8], field: Option<&str>) -> PyResult<Vec<Record>> {
    match field {
        None => Ok(vec![Record(parsed(py, answer)?)]),
        Some(field) => {
            let mut object: serde_json::Map<String, serde_json::Value> = parsed(py, answer)?;
            let items = object.remove(field).unwrap_or_default();
            let items: Vec<api::Memory> = serde_json::from_value(items).map_err(|e| {
                unexpected(
                    py,
                    format!(
                        "`{field}` of the answer is not a list of records ({e}); is the server \
                         a different version of shadowbrain?"
                    ),
                )
            })?;
            Ok(items.into_iter().map(Record).collect())
        }
    }
}

//! The one error type of the substrate. Every public entry returns [`Result`]; messages say
//! what was wrong and how to fix it, because they reach agents and operators verbatim (the
//! HTTP layer maps variants to status codes, never rewrites the text).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// `Result` with the substrate's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The error a backend or an index library reported, kept as the [`Error`]'s source so a
/// caller can walk the chain. Shared, because one failed group commit answers every writer
/// in the group with it.
pub type Source = Arc<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong in the substrate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input that is well-formed but not acceptable (bad id, empty text, NaN embedding …).
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field or argument at fault, e.g. `text` or `session_id`.
        field: String,
        /// What was wrong and how to fix it.
        reason: String,
    },
    /// Input over a configured size limit.
    #[error("{field} is too large: {size} bytes, the limit is {limit}; {hint}")]
    TooLarge {
        /// The field or argument at fault.
        field: String,
        /// The size that was sent.
        size: usize,
        /// The configured limit.
        limit: usize,
        /// How to get under the limit.
        hint: String,
    },
    /// An embedding whose dimension differs from the store's.
    #[error(
        "embedding has {got} dimensions but this store was created with {expected}; \
         send {expected}-dimensional vectors, or run `shadowbrain reindex` to rebuild the \
         store's indexes for the new embedder"
    )]
    DimensionMismatch {
        /// Dimension of the vector that was offered.
        got: usize,
        /// Dimension recorded in the store.
        expected: usize,
    },
    /// A record, session or recall that does not exist (or lives in another namespace).
    #[error("{what} `{id}` not found")]
    NotFound {
        /// What kind of thing was looked up (`memory`, `session`, `recall`).
        what: &'static str,
        /// The id that was asked for.
        id: String,
    },
    /// A policy file that does not compile; every problem is listed.
    #[error(transparent)]
    Policy(#[from] PolicyErrors),
    /// The ordered key-value store failed.
    #[error("storage error ({backend}): {message}")]
    Storage {
        /// `sled` or `lmdb`.
        backend: &'static str,
        /// The backend's own message, or what the store found wrong.
        message: String,
        /// The backend's error, when it reported one.
        #[source]
        source: Option<Source>,
    },
    /// The disk holding the data directory is full: nothing of the write was stored.
    /// Writes succeed again by themselves once space is freed; reads keep working.
    #[error(
        "the disk holding {dir} is full ({free_bytes} bytes free; the store said: {message}): \
         nothing of this write was stored; free space on that disk or move the data \
         directory to a larger one, then retry (writes resume by themselves; reads keep \
         working meanwhile)",
        dir = dir.display()
    )]
    StorageFull {
        /// The store's directory.
        dir: PathBuf,
        /// Bytes an unprivileged writer may still use on that filesystem.
        free_bytes: u64,
        /// The backend's own message.
        message: String,
        /// The backend's error, when it reported one.
        #[source]
        source: Option<Source>,
    },
    /// A derived index (vector or keyword) failed; it can be rebuilt from the store.
    #[error("{index} index error: {message}; if it persists, run `shadowbrain reindex`")]
    Index {
        /// `vector` or `keyword`.
        index: &'static str,
        /// The index's own message.
        message: String,
        /// The index library's error, when it reported one.
        #[source]
        source: Option<Source>,
    },
    /// The data directory was written by another on-disk format version.
    #[error(
        "the data directory uses on-disk format {found}, this build reads format {expected}; \
         use a matching shadowbrain version, or export with it and import here"
    )]
    FormatVersion {
        /// The version found on disk.
        found: u32,
        /// The version this build writes.
        expected: u32,
    },
    /// Stored bytes that do not decode: a bug or on-disk damage.
    #[error("corrupt data under key {key}: {message}")]
    Corrupt {
        /// The key (printable form) whose value would not decode.
        key: String,
        /// The decoder's message.
        message: String,
    },
    /// An embedding or LLM provider failed after its retries.
    #[error("provider `{provider}` failed: {message}")]
    Provider {
        /// Provider name (`openai`, `hash` …).
        provider: String,
        /// What happened, never including secrets.
        message: String,
    },
    /// A namespace has spent its hourly LLM token budget (`[llm] tokens_per_hour`); rules
    /// and extractive condensation stand in until the hour turns.
    #[error(
        "namespace `{namespace}` has spent its LLM budget for this hour ({spent} of {limit} \
         tokens); rules stand in until {until}; raise [llm] tokens_per_hour to spend more"
    )]
    OverBudget {
        /// The namespace.
        namespace: String,
        /// Tokens spent this hour.
        spent: u64,
        /// The hourly limit.
        limit: u64,
        /// When the next hour starts (`11:00 UTC`).
        until: String,
    },
    /// A file-system operation failed.
    #[error("I/O error at {}: {source}", path.display())]
    Io {
        /// The path that was being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The store is shutting down or its writer thread is gone.
    #[error("the store is closed; reopen the data directory")]
    Closed,
    /// A part of the actor runtime could not take the request (stopped, restarting or
    /// shutting down).
    #[error("{what} is unavailable: {message}; retry, and if it persists check the log")]
    Unavailable {
        /// What was asked (e.g. "session `s1`").
        what: String,
        /// Why it could not answer.
        message: String,
    },
    /// A request to the actor runtime did not answer in time.
    #[error("{what} did not answer within {after_ms} ms; retry, or raise the call timeout")]
    Timeout {
        /// What was asked.
        what: String,
        /// The timeout that expired, in milliseconds.
        after_ms: u64,
    },
    /// An actor failed (panicked) while handling the request; it was restarted, and the
    /// request had no effect.
    #[error("{what} failed while handling the request: {message}; it was restarted, retry")]
    Panicked {
        /// What was asked.
        what: String,
        /// The panic message.
        message: String,
    },
    /// Something that cannot happen did (a task panicked, an invariant broke): a bug, not
    /// the caller's fault. The server answers 500 `internal` and logs it.
    #[error("internal error in {what}: {message}; this is a bug, please report it with the log")]
    Internal {
        /// What failed.
        what: String,
        /// What happened.
        message: String,
    },
    /// The input kept making an actor fail and was set aside (see [`crate::QuarantineEntry`]).
    #[error(
        "the input was quarantined as `{id}` because processing it kept failing ({message}); \
         inspect it with the history of `{id}`, and send it again once the fault is fixed"
    )]
    Quarantined {
        /// The id its quarantine entry is kept under.
        id: String,
        /// The last error.
        message: String,
    },
}

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Index`] with a message of our own.
    pub fn index(index: &'static str, message: impl fmt::Display) -> Self {
        Error::Index {
            index,
            message: message.to_string(),
            source: None,
        }
    }

    /// [`Error::Index`] for an error the index library reported, kept as the source.
    pub fn index_failed(
        index: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Index {
            index,
            message: source.to_string(),
            source: Some(Arc::new(source)),
        }
    }

    /// [`Error::Storage`] with a message of our own (no backend error behind it).
    pub fn storage(backend: &'static str, message: impl Into<String>) -> Self {
        Error::Storage {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Storage`] for an error the backend reported, kept as the source.
    pub fn storage_failed(
        backend: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Storage {
            backend,
            message: source.to_string(),
            source: Some(Arc::new(source)),
        }
    }

    /// Shorthand for [`Error::Internal`].
    pub fn internal(what: impl Into<String>, message: impl fmt::Display) -> Self {
        Error::Internal {
            what: what.into(),
            message: message.to_string(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// One problem found while compiling a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyIssue {
    /// The file the policy came from (or `<inline>` / `<default>`).
    pub file: String,
    /// The dotted key at fault, e.g. `scoring.recency_half_life`.
    pub key: String,
    /// What was wrong and how to fix it.
    pub reason: String,
}

impl fmt::Display for PolicyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.file, self.key, self.reason)
    }
}

/// Every problem found in one policy file: compilation never stops at the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyIssue>);

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "policy has {n} error{}", if n == 1 { "" } else { "s" })?;
        for issue in &self.0 {
            write!(f, "\n  - {issue}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::storage_failed("sled", e)
    }
}

impl From<heed::Error> for Error {
    fn from(e: heed::Error) -> Self {
        Error::storage_failed("lmdb", e)
    }
}

impl From<arroy::Error> for Error {
    fn from(e: arroy::Error) -> Self {
        Error::index_failed("vector", e)
    }
}

impl From<tantivy::TantivyError> for Error {
    fn from(e: tantivy::TantivyError) -> Self {
        Error::index_failed("keyword", e)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn backend_errors_keep_their_source_and_their_text() {
        let lmdb = heed::Error::Mdb(heed::MdbError::MapFull);
        let shown = lmdb.to_string();
        let e = Error::from(lmdb);
        assert_eq!(e.to_string(), format!("storage error (lmdb): {shown}"));
        let source = e.source().expect("the backend's error is kept");
        assert_eq!(source.to_string(), shown);
        // One failed group commit answers many writers: the source is shared, not lost.
        let Error::Storage { source, .. } = &e else {
            unreachable!()
        };
        let copy = Error::Storage {
            backend: "lmdb",
            message: shown.clone(),
            source: source.clone(),
        };
        assert_eq!(copy.source().map(|s| s.to_string()), Some(shown));
        // Messages of our own have no source to show.
        assert!(Error::storage("lmdb", "ids exhausted").source().is_none());
    }

    #[test]
    fn an_internal_failure_says_it_is_a_bug() {
        let e = Error::internal("recall ranking", "task 7 panicked");
        assert_eq!(
            e.to_string(),
            "internal error in recall ranking: task 7 panicked; this is a bug, please report \
             it with the log"
        );
    }
}

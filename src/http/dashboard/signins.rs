//! The dashboard's sign-ins: a random token per sign-in, mapped to the key's namespace and
//! role, kept in this process's memory or, in cluster mode, in a store every node shares;
//! bounded in number overall and per key, and in how fast one key may start them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::answer::UiError;
use crate::auth::{Role, digest, random_token};

/// How long a sign-in lasts.
pub(crate) const SIGN_IN_FOR: Duration = Duration::from_secs(12 * 3600);

/// Sign-ins kept at most in memory; past it the key holding the most makes room, its
/// sign-in closest to expiry.
const MAX_SIGN_INS: usize = 10_000;

/// Sign-ins one key holds at most; past it that key's own sign-in closest to expiry makes
/// room, never another key's.
const MAX_SIGN_INS_PER_KEY: usize = 100;

/// Sign-ins one key may start per minute (on each node); past it the form answers 429.
const SIGN_INS_PER_MINUTE: u32 = 20;

/// What a [`SharedSignIns`] answers.
pub(crate) type Shared<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// Sign-ins every node of a cluster reads and writes (`crate::cluster`). Each is named by
/// the hex SHA-256 of its token; the store forgets it after [`SIGN_IN_FOR`] at most.
/// Errors are the store's words, shown to the visitor with a 503.
pub(crate) trait SharedSignIns: Send + Sync {
    /// Keeps `sign_in` as `name`.
    fn put<'a>(&'a self, name: &'a str, sign_in: &'a SignIn) -> Shared<'a, ()>;
    /// The sign-in named `name`, if any.
    fn get<'a>(&'a self, name: &'a str) -> Shared<'a, Option<SignIn>>;
    /// Forgets the sign-in named `name`.
    fn delete<'a>(&'a self, name: &'a str) -> Shared<'a, ()>;
    /// The forms' token while no keys are configured: the same on every node.
    fn open_csrf(&self) -> Shared<'_, String>;
}

/// The sign-ins in force.
pub(crate) struct Logins {
    kept: SignInStore,
    /// Per key (by its SHA-256): sign-ins started in the current minute, and when it began.
    started: Mutex<HashMap<String, (u32, std::time::Instant)>>,
}

enum SignInStore {
    /// One server: by the SHA-256 of their token, and the forms' token while no keys are
    /// configured (random per start).
    Here {
        map: Mutex<HashMap<String, SignIn>>,
        open_csrf: String,
    },
    /// A cluster's nodes.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Shared(Arc<dyn SharedSignIns>),
}

/// One sign-in: whose, what its forms carry, and until when (Unix seconds, so that every
/// node of a cluster reads the same instant).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SignIn {
    pub(super) namespace: String,
    pub(super) admin: bool,
    pub(super) csrf: String,
    pub(super) expires: u64,
    /// The hex SHA-256 of the key it was made with (what the config holds, never the key):
    /// the caps count per key.
    #[serde(default)]
    pub(super) key: String,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The sign-ins could not be read or written (a cluster's NATS did not answer, or its
/// bucket is full).
fn unavailable(e: String) -> UiError {
    UiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("the cluster's sign-ins cannot be read or kept now ({e}); retry shortly"),
    )
}

impl Logins {
    /// Sign-ins in this process's memory: a restart signs everyone out.
    pub(crate) fn here() -> Self {
        Logins {
            kept: SignInStore::Here {
                map: Mutex::new(HashMap::new()),
                open_csrf: random_token(),
            },
            started: Mutex::new(HashMap::new()),
        }
    }

    /// Sign-ins every node of a cluster shares.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn shared(store: Arc<dyn SharedSignIns>) -> Self {
        Logins {
            kept: SignInStore::Shared(store),
            started: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a sign-in started with `key`; the wait when the key has started its
    /// [`SIGN_INS_PER_MINUTE`].
    fn rate(&self, key: &str) -> Option<Duration> {
        let now = std::time::Instant::now();
        let window = Duration::from_secs(60);
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if started.len() >= 10_000 {
            started.retain(|_, (_, since)| now.duration_since(*since) < window);
        }
        let entry = started.entry(key.to_string()).or_insert((0, now));
        if now.duration_since(entry.1) >= window {
            *entry = (0, now);
        }
        if entry.0 >= SIGN_INS_PER_MINUTE {
            return Some(window.saturating_sub(now.duration_since(entry.1)));
        }
        entry.0 += 1;
        None
    }

    /// A new sign-in for a key (its hex SHA-256), namespace and role: its token (for the
    /// cookie). Past [`SIGN_INS_PER_MINUTE`] for the key, 429.
    pub(super) async fn start(
        &self,
        key: String,
        namespace: String,
        role: Role,
    ) -> Result<String, UiError> {
        if let Some(wait) = self.rate(&key) {
            return Err(UiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_sign_ins",
                format!(
                    "this key started {SIGN_INS_PER_MINUTE} sign-ins in the last minute; wait \
                     {}s and sign in again",
                    wait.as_secs().max(1)
                ),
            ));
        }
        let token = random_token();
        let now = unix_now();
        let sign_in = SignIn {
            namespace,
            admin: role == Role::Admin,
            csrf: random_token(),
            expires: now + SIGN_IN_FOR.as_secs(),
            key,
        };
        match &self.kept {
            SignInStore::Here { map, .. } => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                map.retain(|_, s| s.expires > now);
                let own = map.values().filter(|s| s.key == sign_in.key).count();
                // Room is made by the key holding the most: this one at its own cap, else
                // whichever key has the largest share when the whole table is full. So
                // one key's sign-ins never sign another key's visitor out.
                let evict = if own >= MAX_SIGN_INS_PER_KEY {
                    Some(sign_in.key.clone())
                } else if map.len() >= MAX_SIGN_INS {
                    let mut counts: HashMap<&str, usize> = HashMap::new();
                    for s in map.values() {
                        *counts.entry(s.key.as_str()).or_default() += 1;
                    }
                    counts
                        .into_iter()
                        .max_by_key(|&(_, n)| n)
                        .map(|(k, _)| k.to_string())
                } else {
                    None
                };
                if let Some(key) = evict
                    && let Some(oldest) = map
                        .iter()
                        .filter(|(_, s)| s.key == key)
                        .min_by_key(|(_, s)| s.expires)
                        .map(|(k, _)| k.clone())
                {
                    map.remove(&oldest);
                }
                map.insert(digest(&token), sign_in);
            }
            SignInStore::Shared(store) => store
                .put(&digest(&token), &sign_in)
                .await
                .map_err(unavailable)?,
        }
        Ok(token)
    }

    pub(super) async fn find(&self, token: &str) -> Result<Option<SignIn>, UiError> {
        let found = match &self.kept {
            SignInStore::Here { map, .. } => map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&digest(token))
                .cloned(),
            SignInStore::Shared(store) => store.get(&digest(token)).await.map_err(unavailable)?,
        };
        Ok(found.filter(|s| s.expires > unix_now()))
    }

    pub(super) async fn end(&self, token: &str) -> Result<(), UiError> {
        match &self.kept {
            SignInStore::Here { map, .. } => {
                map.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&digest(token));
                Ok(())
            }
            SignInStore::Shared(store) => store.delete(&digest(token)).await.map_err(unavailable),
        }
    }

    pub(super) async fn open_csrf(&self) -> Result<String, UiError> {
        match &self.kept {
            SignInStore::Here { open_csrf, .. } => Ok(open_csrf.clone()),
            SignInStore::Shared(store) => store.open_csrf().await.map_err(unavailable),
        }
    }
}

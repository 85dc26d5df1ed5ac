//! The dashboard's sign-ins in cluster mode: a replicated JetStream KV bucket every node
//! reads, so a visitor who signed in through one node is signed in at every node — the one
//! that serves the page (its namespace's partition owner), the one a later page enters at,
//! and the one that owns the partition after a takeover. Each sign-in is kept under the hex
//! SHA-256 of its cookie's token (never the token, never the API key); the bucket forgets
//! an entry after the sign-in's lifetime, and signing out deletes it at once everywhere.
//! Every entry is sealed under the cluster secret and bound to its name ([`super::seal`]):
//! one that no node wrote, or that was moved to another name, is no sign-in.

use std::sync::Arc;

use async_nats::jetstream::kv;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;

use super::seal::{Kind, Sealer};
use crate::auth::random_token;
use crate::http::dashboard::{SharedSignIns, SignIn};

/// The key of the forms' token while no keys are configured (not a hex digest, so never a
/// sign-in's).
const OPEN_CSRF: &str = "open-csrf";

/// The bucket's size limit: some hundred thousand sign-ins. Past it new sign-ins are
/// refused (JetStream keeps what it has) until old ones expire; the visitor is told so.
pub(super) const MAX_BYTES: i64 = 64 << 20;

/// [`SharedSignIns`] on a KV bucket.
pub(super) struct KvSignIns {
    pub(super) bucket: kv::Store,
    pub(super) sealer: Arc<Sealer>,
}

impl KvSignIns {
    fn seal(&self, name: &str, value: &[u8]) -> bytes::Bytes {
        self.sealer
            .seal(Kind::SignIn, &[name.as_bytes()], value)
            .into()
    }

    /// The value kept under `name`, if there is one a node sealed.
    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let found = self
            .bucket
            .get(name)
            .await
            .map_err(|e| format!("reading the sign-in: {e}"))?;
        let sealed = match found {
            Some(sealed) => sealed,
            // A get is answered by any replica of the bucket, and one that has not applied
            // a put acknowledged a moment ago (a sign-in just made) answers nothing: a
            // miss is asked of the stream's leader before it counts.
            None => match self.read_from_leader(name).await? {
                Some(sealed) => sealed,
                None => return Ok(None),
            },
        };
        match self.sealer.open(Kind::SignIn, &[name.as_bytes()], &sealed) {
            Ok(value) => Ok(Some(value.to_vec())),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a sign-in no node wrote");
                Ok(None)
            }
        }
    }

    /// The entry `name` as the bucket's stream leader holds it (`None`: none, or deleted).
    async fn read_from_leader(&self, name: &str) -> Result<Option<Bytes>, String> {
        let subject = format!("{}{name}", self.bucket.prefix);
        match self
            .bucket
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            // A delete or a purge leaves a marker with an operation header and no value.
            Ok(m) if m.headers.get("KV-Operation").is_some() => Ok(None),
            Ok(m) if m.headers.get("Nats-Marker-Reason").is_some() => Ok(None),
            Ok(m) => Ok(Some(m.payload)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(format!("reading the sign-in: {e}")),
        }
    }
}

impl SharedSignIns for KvSignIns {
    fn put<'a>(
        &'a self,
        name: &'a str,
        sign_in: &'a SignIn,
    ) -> crate::http::dashboard::Shared<'a, ()> {
        Box::pin(async move {
            let value = serde_json::to_vec(sign_in).expect("a sign-in serializes");
            self.bucket
                .put(name, self.seal(name, &value))
                .await
                .map(|_| ())
                .map_err(|e| format!("keeping the sign-in: {e}"))
        })
    }

    fn get<'a>(&'a self, name: &'a str) -> crate::http::dashboard::Shared<'a, Option<SignIn>> {
        Box::pin(async move {
            let Some(value) = self.read(name).await? else {
                return Ok(None);
            };
            // An entry another version wrote differently is no sign-in: sign in again.
            Ok(serde_json::from_slice(&value).ok())
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> crate::http::dashboard::Shared<'a, ()> {
        Box::pin(async move {
            self.bucket
                .delete(name)
                .await
                .map_err(|e| format!("ending the sign-in: {e}"))
        })
    }

    fn open_csrf(&self) -> crate::http::dashboard::Shared<'_, String> {
        Box::pin(async move {
            // The first node to need it makes it; the bucket forgets it with the sign-ins,
            // and the next node to need it makes a new one (a page older than that asks
            // for a reload when its form is sent).
            for _ in 0..3 {
                if let Some(token) = self.read(OPEN_CSRF).await? {
                    return Ok(String::from_utf8_lossy(&token).into_owned());
                }
                let token = random_token();
                let sealed = self.seal(OPEN_CSRF, token.as_bytes());
                match self.bucket.create(OPEN_CSRF, sealed.clone()).await {
                    Ok(_) => return Ok(token),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                        // Another node made one first, or something that is not a node
                        // wrote one: a sealed token replaces the latter.
                        if self.read(OPEN_CSRF).await?.is_none() {
                            self.bucket
                                .put(OPEN_CSRF, sealed)
                                .await
                                .map_err(|e| format!("making the forms' token: {e}"))?;
                            return Ok(token);
                        }
                    }
                    Err(e) => return Err(format!("making the forms' token: {e}")),
                }
            }
            Err("the forms' token kept changing; retry".to_string())
        })
    }
}

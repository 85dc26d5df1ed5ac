//! What acts on or shows the whole cluster: the policy reload on every node (asked, checked
//! everywhere, then applied), each node's status and metrics, and the sealed asks nodes
//! answer one another; and what a partition's router borrows of its node ([`NodeHandle`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::super::forward::{self};
use super::super::policy;
use super::state::*;
use crate::api::ApiError;
use crate::http::{ClusterNode, NodeFuture};
use crate::metrics::NodeFigures;

/// What the router of an owned partition may ask of its node ([`ClusterNode`]).
pub(super) struct NodeHandle(pub(super) Weak<Node>, pub(super) String);

impl NodeHandle {
    pub(super) fn node(&self) -> Result<Arc<Node>, ApiError> {
        self.0.upgrade().ok_or_else(|| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "this node is stopping; retry shortly (another node takes its partitions)",
            );
            e.retry_after = Some(1);
            e
        })
    }
}

impl ClusterNode for NodeHandle {
    fn name(&self) -> &str {
        &self.1
    }

    fn reload_policies(&self) -> NodeFuture<'_, ()> {
        Box::pin(async move { self.node()?.reload_everywhere().await })
    }

    fn statuses(&self) -> NodeFuture<'_, Vec<serde_json::Value>> {
        Box::pin(async move { self.node()?.statuses().await })
    }
}

/// Answers every node's asks for this node's [`Node::status`] until stopped.
pub(super) async fn answer_status_asks(
    node: Arc<Node>,
    mut asks: async_nats::Subscriber,
    stop: CancellationToken,
) {
    while let Some((message, reply)) = next_ask(&mut asks, &stop).await {
        if let Err(e) = forward::open_ask(&node.sealer, &message, &reply) {
            tracing::warn!(error = %e, "refusing a status ask");
            continue;
        }
        // `status` waits for nothing (a partition that is moving says so).
        let body = serde_json::to_vec(&node.status()).expect("a status serializes");
        let payload = forward::seal_reply(&node.sealer, &reply, &body);
        if let Err(e) = node.client.publish(reply, payload.into()).await {
            tracing::warn!(error = %e, "cannot answer a status ask");
        }
    }
}

/// The next ask another node sent on `asks` (with the subject to answer it on), or `None`
/// once stopped or unsubscribed; asks that want no answer are skipped.
pub(super) async fn next_ask(
    asks: &mut async_nats::Subscriber,
    stop: &CancellationToken,
) -> Option<(async_nats::Message, async_nats::Subject)> {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return None,
            m = asks.next() => m?,
        };
        if let Some(reply) = message.reply.clone() {
            return Some((message, reply));
        }
    }
}

/// Answers the policy reloads of every node (this one's included), each on a task of its
/// own, until stopped.
pub(super) async fn answer_policy_asks(
    node: Arc<Node>,
    mut asks: async_nats::Subscriber,
    stop: CancellationToken,
) {
    while let Some((message, reply)) = next_ask(&mut asks, &stop).await {
        let node = node.clone();
        let Ok(body) = forward::open_ask(&node.sealer, &message, &reply) else {
            tracing::warn!("refusing a policy ask without the cluster's seal");
            continue;
        };
        let ask = serde_json::from_slice::<policy::Ask>(body);
        tokio::spawn(async move {
            let outcome = match ask {
                Ok(ask) => node.answer_policy_ask(ask).await,
                Err(e) => policy::Outcome::failed(&ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_ask",
                    format!(
                        "an unreadable policy reload ask ({e}): are all nodes the same version?"
                    ),
                )),
            };
            let answer = policy::Reply {
                node: node.cfg.node.clone(),
                outcome,
            };
            let body = serde_json::to_vec(&answer).expect("a reply serializes");
            let payload = forward::seal_reply(&node.sealer, &reply, &body);
            if let Err(e) = node.client.publish(reply, payload.into()).await {
                tracing::warn!(error = %e, "cannot answer a policy reload");
            }
        });
    }
}
impl Node {
    pub(super) fn reloaded_policies(&self) -> Option<policy::Loaded> {
        self.reloaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `POST /v1/policy/reload` (an admin key): every live node reads its policy files;
    /// when all read the same valid policies, all make them active (see [`policy`]).
    pub(super) async fn reload_policies(&self, authorization: Option<&str>) -> Response {
        if let Err(e) = self.auth.admin(
            authorization,
            "this acts on the whole cluster and needs an admin key (`role = \"admin\"` in \
             `[[auth.keys]]`); a tenant key reaches its own namespace only",
        ) {
            return e.into_response();
        }
        if let Err(e) = self.reload_everywhere().await {
            return e.into_response();
        }
        let loaded = match self.reloaded_policies() {
            Some(loaded) => loaded,
            // Not a member yet when the reload began: what every member made active.
            None => match policy::read(&self.rt_config) {
                Ok(loaded) => loaded,
                Err(e) => return e.into_response(),
            },
        };
        let semantic = self.rt_config.substrate.embedder.is_semantic();
        axum::Json(loaded.answer(semantic)).into_response()
    }

    /// This node's view: members, and per partition its role, epoch and applied position
    /// (`GET /cluster`, and this node's part of the dashboard's cluster overview).
    pub(super) fn status(&self) -> serde_json::Value {
        let mut parts = Vec::new();
        for part in &self.partitions {
            // A takeover holds the role for as long as it takes (an index rebuild can take a
            // minute): say so rather than wait.
            let (name, epoch, applied, unbuilt) = match part.role.try_lock().as_deref() {
                Ok(Role::Owner(o)) => {
                    // Changes the indexes have not built yet (searched exactly meanwhile): a
                    // takeover of a big partition builds them in the background.
                    let sub = o.rt.substrate();
                    let unbuilt = json!({
                        "vectors": sub.vectors().pending(),
                        "keywords": sub.keywords().pending(),
                    });
                    ("owner", Some(o.epoch), None, Some(unbuilt))
                }
                Ok(Role::Standby(f)) => ("standby", None, Some(*f.applied.borrow()), None),
                Ok(Role::Idle) => ("idle", None, None, None),
                Ok(Role::Absent) => ("none", None, None, None),
                Err(_) => ("moving", None, None, None),
            };
            parts.push(json!({
                "partition": part.id,
                "role": name,
                "caught_up": part.is_warm(),
                "epoch": epoch,
                "applied": applied,
                "unbuilt": unbuilt,
            }));
        }
        let counters = &self.counters;
        let members = self.live.borrow().clone();
        json!({
            "node": self.cfg.node,
            "members": members.names,
            "copies": self.cfg.copies,
            "caught_up": members.warm,
            "partitions": parts,
            "log": {
                "entries": counters.entries.load(Ordering::Relaxed),
                "bytes": counters.bytes.load(Ordering::Relaxed),
                "retries": counters.retries.load(Ordering::Relaxed),
                "duplicates": counters.duplicates.load(Ordering::Relaxed),
            },
        })
    }

    /// `GET /metrics` (an admin key): this node's figures — the requests it answered, the
    /// runtimes of the partitions it owns (summed), its partitions by role and what it
    /// appended to the log. Each node is scraped on its own, as with any cluster.
    pub(super) async fn metrics(&self, authorization: Option<&str>) -> Response {
        if let Err(e) = self.auth.admin(
            authorization,
            "GET /metrics needs an admin key (`role = \"admin\"` in `[[auth.keys]]`): it \
             shows every namespace's activity on this node",
        ) {
            return e.into_response();
        }
        // Read before the runtimes: a runtime closed in between is then counted in
        // neither (the counters catch up at the next scrape), never in both.
        let retired = *self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let mut runtimes = Vec::new();
        let mut figures = NodeFigures::default();
        for part in &self.partitions {
            match part.role.try_lock().as_deref() {
                Ok(Role::Owner(o)) => {
                    figures.owner += 1;
                    runtimes.push(o.rt.clone());
                }
                Ok(Role::Standby(_)) => figures.standby += 1,
                Ok(Role::Idle) | Err(_) => figures.moving += 1,
                Ok(Role::Absent) => {}
            }
        }
        let counters = &self.counters;
        figures.members = self.live.borrow().names.len() as u64;
        figures.log_entries = counters.entries.load(Ordering::Relaxed);
        figures.log_bytes = counters.bytes.load(Ordering::Relaxed);
        figures.log_retries = counters.retries.load(Ordering::Relaxed);
        figures.log_duplicates = counters.duplicates.load(Ordering::Relaxed);
        self.metrics.set_node(figures);
        let text = self.metrics.render_all(&runtimes, retired).await;
        (
            [(
                axum::http::header::CONTENT_TYPE,
                crate::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response()
    }

    /// The check and the apply of a reload on every live node (see [`policy`]).
    pub(super) async fn reload_everywhere(&self) -> Result<(), ApiError> {
        let subject = format!("{}.policy", self.cfg.prefix);
        let members = self.live.borrow().names.clone();
        let patience = self.cfg.forward_timeout;
        let checked = policy::ask_all(
            &self.client,
            &self.sealer,
            &subject,
            &policy::Ask::Check,
            &members,
            patience,
        )
        .await?;
        let expect = policy::agreed(&checked, false)?;
        let ask = policy::Ask::Apply { expect };
        let applied = policy::ask_all(
            &self.client,
            &self.sealer,
            &subject,
            &ask,
            &members,
            patience,
        )
        .await?;
        policy::agreed(&applied, true).map(|_| ())
    }

    /// Every live node's [`Node::status`], gathered over NATS; a member that did not
    /// answer in time is listed with `"answered": false`.
    pub(super) async fn statuses(&self) -> Result<Vec<serde_json::Value>, ApiError> {
        let members = self.live.borrow().names.clone();
        let got = forward::gather(
            &self.client,
            &self.sealer,
            &format!("{}.status", self.cfg.prefix),
            Vec::new(),
            &members,
            Duration::from_secs(2),
            |v: serde_json::Value| (v["node"].as_str().unwrap_or("?").to_string(), v),
        )
        .await
        .map_err(|e| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("cannot reach the other nodes over NATS ({e}); retry shortly"),
            );
            e.retry_after = Some(1);
            e
        })?;
        let silent = members.iter().filter(|m| !got.contains_key(*m));
        let silent: Vec<serde_json::Value> = silent
            .map(|m| json!({"node": m, "answered": false}))
            .collect();
        Ok(got.into_values().chain(silent).collect())
    }

    /// This node's part of a reload: read the files; on `Apply`, make them active on every
    /// partition it owns and for every runtime it opens from now on.
    pub(super) async fn answer_policy_ask(&self, ask: policy::Ask) -> policy::Outcome {
        let config = self.rt_config.clone();
        let read = tokio::task::spawn_blocking(move || policy::read(&config))
            .await
            .unwrap_or_else(|e| {
                Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("reading the policy files failed inside the server: {e}"),
                ))
            });
        let loaded = match read {
            Ok(loaded) => loaded,
            Err(e) => return policy::Outcome::failed(&e),
        };
        let stamps = loaded.stamps();
        let policy::Ask::Apply { expect } = ask else {
            return policy::Outcome::Read(stamps);
        };
        if stamps != expect {
            return policy::Outcome::failed(&ApiError::new(
                StatusCode::CONFLICT,
                "policy_changed",
                "the policy files changed between the check and the apply; reload again",
            ));
        }
        let _one = self.applying.lock().await;
        // Set first: a takeover under way reads it when it opens its runtime, or its role
        // lock, taken below, waits for it to end.
        *self.reloaded.write().unwrap_or_else(|p| p.into_inner()) = Some(loaded.clone());
        for part in &self.partitions {
            if let Role::Owner(o) = &*part.role.lock().await {
                o.rt.substrate()
                    .set_policies(loaded.default.clone(), loaded.namespaces.clone());
            }
        }
        for (namespace, stamp) in &stamps {
            tracing::info!(namespace = %namespace, name = %stamp.name, hash = %stamp.hash, "policy reloaded on every partition of this node");
        }
        policy::Outcome::Read(stamps)
    }
}

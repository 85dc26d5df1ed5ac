//! A cluster placed by session (docs/cluster-placement.md): a namespace's records are in
//! every partition, so a partition's owner recalls and lists over the others too. It asks
//! each partition's owner over NATS request/reply on the partition's `parts` subject
//! ([`NatsPart`], a [`PartLink`]), sealed like a forwarded request, and an owner answers
//! those asks with its store ([`answer_parts`], [`Substrate::answer_part`]). Nothing but
//! nodes can ask: an ask whose seal does not verify, or that is stale or answered already,
//! is not answered.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use shadowbrain_runtime::{
    Error, IdBlock, KNOWLEDGE_SESSION, PartFuture, PartLink, Spread, Substrate,
};

use super::forward::{Unanswered, ask_owner};
use super::seal::{self, Kind, Sealer, SeenNonces};
use super::session_partition;

/// A round on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireAsk {
    /// The round ([`shadowbrain_runtime::PartAsk`], encoded by the runtime).
    ask: Vec<u8>,
    /// Fresh per attempt: the answer is sealed to it, and the owner answers it once.
    nonce: [u8; 16],
    /// When it was sealed (Unix ms): the owner refuses stale ones.
    issued: u64,
}

/// The subject partition `p`'s owner answers parts' rounds on.
pub(super) fn parts_subject(prefix: &str, p: u16) -> String {
    format!("{prefix}.parts.{p:03}")
}

/// What asking the other partitions needs.
#[derive(Debug, Clone)]
pub(super) struct Asker {
    pub(super) client: async_nats::Client,
    pub(super) sealer: Arc<Sealer>,
    pub(super) prefix: String,
    pub(super) partitions: u16,
    /// How long to wait through a takeover.
    pub(super) deadline: Duration,
}

/// Another partition, asked through its owner.
#[derive(Debug)]
pub(super) struct NatsPart {
    asker: Arc<Asker>,
    partition: u16,
    subject: String,
}

impl PartLink for NatsPart {
    fn ids(&self) -> IdBlock {
        IdBlock::of_partition(self.partition, self.asker.partitions)
    }

    fn ask(&self, ask: Vec<u8>, repeatable: bool) -> PartFuture<'_> {
        Box::pin(self.send(ask, repeatable))
    }
}

impl NatsPart {
    fn unavailable(&self, why: String) -> Error {
        Error::Unavailable {
            what: format!("partition {}", self.partition),
            message: why,
        }
    }

    /// Sends `ask` to the partition's owner through a takeover (`forward::ask_owner`), again
    /// when an attempt goes unanswered only if `repeatable`.
    async fn send(&self, ask: Vec<u8>, repeatable: bool) -> Result<Vec<u8>, Error> {
        let Asker {
            client,
            sealer,
            deadline,
            ..
        } = &*self.asker;
        let mut wire = WireAsk {
            ask,
            nonce: [0; 16],
            issued: 0,
        };
        let asked = ask_owner(
            client,
            &self.subject,
            *deadline,
            repeatable,
            |nonce, issued| {
                wire.nonce = nonce;
                wire.issued = issued;
                sealer.seal(
                    Kind::Request,
                    &[self.subject.as_bytes()],
                    &postcard::to_stdvec(&wire).expect("an ask serialises"),
                )
            },
        )
        .await;
        let (message, nonce) = match asked {
            Ok(answered) => answered,
            Err(Unanswered::Failed(e)) => {
                return Err(self.unavailable(format!(
                    "its owner did not answer within {} ({e}); retry shortly",
                    humantime::format_duration(*deadline)
                )));
            }
            Err(Unanswered::NoOwner) => {
                return Err(self.unavailable(format!(
                    "no node owned it within {}; retry shortly",
                    humantime::format_duration(*deadline)
                )));
            }
        };
        sealer
            .open(Kind::Answer, &[&nonce], &message.payload)
            .map(<[u8]>::to_vec)
            .map_err(|e| {
                self.unavailable(format!(
                    "its answer was refused ({e}); check that every node has the same cluster \
                     secret (secret_env) and version"
                ))
            })
    }
}

/// The other partitions of a cluster placed by session, for partition `me`'s runtime.
#[derive(Debug)]
pub(super) struct OtherPartitions {
    pub(super) asker: Arc<Asker>,
    pub(super) me: u16,
}

impl OtherPartitions {
    fn part(&self, p: u16) -> Arc<dyn PartLink> {
        Arc::new(NatsPart {
            asker: self.asker.clone(),
            partition: p,
            subject: parts_subject(&self.asker.prefix, p),
        })
    }
}

impl Spread for OtherPartitions {
    fn others(&self, _namespace: &str) -> Vec<Arc<dyn PartLink>> {
        (0..self.asker.partitions)
            .filter(|&p| p != self.me)
            .map(|p| self.part(p))
            .collect()
    }

    fn home(&self, namespace: &str) -> Option<Arc<dyn PartLink>> {
        let home = session_partition(namespace, KNOWLEDGE_SESSION, self.asker.partitions);
        (home != self.me).then(|| self.part(home))
    }
}

/// Answers what is sent to `asks`' subject with `substrate` (the owned partition's), each
/// on a task of its own, until the subscription ends (dropped with the partition).
pub(super) async fn answer_parts(
    client: async_nats::Client,
    sealer: Arc<Sealer>,
    seen: Arc<SeenNonces>,
    mut asks: async_nats::Subscriber,
    substrate: Substrate,
) {
    while let Some(message) = asks.next().await {
        let Some(reply) = message.reply.clone() else {
            continue;
        };
        let (client, sealer, seen, substrate) = (
            client.clone(),
            sealer.clone(),
            seen.clone(),
            substrate.clone(),
        );
        tokio::spawn(async move {
            let opened = sealer
                .open(
                    Kind::Request,
                    &[message.subject.as_bytes()],
                    &message.payload,
                )
                .map_err(|e| e.to_string())
                .and_then(|body| {
                    postcard::from_bytes::<WireAsk>(body).map_err(|e| {
                        format!("an unreadable ask ({e}); is every node on the same version?")
                    })
                })
                .and_then(|wire| {
                    seen.admit(wire.nonce, wire.issued, seal::now_ms())
                        .map(|()| wire)
                });
            let payload = match opened {
                Ok(wire) => {
                    let body = substrate.answer_part(wire.ask).await;
                    sealer.seal(Kind::Answer, &[&wire.nonce], &body)
                }
                Err(why) => {
                    tracing::warn!(subject = %message.subject, why, "refusing a part's round");
                    b"refused".to_vec()
                }
            };
            if let Err(e) = client.publish(reply, payload.into()).await {
                tracing::warn!(error = %e, "could not send a part's answer");
            }
        });
    }
}

//! `POST /v1/policy/reload` in cluster mode. Each partition's runtime holds the policies it
//! was opened with: a reload forwarded to one partition's owner, like any other request,
//! would change that partition alone, and a takeover would bring back the policies the
//! taking node started with. So the node that receives a reload asks every live node, over
//! NATS, to read its policy files (**check**); only when every one of them read them
//! without an error and to the same hashes does it ask them to make those policies active
//! (**apply**): on every partition each owns, and on every partition it takes over later.
//! Files with errors, nodes that read different policies, or a node that does not answer
//! leave every policy as it was, and the answer names the node and says why.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::api::ApiError;
use crate::api::PolicyOut;
use crate::api::requests::policy_out;
use crate::policy::Policy;
use crate::{PolicyStamp, RuntimeConfig};

/// What a reload asks of every node.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Ask {
    /// Read the files and say what they hold; change nothing.
    Check,
    /// Read the files again and make them active, if they still hold `expect`.
    Apply {
        expect: BTreeMap<String, PolicyStamp>,
    },
}

/// A node's answer to an [`Ask`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Reply {
    pub node: String,
    pub outcome: Outcome,
}

/// What a node read, or why it could not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum Outcome {
    /// The stamps of what the files hold: `*` for the default policy, then each
    /// namespace's own.
    Read(BTreeMap<String, PolicyStamp>),
    /// Why not, in the one error shape.
    Failed {
        status: u16,
        code: String,
        message: String,
    },
}

impl Outcome {
    pub(super) fn failed(e: &ApiError) -> Outcome {
        Outcome::Failed {
            status: e.status().as_u16(),
            code: e.code().to_string(),
            message: e.message().to_string(),
        }
    }
}

/// The policies a node's runtimes run with: the default one and each namespace's own.
#[derive(Debug, Clone)]
pub(super) struct Loaded {
    pub default: Policy,
    pub namespaces: BTreeMap<String, Policy>,
}

impl Loaded {
    pub(super) fn stamps(&self) -> BTreeMap<String, PolicyStamp> {
        std::iter::once(("*".to_string(), self.default.stamp()))
            .chain(
                self.namespaces
                    .iter()
                    .map(|(ns, p)| (ns.clone(), p.stamp())),
            )
            .collect()
    }

    /// The answer of a reload, as a single process gives it: the active default policy
    /// (with the defaults that follow the embedder) and each namespace's name and hash.
    pub(super) fn answer(&self, semantic: bool) -> PolicyOut {
        let mut out = policy_out(&self.default.clone().for_embedder(semantic));
        out.namespaces = self
            .namespaces
            .iter()
            .map(|(ns, p)| (ns.clone(), p.clone().for_embedder(semantic).stamp().into()))
            .collect();
        out
    }
}

/// Every policy file of a node read again, all or nothing
/// ([`RuntimeConfig::read_policy_files`]); without a default file, the default policy the
/// node started with (the built-in one) stays.
pub(super) fn read(config: &RuntimeConfig) -> Result<Loaded, ApiError> {
    let (default, namespaces) = config.read_policy_files()?;
    Ok(Loaded {
        default: default.unwrap_or_else(|| config.substrate.policy.clone()),
        namespaces,
    })
}

/// Sends `ask` to every node and gathers the answers of `members` (the live nodes, this
/// one included), waiting `patience` at most.
pub(super) async fn ask_all(
    client: &async_nats::Client,
    sealer: &super::seal::Sealer,
    subject: &str,
    ask: &Ask,
    members: &[String],
    patience: Duration,
) -> Result<BTreeMap<String, Outcome>, ApiError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "cannot reach the other nodes over NATS ({e}); no policy changed; retry shortly"
            ),
        );
        e.retry_after = Some(1);
        e
    };
    let payload = serde_json::to_vec(ask).expect("an ask serializes");
    let got = super::forward::gather(
        client,
        sealer,
        subject,
        payload,
        members,
        patience,
        |r: Reply| (r.node, r.outcome),
    )
    .await
    .map_err(|e| unreachable(&e))?;
    let missing: Vec<&str> = members
        .iter()
        .filter(|m| !got.contains_key(*m))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "{} did not answer within {}; {}",
                missing.join(", "),
                humantime::format_duration(patience),
                match ask {
                    Ask::Check => "no policy changed; retry shortly".to_string(),
                    Ask::Apply { .. } => format!(
                        "the other nodes made the new policies active; reload again once \
                         `GET /cluster` lists {} as a member (until then it may run the old \
                         ones)",
                        missing.join(", ")
                    ),
                }
            ),
        );
        e.retry_after = Some(1);
        return Err(e);
    }
    Ok(got)
}

/// The one set of stamps every node read, or why there is none: the first failure (by
/// node name), or the nodes' disagreement.
pub(super) fn agreed(
    outcomes: &BTreeMap<String, Outcome>,
    applying: bool,
) -> Result<BTreeMap<String, PolicyStamp>, ApiError> {
    let unchanged = if applying {
        "the nodes without an error made the new policies active; fix it and reload again"
    } else {
        "no policy changed on any node"
    };
    for (node, outcome) in outcomes {
        if let Outcome::Failed {
            status,
            code,
            message,
        } = outcome
        {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Err(ApiError::new(
                status,
                code.clone(),
                format!("on {node}: {message} ({unchanged})"),
            ));
        }
    }
    let mut read = outcomes.iter().filter_map(|(node, o)| match o {
        Outcome::Read(stamps) => Some((node, stamps)),
        Outcome::Failed { .. } => None,
    });
    let Some((_, first)) = read.next() else {
        return Ok(BTreeMap::new());
    };
    if read.all(|(_, s)| s == first) {
        return Ok(first.clone());
    }
    let each = outcomes
        .iter()
        .filter_map(|(node, o)| match o {
            Outcome::Read(stamps) => Some(format!(
                "{node}: {}",
                stamps
                    .iter()
                    .map(|(ns, s)| format!("{ns} = {} {}", s.name, short(&s.hash)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Outcome::Failed { .. } => None,
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "policy_differs",
        format!(
            "the nodes read different policies ({each}); give every node the same policy \
             files (and the same SHADOWBRAIN_POLICY__ overrides), then reload again \
             ({unchanged})"
        ),
    ))
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_as(pairs: &[(&str, &str)]) -> Outcome {
        Outcome::Read(
            pairs
                .iter()
                .map(|(ns, hash)| {
                    let stamp = PolicyStamp {
                        name: format!("policy-{hash}"),
                        hash: hash.to_string(),
                    };
                    (ns.to_string(), stamp)
                })
                .collect(),
        )
    }

    fn outcomes(of: Vec<(&str, Outcome)>) -> BTreeMap<String, Outcome> {
        of.into_iter().map(|(n, o)| (n.to_string(), o)).collect()
    }

    #[test]
    fn every_node_reading_the_same_policies_agrees() {
        let same = read_as(&[("*", "aaaa"), ("team-a", "bbbb")]);
        let all = outcomes(vec![("node0", same.clone()), ("node1", same.clone())]);
        let Outcome::Read(stamps) = same else {
            unreachable!()
        };
        assert_eq!(agreed(&all, false).unwrap(), stamps);
    }

    #[test]
    fn a_failure_or_a_disagreement_names_the_nodes_and_what_changed() {
        let bad = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_policy", "x: y");
        let all = outcomes(vec![
            ("node0", read_as(&[("*", "aaaa")])),
            ("node1", Outcome::failed(&bad)),
        ]);
        let e = agreed(&all, false).unwrap_err();
        assert_eq!((e.status(), e.code()), (bad.status(), "invalid_policy"));
        assert!(e.message().starts_with("on node1: x: y"), "{}", e.message());
        assert!(e.message().contains("no policy changed"), "{}", e.message());
        let e = agreed(&all, true).unwrap_err();
        assert!(
            e.message().contains("made the new policies active"),
            "{}",
            e.message()
        );

        let all = outcomes(vec![
            ("node0", read_as(&[("*", "aaaa")])),
            ("node1", read_as(&[("*", "aaaa")])),
            ("node2", read_as(&[("*", "cccc")])),
        ]);
        let e = agreed(&all, false).unwrap_err();
        assert_eq!(
            (e.status(), e.code()),
            (StatusCode::CONFLICT, "policy_differs")
        );
        for said in ["node0: * = policy-aaaa aaaa", "node2: * = policy-cccc cccc"] {
            assert!(e.message().contains(said), "{}", e.message());
        }
    }

    #[test]
    fn reading_is_all_or_nothing_and_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let (good, bad) = (dir.path().join("good.toml"), dir.path().join("bad.toml"));
        std::fs::write(&good, "name = \"good\"\n").unwrap();
        std::fs::write(&bad, "name = \"bad\"\n[scoring]\nrecency = \"high\"\n").unwrap();
        let files = |default: Option<&std::path::Path>, ns: Option<&std::path::Path>| {
            let mut config = RuntimeConfig::new(dir.path());
            config.policy_file = default.map(|p| p.to_path_buf());
            config.namespace_policy_files = ns
                .map(|p| ("team-a".to_string(), p.to_path_buf()))
                .into_iter()
                .collect();
            config
        };
        let loaded = read(&files(Some(&good), None)).unwrap();
        assert_eq!(loaded.stamps()["*"].name, "good");
        // No default file: the built-in default stays, the namespace's file is read.
        let loaded = read(&files(None, Some(&good))).unwrap();
        assert_eq!(loaded.stamps()["*"], Policy::default().stamp());
        assert_eq!(loaded.stamps()["team-a"].name, "good");
        let e = read(&files(Some(&good), Some(&bad))).unwrap_err();
        assert_eq!(e.code(), "invalid_policy");
        assert!(e.message().contains("recency"), "{}", e.message());
        let e = read(&files(None, None)).unwrap_err();
        assert!(e.message().contains("--policy"), "{}", e.message());
    }
}

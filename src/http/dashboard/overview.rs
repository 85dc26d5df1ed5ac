//! `GET /`: the overview. For the visitor's namespace: records by tier and status, its
//! sessions, the policy and the embedder in force, and the LLM tokens it spent this hour.
//! For an admin (or a keyless server): the server's live figures, the same as
//! `/metrics` reads at scrape time (work-queue depths and the age of their oldest item,
//! the commit backlog, index lag, session actors), with ingest and recall rates over the
//! last minute; `live.js` refreshes them every few seconds.

use std::time::{Duration, Instant};

use axum::extract::State;
use maud::{Markup, html};

use super::answer::{UiError, UiResult, html};
use super::page::{self, Nav};
use super::viewer::Viewer;
use crate::http::state::AppState;
use crate::{Census, Status, Tier};

/// The server-wide figures, read from the store.
struct Live {
    queues: Vec<(&'static str, Option<usize>, Option<f64>)>,
    commit_backlog: u64,
    unbuilt: [(&'static str, usize); 2],
}

/// `GET /`.
pub(super) async fn page(State(s): State<AppState>, viewer: Viewer) -> UiResult {
    // In a cluster placed by session, counted over every partition.
    let census = s.rt.census(&viewer.namespace).await?;
    let policy = s.rt.policy_for(&viewer.namespace);
    let sub = s.rt.substrate();
    let embedder = sub.embedder();
    let llm = s.rt.llm().map(|llm| {
        let now = sub.clock().now();
        (
            llm.model().to_string(),
            llm.budget().spent(&viewer.namespace, now),
            llm.budget().per_hour(),
            llm.stats(),
        )
    });
    let server = if viewer.admin() {
        Some(server_figures(&s).await?)
    } else {
        None
    };
    let cluster = match &s.cluster {
        Some(c) if viewer.admin() => Some((c, c.node.statuses().await)),
        _ => None,
    };
    let body = html! {
        section aria-labelledby="ns-h" {
            h2 #ns-h { "Namespace " code { (viewer.namespace) } }
            (census_table(&census))
            dl.facts {
                dt { "sessions" } dd { a href="/ui/sessions" { (census.sessions) } }
                dt { "policy" } dd { a href="/ui/policy" { (policy.name) } " " code.hash { (policy.hash) } }
                dt { "embedder" } dd { (embedder.name()) " (" (embedder.dimensions()) " dimensions)" }
                dt { "LLM" } dd {
                    @match &llm {
                        Some((model, spent, per_hour, _)) => {
                            (model) ": " (spent) " tokens this hour"
                            @if *per_hour > 0 { " of a budget of " (per_hour) }
                            @else { " (no budget set)" }
                        }
                        None => "none configured: importance by rules, extractive condensation",
                    }
                }
            }
        }
        @match server {
            Some(figures) => {
                @let heading = match &cluster {
                    Some((c, _)) => format!("Partition {} on node {}", c.partition, c.node.name()),
                    None => "Server".to_string(),
                };
                (figures_section(&heading, figures, llm.as_ref().map(|l| &l.3)))
            }
            None => section.note {
                p { "The server's figures (queues, rates, LLM calls) are shown to admin keys." }
            },
        }
        @if let Some((_, statuses)) = cluster {
            (cluster_section(statuses))
        }
    };
    Ok(html(page::page("Overview", &viewer, Nav::Overview, body)))
}

fn census_table(c: &Census) -> Markup {
    html! {
        div.scroll {
            table.census {
                caption { (c.total()) " records by tier and status" }
                thead { tr {
                    th scope="col" { "tier" }
                    @for status in Status::ALL { th scope="col" { (status.as_str()) } }
                    th scope="col" { "all" }
                } }
                tbody {
                    @for (t, tier) in Tier::ALL.iter().enumerate() {
                        tr {
                            th scope="row" { (tier.as_str()) }
                            @for n in c.by_tier_status[t] { td.num { (n) } }
                            td.num { strong { (c.tier(*tier)) } }
                        }
                    }
                }
                tfoot { tr {
                    th scope="row" { "all" }
                    @for status in Status::ALL { td.num { (c.status(status)) } }
                    td.num { strong { (c.total()) } }
                } }
            }
        }
    }
}

/// What an admin sees beyond the namespace.
struct Figures {
    live: Live,
    sessions_live: usize,
    in_flight: u64,
    quarantined: usize,
    restarts: u64,
    rates: (f64, f64, f64),
    uptime: Duration,
}

async fn server_figures(s: &AppState) -> Result<Figures, UiError> {
    let live =
        s.rt.inspect("the server's figures", |sub| {
            let store = sub.store();
            let queues = crate::metrics::work_queues(sub);
            Ok(Live {
                queues,
                commit_backlog: store.commit_backlog(),
                unbuilt: [
                    ("vectors", sub.vectors().pending()),
                    ("keywords", sub.keywords().pending()),
                ],
            })
        })
        .await?;
    let rates = s.ui.rates.lock().unwrap_or_else(|p| p.into_inner()).rates(
        Instant::now(),
        s.metrics.served(),
        s.ui.started,
    );
    Ok(Figures {
        live,
        sessions_live: s.rt.live_sessions().await.unwrap_or(0),
        in_flight: s.rt.session_calls_in_flight(),
        quarantined: s.rt.quarantined(None).await.map_or(0, |q| q.len()),
        restarts: s.rt.restarts().await.unwrap_or(0),
        rates,
        uptime: s.ui.started.elapsed(),
    })
}

fn figures_section(heading: &str, f: Figures, llm: Option<&crate::llm::cost::LlmStats>) -> Markup {
    let (events, recalls, over) = f.rates;
    html! {
        section #live aria-labelledby="live-h" aria-live="polite" {
            h2 #live-h { (heading) }
            p.small { "Live: refreshed every 5 s. Rates over the last " (format!("{over:.0}")) " s; up " (format!("{:.0}", f.uptime.as_secs_f64())) " s." }
            dl.facts {
                dt { "ingest" } dd { (format!("{events:.1}")) " events/s" }
                dt { "recall" } dd { (format!("{recalls:.1}")) " recalls/s" }
                dt { "session actors" } dd { (f.sessions_live) " live, " (f.in_flight) " calls in flight" }
                dt { "commit backlog" } dd { (f.live.commit_backlog) " write sets" }
                @for (index, n) in f.live.unbuilt {
                    dt { (index) " index lag" } dd { (n) " changes not yet built" }
                }
                dt { "quarantined" } dd { (f.quarantined) }
                dt { "actor restarts" } dd { (f.restarts) }
            }
            div.scroll {
                table {
                    caption { "Work queues" }
                    thead { tr { th scope="col" { "queue" } th scope="col" { "depth" } th scope="col" { "oldest item" } } }
                    tbody {
                        @for (name, depth, age) in &f.live.queues {
                            tr {
                                th scope="row" { (name) }
                                td.num { @match depth { Some(n) => (n), None => "?" } }
                                td.num { @match age { Some(a) => { (format!("{a:.1}")) " s" } None => "—" } }
                            }
                        }
                    }
                }
            }
            @if let Some(llm) = llm {
                dl.facts {
                    dt { "LLM calls" } dd { (llm.chat.requests) " (" (llm.chat.retries) " retried, " (llm.chat.failures) " failed)" }
                    dt { "LLM tokens" } dd { (llm.chat.prompt_tokens) " prompt, " (llm.chat.completion_tokens) " completion" }
                    dt { "records judged" } dd { (llm.judged) " (" (llm.cache_hits) " from cache, " (llm.over_budget) " over budget, " (llm.fallbacks) " fell back)" }
                }
            }
        }
        script type="module" src="/ui/assets/live.js" {}
    }
}

/// In cluster mode, for admins: every live node's view (`GET /cluster` of each), gathered
/// over NATS — who owns which partition under which epoch, what each has not indexed yet,
/// and what each appended to the log.
fn cluster_section(statuses: Result<Vec<serde_json::Value>, crate::api::ApiError>) -> Markup {
    let statuses = match statuses {
        Ok(s) => s,
        Err(e) => {
            return html! {
                section aria-labelledby="cluster-h" {
                    h2 #cluster-h { "Cluster" }
                    p.error role="alert" { code { (e.code()) } ": " (e.message()) }
                }
            };
        }
    };
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "—".to_string(),
        other => other.to_string(),
    };
    let mut owned: Vec<(u64, String, String, String)> = Vec::new();
    for node in &statuses {
        for p in node["partitions"].as_array().into_iter().flatten() {
            if p["role"] == "owner" {
                owned.push((
                    p["partition"].as_u64().unwrap_or(0),
                    text(&node["node"]),
                    text(&p["epoch"]),
                    format!(
                        "{} / {}",
                        text(&p["unbuilt"]["vectors"]),
                        text(&p["unbuilt"]["keywords"])
                    ),
                ));
            }
        }
    }
    owned.sort();
    let answered = statuses.iter().filter(|n| n["answered"] != false).count();
    html! {
        section aria-labelledby="cluster-h" {
            h2 #cluster-h { "Cluster" }
            p.small {
                (answered) " live nodes"
                @if answered < statuses.len() { " answered of " (statuses.len()) " members" }
                "; each page of a namespace is answered by the node owning its partition."
            }
            div.scroll {
                table.nodes {
                    caption { "Nodes" }
                    thead { tr {
                        th scope="col" { "node" } th scope="col" { "owns" } th scope="col" { "standby of" }
                        th scope="col" { "log entries" } th scope="col" { "log bytes" } th scope="col" { "publish retries" }
                    } }
                    tbody {
                        @for node in &statuses {
                            @let parts = node["partitions"].as_array().cloned().unwrap_or_default();
                            @if node["answered"] == false {
                                tr {
                                    th scope="row" { (text(&node["node"])) }
                                    td colspan="5" { "did not answer within 2 s" }
                                }
                            } @else {
                                tr {
                                    th scope="row" { (text(&node["node"])) }
                                    td.num { (parts.iter().filter(|p| p["role"] == "owner").count()) }
                                    td.num { (parts.iter().filter(|p| p["role"] == "standby").count()) }
                                    td.num { (text(&node["log"]["entries"])) }
                                    td.num { (text(&node["log"]["bytes"])) }
                                    td.num { (text(&node["log"]["retries"])) }
                                }
                            }
                        }
                    }
                }
            }
            div.scroll {
                table.partitions {
                    caption { "Partitions" }
                    thead { tr {
                        th scope="col" { "partition" } th scope="col" { "owner" } th scope="col" { "epoch" }
                        th scope="col" { "not yet indexed (vectors / keywords)" }
                    } }
                    tbody {
                        @for (p, node, epoch, unbuilt) in &owned {
                            tr {
                                th scope="row" { (p) }
                                td { (node) }
                                td.num { (epoch) }
                                td.num { (unbuilt) }
                            }
                        }
                    }
                }
            }
        }
    }
}

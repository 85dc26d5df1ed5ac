//! `/ui/search`: a recall as an agent would make it (query, session, scope — the whole
//! namespace unless another is chosen —, agent, k,
//! kinds, time range, knowledge on or off), read by the same function as `/v1`'s recall,
//! so a bad field gets the same error; each result with its score and the parts of its
//! `why` drawn as meters, then the context block an agent's prompt would get.
//!
//! By default a search from the dashboard only looks: it does not reinforce what it
//! returns (the policy's `reinforce_on_recall`), so browsing does not change the strengths
//! and the "most recalled" figures it shows. A box turns reinforcement on, to reproduce an
//! agent's recall exactly. It takes a recall slot like any other recall.

use axum::extract::{Query, State};
use maud::html;
use serde::Deserialize;
use serde_json::Value;

use super::answer::{UiError, UiResult, html};
use super::page::{self, Nav, encode};
use super::viewer::Viewer;
use crate::admission::WorkClass;
use crate::api::RecallIn;
use crate::api::requests::recall_request;
use crate::http::state::AppState;

#[derive(Debug, Default, Deserialize)]
pub(super) struct SearchQuery {
    query: Option<String>,
    session: Option<String>,
    scope: Option<String>,
    agent: Option<String>,
    k: Option<String>,
    kinds: Option<String>,
    since: Option<String>,
    until: Option<String>,
    /// `off` to leave the knowledge pool out.
    knowledge: Option<String>,
    /// `on` to reinforce what is returned, as an agent's recall does.
    reinforce: Option<String>,
}

/// A form's time, in RFC 3339: a browser's `datetime-local` value has no offset (read as
/// UTC) and may lack seconds.
fn form_time(value: &str) -> String {
    let v = value.trim();
    let has_offset = v.ends_with('Z') || v.get(10..).is_some_and(|t| t.contains(['+', '-']));
    match (has_offset, v.len()) {
        (true, _) => v.to_string(),
        (false, 16) => format!("{v}:00Z"),
        (false, _) => format!("{v}Z"),
    }
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// `GET /ui/search`.
pub(super) async fn page(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(q): Query<SearchQuery>,
) -> UiResult {
    let session = given(&q.session).unwrap_or("default").to_string();
    let scope = given(&q.scope).unwrap_or("namespace").to_string();
    let reinforce = q.reinforce.as_deref() == Some("on");
    let knowledge = q.knowledge.as_deref() != Some("off");
    let outcome = match given(&q.query) {
        None => None,
        Some(query) => Some(
            run(
                &s,
                &viewer,
                &q,
                query,
                (&session, &scope),
                knowledge,
                reinforce,
            )
            .await,
        ),
    };
    let selected = |name: &str| (scope == name).then_some("selected");
    let body = html! {
        form.search role="search" method="get" action="/ui/search" {
            div.field.wide {
                label for="query" { "Query" }
                input #query type="search" name="query" value=[given(&q.query)] required autofocus;
            }
            div.field { label for="session" { "Session" } input #session name="session" value=(session); }
            div.field {
                label for="scope" { "Scope" }
                select #scope name="scope" {
                    option value="session" selected=[selected("session")] { "session" }
                    option value="agent" selected=[selected("agent")] { "agent" }
                    option value="namespace" selected=[selected("namespace")] { "namespace" }
                }
            }
            div.field { label for="agent" { "Agent (agent scope)" } input #agent name="agent" value=[given(&q.agent)]; }
            div.field { label for="k" { "k" } input #k type="number" name="k" min="1" max="200" value=(given(&q.k).unwrap_or("10")); }
            div.field { label for="kinds" { "Kinds (comma-separated)" } input #kinds name="kinds" value=[given(&q.kinds)]; }
            div.field { label for="since" { "Since (UTC)" } input #since type="datetime-local" step="1" name="since" value=[given(&q.since)]; }
            div.field { label for="until" { "Until (UTC)" } input #until type="datetime-local" step="1" name="until" value=[given(&q.until)]; }
            div.field.check {
                input #knowledge type="checkbox" name="knowledge" value="off" checked[!knowledge];
                label for="knowledge" { "Leave the knowledge pool out" }
            }
            div.field.check {
                input #reinforce type="checkbox" name="reinforce" value="on" checked[reinforce];
                label for="reinforce" { "Reinforce what is returned, as an agent's recall does" }
            }
            div.field { button type="submit" { "Recall" } }
        }
        @match outcome {
            None => p.small { "A search from here only looks unless you tick reinforcement: strengths and recall counts stay as they are." },
            Some(Err(e)) => p.error role="alert" { code { (e.code) } ": " (e.message) },
            Some(Ok(found)) => (found),
        }
    };
    Ok(html(page::page("Search", &viewer, Nav::Search, body)))
}

async fn run(
    s: &AppState,
    viewer: &Viewer,
    q: &SearchQuery,
    query: &str,
    (session, scope): (&str, &str),
    knowledge: bool,
    reinforce: bool,
) -> Result<maud::Markup, UiError> {
    let k = match given(&q.k) {
        Some(k) => Some(k.parse::<usize>().map_err(|_| {
            UiError::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_k",
                format!("invalid k: `{k}` is not a number; ask for 1 to 200 memories"),
            )
        })?),
        None => None,
    };
    let scope = Some(crate::api::from_value(
        "recall",
        Value::String(scope.to_string()),
    )?);
    let kinds = given(&q.kinds).map(|k| {
        k.split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect()
    });
    let body = RecallIn {
        query: query.to_string(),
        k,
        scope,
        agent_id: given(&q.agent).map(str::to_string),
        kinds,
        since: given(&q.since).map(|t| Value::String(form_time(t))),
        until: given(&q.until).map(|t| Value::String(form_time(t))),
        include_knowledge: Some(knowledge),
        token_budget: None,
        include_superseded: None,
    };
    let handle = s.rt.session(&viewer.namespace, session)?;
    let mut request = recall_request(&s.limits, &viewer.namespace, session, body)?;
    request.reinforce = reinforce;
    let slot = s.admission.enter(WorkClass::Recall).await?;
    let result = handle.recall_with(request).await?;
    drop(slot);
    s.metrics.recall();
    Ok(html! {
        section aria-labelledby="results-h" {
            h2 #results-h {
                (result.memories.len()) " memories"
                @if let Some(id) = &result.recall_id { " · recall " code { (id) } }
                " · policy " code { (result.policy.name) " " (result.policy.hash) }
            }
            @for note in &result.notes { p.note { (note) } }
            ol.results {
                @for m in &result.memories {
                    li.result {
                        div.head {
                            (page::memory_link(m.record.id))
                            " " span.badge { (m.record.tier.as_str()) }
                            " " span.kind { (m.record.kind.as_str()) }
                            " · session " a href={ "/ui/sessions/" (encode(&m.record.session_id)) } { (m.record.session_id) }
                            " · " (page::when(m.record.event_time))
                            " · score " strong { (format!("{:.3}", m.score)) }
                        }
                        p.text { (page::short(&m.record.text, 600)) }
                        div.why aria-label="why this memory" {
                            span.part { "relevance " (page::meter("relevance", m.why.relevance)) }
                            span.part { "recency " (page::meter("recency", m.why.recency)) }
                            span.part { "importance " (page::meter("importance", m.why.importance)) }
                            span.part { "utility " (page::meter("utility", m.why.utility)) }
                        }
                    }
                }
            }
            h2 { "Context block" }
            pre.context { (result.context) }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_times_become_rfc_3339() {
        assert_eq!(form_time("2026-12-01T10:30"), "2026-12-01T10:30:00Z");
        assert_eq!(form_time("2026-12-01T10:30:15"), "2026-12-01T10:30:15Z");
        assert_eq!(
            form_time("2026-12-01T10:30:15+02:00"),
            "2026-12-01T10:30:15+02:00"
        );
        assert_eq!(form_time("2026-12-01T10:30:15Z"), "2026-12-01T10:30:15Z");
    }
}

//! `/ui/memories/{id}`: one record whole — every field, its text and content, the records
//! it was made from and those made from it, its knowledge-graph links and its audit
//! history — and the actions a curator takes on it: pin, mark obsolete, mark wrong (with a
//! reason, kept in the history; a wrong memory is never recalled and counts as a failure),
//! archive and restore. Actions go through the same handle as `PATCH` and `DELETE
//! /v1/memories/{id}`, audited as done by `dashboard`.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use maud::{Markup, html};
use serde::Deserialize;

use super::answer::{UiError, UiResult, html, redirect};
use super::auth::check_form;
use super::page::{self, Nav, encode};
use super::viewer::Viewer;
use crate::admission::WorkClass;
use crate::api::requests::settable;
use crate::http::state::AppState;
use crate::internals::Filter;
use crate::{AuditEntry, Edge, MemoryId, MemoryRecord, Status, Tier};

/// Who changed a record from the dashboard, in its history.
const BY_UI: &str = "dashboard";

/// What the page shows beside the record.
struct Around {
    record: MemoryRecord,
    history: Vec<AuditEntry>,
    edges: Vec<Edge>,
    derived: Vec<MemoryRecord>,
    sources: Vec<MemoryRecord>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Done {
    done: Option<String>,
}

/// `GET /ui/memories/{id}`.
pub(super) async fn page(
    State(s): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(done): Query<Done>,
) -> UiResult {
    let id: MemoryId = id.parse()?;
    let ns = viewer.namespace.clone();
    let around =
        s.rt.inspect("the memory", move |sub| {
            let store = sub.store();
            let record = sub.get(&ns, id)?;
            let history = sub.history(&ns, id)?;
            let edges: Vec<Edge> = store
                .edges(&ns, None)?
                .into_iter()
                .filter(|e| e.from == id || e.to == id)
                .collect();
            let mut derived = Vec::new();
            if record.tier != Tier::Knowledge {
                // Condensed records live in their sources' session; knowledge points back
                // at what it was promoted from with a `derived_from` edge.
                let made = store.candidates(&Filter {
                    namespace: &ns,
                    session: Some(&record.session_id),
                    tiers: Some(&[Tier::Condensed]),
                    ..Filter::default()
                });
                for other in made.iter().map(MemoryId) {
                    if let Some(r) = store.get_light(other)?
                        && r.sources.contains(&id)
                    {
                        derived.push(r);
                    }
                }
            }
            for e in &edges {
                if e.to == id
                    && e.relation == crate::Relation::DerivedFrom
                    && let Some(r) = store.get_light(e.from)?
                {
                    derived.push(r);
                }
            }
            let mut sources = Vec::new();
            for source in &record.sources {
                sources.extend(store.get_light(*source)?);
            }
            Ok(Around {
                record,
                history,
                edges,
                derived,
                sources,
            })
        })
        .await?;
    let policy = s.rt.policy_for(&viewer.namespace);
    let now = s.rt.substrate().clock().now();
    let r = &around.record;
    let strength_now = policy.strength_at(r, now);
    let body = html! {
        @if let Some(done) = done.done.as_deref() {
            p.done role="status" { "Done: the memory is now " strong { (done) } "." }
        }
        (actions(&viewer, r))
        section aria-labelledby="text-h" {
            h2 #text-h { "Text" }
            pre.text { (r.text) }
        }
        section aria-labelledby="fields-h" {
            h2 #fields-h { "Fields" }
            dl.fields {
                dt { "status" } dd { (page::status(r.status)) " since " (page::when(r.status_at)) }
                dt { "tier" } dd { (r.tier.as_str()) }
                dt { "kind" } dd { (r.kind.as_str()) }
                dt { "namespace" } dd { (r.namespace) }
                dt { "session" } dd { a href={ "/ui/sessions/" (encode(&r.session_id)) } { (r.session_id) } }
                dt { "agent" } dd { (r.agent_id.as_deref().unwrap_or("—")) }
                dt { "parent" } dd { (r.parent_id.as_deref().unwrap_or("—")) }
                dt { "happened" } dd { (page::when(r.event_time)) }
                dt { "recorded" } dd { (page::when(r.recorded_time)) }
                dt { "importance" } dd { (format!("{:.2}", r.importance)) " of 10" }
                dt { "strength" } dd {
                    (format!("{:.3}", r.strength)) " set " (page::when(r.strength_at))
                    "; " (format!("{strength_now:.3}")) " now after decay"
                }
                dt { "reinforcements" } dd { (r.reinforcements) }
                dt { "utility" } dd { (page::utility(r)) }
                dt { "decided by" } dd { (r.policy.name) " " code.hash { (r.policy.hash) } }
                dt { "embedding" } dd {
                    @match &r.embedding {
                        Some(v) => { (v.len()) " dimensions" }
                        None => "not yet (waiting for the embedder)",
                    }
                }
            }
            @if !r.content.is_null() {
                h3 { "Content" }
                pre.json { (serde_json::to_string_pretty(&r.content).unwrap_or_default()) }
            }
            @if !r.metadata.is_null() {
                h3 { "Metadata" }
                pre.json { (serde_json::to_string_pretty(&r.metadata).unwrap_or_default()) }
            }
        }
        section aria-labelledby="links-h" {
            h2 #links-h { "Sources, derived records and links" }
            @if around.sources.is_empty() && around.derived.is_empty() && around.edges.is_empty() {
                p { "None: this record was not made from others, nothing was made from it, and it has no links." }
            }
            @if !around.sources.is_empty() {
                h3 { "Made from" }
                (page::records(&around.sources, 160))
            }
            @if !around.derived.is_empty() {
                h3 { "Made from it" }
                (page::records(&around.derived, 160))
            }
            @if !around.edges.is_empty() {
                h3 { "Links" }
                ul.edges {
                    @for e in &around.edges {
                        li class={ "edge " (e.relation.as_str()) } {
                            (page::memory_link(e.from)) " " span.relation { (e.relation.as_str()) } " " (page::memory_link(e.to))
                        }
                    }
                }
            }
            p { a href={ "/ui/graph?around=" (r.id) } { "See the graph around it" } }
        }
        section aria-labelledby="history-h" {
            h2 #history-h { "History" }
            div.scroll {
                table.history {
                    thead { tr { th scope="col" { "when" } th scope="col" { "action" } th scope="col" { "by" } th scope="col" { "detail" } } }
                    tbody {
                        @for e in &around.history {
                            tr {
                                td { (page::when(e.at)) }
                                td { (action_name(e)) }
                                td { (e.by) }
                                td.text { (e.detail) }
                            }
                        }
                    }
                }
            }
        }
    };
    let title = format!("Memory {}", r.id);
    Ok(html(page::page(&title, &viewer, Nav::Search, body)))
}

fn action_name(e: &AuditEntry) -> String {
    match serde_json::to_value(e.action) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{:?}", e.action),
    }
}

/// The curator's actions for a record in status `r.status`: one form, one button each.
fn actions(viewer: &Viewer, r: &MemoryRecord) -> Markup {
    let choices: &[(Status, &str)] = match r.status {
        Status::Active => &[
            (Status::Pinned, "Pin"),
            (Status::Obsolete, "Mark obsolete"),
            (Status::Wrong, "Mark wrong"),
            (Status::Archived, "Archive"),
        ],
        Status::Pinned => &[
            (Status::Active, "Unpin"),
            (Status::Obsolete, "Mark obsolete"),
            (Status::Wrong, "Mark wrong"),
            (Status::Archived, "Archive"),
        ],
        Status::Obsolete | Status::Wrong | Status::Archived => &[
            (Status::Active, "Restore"),
            (Status::Pinned, "Restore and pin"),
        ],
    };
    html! {
        section.actions aria-labelledby="actions-h" {
            h2 #actions-h { "Actions" }
            form method="post" action={ "/ui/memories/" (r.id) "/status" } {
                input type="hidden" name="csrf" value=(viewer.csrf);
                label for="reason" { "Reason (kept in the history; say why when marking it wrong)" }
                textarea #reason name="reason" rows="2" maxlength="1024" {}
                div.buttons {
                    @for (status, label) in choices {
                        button type="submit" name="status" value=(status.as_str())
                            class={ "to-" (status.as_str()) } { (label) }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct StatusForm {
    csrf: String,
    status: String,
    reason: Option<String>,
}

/// `POST /ui/memories/{id}/status`: sets the status (or archives), then back to the page.
pub(super) async fn set_status(
    State(s): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    form: Result<Form<StatusForm>, FormRejection>,
) -> UiResult {
    let Form(form) = form.map_err(|e| {
        UiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_form",
            format!("{}; use the buttons of the memory's page", e.body_text()),
        )
    })?;
    check_form(&viewer, &headers, &form.csrf)?;
    let status: Status =
        crate::api::from_value("status", serde_json::Value::String(form.status.clone()))?;
    let id: MemoryId = id.parse()?;
    let memory = s.rt.memory(&viewer.namespace, id)?;
    let reason = form
        .reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    let slot = s.admission.enter(WorkClass::Write).await?;
    // Archiving is its own operation in `/v1` (DELETE); here it is one more button, and
    // its reason is kept like the others'.
    if status != Status::Archived {
        settable(status, "archive with the Archive button")?;
    }
    let record = memory.set_status_because(status, reason, BY_UI).await?;
    drop(slot);
    Ok(redirect(&format!(
        "/ui/memories/{}?done={}",
        record.id,
        record.status.as_str()
    )))
}

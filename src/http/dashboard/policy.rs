//! `/ui/policy`: the policy in force for the visitor's namespace — name, hash, the file it
//! came from, that file as it is on disk now, and the compiled policy — and, for an admin, a reload: the running
//! policy changes only when every file compiles, and otherwise the page lists each error
//! with its file and key.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use maud::{Markup, html};
use serde::Deserialize;

use super::answer::{UiError, UiResult, html, redirect};
use super::auth::{CsrfForm, check_form};
use super::page::{self, Nav};
use super::viewer::Viewer;
use crate::http::state::AppState;
use crate::{Error, PolicyIssue};

#[derive(Debug, Deserialize)]
pub(super) struct PolicyQuery {
    reloaded: Option<String>,
}

/// `GET /ui/policy`.
pub(super) async fn page(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(query): Query<PolicyQuery>,
) -> UiResult {
    let flash = query.reloaded.is_some().then(|| {
        html! { p.done role="status" { "Reloaded: the policy below is now in force." } }
    });
    Ok(html(view(&s, &viewer, flash, &[]).await))
}

async fn view(
    s: &AppState,
    viewer: &Viewer,
    flash: Option<Markup>,
    errors: &[PolicyIssue],
) -> Markup {
    let policy = s.rt.policy_for(&viewer.namespace);
    let on_disk = match policy.file.as_str() {
        "<default>" | "<inline>" => None,
        path => {
            let path = path.to_string();
            Some(
                tokio::task::spawn_blocking(move || std::fs::read_to_string(path))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|read| read.map_err(|e| e.to_string()))
                    .map_err(|e| format!("cannot read it now: {e}")),
            )
        }
    };
    let compiled = serde_json::to_string_pretty(&policy.to_json()).unwrap_or_default();
    let body = html! {
        @if let Some(flash) = flash { (flash) }
        @if !errors.is_empty() {
            div.error role="alert" {
                p { "The reload was refused; the running policy stays. " (errors.len()) " errors:" }
                ul { @for e in errors { li { code { (e.file) } " " code { (e.key) } ": " (e.reason) } } }
            }
        }
        dl.facts {
            dt { "name" } dd { (policy.name) }
            dt { "hash" } dd { code.hash { (policy.hash) } }
            dt { "file" } dd { code { (policy.file) } }
        }
        @if viewer.admin() {
            form method="post" action="/ui/policy/reload" {
                input type="hidden" name="csrf" value=(viewer.csrf);
                button type="submit" { "Reload the policy files" }
            }
        } @else {
            p.small { "Reloading the policy acts on the whole server and needs an admin key." }
        }
        @if let Some(text) = on_disk {
            h2 { "The file on disk now" }
            p.small { "As it reads now; an edit since the last load is in force only after a reload." }
            @match text {
                Ok(text) => pre.policy { (text) },
                Err(e) => p.error { (e) },
            }
        } @else {
            p { "No policy file: the built-in default (docs/policy.md) is in force." }
        }
        h2 { "In force (compiled)" }
        pre.json { (compiled) }
    };
    page::page("Policy", viewer, Nav::Policy, body)
}

/// `POST /ui/policy/reload` (admin).
pub(super) async fn reload(
    State(s): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> UiResult {
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    check_form(&viewer, &headers, &csrf)?;
    if !viewer.admin() {
        return Err(UiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "reloading the policy acts on the whole server and needs an admin key \
             (`role = \"admin\"` in `[[auth.keys]]`)",
        ));
    }
    if let Some(cluster) = &s.cluster {
        // Every partition on every node, as `POST /v1/policy/reload` in cluster mode: this
        // partition's runtime alone would leave the others on the old policy.
        return match cluster.node.reload_policies().await {
            Ok(()) => Ok(redirect("/ui/policy?reloaded=1")),
            Err(e) => {
                let refused = html! {
                    div.error role="alert" {
                        p { "The reload was refused; every node keeps its running policy." }
                        p { code { (e.code()) } ": " (e.message()) }
                    }
                };
                let page = view(&s, &viewer, Some(refused), &[]).await;
                Ok((e.status(), axum::response::Html(page.into_string())).into_response())
            }
        };
    }
    match s.rt.reload_policy().await {
        Ok(_) => Ok(redirect("/ui/policy?reloaded=1")),
        Err(Error::Policy(errors)) => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::response::Html(view(&s, &viewer, None, &errors.0).await.into_string()),
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

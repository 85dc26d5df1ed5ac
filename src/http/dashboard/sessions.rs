//! `/ui/sessions`: the namespace's sessions, most recently active first, paged and
//! filterable by id; `/ui/sessions/{id}`: one session's timeline, newest first, paged by a
//! cursor (the last row's time and id), each record with its kind, importance, strength,
//! utility and status.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::html;
use serde::Deserialize;

use super::answer::{UiError, UiResult, html};
use super::page::{self, Nav, encode};
use super::viewer::Viewer;
use crate::http::state::AppState;
use crate::{MemoryId, Timestamp};

/// Rows per page.
const PAGE: usize = 50;

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    /// Only sessions whose id contains this.
    q: Option<String>,
    /// 0-based page.
    page: Option<usize>,
}

/// `GET /ui/sessions`.
pub(super) async fn list(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(query): Query<ListQuery>,
) -> UiResult {
    let mut sessions = s.rt.sessions(&viewer.namespace).await?;
    let filter = query.q.as_deref().map(str::trim).filter(|q| !q.is_empty());
    if let Some(q) = filter {
        sessions.retain(|st| st.session_id.contains(q));
    }
    sessions.sort_by(|a, b| {
        b.last_active
            .cmp(&a.last_active)
            .then_with(|| a.session_id.cmp(&b.session_id))
    });
    let total = sessions.len();
    let page_no = query.page.unwrap_or(0);
    let shown: Vec<_> = sessions
        .into_iter()
        .skip(page_no * PAGE)
        .take(PAGE)
        .collect();
    let link = |p: usize| {
        let mut url = format!("/ui/sessions?page={p}");
        if let Some(q) = filter {
            url.push_str(&format!("&q={}", encode(q)));
        }
        url
    };
    let body = html! {
        form.inline role="search" method="get" action="/ui/sessions" {
            label for="q" { "Session id contains" }
            input #q type="search" name="q" value=[filter];
            button type="submit" { "Filter" }
        }
        p { (total) " sessions" @if let Some(q) = filter { " matching " code { (q) } } "." }
        div.scroll {
            table {
                thead { tr {
                    th scope="col" { "session" } th scope="col" { "events" }
                    th scope="col" { "memories" } th scope="col" { "first active" } th scope="col" { "last active" }
                } }
                tbody {
                    @for st in &shown {
                        tr {
                            td { a href={ "/ui/sessions/" (encode(&st.session_id)) } { (st.session_id) } }
                            td.num { (st.events) }
                            td.num { (st.memories) }
                            td { (page::when(st.first_active)) }
                            td { (page::when(st.last_active)) }
                        }
                    }
                }
            }
        }
        (page::pager(
            (page_no > 0).then(|| link(page_no - 1)),
            ((page_no + 1) * PAGE < total).then(|| link(page_no + 1)),
        ))
    };
    Ok(html(page::page("Sessions", &viewer, Nav::Sessions, body)))
}

#[derive(Debug, Deserialize)]
pub(super) struct TimelineQuery {
    /// Older than this row: `<event time in ms>:<mem-id>`.
    before: Option<String>,
}

/// `GET /ui/sessions/{id}`.
pub(super) async fn timeline(
    State(s): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(query): Query<TimelineQuery>,
) -> UiResult {
    // Validates the id as every door does.
    s.rt.session(&viewer.namespace, &id)?;
    let before = query.before.as_deref().map(cursor).transpose()?;
    let (ns, session) = (viewer.namespace.clone(), id.clone());
    let (stats, mut items) =
        s.rt.inspect("the timeline", move |sub| {
            let store = sub.store();
            Ok((
                store.session_stats(&ns, &session)?,
                store.timeline(&ns, &session, before, PAGE + 1)?,
            ))
        })
        .await?;
    let Some(stats) = stats else {
        return Err(UiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("namespace `{}` has no session `{id}`", viewer.namespace),
        ));
    };
    let more = items.len() > PAGE;
    items.truncate(PAGE);
    let next = more.then(|| {
        let last = &items[items.len() - 1];
        format!(
            "/ui/sessions/{}?before={}:{}",
            encode(&id),
            last.event_time,
            last.id
        )
    });
    let body = html! {
        dl.facts {
            dt { "events" } dd { (stats.events) }
            dt { "memories" } dd { (stats.memories) }
            dt { "active" } dd { (page::when(stats.first_active)) " to " (page::when(stats.last_active)) }
        }
        p { a href={ "/ui/search?session=" (encode(&id)) } { "Recall in this session" } }
        h2 { "Timeline, newest first" }
        (page::records(&items, 240))
        (page::pager(
            before.is_some().then(|| format!("/ui/sessions/{}", encode(&id))),
            next,
        ))
    };
    let title = format!("Session {id}");
    Ok(html(page::page(&title, &viewer, Nav::Sessions, body)))
}

/// A timeline cursor, `<ms>:<mem-id>`.
fn cursor(text: &str) -> Result<(Timestamp, MemoryId), UiError> {
    let bad = || {
        UiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_before",
            format!("`{text}` is not a timeline cursor; follow the page's own \"older\" link"),
        )
    };
    let (time, id) = text.split_once(':').ok_or_else(bad)?;
    Ok((
        time.parse().map_err(|_| bad())?,
        id.parse().map_err(|_| bad())?,
    ))
}

//! `/ui/insights`: what the namespace's memory has been doing ([`crate::Insights`]): most
//! recalled, most useful (success feedback), most often part of successful recalls, about
//! to be archived by decay, lately retired or superseded, and open contradictions.
//! Computing them reads every record of the namespace, so the answer is kept for
//! [`FRESH_FOR`] and the page says when it was computed and how long that took; `?fresh=1`
//! computes anew.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::answer::{UiResult, html};
use super::page::{self, Nav};
use super::ui::Cached;
use super::viewer::Viewer;
use crate::MemoryRecord;
use crate::admission::WorkClass;
use crate::http::state::AppState;

/// How long computed insights are shown before they are computed again.
const FRESH_FOR: Duration = Duration::from_secs(30);

/// Entries per list.
const TOP: usize = 20;

#[derive(Debug, Deserialize)]
pub(super) struct InsightsQuery {
    fresh: Option<String>,
}

/// `GET /ui/insights`.
pub(super) async fn page(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(query): Query<InsightsQuery>,
) -> UiResult {
    let asked = Instant::now();
    // Cached and fresh enough; with `?fresh=1`, computed after this request arrived.
    let cached = || {
        let cache = s.ui.insights.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(&viewer.namespace)
            .filter(|c| match query.fresh {
                None => c.at.elapsed() < FRESH_FOR,
                Some(_) => c.at >= asked,
            })
            .map(|c| (c.insights.clone(), c.at, c.took))
    };
    // One computation per namespace at a time: a visitor who arrives while one runs waits
    // for it and shows its answer instead of starting another.
    let turn =
        s.ui.computing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(viewer.namespace.clone())
            .or_default()
            .clone();
    let _turn = match cached() {
        Some(_) => None,
        None => Some(turn.lock_owned().await),
    };
    let (insights, at, took) = match cached() {
        Some(c) => c,
        None => {
            // Admitted like a recall; the slot is held by the reading itself (in a cluster
            // placed by session, of every partition's share), which goes on if the request
            // is abandoned, so the work never outlives its slot.
            let slot = s.admission.enter(WorkClass::Recall).await?;
            let now = s.rt.substrate().clock().now();
            let started = Instant::now();
            let (rt, ns) = (s.rt.clone(), viewer.namespace.clone());
            let reading = tokio::spawn(async move {
                let _slot = slot;
                rt.insights(&ns, now, TOP).await
            });
            let insights = reading
                .await
                .map_err(|e| crate::Error::internal("the insights", e))??;
            let insights = Arc::new(insights);
            let took = started.elapsed();
            s.ui.insights
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    viewer.namespace.clone(),
                    Cached {
                        insights: insights.clone(),
                        at: started,
                        took,
                    },
                );
            (insights, started, took)
        }
    };
    let i = &insights;
    let body = html! {
        p.small {
            "From " (i.records) " records and " (i.recalls) " remembered recalls, computed "
            (format!("{:.0}", at.elapsed().as_secs_f64())) " s ago in "
            (format!("{:.0}", took.as_secs_f64() * 1e3)) " ms. "
            a href="/ui/insights?fresh=1" { "Compute again" }
        }
        div.grid {
            (counted("Most recalled", "times returned", &i.most_recalled))
            (list("Most useful", "success feedback", &i.most_useful, |r| html! {
                (r.utility.successes) " successes, " (r.utility.failures) " failures"
            }))
            (counted("Most often in successful recalls", "successful recalls", &i.in_successful_recalls))
            (section("About to be archived by decay", html! {
                @if i.fading.is_empty() { p { "Nothing is fading: no active, unprotected record will fall below the policy's archive threshold in ten years." } }
                @else {
                    ol.insight {
                        @for f in &i.fading {
                            li {
                                (page::memory_link(f.record.id)) " " span.text { (page::short(&f.record.text, 120)) }
                                br;
                                span.small { "strength " (format!("{:.3}", f.strength_now)) " now; archived after " (page::when(f.archive_at)) " unless recalled" }
                            }
                        }
                    }
                }
            }))
            (list("Recently retired", "archived, obsolete or wrong", &i.retired, |r| html! {
                (page::status(r.status)) " " (page::when(r.status_at))
            }))
            (section("Superseded", html! {
                @if i.superseded.is_empty() { p { "No record is superseded by another." } }
                @else {
                    ol.insight {
                        @for s in &i.superseded {
                            li {
                                (page::memory_link(s.record.id)) " " span.text { (page::short(&s.record.text, 120)) }
                                br; span.small { "superseded by " (page::memory_link(s.by)) }
                            }
                        }
                    }
                }
            }))
            (section("Open contradictions", html! {
                @if i.conflicts.is_empty() { p { "No record is in an open contradiction." } }
                @else {
                    p.small { "Held for review: settle each with PATCH /v1/memories/{id} and {\"resolve\": \"keep\"} or \"dismiss\"." }
                    ol.insight {
                        @for (r, with) in &i.conflicts {
                            li {
                                (page::memory_link(r.id)) " " span.text { (page::short(&r.text, 120)) }
                                br; span.small { "conflicts with "
                                    @for (n, w) in with.iter().enumerate() {
                                        @if n > 0 { ", " }
                                        (page::memory_link(*w))
                                    }
                                }
                            }
                        }
                    }
                }
            }))
        }
    };
    Ok(html(page::page("Insights", &viewer, Nav::Insights, body)))
}

fn section(title: &str, content: Markup) -> Markup {
    html! {
        section.card {
            h2 { (title) }
            (content)
        }
    }
}

fn counted(title: &str, unit: &str, items: &[crate::Counted]) -> Markup {
    section(
        title,
        html! {
            @if items.is_empty() { p { "None yet." } }
            @else {
                ol.insight {
                    @for c in items {
                        li {
                            (page::memory_link(c.record.id)) " " span.text { (page::short(&c.record.text, 120)) }
                            br; span.small { (c.times) " " (unit) }
                        }
                    }
                }
            }
        },
    )
}

fn list(
    title: &str,
    what: &str,
    items: &[MemoryRecord],
    detail: impl Fn(&MemoryRecord) -> Markup,
) -> Markup {
    section(
        title,
        html! {
            @if items.is_empty() { p { "None yet (" (what) ")." } }
            @else {
                ol.insight {
                    @for r in items {
                        li {
                            (page::memory_link(r.id)) " " span.text { (page::short(&r.text, 120)) }
                            br; span.small { (detail(r)) }
                        }
                    }
                }
            }
        },
    )
}

//! `/ui/knowledge`: the namespace's knowledge pool, newest first (each record's support —
//! the records it was promoted from —, utility, strength and status), or a knowledge
//! search; `/ui/graph?around={id}&depth=`: the knowledge graph around a record (or the
//! pool's newest records and their edges), drawn by the vendored Cytoscape.js with each
//! relation (`derived_from`, `similar_to`, `supersedes`, `contradicts`) in a style of its
//! own, and listed as a table for keyboards and screen readers.

use axum::extract::{Query, State};
use maud::{Markup, PreEscaped, html};
use serde::Deserialize;
use serde_json::json;

use super::answer::{UiResult, html};
use super::page::{self, Nav};
use super::viewer::Viewer;
use crate::admission::WorkClass;
use crate::http::state::AppState;
use crate::internals::Filter;
use crate::{MemoryId, MemoryRecord, Tier};

/// Rows per page of the pool.
const PAGE: usize = 50;

/// Records drawn at most when no record is asked for.
const GRAPH_NODES: usize = 300;

#[derive(Debug, Deserialize)]
pub(super) struct PoolQuery {
    q: Option<String>,
    page: Option<usize>,
}

/// `GET /ui/knowledge`.
pub(super) async fn pool(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(query): Query<PoolQuery>,
) -> UiResult {
    let search = query.q.as_deref().map(str::trim).filter(|q| !q.is_empty());
    let page_no = query.page.unwrap_or(0);
    let (items, total): (Vec<MemoryRecord>, usize) = match search {
        Some(q) => {
            let slot = s.admission.enter(WorkClass::Recall).await?;
            let found = s.rt.knowledge(&viewer.namespace)?.search(q, PAGE).await?;
            drop(slot);
            let n = found.memories.len();
            (found.memories.into_iter().map(|m| m.record).collect(), n)
        }
        None => {
            let ns = viewer.namespace.clone();
            s.rt.inspect("the knowledge pool", move |sub| {
                let store = sub.store();
                let ids = store.candidates(&Filter {
                    namespace: &ns,
                    tiers: Some(&[Tier::Knowledge]),
                    ..Filter::default()
                });
                let total = ids.len() as usize;
                // Ids follow arrival: the highest are the newest.
                let mut out = Vec::new();
                for id in ids.iter().rev().skip(page_no * PAGE).take(PAGE) {
                    out.extend(store.get_light(MemoryId(id))?);
                }
                Ok((out, total))
            })
            .await?
        }
    };
    let link = |p: usize| format!("/ui/knowledge?page={p}");
    let body = html! {
        form.inline role="search" method="get" action="/ui/knowledge" {
            label for="q" { "Search the pool" }
            input #q type="search" name="q" value=[search];
            button type="submit" { "Search" }
        }
        p {
            (total) " knowledge records"
            @if search.is_some() { " found, best first" } @else { ", newest first" } "."
        }
        div.scroll {
            table.records {
                thead { tr {
                    th scope="col" { "memory" } th scope="col" { "text" } th scope="col" { "support" }
                    th scope="col" { "utility" } th scope="col" { "strength" } th scope="col" { "status" } th scope="col" { "graph" }
                } }
                tbody {
                    @for r in &items {
                        tr {
                            td { (page::memory_link(r.id)) }
                            td.text { (page::short(&r.text, 240)) }
                            td { (sources(r)) }
                            td { (page::utility(r)) }
                            td.num { (format!("{:.3}", r.strength)) }
                            td { (page::status(r.status)) }
                            td { a href={ "/ui/graph?around=" (r.id) } { "around" } }
                        }
                    }
                }
            }
        }
        @if search.is_none() {
            (page::pager(
                (page_no > 0).then(|| link(page_no - 1)),
                ((page_no + 1) * PAGE < total).then(|| link(page_no + 1)),
            ))
        }
    };
    Ok(html(page::page("Knowledge", &viewer, Nav::Knowledge, body)))
}

fn sources(r: &MemoryRecord) -> Markup {
    html! {
        details {
            summary { (r.sources.len()) " sources" }
            ul.plain { @for id in &r.sources { li { (page::memory_link(*id)) } } }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct GraphQuery {
    around: Option<String>,
    depth: Option<usize>,
}

/// `GET /ui/graph`.
pub(super) async fn graph(
    State(s): State<AppState>,
    viewer: Viewer,
    Query(query): Query<GraphQuery>,
) -> UiResult {
    let around = query
        .around
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.is_empty());
    // Walking a neighbourhood or reading the pool is admitted like a recall.
    let slot = s.admission.enter(WorkClass::Recall).await?;
    let (nodes, edges): (Vec<MemoryRecord>, Vec<crate::Edge>) = match around {
        Some(id) => {
            crate::api::requests::graph_records(&s.rt, &viewer.namespace, id, query.depth).await?
        }
        None => {
            let ns = viewer.namespace.clone();
            s.rt.inspect("the knowledge graph", move |sub| {
                let _slot = slot;
                let store = sub.store();
                let ids = store.candidates(&Filter {
                    namespace: &ns,
                    tiers: Some(&[Tier::Knowledge]),
                    ..Filter::default()
                });
                let mut nodes = Vec::new();
                for id in ids.iter().rev().take(GRAPH_NODES) {
                    nodes.extend(store.get_light(MemoryId(id))?);
                }
                let shown: std::collections::HashSet<MemoryId> =
                    nodes.iter().map(|r| r.id).collect();
                let edges = store
                    .edges(&ns, None)?
                    .into_iter()
                    .filter(|e| shown.contains(&e.from) && shown.contains(&e.to))
                    .collect();
                Ok((nodes, edges))
            })
            .await?
        }
    };
    let data = json!({
        "around": around,
        "nodes": nodes.iter().map(|r| json!({
            "id": r.id.to_string(),
            "label": page::short(&r.text, 40),
            "tier": r.tier.as_str(),
            "status": r.status.as_str(),
        })).collect::<Vec<_>>(),
        "edges": edges.iter().map(|e| json!({
            "from": e.from.to_string(),
            "to": e.to.to_string(),
            "relation": e.relation.as_str(),
        })).collect::<Vec<_>>(),
    });
    let body = html! {
        form.inline method="get" action="/ui/graph" {
            label for="around" { "Around record" }
            input #around name="around" placeholder="mem-…" value=[around];
            label for="depth" { "depth" }
            input #depth type="number" name="depth" min="0" max="4" value=(query.depth.unwrap_or(2));
            button type="submit" { "Show" }
        }
        p {
            (nodes.len()) " records, " (edges.len()) " edges"
            @if around.is_none() { " (the pool's newest " (GRAPH_NODES) " at most)" } "."
        }
        ul.legend aria-label="Edge styles" {
            @for relation in ["derived_from", "similar_to", "supersedes", "contradicts"] {
                li class={ "edge " (relation) } { span.swatch {} (relation) }
            }
        }
        div #graph role="img" aria-label="The graph drawn; the table below lists the same edges" {}
        script #graph-data type="application/json" { (PreEscaped(script_json(&data))) }
        script type="module" src="/ui/assets/graph.js" {}
        h2 { "Edges" }
        @if edges.is_empty() { p { "No edges." } }
        @else {
            div.scroll {
                table.edges {
                    thead { tr { th scope="col" { "from" } th scope="col" { "relation" } th scope="col" { "to" } } }
                    tbody {
                        @for e in &edges {
                            tr class={ "edge " (e.relation.as_str()) } {
                                td { (page::memory_link(e.from)) }
                                td { span.relation { (e.relation.as_str()) } }
                                td { (page::memory_link(e.to)) }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Records" }
        (page::records(&nodes, 160))
    };
    Ok(html(page::page("Graph", &viewer, Nav::Graph, body)))
}

/// JSON that is safe inside a `<script>` element: no `<`, `>` or `&` can end it or open a
/// comment, whatever the records' texts hold.
fn script_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_cannot_close_its_element() {
        let v = json!({"label": "</script><script>alert(1)</script>&"});
        let out = script_json(&v);
        assert!(
            !out.contains('<') && !out.contains('>') && !out.contains('&'),
            "{out}"
        );
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back, v);
    }
}

//! The page every view is drawn in (a skip link, the navigation, who is looking, the
//! content) and the small pieces views share: times, statuses, scores drawn as meters,
//! shortened texts, links and pagers. Everything a record holds goes through maud's
//! escaping: no view ever writes a stored string as markup.

use maud::{DOCTYPE, Markup, html};

use super::viewer::Viewer;
use crate::{MemoryId, MemoryRecord, Status, Timestamp, to_rfc3339};

/// Which view a page is, for the navigation's `aria-current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nav {
    Overview,
    Sessions,
    Search,
    Knowledge,
    Graph,
    Insights,
    Policy,
}

const NAV: [(Nav, &str, &str); 7] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Sessions, "/ui/sessions", "Sessions"),
    (Nav::Search, "/ui/search", "Search"),
    (Nav::Knowledge, "/ui/knowledge", "Knowledge"),
    (Nav::Graph, "/ui/graph", "Graph"),
    (Nav::Insights, "/ui/insights", "Insights"),
    (Nav::Policy, "/ui/policy", "Policy"),
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · shadowbrain" }
            link rel="stylesheet" href="/ui/assets/app.css";
            link rel="icon" href="/ui/assets/favicon.svg" type="image/svg+xml";
        }
    }
}

/// A view: the navigation with `nav` current, the visitor's namespace and role, `body`.
pub(super) fn page(title: &str, viewer: &Viewer, nav: Nav, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" { "shadowbrain" }
                    nav aria-label="Views" {
                        ul {
                            @for (n, href, label) in NAV {
                                li {
                                    a href=(href) aria-current=[(n == nav).then_some("page")] {
                                        (label)
                                    }
                                }
                            }
                        }
                    }
                    div.who {
                        span.ns title="The namespace shown" { "namespace " strong { (viewer.namespace) } }
                        @if viewer.admin() { " " span.role { "admin" } }
                        @if viewer.signed_in {
                            form.signout method="post" action="/ui/logout" {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main #main tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
                footer { "shadowbrain " (env!("CARGO_PKG_VERSION")) }
            }
        }
    }
}

/// A page without navigation: the sign-in prompt and errors.
pub(super) fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body.bare {
                main #main { (body) }
            }
        }
    }
}

/// A time, readable, with its RFC 3339 form for machines and on hover.
pub(super) fn when(t: Timestamp) -> Markup {
    let exact = to_rfc3339(t);
    html! { time datetime=(exact) title=(exact) { (crate::to_human(t)) } }
}

/// A status, as a badge.
pub(super) fn status(s: Status) -> Markup {
    html! { span class={ "badge status-" (s.as_str()) } { (s.as_str()) } }
}

/// A score in 0..=1 as a meter with its value beside it.
pub(super) fn meter(label: &str, value: f32) -> Markup {
    let shown = if value.is_finite() { value } else { 0.0 };
    html! {
        span.score {
            meter min="0" max="1" value=(format!("{:.3}", shown.clamp(0.0, 1.0))) aria-label=(label) {}
            span.value { (format!("{shown:.3}")) }
        }
    }
}

/// At most `chars` characters of `text`, with an ellipsis when cut.
pub(super) fn short(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// A link to a memory's page.
pub(super) fn memory_link(id: MemoryId) -> Markup {
    html! { a.id href={ "/ui/memories/" (id) } { (id) } }
}

/// Successes and failures, and the Beta mean they give.
pub(super) fn utility(r: &MemoryRecord) -> Markup {
    html! {
        span.utility title="successes / failures (mean)" {
            (r.utility.successes) " / " (r.utility.failures)
            " (" (format!("{:.2}", r.utility.mean())) ")"
        }
    }
}

/// A table of records: time, kind, tier, text, importance, strength, utility, status.
pub(super) fn records(items: &[MemoryRecord], text_chars: usize) -> Markup {
    html! {
        div.scroll {
            table.records {
                thead { tr {
                    th scope="col" { "when" } th scope="col" { "memory" } th scope="col" { "kind" }
                    th scope="col" { "tier" } th scope="col" { "text" } th scope="col" { "importance" }
                    th scope="col" { "strength" } th scope="col" { "utility" } th scope="col" { "status" }
                } }
                tbody {
                    @for r in items {
                        tr {
                            td { (when(r.event_time)) }
                            td { (memory_link(r.id)) }
                            td { (r.kind.as_str()) }
                            td { (r.tier.as_str()) }
                            td.text { (short(&r.text, text_chars)) }
                            td.num { (format!("{:.1}", r.importance)) }
                            td.num { (format!("{:.3}", r.strength)) }
                            td { (utility(r)) }
                            td { (status(r.status)) }
                        }
                    }
                }
            }
        }
    }
}

/// Percent-encodes a query value (everything but unreserved characters).
pub(super) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Previous and next links of a paged list.
pub(super) fn pager(previous: Option<String>, next: Option<String>) -> Markup {
    html! {
        @if previous.is_some() || next.is_some() {
            nav.pager aria-label="Pages" {
                @if let Some(p) = previous { a rel="prev" href=(p) { "← newer" } }
                @if let Some(n) = next { a rel="next" href=(n) { "older →" } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_cut_on_character_boundaries() {
        assert_eq!(short("héllo wörld", 5), "héllo…");
        assert_eq!(short("short", 10), "short");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn markup_escapes_what_a_record_holds() {
        let text = "<script>alert(1)</script>";
        let out = html! { td { (short(text, 100)) } }.into_string();
        assert_eq!(out, "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>");
    }
}

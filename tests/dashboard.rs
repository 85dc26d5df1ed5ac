//! The dashboard as people meet it, on the `serve` binary: every view's answer over HTTP
//! (status, content, escaping, who may see it, the CSRF and cross-site checks), and the
//! pages in a real headless Chromium driven through chromedriver (every view with data,
//! search → memory → mark wrong and what the API says after, a script in a record's text,
//! the key prompt), saving a screenshot of each view under `target/dashboard-screenshots/`.
//!
//! The browser tests need Debian's `chromium` and `chromium-driver` (`scripts/setup`
//! installs them); without them they skip, unless `SHADOWBRAIN_REQUIRE_BROWSER=1` (CI)
//! makes a missing browser a failure.

use std::time::Duration;

use serde_json::json;

use crate::common::browser::{browser, click, open, screenshot, wait_for};
use crate::common::config::sha256_hex;
use crate::common::serve::{self, Served};
use crate::common::site::{Site, cookie_of, csrf_of};

/// A `serve` child with the hash embedder and `extra` in its config file, and namespace
/// `acme`'s policy file `acme.toml` beside it (the path of that file is answered too).
fn serve(extra: &str) -> (Served, std::path::PathBuf) {
    let serve = serve::new();
    let policy = serve.dir().join("acme.toml");
    std::fs::write(&policy, "name = \"acme-policy\"\n").unwrap();
    let served = serve
        .config(&format!(
            "[embedder]\nkind = \"hash\"\n{extra}\n\
             [[namespaces]]\nname = \"acme\"\npolicy = \"acme.toml\"\n"
        ))
        .start();
    (served, policy)
}

/// Keys: a tenant of `acme`, a tenant of `globex`, an admin whose namespace is `acme`.
const ACME: &str = "key-of-acme-0123456789";
const GLOBEX: &str = "key-of-globex-0123456789";
const ADMIN: &str = "key-of-the-admin-0123456789";

fn keyed() -> (Served, std::path::PathBuf) {
    serve(&format!(
        "[[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"acme\"\n\
         [[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"globex\"\n\
         [[auth.keys]]\nsha256 = \"{}\"\nnamespace = \"acme\"\nrole = \"admin\"\n",
        sha256_hex(ACME),
        sha256_hex(GLOBEX),
        sha256_hex(ADMIN)
    ))
}

/// A text that would run if a page ever wrote it as markup.
const HOSTILE: &str = "runner eu-2 notes <script>window.__pwned = 1</script>\
                       <img src=x onerror=\"window.__pwned = 2\"> end";

/// Seeds the default namespace: a session with a hostile text, a recall with success
/// feedback, a condensation. Answers the ids written.
async fn seed(site: &Site, key: Option<&str>) -> Vec<String> {
    let mut ids = site
        .write(
            key,
            "deploys",
            &[
                "the deploy runner moved from eu-1 to eu-2 on monday",
                "deploys fail when the eu-1 runner is down",
                "the user wants reports as CSV, not XLSX",
                HOSTILE,
                "deploy 41 failed: the eu-1 runner timed out",
                "deploy 42 failed: the eu-1 runner timed out again",
                "deploy 43 succeeded on the eu-2 runner",
                "the deploy checklist now names eu-2 as the runner",
                "rollback of deploy 41 took four minutes",
                "the on-call engineer confirmed eu-2 is healthy",
            ],
        )
        .await;
    ids.extend(
        site.write(
            key,
            "billing",
            &["invoices are sent on the first of the month"],
        )
        .await,
    );
    let recall = site.recall(key, "deploys", "deploy runner").await;
    site.api(
        "POST",
        "/v1/sessions/deploys/feedback",
        key,
        Some(json!({"recall_id": recall["recall_id"], "outcome": "success"})),
    )
    .await;
    ids
}

/// Condenses session `deploys` and credits the condensed record with a success, which the
/// default promotion policy admits into the knowledge pool: answers the condensed record's
/// id once the graph around it holds the knowledge record made from it.
async fn grow_knowledge(site: &Site, key: Option<&str>) -> String {
    let condensed = site
        .api("POST", "/v1/sessions/deploys/condense", key, None)
        .await;
    let condensed = condensed["memory_id"]
        .as_str()
        .expect("a condensed record")
        .to_string();
    site.api(
        "POST",
        "/v1/sessions/deploys/feedback",
        key,
        Some(json!({"memory_ids": [condensed], "outcome": "success"})),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let graph = site
            .api(
                "GET",
                &format!("/v1/knowledge/graph?around={condensed}"),
                key,
                None,
            )
            .await;
        if graph["edges"].as_array().is_some_and(|e| !e.is_empty()) {
            return condensed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no promotion: {graph}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_answers_with_its_data_and_shows_record_text_as_text() {
    let (served, _) = serve("");
    let site = Site::of(&served);
    let ids = seed(&site, None).await;
    let hostile = &ids[3];
    let condensed = grow_knowledge(&site, None).await;

    let around = format!("/ui/graph?around={condensed}");
    let views: [(&str, &[&str]); 12] = [
        (
            "/",
            &[
                "records by tier and status",
                "Server",
                "events/s",
                "Work queues",
            ],
        ),
        ("/ui/sessions", &["deploys", "billing", "3 sessions"]),
        (
            "/ui/sessions/deploys",
            &["eu-2", "Timeline, newest first", "observation"],
        ),
        (
            "/ui/search?query=deploy+runner&scope=namespace",
            &["Context block", "relevance", "<meter"],
        ),
        (
            &format!("/ui/memories/{hostile}"),
            &["Mark wrong", "History", "created"],
        ),
        ("/ui/knowledge", &["1 knowledge records", "1 sources"]),
        (
            &around,
            &[
                "graph-data",
                "<span class=\"relation\">derived_from</span>",
                "2 records, 1 edges",
            ],
        ),
        ("/ui/graph", &["graph-data", "derived_from", "contradicts"]),
        (&format!("/ui/graph?around={}", ids[0]), &["graph-data"]),
        (
            "/ui/insights",
            &[
                "Most recalled",
                "Most often in successful recalls",
                "About to be archived",
            ],
        ),
        (
            "/ui/policy",
            &["In force (compiled)", "Reload the policy files"],
        ),
        ("/ui/sessions?q=bill", &["billing", "1 sessions"]),
    ];
    for (path, wanted) in views {
        let page = site.get(path, None).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(
            page.header("content-type").starts_with("text/html"),
            "{path}"
        );
        assert!(
            page.header("content-security-policy")
                .contains("script-src 'self'"),
            "{path}"
        );
        assert_eq!(page.header("x-frame-options"), "DENY", "{path}");
        for w in wanted {
            assert!(page.body.contains(w), "{path} lacks {w:?}");
        }
        // The hostile text is never markup: no view writes its tags.
        assert!(!page.body.contains("<script>window.__pwned"), "{path}");
        assert!(!page.body.contains("<img src=x"), "{path}");
    }
    // It is shown, escaped, where records are shown.
    for path in [
        format!("/ui/memories/{hostile}"),
        "/ui/sessions/deploys".into(),
    ] {
        let body = site.get(&path, None).await.body;
        assert!(
            body.contains("&lt;script&gt;window.__pwned = 1&lt;/script&gt;"),
            "{path}"
        );
    }
    // The recall that went well is counted for the records it returned.
    let insights = site.get("/ui/insights?fresh=1", None).await.body;
    let successful = &insights[insights.find("Most often in successful recalls").unwrap()..];
    assert!(successful.contains("1 successful recalls"), "{successful}");
    assert!(insights.contains("times returned"));

    // Errors are pages too: an unknown record, a bad id, an unknown view.
    let missing = site.get("/ui/memories/mem-0fffffff", None).await;
    assert_eq!(missing.status, 404);
    assert!(
        missing.body.contains("not_found")
            && missing.header("content-type").starts_with("text/html")
    );
    assert_eq!(site.get("/ui/memories/nonsense", None).await.status, 422);
    assert_eq!(site.get("/ui/nowhere", None).await.status, 404);
    let bad_k = site.get("/ui/search?query=x&k=0", None).await;
    assert!(bad_k.body.contains("invalid_k"), "{}", bad_k.body);
    // The assets are served from the binary.
    let css = site.get("/ui/assets/app.css", None).await;
    assert_eq!(
        (css.status, css.header("content-type")),
        (200, "text/css; charset=utf-8")
    );
    let lib = site.get("/ui/assets/cytoscape.esm.min.mjs", None).await;
    assert!(lib.status == 200 && lib.body.len() > 100_000);
    assert!(
        site.get("/ui/assets/cytoscape.LICENSE.txt", None)
            .await
            .body
            .contains("Permission is hereby granted")
    );

    // A keyless server answers loopback names only (DNS rebinding).
    let rebound = site
        .http
        .get(format!("{}/", site.base))
        .header("host", "attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status().as_u16(), 403);

    // State changes need the page's token, from this site.
    let path = format!("/ui/memories/{}/status", ids[1]);
    let token = csrf_of(
        &site
            .get(&format!("/ui/memories/{}", ids[1]), None)
            .await
            .body,
    );
    let forged = site
        .post(&path, None, &[("status", "wrong"), ("csrf", "0")])
        .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let cross = site
        .post_from(
            &path,
            None,
            &[("status", "wrong"), ("csrf", &token)],
            Some("http://attacker.example"),
        )
        .await;
    assert_eq!(cross.status, 403);
    let memory = site
        .api("GET", &format!("/v1/memories/{}", ids[1]), None, None)
        .await;
    assert_eq!(
        memory["status"], "active",
        "a refused change changed nothing"
    );
    let done = site
        .post(
            &path,
            None,
            &[
                ("status", "wrong"),
                ("reason", "eu-1 was retired"),
                ("csrf", &token),
            ],
        )
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(
        done.header("location"),
        format!("/ui/memories/{}?done=wrong", ids[1])
    );
    let memory = site
        .api("GET", &format!("/v1/memories/{}", ids[1]), None, None)
        .await;
    assert_eq!(memory["status"], "wrong");
    assert_eq!(memory["utility"]["failures"], 1);
    let history = site
        .api(
            "GET",
            &format!("/v1/memories/{}/history", ids[1]),
            None,
            None,
        )
        .await;
    let last = history["entries"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["by"], "dashboard");
    assert_eq!(last["detail"], "active -> wrong: eu-1 was retired");
    // Archive and restore from the same form.
    for (status, then) in [("archived", "archived"), ("active", "active")] {
        let answer = site
            .post(&path, None, &[("status", status), ("csrf", &token)])
            .await;
        assert_eq!(answer.status, 303);
        let memory = site
            .api("GET", &format!("/v1/memories/{}", ids[1]), None, None)
            .await;
        assert_eq!(memory["status"], then);
    }
    let nonsense = site
        .post(&path, None, &[("status", "gone"), ("csrf", &token)])
        .await;
    assert_eq!(nonsense.status, 422, "{}", nonsense.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_a_visitor_signs_in_and_sees_only_the_keys_namespace() {
    let (served, policy_file) = keyed();
    let site = Site::of(&served);
    let acme = seed(&site, Some(ACME)).await;
    let globex = site
        .write(Some(GLOBEX), "rivals", &["globex secret plan"])
        .await;

    // Without a sign-in: the key prompt and nothing else, on every view.
    for path in [
        "/",
        "/ui/sessions",
        &format!("/ui/memories/{}", acme[0]),
        "/ui/insights",
        "/ui/policy",
    ] {
        let page = site.get(path, None).await;
        assert_eq!(page.status, 401, "{path}");
        assert!(
            page.body.contains("type=\"password\" name=\"key\""),
            "{path}"
        );
        assert!(
            !page.body.contains("deploy") && !page.body.contains("acme"),
            "{path}: {}",
            page.body
        );
    }
    let wrong = site
        .post("/ui/login", None, &[("key", "not-a-key"), ("next", "/")])
        .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("not one of this server's keys"));
    assert!(wrong.header("set-cookie").is_empty());
    let cross = site
        .post_from(
            "/ui/login",
            None,
            &[("key", ACME)],
            Some("http://attacker.example"),
        )
        .await;
    assert_eq!(cross.status, 403);

    // A tenant: its namespace, no server figures, no reload; never the key in a URL.
    let login = site
        .post(
            "/ui/login",
            None,
            &[("key", ACME), ("next", "/ui/sessions")],
        )
        .await;
    assert_eq!(login.status, 303);
    assert_eq!(login.header("location"), "/ui/sessions");
    let tenant = cookie_of(&login);
    assert!(
        !tenant.contains(ACME),
        "the cookie holds a token, not the key"
    );
    let overview = site.get("/", Some(&tenant)).await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.contains("<strong>acme</strong>"));
    assert!(
        overview.body.contains("shown to admin keys") && !overview.body.contains("Work queues")
    );
    assert!(
        site.get("/ui/sessions", Some(&tenant))
            .await
            .body
            .contains("deploys")
    );
    let other = site
        .get(&format!("/ui/memories/{}", globex[0]), Some(&tenant))
        .await;
    assert_eq!(other.status, 404, "another namespace's record is not found");
    assert!(!other.body.contains("secret plan"));
    let search = site
        .get("/ui/search?query=globex+secret+plan", Some(&tenant))
        .await;
    assert!(search.body.contains("Context block"), "{}", search.body);
    assert!(
        !search.body.contains(&globex[0]),
        "a recall finds no other namespace's record"
    );
    let policy = site.get("/ui/policy", Some(&tenant)).await;
    assert!(!policy.body.contains("Reload the policy files"));
    let token = csrf_of(&policy.body);
    let reload = site
        .post("/ui/policy/reload", Some(&tenant), &[("csrf", &token)])
        .await;
    assert_eq!(reload.status, 403);
    // A token of one sign-in does not pass for another's forms.
    let globex_cookie = cookie_of(&site.post("/ui/login", None, &[("key", GLOBEX)]).await);
    let path = format!("/ui/memories/{}/status", globex[0]);
    let stolen = site
        .post(
            &path,
            Some(&globex_cookie),
            &[("status", "wrong"), ("csrf", &token)],
        )
        .await;
    assert_eq!(stolen.status, 403);

    // An admin: the server's figures and the reload.
    let admin = cookie_of(&site.post("/ui/login", None, &[("key", ADMIN)]).await);
    let overview = site.get("/", Some(&admin)).await;
    assert!(overview.body.contains("Work queues") && overview.body.contains("admin"));
    let token = csrf_of(&site.get("/ui/policy", Some(&admin)).await.body);
    let reload = site
        .post("/ui/policy/reload", Some(&admin), &[("csrf", &token)])
        .await;
    assert_eq!(reload.status, 303, "{}", reload.body);
    assert_eq!(reload.header("location"), "/ui/policy?reloaded=1");
    let policy = site.get("/ui/policy?reloaded=1", Some(&admin)).await.body;
    assert!(
        policy.contains("acme-policy") && policy.contains("Reloaded"),
        "{policy}"
    );
    // A broken file: the page lists its errors and the running policy stays.
    std::fs::write(
        &policy_file,
        "name = \"acme-policy\"\n[scoring]\nweigths = 1\n",
    )
    .unwrap();
    let refused = site
        .post("/ui/policy/reload", Some(&admin), &[("csrf", &token)])
        .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.body.contains("The reload was refused") && refused.body.contains("weigths"),
        "{}",
        refused.body
    );
    assert_eq!(
        site.api("GET", "/v1/policy", Some(ACME), None).await["name"],
        "acme-policy"
    );

    // Signing out ends the sign-in.
    let token = csrf_of(&site.get("/", Some(&tenant)).await.body);
    let out = site
        .post("/ui/logout", Some(&tenant), &[("csrf", &token)])
        .await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").contains("Max-Age=0"));
    assert_eq!(site.get("/", Some(&tenant)).await.status, 401);
}

/// Presses Tab, as a person at the keyboard does.
async fn tab(client: &fantoccini::Client) {
    use fantoccini::actions::{InputSource, KeyAction, KeyActions};
    let tab = '\u{E004}';
    let press = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: tab })
        .then(KeyAction::Up { value: tab });
    client.perform_actions(press).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_every_view_renders_and_a_memory_marked_wrong_leaves_recall() {
    use fantoccini::Locator::Css;
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let (served, _) = serve("");
    let site = Site::of(&served);
    let ids = seed(&site, None).await;
    let condensed = grow_knowledge(&site, None).await;
    let base = site.base.clone();

    let views = [
        ("overview", "/".to_string(), "Overview"),
        ("sessions", "/ui/sessions".into(), "Sessions"),
        ("session", "/ui/sessions/deploys".into(), "Session deploys"),
        ("search", "/ui/search?query=deploy+runner".into(), "Search"),
        ("memory", format!("/ui/memories/{}", ids[3]), "Memory"),
        ("knowledge", "/ui/knowledge".into(), "Knowledge"),
        ("graph", format!("/ui/graph?around={condensed}"), "Graph"),
        ("insights", "/ui/insights".into(), "Insights"),
        ("policy", "/ui/policy".into(), "Policy"),
    ];
    for (name, path, heading) in &views {
        let h1 = open(&client, &base, path).await;
        assert!(h1.starts_with(heading), "{path}: {h1}");
        // Nothing the page loads is refused by its own CSP or missing.
        let errors = client
            .execute(
                "return performance.getEntriesByType('resource')\
                   .filter(e => e.responseStatus && e.responseStatus >= 400).map(e => e.name)",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(errors, json!([]), "{path}");
        screenshot(&client, name).await;
    }

    // The script in a record's text is shown, never run.
    open(&client, &base, &format!("/ui/memories/{}", ids[3])).await;
    let pwned = client
        .execute("return window.__pwned === undefined", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, json!(true), "the record's script ran");
    let text = client
        .find(Css("pre.text"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("<script>window.__pwned = 1</script>"),
        "{text}"
    );

    // The graph is drawn by the vendored library under the page's CSP.
    open(&client, &base, &format!("/ui/graph?around={condensed}")).await;
    let drawn = wait_for(&client, "#graph[data-drawn]")
        .await
        .attr("data-drawn")
        .await
        .unwrap();
    assert_eq!(
        drawn.as_deref(),
        Some("2"),
        "the condensed record and its knowledge"
    );

    // The keyboard reaches the skip link first, then the navigation.
    open(&client, &base, "/ui/sessions").await;
    for wanted in ["skip", "brand"] {
        tab(&client).await;
        let focused = client.active_element().await.unwrap();
        assert_eq!(
            focused.attr("class").await.unwrap().as_deref(),
            Some(wanted)
        );
    }

    // Search (submitted with Enter) → the memory → mark it wrong.
    let target = &ids[1];
    open(&client, &base, "/ui/search").await;
    client
        .find(Css("#query"))
        .await
        .unwrap()
        .send_keys("eu-1 runner down\u{E007}")
        .await
        .unwrap();
    wait_for(&client, "ol.results").await;
    click(
        &client,
        &format!("ol.results a[href='/ui/memories/{target}']"),
    )
    .await;
    wait_for(&client, "textarea#reason")
        .await
        .send_keys("eu-1 was retired in May")
        .await
        .unwrap();
    click(&client, "button.to-wrong").await;
    let done = wait_for(&client, "p.done").await.text().await.unwrap();
    assert!(done.contains("wrong"), "{done}");
    screenshot(&client, "memory-marked-wrong").await;
    let memory = site
        .api("GET", &format!("/v1/memories/{target}"), None, None)
        .await;
    assert_eq!(memory["status"], "wrong");
    assert_eq!(memory["utility"]["failures"], 1);
    let recall = site.recall(None, "deploys", "eu-1 runner down").await;
    let returned: Vec<&str> = recall["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(!returned.contains(&target.as_str()), "{returned:?}");
    assert!(!returned.is_empty(), "recall still answers with the others");

    // A phone's width: the navigation and the memory page still fit and work.
    client.set_window_size(390, 844).await.unwrap();
    open(&client, &base, &format!("/ui/memories/{target}")).await;
    let overflow = client
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        overflow,
        json!(true),
        "the page scrolls sideways at phone width"
    );
    screenshot(&client, "memory-phone").await;
    open(&client, &base, "/").await;
    screenshot(&client, "overview-phone").await;
    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_key_prompt_signs_in_to_the_keys_namespace() {
    use fantoccini::Locator::Css;
    let Some((_driver, client)) = browser().await else {
        return;
    };
    let (served, _) = keyed();
    let site = Site::of(&served);
    seed(&site, Some(ACME)).await;
    let base = site.base.clone();
    let h1 = open(&client, &base, "/ui/sessions").await;
    assert_eq!(h1, "Sign in to shadowbrain");
    screenshot(&client, "sign-in").await;
    let body = client
        .find(Css("body"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!body.contains("deploys"), "{body}");
    client
        .find(Css("#key"))
        .await
        .unwrap()
        .send_keys(ACME)
        .await
        .unwrap();
    click(&client, "form.signin button").await;
    wait_for(&client, "main table").await;
    let url = client.current_url().await.unwrap();
    assert_eq!(url.path(), "/ui/sessions");
    assert!(!url.as_str().contains(ACME), "no key in the URL: {url}");
    let text = client
        .find(Css("main"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("deploys"), "{text}");
    // The cookie is out of the page's reach.
    let cookies = client
        .execute("return document.cookie", vec![])
        .await
        .unwrap();
    assert_eq!(cookies, json!(""));
    client.close().await.unwrap();
}

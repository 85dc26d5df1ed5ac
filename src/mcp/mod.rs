//! The MCP door (docs/mcp.md): the memory runtime as a Model Context Protocol server,
//! on the official SDK (rmcp), over stdio (`shadowbrain mcp`) and over Streamable HTTP
//! (`/mcp` on `serve`, mounted by [`crate::http`] behind the API keys).
//!
//! The tools' names are a contract ([`Tool`]). Each tool reads its arguments with the same
//! functions as the HTTP handler it mirrors ([`crate::api::requests`]: `events_from`,
//! `recall_request`, `feedback_target`, …), so a bad argument is refused with the same
//! code and words as over HTTP, here as a tool error (`isError`) the model can read and act
//! on. A result carries the HTTP API's JSON as structured content (its schema is the tool's
//! `outputSchema`, derived from the same [`crate::api`] structs) and a rendering of it as
//! text for hosts and models that read text only.
//!
//! Namespaces are never an argument: over HTTP a request acts in its API key's namespace,
//! read per request (a session of the protocol opened with one key cannot reach another
//! key's memories); over stdio, in `--namespace`. A tool that works on a session takes an
//! optional `session_id`; without one it acts in the default session (`--session` over
//! stdio, the `Shadowbrain-Session` header over HTTP, else `default`), so a model that
//! never names a session still remembers and recalls predictably.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, JsonObject, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    Prompt, PromptArgument, PromptMessage, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Role,
    ServerCapabilities, ServerConfig, Tool as ToolSpec, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

use crate::admission::{Admission, Slot};
use crate::api::requests::{self, events_from};
use crate::api::{ApiError, ApiResult, from_value};
use crate::api::{
    CondenseOut, FeedbackIn, Graph, Ids, KnowledgeSearchIn, Memory, RecallIn, RecallOut, Sessions,
    Timeline, Updated,
};
use crate::metrics::Metrics;
use crate::policy::CondensationMode;
use crate::{Limits, MemoryId, Outcome, Runtime, Status};

mod tool;

pub use tool::Tool;

/// The session a tool acts in when its call names none and the host set no other.
pub const DEFAULT_SESSION: &str = "default";

/// The HTTP request header that sets a `/mcp` client's default session.
pub const SESSION_HEADER: &str = "shadowbrain-session";

/// Who changed a record through MCP, in its history.
const BY_MCP: &str = "mcp";

/// The protocol revisions served: the three current ones. 2026-07-28 is the stateless
/// revision (no `initialize`, no protocol sessions), served by the SDK on the same paths.
pub const PROTOCOL_VERSIONS: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// The namespace an HTTP request to `/mcp` acts in, from its API key: put in the request's
/// extensions by the server's `/mcp` guard, read here per request.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) String);

/// The MCP server over a runtime: one per protocol session (it is cheap to clone).
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    rt: Runtime,
    limits: Arc<Limits>,
    /// The namespace of every call over stdio; `None` over HTTP, where each request's
    /// [`Caller`] says.
    namespace: Option<String>,
    default_session: String,
    metrics: Option<Arc<Metrics>>,
    /// The server's admission slots over HTTP, so a recall through `/mcp` counts against
    /// `server.max_recalls` exactly as one through `/v1` does.
    admission: Option<Arc<Admission>>,
}

/// Where one call acts.
struct CallScope {
    namespace: String,
    session: String,
}

impl McpServer {
    /// A server for one client over stdio: every call in `namespace`, and in
    /// `default_session` when it names no session.
    pub fn stdio(rt: Runtime, limits: Limits, namespace: &str, default_session: &str) -> Self {
        McpServer {
            inner: Arc::new(Inner {
                rt,
                limits: Arc::new(limits),
                namespace: Some(namespace.to_string()),
                default_session: default_session.to_string(),
                metrics: None,
                admission: None,
            }),
        }
    }

    /// The server behind `/mcp`: each request's namespace from its API key ([`Caller`]),
    /// its calls counted in `metrics` and bounded by the server's `admission`.
    pub(crate) fn http(
        rt: Runtime,
        limits: Arc<Limits>,
        metrics: Arc<Metrics>,
        admission: Arc<Admission>,
    ) -> Self {
        McpServer {
            inner: Arc::new(Inner {
                rt,
                limits,
                namespace: None,
                default_session: DEFAULT_SESSION.to_string(),
                metrics: Some(metrics),
                admission: Some(admission),
            }),
        }
    }

    /// Where a call acts: the stdio namespace, or the HTTP request's key's; the session the
    /// host set as default (the header over HTTP).
    fn place(&self, context: &RequestContext<RoleServer>) -> ApiResult<CallScope> {
        let inner = &self.inner;
        if let Some(namespace) = &inner.namespace {
            return Ok(CallScope {
                namespace: namespace.clone(),
                session: inner.default_session.clone(),
            });
        }
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let caller = parts.and_then(|p| p.extensions.get::<Caller>());
        let Some(Caller(namespace)) = caller else {
            // The guard in front of /mcp always sets it: reaching here is a bug, and
            // acting in some namespace anyway would be worse than refusing.
            return Err(ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request reached the MCP server without its API key's namespace (a bug: \
                 the log has the details)",
            ));
        };
        let session = parts
            .and_then(|p| p.headers.get(SESSION_HEADER))
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| inner.default_session.clone(), str::to_string);
        Ok(CallScope {
            namespace: namespace.clone(),
            session,
        })
    }

    /// Takes an admission slot for a tool that recalls or writes, as `/v1` does: it waits
    /// for one, or is refused with HTTP's `overloaded`, exactly as a `/v1` request.
    async fn admit(&self, tool: Tool) -> ApiResult<Option<Slot>> {
        match (&self.inner.admission, tool.work()) {
            (Some(admission), Some(work)) => admission.enter(work).await.map(Some),
            _ => Ok(None),
        }
    }

    /// Runs one tool: its structured answer and its text.
    async fn run(
        &self,
        tool: Tool,
        args: JsonObject,
        place: CallScope,
    ) -> ApiResult<(Value, String)> {
        let rt = &self.inner.rt;
        let limits = &self.inner.limits;
        let mut args = args;
        let ns = place.namespace.as_str();
        match tool {
            Tool::Remember => {
                let session_id = session_arg(&mut args, &place)?;
                let events = events_from(remember_body(args)?)?;
                let session = rt.session(ns, &session_id)?;
                let recorded = session.record_idempotent(events, None).await?;
                if let Some(metrics) = &self.inner.metrics {
                    metrics.events_ingested(recorded.ids.len());
                }
                let ids: Vec<String> = recorded.ids.iter().map(MemoryId::to_string).collect();
                let text = format!(
                    "remembered {} in session `{session_id}`: {}",
                    plural(ids.len(), "event"),
                    ids.join(", ")
                );
                answer(&Ids { ids }, text)
            }
            Tool::Recall => {
                let session_id = session_arg(&mut args, &place)?;
                let body: RecallIn = from_value("recall", Value::Object(args))?;
                let session = rt.session(ns, &session_id)?;
                let request = requests::recall_request(limits, ns, &session_id, body)?;
                let result = RecallOut::from(session.recall_with(request).await?);
                if let Some(metrics) = &self.inner.metrics {
                    metrics.recall();
                }
                let text = render_recall(&result);
                answer(&result, text)
            }
            Tool::Feedback => {
                let session_id = session_arg(&mut args, &place)?;
                let body: FeedbackIn = from_value("feedback", Value::Object(args))?;
                let outcome = body.outcome;
                let target = requests::feedback_target(body)?;
                let report = rt
                    .session(ns, &session_id)?
                    .feedback(target, outcome)
                    .await?;
                let outcome = match outcome {
                    Outcome::Success => "success",
                    Outcome::Failure => "failure",
                };
                let text = format!(
                    "recorded {outcome} for {}",
                    plural(report.updated, "memory")
                );
                answer(
                    &Updated {
                        updated: report.updated,
                    },
                    text,
                )
            }
            Tool::Forget => {
                let MemoryArg { id } = from_value("arguments", Value::Object(args))?;
                let record = rt.memory(ns, id.parse()?)?.archive(BY_MCP).await?;
                let text = format!(
                    "archived {id}: it is no longer recalled; `mark` it `active` to restore it"
                );
                answer(
                    &Memory::all_of(rt.substrate(), vec![record])?.remove(0),
                    text,
                )
            }
            Tool::Mark => {
                let MarkArgs { id, status, reason } = from_value("arguments", Value::Object(args))?;
                requests::settable(status, "archive with the `forget` tool")?;
                let record = rt
                    .memory(ns, id.parse()?)?
                    .set_status_because(status, reason, BY_MCP)
                    .await?;
                let memory = Memory::all_of(rt.substrate(), vec![record])?.remove(0);
                let text = format!("{id} is now {}", status.as_str());
                answer(&memory, text)
            }
            Tool::Timeline => {
                let session_id = session_arg(&mut args, &place)?;
                let TimelineArgs { limit } = from_value("arguments", Value::Object(args))?;
                let limit = requests::timeline_limit(limits, limit)?;
                let records = rt.session(ns, &session_id)?.timeline(limit).await?;
                let items = Memory::all_of(rt.substrate(), records)?;
                let text = render_timeline(&session_id, &items);
                answer(&Timeline { items }, text)
            }
            Tool::Sessions => {
                let NoArgs {} = from_value("arguments", Value::Object(args))?;
                let sessions: Vec<_> = rt.sessions(ns).await?.into_iter().map(Into::into).collect();
                let sessions = Sessions { sessions };
                let mut text = format!(
                    "{} in this namespace",
                    plural(sessions.sessions.len(), "session")
                );
                for s in &sessions.sessions {
                    text.push_str(&format!(
                        "\n- {}: {} ({}), last active {}",
                        s.session_id,
                        plural(s.events as usize, "event"),
                        plural(s.memories as usize, "record"),
                        s.last_active
                    ));
                }
                answer(&sessions, text)
            }
            Tool::KnowledgeSearch => {
                let body: KnowledgeSearchIn = from_value("search", Value::Object(args))?;
                let k = limits.k(body.k)?;
                let result = RecallOut::from(rt.knowledge(ns)?.search(&body.query, k).await?);
                let text = render_recall(&result);
                answer(&result, text)
            }
            Tool::KnowledgeGraph => {
                let GraphArgs { around, depth } = from_value("arguments", Value::Object(args))?;
                let graph = requests::graph(rt, ns, &around, depth).await?;
                let text = render_graph(&graph);
                answer(&graph, text)
            }
            Tool::Condense => {
                let session_id = session_arg(&mut args, &place)?;
                let NoArgs {} = from_value("arguments", Value::Object(args))?;
                let session = rt.session(ns, &session_id)?;
                // A tool call never waits for a model: with an LLM condenser the window is
                // condensed in the background and shows up in the timeline.
                if rt.policy_for(ns).condensation.mode == CondensationMode::Llm {
                    session.condense_in_background()?;
                    let text = format!(
                        "condensing session `{session_id}` in the background with the LLM; the \
                         condensed record will appear in its timeline"
                    );
                    return answer(&CondenseOut { memory_id: None }, text);
                }
                let memory_id = session.condense().await?.map(|c| c.id.to_string());
                let text = match &memory_id {
                    Some(id) => {
                        format!("condensed session `{session_id}`'s recent window into {id}")
                    }
                    None => format!("nothing in session `{session_id}` to condense yet"),
                };
                answer(&CondenseOut { memory_id }, text)
            }
        }
    }

    /// Reads a resource: the policy, a memory with its history, a session's timeline.
    async fn read(&self, uri: &str, place: CallScope) -> ApiResult<Value> {
        let rt = &self.inner.rt;
        let ns = place.namespace.as_str();
        if uri == POLICY_URI {
            return Ok(json(&requests::policy_out(&rt.policy_for(ns))));
        }
        if let Some(id) = uri.strip_prefix("shadowbrain://memories/") {
            let memory = rt.memory(ns, id.parse()?)?;
            let record = Memory::from(memory.get().await?).with_chain(memory.chain().await?);
            return Ok(serde_json::json!({
                "memory": record,
                "history": requests::history(&memory).await?,
            }));
        }
        if let Some(session) = uri
            .strip_prefix("shadowbrain://sessions/")
            .and_then(|rest| rest.strip_suffix("/timeline"))
        {
            let limit = requests::timeline_limit(&self.inner.limits, None)?;
            let records = rt.session(ns, session)?.timeline(limit).await?;
            let items = Memory::all_of(rt.substrate(), records)?;
            return Ok(json(&Timeline { items }));
        }
        Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no resource `{uri}`; read {POLICY_URI}, shadowbrain://memories/{{id}} or \
                 shadowbrain://sessions/{{session_id}}/timeline"
            ),
        ))
    }
}

const POLICY_URI: &str = "shadowbrain://policy";

/// The prompt that sets a host's model up to use its memory.
const PROMPT: &str = "use_memory";

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_prompts()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("shadowbrain", env!("CARGO_PKG_VERSION"))
                    .with_title("shadowbrain long-term memory"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        let tool = Tool::named(name);
        let outcome = async {
            let place = self.place(&context)?;
            let Some(tool) = tool else {
                let tools: Vec<&str> = Tool::ALL.iter().map(|t| t.name()).collect();
                return Err(ApiError::invalid(
                    "tool",
                    format!(
                        "there is no tool `{name}`; the tools are {}",
                        tools.join(", ")
                    ),
                ));
            };
            let _slot = self.admit(tool).await?;
            self.run(tool, request.arguments.unwrap_or_default(), place)
                .await
        }
        .await;
        if let Some(metrics) = &self.inner.metrics {
            // Only the contract's names become labels: a client cannot grow the label set.
            metrics.tool_call(tool.map_or("unknown", Tool::name), outcome.is_ok());
        }
        let result = match outcome {
            Ok((structured, text)) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(structured);
                result
            }
            Err(e) => CallToolResult::error(vec![ContentBlock::text(error_text(&e))]),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let policy = Resource::new(POLICY_URI, "policy")
            .with_title("The memory policy in force")
            .with_description(
                "The policy that scores, ranks, condenses and forgets this namespace's \
                 memories: its name, hash and every section",
            )
            .with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![policy]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let memory = ResourceTemplate::new("shadowbrain://memories/{id}", "memory")
            .with_title("A memory and its history")
            .with_description("One record (`mem-…`) with every field and its whole audit history")
            .with_mime_type("application/json");
        let timeline = ResourceTemplate::new(
            "shadowbrain://sessions/{session_id}/timeline",
            "session timeline",
        )
        .with_title("A session's timeline")
        .with_description("A session's newest 100 records, newest first")
        .with_mime_type("application/json");
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            memory, timeline,
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let outcome = async {
            let place = self.place(&context)?;
            self.read(&request.uri, place).await
        }
        .await;
        match outcome {
            Ok(value) => {
                let text = serde_json::to_string_pretty(&value).unwrap_or_default();
                let contents =
                    ResourceContents::text(text, request.uri).with_mime_type("application/json");
                Ok(ReadResourceResult::new(vec![contents]).into())
            }
            // A resource has no error result of its own: a protocol error carries the text,
            // with the code in its data.
            Err(e) if e.status() == axum::http::StatusCode::NOT_FOUND => Err(
                ErrorData::resource_not_found(error_text(&e), Some(error_data(&e))),
            ),
            Err(e) if e.status().is_client_error() => Err(ErrorData::invalid_params(
                error_text(&e),
                Some(error_data(&e)),
            )),
            Err(e) => Err(ErrorData::internal_error(
                error_text(&e),
                Some(error_data(&e)),
            )),
        }
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let task = PromptArgument::new("task")
            .with_description("What you are about to do (recall looks for memories about it)")
            .with_required(true);
        let prompt = Prompt::new(
            PROMPT,
            Some(
                "Work on a task with long-term memory: recall what is known about it first, \
                 remember what happens, and report whether the memories helped",
            ),
            Some(vec![task]),
        )
        .with_title("Use long-term memory");
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != PROMPT {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no prompt `{}`; the prompt is `{PROMPT}`",
                    request.name
                ),
                None,
            ));
        }
        let task = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("task"))
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    "the prompt `use_memory` needs its `task` argument: what you are about to do",
                    None,
                )
            })?;
        let text = format!(
            "{task}\n\n\
             You have a long-term memory through the shadowbrain tools. WorkClass like this:\n\
             1. Before you act, call `recall` with a query that describes the task. Read its \
             context, and keep its `recall_id`.\n\
             2. While you work, call `remember` for what is worth keeping: what you tried, what \
             you observed, what the user told you, decisions and their reasons (one event per \
             fact; `kind` says what it is).\n\
             3. When you know how it went, call `feedback` with the `recall_id` and `outcome` \
             `success` if the memories helped or `failure` if they misled you. Memories that \
             help rank higher next time; those that mislead sink.\n\
             4. If a memory is wrong or out of date, `mark` it `obsolete` (or `forget` it) so it \
             is not recalled again."
        );
        let result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description("Recall before acting, remember while working, feedback after");
        Ok(result.into())
    }
}

/// What the server tells a host about itself at `initialize`.
const INSTRUCTIONS: &str = "shadowbrain is your long-term memory. Before acting on a task, call \
    `recall` with a query about it and use the context it returns; record what happens with \
    `remember`; afterwards send `feedback` with the recall's `recall_id` and whether it helped \
    (`success` or `failure`). Sessions: every tool that works on a session takes an optional \
    `session_id`; without it the server's default session is used. The namespace is fixed by \
    the server (its API key over HTTP) and is never an argument.";

/// Said in every session tool's description: how the session is chosen.
const SESSION_NOTE: &str = "`session_id` is optional: without it the call acts in this \
    server's default session (set by the host with `--session` or the `Shadowbrain-Session` \
    header, else `default`).";

/// Said in the description of every tool without a session: how the namespace is chosen.
const NAMESPACE_NOTE: &str = "The namespace is never an argument: it is the API key's (over \
    HTTP) or the server's `--namespace` (over stdio), and nothing outside it is visible.";

/// The tools with their descriptions (written for a model), input and output schemas.
fn tools() -> Vec<ToolSpec> {
    let tool = |tool: Tool, description: String| {
        ToolSpec::new(tool.name(), description, JsonObject::new())
    };
    let read_only = || ToolAnnotations::new().read_only(true);
    vec![
        tool(
            Tool::Remember,
            format!(
                "Record what happened into long-term memory: one event (give `kind` and \
                 `text`) or several at once (give `events`, a list of such objects). Use it \
                 for observations, actions you took, the user's messages and preferences, \
                 goals, decisions and outcomes — one fact per event. It answers at once with \
                 the new ids (`mem-…`); scoring and indexing happen in the background, so a \
                 memory is recallable a moment later. {SESSION_NOTE} {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<RememberArgs>()
        .with_output_schema::<Ids>()
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        tool(
            Tool::Recall,
            format!(
                "Ask long-term memory what is relevant now: answers the best memories for \
                 `query`, best first, each with `why` (relevance, recency, importance and \
                 utility parts of its score), a prompt-ready `context` block to use as \
                 background, and a `recall_id` to send back with `feedback` once you know \
                 whether the memories helped. Call it before acting on a task. `scope` widens \
                 the search from the session to the agent (`agent_id`) or the whole \
                 namespace. {SESSION_NOTE} {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<RecallArgs>()
        .with_output_schema::<RecallOut>()
        .with_annotations(read_only()),
        tool(
            Tool::Feedback,
            format!(
                "Tell long-term memory whether what it recalled helped: `outcome` `success` \
                 or `failure`, for every memory of a recall (`recall_id`) or for memories you \
                 name (`memory_ids`), not both. Helpful memories rank higher afterwards and \
                 misleading ones sink; proven lessons are promoted into the shared knowledge \
                 pool. {SESSION_NOTE} {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<FeedbackArgs>()
        .with_output_schema::<Updated>()
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
        tool(
            Tool::Forget,
            format!(
                "Archive a memory (`id`, `mem-…`): it is never recalled again but is kept, \
                 with its history, and can be restored with `mark` status `active`. Use it \
                 for a memory that is wrong or harmful. {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<MemoryArg>()
        .with_output_schema::<Memory>()
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(true),
        ),
        tool(
            Tool::Mark,
            format!(
                "Set a memory's status (`id`, `mem-…`): `pinned` (always kept, never fades), \
                 `obsolete` (kept for history, never recalled: for a fact that is no longer \
                 true), `wrong` (never recalled and counted as a failure: for a memory that \
                 was never true or misled you) or `active` (normal; also restores a \
                 forgotten memory). The change, with the `reason` you give, is in the \
                 memory's history. {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<MarkArgs>()
        .with_output_schema::<Memory>()
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(true),
        ),
        tool(
            Tool::Timeline,
            format!(
                "A session's records, newest first (`limit`, default 100): what was \
                 recorded, in order, with each record's kind, importance, strength and \
                 status. {SESSION_NOTE} {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<TimelineArgsSchema>()
        .with_output_schema::<Timeline>()
        .with_annotations(read_only()),
        tool(
            Tool::Sessions,
            format!(
                "The sessions of this namespace, with how many events and records each holds \
                 and when it was last active. Takes no arguments. {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<NoArgs>()
        .with_output_schema::<Sessions>()
        .with_annotations(read_only()),
        tool(
            Tool::KnowledgeSearch,
            format!(
                "Search the namespace's shared knowledge pool: lessons promoted from every \
                 agent's and session's experience because they proved useful. Answers like \
                 `recall`, over knowledge only. {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<KnowledgeSearchIn>()
        .with_output_schema::<RecallOut>()
        .with_annotations(read_only()),
        tool(
            Tool::KnowledgeGraph,
            format!(
                "The graph around a record (`around`, `mem-…`): the records within `depth` \
                 edges (default 2, at most 5) and the edges among them (`derived_from`, \
                 `similar_to`, `supersedes`, `contradicts`). Use it to see where a lesson \
                 came from and what it relates to. {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<GraphArgs>()
        .with_output_schema::<Graph>()
        .with_annotations(read_only()),
        tool(
            Tool::Condense,
            format!(
                "Condense a session's recent records into one condensed memory now (the \
                 policy also does it on its own as sessions grow). Answers the condensed \
                 record's id, or null when there was nothing to condense. {SESSION_NOTE} {NAMESPACE_NOTE}"
            ),
        )
        .with_input_schema::<SessionArg>()
        .with_output_schema::<CondenseOut>()
        .with_annotations(ToolAnnotations::new().read_only(false).destructive(false)),
    ]
}

/// Whether an MCP message (a POST body to `/mcp`) may be sent a second time when the first
/// went unanswered, with nothing stored beyond what one delivery stores: every message but a
/// call of a tool whose annotations say neither read-only nor idempotent (`remember`,
/// `feedback`, `condense`). A body that is not a JSON-RPC message is refused the same way
/// each time, so it too may be sent again. Cluster forwarding asks this when a partition's
/// owner dies with the request in hand.
pub fn safe_to_resend(body: &[u8]) -> bool {
    static REPEATABLE: std::sync::LazyLock<Vec<Cow<'static, str>>> =
        std::sync::LazyLock::new(|| {
            tools()
                .into_iter()
                .filter(|t| {
                    t.annotations.as_ref().is_some_and(|a| {
                        a.read_only_hint == Some(true) || a.idempotent_hint == Some(true)
                    })
                })
                .map(|t| t.name)
                .collect()
        });
    let repeatable = |message: &Value| {
        if message.get("method").and_then(Value::as_str) != Some("tools/call") {
            return true;
        }
        match message.pointer("/params/name").and_then(Value::as_str) {
            Some(name) => REPEATABLE.iter().any(|t| t == name) || Tool::named(name).is_none(),
            None => true,
        }
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(batch)) => batch.iter().all(repeatable),
        Ok(message) => repeatable(&message),
        Err(_) => true,
    }
}

/// Takes `session_id` out of a call's arguments (the rest are the HTTP body's fields), or
/// the default session.
fn session_arg(args: &mut JsonObject, place: &CallScope) -> ApiResult<String> {
    match args.remove("session_id") {
        None | Some(Value::Null) => Ok(place.session.clone()),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ApiError::invalid(
            "session_id",
            format!(
                "{other} is not a session id; give a string of 1 to 128 of A-Z a-z 0-9 . _ : - \
                 (or leave it out for the default session)"
            ),
        )),
    }
}

/// `remember`'s arguments as the body of `POST …/events`: one event or `{"events":[…]}`,
/// each event's `kind` defaulting to `observation`.
fn remember_body(mut args: JsonObject) -> ApiResult<Value> {
    let with_kind = |mut event: Value| {
        if let Value::Object(fields) = &mut event
            && !fields.contains_key("kind")
        {
            fields.insert("kind".into(), Value::from("observation"));
        }
        event
    };
    match args.remove("events") {
        None | Some(Value::Null) => Ok(with_kind(Value::Object(args))),
        Some(_) if !args.is_empty() => {
            let mut fields: Vec<&str> = args.keys().map(String::as_str).collect();
            fields.sort_unstable();
            Err(ApiError::invalid(
                "events",
                format!(
                    "give either the fields of one event or `events`, not both (also given: \
                     {}); put those fields inside each event",
                    fields.join(", ")
                ),
            ))
        }
        Some(Value::Array(events)) if events.is_empty() => Err(ApiError::invalid(
            "events",
            "`events` is empty; give at least one event, e.g. [{\"kind\":\"observation\",\"text\":\"…\"}]",
        )),
        Some(Value::Array(events)) => Ok(serde_json::json!({
            "events": events.into_iter().map(with_kind).collect::<Vec<_>>(),
        })),
        Some(other) => Err(ApiError::invalid(
            "events",
            format!(
                "`events` must be a list of events, not {other}; give \
                 [{{\"kind\":\"observation\",\"text\":\"…\"}}]"
            ),
        )),
    }
}

/// A success: the structured answer, and its text.
fn answer<T: Serialize>(value: &T, text: String) -> ApiResult<(Value, String)> {
    Ok((json(value), text))
}

fn json<T: Serialize>(value: &T) -> Value {
    // The wire types serialize infallibly (string keys, finite numbers).
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A tool error's text: the HTTP error's code and message (what was wrong, how to fix it).
fn error_text(e: &ApiError) -> String {
    format!("{}: {}", e.code(), e.message())
}

fn error_data(e: &ApiError) -> Value {
    serde_json::json!({ "code": e.code(), "status": e.status().as_u16() })
}

fn plural(n: usize, what: &str) -> String {
    match (n, what) {
        (1, _) => format!("1 {what}"),
        (_, "memory") => format!("{n} memories"),
        _ => format!("{n} {what}s"),
    }
}

/// At most `max` bytes of `text` on one line, cut at a character boundary.
fn excerpt(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.len() <= max {
        return flat;
    }
    let mut end = max;
    while !flat.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &flat[..end])
}

/// A recall as text: the id to send back, each memory with its score's parts, the context.
fn render_recall(result: &RecallOut) -> String {
    let mut text = String::new();
    if let Some(id) = &result.recall_id {
        text.push_str(&format!(
            "recall_id: {id} (after acting, send it to `feedback` with outcome success or \
             failure)\n"
        ));
    }
    if result.memories.is_empty() {
        text.push_str("no memories matched");
    } else {
        text.push_str(&format!(
            "{}, best first:",
            plural(result.memories.len(), "memory")
        ));
    }
    for (i, m) in result.memories.iter().enumerate() {
        let w = &m.why;
        text.push_str(&format!(
            "\n{}. {} ({}, {}) score {:.3} = relevance {:.3} + recency {:.3} + importance {:.3} \
             + utility {:.3}\n   {}",
            i + 1,
            m.memory.id,
            m.memory.kind,
            m.memory.tier.as_str(),
            m.score,
            w.relevance,
            w.recency,
            w.importance,
            w.utility,
            excerpt(&m.memory.text, 300),
        ));
    }
    if !result.context.is_empty() {
        text.push_str("\n\ncontext:\n");
        text.push_str(&result.context);
    }
    for note in &result.notes {
        text.push_str(&format!("\nnote: {note}"));
    }
    text
}

fn render_timeline(session_id: &str, items: &[Memory]) -> String {
    let mut text = format!(
        "{} in session `{session_id}`, newest first",
        plural(items.len(), "record")
    );
    for m in items {
        text.push_str(&format!(
            "\n- {} {} {} ({}, importance {:.1}, strength {:.2}, {}): {}",
            m.timestamp,
            m.id,
            m.kind,
            m.tier.as_str(),
            m.importance,
            m.strength,
            m.status.as_str(),
            excerpt(&m.text, 200),
        ));
    }
    text
}

fn render_graph(graph: &Graph) -> String {
    let mut text = format!(
        "{} and {}",
        plural(graph.nodes.len(), "record"),
        plural(graph.edges.len(), "edge")
    );
    for n in &graph.nodes {
        text.push_str(&format!(
            "\n- {} ({}): {}",
            n.id,
            n.tier.as_str(),
            excerpt(&n.text, 200)
        ));
    }
    for e in &graph.edges {
        text.push_str(&format!("\n{} -{}-> {}", e.from, e.relation.as_str(), e.to));
    }
    text
}

// The tools' arguments. Those with an HTTP body take that body's fields (the same struct,
// read by the same function) and an optional `session_id`; their schemas here only
// describe them.

/// The session to act in (optional: see the tool's description).
#[derive(Debug, JsonSchema)]
struct SessionField {
    /// The session to act in, `[A-Za-z0-9._:-]{1,128}`; leave it out for the default
    /// session.
    #[allow(dead_code)]
    session_id: Option<String>,
}

/// `condense`'s arguments.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct SessionArg {
    #[serde(flatten)]
    session: SessionField,
}

/// `recall`'s arguments.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct RecallArgs {
    #[serde(flatten)]
    session: SessionField,
    #[serde(flatten)]
    body: RecallIn,
}

/// `feedback`'s arguments.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct FeedbackArgs {
    #[serde(flatten)]
    session: SessionField,
    #[serde(flatten)]
    body: FeedbackIn,
}

/// One event for `remember`.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct EventArgs {
    /// What it is: `observation` (the default), `thought`, `action`, `user_message`,
    /// `goal`, `feedback`, or any custom `[a-z][a-z0-9_]{0,31}`.
    kind: Option<String>,
    /// The event in words (required unless `content` is given).
    text: Option<String>,
    /// Structured content; `text` is derived from it when not given.
    content: Option<Value>,
    /// The agent that produced it (lets `recall` with scope `agent` find it).
    agent_id: Option<String>,
    /// Free-form metadata.
    metadata: Option<Value>,
    /// How much it matters, 0 to 10 (default: scored by the policy).
    importance: Option<f32>,
    /// The id (`mem-…`) of the event this one follows from.
    parent_id: Option<String>,
    /// When it happened, RFC 3339 (default: now).
    timestamp: Option<String>,
}

/// `remember`'s arguments: one event's fields, or `events`.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct RememberArgs {
    #[serde(flatten)]
    session: SessionField,
    #[serde(flatten)]
    event: EventArgs,
    /// Several events at once (at most 1000), instead of one event's fields.
    events: Option<Vec<EventArgs>>,
}

/// A memory's id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct MemoryArg {
    /// The memory's id, `mem-…`.
    id: String,
}

/// `mark`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct MarkArgs {
    /// The memory's id, `mem-…`.
    id: String,
    /// `pinned`, `obsolete`, `wrong` or `active`.
    #[schemars(with = "crate::api::SettableStatusSchema")]
    status: Status,
    /// Why (optional, kept in the memory's history; at most 1024 bytes).
    #[serde(default)]
    reason: Option<String>,
}

/// `timeline`'s arguments without the session.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimelineArgs {
    limit: Option<usize>,
}

/// `timeline`'s arguments.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)]
struct TimelineArgsSchema {
    #[serde(flatten)]
    session: SessionField,
    /// How many records, newest first (1 to 1000, default 100).
    #[schemars(range(min = 1, max = 1000))]
    limit: Option<usize>,
}

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// `knowledge_graph`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GraphArgs {
    /// The record to start from, `mem-…`.
    around: String,
    /// How many edges away (0 to 5, default 2).
    #[schemars(range(max = 5))]
    depth: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_of_the_contract_is_listed_once_with_schemas_of_objects() {
        let tools = tools();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, Tool::ALL.map(Tool::name));
        for tool in &tools {
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&Value::from("object")),
                "{}",
                tool.name
            );
            let output = tool.output_schema.as_ref().expect("structured output");
            assert_eq!(
                output.get("type"),
                Some(&Value::from("object")),
                "{}",
                tool.name
            );
            assert!(
                tool.description.as_ref().is_some_and(|d| d.len() > 80),
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn remember_takes_one_event_or_a_batch_never_both() {
        let object = |v: Value| v.as_object().cloned().unwrap();
        let one = remember_body(object(serde_json::json!({"text": "a"}))).unwrap();
        assert_eq!(one, serde_json::json!({"kind": "observation", "text": "a"}));
        let batch = remember_body(object(serde_json::json!({
            "events": [{"text": "a"}, {"kind": "goal", "text": "b"}]
        })))
        .unwrap();
        assert_eq!(batch["events"][0]["kind"], "observation");
        assert_eq!(batch["events"][1]["kind"], "goal");
        let both = remember_body(object(serde_json::json!({"text": "a", "events": []})));
        assert!(both.unwrap_err().message().contains("not both"));
        let empty = remember_body(object(serde_json::json!({"events": []})));
        assert!(empty.unwrap_err().message().contains("empty"));
    }
}

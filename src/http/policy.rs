//! The policy in force (`GET /v1/policy`) and its reload from the files (admin).

use axum::Json;
use axum::extract::State;

use super::auth::{Admin, Namespace};
use super::state::AppState;
use crate::api::requests::policy_out;
use crate::api::{ApiResult, ErrorBody, PolicyOut, Unauthorized};

/// `GET /v1/policy`.
#[utoipa::path(get, path = "/v1/policy", tag = "policy",
    responses(
        (status = 200, description = "The policy in force for the caller's namespace (its own when `[[namespaces]]` gives it one, else the default)", body = PolicyOut),
        Unauthorized,
    ))]
pub(super) async fn get_policy(State(s): State<AppState>, ns: Namespace) -> Json<PolicyOut> {
    Json(policy_out(&s.rt.policy_for(&ns.0)))
}

/// `POST /v1/policy/reload`: the new policy, or 422 with every error of the file (the
/// running policy stays).
#[utoipa::path(post, path = "/v1/policy/reload", tag = "policy",
    responses(
        (status = 200, description = "The newly active default policy, and the name and hash of each namespace's own", body = PolicyOut),
        Unauthorized,
        (status = 403, description = "A tenant key: the policy is server-wide, reloading it needs an admin key", body = ErrorBody),
        (status = 422, description = "Every error of every policy file; all the running policies stay", body = ErrorBody),
        (status = 409, description = "Cluster mode: the nodes read different policies (`policy_differs`, each node's name and hash); all the running policies stay", body = ErrorBody),
        (status = 503, description = "Cluster mode: a live node did not answer; the message says what changed", body = ErrorBody),
    ))]
pub(super) async fn post_policy_reload(
    State(s): State<AppState>,
    _admin: Admin,
) -> ApiResult<Json<PolicyOut>> {
    let policies = s.rt.reload_policy().await?;
    let mut out = policy_out(&policies.default);
    out.namespaces = policies
        .namespaces
        .iter()
        .map(|(ns, p)| (ns.clone(), p.stamp().into()))
        .collect();
    Ok(Json(out))
}

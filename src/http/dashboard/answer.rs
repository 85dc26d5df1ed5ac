//! What a dashboard view answers: an HTML page, a redirect, or an error page for people
//! (the contract's code and message, shown as HTML).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use super::page;
use crate::api::ApiError;

/// A `303 See Other` to `to` (after a form, so a reload does not post it again).
pub(super) fn redirect(to: &str) -> Response {
    let mut answer = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(to) {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    answer
}

/// A dashboard page that could not be shown: the status and the error's code and words,
/// on a page of its own (the same words `/v1` would answer).
#[derive(Debug)]
pub(super) struct UiError {
    status: StatusCode,
    pub(super) code: String,
    pub(super) message: String,
}

impl UiError {
    pub(super) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        UiError {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }
}

impl From<ApiError> for UiError {
    fn from(e: ApiError) -> Self {
        UiError::new(e.status(), e.code(), e.message())
    }
}

impl From<crate::Error> for UiError {
    fn from(e: crate::Error) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        let body = page::bare(
            title,
            maud::html! {
                h1 { (title) }
                p.error role="alert" { code { (self.code) } ": " (self.message) }
                p { a href="/" { "Back to the overview" } }
            },
        );
        (self.status, Html(body.into_string())).into_response()
    }
}

/// What a view answers.
pub(super) type UiResult = Result<Response, UiError>;

/// An HTML page with status 200.
pub(super) fn html(markup: maud::Markup) -> Response {
    Html(markup.into_string()).into_response()
}

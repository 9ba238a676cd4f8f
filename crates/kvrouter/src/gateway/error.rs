//! OpenAI-style error responses: `{"error": {"message", "type", "param",
//! "code"}}` with the status that goes with them, so OpenAI clients read
//! the gateway's own refusals as they read an engine's.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refusal or failure of the gateway itself (an engine's own error
/// responses pass through unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON, or not a JSON object (400).
    #[error("{0}")]
    InvalidJson(String),
    /// A required field is missing or of the wrong type (400).
    #[error("{0}")]
    MissingField(String),
    /// The prompt cannot be tokenized as given (400).
    #[error("{0}")]
    InvalidPrompt(String),
    /// The prompt is longer than the context limit (400).
    #[error("{0}")]
    ContextLength(String),
    /// No tokenizer or no workers for the model (404).
    #[error("{0}")]
    ModelNotFound(String),
    /// The body is over `--max-body-bytes` (413).
    #[error("{0}")]
    TooLarge(String),
    /// The concurrency limit and its queue are full, or the wait timed
    /// out (429, with `Retry-After`).
    #[error("{0}")]
    Overloaded(String),
    /// The gateway failed on its own side (500).
    #[error("{0}")]
    Internal(String),
    /// The engine's response broke off or could not be read (502).
    #[error("{0}")]
    BadGateway(String),
    /// No engine could take the request: none healthy, none reachable,
    /// or the router is draining (503).
    #[error("{0}")]
    Unavailable(String),
    /// The engine did not answer in time (504).
    #[error("{0}")]
    Timeout(String),
}

impl GatewayError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidJson(_)
            | Self::MissingField(_)
            | Self::InvalidPrompt(_)
            | Self::ContextLength(_) => StatusCode::BAD_REQUEST,
            Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The OpenAI `code` field.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidJson(_) => "invalid_json",
            Self::MissingField(_) => "missing_required_parameter",
            Self::InvalidPrompt(_) => "invalid_prompt",
            Self::ContextLength(_) => "context_length_exceeded",
            Self::ModelNotFound(_) => "model_not_found",
            Self::TooLarge(_) => "request_too_large",
            Self::Overloaded(_) => "rate_limit_exceeded",
            Self::Internal(_) => "internal_error",
            Self::BadGateway(_) => "bad_gateway",
            Self::Unavailable(_) => "service_unavailable",
            Self::Timeout(_) => "timeout",
        }
    }

    /// The OpenAI `type` field: the client's fault or the server's.
    pub fn kind(&self) -> &'static str {
        if self.status().is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.to_string(),
            "type": self.kind(),
            "param": null,
            "code": self.code(),
        }})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, Self::Overloaded(_)) {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_statuses() {
        let e = GatewayError::ContextLength("too long".into());
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            json!({"error": {"message": "too long", "type": "invalid_request_error",
                              "param": null, "code": "context_length_exceeded"}})
        );
        let e = GatewayError::Timeout("slow".into());
        assert_eq!(e.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(e.kind(), "server_error");
        let r = GatewayError::Overloaded("full".into()).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}

//! OpenAI's request and response shapes: parsing and checking a
//! completion or chat request, the JSON of responses and stream chunks, and
//! the error body (`{"error": {"message", "type", "param", "code"}}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kvrouter::tokenize::{Endpoint, ModelTokenizer};
use serde_json::{json, Value};

/// Which OpenAI API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

impl Api {
    fn endpoint(self) -> Endpoint {
        match self {
            Self::Completions => Endpoint::Completions,
            Self::Chat => Endpoint::ChatCompletions,
        }
    }

    /// The prefix of response ids.
    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Self::Completions => "cmpl",
            Self::Chat => "chatcmpl",
        }
    }
}

/// An error answered as OpenAI's error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    /// HTTP status.
    pub(crate) status: StatusCode,
    /// What went wrong, for the client.
    pub(crate) message: String,
}

impl ApiError {
    /// An error with `status`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// A 400.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": null,
            "code": self.status.as_u16(),
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

/// The limits a request is checked against.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// The served model's name.
    pub(crate) model: String,
    /// Longest prompt, tokens.
    pub(crate) max_model_len: usize,
    /// Most tokens one request may generate (larger asks are capped).
    pub(crate) max_tokens: u32,
}

/// Tokens generated when a request does not say.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 16;

/// A checked request.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// Stream the tokens as server-sent events.
    pub(crate) stream: bool,
    /// Send usage in a last chunk (`stream_options.include_usage`).
    pub(crate) include_usage: bool,
    /// Tokens to generate.
    pub(crate) max_tokens: u32,
    /// The prompt's tokens, as the engine computes them.
    pub(crate) tokens: Vec<u32>,
}

fn field_bool(body: &Value, name: &str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!("`{name}` must be a boolean"))),
    }
}

fn field_count(body: &Value, name: &str) -> Result<Option<u64>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(ApiError::bad_request(format!(
                "`{name}` must be an integer of at least 1, got {v}"
            ))),
        },
    }
}

/// Parses and checks a request body: JSON object (400), the served model
/// (404), field types (400), the prompt's tokens (400 where the tokenizer
/// blames the request) and its length (400).
pub(crate) fn parse(
    api: Api,
    limits: &Limits,
    tokenizer: &ModelTokenizer,
    bytes: &[u8],
) -> Result<Parsed, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    match body.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if *m == limits.model => {}
        Some(m) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{}` does not exist.",
                    m.as_str().unwrap_or(&m.to_string())
                ),
            ))
        }
    }
    let stream = field_bool(&body, "stream")?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(o @ Value::Object(_)) => field_bool(o, "include_usage")?,
        Some(_) => return Err(ApiError::bad_request("`stream_options` must be an object")),
    };
    let mut max_tokens = field_count(&body, "max_tokens")?;
    if api == Api::Chat {
        if let Some(n) = field_count(&body, "max_completion_tokens")? {
            max_tokens = Some(n);
        }
    }
    let max_tokens = max_tokens
        .unwrap_or(u64::from(DEFAULT_MAX_TOKENS))
        .min(u64::from(limits.max_tokens)) as u32;
    let tokens = tokenizer
        .prompt_tokens(api.endpoint(), &body)
        .map_err(|e| {
            let status = if e.is_client_error() {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            ApiError::new(status, e.to_string())
        })?;
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if tokens.len() > limits.max_model_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {} tokens. However, your request has {} \
             input tokens. Please reduce the length of the input messages.",
            limits.max_model_len,
            tokens.len()
        )));
    }
    Ok(Parsed {
        stream,
        include_usage,
        max_tokens,
        tokens,
    })
}

/// What every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    /// The API.
    pub(crate) api: Api,
    /// The response id.
    pub(crate) id: String,
    /// Unix seconds.
    pub(crate) created: u64,
    /// The model.
    pub(crate) model: String,
}

/// The `usage` object: prompt, completion and cached prompt tokens.
pub(crate) fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// One streamed token: `text` (completions) or `delta.content` (chat, with
/// the role on the first), `finish_reason` "length" on the last.
pub(crate) fn chunk(h: &Head, text: &str, first: bool, last: bool, usage_null: bool) -> Value {
    let finish = if last { json!("length") } else { Value::Null };
    let (object, choice) = match h.api {
        Api::Completions => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
        ),
        Api::Chat => {
            let delta = if first {
                json!({"role": "assistant", "content": text})
            } else {
                json!({"content": text})
            };
            (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}),
            )
        }
    };
    let mut v = json!({
        "id": h.id, "object": object, "created": h.created, "model": h.model,
        "choices": [choice],
    });
    if usage_null {
        v["usage"] = Value::Null;
    }
    v
}

/// The chunk after the last token when usage is asked for: no choices.
pub(crate) fn usage_chunk(h: &Head, usage: Value) -> Value {
    let object = match h.api {
        Api::Completions => "text_completion",
        Api::Chat => "chat.completion.chunk",
    };
    json!({
        "id": h.id, "object": object, "created": h.created, "model": h.model,
        "choices": [], "usage": usage,
    })
}

/// A whole (non-streamed) response.
pub(crate) fn full(h: &Head, text: &str, usage: Value) -> Value {
    let (object, choice) = match h.api {
        Api::Completions => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length",
                   "stop_reason": null}),
        ),
        Api::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": "length", "stop_reason": null}),
        ),
    };
    json!({
        "id": h.id, "object": object, "created": h.created, "model": h.model,
        "choices": [choice], "usage": usage,
    })
}

/// The generated tokens: the prompt's own that decode to some text (ids
/// the tokenizer surely knows; special tokens left out), cycled, and each
/// one's text as an incremental decode gives it (the text of the last few
/// tokens with it, minus without it), so that the pieces concatenate to
/// the decode of the whole.
pub(crate) fn generate(
    tokenizer: &ModelTokenizer,
    prompt: &[u32],
    n: usize,
) -> (Vec<String>, String) {
    const WINDOW: usize = 4;
    let dec = |t: &[u32]| tokenizer.decode(t).unwrap_or_default();
    let mut vocab: Vec<u32> = prompt
        .iter()
        .copied()
        .filter(|&t| !dec(&[t]).is_empty())
        .take(n)
        .collect();
    if vocab.is_empty() {
        vocab = prompt.to_vec();
    }
    let gen: Vec<u32> = vocab.iter().copied().cycle().take(n).collect();
    let pieces: Vec<String> = (0..gen.len())
        .map(|i| {
            let lo = i.saturating_sub(WINDOW);
            let before = dec(&gen[lo..i]);
            let with = dec(&gen[lo..=i]);
            match with.strip_prefix(before.as_str()) {
                Some(rest) => rest.to_string(),
                None => dec(&gen[i..=i]),
            }
        })
        .collect();
    let text = pieces.concat();
    (pieces, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits() -> Limits {
        Limits {
            model: "m".into(),
            max_model_len: 40,
            max_tokens: 8,
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            "[a-z <|>]{0,60}".prop_map(Value::from),
            Just(json!("m")),
            Just(json!("user")),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop::sample::select(vec!["role", "content", "include_usage"]),
                        inner
                    ),
                    0..3
                )
                .prop_map(|kv| Value::Object(
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                )),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Value> {
        let keys = prop::sample::select(vec![
            "model",
            "prompt",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "stream",
            "stream_options",
            "add_special_tokens",
        ]);
        prop::collection::vec((keys, value()), 0..6)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
    }

    proptest! {
        /// Any body either fails with a client error or parses within the
        /// limits; nothing panics.
        #[test]
        fn any_body_is_refused_or_within_limits(b in body(), chat in any::<bool>()) {
            let tok = ModelTokenizer::builtin();
            let api = if chat { Api::Chat } else { Api::Completions };
            let bytes = serde_json::to_vec(&b).unwrap();
            match parse(api, &limits(), &tok, &bytes) {
                Ok(p) => {
                    prop_assert!(!p.tokens.is_empty() && p.tokens.len() <= 40);
                    prop_assert!((1..=8).contains(&p.max_tokens));
                    let (pieces, text) = generate(&tok, &p.tokens, p.max_tokens as usize);
                    prop_assert_eq!(pieces.len(), p.max_tokens as usize);
                    prop_assert_eq!(pieces.concat(), text);
                }
                Err(e) => prop_assert!(e.status.is_client_error(), "{:?}", e),
            }
        }
    }

    #[test]
    fn defaults_caps_and_model() {
        let tok = ModelTokenizer::builtin();
        let p = |v: Value| parse(Api::Completions, &limits(), &tok, v.to_string().as_bytes());
        let ok = p(json!({"prompt": "hi"})).unwrap();
        assert_eq!((ok.max_tokens, ok.stream, ok.tokens.len()), (8, false, 2));
        let limits16 = Limits {
            max_tokens: 100,
            ..limits()
        };
        let d = parse(Api::Completions, &limits16, &tok, br#"{"prompt": "hi"}"#).unwrap();
        assert_eq!(d.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(
            p(json!({"model": "x", "prompt": "hi"})).unwrap_err().status,
            404
        );
        assert_eq!(
            p(json!({"prompt": "x".repeat(41)})).unwrap_err().status,
            400
        );
        let chat = parse(
            Api::Chat,
            &limits16,
            &tok,
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                   "max_completion_tokens": 3, "stream": true,
                   "stream_options": {"include_usage": true}})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            (chat.max_tokens, chat.stream, chat.include_usage),
            (3, true, true)
        );
    }
}

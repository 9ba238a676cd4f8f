//! Tokenization as the engine does it, so the router hashes the blocks the
//! engine will store.
//!
//! A model directory holds HF's `tokenizer.json` and, optionally,
//! `tokenizer_config.json` (the chat template, special tokens, context
//! length). A completion's prompt is encoded with the tokenizer's special
//! tokens added (vLLM's default for `/v1/completions`); a chat request is
//! first rendered with the model's Jinja chat template, then encoded without
//! adding special tokens (the template writes them, as vLLM assumes for
//! `/v1/chat/completions`). The template runs in `minijinja` set up as
//! `transformers` sets up Jinja: blocks trimmed and left-stripped, loop
//! controls, Python string methods, `raise_exception`, `strftime_now`, and a
//! `tojson` that writes what Python's `json.dumps` writes.
//!
//! [`ModelTokenizer::builtin`] is a byte-level tokenizer (one token per
//! byte) with a ChatML template, for a fleet started with no model files.
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind, Value};
use serde_json::Value as Json;

mod prefix;

pub use prefix::CacheStats;
use prefix::{Cuts, PrefixCache, Shape};

/// Which OpenAI endpoint a request body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`: `prompt` is text or token ids.
    Completions,
    /// `POST /v1/chat/completions`: `messages`, rendered by the chat template.
    ChatCompletions,
}

/// A prompt's tokens as far as [`ModelTokenizer::prompt_tokens_until`]
/// encoded them.
#[derive(Debug)]
pub struct PromptTokens {
    /// The leading tokens; all of them when `rest` is `None`.
    pub tokens: Vec<u32>,
    /// The text not encoded yet.
    pub rest: Option<Rest>,
}

/// The part of a prompt left unencoded (see [`ModelTokenizer::finish`]).
#[derive(Debug)]
pub struct Rest {
    text: String,
    at: prefix::Resume,
    /// Tokens of the text encoded so far (special tokens not counted).
    body_tokens: usize,
    /// The special tokens that follow the text.
    after: Vec<u32>,
    /// See [`Rest::fills_cache`].
    fills: bool,
}

impl Rest {
    /// Bytes of text not encoded yet.
    pub fn bytes(&self) -> usize {
        self.text.len() - self.encoded_bytes()
    }

    /// Whether finishing would keep a chunk in the prefix cache (else
    /// encoding the rest is of no use to later requests).
    pub fn fills_cache(&self) -> bool {
        self.fills
    }

    /// Bytes of text encoded so far (up to the cut, and a probe past it).
    fn encoded_bytes(&self) -> usize {
        self.at.pos + self.at.probe.0
    }

    /// The most tokens the rest can take: the tokenizers a prefix cache
    /// serves are byte-level, where a token stands for at least one byte.
    pub fn max_tokens(&self) -> usize {
        self.bytes() + self.after.len()
    }

    /// The rest's tokens estimated at the rate of the text before it
    /// (rounded up; at most [`max_tokens`](Self::max_tokens)).
    pub fn estimated_tokens(&self) -> usize {
        let est = match self.encoded_bytes() {
            0 => self.bytes(),
            done => (self.bytes() * self.body_tokens).div_ceil(done),
        };
        est.min(self.bytes()) + self.after.len()
    }
}

/// What a request asks to be tokenized.
enum Source<'a> {
    /// Text, and whether special tokens are added.
    Text(Cow<'a, str>, bool),
    /// Token ids given.
    Ids(Vec<u32>),
}

/// Why a tokenizer could not be loaded or a request not tokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A model file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `tokenizer.json`, `tokenizer_config.json` or the chat template is not
    /// usable.
    #[error("loading the tokenizer: {0}")]
    Load(String),
    /// The request cannot be tokenized (the client's fault): a missing or
    /// mistyped field, or a conversation the chat template refuses.
    #[error("{0}")]
    BadRequest(String),
    /// The tokenizer failed on valid input.
    #[error("tokenizer: {0}")]
    Internal(String),
}

impl TokenizeError {
    /// True when the request was at fault (an HTTP 400), not the server.
    pub fn is_client_error(&self) -> bool {
        matches!(self, Self::BadRequest(_))
    }
}

/// A model's tokenizer and chat template.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    /// Holds the compiled chat template (named [`TEMPLATE`]), if any.
    env: Option<Environment<'static>>,
    /// Special tokens the template sees (`bos_token`, `eos_token`, ...).
    specials: serde_json::Map<String, Json>,
    max_context: Option<usize>,
    /// Where the tokenizer's output may be cut and what its special tokens
    /// are, if its structure says (else no prefix cache).
    shape: Option<Shape>,
    /// Chunks of prompts seen before ([`ModelTokenizer::with_prefix_cache`]).
    cache: Option<PrefixCache>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.env.is_some())
            .field("max_context", &self.max_context)
            .finish()
    }
}

const TEMPLATE: &str = "chat";

/// The name that stands for the built-in tokenizer where a model directory
/// is expected.
pub const BUILTIN: &str = "builtin";

/// `transformers` treats a `model_max_length` this large as unset.
const UNSET_LENGTH: f64 = 1e12;

impl ModelTokenizer {
    /// Loads `dir/tokenizer.json` and, if present, `dir/tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizeError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| TokenizeError::Io { path, source })
        };
        let tokenizer = read("tokenizer.json")?;
        let config = match read("tokenizer_config.json") {
            Ok(bytes) => Some(serde_json::from_slice::<Json>(&bytes).map_err(|e| {
                TokenizeError::Load(format!(
                    "{}: {e}",
                    dir.join("tokenizer_config.json").display()
                ))
            })?),
            Err(TokenizeError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        Self::from_json(&tokenizer, config.as_ref())
    }

    /// `builtin` (the [`ModelTokenizer::builtin`] one), else a model
    /// directory ([`ModelTokenizer::from_dir`]): what a `--tokenizer` flag
    /// names.
    pub fn load(spec: &Path) -> Result<Self, TokenizeError> {
        if spec.as_os_str() == BUILTIN {
            Ok(Self::builtin())
        } else {
            Self::from_dir(spec)
        }
    }

    /// Builds from the bytes of a `tokenizer.json` and a parsed
    /// `tokenizer_config.json`.
    pub fn from_json(tokenizer_json: &[u8], config: Option<&Json>) -> Result<Self, TokenizeError> {
        let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| TokenizeError::Load(format!("tokenizer.json: {e}")))?;
        let empty = serde_json::Map::new();
        let config = match config {
            None => &empty,
            Some(Json::Object(m)) => m,
            Some(_) => {
                return Err(TokenizeError::Load(
                    "tokenizer_config.json is not a JSON object".into(),
                ))
            }
        };
        let mut specials = serde_json::Map::new();
        for (k, v) in config {
            if k.ends_with("_token") {
                // A string, or an AddedToken dict with its text in `content`.
                let text = match v {
                    Json::String(s) => Some(s.clone()),
                    Json::Object(o) => o.get("content").and_then(Json::as_str).map(String::from),
                    _ => None,
                };
                if let Some(t) = text {
                    specials.insert(k.clone(), Json::String(t));
                }
            }
        }
        let max_context = config
            .get("model_max_length")
            .and_then(Json::as_f64)
            .filter(|n| (1.0..UNSET_LENGTH).contains(n))
            .map(|n| n as usize);
        let env = match chat_template(config)? {
            Some(src) => Some(environment(src)?),
            None => None,
        };
        let structure: Json = serde_json::from_slice(tokenizer_json)
            .map_err(|e| TokenizeError::Load(format!("tokenizer.json: {e}")))?;
        let shape = Cuts::of(&structure)
            .zip(specials_around(&tokenizer))
            .map(|(cuts, around)| Shape {
                cuts,
                added: (structure["added_tokens"].as_array().into_iter().flatten())
                    .filter_map(|t| t["content"].as_str().map(String::from))
                    .collect(),
                around,
            });
        Ok(Self {
            tokenizer,
            env,
            specials,
            max_context,
            shape,
            cache: None,
        })
    }

    /// Keeps the tokens of up to `budget` tokens' worth of prompt chunks,
    /// so a prompt that starts with text seen before (a conversation's
    /// next turn) has only its new text encoded; the tokens are the same
    /// as without it. Off (every prompt encoded whole) for `budget` 0 and
    /// for a tokenizer whose structure does not show where its output can
    /// be cut (see `tokenize/prefix.rs`).
    pub fn with_prefix_cache(self, budget: usize) -> Self {
        self.with_prefix_cache_chunks(budget, prefix::CHUNK_BYTES)
    }

    /// [`Self::with_prefix_cache`] with chunks of at least `chunk` bytes.
    fn with_prefix_cache_chunks(mut self, budget: usize, chunk: usize) -> Self {
        self.cache = (self.shape.clone())
            .filter(|_| budget > 0)
            .map(|shape| PrefixCache::new(shape, budget, chunk));
        self
    }

    /// Tokens the prefix cache gave and tokens encoded through it so far;
    /// `None` when there is no cache.
    pub fn prefix_cache_stats(&self) -> Option<CacheStats> {
        self.cache.as_ref().map(PrefixCache::stats)
    }

    /// One token per byte, a ChatML chat template, `<|im_start|>` and
    /// `<|im_end|>` as special tokens: a tokenizer needing no files.
    pub fn builtin() -> Self {
        Self::from_json(
            builtin_tokenizer_json().as_bytes(),
            Some(&builtin_config_json()),
        )
        .expect("the built-in tokenizer is valid")
    }

    /// Writes the built-in tokenizer's `tokenizer.json` and
    /// `tokenizer_config.json` into `dir` (created if missing), for programs
    /// that take a model directory.
    pub fn write_builtin(dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("tokenizer.json"), builtin_tokenizer_json())?;
        std::fs::write(
            dir.join("tokenizer_config.json"),
            builtin_config_json().to_string(),
        )
    }

    /// The context length from `model_max_length`, if the config sets one.
    pub fn max_context(&self) -> Option<usize> {
        self.max_context
    }

    /// True when the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.env.is_some()
    }

    /// Encodes text (through the prefix cache when there is one).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let Some(cache) = self.cache.as_ref().filter(|c| c.worth(text.len())) else {
            return self.encode_whole(text, add_special_tokens);
        };
        let body = cache.encode(text, |s| self.encode_whole(s, false))?;
        if !add_special_tokens {
            return Ok(body);
        }
        let (before, after) = cache.around();
        let mut out = Vec::with_capacity(before.len() + body.len() + after.len());
        out.extend_from_slice(before);
        out.extend_from_slice(&body);
        out.extend_from_slice(after);
        Ok(out)
    }

    /// Encodes text in one call to the tokenizer.
    fn encode_whole(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Internal(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes token ids to text, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| TokenizeError::Internal(e.to_string()))
    }

    /// The token ids the engine computes for a request body: the
    /// completion's prompt (text encoded with special tokens, or token ids
    /// as given; of a batch of prompts, the first) or the rendered chat.
    /// `add_special_tokens` in the body overrides the endpoint's default.
    pub fn prompt_tokens(&self, ep: Endpoint, body: &Json) -> Result<Vec<u32>, TokenizeError> {
        match self.source(ep, body)? {
            Source::Text(s, add) => self.encode(&s, add),
            Source::Ids(ids) => Ok(ids),
        }
    }

    /// [`prompt_tokens`](Self::prompt_tokens) encoded only as far as
    /// wanted: through the prefix cache, `more(tokens so far)` is asked
    /// after the cached chunks and after each batch of encoded ones, and
    /// once it says no the rest of the text is left for
    /// [`finish`](Self::finish). A router asks for more while some worker
    /// holds every full block so far: past the first block none holds, the
    /// tokens change no worker's overlap. Without a cache (or for token
    /// ids, or a short text) every token is returned.
    pub fn prompt_tokens_until(
        &self,
        ep: Endpoint,
        body: &Json,
        more: impl FnMut(&[u32]) -> bool,
    ) -> Result<PromptTokens, TokenizeError> {
        let whole = |tokens| PromptTokens { tokens, rest: None };
        let (text, add) = match self.source(ep, body)? {
            Source::Ids(ids) => return Ok(whole(ids)),
            Source::Text(s, add) => (s, add),
        };
        let Some(cache) = (self.cache.as_ref()).filter(|c| c.worth_probing(text.len())) else {
            return Ok(whole(self.encode_whole(&text, add)?));
        };
        let (before, after) = if add {
            cache.around()
        } else {
            (&[][..], &[][..])
        };
        let mut tokens = before.to_vec();
        let at = cache.encode_until(
            &text,
            cache.start(),
            &mut tokens,
            |s| self.encode_whole(s, false),
            more,
            true,
        )?;
        match at {
            None => {
                tokens.extend_from_slice(after);
                Ok(whole(tokens))
            }
            Some(at) => {
                let body_tokens = tokens.len() - before.len();
                let fills = cache.keeps_from(&text, at);
                Ok(PromptTokens {
                    tokens,
                    rest: Some(Rest {
                        text: text.into_owned(),
                        at,
                        body_tokens,
                        after: after.to_vec(),
                        fills,
                    }),
                })
            }
        }
    }

    /// Completes `tokens` (a prompt's leading tokens, as
    /// [`prompt_tokens_until`](Self::prompt_tokens_until) gave them with
    /// `rest`) with the tokens of the rest: the prompt's every token. The
    /// new chunks are kept in the prefix cache.
    pub fn finish(&self, tokens: &mut Vec<u32>, rest: &Rest) -> Result<(), TokenizeError> {
        match self.cache.as_ref() {
            Some(cache) => {
                cache.encode_until(
                    &rest.text,
                    rest.at,
                    tokens,
                    |s| self.encode_whole(s, false),
                    |_| true,
                    false,
                )?;
            }
            // Only a cache leaves a rest; encoded plainly all the same.
            None => tokens.extend(self.encode_whole(&rest.text[rest.at.pos..], false)?),
        }
        tokens.extend_from_slice(&rest.after);
        Ok(())
    }

    /// The text to encode (and whether special tokens are added), or the
    /// token ids a completion request gives.
    fn source<'a>(&self, ep: Endpoint, body: &'a Json) -> Result<Source<'a>, TokenizeError> {
        let add_special = |default: bool| match body.get("add_special_tokens") {
            None | Some(Json::Null) => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(_) => Err(bad("\"add_special_tokens\" must be a boolean")),
        };
        match ep {
            Endpoint::Completions => {
                let add = add_special(true)?;
                let text = |s: &'a String| Ok(Source::Text(Cow::Borrowed(s.as_str()), add));
                match body.get("prompt") {
                    Some(Json::String(s)) => text(s),
                    Some(Json::Array(items)) => match items.first() {
                        None => Err(bad("\"prompt\" is empty")),
                        Some(Json::String(s)) => text(s),
                        Some(Json::Number(_)) => token_ids(items).map(Source::Ids),
                        Some(Json::Array(ids)) => token_ids(ids).map(Source::Ids),
                        Some(_) => Err(bad(PROMPT_SHAPE)),
                    },
                    None | Some(Json::Null) => Err(bad("\"prompt\" is required")),
                    Some(_) => Err(bad(PROMPT_SHAPE)),
                }
            }
            Endpoint::ChatCompletions => {
                let add = add_special(false)?;
                Ok(Source::Text(Cow::Owned(self.render_chat(body)?), add))
            }
        }
    }

    /// Renders a chat request's `messages` with the model's template, as
    /// `apply_chat_template` does: with `add_generation_prompt` (default
    /// true), `continue_final_message`, `tools`, `documents`, the special
    /// tokens and `chat_template_kwargs` in its context. Text parts of a
    /// message's content list are joined with newlines, as vLLM does for
    /// templates that expect a string.
    pub fn render_chat(&self, body: &Json) -> Result<String, TokenizeError> {
        let env = self
            .env
            .as_ref()
            .ok_or_else(|| bad("this model has no chat template: use /v1/completions instead"))?;
        let messages = match body.get("messages") {
            Some(Json::Array(m)) if !m.is_empty() => m,
            Some(Json::Array(_)) => return Err(bad("\"messages\" is empty")),
            None | Some(Json::Null) => return Err(bad("\"messages\" is required")),
            Some(_) => return Err(bad("\"messages\" must be an array")),
        };
        let messages = messages
            .iter()
            .map(flatten_message)
            .collect::<Result<Vec<_>, _>>()?;
        let mut ctx = self.specials.clone();
        if let Some(kw) = body.get("chat_template_kwargs") {
            match kw {
                Json::Object(m) => ctx.extend(m.iter().map(|(k, v)| (k.clone(), v.clone()))),
                Json::Null => {}
                _ => return Err(bad("\"chat_template_kwargs\" must be an object")),
            }
        }
        let flag = |name: &str, default: bool| match body.get(name) {
            None | Some(Json::Null) => Ok(default),
            Some(Json::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(&format!("{name:?} must be a boolean"))),
        };
        let cont = flag("continue_final_message", false)?;
        // A final message to continue gets no generation prompt after it.
        let gen = flag("add_generation_prompt", !cont)?;
        ctx.insert("messages".into(), Json::Array(messages));
        ctx.insert("add_generation_prompt".into(), Json::Bool(gen));
        for key in ["tools", "documents"] {
            if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
                ctx.insert(key.into(), v.clone());
            }
        }
        let tmpl = env
            .get_template(TEMPLATE)
            .map_err(|e| TokenizeError::Internal(e.to_string()))?;
        let mut text = tmpl
            .render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidOperation => bad(&format!("chat template: {}", detail(&e))),
                _ => bad(&format!(
                    "the chat template failed on this request: {}",
                    detail(&e)
                )),
            })?;
        if cont {
            // Drop what the template wrote after the final message's text,
            // so the model continues it.
            if let Some(last) = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .map(message_text)
                .filter(|t| !t.is_empty())
            {
                if let Some(at) = text.rfind(last.as_str()) {
                    text.truncate(at + last.len());
                }
            }
        }
        Ok(text)
    }
}

const PROMPT_SHAPE: &str =
    "\"prompt\" must be a string, an array of strings, an array of token ids or an array of such arrays";

/// The tokens adding special tokens puts before and after a text's own,
/// if the same for two unlike texts (a post-processor's fixed template).
fn specials_around(t: &tokenizers::Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    let ids = |text: &str, add: bool| (t.encode_fast(text, add).ok()).map(|e| e.get_ids().to_vec());
    let mut found = None;
    for probe in ["ab", "a b\ncd 12!"] {
        let (with, without) = (ids(probe, true)?, ids(probe, false)?);
        let n = without.len();
        let k = (0..=with.len().checked_sub(n)?).find(|&k| with[k..k + n] == without[..])?;
        let pair = (with[..k].to_vec(), with[k + n..].to_vec());
        match &found {
            None => found = Some(pair),
            Some(f) if *f == pair => {}
            Some(_) => return None,
        }
    }
    found
}

fn bad(msg: &str) -> TokenizeError {
    TokenizeError::BadRequest(msg.to_string())
}

fn detail(e: &minijinja::Error) -> String {
    e.detail()
        .map(String::from)
        .unwrap_or_else(|| e.to_string())
}

fn token_ids(items: &[Json]) -> Result<Vec<u32>, TokenizeError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("token ids must be integers from 0 to 4294967295"))
        })
        .collect()
}

/// A message with a content list of text parts turned into one string.
fn flatten_message(m: &Json) -> Result<Json, TokenizeError> {
    let Json::Object(map) = m else {
        return Err(bad("each message must be an object"));
    };
    match map.get("role") {
        Some(Json::String(_)) => {}
        _ => return Err(bad("each message needs a string \"role\"")),
    }
    let mut out = map.clone();
    if let Some(Json::Array(parts)) = map.get("content") {
        let mut texts = Vec::with_capacity(parts.len());
        for p in parts {
            match (p.get("type").and_then(Json::as_str), p.get("text")) {
                (Some("text"), Some(Json::String(t))) => texts.push(t.as_str()),
                (Some(other), _) if other != "text" => {
                    return Err(bad(&format!(
                        "content parts of type {other:?} are not supported: text only"
                    )))
                }
                _ => return Err(bad("a text content part needs a string \"text\"")),
            }
        }
        out.insert("content".into(), Json::String(texts.join("\n")));
    }
    Ok(Json::Object(out))
}

fn message_text(m: &Json) -> String {
    match flatten_message(m) {
        Ok(Json::Object(o)) => o
            .get("content")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

/// The chat template in a config: a string, or a list of named templates
/// (the one named "default").
fn chat_template(config: &serde_json::Map<String, Json>) -> Result<Option<String>, TokenizeError> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => Ok(list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(String::from)),
        Some(_) => Err(TokenizeError::Load(
            "chat_template must be a string or a list of named templates".into(),
        )),
    }
}

/// Jinja as `transformers` configures it for chat templates.
fn environment(source: String) -> Result<Environment<'static>, TokenizeError> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizeError::Load(e.to_string()))?,
    );
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", tojson);
    env.add_template_owned(TEMPLATE, source)
        .map_err(|e| TokenizeError::Load(format!("chat template: {}", detail(&e))))?;
    Ok(env)
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    py_json(&json, indent, sort.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Writes JSON as Python's `json.dumps` does: `", "` and `": "` between
/// items without an indent, newlines and `indent` spaces per level with one.
fn py_json(v: &Json, indent: Option<usize>, sort: bool, level: usize, out: &mut String) {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                py_json(item, indent, sort, level + 1, out);
            }
            newline(out, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, level + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                py_json(item, indent, sort, level + 1, out);
            }
            newline(out, level);
            out.push('}');
        }
        Json::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() < 1e16 {
                let _ = write!(out, "{f:.1}");
            } else {
                let _ = write!(out, "{f}");
            }
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The current UTC time in a `strftime` format (`%Y %m %d %H %M %S %b %B
/// %a %A %y %j %%`), for templates that print today's date.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(fmt, secs)
}

fn strftime(fmt: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let month = MONTHS[(m - 1) as usize];
    let day = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{:02}", tod / 3600),
            Some('M') => write!(out, "{:02}", tod / 60 % 60),
            Some('S') => write!(out, "{:02}", tod % 60),
            Some('B') => write!(out, "{month}"),
            Some('b') => write!(out, "{}", &month[..3]),
            Some('A') => write!(out, "{day}"),
            Some('a') => write!(out, "{}", &day[..3]),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// ChatML, as many models' templates write it.
const BUILTIN_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The `tokenizer_config.json` of [`ModelTokenizer::builtin`].
pub fn builtin_config_json() -> Json {
    serde_json::json!({
        "chat_template": BUILTIN_TEMPLATE,
        "eos_token": "<|im_end|>",
        "model_max_length": 32768,
    })
}

/// The `tokenizer.json` of [`ModelTokenizer::builtin`]: byte-level BPE with
/// no merges (every byte is one token, ids 0 to 255 in GPT-2's byte order),
/// then the two ChatML markers as special tokens 256 and 257.
pub fn builtin_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, Json> = byte_chars()
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), Json::from(i as u64)))
        .collect();
    let added = |id: u32, content: &str| {
        serde_json::json!({
            "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        })
    };
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(256, "<|im_start|>"), added(257, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
    .to_string()
}

/// GPT-2's reversible map of the 256 bytes to printable characters.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_is_one_token_per_byte() {
        let t = ModelTokenizer::builtin();
        let ids = t.encode("ab c\n\u{e9}", true).unwrap();
        // GPT-2 order: printable bytes keep their place among the 256.
        assert_eq!(ids.len(), "ab c\n\u{e9}".len());
        assert_eq!(t.decode(&ids).unwrap(), "ab c\n\u{e9}");
        let chat = t
            .prompt_tokens(
                Endpoint::ChatCompletions,
                &json!({"messages": [{"role": "user", "content": "hi"}]}),
            )
            .unwrap();
        assert_eq!(chat[0], 256, "<|im_start|> is one special token");
        assert_eq!(chat.iter().filter(|&&i| i == 257).count(), 1);
        assert_eq!(
            t.render_chat(&json!({"messages": [{"role": "user", "content": "hi"}]}))
                .unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn word_level_model_dir() {
        use test_support::tokenizer::{word_id, write_model_dir};
        let dir = tempfile::tempdir().unwrap();
        let t = ModelTokenizer::from_dir(&write_model_dir(dir.path())).unwrap();
        assert_eq!(t.max_context(), Some(4096));
        // Completions add <s> (id 1) through the post-processor.
        assert_eq!(
            t.prompt_tokens(Endpoint::Completions, &json!({"prompt": "t1 t2"}))
                .unwrap(),
            vec![1, word_id(1), word_id(2)]
        );
        // The chat template writes <s> itself; it is not added twice.
        let chat = t
            .prompt_tokens(
                Endpoint::ChatCompletions,
                &json!({"messages": [{"role": "user", "content": "t7 t8"}]}),
            )
            .unwrap();
        assert_eq!(chat, vec![1, 4, word_id(7), word_id(8), 5]);
        assert_eq!(t.decode(&chat).unwrap(), "[user] t7 t8 [assistant]");
    }

    #[test]
    fn load_takes_builtin_or_a_directory() {
        let builtin = ModelTokenizer::load(Path::new(BUILTIN)).unwrap();
        assert_eq!(builtin.encode("ab", false).unwrap().len(), 2);
        let dir = tempfile::tempdir().unwrap();
        let words = test_support::tokenizer::write_model_dir(dir.path());
        assert_eq!(
            ModelTokenizer::load(&words)
                .unwrap()
                .encode("t1 t2", false)
                .unwrap(),
            vec![
                test_support::tokenizer::word_id(1),
                test_support::tokenizer::word_id(2)
            ]
        );
        assert!(matches!(
            ModelTokenizer::load(&dir.path().join("absent")),
            Err(TokenizeError::Io { .. })
        ));
    }

    #[test]
    fn builtin_written_to_a_dir_loads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        ModelTokenizer::write_builtin(dir.path()).unwrap();
        let t = ModelTokenizer::from_dir(dir.path()).unwrap();
        let body = json!({"messages": [{"role": "user", "content": "hello"}]});
        assert_eq!(
            t.prompt_tokens(Endpoint::ChatCompletions, &body).unwrap(),
            ModelTokenizer::builtin()
                .prompt_tokens(Endpoint::ChatCompletions, &body)
                .unwrap()
        );
        assert_eq!(t.max_context(), Some(32768));
    }

    #[test]
    fn completion_prompt_forms() {
        let t = ModelTokenizer::builtin();
        let ep = Endpoint::Completions;
        assert_eq!(
            t.prompt_tokens(ep, &json!({"prompt": "xy"})).unwrap().len(),
            2
        );
        assert_eq!(
            t.prompt_tokens(ep, &json!({"prompt": [5, 6, 7]})).unwrap(),
            vec![5, 6, 7]
        );
        assert_eq!(
            t.prompt_tokens(ep, &json!({"prompt": [[9, 8], [1]]}))
                .unwrap(),
            vec![9, 8]
        );
        assert_eq!(
            t.prompt_tokens(ep, &json!({"prompt": ["abc", "d"]}))
                .unwrap()
                .len(),
            3
        );
        for body in [
            json!({}),
            json!({"prompt": 3}),
            json!({"prompt": []}),
            json!({"prompt": [-1]}),
            json!({"prompt": [1.5]}),
            json!({"prompt": [5_000_000_000u64]}),
            json!({"prompt": [{}]}),
            json!({"prompt": "x", "add_special_tokens": "yes"}),
        ] {
            let e = t.prompt_tokens(ep, &body).unwrap_err();
            assert!(e.is_client_error(), "{body}: {e}");
        }
    }

    #[test]
    fn chat_errors_are_the_clients() {
        let t = ModelTokenizer::builtin();
        let ep = Endpoint::ChatCompletions;
        for body in [
            json!({}),
            json!({"messages": []}),
            json!({"messages": "hi"}),
            json!({"messages": [1]}),
            json!({"messages": [{"content": "x"}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1}),
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []}),
        ] {
            let e = t.prompt_tokens(ep, &body).unwrap_err();
            assert!(e.is_client_error(), "{body}: {e}");
        }
        let cfg = json!({"chat_template": "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"});
        let t = ModelTokenizer::from_json(builtin_tokenizer_json().as_bytes(), Some(&cfg)).unwrap();
        let e = t
            .render_chat(&json!({"messages": [{"role": "system", "content": "s"}]}))
            .unwrap_err();
        assert!(
            e.is_client_error() && e.to_string().contains("first must be user"),
            "{e}"
        );
        let none = ModelTokenizer::from_json(builtin_tokenizer_json().as_bytes(), None).unwrap();
        assert!(none
            .prompt_tokens(ep, &json!({"messages": [{"role": "user", "content": "x"}]}))
            .unwrap_err()
            .is_client_error());
    }

    #[test]
    fn template_context_as_transformers_gives_it() {
        let cfg = json!({
            "bos_token": {"content": "<s>", "special": true},
            "eos_token": "</s>",
            "model_max_length": 4096,
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ bos_token }}\n{% for m in messages %}\n  [{{ m.role | upper }}] {{ m.content.strip() }}{% if not loop.last %}|{% endif %}\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}>{% endif %}{% if flag %}!{% endif %}"}
            ]
        });
        let t = ModelTokenizer::from_json(builtin_tokenizer_json().as_bytes(), Some(&cfg)).unwrap();
        assert_eq!(t.max_context(), Some(4096));
        let body = json!({
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": " a"}, {"type": "text", "text": "b "}]},
                {"role": "assistant", "content": "c"}
            ],
            "tools": [{"name": "f", "x": [1, 2.0, "\u{e9}<"]}],
            "chat_template_kwargs": {"flag": true}
        });
        // trim_blocks drops the newline after a block tag (the indentation
        // before text stays); content parts join with a newline; tojson
        // writes Python's separators and leaves `<` and non-ASCII alone.
        assert_eq!(
            t.render_chat(&body).unwrap(),
            "<s>\n  [USER] a\nb|  [ASSISTANT] c[{\"name\": \"f\", \"x\": [1, 2.0, \"\u{e9}<\"]}]>!"
        );
        let mut no_gen = body.clone();
        no_gen["add_generation_prompt"] = json!(false);
        assert!(t.render_chat(&no_gen).unwrap().ends_with("}]!"));
    }

    #[test]
    fn continue_final_message_stops_after_its_text() {
        let t = ModelTokenizer::builtin();
        let body = json!({
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}],
            "continue_final_message": true
        });
        assert!(t
            .render_chat(&body)
            .unwrap()
            .ends_with("assistant\nThe answer is"));
    }

    #[test]
    fn python_json() {
        let v = json!({"b": [1, {"c": null}], "a": "x\"\n", "d": {}, "e": []});
        let mut s = String::new();
        py_json(&v, None, true, 0, &mut s);
        assert_eq!(
            s,
            r#"{"a": "x\"\n", "b": [1, {"c": null}], "d": {}, "e": []}"#
        );
        let mut s = String::new();
        py_json(&json!({"a": [1, 2]}), Some(2), false, 0, &mut s);
        assert_eq!(s, "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
    }

    #[test]
    fn dates() {
        // 2026-12-06 11:45:21 UTC, a Sunday, day 340.
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a %A %b %B %y %j %% %q", 1_796_557_521),
            "2026-12-06 11:45:21 Sun Sunday Dec December 26 340 % %q"
        );
        // 2024-02-29 (a leap day) 00:00:00 UTC, a Thursday.
        assert_eq!(
            strftime("%d %b %Y %a %j", 1_709_164_800),
            "29 Feb 2024 Thu 060"
        );
    }

    #[test]
    fn bad_files_are_load_errors() {
        assert!(matches!(
            ModelTokenizer::from_json(b"{", None),
            Err(TokenizeError::Load(_))
        ));
        let cfg = json!({"chat_template": "{% for %}"});
        assert!(matches!(
            ModelTokenizer::from_json(builtin_tokenizer_json().as_bytes(), Some(&cfg)),
            Err(TokenizeError::Load(_))
        ));
        let dir = std::env::temp_dir().join("kvrouter-no-such-model-dir");
        assert!(matches!(
            ModelTokenizer::from_dir(&dir),
            Err(TokenizeError::Io { .. })
        ));
    }
}

//! The gateway's tokenization of client requests under coverage-guided
//! fuzzing: any request body, under the built-in ChatML template or one
//! that uses what Hugging Face templates use (tools as JSON, string
//! methods, loop variables, `raise_exception`), gives prompt tokens or a
//! typed error for both OpenAI endpoints, never a panic. Tokens from a
//! completion's token-id prompt are those ids. (Templates come from the
//! operator's model files, not from clients: they are not fuzzed.)
#![no_main]

use std::sync::OnceLock;

use kvrouter::tokenize::{builtin_tokenizer_json, Endpoint, ModelTokenizer, TokenizeError};
use libfuzzer_sys::fuzz_target;

fn builtin() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(ModelTokenizer::builtin)
}

const RICH: &str = "{{ bos_token }}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}\
{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}\
{{ raise_exception('system must come first') }}{% endif %}\
[{{ m.role | upper }}] {{ (m.content or '') | string | trim }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\
{% if not loop.last %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}";

fn rich() -> &'static ModelTokenizer {
    static TOK: OnceLock<ModelTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let config = serde_json::json!({"chat_template": RICH, "bos_token": "<s>"});
        ModelTokenizer::from_json(builtin_tokenizer_json().as_bytes(), Some(&config))
            .expect("the template compiles")
    })
}

fn check(tok: &ModelTokenizer, body: &serde_json::Value) {
    for ep in [Endpoint::Completions, Endpoint::ChatCompletions] {
        match tok.prompt_tokens(ep, body) {
            Ok(tokens) => {
                if ep == Endpoint::Completions {
                    if let Some(ids) = body["prompt"].as_array() {
                        if ids.first().is_some_and(|v| v.is_number()) {
                            let want: Vec<u32> =
                                ids.iter().map(|v| v.as_u64().unwrap() as u32).collect();
                            assert_eq!(tokens, want);
                        }
                    }
                }
            }
            Err(TokenizeError::BadRequest(_)) | Err(TokenizeError::Internal(_)) => {}
            Err(e) => panic!("a request gave a load error: {e}"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    check(if which & 1 == 0 { builtin() } else { rich() }, &body);
});

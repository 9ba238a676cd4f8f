//! Time to tokenize a prompt as the gateway does: the built-in byte-level
//! tokenizer and the word-level test model, completions and chats, and a
//! long prompt whose text the prefix cache has seen.
//!
//! `cargo run --release -p kvrouter --example tokenize`
use std::time::Instant;

use kvrouter::tokenize::{Endpoint, ModelTokenizer};
use serde_json::json;

fn time(name: &str, tok: &ModelTokenizer, ep: Endpoint, body: &serde_json::Value) {
    let n = tok.prompt_tokens(ep, body).expect("tokenizes").len();
    let reps = (2_000_000 / n.max(1)).clamp(5, 20_000);
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(tok.prompt_tokens(ep, body).expect("tokenizes"));
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    println!(
        "{name:<40} {n:>7} tokens {us:>10.1} µs  {:>6.0} ns/token",
        us * 1e3 / n as f64
    );
}

fn main() {
    let text = |n: usize| -> String {
        (0..n)
            .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
            .collect()
    };
    let words = |n: usize| -> String {
        (0..n)
            .map(|i| format!("t{}", i % 4000))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let builtin = ModelTokenizer::builtin();
    for n in [1_000, 12_000] {
        time(
            &format!("builtin completion, {n} bytes"),
            &builtin,
            Endpoint::Completions,
            &json!({"prompt": text(n)}),
        );
        time(
            &format!("builtin chat, {n} bytes"),
            &builtin,
            Endpoint::ChatCompletions,
            &json!({"messages": [{"role": "user", "content": text(n)}]}),
        );
    }
    // A conversation's next turn: its history was tokenized before (the
    // prefix cache holds its chunks); only the text after the last cut is
    // encoded.
    let cached = ModelTokenizer::builtin().with_prefix_cache(4 << 20);
    for n in [12_000, 85_000] {
        let history = text(n);
        cached.encode(&history, true).expect("tokenizes");
        time(
            &format!("builtin completion, {n} bytes, cached"),
            &cached,
            Endpoint::Completions,
            &json!({"prompt": format!("{history}{}", text(500))}),
        );
    }
    let dir = std::env::temp_dir().join(format!("kvrouter-tokenize-{}", std::process::id()));
    let words_model = ModelTokenizer::from_dir(&test_support::tokenizer::write_model_dir(&dir))
        .expect("the test model loads");
    for n in [1_000, 12_000] {
        time(
            &format!("word-level completion, {n} words"),
            &words_model,
            Endpoint::Completions,
            &json!({"prompt": words(n)}),
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

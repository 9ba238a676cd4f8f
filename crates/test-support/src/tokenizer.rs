//! A small word-level model directory written in code, for tests that
//! tokenize as an engine would without downloading a model.
use std::path::{Path, PathBuf};

/// Words `t0`, `t1`, ... in the vocabulary.
pub const WORDS: usize = 5000;

/// Token id of the word `t{n}`.
pub fn word_id(n: usize) -> u32 {
    (FIRST_WORD + n) as u32
}

/// Ids before the words: `<unk>`, `<s>`, `</s>`, then the role markers.
const SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];
const ROLES: [&str; 4] = ["[system]", "[user]", "[assistant]", "[tool]"];
const FIRST_WORD: usize = SPECIALS.len() + ROLES.len();

/// The chat template: BOS, then `[role] content` per message.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";

/// Writes `tokenizer.json` (word level, split on whitespace, `<s>` added in
/// front when special tokens are added) and `tokenizer_config.json` (the
/// chat template, `<s>`/`</s>`, a 4096-token context) into `dir`, and
/// returns `dir`.
pub fn write_model_dir(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the model dir");
    let mut vocab = String::from("{");
    let names = SPECIALS
        .iter()
        .chain(ROLES.iter())
        .map(|s| s.to_string())
        .chain((0..WORDS).map(|n| format!("t{n}")));
    for (i, w) in names.enumerate() {
        if i > 0 {
            vocab.push(',');
        }
        vocab.push_str(&format!("\"{w}\":{i}"));
    }
    vocab.push('}');
    let added: Vec<String> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                r#"{{"id":{i},"content":"{s}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
            )
        })
        .collect();
    let tokenizer = format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{}],
"normalizer":null,"pre_tokenizer":{{"type":"WhitespaceSplit"}},
"post_processor":{{"type":"TemplateProcessing","single":[{{"SpecialToken":{{"id":"<s>","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}}],
 "pair":[{{"SpecialToken":{{"id":"<s>","type_id":0}}}},{{"Sequence":{{"id":"A","type_id":0}}}},{{"Sequence":{{"id":"B","type_id":1}}}}],
 "special_tokens":{{"<s>":{{"id":"<s>","ids":[1],"tokens":["<s>"]}}}}}},
"decoder":null,
"model":{{"type":"WordLevel","vocab":{vocab},"unk_token":"<unk>"}}}}"#,
        added.join(",")
    );
    std::fs::write(dir.join("tokenizer.json"), tokenizer).expect("write tokenizer.json");
    let config = serde_like_config();
    std::fs::write(dir.join("tokenizer_config.json"), config).expect("write tokenizer_config.json");
    dir.to_path_buf()
}

fn serde_like_config() -> String {
    let template = CHAT_TEMPLATE.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"{{"bos_token":"<s>","eos_token":{{"content":"</s>","special":true}},"unk_token":"<unk>","model_max_length":4096,"chat_template":"{template}"}}"#
    )
}

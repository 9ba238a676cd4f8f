//! Tokens of text seen before, reused: a conversation's next turn sends
//! its whole history again, and tokenizing it costs the gateway far more
//! than routing it (about 0.15 µs a token byte-level).
//!
//! The text is cut into chunks at places where the tokenizer's output can
//! be cut ([`Cuts`]): encoding the two sides apart gives the tokens of the
//! whole. A chunk ends at the first such place at least [`CHUNK_BYTES`]
//! past its start, so the places depend on the text alone and two prompts
//! sharing a prefix cut it alike. Each chunk's tokens are kept under a
//! hash chained over every chunk before it (with a per-process seed), so a
//! hit means the whole prefix up to that chunk was seen. A prompt's leading
//! chunks come from the cache; the rest is encoded chunk by chunk and kept.
//! A caller may stop after the cached chunks or after any batch of new ones
//! and go on later from where it stopped (`encode_until`, [`Resume`]).
//!
//! Which places are cuts is read from `tokenizer.json`'s structure; a
//! tokenizer whose structure is not one of the shapes below gets no cache
//! (every prompt encoded whole), never a guess.
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value as Json;

/// A chunk's least length, bytes.
pub(crate) const CHUNK_BYTES: usize = 1024;

/// The split patterns of byte-level BPE tokenizers (Llama 3, Qwen 2) that
/// only ever start a pre-token with a space: a pre-token never holds a
/// space after its first character, nor does one end in the middle of a
/// run of letters, digits or punctuation.
const SPLIT_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Where a tokenizer's output may be cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cuts {
    /// At any character boundary no added token spans: byte-level BPE with
    /// no merges and no split pattern, one token per byte.
    Anywhere,
    /// Before a space between two printable ASCII characters: byte-level
    /// BPE behind GPT-2's split pattern or one of [`SPLIT_PATTERNS`], no
    /// added token holding whitespace. The space starts a pre-token there,
    /// and BPE merges only within a pre-token.
    BeforeSpace,
}

impl Cuts {
    /// What `tokenizer.json` allows, or `None`. Required of every shape:
    /// no normalizer (it may rewrite across a cut), no truncation or
    /// padding (they act on the whole text), a BPE model without dropout,
    /// no prefix space added to the text, added tokens matched as written
    /// (no `lstrip`, `rstrip` or `single_word`).
    pub(crate) fn of(json: &Json) -> Option<Cuts> {
        if ["normalizer", "truncation", "padding"]
            .iter()
            .any(|k| !json[k].is_null())
        {
            return None;
        }
        let model = &json["model"];
        if model["type"] != "BPE" || !model["dropout"].is_null() {
            return None;
        }
        let added = json["added_tokens"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let as_written = added.iter().all(|t| {
            [
                t["lstrip"].as_bool(),
                t["rstrip"].as_bool(),
                t["single_word"].as_bool(),
            ]
            .iter()
            .all(|f| *f != Some(true))
        });
        if !as_written {
            return None;
        }
        let byte_level = |p: &Json, regex: bool| {
            p["type"] == "ByteLevel"
                && p["add_prefix_space"].as_bool() != Some(true)
                && p["use_regex"].as_bool().unwrap_or(true) == regex
        };
        let pre = &json["pre_tokenizer"];
        let no_merges = model["merges"].as_array().is_some_and(Vec::is_empty);
        let cuts = if byte_level(pre, false) && no_merges {
            Cuts::Anywhere
        } else if byte_level(pre, true) {
            Cuts::BeforeSpace
        } else if pre["type"] == "Sequence" {
            let parts = pre["pretokenizers"].as_array()?;
            let [split, bl] = parts.as_slice() else {
                return None;
            };
            let known = split["type"] == "Split"
                && split["behavior"] == "Isolated"
                && split["invert"].as_bool() != Some(true)
                && split["pattern"]["Regex"]
                    .as_str()
                    .is_some_and(|r| SPLIT_PATTERNS.contains(&r));
            if !known || !byte_level(bl, false) {
                return None;
            }
            Cuts::BeforeSpace
        } else {
            return None;
        };
        let spaced = added.iter().any(|t| {
            t["content"]
                .as_str()
                .is_none_or(|c| c.chars().any(char::is_whitespace))
        });
        if cuts == Cuts::BeforeSpace && spaced {
            return None;
        }
        Some(cuts)
    }
}

/// What a tokenizer's structure lets a cache rely on.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// Where its output may be cut.
    pub(crate) cuts: Cuts,
    /// Added tokens' texts: [`Cuts::Anywhere`] cuts none of them.
    pub(crate) added: Vec<String>,
    /// What adding special tokens puts before and after a text's tokens
    /// (the same for every text).
    pub(crate) around: (Vec<u32>, Vec<u32>),
}

/// Tokens reused this run, and tokens encoded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Tokens taken from the cache.
    pub hit_tokens: u64,
    /// Tokens encoded (the rest of each cached-path prompt).
    pub encoded_tokens: u64,
}

/// One generation's chunks by chained hash.
type Chunks = HashMap<u64, Arc<[u32]>>;

/// Chunks' tokens by chained hash, in two generations: new chunks and hits
/// go to `cur`; when it holds half the budget it becomes `old` (the
/// previous `old` is handed back to be dropped). A chunk unused for two generations is gone,
/// and at most the budget (plus a chunk) is held.
#[derive(Default)]
struct Generations {
    cur: Chunks,
    cur_tokens: usize,
    old: Chunks,
}

impl Generations {
    /// The chunk under `h`, moved into the current generation if it was
    /// in the old one; and a retired generation, if that move filled the
    /// current one (see [`Generations::put`]).
    fn get(&mut self, h: u64, budget: usize) -> (Option<Arc<[u32]>>, Option<Chunks>) {
        if let Some(t) = self.cur.get(&h) {
            return (Some(Arc::clone(t)), None);
        }
        let Some(t) = self.old.remove(&h) else {
            return (None, None);
        };
        let retired = self.put(h, Arc::clone(&t), budget);
        (Some(t), retired)
    }

    /// Keeps `t` under `h`. When the current generation passes half the
    /// budget it becomes the old one, and the old one is returned for the
    /// caller to drop after letting go of the lock: thousands of chunks
    /// freed while a request waits for the lock would be its latency.
    #[must_use]
    fn put(&mut self, h: u64, t: Arc<[u32]>, budget: usize) -> Option<Chunks> {
        self.cur_tokens += t.len();
        if let Some(prev) = self.cur.insert(h, t) {
            self.cur_tokens -= prev.len();
        }
        if self.cur_tokens > budget / 2 {
            self.cur_tokens = 0;
            let cur = std::mem::take(&mut self.cur);
            return Some(std::mem::replace(&mut self.old, cur));
        }
        None
    }

    #[cfg(test)]
    fn tokens(&self) -> usize {
        self.cur
            .values()
            .chain(self.old.values())
            .map(|t| t.len())
            .sum()
    }
}

/// Where encoding a text stopped: a cut's byte offset and the chained
/// hash of the text before it; and a probe's text past it whose tokens
/// the caller's tokens end with (bytes, tokens), dropped and encoded again
/// with their chunk when encoding goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    pub(crate) pos: usize,
    h: u64,
    pub(crate) probe: (usize, usize),
}

/// The cache of one tokenizer.
pub(crate) struct PrefixCache {
    shape: Shape,
    chunk: usize,
    budget: usize,
    seed: u64,
    map: Mutex<Generations>,
    hit_tokens: AtomicU64,
    encoded_tokens: AtomicU64,
}

impl PrefixCache {
    /// A cache of at most `budget` tokens, chunks of at least `chunk` bytes.
    pub(crate) fn new(mut shape: Shape, budget: usize, chunk: usize) -> Self {
        shape.added.retain(|a| !a.is_empty());
        Self {
            shape,
            chunk: chunk.max(1),
            budget,
            seed: std::collections::hash_map::RandomState::new().hash_one(0x9e37_79b9_u64),
            map: Mutex::new(Generations::default()),
            hit_tokens: AtomicU64::new(0),
            encoded_tokens: AtomicU64::new(0),
        }
    }

    /// Whether a text this long goes through the cache (shorter ones hold
    /// no chunk worth keeping).
    pub(crate) fn worth(&self, len: usize) -> bool {
        len > self.chunk
    }

    /// Whether a text this long can stop after a probe (see
    /// [`encode_until`](Self::encode_until)): one past a quarter chunk.
    pub(crate) fn worth_probing(&self, len: usize) -> bool {
        len > self.chunk.div_ceil(4)
    }

    /// Whether going on from `at` would keep a chunk: a fill from there is
    /// for the cache alone.
    pub(crate) fn keeps_from(&self, text: &str, at: Resume) -> bool {
        self.next_cut(text, at.pos).is_some()
    }

    /// Where encoding a text starts.
    pub(crate) fn start(&self) -> Resume {
        Resume {
            pos: 0,
            h: self.seed,
            probe: (0, 0),
        }
    }

    /// The tokens of `text`, no special tokens added: cached chunks, then
    /// `encode` (which must encode without special tokens) for the rest,
    /// new chunks kept.
    pub(crate) fn encode<E>(
        &self,
        text: &str,
        encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        let mut out = Vec::with_capacity(text.len() / 2);
        self.encode_until(text, self.start(), &mut out, encode, |_| true, false)?;
        Ok(out)
    }

    /// Appends the tokens of `text[at..]` to `out` as [`encode`] does,
    /// but asks `more(out)` after the cached chunks and after each batch
    /// of encoded ones (1, 2, 4, ... chunks) whether the rest is wanted;
    /// when it is not, returns where it stopped (a cut), from which a
    /// later call goes on. `None`: the whole text is in `out`.
    ///
    /// With `probe`, the first new chunk (or the text's last piece, not a
    /// chunk) is asked about after its first quarter chunk (up to a cut):
    /// one routing question rarely needs a whole chunk's tokens, and a
    /// prompt no engine holds is then routed on a few hundred bytes
    /// encoded. Stopping there leaves those tokens in `out` and says so in
    /// the [`Resume`]; going on from it drops them from `out` first and
    /// encodes the chunk whole.
    ///
    /// [`encode`]: Self::encode
    pub(crate) fn encode_until<E>(
        &self,
        text: &str,
        at: Resume,
        out: &mut Vec<u32>,
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
        mut more: impl FnMut(&[u32]) -> bool,
        probe: bool,
    ) -> Result<Option<Resume>, E> {
        let Resume { mut pos, mut h, .. } = at;
        out.truncate(out.len().saturating_sub(at.probe.1));
        let mut hit = 0;
        let mut retired = Vec::new();
        {
            let mut map = self.map.lock();
            while let Some(end) = self.next_cut(text, pos) {
                let next = xxhash_rust::xxh3::xxh3_64_with_seed(&text.as_bytes()[pos..end], h);
                let (found, gone) = map.get(next, self.budget);
                retired.extend(gone);
                let Some(t) = found else {
                    break;
                };
                out.extend_from_slice(&t);
                hit += t.len();
                h = next;
                pos = end;
            }
        }
        drop(retired);
        self.hit_tokens.fetch_add(hit as u64, Relaxed);
        let stop = |pos, h| Resume {
            pos,
            h,
            probe: (0, 0),
        };
        if !more(out) {
            return Ok(Some(stop(pos, h)));
        }
        // A probe's cut and tokens (already in `out`): the head of the
        // first new chunk, which the loop below finishes.
        let mut head = None;
        if let Some(cut) = self.probe_cut(text, pos).filter(|_| probe) {
            let t = encode(&text[pos..cut])?;
            out.extend_from_slice(&t);
            if !more(out) {
                // Counted as encoded with their chunk, when it is.
                let mut r = stop(pos, h);
                r.probe = (cut - pos, t.len());
                return Ok(Some(r));
            }
            head = Some((cut, t));
        }
        let mut batch = 1;
        loop {
            let mut fresh = Vec::new();
            let mut encoded = 0;
            let mut finished = false;
            while fresh.len() < batch {
                let (from, mut t) = head.take().unwrap_or((pos, Vec::new()));
                let next = self.next_cut(text, pos);
                let tail = encode(&text[from..next.unwrap_or(text.len())])?;
                out.extend_from_slice(&tail);
                let t = if t.is_empty() {
                    tail
                } else {
                    t.extend(tail);
                    t
                };
                encoded += t.len();
                let Some(end) = next else {
                    // The last piece: no chunk to keep.
                    finished = true;
                    break;
                };
                h = xxhash_rust::xxh3::xxh3_64_with_seed(&text.as_bytes()[pos..end], h);
                fresh.push((h, Arc::<[u32]>::from(t)));
                pos = end;
            }
            self.keep(fresh);
            self.encoded_tokens.fetch_add(encoded as u64, Relaxed);
            if finished {
                return Ok(None);
            }
            batch *= 2;
            if !more(out) {
                return Ok(Some(stop(pos, h)));
            }
        }
    }

    /// Keeps new chunks; a generation they retire is freed after the lock.
    fn keep(&self, fresh: Vec<(u64, Arc<[u32]>)>) {
        if fresh.is_empty() {
            return;
        }
        let mut retired = Vec::new();
        let mut map = self.map.lock();
        for (h, t) in fresh {
            retired.extend(map.put(h, t, self.budget));
        }
        drop(map);
        drop(retired);
    }

    /// A cut about a quarter of a chunk on from `from` (the first at least
    /// that far), if one is before the end of the chunk at `from` (the
    /// text's end if there is no chunk).
    fn probe_cut(&self, text: &str, from: usize) -> Option<usize> {
        let end = self.next_cut(text, from).unwrap_or(text.len());
        let cut = self.cut_from(text, from + self.chunk.div_ceil(4))?;
        (cut < end).then_some(cut)
    }

    /// What adding special tokens puts before and after a text's tokens.
    pub(crate) fn around(&self) -> (&[u32], &[u32]) {
        (&self.shape.around.0, &self.shape.around.1)
    }

    /// Tokens reused and encoded so far.
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hit_tokens: self.hit_tokens.load(Relaxed),
            encoded_tokens: self.encoded_tokens.load(Relaxed),
        }
    }

    /// Tokens held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.map.lock().tokens()
    }

    /// The end of the chunk starting at `from`: the first cut at least
    /// `chunk` bytes on, strictly inside the text; `None` if there is none.
    fn next_cut(&self, text: &str, from: usize) -> Option<usize> {
        self.cut_from(text, from + self.chunk)
    }

    /// The first cut at or after `i`, strictly inside the text.
    fn cut_from(&self, text: &str, mut i: usize) -> Option<usize> {
        let b = text.as_bytes();
        match self.shape.cuts {
            Cuts::BeforeSpace => loop {
                let j = i + b.get(i..)?.iter().position(|&c| c == b' ')?;
                let printable = |k: usize| b.get(k).is_some_and(|c| c.is_ascii_graphic());
                if j > 0 && printable(j - 1) && printable(j + 1) {
                    return Some(j);
                }
                i = j + 1;
            },
            Cuts::Anywhere => loop {
                if i >= b.len() {
                    return None;
                }
                if text.is_char_boundary(i) && !self.spans_added(b, i) {
                    return Some(i);
                }
                i += 1;
            },
        }
    }

    /// Whether an occurrence of an added token starts before `i` and ends
    /// after it.
    fn spans_added(&self, b: &[u8], i: usize) -> bool {
        self.shape.added.iter().any(|a| {
            let a = a.as_bytes();
            let lo = (i + 1).saturating_sub(a.len());
            (lo..i).any(|s| b.get(s..s + a.len()) == Some(a))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::{builtin_tokenizer_json, byte_chars, Endpoint, ModelTokenizer};
    use proptest::prelude::*;
    use serde_json::json;

    /// A byte-level BPE tokenizer with a few merges (within words, across
    /// a leading space, of digits), ChatML markers and `<s>` as added
    /// tokens, and a template putting `<s>` first: `pre` is its
    /// pre-tokenizer.
    fn bpe_json(pre: Json) -> Json {
        let chars = byte_chars();
        let sp = chars[usize::from(b' ')].to_string();
        let mut vocab: serde_json::Map<String, Json> = chars
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), json!(i)))
            .collect();
        let merged = [
            ("a", "b"),
            ("ab", "c"),
            ("t", "h"),
            ("th", "e"),
            (&sp, "the"),
            ("1", "2"),
            ("'", "s"),
            (&sp, "a"),
        ];
        let mut merges = Vec::new();
        for (i, (x, y)) in merged.iter().enumerate() {
            vocab.insert(format!("{x}{y}"), json!(258 + i));
            merges.push(json!(format!("{x} {y}")));
        }
        let added = |id: u32, content: &str| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added(256, "<|im_start|>"), added(257, "<|im_end|>"), added(300, "<s>")],
            "normalizer": null,
            "pre_tokenizer": pre,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": merges}
        })
    }

    fn byte_level(regex: bool) -> Json {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex})
    }

    /// GPT-2's shape: the split pattern inside the byte-level step.
    fn gpt2() -> Json {
        bpe_json(byte_level(true))
    }

    /// Llama 3's shape: a split pattern, then the byte-level step.
    fn llama3(pattern: &str) -> Json {
        bpe_json(json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false)
        ]}))
    }

    fn load(j: &Json, chunk: usize) -> ModelTokenizer {
        ModelTokenizer::from_json(j.to_string().as_bytes(), None)
            .expect("loads")
            .with_prefix_cache_chunks(1 << 20, chunk)
    }

    #[test]
    fn which_tokenizers_can_be_cut() {
        let builtin: Json = serde_json::from_str(&builtin_tokenizer_json()).unwrap();
        assert_eq!(Cuts::of(&builtin), Some(Cuts::Anywhere));
        assert_eq!(Cuts::of(&gpt2()), Some(Cuts::BeforeSpace));
        for p in SPLIT_PATTERNS {
            assert_eq!(Cuts::of(&llama3(p)), Some(Cuts::BeforeSpace));
        }
        // Merges without a split pattern: a whole text is one word.
        assert_eq!(Cuts::of(&bpe_json(byte_level(false))), None);
        assert_eq!(Cuts::of(&llama3(r"\w+|\s+")), None);
        let mut j = gpt2();
        j["normalizer"] = json!({"type": "NFC"});
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["pre_tokenizer"]["add_prefix_space"] = json!(true);
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false});
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["added_tokens"][0]["content"] = json!("<| im |>");
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["added_tokens"][0]["lstrip"] = json!(true);
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["model"]["dropout"] = json!(0.1);
        assert_eq!(Cuts::of(&j), None);
        let mut j = gpt2();
        j["truncation"] = json!({"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0});
        assert_eq!(Cuts::of(&j), None);
        // And such a tokenizer encodes whole, with no cache.
        assert!(load(&bpe_json(byte_level(false)), 8)
            .prefix_cache_stats()
            .is_none());
        assert!(load(&gpt2(), 8).prefix_cache_stats().is_some());
        assert!(ModelTokenizer::builtin()
            .with_prefix_cache(0)
            .prefix_cache_stats()
            .is_none());
    }

    #[test]
    fn a_template_around_the_text_is_kept() {
        let t = load(&gpt2(), 8);
        assert_eq!(t.shape.as_ref().unwrap().around, (vec![300], vec![]));
        let text = "the cat 12 the hat's abc the end ".repeat(4);
        let plain = t.encode_whole(&text, true).unwrap();
        assert_eq!(plain[0], 300);
        assert_eq!(t.encode(&text, true).unwrap(), plain);
        assert_eq!(t.encode(&text, true).unwrap(), plain);
    }

    #[test]
    fn a_repeated_prefix_is_not_encoded_again() {
        let t = load(&gpt2(), 16);
        let turn1 = "the cat sat on the mat, 12 times. ".repeat(20);
        let turn2 = format!("{turn1}the dog 's answer: abc abc. ");
        assert_eq!(
            t.encode(&turn1, true).unwrap(),
            t.encode_whole(&turn1, true).unwrap()
        );
        let s1 = t.prefix_cache_stats().unwrap();
        assert_eq!(s1.hit_tokens, 0);
        assert_eq!(
            t.encode(&turn2, true).unwrap(),
            t.encode_whole(&turn2, true).unwrap()
        );
        let s2 = t.prefix_cache_stats().unwrap();
        let whole = t.encode_whole(&turn2, false).unwrap().len() as u64;
        assert_eq!(s2.hit_tokens + s2.encoded_tokens - s1.encoded_tokens, whole);
        // All of turn 1 but its last chunk or so came from the cache.
        assert!(s2.hit_tokens * 10 > whole * 8, "{s2:?} of {whole}");
    }

    #[test]
    fn the_budget_bounds_what_is_held() {
        let t = ModelTokenizer::builtin().with_prefix_cache_chunks(1000, 64);
        for i in 0..200 {
            let text = format!("{i:04}").repeat(100);
            assert_eq!(
                t.encode(&text, false).unwrap(),
                t.encode_whole(&text, false).unwrap()
            );
            let held = t.cache.as_ref().unwrap().held();
            assert!(held <= 1000 + 64 + 4, "{held} tokens held");
        }
    }

    /// Pieces that exercise the cuts: spaces alone and doubled, newlines,
    /// words the merges join, digits, contractions, punctuation,
    /// non-ASCII, added tokens.
    const PIECES: [&str; 22] = [
        "a",
        "b",
        "c",
        "t",
        "h",
        "e",
        " ",
        "  ",
        "\n",
        " \n",
        "1",
        "2",
        "'s",
        "!",
        ".",
        "\u{e9}",
        "\u{3000}",
        "<|im_start|>",
        "<|im_end|>",
        "<s>",
        "\t",
        "the",
    ];

    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(0..PIECES.len(), 0..160)
            .prop_map(|v| v.into_iter().map(|i| PIECES[i]).collect())
    }

    /// The four tokenizer shapes a cache takes.
    fn shapes() -> [Json; 4] {
        [
            serde_json::from_str::<Json>(&builtin_tokenizer_json()).unwrap(),
            gpt2(),
            llama3(SPLIT_PATTERNS[0]),
            llama3(SPLIT_PATTERNS[1]),
        ]
    }

    proptest! {
        /// Through the cache, cold, warm and after a prefix of it, every
        /// tokenizer shape gives what encoding the text whole gives.
        #[test]
        fn cached_tokens_are_the_whole_texts(text in text(), cut in 0usize..200, chunk in 1usize..24, add: bool) {
            for shape in &shapes() {
                let t = load(shape, chunk);
                let whole = t.encode_whole(&text, add).unwrap();
                let mut p = cut.min(text.len());
                while !text.is_char_boundary(p) {
                    p -= 1;
                }
                let before = t.encode(&text[..p], add).unwrap();
                prop_assert_eq!(before, t.encode_whole(&text[..p], add).unwrap());
                prop_assert_eq!(&t.encode(&text, add).unwrap(), &whole);
                prop_assert_eq!(&t.encode(&text, add).unwrap(), &whole);
            }
        }

        /// Stopped after `stop` answers of "more", cold and warm, a prompt's
        /// tokens are the whole encoding's leading ones, the rest's bounds
        /// hold, and finishing gives the whole.
        #[test]
        fn stopped_early_then_finished_gives_the_whole(text in text(), stop in 0usize..4, chunk in 1usize..24, add: bool) {
            let body = json!({"prompt": text, "add_special_tokens": add});
            for shape in &shapes() {
                let t = load(shape, chunk);
                let whole = t.encode_whole(&text, add).unwrap();
                for _ in 0..2 {
                    let mut asked = 0;
                    let mut p = t
                        .prompt_tokens_until(Endpoint::Completions, &body, |so_far| {
                            assert_eq!(so_far, &whole[..so_far.len()]);
                            asked += 1;
                            asked <= stop
                        })
                        .unwrap();
                    prop_assert_eq!(&p.tokens[..], &whole[..p.tokens.len()]);
                    match p.rest.take() {
                        None => prop_assert_eq!(&p.tokens, &whole),
                        Some(rest) => {
                            let left = whole.len() - p.tokens.len();
                            prop_assert!(rest.max_tokens() >= left, "{} < {left}", rest.max_tokens());
                            prop_assert!(rest.estimated_tokens() <= rest.max_tokens());
                            prop_assert!(asked == stop + 1);
                            t.finish(&mut p.tokens, &rest).unwrap();
                            prop_assert_eq!(&p.tokens, &whole);
                        }
                    }
                }
            }
        }
    }

    fn gens_budget(budget: usize) -> Generations {
        let mut g = Generations::default();
        for h in 0..100u64 {
            let _ = g.put(h, Arc::from(vec![0u32; 7]), budget);
            assert!(g.tokens() <= budget + 7, "{} held", g.tokens());
        }
        g
    }

    #[test]
    fn a_prompt_no_one_holds_stops_after_the_probe() {
        let t = ModelTokenizer::builtin().with_prefix_cache(1 << 20);
        let text: String = (0..5000).map(|i| (b'a' + (i % 26) as u8) as char).collect();
        let body = json!({"prompt": text, "add_special_tokens": false});
        let mut asked = Vec::new();
        let mut p = t
            .prompt_tokens_until(Endpoint::Completions, &body, |so_far| {
                asked.push(so_far.len());
                so_far.is_empty()
            })
            .unwrap();
        // Asked with nothing, then after a quarter of the first 1 KiB
        // chunk (the built-in tokenizer: a token a byte, cut anywhere).
        let probe = CHUNK_BYTES / 4;
        assert_eq!(asked, [0, probe]);
        assert_eq!(p.tokens.len(), probe);
        let rest = p.rest.take().unwrap();
        assert_eq!(
            (rest.bytes(), rest.max_tokens()),
            (5000 - probe, 5000 - probe)
        );
        assert_eq!(rest.estimated_tokens(), 5000 - probe);
        // Nothing kept yet; finishing drops the probe's tokens and
        // encodes its chunk whole, once.
        assert_eq!(t.prefix_cache_stats().unwrap().encoded_tokens, 0);
        t.finish(&mut p.tokens, &rest).unwrap();
        assert_eq!(p.tokens, t.encode_whole(&text, false).unwrap());
        assert_eq!(t.prefix_cache_stats().unwrap().encoded_tokens, 5000);
        // A "yes" after the probe finishes that chunk from the probe on:
        // the next question comes at the chunk's end.
        asked.clear();
        let more = format!("{text}{text}");
        let body = json!({"prompt": more, "add_special_tokens": false});
        let p = t
            .prompt_tokens_until(Endpoint::Completions, &body, |so_far| {
                asked.push(so_far.len());
                asked.len() < 3
            })
            .unwrap();
        let cached = asked[0];
        assert!(cached >= 3 * CHUNK_BYTES, "{asked:?}");
        assert_eq!(&asked[1..], [cached + probe, cached + CHUNK_BYTES]);
        assert_eq!(p.tokens.len(), cached + CHUNK_BYTES);
    }

    #[test]
    fn generations_stay_within_the_budget_and_keep_what_is_used() {
        let mut g = gens_budget(64);
        // The newest chunk is held; one put 40 chunks ago is gone.
        assert!(g.get(99, 64).0.is_some());
        assert!(g.get(60, 64).0.is_none());
        // A hit in the old generation moves to the new one.
        let mut g2 = Generations::default();
        assert!(g2.put(1, Arc::from(vec![1u32; 10]), 40).is_none());
        // 21 > 20: cur becomes old, and the (empty) old one is handed back.
        let retired = g2.put(2, Arc::from(vec![2u32; 11]), 40);
        assert!(retired.is_some_and(|r| r.is_empty()));
        assert!(g2.cur.is_empty());
        let (hit, retired) = g2.get(1, 40);
        assert_eq!(hit.as_deref(), Some(&[1u32; 10][..]));
        assert!(retired.is_none());
        assert!(g2.cur.contains_key(&1) && !g2.old.contains_key(&1));
        // Passing half the budget again hands back the old generation,
        // for the caller to drop outside the lock.
        let retired = g2.put(3, Arc::from(vec![3u32; 11]), 40).expect("retired");
        assert_eq!(retired.keys().copied().collect::<Vec<_>>(), [2]);
        assert_eq!(g2.old.len(), 2);
    }

    fn cache(cuts: Cuts, added: &[&str], chunk: usize) -> PrefixCache {
        let shape = Shape {
            cuts,
            added: added.iter().map(|s| s.to_string()).collect(),
            around: (Vec::new(), Vec::new()),
        };
        PrefixCache::new(shape, 1 << 20, chunk)
    }

    #[test]
    fn cuts_before_a_space_between_printable_characters() {
        let c = cache(Cuts::BeforeSpace, &[], 4);
        let t = "abcd  ef gh\u{e9} ij k";
        // "  " (two spaces), then " gh" at 8.
        assert_eq!(c.next_cut(t, 0), Some(8));
        // After 8: "\u{e9} ij" has a non-ASCII left neighbour; " k" is last
        // but one: "j k" cut at 16.
        assert_eq!(c.next_cut(t, 8), Some(t.len() - 2));
        assert_eq!(c.next_cut(t, t.len() - 2), None);
    }

    #[test]
    fn cuts_anywhere_but_inside_added_tokens_and_characters() {
        let c = cache(Cuts::Anywhere, &["<|x|>"], 4);
        assert_eq!(c.next_cut("abcdefgh", 0), Some(4));
        // "ab<|x|>cd": 4 is inside the added token; its end (7) is the cut.
        assert_eq!(c.next_cut("ab<|x|>cd", 0), Some(7));
        // A two-byte character over byte 4.
        assert_eq!(c.next_cut("abc\u{e9}defg", 0), Some(5));
        assert_eq!(c.next_cut("abcd", 0), None);
    }
}

//! The flags of `arbor kv engine` (a `clap::Args` struct the binary
//! flattens) and their translation into [`kvreplay::server::SimEngineConfig`].
//! Defaults come from the library's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use kvreplay::engine::EngineConfig;
use kvreplay::server::{
    SimEngineConfig, DEFAULT_ENGINE, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_TOKENS_CAP,
    DEFAULT_REPLAY_BUFFER,
};
use kvrouter::tokenize::ModelTokenizer;

use crate::replay_args::positive_f64;

/// Every knob of `arbor kv engine`.
///
/// A simulated inference engine: OpenAI's completion and chat routes with
/// prefix caching and a prefill/decode time model, publishing vLLM's KV
/// events over ZeroMQ (and answering vLLM's replay requests with
/// --replay). It stands in for vLLM in router and gateway tests.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// The model name it serves (requests naming another get 404).
    #[arg(long, default_value = "arbor-sim")]
    pub model: String,

    /// A model directory (`tokenizer.json`, optionally
    /// `tokenizer_config.json` with the chat template), tokenized as the
    /// gateway tokenizes. Without it, a built-in byte-level tokenizer with
    /// a ChatML template.
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,

    /// Address the HTTP API listens on.
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,

    /// ZeroMQ endpoint the KV event PUB socket binds.
    #[arg(long, default_value = "tcp://127.0.0.1:5557", value_name = "ENDPOINT")]
    pub events: String,

    /// ZeroMQ endpoint of the replay ROUTER socket (vLLM's replay
    /// protocol); none without it.
    #[arg(long, value_name = "ENDPOINT")]
    pub replay: Option<String>,

    /// Batches kept for replay.
    #[arg(long, default_value_t = DEFAULT_REPLAY_BUFFER, value_name = "N")]
    pub replay_buffer: usize,

    /// Topic frame of every event batch (vLLM's default is empty).
    #[arg(long, default_value = "")]
    pub topic: String,

    /// The engine's id: salts its block hashes (as vLLM's are per engine).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub engine_id: u64,

    /// Tokens per KV block.
    #[arg(long, default_value_t = DEFAULT_ENGINE.block_size as u64, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..=65_536), help_heading = "Engine")]
    pub block_size: u64,

    /// KV blocks in the pool (prefix cache, LRU eviction).
    #[arg(long, default_value_t = DEFAULT_ENGINE.capacity_blocks as u64, value_name = "BLOCKS", value_parser = clap::value_parser!(u64).range(1..=1 << 32), help_heading = "Engine")]
    pub capacity_blocks: u64,

    /// Prefill speed, tokens per second, one prompt at a time (FIFO), over
    /// the tokens not cached.
    #[arg(long, default_value_t = DEFAULT_ENGINE.prefill_tps, value_name = "TOK_S", value_parser = positive_f64, help_heading = "Engine")]
    pub prefill_tps: f64,

    /// Decode speed per running sequence, tokens per second.
    #[arg(long, default_value_t = DEFAULT_ENGINE.decode_tps, value_name = "TOK_S", value_parser = positive_f64, help_heading = "Engine")]
    pub decode_tps: f64,

    /// Most requests admitted at once; the rest wait in FIFO order.
    #[arg(long, default_value_t = DEFAULT_ENGINE.max_running as u64, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1 << 20), help_heading = "Engine")]
    pub max_running: u64,

    /// Run the time model this many times faster than real time (every
    /// simulated duration divided by it).
    #[arg(long, default_value_t = 1.0, value_name = "F", value_parser = positive_f64, help_heading = "Engine")]
    pub speedup: f64,

    /// Most tokens a request generates (`max_tokens` above it is capped;
    /// 16 when a request does not say).
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS_CAP, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(kvreplay::server::MAX_TOKENS_LIMIT)), help_heading = "Requests")]
    pub max_tokens: u32,

    /// Longest prompt, tokens (400 above it). Default: the tokenizer's
    /// `model_max_length`, else 8192.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..=1 << 24), help_heading = "Requests")]
    pub max_model_len: Option<u64>,

    /// Largest request body, bytes (413 above it).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, value_name = "BYTES", help_heading = "Requests")]
    pub max_body_bytes: usize,

    /// Answer every Nth generation request 503 (fault injection for
    /// failover tests).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = "Requests")]
    pub fail_every: Option<u64>,
}

impl EngineArgs {
    /// The tokenizer: `--tokenizer`'s directory (or `builtin`), else the
    /// built-in one.
    pub fn load_tokenizer(&self) -> anyhow::Result<ModelTokenizer> {
        match &self.tokenizer {
            Some(dir) => ModelTokenizer::load(dir)
                .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", dir.display())),
            None => Ok(ModelTokenizer::builtin()),
        }
    }

    /// The engine's settings, with `tokenizer`.
    pub fn config(&self, tokenizer: Arc<ModelTokenizer>) -> SimEngineConfig {
        let mut c = SimEngineConfig::new(self.model.clone(), tokenizer);
        c.engine = EngineConfig {
            capacity_blocks: self.capacity_blocks as usize,
            block_size: self.block_size as usize,
            prefill_tps: self.prefill_tps,
            decode_tps: self.decode_tps,
            max_running: self.max_running as usize,
        };
        c.engine_id = self.engine_id;
        c.speedup = self.speedup;
        c.events = self.events.clone();
        c.replay = self.replay.clone();
        c.replay_buffer = self.replay_buffer;
        c.topic = self.topic.clone();
        c.max_tokens = self.max_tokens;
        c.max_model_len = self.max_model_len.map(|n| n as usize);
        c.max_body_bytes = self.max_body_bytes;
        c.fail_every = self.fail_every;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: EngineArgs,
    }

    #[test]
    fn no_flags_give_the_library_defaults() {
        let a = P::parse_from(["arbor"]).a;
        let c = a.config(Arc::new(a.load_tokenizer().unwrap()));
        let lib = SimEngineConfig::new("arbor-sim", Arc::clone(&c.tokenizer));
        assert_eq!(c.engine, lib.engine);
        assert_eq!(
            (
                c.replay_buffer,
                c.max_tokens,
                c.max_body_bytes,
                c.max_model_len
            ),
            (lib.replay_buffer, lib.max_tokens, lib.max_body_bytes, None)
        );
        assert_eq!(c.events, "tcp://127.0.0.1:5557");
        c.validate().unwrap();
    }

    #[test]
    fn flags_reach_the_config_and_ranges_hold() {
        let a = P::parse_from([
            "arbor",
            "--block-size",
            "32",
            "--capacity-blocks",
            "100",
            "--speedup",
            "10",
            "--replay",
            "tcp://127.0.0.1:5558",
            "--fail-every",
            "4",
            "--engine-id",
            "3",
        ])
        .a;
        let c = a.config(Arc::new(ModelTokenizer::builtin()));
        assert_eq!((c.engine.block_size, c.engine.capacity_blocks), (32, 100));
        assert_eq!((c.speedup, c.fail_every, c.engine_id), (10.0, Some(4), 3));
        assert_eq!(c.replay.as_deref(), Some("tcp://127.0.0.1:5558"));
        for bad in [
            &["--block-size", "0"][..],
            &["--speedup", "0"],
            &["--decode-tps", "-1"],
            &["--fail-every", "0"],
            &["--max-running", "0"],
        ] {
            let argv = [&["arbor"][..], bad].concat();
            assert!(P::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}

//! The router's settings: every limit is a flag with a default.
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use kvroute::PolicyKind;

use crate::ingest::IngestConfig;

/// Parses a routing policy flag with `PolicyKind`'s own `FromStr`, offering
/// the names of [`PolicyKind::ALL`] (with their descriptions) as clap's
/// possible values, so `--help` lists them and a typo gets the list and a
/// suggestion.
pub fn policy_value_parser() -> impl clap::builder::TypedValueParser<Value = PolicyKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        PolicyKind::ALL.map(|p| PossibleValue::new(p.name()).help(p.description())),
    )
    .try_map(|s| s.parse::<PolicyKind>())
}

/// `ID[:DP]=ENDPOINT[,replay=ENDPOINT][,url=http://HOST:PORT]`: a worker
/// given on the command line. In approximate mode the event endpoint may be
/// left out (`ID=url=http://HOST:PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArg {
    /// Instance id.
    pub id: u64,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Event publisher endpoint (`None`: the worker publishes nothing).
    pub endpoint: Option<String>,
    /// Replay endpoint.
    pub replay: Option<String>,
    /// The engine's HTTP base URL, for the gateway.
    pub url: Option<String>,
}

impl FromStr for WorkerArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected ID[:DP]=ENDPOINT[,replay=ENDPOINT][,url=URL]");
        let (who, rest) = s.split_once('=').ok_or_else(bad)?;
        let (id, dp) = match who.split_once(':') {
            Some((i, d)) => (i, Some(d)),
            None => (who, None),
        };
        let id = id.trim().parse::<u64>().map_err(|_| bad())?;
        let dp_rank = match dp {
            Some(d) => d.trim().parse::<u32>().map_err(|_| bad())?,
            None => 0,
        };
        let mut parts = rest.split(',').map(str::trim).peekable();
        let mut endpoint = None;
        // The first part is the endpoint unless it is already an option.
        if let Some(first) = parts.peek() {
            if !(first.starts_with("replay=") || first.starts_with("url=")) {
                if first.is_empty() {
                    return Err(bad());
                }
                endpoint = Some(first.to_string());
                parts.next();
            }
        }
        let mut replay = None;
        let mut url = None;
        for p in parts {
            match p.split_once('=') {
                Some(("replay", e)) if !e.is_empty() => replay = Some(e.to_string()),
                Some(("url", u)) if !u.is_empty() => {
                    check_url(u).map_err(|e| format!("{s:?}: {e}"))?;
                    url = Some(u.trim_end_matches('/').to_string());
                }
                _ => {
                    return Err(format!(
                        "{s:?}: unknown option {p:?} (expected replay=ENDPOINT or url=URL)"
                    ))
                }
            }
        }
        if endpoint.is_none() && url.is_none() {
            return Err(bad());
        }
        Ok(Self {
            id,
            dp_rank,
            endpoint,
            replay,
            url,
        })
    }
}

/// Checks an engine's HTTP base URL: `http://HOST:PORT` (no TLS, no path
/// but an optional trailing slash, no query).
pub fn check_url(u: &str) -> Result<(), String> {
    let rest = u
        .strip_prefix("http://")
        .ok_or_else(|| format!("url {u:?} must start with http://"))?;
    let host = rest.trim_end_matches('/');
    let ok = !host.is_empty()
        && !host.contains(['/', '?', '#', '@', ' '])
        && host.chars().all(|c| c.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(format!("url {u:?} is not http://HOST[:PORT]"))
    }
}

/// `MODEL=DIR`: the tokenizer directory of a model (`--tokenizer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerArg {
    /// The model name, as requests and workers give it.
    pub model: String,
    /// Directory with `tokenizer.json` (and `tokenizer_config.json`).
    pub dir: std::path::PathBuf,
}

impl FromStr for TokenizerArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((m, d)) if !m.is_empty() && !d.is_empty() => Ok(Self {
                model: m.to_string(),
                dir: d.into(),
            }),
            _ => Err(format!("{s:?}: expected MODEL=DIR")),
        }
    }
}

/// `arbor router`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RouterArgs {
    /// Address the HTTP API listens on.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Model served by the workers given with --worker.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Tokens per KV block of the workers given with --worker (must match
    /// the engines' block size: events with another are rejected).
    #[arg(long, default_value_t = 16)]
    pub block_size: u64,
    /// A worker: ID[:DP]=ENDPOINT[,replay=ENDPOINT][,url=http://HOST:PORT],
    /// e.g. `1=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,url=http://127.0.0.1:8000`
    /// (`url`: the engine's OpenAI server, for --gateway; with
    /// --no-kv-events the event endpoint may be left out: `1=url=http://..`).
    /// Repeatable.
    #[arg(long = "worker", value_name = "SPEC")]
    pub workers: Vec<WorkerArg>,
    /// Workers from a JSON file: an array of objects with `instance_id`,
    /// `endpoint`, and optionally `dp_rank`, `replay_endpoint`, `url`,
    /// `model_name` (default --model) and `block_size` (default
    /// --block-size): the body of `POST /register`.
    #[arg(long, value_name = "FILE")]
    pub workers_file: Option<std::path::PathBuf>,
    /// Routing policy for /route.
    #[arg(long, value_parser = policy_value_parser(), default_value_t = PolicyKind::KvBalanced)]
    pub policy: PolicyKind,
    /// Weight of prefill against decode blocks in the kv-aware cost.
    #[arg(long, default_value_t = 1.0)]
    pub overlap_weight: f64,
    /// Approximate mode, for engines that publish no KV events: each routed
    /// request's blocks are assumed cached on its worker for --approx-ttl.
    #[arg(long)]
    pub no_kv_events: bool,
    /// How long approximate mode keeps a routed request's blocks.
    #[arg(long, value_parser = parse_secs, default_value = "120")]
    pub approx_ttl: Duration,
    /// How long a routed request counts as in flight without /complete.
    #[arg(long, value_parser = parse_secs, default_value = "300")]
    pub request_ttl: Duration,
    /// Requests in flight per model (routed, not completed or expired);
    /// /route answers 503 at the limit.
    #[arg(long, default_value_t = 100_000)]
    pub max_in_flight: usize,
    /// Largest HTTP request body, bytes (413 above it).
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Most token ids (or block hashes) one /query or /route may carry.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_request_tokens: usize,
    /// Ingest threads (each worker's events apply on one of them, in order).
    #[arg(long, default_value_t = 2)]
    pub ingest_threads: usize,
    /// Topic prefix to subscribe to (vLLM's default topic is empty).
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Largest ZMQ message an engine may send, bytes; a larger one drops
    /// its connection.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_frame_bytes: i64,
    /// Messages queued per engine before ZMQ drops (a drop is a gap,
    /// which replays).
    #[arg(long, default_value_t = 100_000)]
    pub rcvhwm: i32,
    /// How long one replay may take, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "5")]
    pub replay_timeout: Duration,
    /// Replays in progress at once, all engines.
    #[arg(long, default_value_t = 8)]
    pub max_replays: usize,
    /// Live batches held per engine while its replay runs; past this the
    /// replay is abandoned and the worker resynced.
    #[arg(long, default_value_t = 10_000)]
    pub max_held_batches: usize,
    /// Bytes of live batches held per engine while its replay runs; past
    /// this the replay is abandoned and the worker resynced.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_held_bytes: usize,
    /// Storage tiers besides GPU whose blocks enter the index (e.g. CPU).
    #[arg(long = "include-medium", value_name = "MEDIUM")]
    pub include_media: Vec<String>,
    /// Token ids one stored event may carry.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_event_tokens: usize,
    /// How long /ready waits for a registered engine's first batch before
    /// counting it anyway, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "10")]
    pub connect_timeout: Duration,
    /// Warm restart: load this file on start if it exists, and write it
    /// (atomically) every --snapshot-interval and on shutdown.
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<std::path::PathBuf>,
    /// Seconds between snapshots (0: only on shutdown).
    #[arg(long, value_parser = parse_secs, default_value = "30")]
    pub snapshot_interval: Duration,
    /// Start from another router's state (GET URL/dump) when there is no
    /// snapshot file, then catch up by replay from each engine.
    #[arg(long, value_name = "URL")]
    pub peer: Option<String>,
    /// Seed of the policies' random tie-breaks.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Serve the OpenAI-compatible gateway: `POST /v1/completions`,
    /// `POST /v1/chat/completions`, `GET /v1/models`, proxied to the engine
    /// each request is routed to (workers registered with a url).
    #[arg(long)]
    pub gateway: bool,
    /// The tokenizer of a model for the gateway: MODEL=DIR, DIR holding
    /// `tokenizer.json` and `tokenizer_config.json` (`MODEL=builtin`: the
    /// built-in byte-level one, as `arbor kv engine` uses by default).
    /// Repeatable.
    #[arg(long = "tokenizer", value_name = "MODEL=DIR")]
    pub tokenizers: Vec<TokenizerArg>,
    /// Longest prompt the gateway forwards, tokens (400 above it; default:
    /// the tokenizer's `model_max_length`, else --max-request-tokens).
    #[arg(long)]
    pub max_context_tokens: Option<usize>,
    /// Prompt tokens the gateway keeps per model to skip tokenizing text it
    /// has seen: a conversation's next turn resends its history, and only
    /// the new text is tokenized (same tokens; for tokenizers whose
    /// `tokenizer.json` shows where text can be cut; 0: off).
    #[arg(long, default_value_t = 4 << 20)]
    pub tokenizer_cache_tokens: usize,
    /// Routed prompts whose text past what routing needed waits to be
    /// tokenized into that cache, on background threads of the least
    /// priority; beyond it the text is not cached.
    #[arg(long, default_value_t = 64)]
    pub tokenizer_fill_queue: usize,
    /// Seconds between health checks of each engine (`GET URL/health`);
    /// an engine failing one is not routed to until one passes (0: none).
    #[arg(long, value_parser = parse_secs, default_value = "5")]
    pub health_interval: Duration,
    /// How long one health check may take, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub health_timeout: Duration,
    /// Extra attempts of a gateway request on other engines after one
    /// could not connect or answered 5xx or 429 (never once a byte went
    /// to the client).
    #[arg(long, default_value_t = 2)]
    pub max_retries: usize,
    /// Consecutive failures of an engine that open its circuit breaker
    /// (it gets no requests until --breaker-cooldown has passed, then one
    /// trial request; success closes it).
    #[arg(long, default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long an open breaker keeps its engine out, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "10")]
    pub breaker_cooldown: Duration,
    /// How long connecting to an engine may take, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "2")]
    pub upstream_connect_timeout: Duration,
    /// How long a gateway request may take from start to the end of its
    /// response, seconds (504 before the first byte, cut after).
    #[arg(long, value_parser = parse_secs, default_value = "600")]
    pub request_timeout: Duration,
    /// How long the engine may take to send the first byte of its
    /// response body, seconds (504).
    #[arg(long, value_parser = parse_secs, default_value = "60")]
    pub first_byte_timeout: Duration,
    /// Gateway requests served at once; more wait in a queue.
    #[arg(long, default_value_t = 1024)]
    pub max_concurrent_requests: usize,
    /// Gateway requests waiting for a slot; beyond that, 429.
    #[arg(long, default_value_t = 1024)]
    pub max_queued_requests: usize,
    /// How long a gateway request may wait for a slot, seconds (then 429).
    #[arg(long, value_parser = parse_secs, default_value = "30")]
    pub queue_timeout: Duration,
    /// On shutdown, how long gateway requests in flight may take to
    /// finish (new ones get 503 meanwhile), seconds; then they are cut.
    #[arg(long, value_parser = parse_secs, default_value = "30")]
    pub drain_timeout: Duration,
    /// Replicas on NATS JetStream: relay the engines this router
    /// subscribes to into a stream, and build the indexes from that stream
    /// (with every other router on it). `nats://HOST:PORT`.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// The JetStream stream of engine events; its subjects are
    /// `kv.STREAM.MODEL.ID.RANK`, and its key-value and object buckets
    /// are named after it.
    #[arg(long, default_value = "ARBOR_KV")]
    pub nats_stream: String,
    /// Stream retention: events older than this go, seconds.
    #[arg(long, value_parser = parse_secs, default_value = "3600")]
    pub nats_max_age: Duration,
    /// Stream retention: the oldest events go beyond this many bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub nats_max_bytes: i64,
    /// Keep the stream in memory instead of files (lost if the server restarts).
    #[arg(long)]
    pub nats_memory: bool,
    /// A replica is not ready while more stream messages than this wait
    /// to be applied.
    #[arg(long, default_value_t = 10_000)]
    pub nats_max_lag: u64,
    /// The replica holding the snapshot lease writes a snapshot every this
    /// many stream messages (0: never).
    #[arg(long, default_value_t = 100_000)]
    pub nats_snapshot_every: u64,
    /// The snapshot lease's time to live, seconds: a leader that stops
    /// renewing it loses it after this long.
    #[arg(long, value_parser = parse_secs, default_value = "10")]
    pub nats_lease_ttl: Duration,
    /// Engine batches a relay holds while JetStream acknowledges earlier
    /// ones (the ingest threads wait beyond it).
    #[arg(long, default_value_t = 10_000)]
    pub nats_relay_queue: usize,
    /// Stream messages a replica holds received but not yet applied.
    #[arg(long, default_value_t = 10_000)]
    pub nats_apply_queue: usize,
    /// Relay only: publish the engines' batches into the stream and build
    /// no index (queries get 503; replicas elsewhere answer them). Spares
    /// the relay the cost of applying the stream. Needs --nats.
    #[arg(long)]
    pub nats_relay_only: bool,
    /// This replica's name in the snapshot lease (default: host and pid).
    #[arg(long)]
    pub replica_id: Option<String>,
    /// The kv-aware cost knobs, for embedding (default: --overlap-weight,
    /// temperature 0).
    #[arg(skip)]
    pub cost: Option<kvroute::KvCost>,
    /// The kv-balanced knobs, for embedding (default: `Balance::default()`).
    #[arg(skip)]
    pub balance: Option<kvroute::Balance>,
}

/// One entry of `--workers-file`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerEntry {
    /// Instance id.
    pub instance_id: u64,
    /// Data-parallel rank (0).
    #[serde(default)]
    pub dp_rank: u32,
    /// Event publisher endpoint (may be left out in approximate mode).
    pub endpoint: Option<String>,
    /// Replay endpoint.
    pub replay_endpoint: Option<String>,
    /// The engine's HTTP base URL (`http://HOST:PORT`), for the gateway.
    pub url: Option<String>,
    /// Model (default --model).
    pub model_name: Option<String>,
    /// Block size (default --block-size).
    pub block_size: Option<u64>,
}

/// Reads `--workers-file`.
pub fn read_workers_file(path: &std::path::Path) -> Result<Vec<WorkerEntry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v.is_finite() && (0.0..1e9).contains(&v)) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(v))
}

impl RouterArgs {
    /// The ingest part.
    pub fn ingest(&self) -> IngestConfig {
        IngestConfig {
            threads: self.ingest_threads.max(1),
            topic: self.topic.as_bytes().to_vec(),
            max_frame_bytes: self.max_frame_bytes,
            rcvhwm: self.rcvhwm,
            replay_timeout: self.replay_timeout,
            max_replays: self.max_replays.max(1),
            max_held: self.max_held_batches.max(1),
            max_held_bytes: self.max_held_bytes.max(1),
            extra_media: self.include_media.clone(),
            max_event_tokens: self.max_event_tokens,
        }
    }

    /// Settings for tests and embedding: every default, listening on
    /// `127.0.0.1:0`.
    pub fn defaults() -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: RouterArgs,
        }
        let mut a = P::parse_from(["kvrouter"]).a;
        a.listen = "127.0.0.1:0".parse().expect("a socket address");
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_specs() {
        let w: WorkerArg = "7:2=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558"
            .parse()
            .unwrap();
        assert_eq!(
            w,
            WorkerArg {
                id: 7,
                dp_rank: 2,
                endpoint: Some("tcp://127.0.0.1:5557".into()),
                replay: Some("tcp://127.0.0.1:5558".into()),
                url: None,
            }
        );
        let w: WorkerArg = "3=tcp://127.0.0.1:1,url=http://127.0.0.1:8000/"
            .parse()
            .unwrap();
        assert_eq!(w.url.as_deref(), Some("http://127.0.0.1:8000"));
        let w: WorkerArg = "3:1=url=http://h:80".parse().unwrap();
        assert_eq!((w.endpoint, w.dp_rank), (None, 1));
        assert!("a=b".parse::<TokenizerArg>().is_ok());
        assert!("=b".parse::<TokenizerArg>().is_err());
        assert_eq!("1=ipc:///x".parse::<WorkerArg>().unwrap().dp_rank, 0);
        for bad in [
            "",
            "x=tcp://a:1",
            "1",
            "1=",
            "1:z=tcp://a:1",
            "1=tcp://a:1,foo=b",
            "1=tcp://a:1,url=https://h:1",
            "1=tcp://a:1,url=http://h:1/v1",
            "1=url=",
            "1=replay=tcp://a:1",
        ] {
            assert!(bad.parse::<WorkerArg>().is_err(), "{bad}");
        }
        assert!(parse_secs("-1").is_err());
        assert!(parse_secs("nan").is_err());
        assert_eq!(parse_secs("1.5").unwrap(), Duration::from_millis(1500));
    }
}

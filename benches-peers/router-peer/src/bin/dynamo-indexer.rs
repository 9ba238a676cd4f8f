//! Dynamo's standalone KV indexer (`dynamo-kv-router` 1.6.1,
//! `services::indexer::run_server`), as its own process for the
//! side-by-side benchmark. Usage: dynamo-indexer PORT THREADS
use dynamo_kv_router::services::indexer::{run_server, IndexerConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(8091);
    let threads: usize = args.get(2).and_then(|p| p.parse().ok()).unwrap_or(2);
    run_server(IndexerConfig {
        block_size: None,
        port,
        threads,
        workers: None,
        model_name: "bench".into(),
        routing_group: "default".into(),
        peers: None,
        access_log: None,
        trace_id_header: axum::http::header::HeaderName::from_static("x-trace-id"),
        access_log_local_time: false,
    })
    .await
}

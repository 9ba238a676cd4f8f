//! `kvrouter`: the KV-cache-aware router service.
//!
//! Inference engines (vLLM, SGLang) publish "blocks stored / removed /
//! cleared" events over ZeroMQ; the router subscribes to each ([`ingest`]),
//! decodes them ([`wire`]), keeps their order and fills gaps by replay
//! ([`seq`]), maps them to index events ([`convert`]) and applies them to
//! one `kvindex` per model ([`registry`]). Over HTTP ([`http`]) it answers
//! which worker holds how much of a prompt (Dynamo's standalone-indexer
//! API) and where to send a request (`/route`, with the policies of
//! `kvroute`). [`approx`] covers engines that publish nothing.
//!
//! See `docs/design.md`.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod approx;
pub mod config;
pub mod convert;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod registry;
pub mod seq;
pub mod service;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use config::{RouterArgs, WorkerArg};
pub use service::{Service, ServiceError};

/// Serves the router on `listener` until `shutdown` resolves, then drains
/// requests in flight and stops the ingest threads.
pub async fn serve(
    args: RouterArgs,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let handle = metrics::handle();
    let svc = {
        let a = args.clone();
        tokio::task::spawn_blocking(move || Service::new(a)).await??
    };
    let ticker = {
        let svc = Arc::clone(&svc);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_secs(1));
            loop {
                t.tick().await;
                svc.tick();
                handle_upkeep();
            }
        })
    };
    let app = http::router(Arc::clone(&svc), handle);
    tracing::info!(addr = %listener.local_addr()?, "kvrouter listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    ticker.abort();
    // The ingest threads stop when the last handle on the service drops.
    tokio::task::spawn_blocking(move || drop(svc)).await?;
    Ok(())
}

fn handle_upkeep() {
    metrics::handle().run_upkeep();
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
}

//! The service's main loop: HTTP (and the gateway), the ticker, snapshots,
//! graceful shutdown.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{gateway, http, metrics, snapshot, RouterArgs, Service};

/// Serves the router on `listener` (with the gateway's routes if
/// `--gateway`) until `shutdown` resolves, then drains requests in flight
/// and stops the ingest threads.
pub async fn serve(
    args: RouterArgs,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let handle = metrics::handle();
    let nats = match &args.nats {
        Some(_) => Some(crate::replica::Nats::connect(&args).await?),
        None => None,
    };
    let svc = {
        let a = args.clone();
        let n = nats.clone();
        tokio::task::spawn_blocking(move || Service::with_nats(a, n)).await??
    };
    let nats_tasks = nats.as_ref().map(|n| n.start(&svc)).unwrap_or_default();
    let ticker = {
        let svc = Arc::clone(&svc);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_secs(1));
            let every = svc.args.snapshot_interval;
            let mut last = tokio::time::Instant::now();
            loop {
                t.tick().await;
                svc.tick();
                handle_upkeep();
                if svc.args.snapshot.is_some() && !every.is_zero() && last.elapsed() >= every {
                    last = tokio::time::Instant::now();
                    let s = Arc::clone(&svc);
                    let _ = tokio::task::spawn_blocking(move || save(&s)).await;
                }
            }
        })
    };
    let mut app = http::router(Arc::clone(&svc), handle);
    let gw = if args.gateway {
        Some(gateway::Gateway::new(Arc::clone(&svc)).await?)
    } else {
        None
    };
    let health = gw.as_ref().and_then(|g| {
        app = std::mem::take(&mut app).merge(gateway::routes(Arc::clone(g)));
        g.spawn_health()
    });
    tracing::info!(addr = %listener.local_addr()?, gateway = args.gateway, "kvrouter listening");
    // The gateway drains first (new requests 503, streams in flight
    // finish), then the server stops taking connections.
    let drain = gw.clone();
    let shutdown = async move {
        shutdown.await;
        if let Some(g) = drain {
            g.drain().await;
        }
    };
    // Streamed chunks leave as they come: without TCP_NODELAY a small chunk
    // waits for the client's delayed ACK (40 ms on Linux) behind the last.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    ticker.abort();
    if let Some(h) = health {
        h.abort();
    }
    if let Some(n) = &nats {
        crate::replica::lease::release(n).await;
    }
    // Nothing is applied after the ingest threads stop, so the last
    // snapshot holds exactly the seqs it records.
    tokio::task::spawn_blocking(move || {
        svc.stop_ingest();
        save(&svc);
    })
    .await?;
    // The relay's queue is closed with the ingest threads; what it holds
    // is published before the link goes.
    if let Some(n) = nats {
        n.flush_relay().await;
    }
    for t in nats_tasks {
        t.abort();
    }
    Ok(())
}

/// Writes the snapshot file, if one is configured; failures are logged.
fn save(svc: &Service) {
    // One write at a time: the shutdown write waits for a periodic one.
    static SAVING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    if let Some(path) = &svc.args.snapshot {
        let _one = SAVING.lock();
        let t = std::time::Instant::now();
        let doc = snapshot::take(svc);
        match snapshot::write(path, &doc) {
            Ok(()) => {
                tracing::info!(path = %path.display(), ms = t.elapsed().as_millis() as u64, "snapshot written")
            }
            Err(e) => tracing::error!(error = %e, "snapshot not written"),
        }
    }
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

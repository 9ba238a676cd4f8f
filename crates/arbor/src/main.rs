//! The `arbor` command-line tool.
//!
//! `arbor kv replay` replays LLM traffic (a Mooncake trace or a built-in
//! synthetic workload) through simulated engines under several routing
//! policies, then stress-tests the KV index with the resulting event stream.
//! `arbor kv engine` serves a simulated inference engine (OpenAI HTTP API,
//! vLLM's KV events; `kvreplay::server`). `arbor router` runs the KV-aware
//! router service (`kvrouter`). `arbor db`
//! shows, queries and watches the tables of a process serving statedb's
//! HTTP API. The logic
//! lives in those crates; this binary only parses flags (`arbor::ReplayArgs`,
//! `arbor::EngineArgs`, `kvrouter::RouterArgs`), draws progress bars, sets up logging and prints.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

use std::process::ExitCode;

use arbor::{EngineArgs, ReplayArgs};
use clap::{Parser, Subcommand};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Arbor: tools for KV-cache-aware LLM routing.
#[derive(Debug, Parser)]
#[command(name = "arbor", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// KV-cache index and routing tools.
    #[command(subcommand)]
    Kv(KvCommand),
    /// Run the KV-aware router service: subscribe to engines' KV events
    /// over ZeroMQ, answer /query, /route and the rest over HTTP.
    ///
    /// Workers come from --worker flags or POST /register at runtime. Logs
    /// go to stderr (RUST_LOG sets the level; default info). SIGTERM or
    /// Ctrl-C stops it gracefully.
    Router(Box<kvrouter::RouterArgs>),
    /// Show, query and watch the tables of a running process that serves
    /// statedb's HTTP API (`statedb::http`).
    #[command(subcommand)]
    Db(arbor::db_cmd::DbCommand),
}

#[derive(Debug, Subcommand)]
enum KvCommand {
    /// Compare routing policies on a trace or synthetic workload and
    /// stress-test the KV index with the resulting event stream.
    ///
    /// With no arguments: a built-in synthetic workload (about 10-30 s).
    /// Prints, per routing policy, the prefix-cache hit rate, prefill tokens,
    /// simulated TTFT and load imbalance, and per index implementation the
    /// block operations per second reached, lookup and apply latencies and
    /// memory.
    Replay(Box<ReplayArgs>),
    /// Serve a simulated inference engine: OpenAI's /v1/completions and
    /// /v1/chat/completions with prefix caching and a prefill/decode time
    /// model, publishing vLLM's KV events over ZeroMQ.
    ///
    /// A stand-in for vLLM: start a few on loopback and point a router
    /// (`arbor router --worker ID=EVENTS,replay=REPLAY`) at their events.
    /// SIGTERM or Ctrl-C stops it.
    Engine(Box<EngineArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Kv(KvCommand::Replay(args)) => match replay(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Kv(KvCommand::Engine(args)) => match engine(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Db(cmd) => match db(&cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Router(args) => match router(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// A router serving on a free loopback port from its own thread until the
/// guard drops.
fn local_router(args: kvrouter::RouterArgs) -> anyhow::Result<(String, LocalRouter)> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let _ = addr_tx.send(l.local_addr()?);
            kvrouter::serve(args, l, async {
                let _ = rx.await;
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
        })
    });
    let addr = addr_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the live router did not start"))?;
    Ok((
        format!("http://{addr}"),
        LocalRouter {
            stop: Some(tx),
            thread: Some(thread),
        },
    ))
}

/// Stops the local router when dropped.
struct LocalRouter {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Drop for LocalRouter {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn router(args: kvrouter::RouterArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    #[cfg(not(any(feature = "mimalloc", feature = "jemalloc")))]
    // Not glibc: nothing to pin, the allocator keeps its own policy.
    let _ = kvrouter::sys::pin_malloc_trim_threshold();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
        kvrouter::serve(args, listener, kvrouter::shutdown_signal())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    })
}

fn engine(args: &EngineArgs) -> anyhow::Result<()> {
    let tokenizer = std::sync::Arc::new(args.load_tokenizer()?);
    let config = args.config(tokenizer);
    config.validate()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
        let model = config.model.clone();
        let h = kvreplay::server::SimEngine::start(config, listener).await?;
        eprintln!(
            "arbor kv engine: model {model} on http://{}, events {}, replay {}",
            h.http_addr(),
            h.events_endpoint(),
            h.replay_endpoint().unwrap_or("off"),
        );
        kvrouter::shutdown_signal().await;
        h.shutdown().await;
        Ok(())
    })
}

/// `arbor kv replay --gateway [URL]`: the workload as HTTP requests
/// through a gateway, a local fleet's when `url` is `auto`.
fn gateway_replay(
    args: &ReplayArgs,
    opts: &kvreplay::ReplayOptions,
    url: &str,
) -> anyhow::Result<()> {
    use kvreplay::gateway::{GatewayOptions, LocalFleet, FLEET_MODEL};
    let local = url == "auto";
    let mut g = if local {
        GatewayOptions::new("http://127.0.0.1", FLEET_MODEL)
    } else {
        GatewayOptions::new(url, args.gateway_model.as_str())
    };
    g.speedup = args.speedup;
    g.max_output_tokens = args.max_output_tokens;
    g.max_in_flight = args.max_in_flight;
    g.validate()?;
    opts.validate()?;
    let (workload, _) = kvreplay::load_workload(opts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let fleet = if local {
            let policy = kvrouter::RouterArgs::defaults().policy;
            let sim = &opts.sim;
            let f = LocalFleet::start(sim.workers, sim.engine, args.speedup, policy).await?;
            g.url = f.url().to_string();
            g.engines = Some(sim.workers);
            Some(f)
        } else {
            None
        };
        eprintln!(
            "arbor kv replay: {} requests of {} over {:.1} s through {}",
            workload.requests.len(),
            workload.name,
            workload.span_us() as f64 / 1e6 / g.speedup,
            g.url
        );
        let report = kvreplay::gateway::replay(&workload, &g).await;
        if let Some(f) = fleet {
            f.stop().await;
        }
        let report = report?;
        print!("{}", report.render());
        if let Some(p) = &opts.json {
            std::fs::write(p, serde_json::to_string_pretty(&report)?)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", p.display()))?;
            println!("JSON report written to {}", p.display());
        }
        Ok(())
    })
}

fn db(cmd: &arbor::db_cmd::DbCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stdout = std::io::stdout();
    rt.block_on(arbor::db_cmd::run(cmd, &mut stdout.lock()))
}

fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let mut opts = args.options()?;
    if let Some(url) = &args.gateway {
        return gateway_replay(args, &opts, url);
    }
    // `--live` with no URL: a router of our own on loopback for the run,
    // with the simulation's policy knobs and seed.
    let _router;
    if opts.live.as_deref() == Some("auto") {
        let sim = opts.sim;
        let mut r = kvrouter::RouterArgs::defaults();
        r.seed = sim.seed ^ 0x5EED;
        r.cost = Some(sim.cost);
        r.balance = Some(sim.balance);
        let (url, guard) = local_router(r)?;
        opts.live = Some(url);
        _router = guard;
    }
    let report = kvreplay::run(&opts, arbor::progress::for_stderr(args.no_progress))?;
    print!("{}", kvreplay::report::render_table(&report));
    kvreplay::write_outputs(&opts, &report)?;
    if let Some(p) = &opts.json {
        println!("JSON report written to {}", p.display());
    }
    if let Some(p) = &opts.plot {
        println!("Plot written to {}", p.display());
    }
    Ok(())
}

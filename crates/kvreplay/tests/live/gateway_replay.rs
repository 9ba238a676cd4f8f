//! A workload replayed as HTTP requests through a whole fleet on loopback
//! (simulated engines and the router's gateway), as `arbor kv replay
//! --gateway` runs it.

use kvreplay::engine::EngineConfig;
use kvreplay::gateway::{complete, replay, GatewayOptions, LocalFleet, FLEET_MODEL};
use kvreplay::policy::PolicyKind;
use kvreplay::trace::{Request, Workload};

const BS: usize = 16;

/// `convs` conversations of `turns` turns, each turn four blocks more than
/// the last, a conversation's turns 90 ms apart.
fn conversations(convs: u64, turns: u64) -> Workload {
    let mut requests = Vec::new();
    for t in 0..turns {
        for c in 0..convs {
            let blocks: Vec<u64> = (0..4 * (t + 1)).map(|k| c * 1000 + k).collect();
            requests.push(Request {
                arrival_us: (t * convs + c) * 30_000,
                input_tokens: (blocks.len() * BS) as u32,
                output_tokens: 4,
                blocks,
            });
        }
    }
    Workload {
        name: "conversations".into(),
        block_size: BS,
        requests,
    }
}

fn engine() -> EngineConfig {
    EngineConfig {
        capacity_blocks: 4096,
        block_size: BS,
        prefill_tps: 200_000.0,
        decode_tps: 2000.0,
        max_running: 16,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_workload_through_a_local_fleet_hits_its_cache() {
    let fleet = LocalFleet::start(2, engine(), 1.0, PolicyKind::KvAware)
        .await
        .unwrap();
    let w = conversations(3, 4);
    let r = replay(&w, &GatewayOptions::new(fleet.url(), FLEET_MODEL))
        .await
        .unwrap();
    // A whole (not streamed) answer to the first prompt again: its engine
    // and its cached blocks come from the one JSON body.
    let body = serde_json::json!({
        "model": FLEET_MODEL,
        "prompt": kvreplay::gateway::prompt_text(&w.requests[0], BS),
        "max_tokens": 2,
    });
    let url = format!("{}/v1/completions", fleet.url());
    let whole = complete(&reqwest::Client::new(), &url, &body).await;
    assert_eq!(whole.error, None);
    assert!(whole.engine.is_some_and(|e| e < 2), "{whole:?}");
    assert!(
        whole.cached_tokens >= 48 && whole.prompt_tokens >= 64,
        "{whole:?}"
    );
    assert!(
        whole.ttft_us > 0 && whole.ttft_us <= whole.e2e_us,
        "{whole:?}"
    );
    let stats: Vec<_> = fleet.engines().iter().map(|e| e.stats()).collect();
    let served: u64 = stats.iter().map(|s| s.finished).sum();
    let cached: u64 = stats.iter().map(|s| s.cached_tokens).sum();
    fleet.stop().await;
    assert_eq!((r.requests, r.ok, r.late), (12, 12, 0), "{}", r.render());
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    // Every request named its engine; the warm-up completion is the rest.
    assert_eq!(r.per_engine.values().sum::<u64>(), 12);
    assert_eq!(served, 14);
    assert!(r.per_engine.keys().all(|&e| e < 2));
    // Each later turn finds its earlier turns cached: 3 x 64 x (1+2+3) of
    // 3 x 64 x (1+2+3+4) prompt tokens when every turn stays on its engine.
    assert!(r.prompt_tokens >= 1920, "{}", r.prompt_tokens);
    // What the client read is what the engines counted (the warm-up hit
    // nothing).
    assert_eq!(r.cached_tokens + whole.cached_tokens, cached);
    assert!(r.hit_rate() > 0.5, "{}", r.render());
    // Through a gateway and an engine on loopback: well over 50 us (not
    // the microsecond a clamped histogram gives), under seconds.
    assert!(
        r.ttft_ms.p50 > 0.05 && r.ttft_ms.p99 < 2000.0,
        "{}",
        r.render()
    );
    assert!(r.e2e_ms.p99 >= r.ttft_ms.p50);
    assert!(r.render().contains("| 12 | 0 | 0 |"), "{}", r.render());
}

#[tokio::test]
async fn a_gateway_that_is_not_there_fails_every_request_and_nothing_else() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = GatewayOptions::new(format!("http://127.0.0.1:{port}"), "m");
    let r = replay(&conversations(2, 2), &opts).await.unwrap();
    assert_eq!((r.requests, r.ok), (4, 0));
    assert_eq!(r.failed.get("connect"), Some(&4));
    assert_eq!((r.hit_rate(), r.busiest_over_mean()), (0.0, None));
}

#[tokio::test]
async fn bad_gateway_options_are_refused() {
    let w = conversations(1, 1);
    let mut opts = GatewayOptions::new("http://127.0.0.1:9", "m");
    for speedup in [0.0, 1e-4, f64::NAN, 1e7] {
        opts.speedup = speedup;
        assert!(replay(&w, &opts).await.is_err(), "{speedup}");
    }
    let mut opts = GatewayOptions::new("not a url", "m");
    opts.max_in_flight = 4;
    assert!(replay(&w, &opts).await.is_err());
    let mut opts = GatewayOptions::new("http://127.0.0.1:9", "m");
    opts.max_output_tokens = 0;
    assert!(replay(&w, &opts).await.is_err());
}

//! Every HTTP endpoint and error, on a real server on loopback.

use std::time::Duration;

use crate::support::{args, prompt, Router, BS};
use serde_json::{json, Value};

fn register(r: &Router, id: u64, port: u16) -> (u16, Value) {
    r.post(
        "/register",
        &json!({"instance_id": id, "endpoint": format!("tcp://127.0.0.1:{port}"),
                "model_name": "m", "block_size": BS}),
    )
}

#[test]
fn register_unregister_and_workers_in_dynamos_shapes() {
    let r = Router::start(args());
    assert_eq!(register(&r, 1, 1).0, 201);
    let (s, v) = r.post(
        "/register",
        &json!({"instance_id": 1, "dp_rank": 1, "endpoint": "tcp://127.0.0.1:2",
                "replay_endpoint": "tcp://127.0.0.1:3", "model_name": "m", "block_size": BS,
                "routing_group": "default", "tenant_id": "t"}),
    );
    assert_eq!((s, &v), (201, &json!({"status": "ok"})));
    // Conflicts: the same rank again, another block size for the model.
    let (s, v) = register(&r, 1, 1);
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("already registered"));
    let (s, v) = r.post(
        "/register",
        &json!({"instance_id": 2, "endpoint": "tcp://127.0.0.1:4", "model_name": "m", "block_size": 8}),
    );
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("block size 4"));
    // Bad input: 400 with a JSON error.
    for body in [
        json!({"instance_id": 3, "endpoint": "localhost:1", "model_name": "m", "block_size": BS}),
        json!({"instance_id": 3, "endpoint": "tcp://", "model_name": "m", "block_size": BS}),
        json!({"instance_id": 3, "endpoint": "tcp://127.0.0.1:5", "replay_endpoint": "x", "model_name": "m", "block_size": BS}),
        json!({"instance_id": 3, "endpoint": "tcp://127.0.0.1:5", "model_name": "n", "block_size": 0}),
    ] {
        let (s, v) = r.post("/register", &body);
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    let (s, v) = r.post("/register", &json!({"instance_id": "x"}));
    assert_eq!(s, 422, "{v}");
    assert!(v["error"].is_string());
    let (s, v) = r.post_raw("/register", b"{not json".to_vec());
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].is_string());

    let (s, ws) = r.get("/workers");
    assert_eq!(s, 200);
    let ws = ws.as_array().unwrap();
    assert_eq!(ws.len(), 1, "{ws:?}");
    let w = &ws[0];
    assert_eq!(w["instance_id"], 1);
    assert_eq!(w["source"], "zmq");
    assert_eq!(w["model_name"], "m");
    assert_eq!(w["routing_group"], "default");
    assert_eq!(w["block_size"], BS);
    assert_eq!(w["status"], "pending");
    assert_eq!(w["endpoints"]["1"], "tcp://127.0.0.1:2");
    assert_eq!(w["listeners"]["0"]["status"], "pending");
    assert_eq!(w["feeds"]["1"]["replay_endpoint"], "tcp://127.0.0.1:3");
    assert_eq!(r.get("/workers?model_name=other").1, json!([]));
    assert_eq!(r.get("/workers?routing_group=other").1, json!([]));

    // Nothing heard: not ready until the connect timeout passes.
    let (s, v) = r.get("/ready");
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["waiting"].as_array().unwrap().len(), 2);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(r.get("/ready").0, 200);

    let (s, _) = r.post(
        "/unregister",
        &json!({"instance_id": 1, "dp_rank": 1, "model_name": "m"}),
    );
    assert_eq!(s, 200);
    let (s, _) = r.post(
        "/unregister",
        &json!({"instance_id": 1, "dp_rank": 1, "model_name": "m"}),
    );
    assert_eq!(s, 404);
    let (s, _) = r.post(
        "/unregister",
        &json!({"instance_id": 1, "model_name": "zzz"}),
    );
    assert_eq!(s, 404);
    let (s, _) = r.post("/unregister", &json!({"instance_id": 1, "model_name": "m"}));
    assert_eq!(s, 200);
    assert_eq!(r.get("/workers").1, json!([]));
    assert_eq!(r.get("/health").0, 200);
}

#[test]
fn queries_routes_and_their_errors() {
    let mut a = args();
    a.no_kv_events = true;
    a.max_request_tokens = 1000;
    a.max_body_bytes = 64 << 10;
    let r = Router::start(a);
    // Unknown model: 404 with a clear error.
    let (s, v) = r.post(
        "/query",
        &json!({"token_ids": [1, 2, 3, 4], "model_name": "nope"}),
    );
    assert_eq!(s, 404);
    assert!(v["error"].as_str().unwrap().contains("nope"), "{v}");
    let (s, _) = r.post("/route", &json!({"token_ids": [1], "model_name": "nope"}));
    assert_eq!(s, 404);
    for id in [1, 2] {
        assert_eq!(register(&r, id, 1).0, 201);
    }
    assert_eq!(r.get("/ready").0, 200, "approximate workers are ready");
    let toks = prompt(0, 6);
    // Cold: nobody holds anything.
    let (s, v) = r.post("/query", &json!({"token_ids": toks, "model_name": "m"}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v, json!({"scores": {}, "frequencies": [], "instances": {}}));
    let (s, d1) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "r1"}),
    );
    assert_eq!(s, 200, "{d1}");
    assert_eq!(d1["request_id"], "r1");
    assert_eq!(d1["request_blocks"], 6);
    assert_eq!(d1["overlap_blocks"], 0);
    assert_eq!(d1["scores"].as_array().unwrap().len(), 2);
    assert!(
        d1["reason"].as_str().unwrap().contains("0 of 6 blocks"),
        "{d1}"
    );
    // Approximate mode recorded the routed blocks on the chosen worker.
    let w1 = d1["worker_id"].as_u64().unwrap();
    let (_, q) = r.post("/query", &json!({"token_ids": toks, "model_name": "m"}));
    assert_eq!(q["scores"][w1.to_string()]["0"], 6 * BS as u64, "{q}");
    assert_eq!(q["frequencies"], json!([1, 1, 1, 1, 1, 1]));
    assert_eq!(
        q["instances"][w1.to_string()]["longest_matched"],
        6 * BS as u64
    );
    // The same prompt follows its cache; it counts as in flight there.
    let (_, d2) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "r2"}),
    );
    assert_eq!(d2["worker_id"], w1, "{d2}");
    assert_eq!(d2["overlap_blocks"], 6);
    let mine = d2["scores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["worker_id"] == w1)
        .unwrap();
    assert_eq!(mine["active_requests"], 1, "{d2}");
    // Same id again while in flight: 409.
    let (s, _) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "r2"}),
    );
    assert_eq!(s, 409);
    let (s, _) = r.post(
        "/prefill_complete",
        &json!({"request_id": "r2", "model_name": "m"}),
    );
    assert_eq!(s, 200);
    let (_, d3) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "r3"}),
    );
    let mine = d3["scores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["worker_id"] == w1)
        .unwrap();
    assert_eq!(mine["active_requests"], 2, "{d3}");
    assert_eq!(
        mine["pending_prefill_blocks"], 6,
        "r1's blocks only (r2's prefill is done): {d3}"
    );
    assert_eq!(r.post("/complete", &json!({"request_id": "r3"})).0, 200);
    let (s, _) = r.post("/prefill_complete", &json!({"request_id": "nope"}));
    assert_eq!(s, 404);
    let (s, _) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "policy": "fastest"}),
    );
    assert_eq!(s, 400);
    let (s, d) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "policy": "round-robin", "request_id": "rr"}),
    );
    assert_eq!((s, &d["policy"]), (200, &json!("round-robin")), "{d}");
    r.post("/complete", &json!({"request_id": "rr"}));
    let (s, v) = r.post("/complete", &json!({"request_id": "r1"}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["worker_id"], w1);
    let (s, _) = r.post("/complete", &json!({"request_id": "r1", "model_name": "m"}));
    assert_eq!(s, 404);
    // Another routing group has no index; a cache salt keys other blocks.
    let (s, _) = r.post(
        "/query",
        &json!({"token_ids": toks, "model_name": "m", "routing_group": "g2"}),
    );
    assert_eq!(s, 404);
    let (s, q) = r.post(
        "/query",
        &json!({"token_ids": toks, "model_name": "m", "cache_salt": "tenant"}),
    );
    assert_eq!((s, &q["scores"]), (200, &json!({})), "{q}");
    let (s, _) = r.post(
        "/register",
        &json!({"instance_id": 9, "endpoint": "tcp://127.0.0.1:1", "model_name": "m",
                "block_size": BS, "routing_group": "g2"}),
    );
    assert_eq!(s, 400);
    // Precomputed hashes.
    let hashes: Vec<i64> = kvindex::local_block_hashes(&toks, BS, None)
        .iter()
        .map(|h| h.0 as i64)
        .collect();
    let (s, q) = r.post(
        "/query_by_hash",
        &json!({"block_hashes": hashes, "model_name": "m"}),
    );
    assert_eq!(s, 200);
    assert_eq!(q["scores"][w1.to_string()]["0"], 6 * BS as u64);
    let (s, d) = r.post(
        "/route",
        &json!({"block_hashes": hashes, "model_name": "m"}),
    );
    assert_eq!(s, 200);
    assert_eq!(d["overlap_blocks"], 6);
    let (s, _) = r.post(
        "/query_by_hash",
        &json!({"block_hashes": hashes, "model_name": "m", "cache_salt": "x"}),
    );
    assert_eq!(s, 400);
    // Limits and malformed bodies.
    let (s, v) = r.post(
        "/query",
        &json!({"token_ids": vec![1; 1001], "model_name": "m"}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("limit"));
    let (s, v) = r.post_raw("/query", vec![b' '; 70_000]);
    assert_eq!(s, 413, "{v}");
    assert!(v["error"].is_string());
    let q = br#"{"token_ids": [1], "model_name": "m"}"#.to_vec();
    for ct in ["text/plain", "application/jsonx", "json"] {
        let (s, v) = r.post_typed("/query", ct, q.clone());
        assert_eq!(s, 415, "{ct}: {v}");
        assert!(v["error"].as_str().unwrap().contains("application/json"));
    }
    for ct in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/x+json",
    ] {
        assert_eq!(r.post_typed("/query", ct, q.clone()).0, 200, "{ct}");
    }
    for body in [
        json!({"model_name": "m"}),
        json!({"model_name": "m", "token_ids": [1], "block_hashes": [1]}),
        json!({"model_name": "m", "token_ids": [1], "request_id": ""}),
    ] {
        assert_eq!(r.post("/route", &body).0, 400, "{body}");
    }
    let (s, _) = r.post("/query", &json!({"token_ids": [-1], "model_name": "m"}));
    assert_eq!(s, 422);
    // Dump: Dynamo's RouterEvent shape, one entry per model.
    let (s, dump) = r.get("/dump");
    assert_eq!(s, 200);
    let evs = dump["m:default"]["events"].as_array().unwrap();
    assert_eq!(dump["m:default"]["block_size"], BS);
    assert!(evs
        .iter()
        .any(|e| e["event"]["data"]["stored"]["blocks"].is_array()));
    assert!(evs
        .iter()
        .all(|e| e["worker_id"].is_u64() && e["storage_tier"] == "device"));
    let m = r.text("/metrics");
    for name in [
        "kvrouter_routed_total",
        "kvrouter_route_seconds_bucket",
        "kvrouter_route_overlap_ratio_bucket",
        "kvrouter_index_blocks{model=\"m\"}",
        "kvrouter_worker_blocks{model=\"m\"",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics:\n{m}");
    }
}

#[test]
fn in_flight_requests_are_bounded() {
    let mut a = args();
    a.no_kv_events = true;
    a.max_in_flight = 2;
    let r = Router::start(a);
    assert_eq!(register(&r, 1, 1).0, 201);
    let toks = prompt(1, 2);
    for id in ["a", "b"] {
        let (s, _) = r.post(
            "/route",
            &json!({"token_ids": toks, "model_name": "m", "request_id": id}),
        );
        assert_eq!(s, 200);
    }
    let (s, v) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "c"}),
    );
    assert_eq!(s, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("--max-in-flight"));
    assert_eq!(r.post("/complete", &json!({"request_id": "a"})).0, 200);
    let (s, _) = r.post(
        "/route",
        &json!({"token_ids": toks, "model_name": "m", "request_id": "c"}),
    );
    assert_eq!(s, 200);
}

#[test]
fn approximate_blocks_expire() {
    let mut a = args();
    a.no_kv_events = true;
    a.approx_ttl = Duration::from_millis(300);
    let r = Router::start(a);
    assert_eq!(register(&r, 1, 1).0, 201);
    let toks = prompt(3, 4);
    r.post("/route", &json!({"token_ids": toks, "model_name": "m"}));
    let (_, q) = r.post("/query", &json!({"token_ids": toks, "model_name": "m"}));
    assert_eq!(q["scores"]["1"]["0"], 4 * BS as u64);
    // The router sweeps once a second.
    std::thread::sleep(Duration::from_millis(2300));
    let (_, q) = r.post("/query", &json!({"token_ids": toks, "model_name": "m"}));
    assert_eq!(q["scores"], json!({}), "{q}");
}

#[test]
fn workers_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("workers.json");
    std::fs::write(
        &f,
        r#"[{"instance_id": 4, "endpoint": "tcp://127.0.0.1:9"},
            {"instance_id": 4, "dp_rank": 1, "endpoint": "tcp://127.0.0.1:10",
             "replay_endpoint": "tcp://127.0.0.1:11", "model_name": "other", "block_size": 32}]"#,
    )
    .unwrap();
    let mut a = args();
    a.workers_file = Some(f.clone());
    let r = Router::start(a);
    let (_, ws) = r.get("/workers");
    let ws = ws.as_array().unwrap();
    assert_eq!(ws.len(), 2, "{ws:?}");
    let other = ws.iter().find(|w| w["model_name"] == "other").unwrap();
    assert_eq!(other["block_size"], 32);
    assert_eq!(other["feeds"]["1"]["replay_endpoint"], "tcp://127.0.0.1:11");
    // A bad file stops the router from starting, saying why.
    std::fs::write(
        &f,
        r#"[{"instance_id": 1, "endpoint": "tcp://127.0.0.1:9", "typo": 1}]"#,
    )
    .unwrap();
    let mut a = args();
    a.workers_file = Some(f);
    let err = match kvrouter::Service::new(a) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a bad workers file was accepted"),
    };
    assert!(err.contains("typo"), "{err}");
}

#[test]
fn metrics_series_follow_workers_and_models() {
    let r = Router::start(args());
    let (s, _) = r.post(
        "/register",
        &json!({"instance_id": 77, "endpoint": "tcp://127.0.0.1:1",
                "model_name": "series", "block_size": BS}),
    );
    assert_eq!(s, 201);
    let m = r.text("/metrics");
    let worker = "kvrouter_worker_blocks{model=\"series\",worker_id=\"77\"";
    let bytes = m
        .lines()
        .find_map(|l| l.strip_prefix("kvrouter_index_bytes{model=\"series\"} "))
        .unwrap_or_else(|| panic!("no index bytes:\n{m}"));
    assert!(bytes.parse::<f64>().unwrap() > 0.0, "{bytes}");
    assert!(m.contains(worker), "{m}");
    let (s, _) = r.post(
        "/unregister",
        &json!({"instance_id": 77, "model_name": "series"}),
    );
    assert_eq!(s, 200);
    // Gauges leave the output once no scrape sets them (one second).
    std::thread::sleep(Duration::from_millis(1_200));
    let m = r.text("/metrics");
    assert!(!m.contains("model=\"series\""), "{m}");
}

#[test]
fn a_restored_worker_takes_its_endpoints_from_the_workers_file() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("router.json");
    let mut a = args();
    a.snapshot = Some(snap.clone());
    {
        let r = Router::start(a.clone());
        assert_eq!(register(&r, 5, 9).0, 201);
    } // shutdown writes the snapshot
    let f = dir.path().join("workers.json");
    std::fs::write(
        &f,
        r#"[{"instance_id": 5, "endpoint": "tcp://127.0.0.1:19", "replay_endpoint": "tcp://127.0.0.1:20"}]"#,
    )
    .unwrap();
    a.workers_file = Some(f.clone());
    let r = Router::start(a.clone());
    let (_, ws) = r.get("/workers");
    let ws = ws.as_array().unwrap();
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!(ws[0]["endpoints"]["0"], "tcp://127.0.0.1:19", "{ws:?}");
    assert_eq!(
        ws[0]["feeds"]["0"]["replay_endpoint"], "tcp://127.0.0.1:20",
        "{ws:?}"
    );
    drop(r);
    // A configured block size the snapshot contradicts stops the start.
    std::fs::write(
        &f,
        r#"[{"instance_id": 5, "endpoint": "tcp://127.0.0.1:19", "block_size": 64}]"#,
    )
    .unwrap();
    let err = match kvrouter::Service::new(a) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a contradicting workers file was accepted"),
    };
    assert!(err.contains("block size"), "{err}");
}

//! The router against an independent publisher (Python, pyzmq + msgspec,
//! vLLM's event structs and replay protocol) on loopback: its answers must
//! equal what was published, through drops, short replay buffers,
//! restarts and garbage.

use std::time::Duration;

use crate::support::{args, python, Engine, Expect, Publisher, Router};
use kvindex::WorkerKey;
use serde_json::json;

macro_rules! need_python {
    () => {
        match python() {
            Some(p) => p,
            None => return,
        }
    };
}

fn register(r: &Router, id: u64, p: &Publisher, replay: bool) {
    let mut body = json!({
        "instance_id": id, "endpoint": p.endpoint, "model_name": "m", "block_size": crate::support::BS,
    });
    if replay {
        body["replay_endpoint"] = json!(p.replay);
    }
    let (s, v) = r.post("/register", &body);
    assert_eq!(s, 201, "{v}");
    // Let the subscription connect; anything published before it is
    // recovered by replay from 0 (tested below), not lost.
    std::thread::sleep(Duration::from_millis(200));
}

#[test]
fn answers_equal_what_was_published_in_every_encoding() {
    let py = need_python!();
    let mut pubs = [
        Publisher::start(&py, "array", "int"),
        Publisher::start(&py, "map", "bytes"),
        Publisher::start(&py, "sglang", "int"),
    ];
    let mut a = args();
    // One worker from the command line, two through /register.
    a.workers = vec![format!("1={},replay={}", pubs[0].endpoint, pubs[0].replay)
        .parse()
        .unwrap()];
    let r = Router::start(a);
    register(&r, 2, &pubs[1], true);
    register(&r, 3, &pubs[2], true);
    let mut engines: Vec<Engine> = (1..=3).map(Engine::new).collect();
    let expect = Expect::new();
    let mut rng = 0x5eed_u64;
    for _ in 0..120 {
        for (e, p) in engines.iter_mut().zip(pubs.iter_mut()) {
            let (wire, evs) = e.random_batch(&mut rng, 4);
            p.batch(wire, false);
            expect.apply(&evs);
        }
    }
    for (i, p) in pubs.iter().enumerate() {
        r.wait_for("m", i as u64 + 1, p.last_seq.unwrap());
    }
    let keys: Vec<WorkerKey> = engines.iter().map(|e| e.key).collect();
    expect.check(&r, "m", &keys);
    for k in &keys {
        let f = r.feed("m", k.worker_id, 0);
        assert_eq!(f["resyncs"], 0, "{f}");
        assert_eq!(f["decode_errors"], 0, "{f}");
    }
    let (s, ready) = r.get("/ready");
    assert_eq!((s, &ready["ready"]), (200, &json!(true)), "{ready}");
}

#[test]
fn dropped_batches_are_replayed() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "array", "int");
    let r = Router::start(args());
    // Published before the router subscribed: recovered by a replay from 0.
    let mut e = Engine::new(1);
    let expect = Expect::new();
    let mut rng = 7u64;
    for _ in 0..5 {
        let (w, evs) = e.random_batch(&mut rng, 3);
        p.batch(w, false);
        expect.apply(&evs);
    }
    register(&r, 1, &p, true);
    for i in 0..60 {
        let (w, evs) = e.random_batch(&mut rng, 3);
        p.batch(w, i % 7 == 3 && i < 59);
        expect.apply(&evs);
    }
    r.wait_for("m", 1, p.last_seq.unwrap());
    expect.check(&r, "m", &[e.key]);
    // Eight batches were lost on the way and every answer is right: the
    // replays brought them (one replay may cover several losses).
    let f = r.feed("m", 1, 0);
    assert!(f["replays"].as_u64().unwrap() >= 1, "{f}");
    assert_eq!(f["resyncs"], 0, "{f}");
}

#[test]
fn a_short_replay_buffer_forces_a_resync() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "map", "int");
    let r = Router::start(args());
    register(&r, 1, &p, true);
    let mut e = Engine::new(1);
    let expect = Expect::new();
    let mut rng = 11u64;
    for _ in 0..10 {
        let (w, evs) = e.random_batch(&mut rng, 3);
        p.batch(w, false);
        expect.apply(&evs);
    }
    r.wait_for("m", 1, p.last_seq.unwrap());
    p.cmd(json!({"op": "buffer", "size": 2}));
    // Five batches lost; the engine keeps only the last two of them.
    let mut kept = Vec::new();
    for i in 0..5 {
        let (w, evs) = e.random_batch(&mut rng, 3);
        p.batch(w, true);
        if i >= 3 {
            kept.extend(evs);
        }
    }
    let (w, evs) = e.random_batch(&mut rng, 3);
    p.batch(w, false);
    expect.clear(e.key);
    expect.apply(&kept);
    expect.apply(&evs);
    r.wait_for("m", 1, p.last_seq.unwrap());
    expect.check(&r, "m", &[e.key]);
    let f = r.feed("m", 1, 0);
    assert_eq!(f["resyncs"], 1, "{f}");
}

#[test]
fn without_a_replay_endpoint_a_gap_resyncs() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "sglang", "int");
    let r = Router::start(args());
    register(&r, 1, &p, false);
    let mut e = Engine::new(1);
    let expect = Expect::new();
    let mut rng = 13u64;
    let (w, evs) = e.random_batch(&mut rng, 3);
    p.batch(w, false);
    expect.apply(&evs);
    r.wait_for("m", 1, p.last_seq.unwrap());
    let (w, _) = e.random_batch(&mut rng, 3);
    p.batch(w, true);
    let (w, evs) = e.random_batch(&mut rng, 3);
    p.batch(w, false);
    expect.clear(e.key);
    expect.apply(&evs);
    r.wait_for("m", 1, p.last_seq.unwrap());
    expect.check(&r, "m", &[e.key]);
    assert_eq!(r.feed("m", 1, 0)["resyncs"], 1);
}

#[test]
fn a_publisher_restart_clears_the_worker() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "array", "bytes");
    let r = Router::start(args());
    register(&r, 1, &p, true);
    let mut e = Engine::new(1);
    let expect = Expect::new();
    let mut rng = 17u64;
    for _ in 0..10 {
        let (w, evs) = e.random_batch(&mut rng, 4);
        p.batch(w, false);
        expect.apply(&evs);
    }
    r.wait_for("m", 1, p.last_seq.unwrap());
    assert!(r.feed("m", 1, 0)["blocks"].as_u64().unwrap() > 0);
    p.cmd(json!({"op": "restart"}));
    expect.clear(e.key);
    let mut e = Engine::new(1);
    for _ in 0..3 {
        let (w, evs) = e.random_batch(&mut rng, 4);
        p.batch(w, false);
        expect.apply(&evs);
    }
    r.wait_for("m", 1, 2);
    expect.check(&r, "m", &[e.key]);
    let f = r.feed("m", 1, 0);
    assert_eq!(f["restarts"], 1, "{f}");
}

#[test]
fn garbage_from_one_worker_harms_nothing_else() {
    let py = need_python!();
    let mut bad = Publisher::start(&py, "array", "int");
    let mut good = Publisher::start(&py, "map", "int");
    let r = Router::start(args());
    register(&r, 1, &bad, true);
    register(&r, 2, &good, true);
    let (mut eb, mut eg) = (Engine::new(1), Engine::new(2));
    let expect = Expect::new();
    let mut rng = 19u64;
    for i in 0..40 {
        let (w, evs) = eg.random_batch(&mut rng, 4);
        good.batch(w, false);
        expect.apply(&evs);
        match i % 4 {
            0 => {
                bad.cmd(json!({"op": "garbage", "what": "frames"}));
            }
            1 => {
                bad.cmd(json!({"op": "garbage", "what": "seq"}));
            }
            2 => {
                // An undecodable payload in sequence: counted and skipped.
                bad.cmd(json!({"op": "garbage", "what": "payload"}));
            }
            _ => {
                let (w, evs) = eb.random_batch(&mut rng, 2);
                bad.batch(w, false);
                expect.apply(&evs);
            }
        }
    }
    // A wrong block size is rejected, counted and shown.
    bad.batch(
        vec![json!({"kind": "stored", "hashes": [1], "parent": null, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 8})],
        false,
    );
    r.wait_for("m", 2, good.last_seq.unwrap());
    r.wait_for("m", 1, bad.last_seq.unwrap());
    expect.check(&r, "m", &[eb.key, eg.key]);
    let f = r.feed("m", 1, 0);
    assert!(f["decode_errors"].as_u64().unwrap() >= 30, "{f}");
    assert_eq!(f["block_size_mismatches"], 1, "{f}");
    assert_eq!(f["healthy"], false, "{f}");
    assert!(
        f["problem"].as_str().unwrap().contains("block_size 8"),
        "{f}"
    );
    let (_, ws) = r.get("/workers?model_name=m");
    let bad_info = ws
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["instance_id"] == 1)
        .unwrap();
    assert_eq!(bad_info["status"], "failed");
    let g = r.feed("m", 2, 0);
    assert_eq!(g["decode_errors"], 0, "{g}");
    assert_eq!(g["healthy"], true, "{g}");
    let metrics = r.text("/metrics");
    assert!(
        metrics.contains("kvrouter_decode_errors_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvrouter_worker_healthy{model=\"m\",worker_id=\"1\",dp_rank=\"0\"} 0")
    );
}

#[test]
fn unregistering_stops_the_feed_and_drops_the_blocks() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "array", "int");
    let r = Router::start(args());
    register(&r, 1, &p, true);
    let mut e = Engine::new(1);
    let (w, _) = e.store(1, 6).unwrap();
    p.batch(vec![w], false);
    r.wait_for("m", 1, 0);
    let (s, v) = r.post("/unregister", &json!({"instance_id": 1, "model_name": "m"}));
    assert_eq!(s, 200, "{v}");
    let (w, _) = e.store(2, 6).unwrap();
    p.batch(vec![w], false);
    std::thread::sleep(Duration::from_millis(100));
    let (s, _) = r.post(
        "/query",
        &json!({"token_ids": crate::support::prompt(1, 6), "model_name": "m"}),
    );
    assert_eq!(s, 404);
    let (s, _) = r.post("/unregister", &json!({"instance_id": 1, "model_name": "m"}));
    assert_eq!(s, 404);
}

#[test]
fn a_router_restarted_from_its_snapshot_and_a_replica_from_its_peer_answer_as_before() {
    let py = need_python!();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("router.json");
    let mut p = Publisher::start(&py, "array", "int");
    let mut e = Engine::new(1);
    let expect = Expect::new();
    let mut rng = 23u64;
    let mut a = args();
    a.snapshot = Some(snap.clone());
    {
        let r = Router::start(a.clone());
        register(&r, 1, &p, true);
        for _ in 0..20 {
            let (w, evs) = e.random_batch(&mut rng, 4);
            p.batch(w, false);
            expect.apply(&evs);
        }
        r.wait_for("m", 1, p.last_seq.unwrap());
        expect.check(&r, "m", &[e.key]);
    } // SIGTERM's path: graceful shutdown writes the snapshot.
    assert!(snap.exists());
    // Published while no router listens.
    for _ in 0..5 {
        let (w, evs) = e.random_batch(&mut rng, 4);
        p.batch(w, false);
        expect.apply(&evs);
    }
    let r = Router::start(a);
    // The worker came back from the snapshot, not from a flag or /register.
    let f = r.feed("m", 1, 0);
    assert_eq!(f["last_seq"], 19, "{f}");
    std::thread::sleep(Duration::from_millis(200));
    let (w, evs) = e.random_batch(&mut rng, 4);
    p.batch(w, false);
    expect.apply(&evs);
    r.wait_for("m", 1, p.last_seq.unwrap());
    expect.check(&r, "m", &[e.key]);
    let f = r.feed("m", 1, 0);
    assert_eq!(f["resyncs"], 0, "{f}");
    assert_eq!(
        f["replays"], 1,
        "it replayed from its snapshot's seq, not from 0: {f}"
    );
    let replays = p.cmd(json!({"op": "buffer", "size": 10000}))["replays"]
        .as_u64()
        .unwrap();
    // A new replica starts from this router's /dump and catches up.
    let mut c = args();
    c.peer = Some(r.base.clone());
    let replica = Router::start(c);
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let (w, evs) = e.random_batch(&mut rng, 4);
        p.batch(w, false);
        expect.apply(&evs);
    }
    replica.wait_for("m", 1, p.last_seq.unwrap());
    r.wait_for("m", 1, p.last_seq.unwrap());
    expect.check(&replica, "m", &[e.key]);
    expect.check(&r, "m", &[e.key]);
    let f = replica.feed("m", 1, 0);
    assert_eq!(f["resyncs"], 0, "{f}");
    let after = p.cmd(json!({"op": "buffer", "size": 10000}))["replays"]
        .as_u64()
        .unwrap();
    assert!(
        after <= replays + 1,
        "the replica replayed at most its gap: {replays} -> {after}"
    );
}

#[test]
fn a_batch_naming_another_rank_marks_the_worker() {
    let py = need_python!();
    let mut p = Publisher::start(&py, "map", "int");
    let r = Router::start(args());
    register(&r, 1, &p, true);
    let mut e = Engine::new(1);
    let (w, evs) = e.store(2, 4).unwrap();
    p.cmd(json!({"op": "batch", "events": [w], "dp_rank": 3}));
    r.wait_for("m", 1, 0);
    let expect = Expect::new();
    expect.apply(&[evs]);
    expect.check(&r, "m", &[e.key]);
    let f = r.feed("m", 1, 0);
    assert_eq!(f["healthy"], false, "{f}");
    assert!(f["problem"].as_str().unwrap().contains("rank 3"), "{f}");
}

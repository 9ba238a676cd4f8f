//! Replicas on a real `nats-server -js`: a relay router subscribed to the
//! independent Python publisher, replicas consuming the stream; crashes of
//! replicas and relays, a server restart and a frozen server, a replica
//! cut off past the stream's retention; the snapshot lease.
use std::time::{Duration, Instant};

use kvrouter::{RouterArgs, WorkerArg};
use serde_json::Value;

use crate::support::nats::{binary, Link, NatsServer};
use crate::support::{args, python, Engine, Expect, Publisher, Router};

fn replica_args(n: &NatsServer, id: &str, snapshot_every: u64) -> RouterArgs {
    let mut a = args();
    a.nats = Some(n.url());
    a.replica_id = Some(id.into());
    a.nats_snapshot_every = snapshot_every;
    a.nats_lease_ttl = Duration::from_secs(2);
    a
}

fn relay_args(n: &NatsServer, id: &str, p: &Publisher) -> RouterArgs {
    let mut a = replica_args(n, id, 0);
    a.workers = vec![WorkerArg {
        id: 1,
        dp_rank: 0,
        endpoint: Some(p.endpoint.clone()),
        replay: Some(p.replay.clone()),
        url: None,
    }];
    a
}

fn status(r: &Router) -> Value {
    r.get("/replica").1
}

/// Waits until every router has applied the stream's last message and,
/// in it, worker 1's batch `seq`.
fn converge(routers: &[&Router], seq: u64, within: Duration) {
    let t = Instant::now();
    loop {
        let s: Vec<Value> = routers.iter().map(|r| status(r)).collect();
        let done = s.iter().all(|x| {
            x["applied_seq"] == x["stream_last_seq"]
                && x["workers"].as_array().is_some_and(|w| {
                    w.iter()
                        .any(|w| w["instance_id"] == 1 && w["last_seq"] == seq)
                })
        });
        if done {
            return;
        }
        assert!(
            t.elapsed() < within,
            "replicas did not converge on seq {seq}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Nothing applied twice (a repeat would be skipped and counted as
/// stale) and no batch of the worker missing (a hole clears it).
fn exactly_once(r: &Router) {
    let st = status(r);
    assert_eq!(st["stale"], 0, "{st}");
    assert_eq!(st["worker_gaps"], 0, "{st}");
}

/// Publishes `n` random batches of worker 1 (into `exp` too).
/// Returns the last seq published.
fn publish(p: &mut Publisher, e: &mut Engine, exp: &Expect, rng: &mut u64, n: usize) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let (w, evs) = e.random_batch(rng, 4);
        last = p.batch(w, false);
        exp.apply(&evs);
    }
    last
}

/// `a` on a stream with room for a few dozen records: older ones go.
fn small(mut a: RouterArgs) -> RouterArgs {
    a.nats_max_bytes = 24 << 10;
    a
}

struct Setup {
    srv: NatsServer,
    p: Publisher,
    e: Engine,
    exp: Expect,
    rng: u64,
}

fn setup() -> Option<Setup> {
    let bin = binary()?;
    let py = python()?;
    Some(Setup {
        srv: NatsServer::start(bin),
        p: Publisher::start(&py, "array", "int"),
        e: Engine::new(1),
        exp: Expect::new(),
        rng: 0x9e37_79b9_7f4a_7c15,
    })
}

/// A relay and replica `a` (no snapshots), with `n` batches applied by both.
fn relay_and_replica(s: &mut Setup, n: usize) -> (Router, Router) {
    let relay = Router::start(relay_args(&s.srv, "relay", &s.p));
    let a = Router::start(replica_args(&s.srv, "a", 0));
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, n);
    converge(&[&relay, &a], seq, Duration::from_secs(20));
    (relay, a)
}

#[test]
fn a_replica_started_after_another_crashed_answers_as_the_survivor() {
    let Some(mut s) = setup() else { return };
    let relay = Router::start(relay_args(&s.srv, "relay", &s.p));
    let a = Router::start(replica_args(&s.srv, "a", 40));
    publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 120);
    // Killed while batches keep coming.
    a.kill();
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 120);
    let b = Router::start(replica_args(&s.srv, "b", 40));
    let t = Instant::now();
    converge(&[&relay, &b], seq, Duration::from_secs(20));
    eprintln!("new replica caught up in {:?}", t.elapsed());
    let key = s.e.key;
    s.exp.check(&relay, "m", &[key]);
    s.exp.check(&b, "m", &[key]);
    // It started from the snapshot the crashed replica wrote.
    let st = status(&b);
    assert!(st["snapshot_seq"].as_u64() > Some(0), "{st}");
    exactly_once(&b);
}

#[test]
fn a_server_restart_loses_and_doubles_nothing() {
    let Some(mut s) = setup() else { return };
    let (relay, a) = relay_and_replica(&mut s, 60);
    s.srv.stop();
    publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    s.srv.restart();
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    converge(&[&relay, &a], seq, Duration::from_secs(30));
    s.exp.check(&relay, "m", &[s.e.key]);
    s.exp.check(&a, "m", &[s.e.key]);
    exactly_once(&a);
}

#[test]
fn a_relay_restarted_after_a_crash_leaves_no_gap_and_no_duplicate() {
    let Some(mut s) = setup() else { return };
    let (relay, a) = relay_and_replica(&mut s, 60);
    relay.kill();
    // Heard by no relay: the engine's replay brings them back.
    publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    let relay = Router::start(relay_args(&s.srv, "relay", &s.p));
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    converge(&[&relay, &a], seq, Duration::from_secs(20));
    s.exp.check(&a, "m", &[s.e.key]);
    s.exp.check(&relay, "m", &[s.e.key]);
    exactly_once(&a);
}

#[test]
fn a_frozen_server_makes_replicas_unready_until_it_thaws() {
    let Some(mut s) = setup() else { return };
    let (relay, a) = relay_and_replica(&mut s, 40);
    assert_eq!(a.get("/ready").0, 200);
    s.srv.pause();
    let t = Instant::now();
    while a.get("/ready").0 != 503 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still ready with the server frozen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("unready {:?} after the freeze", t.elapsed());
    assert_eq!(status(&a)["reachable"], false);
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 20);
    s.srv.resume();
    converge(&[&relay, &a], seq, Duration::from_secs(30));
    let t = Instant::now();
    while a.get("/ready").0 != 200 {
        assert!(t.elapsed() < Duration::from_secs(10), "never ready again");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.exp.check(&a, "m", &[s.e.key]);
    s.exp.check(&relay, "m", &[s.e.key]);
}

#[test]
fn one_snapshot_writer_at_a_time_and_a_dead_ones_lease_passes_on() {
    let Some(mut s) = setup() else { return };
    let relay = Router::start(relay_args(&s.srv, "relay", &s.p));
    let a = Router::start(replica_args(&s.srv, "a", 10));
    let b = Router::start(replica_args(&s.srv, "b", 10));
    let leaders = |rs: &[&Router]| -> Vec<bool> {
        rs.iter()
            .map(|r| status(r)["snapshot_leader"] == true)
            .collect()
    };
    // Batches in rounds, the lease holders sampled in between.
    let mut seq = 0;
    for _ in 0..10 {
        seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 10);
        let l = leaders(&[&a, &b]);
        assert!(!(l[0] && l[1]), "two snapshot writers at once");
    }
    converge(&[&relay, &a, &b], seq, Duration::from_secs(20));
    let l = leaders(&[&a, &b]);
    assert!(l[0] ^ l[1], "one writer: {l:?}");
    let (dead, alive) = if l[0] { (a, b) } else { (b, a) };
    let written = status(&dead)["snapshot_seq"].as_u64().unwrap_or(0);
    assert!(status(&dead)["snapshots_written"].as_u64() > Some(0));
    assert_eq!(status(&alive)["snapshots_written"], 0);
    dead.kill();
    // The lease outlives its holder by at most its time to live (2 s).
    let t = Instant::now();
    while status(&alive)["snapshot_leader"] != true {
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "the lease never passed on"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("lease passed on {:?} after the holder died", t.elapsed());
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    converge(&[&relay, &alive], seq, Duration::from_secs(20));
    let t = Instant::now();
    while status(&alive)["snapshots_written"].as_u64() < Some(1) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the new writer wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // It went on past the dead writer's range, not over it.
    assert!(status(&alive)["snapshot_seq"].as_u64() > Some(written));
    s.exp.check(&alive, "m", &[s.e.key]);
}

#[test]
fn a_replica_behind_the_streams_retention_keeps_no_stale_block() {
    let Some(mut s) = setup() else { return };
    let relay = Router::start(small(relay_args(&s.srv, "relay", &s.p)));
    let a = Router::start(small(replica_args(&s.srv, "a", 10)));
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 60);
    converge(&[&relay, &a], seq, Duration::from_secs(20));
    // The snapshot writer goes; the stream moves on past its last snapshot.
    a.kill();
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 200);
    let b = Router::start(small(replica_args(&s.srv, "b", 0)));
    converge(&[&relay, &b], seq, Duration::from_secs(20));
    let st = status(&b);
    assert_eq!(st["gaps"], 1, "{st}");
    // It lost history, so it may hold less than the relay, never more.
    let key = s.e.key;
    for p in 0..24u32 {
        for blocks in [1usize, 3, 5, 8] {
            let body = serde_json::json!({"token_ids": crate::support::prompt(p, blocks), "model_name": "m"});
            let score = |r: &Router| {
                let (_, v) = r.post("/query", &body);
                v["scores"][key.worker_id.to_string()]["0"]
                    .as_u64()
                    .unwrap_or(0)
            };
            assert!(score(&b) <= score(&relay), "prompt {p} ({blocks} blocks)");
        }
    }
}

#[test]
fn a_replica_cut_off_past_the_retention_reloads_the_newest_snapshot() {
    let Some(mut s) = setup() else { return };
    let relay = Router::start(small(relay_args(&s.srv, "relay", &s.p)));
    // The snapshot writer, every 5 messages.
    let a = Router::start(small(replica_args(&s.srv, "a", 5)));
    let link = Link::start(&s.srv);
    let mut b_args = small(replica_args(&s.srv, "b", 0));
    b_args.nats = Some(link.url());
    let b = Router::start(b_args);
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 30);
    converge(&[&relay, &a, &b], seq, Duration::from_secs(20));
    let cut_at = status(&b)["applied_seq"].as_u64().unwrap_or(0);
    link.cut();
    let t = Instant::now();
    while b.get("/ready").0 != 503 {
        assert!(t.elapsed() < Duration::from_secs(10), "ready while cut off");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The stream moves on past everything b had (far more than the
    // 24 KiB it keeps), and a snapshots it.
    let mut seq = 0;
    for _ in 0..20 {
        seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 10);
        std::thread::sleep(Duration::from_millis(20));
    }
    converge(&[&relay, &a], seq, Duration::from_secs(20));
    let t = Instant::now();
    loop {
        let st = status(&a);
        let last = st["stream_last_seq"].as_u64().unwrap_or(0);
        if st["snapshot_seq"].as_u64().unwrap_or(0) + 5 >= last && last > cut_at + 5 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no recent snapshot: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    link.heal();
    converge(&[&relay, &a, &b], seq, Duration::from_secs(40));
    let st = status(&b);
    assert_eq!(st["gaps"], 1, "{st}");
    assert!(st["snapshot_seq"].as_u64() > Some(cut_at), "{st}");
    // Snapshot plus tail is the whole history: every answer exact.
    s.exp.check(&b, "m", &[s.e.key]);
    assert_eq!(b.get("/ready").0, 200);
}

#[test]
fn a_relay_only_router_publishes_and_refuses_queries() {
    let Some(mut s) = setup() else { return };
    let mut r = relay_args(&s.srv, "relay", &s.p);
    r.nats_relay_only = true;
    let relay = Router::start(r);
    let a = Router::start(replica_args(&s.srv, "a", 0));
    let seq = publish(&mut s.p, &mut s.e, &s.exp, &mut s.rng, 40);
    converge(&[&a], seq, Duration::from_secs(20));
    s.exp.check(&a, "m", &[s.e.key]);
    exactly_once(&a);
    let st = status(&relay);
    assert_eq!(st["relay_only"], true, "{st}");
    assert_eq!(st["applied_seq"], 0, "it applies nothing: {st}");
    assert_eq!(relay.get("/ready").0, 200);
    let q = serde_json::json!({"token_ids": crate::support::prompt(0, 2), "model_name": "m"});
    let (code, body) = relay.post("/query", &q);
    assert_eq!(code, 503, "{body}");
    assert!(body.to_string().contains("relay-only"), "{body}");
    assert_eq!(relay.get("/dump").0, 503);
    // A relay-only router serves no gateway, and needs NATS.
    let mut g = relay_args(&s.srv, "g", &s.p);
    g.nats_relay_only = true;
    g.gateway = true;
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let n = rt
        .block_on(kvrouter::replica::Nats::connect(&g))
        .expect("connect");
    let e = rt
        .block_on(async {
            tokio::task::spawn_blocking(move || kvrouter::Service::with_nats(g, Some(n))).await
        })
        .expect("join")
        .err()
        .expect("refused");
    assert!(e.to_string().contains("--gateway"), "{e}");
    let mut lone = crate::support::args();
    lone.nats_relay_only = true;
    let e = kvrouter::Service::new(lone).err().expect("refused");
    assert!(e.to_string().contains("needs --nats"), "{e}");
}

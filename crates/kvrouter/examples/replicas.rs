//! Replicas on NATS, measured: `arbor router` processes and a real
//! `nats-server -js` on loopback (started here, on free ports, in a
//! temporary directory).
//!
//! ```sh
//! cargo build --release -p arbor
//! cargo run --release -p kvrouter --example replicas -- throughput target/release/arbor [STORES_PER_BATCH [EVENTS]]
//! cargo run --release -p kvrouter --example replicas -- catchup target/release/arbor [BLOCKS]
//! ```
//!
//! `throughput`: 8 in-process ZMQ publishers send EVENTS (default 80,000)
//! 16-block stores, STORES_PER_BATCH (default 1) a batch, to one router
//! (direct ingestion), then the same
//! to a relay with two replicas, and to a relay-only router
//! (`--nats-relay-only`) with two replicas; events a second until every
//! router has applied the last batch.
//!
//! `catchup`: a snapshot of BLOCKS (worker, block) pairs (default 10M; 16
//! workers, chains of 64 blocks, a fifth of them shared by every worker)
//! and a tail of 10,000 batches are put into the stream; a new replica is
//! started and timed until it has applied the tail; its peak resident
//! memory is read from /proc.
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, object_store, stream};
use kvindex::{ExternalHash, KvEvent, KvEventData, LocalHash, StoredBlock, WorkerKey};
use kvrouter::record::{
    Body, EngineBatch, Record, Snapshot, SnapshotModel, SnapshotWorker, Subject, WorkerInfo,
};
use kvrouter::wire::{encode_batch, WireEvent};
use serde_json::Value;

const BS: u32 = 16;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nats_server(dir: &std::path::Path) -> (Proc, String) {
    let port = free_port();
    let child = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server (apt-get install nats-server)");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    (Proc(child), format!("nats://127.0.0.1:{port}"))
}

fn router(arbor: &str, args: &[String]) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(arbor)
        .args(["router", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--model", "m", "--block-size", &BS.to_string()])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start arbor router");
    let base = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    while reqwest::blocking::get(format!("{base}/health")).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "router never answered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    (Proc(child), base)
}

fn get(url: &str) -> Value {
    reqwest::blocking::get(url)
        .and_then(|r| r.json())
        .unwrap_or(Value::Null)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// User plus system CPU time of a process so far, seconds.
fn cpu_secs(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Publisher `p`'s batch `i`: `n` stores of 16 blocks, each a chain of its own.
fn wire_batch(p: u64, i: u64, n: u64) -> Vec<u8> {
    let evs: Vec<WireEvent> = (0..n)
        .map(|k| {
            let base = (p << 40) | ((i * n + k) << 8);
            WireEvent::Stored {
                block_hashes: (0..16).map(|j| mix(base + j)).collect(),
                parent: None,
                token_ids: (0..16 * BS)
                    .map(|t| (mix(base ^ u64::from(t)) % 50_000) as u32)
                    .collect(),
                block_size: u64::from(BS),
                medium: None,
                lora_name: None,
            }
        })
        .collect();
    encode_batch(i as f64, &evs, None)
}

fn throughput(arbor: &str, per_batch: u64, events: u64) {
    const PUBS: u64 = 8;
    let per_batch = per_batch.clamp(1, 1000);
    let batches = events / PUBS / per_batch;
    let ctx = zmq::Context::new();
    let mut pubs = Vec::new();
    let mut workers = Vec::new();
    for p in 0..PUBS {
        let s = ctx.socket(zmq::PUB).expect("a PUB socket");
        s.set_sndhwm(0).expect("no send limit");
        let port = free_port();
        s.bind(&format!("tcp://127.0.0.1:{port}")).expect("bind");
        pubs.push(s);
        workers.push(format!("--worker={p}=tcp://127.0.0.1:{port}"));
    }
    let payloads: Vec<Vec<Vec<u8>>> = (0..PUBS)
        .map(|p| (0..batches).map(|i| wire_batch(p, i, per_batch)).collect())
        .collect();
    let send = |pubs: &[zmq::Socket]| {
        for i in 0..batches {
            for (p, s) in pubs.iter().enumerate() {
                s.send_multipart(
                    [
                        &b"kv"[..],
                        &i.to_be_bytes()[..],
                        &payloads[p][i as usize][..],
                    ],
                    0,
                )
                .expect("send");
            }
        }
    };
    let events = (PUBS * batches * per_batch) as f64;
    println!("{PUBS} publishers, {batches} batches each, {per_batch} stores of 16 blocks a batch");
    // Direct: one router subscribed to every publisher.
    let direct = {
        let (r, base) = router(arbor, &workers);
        std::thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        send(&pubs);
        loop {
            let ws = get(&format!("{base}/workers"));
            let done = ws.as_array().is_some_and(|a| {
                a.len() as u64 == PUBS
                    && a.iter().all(|w| w["feeds"]["0"]["last_seq"] == batches - 1)
            });
            if done {
                break (t.elapsed(), cpu_secs(r.0.id()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let (direct, direct_cpu) = direct;
    println!(
        "direct ZMQ ingestion: {:.0} events/s ({:.2} M block ops/s), {:?}, router CPU {direct_cpu:.2} s",
        events / direct.as_secs_f64(),
        events * 16.0 / direct.as_secs_f64() / 1e6,
        direct
    );
    for relay_only in [false, true] {
        let relayed = relayed(arbor, &workers, relay_only, PUBS, batches, || send(&pubs));
        println!(
            "relay{} + 2 replicas: {:.0} events/s ({:.2} M block ops/s), {:?}: {:.2}x of direct",
            if relay_only {
                " (--nats-relay-only)"
            } else {
                ""
            },
            events / relayed.as_secs_f64(),
            events * 16.0 / relayed.as_secs_f64() / 1e6,
            relayed,
            direct.as_secs_f64() / relayed.as_secs_f64()
        );
    }
}

/// The same batches through a relay (relay-only or also a replica) into a
/// fresh stream, and two replicas: the time until both have applied all.
fn relayed(
    arbor: &str,
    workers: &[String],
    relay_only: bool,
    pubs: u64,
    batches: u64,
    send: impl FnOnce(),
) -> Duration {
    let dir = tempfile::tempdir().expect("a store directory");
    let (srv, url) = nats_server(dir.path());
    let nats = |id: &str| {
        vec![
            format!("--nats={url}"),
            format!("--replica-id={id}"),
            "--nats-snapshot-every=0".into(),
        ]
    };
    let (a_proc, a) = router(arbor, &nats("a"));
    let (b_proc, b) = router(arbor, &nats("b"));
    let mut relay_args = nats("relay");
    relay_args.extend(workers.iter().cloned());
    if relay_only {
        relay_args.push("--nats-relay-only".into());
    }
    let (relay, _) = router(arbor, &relay_args);
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    send();
    let mut first = None;
    let elapsed = loop {
        let st: Vec<Value> = [&a, &b]
            .iter()
            .map(|r| get(&format!("{r}/replica")))
            .collect();
        let all_in = |s: &Value| {
            s["workers"].as_array().is_some_and(|w| {
                w.len() as u64 == pubs && w.iter().all(|w| w["last_seq"] == batches - 1)
            })
        };
        if first.is_none() && st.iter().any(all_in) {
            first = Some((t.elapsed(), st[0]["applied_seq"].clone()));
        }
        if st.iter().all(all_in) {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "replicas never caught up"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    println!(
        "  first replica done (elapsed, stream messages) {first:?}; CPU seconds: relay {:.2}, replicas {:.2} and {:.2}, nats-server {:.2}",
        cpu_secs(relay.0.id()),
        cpu_secs(a_proc.0.id()),
        cpu_secs(b_proc.0.id()),
        cpu_secs(srv.0.id())
    );
    elapsed
}

fn catchup(arbor: &str, blocks: u64) {
    const WORKERS: u64 = 16;
    const CHAIN: u64 = 64;
    const TAIL: u64 = 10_000;
    let dir = tempfile::tempdir().expect("a store directory");
    let (_srv, url) = nats_server(dir.path());
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let t = Instant::now();
    let chains = blocks / WORKERS / CHAIN;
    let mut events = Vec::new();
    for w in 0..WORKERS {
        for c in 0..chains {
            // A fifth of the chains are every worker's (shared prefixes).
            let g = if c % 5 == 0 { c } else { (w + 1) << 32 | c };
            events.push(KvEvent {
                worker: WorkerKey::new(w, 0),
                event_id: 0,
                data: KvEventData::Stored {
                    parent: None,
                    blocks: (0..CHAIN)
                        .map(|j| StoredBlock {
                            local: LocalHash(mix(g << 8 | j)),
                            external: ExternalHash(mix((w << 48) ^ (c << 8) ^ j ^ 0x5555)),
                        })
                        .collect(),
                },
            });
        }
    }
    let snap = Snapshot {
        stream_seq: 0,
        models: vec![SnapshotModel {
            name: "m".into(),
            block_size: BS,
            workers: (0..WORKERS)
                .map(|w| SnapshotWorker {
                    key: WorkerKey::new(w, 0),
                    info: WorkerInfo {
                        block_size: BS,
                        ..Default::default()
                    },
                    last_seq: Some(999),
                })
                .collect(),
            events,
        }],
    };
    let bytes = snap.encode();
    drop(snap);
    println!(
        "snapshot: {} blocks, {} bytes, built in {:?}",
        chains * WORKERS * CHAIN,
        bytes.len(),
        t.elapsed()
    );
    rt.block_on(async {
        let js = jetstream::new(async_nats::connect(url.as_str()).await.expect("connect"));
        js.get_or_create_stream(stream::Config {
            name: "ARBOR_KV".into(),
            subjects: vec!["kv.ARBOR_KV.>".into()],
            max_age: Duration::from_secs(3600),
            max_bytes: 1 << 30,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("the stream");
        let store = js
            .create_object_store(object_store::Config {
                bucket: "ARBOR_KV_snapshots".into(),
                ..Default::default()
            })
            .await
            .expect("the snapshot bucket");
        let meta = object_store::ObjectMetadata {
            name: format!("snapshot-{:020}", 0),
            chunk_size: Some(1 << 20),
            ..Default::default()
        };
        store
            .put(meta, &mut bytes.as_slice())
            .await
            .expect("put the snapshot");
        let mut acks = Vec::new();
        for i in 0..TAIL {
            let w = i % WORKERS;
            let seq = 1000 + i / WORKERS;
            let rec = Record {
                subject: Subject {
                    model: "m".into(),
                    key: WorkerKey::new(w, 0),
                },
                body: Body::Batches {
                    block_size: BS,
                    batches: vec![EngineBatch {
                        seq,
                        ts: 0.0,
                        events: vec![KvEventData::Stored {
                            parent: None,
                            blocks: (0..16)
                                .map(|j| StoredBlock {
                                    local: LocalHash(mix(i << 8 | j | 1 << 60)),
                                    external: ExternalHash(mix(i << 8 | j | 1 << 61)),
                                })
                                .collect(),
                        }],
                    }],
                },
            };
            acks.push(
                js.publish(format!("kv.ARBOR_KV.m.{w}.0"), rec.encode().into())
                    .await
                    .expect("publish"),
            );
            // The client allows 5,000 acknowledgements outstanding.
            if acks.len() == 1000 {
                for a in acks.drain(..) {
                    a.await.expect("acknowledged");
                }
            }
        }
        for a in acks {
            a.await.expect("acknowledged");
        }
    });
    drop(bytes);
    let t = Instant::now();
    let (r, base) = router(
        arbor,
        &[format!("--nats={url}"), "--nats-snapshot-every=0".into()],
    );
    let pid = r.0.id();
    loop {
        let s = get(&format!("{base}/replica"));
        if s["applied_seq"] == TAIL && s["ready"] == true {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "never caught up: {s}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = t.elapsed();
    let blocks_held: u64 = get(&format!("{base}/workers"))
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|w| w["feeds"]["0"]["blocks"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    println!(
        "new replica: caught up (snapshot + {TAIL} batches) in {took:?}; {blocks_held} blocks held; peak resident {} MiB",
        vm_hwm_kib(pid) / 1024
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (args.first().map(String::as_str), args.get(1)) {
        (Some("throughput"), Some(arbor)) => {
            let n = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
            throughput(arbor, n(2, 1), n(3, 80_000))
        }
        (Some("catchup"), Some(arbor)) => catchup(
            arbor,
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(10_000_000),
        ),
        _ => eprintln!(
            "usage: replicas throughput ARBOR [STORES_PER_BATCH [EVENTS]] | catchup ARBOR [BLOCKS]"
        ),
    }
}

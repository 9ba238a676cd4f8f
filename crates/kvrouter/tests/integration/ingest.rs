//! Ingest from many engines that each publish now and then: every batch
//! is applied promptly, whichever of an ingest thread's sockets it comes
//! on (the threads wait on the sockets' notification descriptors, which
//! ZMQ signals on changes only; a lost signal would show here as a batch
//! applied only at the next sweep, 100 ms later).

use std::time::{Duration, Instant};

use crate::support::{args, Router, BS};
use kvrouter::wire::{encode_batch, WireEvent};
use serde_json::json;

#[test]
fn batches_from_many_quiet_publishers_apply_promptly() {
    const ENGINES: usize = 48;
    const PROBES: usize = 120;
    let ctx = zmq::Context::new();
    let r = Router::start(args());
    let mut pubs = Vec::new();
    for id in 0..ENGINES {
        let s = ctx.socket(zmq::PUB).expect("a PUB socket");
        s.bind("tcp://127.0.0.1:*").expect("bind");
        let ep = s.get_last_endpoint().expect("endpoint").expect("utf-8");
        let (st, v) = r.post(
            "/register",
            &json!({"instance_id": id, "endpoint": ep, "model_name": "m", "block_size": BS}),
        );
        assert_eq!(st, 201, "{v}");
        pubs.push(s);
    }
    // Let every subscription connect: a batch sent before is not seen.
    std::thread::sleep(Duration::from_millis(500));
    let mut seqs = [0u64; ENGINES];
    let mut lags = Vec::new();
    for p in 0..PROBES {
        let k = p * 7 % ENGINES;
        let tokens: Vec<u32> = (0..BS as u32)
            .map(|j| 500_000 + (p * BS) as u32 + j)
            .collect();
        let batch = encode_batch(
            0.0,
            &[WireEvent::Stored {
                block_hashes: vec![p as u64 + 1],
                parent: None,
                token_ids: tokens.clone(),
                block_size: BS as u64,
                medium: None,
                lora_name: None,
            }],
            None,
        );
        let t0 = Instant::now();
        pubs[k]
            .send_multipart([&b""[..], &seqs[k].to_be_bytes()[..], &batch[..]], 0)
            .expect("send");
        seqs[k] += 1;
        loop {
            let (st, v) = r.post("/query", &json!({"token_ids": tokens, "model_name": "m"}));
            assert_eq!(st, 200, "{v}");
            if v["scores"][k.to_string()]["0"] == BS {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "probe {p} never applied: {v}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        lags.push(t0.elapsed());
        // Quiet between batches: the ingest threads go back to waiting.
        std::thread::sleep(Duration::from_millis(3));
    }
    lags.sort();
    let p90 = lags[PROBES * 9 / 10];
    assert!(
        p90 < Duration::from_millis(50),
        "p90 {p90:?}, slowest {:?}",
        lags.last()
    );
}

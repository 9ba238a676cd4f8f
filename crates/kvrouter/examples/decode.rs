//! What decoding one engine batch costs: the in-place decoder against the
//! decoder over `rmpv` values (its oracle), on a vLLM `BlockStored` batch of
//! `BLOCKS` blocks of 16 tokens.
//!
//! `cargo run --release -p kvrouter --example decode -- [BLOCKS] [ROUNDS]`
use std::time::Instant;

use kvrouter::wire::{decode_batch, encode_batch, reference, WireEvent};

fn main() {
    let mut args = std::env::args().skip(1);
    let parse = |a: Option<String>, d: usize| -> usize {
        match a {
            None => d,
            Some(s) => s.parse().unwrap_or_else(|_| {
                eprintln!("not a count: {s:?}");
                std::process::exit(2)
            }),
        }
    };
    let blocks = parse(args.next(), 128);
    let rounds = parse(args.next(), 2000).max(1);
    let ev = WireEvent::Stored {
        block_hashes: (0..blocks as u64).map(|i| i * 7919 + (1 << 40)).collect(),
        parent: Some(5),
        // Ids spread over a 150k vocabulary as real text's are: 1-, 3- and
        // 5-byte encodings mixed at random.
        token_ids: (0..blocks as u64 * 16)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32 % 150_000)
            .collect(),
        block_size: 16,
        medium: Some("GPU".into()),
        lora_name: None,
    };
    let b = encode_batch(1.0, &[ev], None);
    for _ in 0..3 {
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..rounds {
            n += decode_batch(&b).map_or(0, |x| x.events.len());
        }
        let fast = t.elapsed() / rounds as u32;
        let t = Instant::now();
        for _ in 0..rounds {
            n += reference::decode_batch(&b).map_or(0, |x| x.events.len());
        }
        let slow = t.elapsed() / rounds as u32;
        assert_eq!(n, 2 * rounds);
        println!(
            "{} bytes, {blocks} blocks: in place {fast:?} per batch, over rmpv values {slow:?}",
            b.len()
        );
    }
}

//! The router's decoder of engine event batches under coverage-guided
//! fuzzing: any payload, well formed msgpack or not, decodes to a batch or
//! a typed error without panicking, and every decoded event converts to an
//! index event, a skip or a typed rejection. A decoded batch re-encoded in
//! vLLM's array form decodes to the same events.
#![no_main]

use kvrouter::convert::Converter;
use kvrouter::wire::{decode_batch, WireEvent};
use libfuzzer_sys::fuzz_target;
use rmpv::Value;

fn encode(ev: &WireEvent) -> Option<Value> {
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&x| Value::from(x)).collect());
    let opt_str = |s: &Option<String>| s.as_deref().map_or(Value::Nil, Value::from);
    Some(match ev {
        WireEvent::Stored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            medium,
            lora_name,
        } => Value::Array(vec![
            Value::from("BlockStored"),
            hashes(block_hashes),
            parent.map_or(Value::Nil, Value::from),
            Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
            Value::from(*block_size),
            Value::Nil,
            opt_str(medium),
            opt_str(lora_name),
        ]),
        WireEvent::Removed {
            block_hashes,
            medium,
        } => Value::Array(vec![
            Value::from("BlockRemoved"),
            hashes(block_hashes),
            opt_str(medium),
        ]),
        WireEvent::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        WireEvent::Unknown { .. } | WireEvent::Invalid { .. } => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let conv = Converter {
        block_size: 4,
        extra_media: vec!["CPU".into()],
        max_tokens: 1 << 16,
    };
    for ev in &batch.events {
        let _ = conv.convert(ev);
    }
    let kept: Vec<WireEvent> = batch
        .events
        .iter()
        .filter(|e| encode(e).is_some())
        .cloned()
        .collect();
    let env = Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(kept.iter().filter_map(encode).collect()),
        batch.dp_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &env).expect("encode to a vector");
    let again = decode_batch(&bytes).expect("a re-encoded batch decodes");
    assert_eq!(again.events, kept);
    assert_eq!(again.dp_rank, batch.dp_rank);
});

//! The router's decoder of engine event batches under coverage-guided
//! fuzzing: any payload, well formed msgpack or not, decodes to a batch or
//! a typed error without panicking, and every decoded event converts to an
//! index event, a skip or a typed rejection. The in-place decoder answers
//! as the decoder over `rmpv` values does, and a decoded batch re-encoded
//! in vLLM's array form decodes to the same events.
#![no_main]

use kvrouter::convert::Converter;
use kvrouter::wire::{decode_batch, encode_batch, WireEvent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let fast = decode_batch(data);
    let slow = kvrouter::wire::reference::decode_batch(data);
    assert_eq!(fast.is_ok(), slow.is_ok(), "{fast:?} vs {slow:?}");
    let Ok(batch) = fast else {
        return;
    };
    let slow = slow.expect("checked");
    assert_eq!(batch.events, slow.events);
    assert_eq!(batch.dp_rank, slow.dp_rank);
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
        .filter(|e| !matches!(e, WireEvent::Unknown { .. } | WireEvent::Invalid { .. }))
        .cloned()
        .collect();
    let again = decode_batch(&encode_batch(batch.ts, &batch.events, batch.dp_rank))
        .expect("a re-encoded batch decodes");
    assert_eq!(again.events, kept);
    assert_eq!(again.dp_rank, batch.dp_rank);
});

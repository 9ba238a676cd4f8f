//! kvreplay's trace path under coverage-guided fuzzing: arbitrary bytes as
//! a Mooncake JSONL trace, then the scaling knobs (any values) that turn it
//! into a workload. A malformed line or inconsistent knobs must come back as
//! a typed error, never as a panic or an allocation beyond the limit; a
//! workload that does come back must be sorted by arrival and hold what
//! the knobs promise.
#![no_main]

use kvreplay::trace::{parse_trace, TraceScaling, MAX_SCALED_BLOCKS, MAX_SCALED_REQUESTS};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn run(u: &mut Unstructured) -> Result<()> {
    let scaling = TraceScaling {
        length_factor: u.arbitrary::<u32>()? as usize,
        duplication_factor: u.arbitrary::<u32>()? as usize,
        trace_block_size: u.arbitrary::<u32>()? as usize,
        block_size: u.arbitrary::<u32>()? as usize,
    };
    let skip = u.arbitrary::<bool>()?;
    let text = u.bytes(u.len())?;
    let Ok(parsed) = parse_trace(std::io::Cursor::new(text), skip) else {
        return Ok(());
    };
    for r in &parsed.records {
        assert!(r.timestamp.is_finite() && r.timestamp >= 0.0);
    }
    // What the knobs ask for: past the library's limits (or overflowing)
    // it must refuse without allocating; within them, but too large for a
    // fuzzing run's memory, it is not run.
    let dup = scaling.duplication_factor as u64;
    let ids: u64 = parsed.records.iter().map(|r| r.hash_ids.len() as u64).sum();
    let k = scaling.blocks_per_id();
    let blocks = k
        .as_ref()
        .ok()
        .and_then(|k| ids.checked_mul(*k)?.checked_mul(dup));
    let requests = (parsed.records.len() as u64).checked_mul(dup);
    let (Some(b), Some(n)) = (blocks, requests) else {
        assert!(scaling.apply("fuzz", &parsed.records).is_err());
        return Ok(());
    };
    if b > MAX_SCALED_BLOCKS || n > MAX_SCALED_REQUESTS {
        assert!(scaling.apply("fuzz", &parsed.records).is_err());
        return Ok(());
    }
    if b > 1 << 20 || n > 1 << 16 {
        return Ok(());
    }
    let Ok(w) = scaling.apply("fuzz", &parsed.records) else {
        return Ok(());
    };
    assert_eq!(w.requests.len() as u64, n);
    assert!(w
        .requests
        .windows(2)
        .all(|p| p[0].arrival_us <= p[1].arrival_us));
    assert_eq!(w.total_blocks(), b);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

//! kvreplay's synthetic generator under coverage-guided fuzzing: any
//! configuration (floats of every bit pattern, zero and huge sizes) is
//! either refused by `validate` with a typed error or generates a
//! workload sorted by arrival whose requests hold one block id per full
//! block of their prompt.
#![no_main]

use kvreplay::synth::{generate, SynthConfig};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn run(u: &mut Unstructured) -> Result<()> {
    let cfg = SynthConfig {
        seed: u.arbitrary()?,
        duration_s: u.arbitrary()?,
        session_rate: u.arbitrary()?,
        mean_turns: u.arbitrary()?,
        think_time_s: u.arbitrary()?,
        system_prompts: u.arbitrary::<u32>()? as usize,
        system_prompt_tokens: u.arbitrary()?,
        zipf_s: u.arbitrary()?,
        user_tokens: u.arbitrary()?,
        output_tokens: u.arbitrary()?,
        block_size: u.arbitrary::<u16>()? as usize,
    };
    if cfg.validate().is_err() {
        assert!(generate(&cfg).is_err());
        return Ok(());
    }
    // Accepted, but only small ones are generated here (the generator's
    // own bounds allow gigabytes).
    let requests = cfg.session_rate * cfg.duration_s * cfg.mean_turns;
    if requests > 2000.0 || cfg.estimated_blocks() > f64::from(1 << 18) {
        return Ok(());
    }
    if cfg.system_prompts > 1 << 16 {
        return Ok(());
    }
    let s = generate(&cfg).expect("validated");
    let w = &s.workload;
    assert_eq!(s.request_session.len(), w.requests.len());
    assert!(w
        .requests
        .windows(2)
        .all(|p| p[0].arrival_us <= p[1].arrival_us));
    for r in &w.requests {
        if r.input_tokens < u32::MAX {
            assert_eq!(r.blocks.len(), r.input_tokens as usize / cfg.block_size);
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

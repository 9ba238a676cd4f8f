//! The replicas' stream records and snapshots under coverage-guided
//! fuzzing: any bytes decode to a value or a typed error, never a panic
//! or an allocation past the input, and whatever decodes encodes back to
//! the same bytes.
#![no_main]

use kvrouter::record::{Record, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Record::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if let Ok(s) = Snapshot::decode(data) {
        assert_eq!(s.encode(), data);
    }
});

//! `kvroute`: where to send an LLM request, given which workers hold its
//! prompt's prefix and how busy each one is.
//!
//! No I/O and no clocks of its own (callers pass the time), so the same
//! code decides in the simulator (`kvreplay`) and in the router service
//! (`kvrouter`):
//!
//! * [`policy`]: the routing policies (random, round-robin, least-loaded,
//!   Dynamo's KV-aware cost, and our `kv-balanced`) behind one [`Router`].
//! * [`load`]: the router's own in-flight accounting ([`LoadTracker`]),
//!   which turns requests routed and completed into the [`WorkerLoad`]
//!   each policy reads.
//!
//! ```
//! use kvroute::{Balance, KvCost, LoadTracker, PolicyKind, Router};
//! let mut router = Router::new(PolicyKind::KvAware, KvCost::default(), Balance::default(), 7);
//! let mut loads = LoadTracker::new();
//! let seq = [11, 12, 13, 14];
//! let workers = ["a", "b"];
//! let overlaps = [3, 0]; // "a" holds the first three blocks
//! let l: Vec<_> = workers.iter().map(|w| loads.load(w, &seq)).collect();
//! let w = router.choose(0, seq.len() as u64, &l, &overlaps);
//! assert_eq!(workers[w], "a");
//! loads.start("req-1", workers[w], &seq, overlaps[w], 0, 60_000_000).unwrap();
//! assert_eq!(loads.load(&"a", &seq).active_requests, 1);
//! assert_eq!(loads.complete("req-1"), Some("a"));
//! ```
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

pub mod load;
pub mod policy;

pub use load::{DuplicateRequest, LoadTracker};
pub use policy::{Balance, KvCost, PolicyKind, Router, UnknownPolicy, WorkerLoad};

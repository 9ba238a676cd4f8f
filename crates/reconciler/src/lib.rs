//! `reconciler`: keeps an external system in step with a [`statedb`] table.
//!
//! Each object of the table carries a [`Status`]. Writers store a changed
//! object as [`Status::pending`]; a [`Reconciler`] follows the table's
//! change stream and, in rounds, runs its [`Operations`] (or
//! [`AsyncOperations`]) on the pending and the deleted objects, then writes
//! each outcome back as `Done` or `Error`:
//!
//! * rounds take at most [`Config::round_size`] objects, in revision order,
//!   and are rate limited ([`Config::round_rate`]); the operations run
//!   without any table lock, and a round's statuses commit in one write
//!   transaction, by compare-and-swap on the revision reconciled;
//! * failures are retried with exponential backoff and jitter
//!   ([`Config::retry_min`] to [`Config::retry_max`]); a newer version of
//!   an object replaces its retry;
//! * once the table is initialized, [`Operations::prune`] removes what is
//!   outside but not desired: then, every [`Config::prune_interval`], and on
//!   [`Reconciler::trigger_prune`];
//! * objects done longer ago than [`Config::refresh_interval`] are marked
//!   refreshing and updated again;
//! * [`Reconciler::wait_until_reconciled`] waits for a revision to be done,
//!   [`Reconciler::health`] reports, and figures go to the `metrics` facade
//!   ([`mod@metrics`]).
//!
//! Time comes from a [`Clock`]: [`SystemClock`] in production,
//! [`ManualClock`] in tests. `docs/design.md` describes the loop.
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]

mod clock;
mod config;
mod executor;
mod health;
mod limiter;
pub mod metrics;
mod operations;
mod reconciler;
mod retry;
mod round;
mod status;
mod target;

pub use crate::clock::{Clock, ManualClock, Sleep, SystemClock};
pub use crate::config::{Config, ConfigError, RateLimit};
pub use crate::health::Health;
pub use crate::operations::{AsyncOperations, BatchEntry, OpError, Operations};
pub use crate::reconciler::{Reconciler, StartError, WaitError};
pub use crate::status::{Status, StatusKind, StatusSet, Timestamp};
pub use crate::target::{ObjectKey, Target};

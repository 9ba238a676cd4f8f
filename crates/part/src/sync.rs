//! Atomics and the mutex, from loom when model checking (`--cfg loom`), else from std.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;

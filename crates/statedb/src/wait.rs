//! Spin-then-block waiting on a [`Watch`], for latency-sensitive consumers.
//!
//! Blocking on a watch parks the thread; being woken costs a futex wake and
//! a reschedule (several µs, far more on a loaded machine). A consumer that
//! expects the next change soon can poll the watch for a short while first.

use std::time::{Duration, Instant};

use part::Watch;

/// Waits for `watch` to fire: polls it for up to `spin` (yielding the CPU
/// between polls), then blocks for the rest of `timeout`. True if it fired.
pub fn wait_spin(watch: &Watch, spin: Duration, timeout: Duration) -> bool {
    let start = Instant::now();
    let spin = spin.min(timeout);
    let mut polls = 0u32;
    while !watch.is_closed() {
        if polls % 64 == 63 && start.elapsed() >= spin {
            let left = timeout.saturating_sub(start.elapsed());
            return watch.wait_timeout(left);
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(16) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_and_sees_closed() {
        let db = crate::Db::with_options(crate::DbOptions {
            gc_interval: None,
            ..Default::default()
        });
        let id = crate::Index::unique("id", |x: &u32| *x);
        let t = db.create_table("t", &id, &[]).unwrap();
        let r = db.read_txn();
        let (_, w) = t.all_watch(&r).unwrap();
        let t0 = Instant::now();
        assert!(!wait_spin(
            &w,
            Duration::from_millis(1),
            Duration::from_millis(5)
        ));
        assert!(t0.elapsed() >= Duration::from_millis(5));
        let mut tx = db.write_txn(&[&t]).unwrap();
        t.insert(&mut tx, 1).unwrap();
        tx.commit().unwrap();
        assert!(wait_spin(
            &w,
            Duration::from_millis(1),
            Duration::from_secs(1)
        ));
    }
}

//! The gateway's concurrency limit: at most `running` requests at once,
//! at most `queued` more waiting (each up to a timeout) for a slot; beyond
//! that a request is refused at once, so a burst cannot pile up unbounded
//! work or memory in the router.
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Every slot is taken and the queue is full.
    #[error("{running} requests running and {queued} queued (--max-concurrent-requests, --max-queued-requests)")]
    QueueFull {
        /// The running limit.
        running: usize,
        /// The queue limit.
        queued: usize,
    },
    /// The request waited its whole queue timeout.
    #[error("no slot within the queue timeout of {0:?} (--queue-timeout)")]
    Timeout(Duration),
}

/// A concurrency limit with a bounded wait queue.
#[derive(Debug)]
pub struct Limit {
    slots: Arc<Semaphore>,
    running: usize,
    max_queued: usize,
    queued: AtomicUsize,
    timeout: Duration,
}

/// A slot, released when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// Counts a waiter in the queue until dropped (also when the waiting
/// request is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Limit {
    /// `running` slots (at least one), `queued` waiters, each waiting up
    /// to `timeout`.
    pub fn new(running: usize, queued: usize, timeout: Duration) -> Self {
        let running = running.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(running)),
            running,
            max_queued: queued,
            queued: AtomicUsize::new(0),
            timeout,
        }
    }

    /// A slot now, or after waiting in the queue.
    pub async fn acquire(&self) -> Result<Slot, LimitError> {
        if let Ok(p) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(Slot { _permit: p });
        }
        let full = LimitError::QueueFull {
            running: self.running,
            queued: self.max_queued,
        };
        // Reserve a place in the queue, or refuse.
        let mut n = self.queued.load(Relaxed);
        loop {
            if n >= self.max_queued {
                return Err(full);
            }
            match self
                .queued
                .compare_exchange_weak(n, n + 1, Relaxed, Relaxed)
            {
                Ok(_) => break,
                Err(v) => n = v,
            }
        }
        let _waiting = Waiting(&self.queued);
        match tokio::time::timeout(self.timeout, Arc::clone(&self.slots).acquire_owned()).await {
            Ok(Ok(p)) => Ok(Slot { _permit: p }),
            // The semaphore is never closed; treat it as full anyway.
            Ok(Err(_)) => Err(full),
            Err(_) => Err(LimitError::Timeout(self.timeout)),
        }
    }

    /// Requests holding a slot.
    pub fn running(&self) -> usize {
        self.running - self.slots.available_permits().min(self.running)
    }

    /// Requests waiting for one.
    pub fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_queue_and_refusals() {
        let l = Arc::new(Limit::new(2, 1, Duration::from_millis(200)));
        let a = l.acquire().await.unwrap();
        let _b = l.acquire().await.unwrap();
        assert_eq!(l.running(), 2);
        // The third waits in the queue; a fourth is refused at once.
        let l2 = Arc::clone(&l);
        let waiter = tokio::spawn(async move { l2.acquire().await.map(|_| ()) });
        while l.queued() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            l.acquire().await,
            Err(LimitError::QueueFull { .. })
        ));
        drop(a);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(l.queued(), 0);
        // Waiting past the timeout.
        let _c = l.acquire().await.unwrap();
        assert!(matches!(l.acquire().await, Err(LimitError::Timeout(_))));
        assert_eq!(l.queued(), 0);
    }
}

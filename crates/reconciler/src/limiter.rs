//! A token bucket on the reconciler's clock (the generic cell rate
//! algorithm: one "theoretical arrival time" instead of a token count).

use std::time::Duration;

use crate::config::RateLimit;
use crate::status::Timestamp;

/// Hands out tokens at a [`RateLimit`]'s pace.
#[derive(Debug)]
pub(crate) struct Limiter {
    interval: Duration,
    /// How far ahead of now the bucket may run: `(burst - 1) * interval`.
    slack: Duration,
    /// When the bucket is empty again if no more tokens are taken.
    tat: Timestamp,
}

impl Limiter {
    pub(crate) fn new(limit: RateLimit) -> Limiter {
        Limiter {
            interval: limit.interval,
            slack: limit.interval.saturating_mul(limit.burst.saturating_sub(1)),
            tat: Timestamp(0),
        }
    }

    /// Whether a token is there; if not, when one will be.
    pub(crate) fn peek(&self, now: Timestamp) -> Result<(), Timestamp> {
        if self.interval.is_zero() {
            return Ok(());
        }
        let ready = Timestamp(self.tat.max(now).0.saturating_sub(duration_ns(self.slack)));
        if ready > now {
            return Err(ready);
        }
        Ok(())
    }

    /// Takes a token if one is there; otherwise says when one will be.
    pub(crate) fn take(&mut self, now: Timestamp) -> Result<(), Timestamp> {
        self.peek(now)?;
        if !self.interval.is_zero() {
            self.tat = self.tat.max(now).plus(self.interval);
        }
        Ok(())
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_pace() {
        let ms = |n: u64| Timestamp(n * 1_000_000);
        let mut l = Limiter::new(RateLimit {
            interval: Duration::from_millis(10),
            burst: 3,
        });
        let t = ms(1000);
        assert!(l.take(t).is_ok());
        assert!(l.take(t).is_ok());
        assert!(l.take(t).is_ok());
        assert_eq!(l.take(t), Err(ms(1010)));
        assert!(l.take(ms(1010)).is_ok());
        assert_eq!(l.take(ms(1010)), Err(ms(1020)));
        // Idle time refills up to the burst only.
        for _ in 0..3 {
            assert!(l.take(ms(5000)).is_ok());
        }
        assert!(l.take(ms(5000)).is_err());
        let mut free = Limiter::new(RateLimit {
            interval: Duration::ZERO,
            burst: 1,
        });
        for _ in 0..100 {
            assert!(free.take(t).is_ok());
        }
    }
}

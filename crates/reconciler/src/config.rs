//! The reconciler's options, each with a default, and their checks.

use std::time::Duration;

/// A token bucket: one token every `interval`, at most `burst` saved up.
/// An `interval` of zero puts no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Time to earn one token.
    pub interval: Duration,
    /// Tokens that can be saved up and spent at once (at least 1).
    pub burst: u32,
}

impl RateLimit {
    /// `per_second` tokens a second (0: no limit), `burst` saved up.
    pub fn per_second(per_second: u32, burst: u32) -> RateLimit {
        let interval = match per_second {
            0 => Duration::ZERO,
            n => Duration::from_secs(1) / n,
        };
        RateLimit { interval, burst }
    }
}

/// How a reconciler runs. `Config::default()` gives every field a working
/// value; [`Config::validate`] (called on start) refuses bad ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The reconciler's name: the `reconciler` label of its metrics and
    /// what its messages say. Default `"reconciler"`.
    pub name: String,
    /// At most this many objects (changes and retries together) are
    /// reconciled in one round, whose statuses commit in one write
    /// transaction. Default 1000.
    pub round_size: usize,
    /// Limits how often rounds start, so that a burst of changes is taken
    /// in few large rounds. `None`: a round starts as soon as there is
    /// work. Default 100 rounds a second, no burst.
    pub round_rate: Option<RateLimit>,
    /// The first retry of a failed operation waits this long; each further
    /// failure doubles the wait. Default 100 ms.
    pub retry_min: Duration,
    /// The longest wait between retries. Default 1 min.
    pub retry_max: Duration,
    /// Each retry wait is moved by up to this fraction of itself, either
    /// way, so that objects failing together do not retry in step
    /// (0 to 1). Default 0.1.
    pub retry_jitter: f64,
    /// Once the table is initialized, prune once, then every this often.
    /// `None`: prune only when asked ([`crate::Reconciler::trigger_prune`]).
    /// Default 1 h.
    pub prune_interval: Option<Duration>,
    /// Objects reconciled (done) longer ago than this are marked
    /// refreshing and updated again. `None` (the default): no refresh.
    pub refresh_interval: Option<Duration>,
    /// How fast objects are marked for refresh. Default 100 a second.
    pub refresh_rate: RateLimit,
    /// How many error messages the health report lists. Default 10.
    pub health_errors: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "reconciler".into(),
            round_size: 1000,
            round_rate: Some(RateLimit::per_second(100, 1)),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(60),
            retry_jitter: 0.1,
            prune_interval: Some(Duration::from_secs(3600)),
            refresh_interval: None,
            refresh_rate: RateLimit::per_second(100, 1),
            health_errors: 10,
        }
    }
}

/// A [`Config`] field out of its range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name is empty.
    #[error("the reconciler's name is empty")]
    EmptyName,
    /// `round_size` is zero.
    #[error("round_size must be at least 1")]
    ZeroRoundSize,
    /// A rate limit with a burst of zero would never let anything through.
    #[error("{0}: a rate limit's burst must be at least 1")]
    ZeroBurst(&'static str),
    /// `retry_min` is zero or above `retry_max`.
    #[error("retry_min ({min:?}) must be above zero and at most retry_max ({max:?})")]
    RetryRange {
        /// `retry_min`.
        min: Duration,
        /// `retry_max`.
        max: Duration,
    },
    /// `retry_jitter` is not a number from 0 to 1.
    #[error("retry_jitter must be from 0 to 1")]
    Jitter,
    /// An interval of zero: the work would never stop.
    #[error("{0} must be above zero")]
    ZeroInterval(&'static str),
}

impl Config {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.round_size == 0 {
            return Err(ConfigError::ZeroRoundSize);
        }
        if self.round_rate.is_some_and(|r| r.burst == 0) {
            return Err(ConfigError::ZeroBurst("round_rate"));
        }
        if self.refresh_rate.burst == 0 {
            return Err(ConfigError::ZeroBurst("refresh_rate"));
        }
        if self.retry_min.is_zero() || self.retry_min > self.retry_max {
            return Err(ConfigError::RetryRange {
                min: self.retry_min,
                max: self.retry_max,
            });
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(ConfigError::Jitter);
        }
        if self.prune_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::ZeroInterval("prune_interval"));
        }
        if self.refresh_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::ZeroInterval("refresh_interval"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_each_bad_field_is_refused() {
        assert_eq!(Config::default().validate(), Ok(()));
        let bad: Vec<(Config, ConfigError)> = vec![
            (
                Config {
                    name: String::new(),
                    ..Config::default()
                },
                ConfigError::EmptyName,
            ),
            (
                Config {
                    round_size: 0,
                    ..Config::default()
                },
                ConfigError::ZeroRoundSize,
            ),
            (
                Config {
                    round_rate: Some(RateLimit {
                        interval: Duration::from_millis(1),
                        burst: 0,
                    }),
                    ..Config::default()
                },
                ConfigError::ZeroBurst("round_rate"),
            ),
            (
                Config {
                    refresh_rate: RateLimit::per_second(1, 0),
                    ..Config::default()
                },
                ConfigError::ZeroBurst("refresh_rate"),
            ),
            (
                Config {
                    retry_min: Duration::ZERO,
                    ..Config::default()
                },
                ConfigError::RetryRange {
                    min: Duration::ZERO,
                    max: Duration::from_secs(60),
                },
            ),
            (
                Config {
                    retry_min: Duration::from_secs(2),
                    retry_max: Duration::from_secs(1),
                    ..Config::default()
                },
                ConfigError::RetryRange {
                    min: Duration::from_secs(2),
                    max: Duration::from_secs(1),
                },
            ),
            (
                Config {
                    retry_jitter: f64::NAN,
                    ..Config::default()
                },
                ConfigError::Jitter,
            ),
            (
                Config {
                    retry_jitter: 1.5,
                    ..Config::default()
                },
                ConfigError::Jitter,
            ),
            (
                Config {
                    prune_interval: Some(Duration::ZERO),
                    ..Config::default()
                },
                ConfigError::ZeroInterval("prune_interval"),
            ),
            (
                Config {
                    refresh_interval: Some(Duration::ZERO),
                    ..Config::default()
                },
                ConfigError::ZeroInterval("refresh_interval"),
            ),
        ];
        for (c, e) in bad {
            assert_eq!(c.validate(), Err(e));
        }
        assert_eq!(RateLimit::per_second(0, 1).interval, Duration::ZERO);
        assert_eq!(
            RateLimit::per_second(4, 1).interval,
            Duration::from_millis(250)
        );
    }
}

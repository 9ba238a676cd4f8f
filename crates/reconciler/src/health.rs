//! The reconciler's health as its loop last saw it.

use std::fmt;

/// What the reconciler reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Started, no round finished yet.
    Starting,
    /// Nothing failing; `objects` in the table.
    Ok {
        /// Objects in the table after the last round.
        objects: usize,
    },
    /// Some objects (or the last prune) failed and are being retried.
    Degraded {
        /// Objects failing, plus one if the last prune failed.
        failing: usize,
        /// The first errors, as "key: message" (a failed prune as
        /// "prune: message").
        errors: Vec<String>,
    },
    /// The loop ended: stopped on request, or on the error given.
    Stopped {
        /// Why, if not on request.
        error: Option<String>,
    },
}

impl Health {
    /// Whether the health is [`Health::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, Health::Ok { .. })
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Health::Starting => write!(f, "starting"),
            Health::Ok { objects } => write!(f, "OK, {objects} object(s)"),
            Health::Degraded { failing, errors } => {
                write!(f, "{failing} error(s): {}", errors.join("; "))
            }
            Health::Stopped { error: None } => write!(f, "stopped"),
            Health::Stopped { error: Some(e) } => write!(f, "stopped: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        assert_eq!(Health::Ok { objects: 3 }.to_string(), "OK, 3 object(s)");
        let d = Health::Degraded {
            failing: 2,
            errors: vec!["1: a".into(), "2: b".into()],
        };
        assert_eq!(d.to_string(), "2 error(s): 1: a; 2: b");
        assert!(!d.is_ok() && Health::Ok { objects: 0 }.is_ok());
        assert_eq!(
            Health::Stopped {
                error: Some("x".into())
            }
            .to_string(),
            "stopped: x"
        );
        assert_eq!(Health::Starting.to_string(), "starting");
    }
}

//! The retry queue: objects whose update or delete failed, by primary key,
//! each due again after an exponential backoff with jitter.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use statedb::{Obj, Revision};

use crate::status::Timestamp;

/// Exponential backoff: `min`, doubling per attempt, at most `max`, each
/// delay moved by up to `jitter` of itself either way.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) jitter: f64,
}

impl Backoff {
    /// The wait before retry number `attempt` (1 for the first), without
    /// jitter.
    pub(crate) fn base(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(40);
        self.min.saturating_mul(1u32 << shift.min(31)).min(self.max)
    }

    fn delay(&self, attempt: u32, rng: &mut SmallRng) -> Duration {
        let d = self.base(attempt);
        if self.jitter <= 0.0 {
            return d;
        }
        let f = 1.0 + rng.random_range(-self.jitter..=self.jitter);
        Duration::try_from_secs_f64(d.as_secs_f64() * f.max(0.0)).unwrap_or(self.max)
    }
}

/// One failed object.
#[derive(Debug)]
pub(crate) struct RetryItem<T> {
    /// The object to retry with (for a delete, its last version).
    pub(crate) obj: Obj<T>,
    /// The revision to retry at: the object's (for a status
    /// compare-and-swap) or the delete's.
    pub(crate) rev: Revision,
    /// The revision of the change that first failed: until it succeeds,
    /// nothing from there on is reconciled.
    pub(crate) since: Revision,
    pub(crate) delete: bool,
    attempts: u32,
    pub(crate) error: Arc<String>,
    /// Its place in the queue; `None` while it is being retried.
    due: Option<(Timestamp, u64)>,
}

/// A retry taken from the queue.
pub(crate) struct Due<K, T> {
    pub(crate) key: K,
    pub(crate) obj: Obj<T>,
    pub(crate) rev: Revision,
    pub(crate) delete: bool,
}

/// Failed objects by key, and their order by due time.
pub(crate) struct RetryQueue<K, T> {
    backoff: Backoff,
    rng: SmallRng,
    seq: u64,
    items: HashMap<K, RetryItem<T>>,
    queue: BTreeMap<(Timestamp, u64), K>,
    /// How many items have each `since`, for the lowest one.
    since: BTreeMap<Revision, usize>,
    /// Items that are deletes.
    deletes: usize,
}

impl<K: Clone + Eq + Hash + std::fmt::Debug, T> RetryQueue<K, T> {
    pub(crate) fn new(backoff: Backoff) -> Self {
        RetryQueue {
            backoff,
            rng: SmallRng::seed_from_u64(0x5eed),
            seq: 0,
            items: HashMap::new(),
            queue: BTreeMap::new(),
            since: BTreeMap::new(),
            deletes: 0,
        }
    }

    /// Number of failing objects (queued or being retried).
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many of the failing objects failed a delete.
    pub(crate) fn failing_deletes(&self) -> usize {
        self.deletes
    }

    /// Records a failure of `key`: queues it after its next backoff. An
    /// object already failing keeps its `since` and counts one more attempt.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fail(
        &mut self,
        key: K,
        obj: Obj<T>,
        rev: Revision,
        since: Revision,
        delete: bool,
        error: Arc<String>,
        now: Timestamp,
    ) {
        self.seq += 1;
        let seq = self.seq;
        let item = match self.items.get_mut(&key) {
            Some(item) => {
                if let Some(d) = item.due.take() {
                    self.queue.remove(&d);
                }
                item.obj = obj;
                item.rev = rev;
                if item.delete != delete {
                    if delete {
                        self.deletes += 1;
                    } else {
                        self.deletes -= 1;
                    }
                }
                item.delete = delete;
                item.error = error;
                item.attempts = item.attempts.saturating_add(1);
                item
            }
            None => {
                *self.since.entry(since).or_default() += 1;
                self.deletes += usize::from(delete);
                self.items.entry(key.clone()).or_insert(RetryItem {
                    obj,
                    rev,
                    since,
                    delete,
                    attempts: 1,
                    error,
                    due: None,
                })
            }
        };
        let at = now.plus(self.backoff.delay(item.attempts, &mut self.rng));
        item.due = Some((at, seq));
        self.queue.insert((at, seq), key);
    }

    /// Forgets `key` (it succeeded, or changed and will be reconciled
    /// afresh).
    pub(crate) fn clear(&mut self, key: &K) {
        if let Some(item) = self.items.remove(key) {
            self.deletes -= usize::from(item.delete);
            if let Some(d) = item.due {
                self.queue.remove(&d);
            }
            if let Some(n) = self.since.get_mut(&item.since) {
                *n -= 1;
                if *n == 0 {
                    self.since.remove(&item.since);
                }
            }
        }
    }

    /// The next retry due at `now`, taken off the queue (it stays failing
    /// until [`RetryQueue::clear`] or [`RetryQueue::fail`]).
    pub(crate) fn pop_due(&mut self, now: Timestamp) -> Option<Due<K, T>> {
        let (&(at, seq), _) = self.queue.first_key_value()?;
        if at > now {
            return None;
        }
        let key = self.queue.remove(&(at, seq))?;
        let item = self.items.get_mut(&key)?;
        item.due = None;
        Some(Due {
            obj: item.obj.clone(),
            rev: item.rev,
            delete: item.delete,
            key,
        })
    }

    /// When the next retry is due.
    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.queue.first_key_value().map(|((at, _), _)| *at)
    }

    /// The lowest revision still failing.
    pub(crate) fn lowest_since(&self) -> Option<Revision> {
        self.since.first_key_value().map(|(r, _)| *r)
    }

    /// Up to `n` failures as "key: message", the next due first.
    pub(crate) fn errors(&self, n: usize) -> Vec<String> {
        self.queue
            .values()
            .filter_map(|k| self.items.get(k).map(|i| (k, i)))
            .chain(self.items.iter().filter(|(_, i)| i.due.is_none()))
            .take(n)
            .map(|(k, i)| format!("{k:?}: {}", i.error))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: u32) -> Obj<u32> {
        // An object as a table would hold it is not needed here: any
        // `Obj` will do, taken from a throwaway table.
        let db = statedb::Db::new();
        let id = statedb::Index::unique("id", |x: &u32| *x);
        let t: statedb::Table<u32> = db.create_table("t", &id, &[]).unwrap();
        let mut w = db.write_txn(&[&t]).unwrap();
        t.insert(&mut w, v).unwrap();
        let r = w.commit().unwrap();
        t.read(&r).unwrap().get(&id, &v).unwrap().clone()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff {
            min: ms(100),
            max: ms(1000),
            jitter: 0.0,
        };
        let got: Vec<_> = (1..=6).map(|a| b.base(a)).collect();
        assert_eq!(
            got,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(b.base(u32::MAX), ms(1000));
        let mut rng = SmallRng::seed_from_u64(1);
        let j = Backoff { jitter: 0.5, ..b };
        for a in 1..10 {
            let d = j.delay(a, &mut rng);
            assert!(d >= b.base(a).mul_f64(0.5) && d <= b.base(a).mul_f64(1.5));
        }
    }

    #[test]
    fn queue_orders_by_due_and_clears() {
        let b = Backoff {
            min: ms(100),
            max: ms(1000),
            jitter: 0.0,
        };
        let mut q: RetryQueue<u32, u32> = RetryQueue::new(b);
        let t0 = Timestamp(0);
        let e = Arc::new("boom".to_string());
        q.fail(1, obj(1), 5, 5, false, e.clone(), t0);
        q.fail(2, obj(2), 3, 3, true, e.clone(), t0.plus(ms(50)));
        assert_eq!(q.len(), 2);
        assert_eq!(q.lowest_since(), Some(3));
        assert_eq!(q.next_due(), Some(t0.plus(ms(100))));
        assert!(q.pop_due(t0.plus(ms(99))).is_none());
        let d = q.pop_due(t0.plus(ms(100))).unwrap();
        assert_eq!((d.key, d.rev, d.delete), (1, 5, false));
        // Fails again: twice the wait, `since` kept.
        q.fail(1, obj(1), 7, 7, false, e.clone(), t0.plus(ms(100)));
        assert_eq!(q.next_due(), Some(t0.plus(ms(150))));
        assert_eq!(q.errors(10).len(), 2);
        q.clear(&2);
        assert_eq!(q.lowest_since(), Some(5));
        assert_eq!(q.next_due(), Some(t0.plus(ms(300))));
        q.clear(&1);
        assert!(q.is_empty() && q.lowest_since().is_none() && q.next_due().is_none());
    }
}

//! Deterministic random event streams for stress tests and benchmarks.

use std::collections::{HashMap, HashSet};

use kvindex::{ExternalHash, KvEvent, KvEventData, LocalHash, WorkerKey};

use super::{ext_of, stored, Model};

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Per worker: its events in order, and every path it ever held.
pub struct Stream {
    pub events: HashMap<WorkerKey, Vec<KvEvent>>,
    pub ever: HashMap<WorkerKey, HashSet<Vec<LocalHash>>>,
    pub model: Model,
}

/// `workers` workers, `per_worker` events each, locals from `alphabet`.
pub fn make_stream(seed: u64, workers: u64, per_worker: usize, alphabet: u64) -> Stream {
    let mut rng = Rng(seed | 1);
    let mut model = Model::default();
    let mut events: HashMap<WorkerKey, Vec<KvEvent>> = HashMap::new();
    let mut ever: HashMap<WorkerKey, HashSet<Vec<LocalHash>>> = HashMap::new();
    for i in 0..per_worker {
        for wid in 0..workers {
            let w = WorkerKey::new(wid, 0);
            let id = i as u64;
            let held: Vec<Vec<LocalHash>> = {
                let mut v: Vec<_> = model
                    .workers
                    .get(&w)
                    .map(|s| s.held.keys().cloned().collect())
                    .unwrap_or_default();
                v.sort();
                v
            };
            let r = rng.below(100);
            let ev = if r < 60 || held.is_empty() {
                let parent = if held.is_empty() || rng.below(3) == 0 {
                    Vec::new()
                } else {
                    held[rng.below(held.len() as u64) as usize].clone()
                };
                let n = 1 + rng.below(8) as usize;
                let locals: Vec<LocalHash> =
                    (0..n).map(|_| LocalHash(1 + rng.below(alphabet))).collect();
                stored(w, id, &parent, &locals, 0)
            } else if r < 97 {
                let k = 1 + rng.below(4) as usize;
                let hashes: Vec<ExternalHash> = (0..k)
                    .map(|_| ext_of(&held[rng.below(held.len() as u64) as usize], 0))
                    .collect();
                KvEvent {
                    worker: w,
                    event_id: id,
                    data: KvEventData::Removed { hashes },
                }
            } else {
                KvEvent {
                    worker: w,
                    event_id: id,
                    data: KvEventData::Cleared,
                }
            };
            let _ = model.apply(&ev);
            let e = ever.entry(w).or_default();
            if let Some(s) = model.workers.get(&w) {
                e.extend(s.held.keys().cloned());
            }
            events.entry(w).or_default().push(ev);
        }
    }
    Stream {
        events,
        ever,
        model,
    }
}

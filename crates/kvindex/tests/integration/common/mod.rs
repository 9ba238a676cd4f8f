//! Shared test helpers: a per-worker HashSet model and event builders.
#![allow(dead_code)]

pub mod stream;

use std::collections::{HashMap, HashSet};

use kvindex::{
    next_sequence_hash, ApplyError, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    StoredBlock, WorkerKey,
};

/// The simplest possible model: per worker, the set of held block paths
/// (each path = the local hashes from the root to the block).
#[derive(Default, Clone)]
pub struct Model {
    pub workers: HashMap<WorkerKey, MWorker>,
}

#[derive(Default, Clone)]
pub struct MWorker {
    pub ext: HashMap<ExternalHash, Vec<LocalHash>>,
    pub held: HashMap<Vec<LocalHash>, ExternalHash>,
    pub last: Option<u64>,
}

impl Model {
    pub fn apply(&mut self, ev: &KvEvent) -> Result<(), ()> {
        let st = self.workers.entry(ev.worker).or_default();
        if let Some(l) = st.last {
            if ev.event_id < l {
                return Ok(());
            }
        }
        st.last = Some(ev.event_id);
        match &ev.data {
            KvEventData::Stored { parent, blocks } => {
                let mut cur: Vec<LocalHash> = match parent {
                    None => Vec::new(),
                    Some(p) => match st.ext.get(p) {
                        Some(path) => path.clone(),
                        None => return Err(()),
                    },
                };
                for b in blocks {
                    if let Some(p) = st.ext.get(&b.external) {
                        cur = p.clone();
                        continue;
                    }
                    cur.push(b.local);
                    if !st.held.contains_key(&cur) {
                        st.held.insert(cur.clone(), b.external);
                        st.ext.insert(b.external, cur.clone());
                    }
                }
            }
            KvEventData::Removed { hashes } => {
                for h in hashes {
                    if let Some(p) = st.ext.remove(h) {
                        st.held.remove(&p);
                    }
                }
            }
            KvEventData::Cleared => {
                st.ext.clear();
                st.held.clear();
            }
        }
        Ok(())
    }

    pub fn remove_worker(&mut self, w: WorkerKey) {
        self.workers.remove(&w);
    }

    pub fn score(&self, w: WorkerKey, q: &[LocalHash]) -> u32 {
        let Some(st) = self.workers.get(&w) else {
            return 0;
        };
        let mut k = 0;
        while k < q.len() && st.held.contains_key(&q[..=k]) {
            k += 1;
        }
        k as u32
    }

    pub fn scores(&self, q: &[LocalHash]) -> Vec<(WorkerKey, u32)> {
        let mut v: Vec<_> = self
            .workers
            .keys()
            .map(|w| (*w, self.score(*w, q)))
            .filter(|(_, s)| *s > 0)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn count(&self, w: WorkerKey) -> usize {
        self.workers.get(&w).map_or(0, |s| s.ext.len())
    }

    /// Every held path (for exhaustive queries).
    pub fn all_paths(&self) -> HashSet<Vec<LocalHash>> {
        self.workers
            .values()
            .flat_map(|s| s.held.keys().cloned())
            .collect()
    }
}

/// Engine-style external id: the sequence hash of the path, optionally
/// salted per worker.
pub fn ext_of(path: &[LocalHash], salt: u64) -> ExternalHash {
    let mut h = salt;
    for l in path {
        h = next_sequence_hash(h, *l);
    }
    ExternalHash(h)
}

pub fn wk(id: u64) -> WorkerKey {
    WorkerKey::new(id, (id % 2) as u32)
}

/// Builds a Stored event for `locals` appended below `parent_path`.
pub fn stored(
    w: WorkerKey,
    id: u64,
    parent_path: &[LocalHash],
    locals: &[LocalHash],
    salt: u64,
) -> KvEvent {
    let parent = (!parent_path.is_empty()).then(|| ext_of(parent_path, salt));
    let mut path = parent_path.to_vec();
    let blocks = locals
        .iter()
        .map(|l| {
            path.push(*l);
            StoredBlock {
                external: ext_of(&path, salt),
                local: *l,
            }
        })
        .collect();
    KvEvent {
        worker: w,
        event_id: id,
        data: KvEventData::Stored { parent, blocks },
    }
}

pub fn removed(w: WorkerKey, id: u64, paths: &[&[LocalHash]], salt: u64) -> KvEvent {
    KvEvent {
        worker: w,
        event_id: id,
        data: KvEventData::Removed {
            hashes: paths.iter().map(|p| ext_of(p, salt)).collect(),
        },
    }
}

pub fn l(v: &[u64]) -> Vec<LocalHash> {
    v.iter().map(|x| LocalHash(*x)).collect()
}

pub fn sorted(s: &kvindex::OverlapScores) -> Vec<(WorkerKey, u32)> {
    s.sorted()
}

/// Applies `ev` and maps the result to a comparable form.
pub fn app(ix: &dyn KvIndexer, ev: &KvEvent) -> Result<(), ()> {
    ix.apply(ev).map_err(|e| {
        assert!(matches!(e, ApplyError::UnknownParent { .. }), "{e}");
    })
}

/// Checks `ix` against the model on every held path (plus one-block
/// extensions) and on block counts.
pub fn check_equal(ix: &dyn KvIndexer, m: &Model, extra: &[Vec<LocalHash>]) {
    let mut qs: Vec<Vec<LocalHash>> = m.all_paths().into_iter().collect();
    qs.extend(extra.iter().cloned());
    for q in &qs {
        assert_eq!(
            sorted(&ix.find_matches(q)),
            m.scores(q),
            "{} query {:?}",
            ix.name(),
            q
        );
        let mut q2 = q.clone();
        q2.push(LocalHash(999_999));
        assert_eq!(
            sorted(&ix.find_matches(&q2)),
            m.scores(&q2),
            "{} query {:?}",
            ix.name(),
            q2
        );
    }
    for w in m.workers.keys() {
        assert_eq!(
            ix.worker_block_count(*w),
            m.count(*w),
            "{} count {:?}",
            ix.name(),
            w
        );
    }
}

//! kvindex under coverage-guided fuzzing: raw event streams, well formed or
//! not, applied to the concurrent index and to the reference index.
//!
//! Events come straight from the input, over small id spaces so that
//! parents, duplicates and conflicts are common: chains under held, unknown
//! or missing parents, one engine id stored twice with different contents
//! or under different parents, removals of held and unknown blocks,
//! clears, forgotten workers, replayed and skipped event ids. Neither index
//! may panic; both must accept or refuse each event alike (refusals are
//! typed), answer every prefix query and block count alike, and a dump of
//! the concurrent index must rebuild an index that answers alike too (a
//! router replica restarts from one). A replica is also rebuilt the way a
//! router replica catches up: from a dump taken part way, then the events
//! after it, the last few before it delivered again (as a stream that
//! redelivers does); it must end equal to the index that saw the stream
//! once, unless some worker's last event id before the dump was carried by
//! more than one event (event ids are the only way to tell a redelivery,
//! so distinct events under one id cannot be told apart: the first of them,
//! refused at first for want of a parent that the second stored, is
//! accepted when delivered again).
#![no_main]

use kvindex::{
    ApplyError, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, LocalHash,
    ReferenceIndex, StoredBlock, WorkerKey,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Events per input, at most.
const STEPS: usize = 300;
/// Workers (two data-parallel ranks of one instance among them).
const WORKERS: [WorkerKey; 4] = [
    WorkerKey::new(1, 0),
    WorkerKey::new(1, 1),
    WorkerKey::new(2, 0),
    WorkerKey::new(3, 0),
];

fn external(u: &mut Unstructured) -> Result<ExternalHash> {
    Ok(ExternalHash(u.int_in_range(0..=40)?))
}

fn local(u: &mut Unstructured) -> Result<LocalHash> {
    Ok(LocalHash(u.int_in_range(0..=6)?))
}

fn query(u: &mut Unstructured) -> Result<Vec<LocalHash>> {
    let n = u.int_in_range(0..=8)?;
    (0..n).map(|_| local(u)).collect()
}

/// Both indexes answer `q` alike.
fn same_matches(a: &dyn KvIndexer, b: &dyn KvIndexer, q: &[LocalHash]) {
    assert_eq!(
        a.find_matches(q).sorted(),
        b.find_matches(q).sorted(),
        "{} and {} differ on {q:?}",
        a.name(),
        b.name()
    );
}

fn same_counts(a: &dyn KvIndexer, b: &dyn KvIndexer) {
    for w in WORKERS {
        assert_eq!(
            a.worker_block_count(w),
            b.worker_block_count(w),
            "{} and {} count {w:?} differently",
            a.name(),
            b.name()
        );
    }
}

/// What the index was given, in order, for replicas to replay.
enum Entry {
    /// An event and what applying it returned.
    Event(KvEvent, std::result::Result<(), ApplyError>),
    /// `remove_worker`.
    Forget(WorkerKey),
}

/// A dump taken part way: where in the log, the events, how many entries
/// before it are delivered again, and whether every worker's last id was
/// one event's.
struct Cut {
    at: usize,
    dump: Vec<KvEvent>,
    overlap: usize,
    distinct: bool,
}

/// A new index from `dump` (every event accepted).
fn rebuilt(dump: &[KvEvent]) -> ConcurrentIndex {
    let ix = ConcurrentIndex::new();
    for ev in dump {
        if let Err(e) = ix.apply(ev) {
            panic!("dump event refused: {e} ({ev:?})");
        }
    }
    ix
}

/// `b` answers every query and counts every worker as `a` does.
fn same_index(a: &dyn KvIndexer, b: &dyn KvIndexer, queries: &[Vec<LocalHash>]) {
    same_counts(a, b);
    for q in queries {
        same_matches(a, b, q);
    }
}

fn run(u: &mut Unstructured) -> Result<()> {
    let ours = ConcurrentIndex::new();
    let reference = ReferenceIndex::new();
    let mut next_id = [0u64; WORKERS.len()];
    // Events applied under each worker's highest id so far.
    let mut at_last = [0u32; WORKERS.len()];
    let mut queries: Vec<Vec<LocalHash>> = Vec::new();
    let mut log: Vec<Entry> = Vec::new();
    let mut cut: Option<Cut> = None;
    for _ in 0..STEPS {
        if u.is_empty() {
            break;
        }
        let wi = u.choose_index(WORKERS.len())?;
        let worker = WORKERS[wi];
        let data = match u.int_in_range(0u8..=10)? {
            0..=4 => {
                let parent = if u.ratio(1u8, 4)? {
                    None
                } else {
                    Some(external(u)?)
                };
                let n = u.int_in_range(0..=6)?;
                let blocks = (0..n)
                    .map(|_| {
                        Ok(StoredBlock {
                            external: external(u)?,
                            local: local(u)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                KvEventData::Stored { parent, blocks }
            }
            5 | 6 => {
                let n = u.int_in_range(0..=5)?;
                KvEventData::Removed {
                    hashes: (0..n).map(|_| external(u)).collect::<Result<_>>()?,
                }
            }
            7 => KvEventData::Cleared,
            8 => {
                ours.remove_worker(worker);
                reference.remove_worker(worker);
                log.push(Entry::Forget(worker));
                next_id[wi] = 0;
                at_last[wi] = 0;
                same_counts(&ours, &reference);
                continue;
            }
            9 if cut.is_none() => {
                cut = Some(Cut {
                    at: log.len(),
                    dump: ours.dump(),
                    overlap: u.int_in_range(0..=6)?,
                    distinct: at_last.iter().all(|&n| n <= 1),
                });
                continue;
            }
            _ => {
                let q = query(u)?;
                same_matches(&ours, &reference, &q);
                queries.push(q);
                continue;
            }
        };
        // Mostly the next id; sometimes a replay, a repeat or a gap.
        let id = match u.int_in_range(0u8..=15)? {
            0 => next_id[wi].saturating_sub(u.int_in_range(1..=3)?),
            1 => next_id[wi].saturating_sub(1),
            2 => next_id[wi] + u.int_in_range(1..=5)?,
            _ => next_id[wi],
        };
        if id + 1 == next_id[wi] {
            at_last[wi] += 1;
        } else if id >= next_id[wi] {
            at_last[wi] = 1;
        }
        next_id[wi] = next_id[wi].max(id + 1);
        let ev = KvEvent {
            worker,
            event_id: id,
            data,
        };
        let a = ours.apply(&ev);
        let b = reference.apply(&ev);
        assert_eq!(a, b, "results differ on {ev:?}");
        same_counts(&ours, &reference);
        log.push(Entry::Event(ev, a));
    }
    queries.push(Vec::new());
    for q in &queries {
        same_matches(&ours, &reference, q);
    }
    // A replica rebuilt from the dump answers as the index it was taken of.
    same_index(&ours, &rebuilt(&ours.dump()), &queries);
    // One that caught up from a dump taken part way: after the cut, each
    // event returns what it returned the first time.
    if let Some(c) = cut.filter(|c| c.distinct) {
        let replica = rebuilt(&c.dump);
        for (i, e) in log.iter().enumerate().skip(c.at.saturating_sub(c.overlap)) {
            match e {
                Entry::Event(ev, first) => {
                    let got = replica.apply(ev);
                    if i >= c.at {
                        assert_eq!(&got, first, "replica differs on {ev:?}");
                    }
                }
                Entry::Forget(w) => replica.remove_worker(*w),
            }
        }
        same_index(&ours, &replica, &queries);
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

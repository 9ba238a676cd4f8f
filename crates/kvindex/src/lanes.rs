//! Writer lanes: N threads applying events to a shared index, each worker
//! pinned to one lane so its events stay in order. Queues are bounded (a
//! producer that outruns the lanes waits: backpressure, not memory), and
//! an event the index refuses is counted and handed to an error handler.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::event::{ApplyError, KvEvent, WorkerKey};
use crate::stats::IndexStats;
use crate::KvIndexer;

/// Messages (events or batches) a lane queues by default before
/// [`Lanes::submit`] waits.
pub const DEFAULT_QUEUE: usize = 4096;

/// What a lane does with an event the index refused (after counting it).
pub type ErrorHandler = dyn Fn(&KvEvent, &ApplyError) + Send + Sync;

/// How [`Lanes`] run: lane count, queue bound, error handler.
#[derive(Clone)]
#[non_exhaustive]
pub struct LanesConfig {
    /// Writer threads (at least one).
    pub lanes: usize,
    /// Messages each lane queues before `submit` waits (at least one).
    pub queue: usize,
    /// Called on the lane's thread for each refused event.
    pub on_error: Option<Arc<ErrorHandler>>,
}

impl LanesConfig {
    /// `lanes` lanes, [`DEFAULT_QUEUE`], no handler.
    pub fn new(lanes: usize) -> Self {
        Self {
            lanes,
            queue: DEFAULT_QUEUE,
            on_error: None,
        }
    }

    /// Sets the queue bound.
    pub fn with_queue(mut self, queue: usize) -> Self {
        self.queue = queue;
        self
    }

    /// Sets the error handler.
    pub fn with_error_handler(mut self, h: Arc<ErrorHandler>) -> Self {
        self.on_error = Some(h);
        self
    }
}

/// An event [`Lanes::try_submit`] could not queue: its lane is full.
#[derive(Debug)]
pub struct Full(pub KvEvent);

enum Msg {
    Event(KvEvent),
    Batch(Vec<KvEvent>),
    Flush(Sender<()>),
}

/// N writer lanes (threads) in front of any [`KvIndexer`]; each worker is
/// hashed to a fixed lane. Dropping `Lanes` drains and joins the threads.
///
/// ```
/// use std::sync::Arc;
/// use kvindex::{
///     local_block_hashes, ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, Lanes,
///     StoredBlock, WorkerKey,
/// };
///
/// let lanes = Lanes::new(Arc::new(ConcurrentIndex::new()), 2);
/// let tokens: Vec<u32> = (0..32).collect();
/// let locals = local_block_hashes(&tokens, 16, None);
/// let blocks = locals
///     .iter()
///     .enumerate()
///     .map(|(i, &local)| StoredBlock { external: ExternalHash(100 + i as u64), local })
///     .collect();
/// let worker = WorkerKey::new(1, 0);
/// lanes.submit(KvEvent { worker, event_id: 0, data: KvEventData::Stored { parent: None, blocks } });
/// lanes.flush(); // everything submitted so far is applied
/// assert_eq!(lanes.index().find_matches(&locals).get(worker), 2);
/// assert_eq!(lanes.apply_errors(), 0);
/// ```
pub struct Lanes<I: KvIndexer + ?Sized + 'static> {
    index: Arc<I>,
    senders: Vec<Sender<Msg>>,
    threads: Vec<JoinHandle<()>>,
    errors: Arc<AtomicU64>,
}

/// The lane a worker's events go to, for `lanes` lanes.
pub fn lane_of(w: WorkerKey, lanes: usize) -> usize {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&w.worker_id.to_le_bytes());
    b[8..].copy_from_slice(&w.dp_rank.to_le_bytes());
    let h = xxhash_rust::xxh3::xxh3_64(&b);
    (h % lanes.max(1) as u64) as usize
}

/// Polls before blocking, so a lane that keeps up with its producer does
/// not make every `send` pay a futex wake-up (microseconds on a VM, more
/// than applying a typical event). Yields between polls so the producer
/// keeps its CPU when the lanes outnumber the cores.
const POLLS_BEFORE_BLOCKING: u32 = 64;

fn next_msg(rx: &Receiver<Msg>) -> Option<Msg> {
    for _ in 0..POLLS_BEFORE_BLOCKING {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
    rx.recv().ok()
}

impl<I: KvIndexer + ?Sized + 'static> Lanes<I> {
    /// Starts `lanes` writer threads (at least one) over `index`, with
    /// [`DEFAULT_QUEUE`] and no error handler (refused events are only
    /// counted: [`Lanes::apply_errors`]).
    pub fn new(index: Arc<I>, lanes: usize) -> Self {
        Self::with_config(index, LanesConfig::new(lanes))
    }

    /// Starts lanes as `cfg` says.
    pub fn with_config(index: Arc<I>, cfg: LanesConfig) -> Self {
        let lanes = cfg.lanes.max(1);
        let errors = Arc::new(AtomicU64::new(0));
        let mut senders = Vec::with_capacity(lanes);
        let mut threads = Vec::with_capacity(lanes);
        for i in 0..lanes {
            let (tx, rx): (Sender<Msg>, Receiver<Msg>) = bounded(cfg.queue.max(1));
            let idx = Arc::clone(&index);
            let (errors, on_error) = (Arc::clone(&errors), cfg.on_error.clone());
            let apply = move |ev: &KvEvent| {
                if let Err(e) = idx.apply(ev) {
                    errors.fetch_add(1, Relaxed);
                    if let Some(h) = &on_error {
                        h(ev, &e);
                    }
                }
            };
            let t = std::thread::Builder::new()
                .name(format!("kvindex-lane-{i}"))
                .spawn(move || {
                    while let Some(m) = next_msg(&rx) {
                        match m {
                            Msg::Event(ev) => apply(&ev),
                            Msg::Batch(evs) => evs.iter().for_each(&apply),
                            Msg::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                })
                .expect("spawn lane thread");
            senders.push(tx);
            threads.push(t);
        }
        Self {
            index,
            senders,
            threads,
            errors,
        }
    }

    /// Events the index refused (unknown parent, too deep), all lanes.
    pub fn apply_errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.senders.len()
    }

    /// Enqueues `ev` on its worker's lane, waiting while the lane's queue
    /// is full.
    pub fn submit(&self, ev: KvEvent) {
        let lane = lane_of(ev.worker, self.senders.len());
        // The receiver lives as long as `self`, so sending cannot fail.
        let _ = self.senders[lane].send(Msg::Event(ev));
    }

    /// Enqueues `ev` if its lane has room; gives it back otherwise.
    pub fn try_submit(&self, ev: KvEvent) -> Result<(), Full> {
        let lane = lane_of(ev.worker, self.senders.len());
        match self.senders[lane].try_send(Msg::Event(ev)) {
            Ok(()) => Ok(()),
            Err(e) => match e.into_inner() {
                Msg::Event(ev) => Err(Full(ev)),
                // Not sent above; nothing to give back.
                Msg::Batch(_) | Msg::Flush(_) => Ok(()),
            },
        }
    }

    /// Enqueues events that all belong to workers of lane `lane` (see
    /// [`lane_of`]) as one message, waiting while that lane is full; used
    /// by benchmarks to cut channel cost.
    pub fn submit_batch(&self, lane: usize, evs: Vec<KvEvent>) {
        let _ = self.senders[lane % self.senders.len()].send(Msg::Batch(evs));
    }

    /// Blocks until every event submitted before this call is applied.
    pub fn flush(&self) {
        let waits: Vec<_> = self
            .senders
            .iter()
            .map(|s| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                let _ = s.send(Msg::Flush(tx));
                rx
            })
            .collect();
        for rx in waits {
            let _ = rx.recv();
        }
    }

    /// The index behind the lanes.
    pub fn index(&self) -> &Arc<I> {
        &self.index
    }

    /// The index's counters: events applied, gaps, unknown parents,
    /// unknown removes, duplicates.
    pub fn stats(&self) -> IndexStats {
        self.index.stats()
    }
}

impl<I: KvIndexer + ?Sized + 'static> Drop for Lanes<I> {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Barrier, Mutex};

    use super::*;
    use crate::event::{KvEventData, StoredBlock};
    use crate::hash::{ExternalHash, LocalHash};
    use crate::ConcurrentIndex;

    fn stored(worker: u64, id: u64, parent: Option<u64>, block: u64) -> KvEvent {
        KvEvent {
            worker: WorkerKey::new(worker, 0),
            event_id: id,
            data: KvEventData::Stored {
                parent: parent.map(ExternalHash),
                blocks: vec![StoredBlock {
                    external: ExternalHash(block),
                    local: LocalHash(block),
                }],
            },
        }
    }

    #[test]
    fn refused_events_are_counted_and_handed_over() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let cfg = LanesConfig::new(2).with_error_handler(Arc::new(
            move |ev: &KvEvent, e: &ApplyError| {
                s2.lock().unwrap().push((ev.worker, ev.event_id, e.clone()));
            },
        ));
        let lanes = Lanes::with_config(Arc::new(ConcurrentIndex::new()), cfg);
        lanes.submit(stored(1, 0, None, 10));
        lanes.submit(stored(1, 1, Some(99), 11)); // parent never stored
        lanes.submit(stored(2, 0, Some(10), 12)); // worker 2 does not hold 10
        lanes.flush();
        assert_eq!(lanes.apply_errors(), 2);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|(w, id, _)| (*w, *id));
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].0, seen[0].1), (WorkerKey::new(1, 0), 1));
        assert!(
            matches!(seen[0].2, ApplyError::UnknownParent { .. }),
            "{:?}",
            seen[0].2
        );
        assert_eq!(lanes.index().worker_block_count(WorkerKey::new(1, 0)), 1);
    }

    #[test]
    fn a_full_lane_pushes_back() {
        // The handler holds the lane's thread until released, so its queue
        // (one message) fills.
        let gate = Arc::new(Barrier::new(2));
        let g2 = Arc::clone(&gate);
        let cfg = LanesConfig::new(1)
            .with_queue(1)
            .with_error_handler(Arc::new(move |_: &KvEvent, _: &ApplyError| {
                g2.wait();
            }));
        let lanes = Lanes::with_config(Arc::new(ConcurrentIndex::new()), cfg);
        lanes.submit(stored(1, 0, Some(7), 1)); // refused: the lane waits at the gate
                                                // Queue room for one while the lane is held (it may not have taken
                                                // the first yet: retry until the lane is inside the handler).
        let mut queued = 0;
        let mut id = 1;
        let full = loop {
            match lanes.try_submit(stored(1, id, None, 100 + id)) {
                Ok(()) => queued += 1,
                Err(Full(ev)) => break ev,
            }
            id += 1;
            assert!(queued <= 2, "a queue of one took {queued}");
        };
        assert_eq!(full.event_id, id, "the refused event comes back");
        gate.wait();
        lanes.flush();
        assert_eq!(lanes.apply_errors(), 1);
        assert_eq!(
            lanes.index().worker_block_count(WorkerKey::new(1, 0)),
            queued
        );
    }
}

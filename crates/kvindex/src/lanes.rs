//! Writer lanes: N threads applying events to a shared index, each worker
//! pinned to one lane so its events stay in order.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::event::{KvEvent, WorkerKey};
use crate::stats::IndexStats;
use crate::KvIndexer;

enum Msg {
    Event(KvEvent),
    Batch(Vec<KvEvent>),
    Flush(Sender<()>),
}

/// N writer lanes (threads) in front of any [`KvIndexer`]; each worker is
/// hashed to a fixed lane. Dropping `Lanes` drains and joins the threads.
pub struct Lanes<I: KvIndexer + ?Sized + 'static> {
    index: Arc<I>,
    senders: Vec<Sender<Msg>>,
    threads: Vec<JoinHandle<()>>,
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
    /// Starts `lanes` writer threads (at least one) over `index`.
    pub fn new(index: Arc<I>, lanes: usize) -> Self {
        let lanes = lanes.max(1);
        let mut senders = Vec::with_capacity(lanes);
        let mut threads = Vec::with_capacity(lanes);
        for i in 0..lanes {
            let (tx, rx): (Sender<Msg>, Receiver<Msg>) = unbounded();
            let idx = Arc::clone(&index);
            let t = std::thread::Builder::new()
                .name(format!("kvindex-lane-{i}"))
                .spawn(move || {
                    while let Some(m) = next_msg(&rx) {
                        match m {
                            // Errors are counted by the index; a lane keeps going.
                            Msg::Event(ev) => {
                                let _ = idx.apply(&ev);
                            }
                            Msg::Batch(evs) => {
                                for ev in &evs {
                                    let _ = idx.apply(ev);
                                }
                            }
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
        }
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.senders.len()
    }

    /// Enqueues `ev` on its worker's lane without blocking.
    pub fn submit(&self, ev: KvEvent) {
        let lane = lane_of(ev.worker, self.senders.len());
        // The receiver lives as long as `self`, so sending cannot fail.
        let _ = self.senders[lane].send(Msg::Event(ev));
    }

    /// Enqueues events that all belong to workers of lane `lane` (see
    /// [`lane_of`]) as one message; used by benchmarks to cut channel cost.
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

//! Sequence tracking for one publisher: which batches to apply, when to ask
//! for a replay, and when the index can no longer be trusted for a worker.
//!
//! Engines number their batches from 0 per process (the second frame of
//! every message). The [`Sequencer`] turns the numbers it sees, live and
//! replayed, into [`Step`]s; it does no I/O, so it is tested against a
//! model ([`tests`]) and the ingest loop only carries its steps out.
//!
//! * The batch after the last one applied: apply it.
//! * A gap (live seq past the next one wanted): ask the engine to replay
//!   from the next one wanted and hold live batches until the replay ends.
//!   Replayed batches fill the gap in order; duplicates are dropped.
//! * A replay that cannot fill the gap (the engine's buffer starts later,
//!   the replay brings nothing, times out, or the live batches held
//!   overflow their count or byte budget): clear the worker ([`Step::Clear`] with [`Clear::Resync`])
//!   and go on from the next batch there is. The index is never silently
//!   stale. A hole among the held batches past what a replay brought is a
//!   newer loss: replay again.
//! * A live seq at or below the last one heard live: the engine restarted.
//!   Clear the worker ([`Clear::Restart`]) and start over from that batch.
//!   (A restart is seen only this way: if every batch of the new process is
//!   lost until its seq passes the old process's, it reads as a gap.) A
//!   live seq below the next one wanted but above the last heard live was
//!   queued on the live socket while a replay brought it: a duplicate.
//! * The first batch heard, if it is not the one expected (0, or the one
//!   after a snapshot's seq): replay from the expected one first, so the
//!   worker counts as current only once its history is in.
//! * With no replay endpoint a gap cannot be filled: resync at once.
use std::collections::VecDeque;

/// A payload's size, for the byte budget of batches held during a replay.
pub trait Weighed {
    /// Bytes it occupies.
    fn bytes(&self) -> usize;
}

impl Weighed for u64 {
    fn bytes(&self) -> usize {
        8
    }
}

impl Weighed for (u32, u64) {
    fn bytes(&self) -> usize {
        12
    }
}

/// Why a worker's blocks are dropped from the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clear {
    /// The engine's seq went backwards: a new process, an empty cache.
    Restart,
    /// Batches are missing and cannot be replayed.
    Resync,
}

/// What the caller must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<P> {
    /// Apply this batch.
    Apply(u64, P),
    /// Drop the worker's blocks from the index.
    Clear(Clear),
    /// Ask the engine to replay from this seq.
    Replay(u64),
    /// Stop the replay in progress (its socket may be closed).
    CancelReplay,
}

/// One publisher's sequence state. `P` is the batch payload.
#[derive(Debug)]
pub struct Sequencer<P> {
    /// The next seq to apply; `None` until the first batch is heard.
    next: Option<u64>,
    /// The highest seq heard on the live stream (this process's).
    last_live: Option<u64>,
    /// The seq a first-heard publisher should start at.
    start: u64,
    replaying: bool,
    /// The replay in progress applied at least one batch.
    progressed: bool,
    can_replay: bool,
    held: VecDeque<(u64, P)>,
    held_bytes: usize,
    max_held: usize,
    max_held_bytes: usize,
    /// Batches dropped as duplicates.
    pub duplicates: u64,
    /// Times the live stream skipped seqs (batches lost in transit). A
    /// replay asked again for the same hole is not another gap.
    pub gaps: u64,
}

impl<P: Weighed> Sequencer<P> {
    /// A publisher heard for the first time, whose history is wanted from
    /// `start` (0, or a snapshot's seq + 1). `can_replay`: the engine has a
    /// replay endpoint. `max_held`: live batches held during a replay.
    pub fn new(start: u64, can_replay: bool, max_held: usize) -> Self {
        Self {
            next: None,
            last_live: None,
            start,
            replaying: false,
            progressed: false,
            can_replay,
            held: VecDeque::new(),
            held_bytes: 0,
            max_held: max_held.max(1),
            max_held_bytes: usize::MAX,
            duplicates: 0,
            gaps: 0,
        }
    }

    /// Also gives up a replay once the live batches held pass `bytes`.
    pub fn with_max_held_bytes(mut self, bytes: usize) -> Self {
        self.max_held_bytes = bytes.max(1);
        self
    }

    fn hold(&mut self, seq: u64, p: P) {
        self.held_bytes += p.bytes();
        self.held.push_back((seq, p));
    }

    fn hold_front(&mut self, seq: u64, p: P) {
        self.held_bytes += p.bytes();
        self.held.push_front((seq, p));
    }

    fn take_held(&mut self) -> Option<(u64, P)> {
        let (seq, p) = self.held.pop_front()?;
        self.held_bytes -= p.bytes();
        Some((seq, p))
    }

    fn drop_held(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
    }

    /// The next seq wanted, once any has been heard.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// True while a replay is in progress.
    pub fn replaying(&self) -> bool {
        self.replaying
    }

    /// True once the worker's history is in: a batch was applied and no
    /// replay is pending.
    pub fn current(&self) -> bool {
        self.next.is_some() && !self.replaying
    }

    /// Live batches held for a replay.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A batch from the live stream.
    pub fn live(&mut self, seq: u64, p: P) -> Vec<Step<P>> {
        let mut out = Vec::new();
        self.live_into(seq, p, &mut out);
        out
    }

    fn live_into(&mut self, seq: u64, p: P, out: &mut Vec<Step<P>>) {
        // The live stream itself going back (not a replay having run ahead
        // of batches still queued on it): the engine restarted.
        if self.last_live.is_some_and(|l| seq <= l) {
            if self.replaying {
                self.replaying = false;
                self.drop_held();
                out.push(Step::CancelReplay);
            }
            self.last_live = Some(seq);
            self.restart(seq, p, out);
            return;
        }
        if self.last_live.is_some_and(|l| seq > l + 1) {
            self.gaps += 1;
        }
        self.last_live = Some(seq);
        if self.replaying {
            self.hold(seq, p);
            if self.held.len() > self.max_held || self.held_bytes > self.max_held_bytes {
                self.replaying = false;
                out.push(Step::CancelReplay);
                self.progressed = false;
                self.resume(out);
            }
            return;
        }
        match self.next {
            None => self.first(seq, p, out),
            Some(n) if seq == n => self.apply(seq, p, out),
            // A replay brought it already.
            Some(n) if seq < n => self.duplicates += 1,
            Some(n) => {
                if self.can_replay {
                    self.hold(seq, p);
                    self.start_replay(n, out);
                } else {
                    out.push(Step::Clear(Clear::Resync));
                    self.apply(seq, p, out);
                }
            }
        }
    }

    fn first(&mut self, seq: u64, p: P, out: &mut Vec<Step<P>>) {
        if seq == self.start {
            self.apply(seq, p, out);
        } else if seq < self.start {
            // Below what a snapshot had: the engine restarted since.
            self.restart(seq, p, out);
        } else if self.can_replay {
            self.next = Some(self.start);
            self.hold(seq, p);
            self.start_replay(self.start, out);
        } else {
            out.push(Step::Clear(Clear::Resync));
            self.apply(seq, p, out);
        }
    }

    fn start_replay(&mut self, from: u64, out: &mut Vec<Step<P>>) {
        self.replaying = true;
        self.progressed = false;
        out.push(Step::Replay(from));
    }

    fn restart(&mut self, seq: u64, p: P, out: &mut Vec<Step<P>>) {
        out.push(Step::Clear(Clear::Restart));
        self.next = None;
        self.start = 0;
        self.first(seq, p, out);
    }

    fn apply(&mut self, seq: u64, p: P, out: &mut Vec<Step<P>>) {
        self.next = Some(seq.saturating_add(1));
        out.push(Step::Apply(seq, p));
    }

    /// A batch the engine replayed.
    pub fn replayed(&mut self, seq: u64, p: P) -> Vec<Step<P>> {
        let mut out = Vec::new();
        if !self.replaying {
            self.duplicates += 1;
            return out;
        }
        let n = self.next.unwrap_or(self.start);
        if seq < n {
            self.duplicates += 1;
        } else if seq == n {
            self.progressed = true;
            self.apply(seq, p, &mut out);
        } else {
            // The engine no longer holds [n, seq): that history is lost.
            self.progressed = true;
            out.push(Step::Clear(Clear::Resync));
            self.apply(seq, p, &mut out);
        }
        out
    }

    /// The replay ended: its end marker arrived (`complete`), or it timed
    /// out or failed. Held batches apply; what is still missing resyncs.
    pub fn replay_done(&mut self) -> Vec<Step<P>> {
        let mut out = Vec::new();
        if self.replaying {
            self.replaying = false;
            self.resume(&mut out);
        }
        out
    }

    /// Applies the held batches in order. A hole left after a replay that
    /// made progress is a newer loss: replay again from it. After one that
    /// brought nothing, the hole is history the engine cannot give: resync.
    fn resume(&mut self, out: &mut Vec<Step<P>>) {
        while let Some((seq, p)) = self.take_held() {
            match self.next {
                Some(n) if seq < n => self.duplicates += 1,
                Some(n) if seq == n => self.apply(seq, p, out),
                Some(n) if self.can_replay && self.progressed => {
                    self.hold_front(seq, p);
                    self.start_replay(n, out);
                    return;
                }
                _ => {
                    out.push(Step::Clear(Clear::Resync));
                    self.apply(seq, p, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn applied(steps: &[Step<u64>]) -> Vec<u64> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Apply(q, _) => Some(*q),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn in_order_applies_and_gaps_replay() {
        let mut s = Sequencer::new(0, true, 10);
        assert_eq!(s.live(0, 0), vec![Step::Apply(0, 0)]);
        assert!(s.current());
        assert_eq!(s.live(3, 3), vec![Step::Replay(1)]);
        assert!(!s.current());
        assert!(s.live(4, 4).is_empty());
        assert_eq!(s.replayed(0, 0), vec![]);
        assert_eq!(applied(&s.replayed(1, 1)), vec![1]);
        assert_eq!(applied(&s.replayed(2, 2)), vec![2]);
        assert_eq!(applied(&s.replayed(3, 3)), vec![3]);
        assert_eq!(applied(&s.replay_done()), vec![4]);
        assert_eq!(s.duplicates, 2);
        assert_eq!(s.gaps, 1);
        assert!(s.current());
    }

    #[test]
    fn a_hole_asked_for_twice_is_one_gap() {
        let mut s = Sequencer::new(0, true, 10);
        s.live(0, 0);
        assert_eq!(s.live(5, 5), vec![Step::Replay(1)]);
        // The replay brings 1 and 2, then ends (timed out): 3 and 4 are
        // still missing, so it is asked again.
        s.replayed(1, 1);
        s.replayed(2, 2);
        assert_eq!(s.replay_done(), vec![Step::Replay(3)]);
        assert_eq!(s.gaps, 1);
        // Another live loss is another gap.
        s.replayed(3, 3);
        s.replayed(4, 4);
        assert_eq!(applied(&s.replay_done()), vec![5]);
        assert_eq!(s.live(8, 8), vec![Step::Replay(6)]);
        assert_eq!(s.gaps, 2);
    }

    #[test]
    fn a_short_buffer_resyncs() {
        let mut s = Sequencer::new(0, true, 10);
        s.live(0, 0);
        s.live(5, 5);
        assert_eq!(
            s.replayed(3, 3),
            vec![Step::Clear(Clear::Resync), Step::Apply(3, 3)]
        );
        assert_eq!(applied(&s.replayed(4, 4)), vec![4]);
        assert_eq!(applied(&s.replay_done()), vec![5]);
        // A replay that times out with nothing resyncs over the hole.
        s.live(9, 9);
        assert_eq!(
            s.replay_done(),
            vec![Step::Clear(Clear::Resync), Step::Apply(9, 9)]
        );
    }

    #[test]
    fn going_backwards_is_a_restart_and_late_joiners_replay() {
        let mut s = Sequencer::new(0, true, 10);
        s.live(0, 0);
        s.live(1, 1);
        assert_eq!(
            s.live(0, 0),
            vec![Step::Clear(Clear::Restart), Step::Apply(0, 0)]
        );
        let mut late = Sequencer::new(0, true, 10);
        assert_eq!(late.live(7, 7), vec![Step::Replay(0)]);
        assert!(!late.current());
        let mut snap = Sequencer::new(5, true, 10);
        assert_eq!(snap.live(5, 5), vec![Step::Apply(5, 5)]);
        let mut snap = Sequencer::new(5, true, 10);
        assert_eq!(
            snap.live(2, 2),
            vec![Step::Clear(Clear::Restart), Step::Replay(0)]
        );
        let mut blind = Sequencer::new(0, false, 10);
        assert_eq!(
            blind.live(4, 4),
            vec![Step::Clear(Clear::Resync), Step::Apply(4, 4)]
        );
    }

    /// Holding past either bound (batches, or bytes: u64 payloads weigh 8,
    /// so two fit in 20 and a third does not) gives the replay up: the
    /// worker resyncs and the held batches apply in order.
    #[test]
    fn too_much_held_gives_up_the_replay() {
        let by_count = Sequencer::new(0, true, 2);
        let by_bytes = Sequencer::new(0, true, 100).with_max_held_bytes(20);
        for (bound, mut s) in [("batches", by_count), ("bytes", by_bytes)] {
            s.live(0, 0);
            assert_eq!(s.live(2, 2), vec![Step::Replay(1)], "{bound}");
            assert!(s.live(3, 3).is_empty(), "{bound}");
            assert_eq!(
                s.live(4, 4),
                vec![
                    Step::CancelReplay,
                    Step::Clear(Clear::Resync),
                    Step::Apply(2, 2),
                    Step::Apply(3, 3),
                    Step::Apply(4, 4)
                ],
                "{bound}"
            );
            assert_eq!((s.held(), s.held_bytes), (0, 0), "{bound}");
            assert!(s.current(), "{bound}");
            assert!(s.replayed(1, 1).is_empty(), "{bound}");
        }
    }

    /// What the publisher does, seen from the router.
    #[derive(Debug, Clone)]
    enum Ev {
        /// The engine publishes its next batch; it is queued on the way
        /// to the router (or dropped).
        Publish { dropped: bool },
        /// Up to `n` queued live batches reach the router, in order.
        Deliver { n: usize },
        /// The publisher restarts at seq 0 with an empty cache (what it had
        /// queued reaches the router first).
        Restart,
        /// The engine serves the pending replay: what its buffer held when
        /// the request arrived (`lag` batches ago, at most what was
        /// published since), then the end marker (a timeout ends it the
        /// same way).
        Serve { lag: u64 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            6 => any::<bool>().prop_map(|d| Ev::Publish { dropped: d }),
            4 => (1..4usize).prop_map(|n| Ev::Deliver { n }),
            1 => Just(Ev::Restart),
            3 => (0..3u64).prop_map(|lag| Ev::Serve { lag }),
        ]
    }

    proptest! {
        /// Against a publisher with a bounded replay buffer: batches apply
        /// at most once, in increasing order within a process; whenever the
        /// worker is current, everything applied since the last clear is
        /// exactly one process's consecutive batches, up to the last heard.
        #[test]
        fn model(evs in proptest::collection::vec(ev(), 0..80), buf in 1usize..6, max_held in 1usize..6) {
            // Payload: (process, seq).
            let mut s: Sequencer<(u32, u64)> = Sequencer::new(0, true, max_held);
            let mut proc_id = 0u32;
            let mut published: u64 = 0; // batches of this process so far
            let mut pending: Option<(u64, u64)> = None; // replay asked from, when
            let mut just_restarted = false;
            // Live batches on their way, in order.
            let mut wire: std::collections::VecDeque<(u32, u64)> = Default::default();
            // What the index holds: the batches applied since the last clear.
            let mut index: Vec<(u32, u64)> = Vec::new();
            let carry = |steps: Vec<Step<(u32, u64)>>, index: &mut Vec<(u32, u64)>, pending: &mut Option<(u64, u64)>, published: u64| -> Result<(), TestCaseError> {
                for st in steps {
                    match st {
                        Step::Apply(q, p) => {
                            prop_assert_eq!(q, p.1);
                            if let Some(last) = index.last() {
                                prop_assert!(p.0 > last.0 || (p.0 == last.0 && p.1 == last.1 + 1),
                                    "out of order: {:?} after {:?}", p, last);
                            }
                            index.push(p);
                        }
                        Step::Clear(_) => index.clear(),
                        Step::Replay(from) => *pending = Some((from, published)),
                        Step::CancelReplay => *pending = None,
                    }
                }
                Ok(())
            };
            for e in evs {
                match e {
                    Ev::Publish { dropped } => {
                        let q = published;
                        published += 1;
                        // A restart shows only in the seq of a batch the
                        // router hears: the new process's first one must
                        // arrive before its seq passes the old one's.
                        if dropped && !just_restarted { continue; }
                        just_restarted = false;
                        wire.push_back((proc_id, q));
                    }
                    Ev::Deliver { n } => {
                        for _ in 0..n {
                            let Some(b) = wire.pop_front() else { break };
                            let st = s.live(b.1, b);
                            carry(st, &mut index, &mut pending, published)?;
                        }
                    }
                    Ev::Restart => {
                        // The old process's connection drains before the
                        // new one's (an old batch heard after the new
                        // process's cannot be told from the new one's).
                        while let Some(b) = wire.pop_front() {
                            let st = s.live(b.1, b);
                            carry(st, &mut index, &mut pending, published)?;
                        }
                        proc_id += 1;
                        published = 0;
                        pending = None;
                        just_restarted = true;
                    }
                    Ev::Serve { lag } => {
                        let Some((from, asked_at)) = pending.take() else { continue };
                        let upto = published.saturating_sub(lag).max(asked_at).min(published);
                        let oldest = upto.saturating_sub(buf as u64);
                        let missing_kept = from >= oldest;
                        let mut cleared = false;
                        for q in from.max(oldest)..upto {
                            let st = s.replayed(q, (proc_id, q));
                            cleared |= st.iter().any(|x| matches!(x, Step::Clear(_)));
                            carry(st, &mut index, &mut pending, published)?;
                        }
                        let st = s.replay_done();
                        cleared |= st.iter().any(|x| matches!(x, Step::Clear(_)));
                        carry(st, &mut index, &mut pending, published)?;
                        // A buffer that still held everything missing fills
                        // the gap without a resync.
                        if missing_kept {
                            prop_assert!(!cleared, "resynced though the engine held [{}, {})", from, published);
                        }
                    }
                }
                if s.current() {
                    // Everything applied since the clear is one process's
                    // consecutive batches ending at the last one heard.
                    if let (Some(first), Some(last)) = (index.first(), index.last()) {
                        prop_assert_eq!(first.0, last.0);
                        prop_assert_eq!(index.len() as u64, last.1 - first.1 + 1);
                        prop_assert_eq!(s.next(), Some(last.1 + 1));
                    }
                }
            }
        }
    }
}

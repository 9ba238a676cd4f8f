//! Event ingest: ZMQ subscribers, replays, and applying batches to the
//! index.
//!
//! A fixed set of ingest threads (lanes) share the workers, each new worker
//! on the lane with the fewest; a worker lives on its lane for good, so
//! its batches apply in order, and
//! different workers apply in parallel (the index takes concurrent writers
//! for different workers). A thread waits in epoll on the notification
//! descriptors (`ZMQ_FD`) of its workers' SUB sockets and of the DEALER
//! sockets of replays in progress, drains a bounded number of messages
//! from each socket that may be ready in turn (one busy or broken
//! publisher cannot starve the rest), and carries out what the worker's
//! [`Sequencer`] says. ZMQ signals those descriptors on a change, not a
//! level: a socket stays marked ready until a receive finds it empty and
//! `ZMQ_EVENTS` agrees, and every [`SWEEP`] all sockets are looked at
//! anyway, so a lost signal could delay a batch by that much, never drop
//! it.
//!
//! Frames: live `[topic, seq, payload]` with `seq` 8 bytes big-endian.
//! Replay: the router sends `["", start_seq]` to the engine's ROUTER and
//! gets `["", seq, payload]` (or `["", topic, seq, payload]`) per batch,
//! then an end marker whose seq is -1.
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed, Ordering::Release};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};
use kvindex::{KvIndexer, WorkerKey};

use crate::convert::{Converter, EventIds, Outcome, Rejected};
use crate::record::ClearReason;
use crate::registry::{FeedState, Model, Worker};
use crate::replica::RelaySink;
use crate::seq::{Clear, Sequencer, Step, Weighed};
use crate::wire::decode_batch;

/// Ingest limits and knobs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Ingest threads.
    pub threads: usize,
    /// Topic prefix to subscribe to (empty: all).
    pub topic: Vec<u8>,
    /// Largest message a publisher may send; larger ones drop its
    /// connection (ZMQ_MAXMSGSIZE).
    pub max_frame_bytes: i64,
    /// Messages a SUB socket queues before dropping (ZMQ_RCVHWM).
    pub rcvhwm: i32,
    /// How long a replay may take.
    pub replay_timeout: Duration,
    /// Replays in progress at once, all workers.
    pub max_replays: usize,
    /// Live batches held per worker while its replay runs.
    pub max_held: usize,
    /// Bytes of live batches held per worker while its replay runs.
    pub max_held_bytes: usize,
    /// Storage tiers that enter the index besides GPU.
    pub extra_media: Vec<String>,
    /// Token ids one stored event may carry.
    pub max_event_tokens: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            topic: Vec::new(),
            max_frame_bytes: 64 << 20,
            rcvhwm: 100_000,
            replay_timeout: Duration::from_secs(5),
            max_replays: 8,
            max_held: 10_000,
            max_held_bytes: 64 << 20,
            extra_media: Vec::new(),
            max_event_tokens: 1 << 20,
        }
    }
}

/// Messages drained from one socket before the next gets a turn.
const DRAIN_BUDGET: usize = 256;
/// Longest a thread sleeps in poll, so commands are picked up.
const IDLE_POLL: Duration = Duration::from_millis(10);
/// How often every socket is looked at whether signalled or not.
const SWEEP: Duration = Duration::from_millis(100);

enum Cmd {
    Add(Box<Feed>),
    Remove(WorkerKey, String, Sender<()>),
}

/// The ingest threads.
pub struct Ingest {
    ctx: zmq::Context,
    cfg: Arc<IngestConfig>,
    lanes: Vec<Sender<Cmd>>,
    threads: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Which lane each (model, worker) feed is on.
    placed: parking_lot::Mutex<std::collections::HashMap<(String, WorkerKey), usize>>,
}

/// Why a feed could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FeedError(pub String);

impl Ingest {
    /// Starts the ingest threads.
    pub fn start(cfg: IngestConfig) -> Self {
        let ctx = zmq::Context::new();
        let cfg = Arc::new(cfg);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replays = Arc::new(AtomicUsize::new(0));
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..cfg.threads.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded();
            let lane = Lane {
                ctx: ctx.clone(),
                registry: None,
                next_id: 0,
                cfg: Arc::clone(&cfg),
                rx,
                feeds: Vec::new(),
                replay_cursor: 0,
                replays: Arc::clone(&replays),
                stop: Arc::clone(&stop),
            };
            lanes.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("kvrouter-ingest-{i}"))
                    .spawn(move || lane.run())
                    .expect("spawn an ingest thread"),
            );
        }
        Self {
            ctx,
            cfg,
            lanes,
            threads: parking_lot::Mutex::new(threads),
            stop,
            placed: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Subscribes to `worker`'s events into `model`'s index, its history
    /// wanted from seq `start` (0, or a snapshot's seq + 1); its index
    /// events are numbered from `first_id` (past those a snapshot loaded).
    /// With a `relay`, the batches go to the NATS stream instead of the
    /// index.
    pub fn add(
        &self,
        model: Arc<Model>,
        worker: Arc<Worker>,
        start: u64,
        first_id: u64,
        relay: Option<RelaySink>,
    ) -> Result<(), FeedError> {
        if self.stop.load(Relaxed) {
            return Err(FeedError("the router is stopping".into()));
        }
        let Some(endpoint) = worker.spec.endpoint.clone() else {
            return Ok(());
        };
        let sub = self
            .ctx
            .socket(zmq::SUB)
            .map_err(|e| FeedError(e.to_string()))?;
        let set = |r: zmq::Result<()>| r.map_err(|e| FeedError(e.to_string()));
        set(sub.set_maxmsgsize(self.cfg.max_frame_bytes))?;
        set(sub.set_rcvhwm(self.cfg.rcvhwm))?;
        set(sub.set_linger(0))?;
        set(sub.set_subscribe(&self.cfg.topic))?;
        sub.connect(&endpoint)
            .map_err(|e| FeedError(format!("cannot connect to {endpoint:?}: {e}")))?;
        if let Some(r) = &worker.spec.replay_endpoint {
            check_endpoint(r)?;
        }
        let feed = Feed {
            id: 0,
            live_ready: true,
            replay_ready: false,
            key: worker.spec.key,
            seq: Sequencer::new(
                start,
                worker.spec.replay_endpoint.is_some(),
                self.cfg.max_held,
            )
            .with_max_held_bytes(self.cfg.max_held_bytes),
            conv: Converter {
                block_size: worker.spec.block_size,
                extra_media: self.cfg.extra_media.clone(),
                max_tokens: self.cfg.max_event_tokens,
            },
            ids: EventIds::starting_at(first_id),
            sub,
            replay: None,
            replay_wanted: None,
            model,
            worker,
            relay,
        };
        // The lane with the fewest workers: a hash would leave lanes
        // uneven for the few workers a router has.
        let mut placed = self.placed.lock();
        let lane = match placed.get(&(feed.model.name.clone(), feed.key)) {
            Some(&l) => l,
            None => (0..self.lanes.len())
                .min_by_key(|&l| placed.values().filter(|&&x| x == l).count())
                .unwrap_or(0),
        };
        placed.insert((feed.model.name.clone(), feed.key), lane);
        drop(placed);
        self.lanes[lane]
            .send(Cmd::Add(Box::new(feed)))
            .map_err(|_| FeedError("ingest stopped".into()))
    }

    /// True if `model`'s worker `key` has a feed here.
    pub fn feeds(&self, model: &str, key: WorkerKey) -> bool {
        self.placed.lock().contains_key(&(model.to_string(), key))
    }

    /// Stops `key`'s feed for `model`; the receiver hears once its ingest
    /// thread will apply nothing more of it.
    pub fn remove(&self, key: WorkerKey, model: &str) -> Receiver<()> {
        let lane = self
            .placed
            .lock()
            .remove(&(model.to_string(), key))
            .unwrap_or(0);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let _ = self.lanes[lane].send(Cmd::Remove(key, model.to_string(), tx));
        rx
    }
}

impl Ingest {
    /// Stops the ingest threads and waits for them: nothing is applied
    /// after this returns.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Refuses endpoints ZMQ would reject only later, or silently.
pub fn check_endpoint(e: &str) -> Result<(), FeedError> {
    let ok = ["tcp://", "ipc://", "inproc://"]
        .iter()
        .any(|p| e.starts_with(p) && e.len() > p.len());
    if ok {
        Ok(())
    } else {
        Err(FeedError(format!(
            "{e:?} is not a ZMQ endpoint (tcp://HOST:PORT, ipc://PATH)"
        )))
    }
}

struct Replay {
    socket: zmq::Socket,
    deadline: Instant,
}

struct Feed {
    /// The lane's number for it: its epoll tokens are `2 id` (live) and
    /// `2 id + 1` (replay).
    id: usize,
    /// The SUB socket may hold messages (signalled, or not yet found empty).
    live_ready: bool,
    /// The same for the replay socket.
    replay_ready: bool,
    key: WorkerKey,
    model: Arc<Model>,
    worker: Arc<Worker>,
    sub: zmq::Socket,
    seq: Sequencer<zmq::Message>,
    conv: Converter,
    ids: EventIds,
    replay: Option<Replay>,
    /// A replay asked for but not started (all replay slots busy).
    replay_wanted: Option<u64>,
    /// Where batches go instead of the index (`--nats`).
    relay: Option<RelaySink>,
}

struct Lane {
    ctx: zmq::Context,
    /// Where the sockets' notification descriptors are registered.
    registry: Option<mio::Registry>,
    /// The next feed's id.
    next_id: usize,
    cfg: Arc<IngestConfig>,
    rx: Receiver<Cmd>,
    feeds: Vec<Feed>,
    replays: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Where the next search for a waiting replay starts: slots go round
    /// the feeds, so no worker waits behind others that keep wanting one.
    replay_cursor: usize,
}

impl Lane {
    fn run(mut self) {
        let mut poll = match mio::Poll::new() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "an ingest thread cannot create its epoll instance");
                return;
            }
        };
        self.registry = poll.registry().try_clone().ok();
        let mut events = mio::Events::with_capacity(1024);
        let mut swept = Instant::now();
        loop {
            if self.stop.load(Relaxed) {
                break;
            }
            loop {
                match self.rx.try_recv() {
                    Ok(Cmd::Add(f)) => self.add(*f),
                    Ok(Cmd::Remove(k, m, done)) => {
                        let replays = &self.replays;
                        self.feeds.retain_mut(|x| {
                            let gone = x.key == k && x.model.name == m;
                            if gone && x.replay.take().is_some() {
                                replays.fetch_sub(1, Relaxed);
                            }
                            if let Some(r) = x.relay.as_mut().filter(|_| gone) {
                                r.flush();
                            }
                            !gone
                        });
                        let _ = done.send(());
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                    Err(crossbeam_channel::TryRecvError::Disconnected) => return,
                }
            }
            self.start_wanted_replays();
            if self.feeds.is_empty() {
                match self.rx.recv_timeout(IDLE_POLL) {
                    Ok(Cmd::Add(f)) => self.add(*f),
                    Ok(Cmd::Remove(_, _, done)) => {
                        let _ = done.send(());
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                }
                continue;
            }
            let busy = self.feeds.iter().any(|f| f.live_ready || f.replay_ready);
            let wait = if busy { Duration::ZERO } else { IDLE_POLL };
            if poll.poll(&mut events, Some(wait)).is_ok() {
                for ev in events.iter() {
                    let (id, replay) = (ev.token().0 / 2, ev.token().0 % 2 == 1);
                    // Feeds stay in the order of their ids (pushed with the
                    // next id, removed in place). A removed feed's socket
                    // may still signal: no feed.
                    let at = self.feeds.binary_search_by_key(&id, |f| f.id);
                    if let Some(f) = at.ok().map(|i| &mut self.feeds[i]) {
                        if replay {
                            f.replay_ready = f.replay.is_some();
                        } else {
                            f.live_ready = true;
                        }
                    }
                }
            }
            if swept.elapsed() >= SWEEP {
                swept = Instant::now();
                for f in &mut self.feeds {
                    f.live_ready = true;
                    f.replay_ready = f.replay.is_some();
                }
            }
            for i in 0..self.feeds.len() {
                if self.feeds[i].live_ready {
                    let more = self.drain_live(i);
                    let f = &mut self.feeds[i];
                    f.live_ready = more || has_input(&f.sub);
                }
                if self.feeds[i].replay_ready {
                    let more = self.drain_replay(i);
                    let f = &mut self.feeds[i];
                    f.replay_ready = match &f.replay {
                        Some(r) => more || has_input(&r.socket),
                        None => false,
                    };
                }
            }
            self.expire_replays();
            // What this round read goes out as one message per worker.
            for f in &mut self.feeds {
                if let Some(r) = &mut f.relay {
                    r.flush();
                }
            }
        }
    }

    /// Takes on a feed (replacing one of the same worker and model).
    fn add(&mut self, mut f: Feed) {
        self.feeds
            .retain(|x| x.key != f.key || x.model.name != f.model.name);
        f.id = self.next_id;
        self.next_id += 1;
        f.live_ready = true;
        self.watch(&f.sub, 2 * f.id);
        self.feeds.push(f);
    }

    /// Registers `s`'s notification descriptor under `token`. Should that
    /// fail, the socket is still looked at every [`SWEEP`].
    fn watch(&self, s: &zmq::Socket, token: usize) {
        let Some(reg) = &self.registry else { return };
        let r = s.get_fd().map_err(std::io::Error::from).and_then(|fd| {
            reg.register(
                &mut mio::unix::SourceFd(&fd),
                mio::Token(token),
                mio::Interest::READABLE,
            )
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "a ZMQ socket's descriptor could not be watched");
        }
    }

    /// Reads up to [`DRAIN_BUDGET`] live messages; true if it read that
    /// many (more may wait).
    fn drain_live(&mut self, i: usize) -> bool {
        for _ in 0..DRAIN_BUDGET {
            let f = &mut self.feeds[i];
            let Some(frames) = recv_frames(&f.sub) else {
                return false;
            };
            let st = &f.worker.status;
            st.batches.fetch_add(1, Relaxed);
            // [topic, seq, payload]
            // u64::MAX has no successor: refused like a malformed frame.
            let parsed = match frames.as_slice() {
                [_, seq, _] => seq_of(seq).filter(|&s| s != u64::MAX),
                _ => None,
            };
            let Some(seq) = parsed else {
                st.decode_errors.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_frame_errors_total", "source" => "live").increment(1);
                tracing::warn!(worker = ?f.key, frames = frames.len(), "malformed live message");
                continue;
            };
            let Some(payload) = frames.into_iter().nth(2) else {
                continue;
            };
            let steps = f.seq.live(seq, payload);
            self.carry_out(i, steps);
        }
        true
    }

    /// Reads up to [`DRAIN_BUDGET`] replayed messages; true if it read
    /// that many and the replay goes on.
    fn drain_replay(&mut self, i: usize) -> bool {
        for _ in 0..DRAIN_BUDGET {
            let f = &mut self.feeds[i];
            let Some(r) = &f.replay else { return false };
            let Some(frames) = recv_frames(&r.socket) else {
                return false;
            };
            // ["", seq, payload] or ["", topic, seq, payload]
            let (seq, payload) = match frames.len() {
                3 => (&frames[1], 2),
                4 => (&frames[2], 3),
                _ => (&frames[0], usize::MAX),
            };
            if payload == usize::MAX || seq.len() != 8 {
                f.worker.status.decode_errors.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_frame_errors_total", "source" => "replay").increment(1);
                continue;
            }
            let raw = i64::from_be_bytes(seq[..].try_into().unwrap_or([0; 8]));
            if raw == -1 {
                self.finish_replay(i, false);
                return false;
            }
            if raw < 0 {
                self.feeds[i]
                    .worker
                    .status
                    .decode_errors
                    .fetch_add(1, Relaxed);
                continue;
            }
            let seq = raw as u64;
            let Some(payload) = frames.into_iter().nth(payload) else {
                continue;
            };
            let steps = self.feeds[i].seq.replayed(seq, payload);
            self.carry_out(i, steps);
        }
        self.feeds[i].replay.is_some()
    }

    fn finish_replay(&mut self, i: usize, timed_out: bool) {
        let f = &mut self.feeds[i];
        if f.replay.take().is_some() {
            self.replays.fetch_sub(1, Relaxed);
        }
        if timed_out {
            f.worker.status.replay_timeouts.fetch_add(1, Relaxed);
            tracing::warn!(worker = ?f.key, "replay timed out");
        }
        let steps = f.seq.replay_done();
        self.carry_out(i, steps);
    }

    fn expire_replays(&mut self) {
        let now = Instant::now();
        for i in 0..self.feeds.len() {
            if self.feeds[i]
                .replay
                .as_ref()
                .is_some_and(|r| r.deadline <= now)
            {
                self.finish_replay(i, true);
            }
        }
    }

    fn start_wanted_replays(&mut self) {
        let n = self.feeds.len();
        for k in 0..n {
            let i = (self.replay_cursor + k) % n;
            if let Some(from) = self.feeds[i].replay_wanted {
                self.start_replay(i, from);
                if self.feeds[i].replay_wanted.is_some() {
                    // No slot free: the next search starts here.
                    self.replay_cursor = i;
                    return;
                }
            }
        }
    }

    fn start_replay(&mut self, i: usize, from: u64) {
        let f = &mut self.feeds[i];
        let Some(ep) = f.worker.spec.replay_endpoint.clone() else {
            f.replay_wanted = None;
            return;
        };
        let taken = self
            .replays
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < self.cfg.max_replays).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            f.replay_wanted = Some(from);
            return;
        }
        f.replay_wanted = None;
        let started = (|| -> zmq::Result<zmq::Socket> {
            let s = self.ctx.socket(zmq::DEALER)?;
            s.set_linger(0)?;
            s.set_maxmsgsize(self.cfg.max_frame_bytes)?;
            // The engine sends its whole buffer at once and a ROUTER drops
            // what a full peer queue cannot take: no receive limit here
            // (the engine's buffer bounds a replay).
            s.set_rcvhwm(0)?;
            s.connect(&ep)?;
            s.send_multipart([&b""[..], &from.to_be_bytes()[..]], zmq::DONTWAIT)?;
            Ok(s)
        })();
        f.worker.status.replays.fetch_add(1, Relaxed);
        metrics::counter!("kvrouter_replays_total").increment(1);
        match started {
            Ok(socket) => {
                tracing::info!(worker = ?f.key, from, "replay requested");
                let token = 2 * f.id + 1;
                f.replay_ready = true;
                f.replay = Some(Replay {
                    socket,
                    deadline: Instant::now() + self.cfg.replay_timeout,
                });
                if let Some(r) = &self.feeds[i].replay {
                    self.watch(&r.socket, token);
                }
            }
            Err(e) => {
                // Counts as a replay that returned nothing.
                tracing::warn!(worker = ?f.key, error = %e, "replay request failed");
                self.replays.fetch_sub(1, Relaxed);
                let steps = f.seq.replay_done();
                self.carry_out(i, steps);
            }
        }
    }

    fn carry_out(&mut self, i: usize, steps: Vec<Step<zmq::Message>>) {
        for s in steps {
            match s {
                Step::Apply(seq, payload) => self.feeds[i].apply(seq, &payload),
                Step::Clear(why) => self.feeds[i].clear(why),
                Step::Replay(from) => {
                    // In turn with the workers already waiting for a slot.
                    self.feeds[i].replay_wanted = Some(from);
                    self.start_wanted_replays();
                }
                Step::CancelReplay => {
                    let f = &mut self.feeds[i];
                    f.replay_wanted = None;
                    if f.replay.take().is_some() {
                        self.replays.fetch_sub(1, Relaxed);
                    }
                }
            }
        }
        let f = &self.feeds[i];
        f.worker.status.duplicates.store(f.seq.duplicates, Relaxed);
        let gaps = f.worker.status.gaps.load(Relaxed);
        if f.seq.gaps != gaps {
            // Rare: no metrics lookup on the per-batch path otherwise.
            f.worker.status.gaps.store(f.seq.gaps, Relaxed);
            metrics::counter!("kvrouter_gaps_total").increment(f.seq.gaps.saturating_sub(gaps));
        }
        let state = if f.seq.current() {
            FeedState::Active
        } else if f.seq.replaying() {
            FeedState::Replaying
        } else {
            FeedState::Pending
        };
        f.worker.status.set_state(state);
    }
}

impl Weighed for zmq::Message {
    fn bytes(&self) -> usize {
        self.len()
    }
}

/// Most frames a message may have; the rest of a longer one are dropped
/// (it is malformed either way).
const MAX_FRAMES: usize = 8;

/// One whole multipart message, its frames received without copying;
/// `None` when nothing is waiting.
/// The socket holds a message to read (`ZMQ_EVENTS`, which also takes in
/// what its descriptor signalled).
fn has_input(s: &zmq::Socket) -> bool {
    s.get_events().is_ok_and(|e| e.contains(zmq::POLLIN))
}

fn recv_frames(s: &zmq::Socket) -> Option<Vec<zmq::Message>> {
    let first = s.recv_msg(zmq::DONTWAIT).ok()?;
    let mut more = first.get_more();
    let mut frames = vec![first];
    // The rest of a multipart message arrives with its first frame.
    while more {
        let Ok(m) = s.recv_msg(0) else { break };
        more = m.get_more();
        if frames.len() < MAX_FRAMES {
            frames.push(m);
        }
    }
    Some(frames)
}

fn seq_of(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// Per-batch tallies, flushed to the metrics recorder once per batch.
#[derive(Default)]
struct Tally {
    stored: u64,
    removed: u64,
    cleared: u64,
    rejected: u64,
    mismatched: u64,
    malformed: u64,
    other_tier: u64,
    unknown: u64,
    blocks: u64,
}

impl Feed {
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        let st = &self.worker.status;
        let batch = match decode_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                st.decode_errors.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_decode_errors_total").increment(1);
                tracing::warn!(worker = ?self.key, seq, error = %e, "undecodable batch");
                // Replicas see the seq go by, not a hole.
                if let Some(r) = &mut self.relay {
                    r.batch(seq, 0.0, Vec::new());
                }
                st.last_seq.store(seq, Release);
                return;
            }
        };
        st.last_ts.store(batch.ts.to_bits(), Relaxed);
        if let Some(r) = batch.dp_rank.filter(|&r| r != i64::from(self.key.dp_rank)) {
            // Two ranks' publishers on one endpoint, or a rank registered
            // under another: the blocks go to the registered key, but say so.
            if st.problem().is_none() {
                st.set_problem(format!(
                    "batches carry data-parallel rank {r}, but the worker is registered as rank {}",
                    self.key.dp_rank
                ));
            }
        }
        let mut t = Tally::default();
        let mut relayed = Vec::new();
        for ev in &batch.events {
            match self.conv.convert(ev) {
                Outcome::Index(data) => {
                    let (kind, n) = match &data {
                        kvindex::KvEventData::Stored { blocks, .. } => {
                            (&mut t.stored, blocks.len())
                        }
                        kvindex::KvEventData::Removed { hashes } => (&mut t.removed, hashes.len()),
                        kvindex::KvEventData::Cleared => (&mut t.cleared, 0),
                    };
                    if self.relay.is_some() {
                        relayed.push(data);
                        *kind += 1;
                        t.blocks += n as u64;
                        continue;
                    }
                    let ev = self.ids.event(self.key, data);
                    match self.model.index.apply(&ev) {
                        Ok(()) => {
                            *kind += 1;
                            t.blocks += n as u64;
                        }
                        Err(e) => {
                            t.rejected += 1;
                            tracing::debug!(worker = ?self.key, error = %e, "event rejected");
                        }
                    }
                }
                Outcome::OtherTier => t.other_tier += 1,
                Outcome::Unknown => t.unknown += 1,
                Outcome::Rejected(r @ Rejected::BlockSize { .. }) => {
                    t.mismatched += 1;
                    st.set_problem(r.to_string());
                }
                Outcome::Rejected(r) => {
                    t.malformed += 1;
                    tracing::debug!(worker = ?self.key, error = %r, "event malformed");
                }
            }
        }
        if let Some(r) = &mut self.relay {
            r.batch(seq, batch.ts, relayed);
        }
        let applied = t.stored + t.removed + t.cleared;
        st.events_applied.fetch_add(applied, Relaxed);
        st.events_rejected.fetch_add(t.rejected, Relaxed);
        st.block_size_mismatches.fetch_add(t.mismatched, Relaxed);
        st.decode_errors.fetch_add(t.malformed, Relaxed);
        st.other_tier.fetch_add(t.other_tier, Relaxed);
        st.unknown_kinds.fetch_add(t.unknown, Relaxed);
        for (kind, outcome, n) in [
            ("stored", "applied", t.stored),
            ("removed", "applied", t.removed),
            ("cleared", "applied", t.cleared),
            ("any", "rejected", t.rejected),
            ("stored", "block_size_mismatch", t.mismatched),
            ("any", "malformed", t.malformed),
            ("any", "other_tier", t.other_tier),
            ("unknown", "skipped", t.unknown),
        ] {
            if n > 0 {
                metrics::counter!("kvrouter_events_total", "kind" => kind, "outcome" => outcome)
                    .increment(n);
            }
        }
        if t.blocks > 0 {
            metrics::counter!("kvrouter_block_ops_total").increment(t.blocks);
        }
        if t.mismatched > 0 {
            tracing::warn!(worker = ?self.key, "events with the wrong block size rejected");
        }
        // Published once the batch is in: whoever reads this seq (a
        // snapshot, a replay driver) finds its events applied.
        st.last_seq.store(seq, Release);
    }

    fn clear(&mut self, why: Clear) {
        match &mut self.relay {
            Some(r) => r.clear(match why {
                Clear::Restart => ClearReason::Restart,
                Clear::Resync => ClearReason::Resync,
            }),
            None => self.model.index.remove_worker(self.key),
        }
        self.ids.reset();
        let st = &self.worker.status;
        match why {
            Clear::Restart => {
                st.restarts.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_restarts_total").increment(1);
                tracing::info!(worker = ?self.key, "engine restarted: its blocks are cleared");
            }
            Clear::Resync => {
                st.resyncs.fetch_add(1, Relaxed);
                metrics::counter!("kvrouter_resyncs_total").increment(1);
                tracing::warn!(worker = ?self.key, "history lost: its blocks are cleared");
            }
        }
    }
}

/// Seconds since the Unix epoch, for lag against engine timestamps.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

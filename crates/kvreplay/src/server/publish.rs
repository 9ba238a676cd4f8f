//! The KV event publisher: batches in vLLM's frames (`[topic, seq,
//! payload]`, seq 8 bytes big-endian from 0) on a PUB socket, and vLLM's
//! replay protocol on a ROUTER socket, both owned by one thread.
//!
//! A replay request is `["", from_seq]` from a DEALER; the answer is
//! `["", seq, payload]` for every batch still in the ring from `from_seq`
//! on, then `["", -1, ""]`. The ring keeps the last `replay_buffer`
//! batches.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::ServerError;

/// The seq of the end-of-replay marker: -1 as a signed 64-bit integer.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// How long the thread waits for a batch before looking at the replay
/// socket again.
const POLL: Duration = Duration::from_millis(5);

/// A message to the publisher thread.
enum Msg {
    /// An encoded batch to publish under the next seq.
    Batch(Vec<u8>),
    /// Stop the thread.
    Stop,
}

/// Where batches are handed to the publisher thread, in publication order.
#[derive(Clone)]
pub(crate) struct BatchSender(Sender<Msg>);

impl BatchSender {
    /// Queues an encoded batch; it gets the next seq. A stopped publisher
    /// drops it.
    pub(crate) fn send(&self, payload: Vec<u8>) {
        let _ = self.0.send(Msg::Batch(payload));
    }
}

/// The publisher thread and the endpoints it bound.
pub(crate) struct Publisher {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    /// The PUB endpoint as bound (a wildcard port resolved).
    pub(crate) events_endpoint: String,
    /// The ROUTER endpoint as bound, if any.
    pub(crate) replay_endpoint: Option<String>,
}

fn zmq_err(endpoint: &str) -> impl Fn(zmq::Error) -> ServerError + '_ {
    move |source| ServerError::Zmq {
        endpoint: endpoint.to_string(),
        source,
    }
}

fn bind(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    endpoint: &str,
) -> Result<(zmq::Socket, String), ServerError> {
    let err = zmq_err(endpoint);
    let s = ctx.socket(kind).map_err(&err)?;
    s.set_linger(0).map_err(&err)?;
    s.set_sndhwm(100_000).map_err(&err)?;
    s.bind(endpoint).map_err(&err)?;
    let bound = s
        .get_last_endpoint()
        .map_err(&err)?
        .unwrap_or_else(|_| endpoint.to_string());
    Ok((s, bound))
}

impl Publisher {
    /// Binds the PUB socket at `events` (and the ROUTER at `replay`) and
    /// starts the thread.
    pub(crate) fn start(
        events: &str,
        replay: Option<&str>,
        topic: String,
        replay_buffer: usize,
    ) -> Result<Self, ServerError> {
        let ctx = zmq::Context::new();
        let (pub_sock, events_endpoint) = bind(&ctx, zmq::PUB, events)?;
        let (router, replay_endpoint) = match replay {
            Some(r) => {
                let (s, ep) = bind(&ctx, zmq::ROUTER, r)?;
                (Some(s), Some(ep))
            }
            None => (None, None),
        };
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("engine-events".into())
            .spawn(move || {
                let mut t = Thread {
                    _ctx: ctx,
                    pub_sock,
                    router,
                    topic: topic.into_bytes(),
                    seq: 0,
                    ring: VecDeque::new(),
                    cap: replay_buffer,
                };
                t.run(&rx);
            })
            .map_err(ServerError::Io)?;
        Ok(Self {
            tx,
            thread: Some(thread),
            events_endpoint,
            replay_endpoint,
        })
    }

    /// A handle to queue batches with.
    pub(crate) fn sender(&self) -> BatchSender {
        BatchSender(self.tx.clone())
    }

    /// Stops the thread (batches queued before are still published) and
    /// waits for it.
    pub(crate) fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread's state: its sockets, the next seq and the replay ring.
struct Thread {
    /// Kept alive as long as the sockets.
    _ctx: zmq::Context,
    pub_sock: zmq::Socket,
    router: Option<zmq::Socket>,
    topic: Vec<u8>,
    seq: u64,
    ring: VecDeque<(u64, Vec<u8>)>,
    cap: usize,
}

impl Thread {
    fn run(&mut self, rx: &Receiver<Msg>) {
        loop {
            match rx.recv_timeout(POLL) {
                Ok(Msg::Batch(p)) => {
                    self.publish(p);
                    // Publish everything already queued before replays.
                    loop {
                        match rx.try_recv() {
                            Ok(Msg::Batch(p)) => self.publish(p),
                            Ok(Msg::Stop) => return,
                            Err(_) => break,
                        }
                    }
                }
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.serve_replays();
        }
    }

    fn publish(&mut self, payload: Vec<u8>) {
        let seq = self.seq;
        self.seq += 1;
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), &payload];
        // PUB never blocks: with no subscriber, or a full one, it drops.
        let _ = self.pub_sock.send_multipart(frames, 0);
        if self.cap > 0 {
            if self.ring.len() == self.cap {
                self.ring.pop_front();
            }
            self.ring.push_back((seq, payload));
        }
    }

    /// Answers every replay request waiting on the ROUTER socket.
    fn serve_replays(&mut self) {
        let Some(router) = &self.router else { return };
        while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
            // [identity, "", from_seq]; anything else is ignored.
            let [id, empty, from] = frames.as_slice() else {
                continue;
            };
            let (Ok(from), true) = (<[u8; 8]>::try_from(from.as_slice()), empty.is_empty()) else {
                continue;
            };
            let from = u64::from_be_bytes(from);
            for (seq, payload) in self.ring.iter().filter(|(s, _)| *s >= from) {
                let f: [&[u8]; 4] = [id, b"", &seq.to_be_bytes(), payload];
                let _ = router.send_multipart(f, 0);
            }
            let f: [&[u8]; 4] = [id, b"", &END_SEQ, b""];
            let _ = router.send_multipart(f, 0);
        }
    }
}

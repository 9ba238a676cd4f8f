//! Test support: the independent Python publisher, a router on loopback,
//! and a reference of what the router should answer.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kvindex::{
    local_block_hashes, sequence_hashes, ExternalHash, KvEvent, KvEventData, KvIndexer,
    ReferenceIndex, StoredBlock, WorkerKey,
};
use serde_json::{json, Value};

pub mod nats;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// A Python with pyzmq and msgspec: `target/pyenv`, set up with pip when
/// missing. `None` (the test skips, saying why) only outside CI.
pub fn python() -> Option<PathBuf> {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = target_dir().join("pyenv");
        let py = venv.join("bin/python");
        let works = |p: &PathBuf| {
            Command::new(p)
                .args(["-c", "import zmq, msgspec"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if works(&py) {
            return Some(py);
        }
        let setup = || -> Result<(), String> {
            let run = |c: &mut Command| -> Result<(), String> {
                let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "{c:?}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ))
                }
            };
            if !py.exists() {
                run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
            }
            run(Command::new(&py).args(["-m", "pip", "install", "-q", "pyzmq", "msgspec"]))
        };
        match setup() {
            Ok(()) if works(&py) => Some(py),
            r => {
                let why = r.err().unwrap_or_else(|| "imports still fail".into());
                if std::env::var_os("CI").is_some() {
                    panic!("the Python publisher cannot be set up: {why}");
                }
                eprintln!("SKIPPED: the Python publisher cannot be set up: {why}");
                None
            }
        }
    })
    .clone()
}

/// The Python publisher, one engine process.
pub struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its PUB endpoint.
    pub endpoint: String,
    /// Its replay endpoint.
    pub replay: String,
    /// The last seq published.
    pub last_seq: Option<u64>,
}

impl Publisher {
    /// Starts one: `encoding` array | map | sglang, `hashes` int | bytes.
    pub fn start(py: &PathBuf, encoding: &str, hashes: &str) -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/publisher.py");
        let mut child = Command::new(py)
            .arg(script)
            .args([encoding, hashes])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the publisher");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the publisher's ports");
        let v: Value = serde_json::from_str(&line).expect("ports as JSON");
        Self {
            endpoint: format!("tcp://127.0.0.1:{}", v["pub"]),
            replay: format!("tcp://127.0.0.1:{}", v["replay"]),
            child,
            stdin,
            stdout,
            last_seq: None,
        }
    }

    /// Sends one command; returns the answer.
    pub fn cmd(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").expect("write to the publisher");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("the publisher answers");
        let v: Value = serde_json::from_str(&line).expect("an answer as JSON");
        if let Some(s) = v["seq"].as_u64() {
            self.last_seq = Some(s);
        }
        v
    }

    /// Publishes a batch (or takes its seq and drops it on the way).
    pub fn batch(&mut self, events: Vec<Value>, drop: bool) -> u64 {
        let v = self.cmd(json!({"op": "batch", "events": events, "drop": drop}));
        v["seq"].as_u64().expect("a seq")
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A router serving on loopback from its own runtime thread.
pub struct Router {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    http: reqwest::blocking::Client,
}

impl Router {
    /// Starts one with `args` (its listen address is ignored).
    pub fn start(args: kvrouter::RouterArgs) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                addr_tx
                    .send(l.local_addr().expect("addr"))
                    .expect("send addr");
                let serve = kvrouter::serve(args, l, async {
                    let _ = rx.await;
                });
                tokio::select! {
                    r = serve => r.expect("the router runs"),
                    // A crash: no drain, no last publish, no lease release.
                    Ok(()) = kill_rx => {}
                }
            });
            rt.shutdown_background();
        });
        let addr = addr_rx.recv().expect("the router's address");
        let r = Self {
            base: format!("http://{addr}"),
            stop: Some(tx),
            kill: Some(kill_tx),
            thread: Some(thread),
            http: reqwest::blocking::Client::new(),
        };
        // Wait until it answers.
        let t = Instant::now();
        while r.http.get(r.url("/health")).send().is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the router never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    /// Asks the router to shut down without waiting for it (it drains
    /// first); dropping it then waits until it has stopped.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Stops the router as a crash would: its tasks dropped where they
    /// stand, nothing flushed or handed over.
    pub fn kill(mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stop = None;
    }

    /// Whether the router's thread has ended.
    pub fn stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// `base + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GET; (status, JSON body or null).
    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().expect("GET");
        let s = r.status().as_u16();
        (s, r.json().unwrap_or(Value::Null))
    }

    /// GET as text.
    pub fn text(&self, path: &str) -> String {
        self.http
            .get(self.url(path))
            .send()
            .expect("GET")
            .text()
            .expect("text")
    }

    /// POST JSON; (status, JSON body or null).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string().into_bytes())
    }

    /// POST raw bytes as JSON.
    pub fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.post_typed(path, "application/json", body)
    }

    /// POSTs `body` with the given content type.
    pub fn post_typed(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .expect("POST");
        let s = r.status().as_u16();
        (s, r.json().unwrap_or(Value::Null))
    }

    /// The feed detail of worker `id` rank `dp` in `model`.
    pub fn feed(&self, model: &str, id: u64, dp: u32) -> Value {
        let (_, ws) = self.get(&format!("/workers?model_name={model}"));
        for w in ws.as_array().into_iter().flatten() {
            if w["instance_id"] == id {
                return w["feeds"][dp.to_string()].clone();
            }
        }
        Value::Null
    }

    /// Waits until worker `id`'s feed has applied `seq` and is active.
    pub fn wait_for(&self, model: &str, id: u64, seq: u64) {
        let t = Instant::now();
        loop {
            let f = self.feed(model, id, 0);
            if f["last_seq"] == seq && f["state"] == "active" {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "worker {id} never reached seq {seq}: {f}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Router settings for tests: block size 4, model "m", fast timeouts.
pub fn args() -> kvrouter::RouterArgs {
    let mut a = kvrouter::RouterArgs::defaults();
    a.model = "m".into();
    a.block_size = BS as u64;
    a.replay_timeout = Duration::from_secs(2);
    a.connect_timeout = Duration::from_secs(1);
    a
}

/// Tokens per block in these tests.
pub const BS: usize = 4;

/// Prompts sharing prefixes: prompt `i` is one of four system prompts
/// (3 blocks) followed by its own blocks.
pub fn prompt(i: u32, blocks: usize) -> Vec<u32> {
    let mut t: Vec<u32> = (0..(3 * BS) as u32).map(|x| 1000 * (i % 4) + x).collect();
    let own = blocks.saturating_sub(3) * BS;
    t.extend((0..own as u32).map(|x| 1_000_000 + i * 10_000 + x));
    t.truncate(blocks * BS);
    t
}

/// One engine's cache as the test drives it: which chains it holds, the
/// events that made it, and the reference index those events build.
pub struct Engine {
    /// Its key.
    pub key: WorkerKey,
    /// Sequence hashes held, with their parent's.
    held: std::collections::BTreeMap<u64, Option<u64>>,
    next_id: u64,
}

impl Engine {
    /// An empty cache.
    pub fn new(id: u64) -> Self {
        Self {
            key: WorkerKey::new(id, 0),
            held: Default::default(),
            next_id: 0,
        }
    }

    /// Stores the first `blocks` blocks of prompt `p`: returns the wire
    /// event and the index event, or `None` if all are held.
    pub fn store(&mut self, p: u32, blocks: usize) -> Option<(Value, KvEvent)> {
        let toks = prompt(p, blocks);
        let locals = local_block_hashes(&toks, BS, None);
        let seqs = sequence_hashes(&locals);
        let have = seqs
            .iter()
            .take_while(|s| self.held.contains_key(s))
            .count();
        if have == seqs.len() {
            return None;
        }
        let parent = have.checked_sub(1).map(|i| seqs[i]);
        for i in have..seqs.len() {
            self.held.insert(seqs[i], i.checked_sub(1).map(|j| seqs[j]));
        }
        let wire = json!({
            "kind": "stored",
            "hashes": seqs[have..],
            "parent": parent,
            "tokens": toks[have * BS..],
            "block_size": BS,
        });
        let blocks = locals[have..]
            .iter()
            .zip(&seqs[have..])
            .map(|(&local, &s)| StoredBlock {
                external: ExternalHash(s),
                local,
            })
            .collect();
        let ev = self.event(KvEventData::Stored {
            parent: parent.map(ExternalHash),
            blocks,
        });
        Some((wire, ev))
    }

    /// Evicts up to `n` leaf blocks (blocks with no held child).
    pub fn evict(&mut self, n: usize) -> Option<(Value, KvEvent)> {
        let parents: std::collections::BTreeSet<u64> =
            self.held.values().flatten().copied().collect();
        let leaves: Vec<u64> = self
            .held
            .keys()
            .filter(|k| !parents.contains(k))
            .take(n)
            .copied()
            .collect();
        if leaves.is_empty() {
            return None;
        }
        for l in &leaves {
            self.held.remove(l);
        }
        let wire = json!({"kind": "removed", "hashes": leaves});
        let ev = self.event(KvEventData::Removed {
            hashes: leaves.iter().map(|&h| ExternalHash(h)).collect(),
        });
        Some((wire, ev))
    }

    /// Drops everything.
    pub fn clear(&mut self) -> (Value, KvEvent) {
        self.held.clear();
        (json!({"kind": "cleared"}), self.event(KvEventData::Cleared))
    }

    fn event(&mut self, data: KvEventData) -> KvEvent {
        let e = KvEvent {
            worker: self.key,
            event_id: self.next_id,
            data,
        };
        self.next_id += 1;
        e
    }

    /// A batch of random events (store, evict, rarely clear) from `rng`.
    pub fn random_batch(&mut self, rng: &mut u64, n: usize) -> (Vec<Value>, Vec<KvEvent>) {
        let mut wire = Vec::new();
        let mut evs = Vec::new();
        for _ in 0..n {
            let r = next(rng);
            let got = match r % 20 {
                0..=12 => self.store((r >> 8) as u32 % 24, 1 + (r >> 16) as usize % 8),
                13..=18 => self.evict(1 + (r >> 8) as usize % 3),
                _ if r.is_multiple_of(7) => Some(self.clear()),
                _ => None,
            };
            if let Some((w, e)) = got {
                wire.push(w);
                evs.push(e);
            }
        }
        (wire, evs)
    }
}

/// xorshift64*.
pub fn next(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// What the router should answer: a reference index fed the same events.
pub struct Expect {
    /// The reference.
    pub index: ReferenceIndex,
}

impl Expect {
    /// Empty.
    pub fn new() -> Self {
        Self {
            index: ReferenceIndex::new(),
        }
    }

    /// Applies `evs` (renumbered per worker as the router numbers them).
    pub fn apply(&self, evs: &[KvEvent]) {
        for e in evs {
            let _ = self.index.apply(e);
        }
    }

    /// Forgets a worker (the router cleared it).
    pub fn clear(&self, w: WorkerKey) {
        self.index.remove_worker(w);
    }

    /// Checks every prompt's `/query` scores and every worker's block count.
    pub fn check(&self, r: &Router, model: &str, workers: &[WorkerKey]) {
        for p in 0..24u32 {
            for blocks in [1usize, 3, 5, 8] {
                let toks = prompt(p, blocks);
                let want = self
                    .index
                    .find_matches(&local_block_hashes(&toks, BS, None));
                let (s, got) = r.post("/query", &json!({"token_ids": toks, "model_name": model}));
                assert_eq!(s, 200, "{got}");
                for &w in workers {
                    let g = got["scores"][w.worker_id.to_string()][w.dp_rank.to_string()]
                        .as_u64()
                        .unwrap_or(0);
                    assert_eq!(
                        g,
                        u64::from(want.get(w)) * BS as u64,
                        "prompt {p} ({blocks} blocks), worker {w:?}: {got}"
                    );
                }
            }
        }
        for &w in workers {
            let f = r.feed(model, w.worker_id, w.dp_rank);
            assert_eq!(
                f["blocks"].as_u64(),
                Some(self.index.worker_block_count(w) as u64),
                "worker {w:?}: {f}"
            );
        }
    }
}

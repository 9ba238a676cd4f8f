//! kvindex's `ConcurrentIndex` (`concurrent`) against Dynamo's CRTC
//! (`dynamo-kv-router` 1.6.1, `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>`,
//! `dynamo-crtc`) and kvindex's `ReferenceIndex` (`reference`), fed the
//! identical events and lookups.
//!
//! The events and lookups are the timeline `arbor kv replay --stress`
//! replays (`kvreplay::timeline`): a Mooncake trace (`--trace FILE`, scaled
//! by `--trace-length-factor`, `--trace-duplication-factor`,
//! `--trace-block-size`, `--block-size`) or the synthetic workload, routed
//! through `--workers` simulated engines by `--stress-policy` (random by
//! default). The flags are `arbor kv replay`'s own (`arbor::ReplayArgs`,
//! flattened); `--event-lanes` (alias `--lanes`) and `--query-lanes` (alias
//! `--readers`) set the harness, the flags of the routing comparison and
//! of the outputs are accepted and ignored.
//!
//! Every index runs in the same harness: one producer thread submits the
//! events in time order to N event lanes (kvindex's `Lanes` for ours and the
//! reference, the `ThreadPoolIndexer`'s N worker threads for Dynamo; a
//! worker's events always on one lane) and waits until they are applied,
//! while R lookup threads run the lookups (dealt in turn, each thread's in
//! time order). Two modes:
//!
//! 1. **Overload**: every deadline is now; each side runs as fast as it
//!    can. A lookup waits only until the producer has submitted the events
//!    before it in time order, so the lookups interleave with the writes as
//!    in the timeline and every index runs the same lookups once (Dynamo's
//!    unbounded queues are flushed every 4096 events per lane, the bound of
//!    kvindex's lanes, so neither producer runs further ahead). Write
//!    capacity is hashes stored plus hashes removed over the time until the
//!    last event is applied; lookups report their service time (the time
//!    inside `find_matches`).
//! 2. **Fixed rates** (`--rate`, block operations per second as the stress
//!    replay counts them: hashes looked up, stored and removed): the
//!    timeline is compressed so that it offers that rate; the producer and
//!    the lookup threads wait for each entry's deadline (to 1 ms, as the
//!    stress replay). An index kept up when everything finished within
//!    1.1 x the window. Lookups report service time and, apart, queueing
//!    (how late each started after its deadline).
//!
//! Agreement: a sequential pass applies the timeline in time order to all
//! three and compares the scores of every lookup at that point (quiescent:
//! Dynamo's lane flushed first), and every run's final state is compared
//! with the sequential pass's on every lookup. Memory: each index populated
//! alone, heap bytes per stored (worker, block) pair, counted per thread
//! shard (`test_support::counting`: one counter every thread writes would
//! be measured with the indexes), and how long that population took (the
//! events applied alone, no lookups). `--only NAME` runs one index's
//! overload runs and nothing else, for a profiler.
//!
//! ```sh
//! cd benches-peers/dynamo-crtc
//! cargo run --release -- --lanes 1,2,4,8 --readers 4 --repeats 5
//! cargo run --release -- --trace ../../../shared/data/mooncake/mooncake_trace_1000.jsonl \
//!     --workers 128 --trace-duplication-factor 4 --block-size 128 --lanes 1,2 --rate 2e6,4e6
//! ```

use std::alloc::System;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use clap::{CommandFactory, FromArgMatches, Parser};
use dynamo_kv_router::concurrent_radix_tree_compressed::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};
use hdrhistogram::Histogram;
use kvindex::{
    ConcurrentIndex, ExternalHash, KvEvent, KvEventData, KvIndexer, Lanes, LocalHash,
    OverlapScores, ReferenceIndex, WorkerKey,
};
use kvreplay::replay::TimelineEntry;
use kvreplay::{NoProgress, ReplayOptions, WorkloadSource};
use test_support::counting::{live, Counting};

/// The command line.
#[derive(Parser)]
#[command(about = "kvindex against Dynamo's CRTC and the reference on the identical timeline")]
struct Args {
    /// Interleaved runs per index and setting; medians are reported.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Offered rates to run at, block operations per second (hashes looked
    /// up, stored and removed), comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "OPS_PER_S")]
    rate: Vec<f64>,
    /// Skip the overload runs.
    #[arg(long)]
    no_overload: bool,
    /// Skip the sequential agreement pass.
    #[arg(long)]
    no_agreement: bool,
    /// Run only this index's overload runs and print its figures (to
    /// profile one index alone): concurrent, dynamo-crtc or reference.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(NAMES))]
    only: Option<String>,
    /// Keep the simulated engines' own external block hashes (salted per
    /// worker, as engines with per-process hash seeds publish them) instead
    /// of renaming them, per worker, to the sequence hash of the block's
    /// prefix (what engines with deterministic hashing publish, and what
    /// Dynamo's CRTC needs: it refuses a store whose parent hash another
    /// worker's path names differently).
    #[arg(long)]
    engine_hashes: bool,
    #[command(flatten)]
    replay: arbor::ReplayArgs,
}

/// The indexes, in the order each repeat runs them.
const NAMES: [&str; 3] = ["concurrent", "dynamo-crtc", "reference"];

/// The system allocator, counted per thread shard: the producer, the lanes
/// and the lookup threads all allocate, and one process-wide counter would
/// have every allocation take its cache line from the other cores.
#[global_allocator]
static A: Counting<System> = Counting(System);

fn to_dynamo(ev: &KvEvent) -> RouterEvent {
    let data = match &ev.data {
        KvEventData::Stored { parent, blocks } => KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(|p| ExternalSequenceBlockHash(p.0)),
            start_position: None,
            blocks: blocks
                .iter()
                .map(|b| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(b.external.0),
                    tokens_hash: LocalBlockHash(b.local.0),
                    mm_extra_info: None,
                })
                .collect(),
        }),
        KvEventData::Removed { hashes } => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: hashes
                .iter()
                .map(|h| ExternalSequenceBlockHash(h.0))
                .collect(),
        }),
        KvEventData::Cleared => KvCacheEventData::Cleared,
    };
    RouterEvent::new(
        ev.worker.worker_id,
        KvCacheEvent {
            event_id: ev.event_id,
            data,
            dp_rank: ev.worker.dp_rank,
        },
    )
}

/// One entry of the timeline in time order.
#[derive(Clone, Copy)]
enum Entry {
    /// Event number `i`.
    Event(usize),
    /// Lookup number `i`.
    Lookup(usize),
}

/// A lookup's answer: (worker id, dp rank, score) with score > 0, sorted.
type Scores = Vec<(u64, u32, u32)>;

fn ours_scores(s: &OverlapScores) -> Scores {
    let mut v: Scores = s
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(w, n)| (w.worker_id, w.dp_rank, n))
        .collect();
    v.sort_unstable();
    v
}

fn dynamo_scores(s: &dynamo_kv_router::protocols::OverlapScores) -> Scores {
    let mut v: Scores = s
        .scores
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(w, n)| (w.worker_id, w.dp_rank, *n))
        .collect();
    v.sort_unstable();
    v
}

/// The timeline, owned, in both sides' forms.
struct Data {
    /// Every event, in time order.
    events: Vec<KvEvent>,
    /// Dynamo's form of each event.
    dyn_events: Vec<RouterEvent>,
    /// Each event's simulated time, µs.
    event_us: Vec<u64>,
    /// Every lookup.
    queries: Vec<Vec<LocalHash>>,
    /// Dynamo's form of each lookup.
    dyn_queries: Vec<Vec<LocalBlockHash>>,
    /// Per lookup thread: (simulated time µs, lookup number), in time order.
    query_lanes: Vec<Vec<(u64, usize)>>,
    /// Every entry in time order.
    order: Vec<Entry>,
    /// Per lookup: the events before it in time order.
    query_gate: Vec<usize>,
    /// Latest simulated time, µs.
    span_us: u64,
    /// Hashes stored plus hashes removed.
    event_ops: u64,
    /// Hashes looked up.
    query_ops: u64,
    /// Tokens per block (Dynamo's `ThreadPoolIndexer` takes it).
    block_size: u32,
}

/// Renames each worker's external block hashes to the sequence hash of the
/// block's prefix of local hashes (`kvindex::sequence_hashes`), the same on
/// every worker: a one-to-one renaming per worker, so every index's answers
/// are unchanged. `events` in time order (each worker's in publication
/// order).
fn deterministic_hashes(events: &mut [KvEvent]) {
    let mut names: HashMap<WorkerKey, HashMap<u64, u64>> = HashMap::new();
    for ev in events {
        let m = names.entry(ev.worker).or_default();
        match &mut ev.data {
            KvEventData::Stored { parent, blocks } => {
                let mut prev = parent.map(|p| *m.get(&p.0).expect("parent stored before"));
                *parent = prev.map(ExternalHash);
                for b in blocks {
                    let h = match prev {
                        None => b.local.0,
                        Some(p) => kvindex::next_sequence_hash(p, b.local),
                    };
                    m.insert(b.external.0, h);
                    b.external = ExternalHash(h);
                    prev = Some(h);
                }
            }
            KvEventData::Removed { hashes } => {
                for h in hashes {
                    *h = ExternalHash(m.remove(&h.0).expect("removed block stored before"));
                }
            }
            KvEventData::Cleared => m.clear(),
        }
    }
}

impl Data {
    fn new(
        opts: &ReplayOptions,
        readers: usize,
        engine_hashes: bool,
    ) -> Result<Self, kvreplay::Error> {
        let tl = kvreplay::timeline(opts, &NoProgress)?;
        let lanes = tl.lanes(1, readers);
        let mut events: Vec<KvEvent> = lanes.events[0].iter().map(|(_, e)| (*e).clone()).collect();
        if !engine_hashes {
            deterministic_hashes(&mut events);
        }
        let event_us = lanes.events[0].iter().map(|(t, _)| *t).collect();
        let mut queries = Vec::new();
        let mut number = HashMap::new();
        let query_lanes = lanes
            .queries
            .iter()
            .map(|lane| {
                lane.iter()
                    .map(|(t, h)| {
                        number.insert(h.as_ptr() as usize, queries.len());
                        queries.push(h.to_vec());
                        (*t, queries.len() - 1)
                    })
                    .collect()
            })
            .collect();
        let mut next_event = 0;
        let order: Vec<Entry> = tl
            .in_time_order()
            .into_iter()
            .map(|(_, e)| match e {
                TimelineEntry::Event(_) => {
                    next_event += 1;
                    Entry::Event(next_event - 1)
                }
                TimelineEntry::Query(h) => Entry::Lookup(number[&(h.as_ptr() as usize)]),
            })
            .collect();
        let mut query_gate = vec![0; queries.len()];
        let mut seen = 0;
        for e in &order {
            match *e {
                Entry::Event(_) => seen += 1,
                Entry::Lookup(q) => query_gate[q] = seen,
            }
        }
        Ok(Self {
            query_gate,
            dyn_events: events.iter().map(to_dynamo).collect(),
            dyn_queries: queries
                .iter()
                .map(|q| q.iter().map(|h| LocalBlockHash(h.0)).collect())
                .collect(),
            events,
            event_us,
            queries,
            query_lanes,
            order,
            span_us: tl.span_us().max(1),
            event_ops: lanes.event_block_ops(),
            query_ops: lanes.query_block_ops(),
            block_size: opts.sim.engine.block_size as u32,
        })
    }

    fn total_ops(&self) -> u64 {
        self.event_ops + self.query_ops
    }
}

/// An entry runs at once when its deadline is less than this far away
/// (the stress replay's timer granularity).
const GRANULARITY: Duration = Duration::from_millis(1);

fn wait_until(target: Instant) {
    let now = Instant::now();
    if target > now + GRANULARITY {
        std::thread::sleep(target - now);
    }
}

/// Nanoseconds, at least 1 (the histograms' lowest value).
fn ns(d: Duration) -> u64 {
    d.as_nanos().clamp(1, 1 << 40) as u64
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 1 << 40, 3).expect("histogram bounds")
}

/// What one run measured.
struct RunStats {
    /// Start until the last event was applied, s.
    write_s: f64,
    /// Start until the last lookup finished, s.
    lookup_s: f64,
    /// Time inside `find_matches`, ns.
    service: Histogram<u64>,
    /// Start of each lookup after its deadline, ns (one record per lookup
    /// run).
    queueing: Histogram<u64>,
    /// Lookups whose answer differs from the sequential pass's final state
    /// (checked after the run, quiescent).
    final_disagreements: usize,
}

impl RunStats {
    fn elapsed_s(&self) -> f64 {
        self.write_s.max(self.lookup_s)
    }
}

/// Runs the events through `submit` (then `flush`, which returns once all
/// are applied) from this thread at their `deadlines` after the start,
/// while one thread per lookup lane runs `lookup` at the lanes' deadlines;
/// with a `gate`, lookup `q` also waits until `gate[q]` events have been
/// submitted (the events before it in time order).
fn harness<T: Send>(
    items: Vec<T>,
    deadlines: &[Duration],
    mut submit: impl FnMut(T),
    flush: impl FnOnce(),
    lanes: &[Vec<(Duration, usize)>],
    lookup: &(dyn Fn(usize) + Sync),
    gate: Option<&[usize]>,
) -> (f64, f64, Histogram<u64>, Histogram<u64>) {
    let barrier = Barrier::new(lanes.len() + 1);
    let start_cell = OnceLock::new();
    let submitted = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .iter()
            .map(|lane| {
                let (barrier, start_cell, submitted) = (&barrier, &start_cell, &submitted);
                s.spawn(move || {
                    let (mut service, mut queueing) = (hist(), hist());
                    barrier.wait();
                    let start: Instant = *start_cell.get().expect("start set");
                    for &(at, q) in lane {
                        let target = start + at;
                        wait_until(target);
                        if let Some(g) = gate {
                            while submitted.load(Ordering::Acquire) < g[q] {
                                std::thread::yield_now();
                            }
                        }
                        let t0 = Instant::now();
                        lookup(q);
                        let t1 = Instant::now();
                        service.saturating_record(ns(t1 - t0));
                        queueing.saturating_record(ns(t0.saturating_duration_since(target)));
                    }
                    (service, queueing, Instant::now())
                })
            })
            .collect();
        let start = Instant::now() + Duration::from_millis(2);
        start_cell.set(start).expect("set once");
        barrier.wait();
        for (k, (item, at)) in items.into_iter().zip(deadlines).enumerate() {
            wait_until(start + *at);
            submit(item);
            submitted.store(k + 1, Ordering::Release);
        }
        flush();
        let write_s = start.elapsed().as_secs_f64();
        let (mut service, mut queueing) = (hist(), hist());
        let mut lookup_s = 0f64;
        for h in handles {
            let (s, q, end) = h.join().expect("lookup thread");
            service.add(s).unwrap();
            queueing.add(q).unwrap();
            lookup_s = lookup_s.max(end.saturating_duration_since(start).as_secs_f64());
        }
        (write_s, lookup_s, service, queueing)
    })
}

/// One run of index `name` with `lanes` event lanes; `window` compresses
/// the timeline (`None`: overload, every deadline now).
fn run_index(
    name: &str,
    data: &Data,
    lanes: usize,
    window: Option<Duration>,
    expected: &[Scores],
    rt: &tokio::runtime::Runtime,
) -> RunStats {
    let at = |t: u64| match window {
        None => Duration::ZERO,
        Some(w) => {
            Duration::from_nanos((u128::from(t) * w.as_nanos() / u128::from(data.span_us)) as u64)
        }
    };
    let deadlines: Vec<Duration> = data.event_us.iter().map(|t| at(*t)).collect();
    let qlanes: Vec<Vec<(Duration, usize)>> = data
        .query_lanes
        .iter()
        .map(|l| l.iter().map(|(t, q)| (at(*t), *q)).collect())
        .collect();
    let (write_s, lookup_s, service, queueing, final_disagreements) = if name == "dynamo-crtc" {
        let idx =
            ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), lanes, data.block_size);
        let items = data.dyn_events.clone();
        let dq = &data.dyn_queries;
        // Its queues are unbounded: in overload, a flush after every
        // `DEFAULT_QUEUE` events per lane keeps the producer as far ahead of
        // the lanes as kvindex's bounded lanes let it run.
        let mut sent = 0usize;
        let (w, l, s, q) = harness(
            items,
            &deadlines,
            |ev| {
                idx.enqueue_event(ev).expect("enqueue");
                sent += 1;
                if window.is_none() && sent.is_multiple_of(kvindex::DEFAULT_QUEUE * lanes) {
                    rt.block_on(idx.flush_and_wait()).expect("flush");
                }
            },
            || rt.block_on(idx.flush_and_wait()).expect("flush"),
            &qlanes,
            &|i| {
                std::hint::black_box(idx.backend().find_matches(&dq[i], false));
            },
            window.is_none().then_some(&data.query_gate[..]),
        );
        let bad = dq
            .iter()
            .zip(expected)
            .filter(|(q, e)| dynamo_scores(&idx.backend().find_matches(q, false)) != **e)
            .count();
        (w, l, s, q, bad)
    } else {
        let ix: Arc<dyn KvIndexer> = if name == "concurrent" {
            Arc::new(ConcurrentIndex::new())
        } else {
            Arc::new(ReferenceIndex::new())
        };
        let l = Lanes::new(ix.clone(), lanes);
        let items = data.events.clone();
        let qs = &data.queries;
        let (w, lk, s, q) = harness(
            items,
            &deadlines,
            |ev| l.submit(ev),
            || l.flush(),
            &qlanes,
            &|i| {
                std::hint::black_box(ix.find_matches(&qs[i]));
            },
            window.is_none().then_some(&data.query_gate[..]),
        );
        assert_eq!(l.apply_errors(), 0, "{name}: events refused");
        drop(l);
        let bad = qs
            .iter()
            .zip(expected)
            .filter(|(q, e)| ours_scores(&ix.find_matches(q)) != **e)
            .count();
        (w, lk, s, q, bad)
    };
    RunStats {
        write_s,
        lookup_s,
        service,
        queueing,
        final_disagreements,
    }
}

/// What the sequential pass found.
struct Agreement {
    /// Lookups compared.
    lookups: usize,
    /// Lookups where ours and the reference differ.
    ours_vs_reference: usize,
    /// Lookups where ours and Dynamo differ.
    ours_vs_dynamo: usize,
    /// Of those, lookups where Dynamo reports a worker a longer prefix than
    /// the reference (overcounting), and a shorter one or none.
    dynamo_over: usize,
    dynamo_under: usize,
    /// The first disagreement with Dynamo, described.
    first_dynamo: Option<String>,
    /// Every lookup's answer after the whole timeline (ours).
    final_scores: Vec<Scores>,
    /// Lookups whose final answers differ: ours vs the reference, ours vs
    /// Dynamo.
    final_vs_reference: usize,
    final_vs_dynamo: usize,
    /// Events Dynamo's CRTC did not apply (its acknowledgement says so).
    dynamo_refused: usize,
    /// The first of them.
    first_refused: Option<String>,
}

/// Applies the timeline in time order, one event at a time, to all three
/// (Dynamo's each acknowledged before the next entry) and compares every
/// lookup where it falls.
fn agreement(data: &Data, rt: &tokio::runtime::Runtime, per_lookup: bool) -> Agreement {
    let ours = ConcurrentIndex::new();
    let reference = ReferenceIndex::new();
    let crtc = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, data.block_size);
    let mut a = Agreement {
        lookups: 0,
        ours_vs_reference: 0,
        ours_vs_dynamo: 0,
        dynamo_over: 0,
        dynamo_under: 0,
        first_dynamo: None,
        final_scores: Vec::new(),
        final_vs_reference: 0,
        final_vs_dynamo: 0,
        dynamo_refused: 0,
        first_refused: None,
    };
    for e in &data.order {
        match *e {
            Entry::Event(i) => {
                ours.apply(&data.events[i]).expect("ours applies");
                reference.apply(&data.events[i]).expect("reference applies");
                if rt
                    .block_on(crtc.apply_event_and_wait(data.dyn_events[i].clone()))
                    .is_err()
                {
                    a.dynamo_refused += 1;
                    if a.first_refused.is_none() {
                        a.first_refused = Some(format!("{:?}", data.events[i]));
                    }
                }
            }
            Entry::Lookup(q) if per_lookup => {
                let o = ours_scores(&ours.find_matches(&data.queries[q]));
                let r = ours_scores(&reference.find_matches(&data.queries[q]));
                let d = dynamo_scores(&crtc.backend().find_matches(&data.dyn_queries[q], false));
                a.lookups += 1;
                a.ours_vs_reference += usize::from(o != r);
                if d != r {
                    a.ours_vs_dynamo += 1;
                    let score = |s: &Scores, w: (u64, u32)| {
                        s.iter().find(|x| (x.0, x.1) == w).map_or(0, |x| x.2)
                    };
                    let over = d.iter().any(|x| x.2 > score(&r, (x.0, x.1)));
                    if over {
                        a.dynamo_over += 1;
                    } else {
                        a.dynamo_under += 1;
                    }
                    if a.first_dynamo.is_none() {
                        a.first_dynamo = Some(format!(
                            "lookup {q} ({} blocks): reference {r:?}, dynamo {d:?}",
                            data.queries[q].len()
                        ));
                    }
                }
            }
            Entry::Lookup(_) => {}
        }
    }
    rt.block_on(crtc.flush_and_wait()).expect("flush");
    for (q, dq) in data.queries.iter().zip(&data.dyn_queries) {
        let o = ours_scores(&ours.find_matches(q));
        a.final_vs_reference += usize::from(o != ours_scores(&reference.find_matches(q)));
        a.final_vs_dynamo +=
            usize::from(o != dynamo_scores(&crtc.backend().find_matches(dq, false)));
        a.final_scores.push(o);
    }
    a
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e3
    }
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let cmd = Args::command()
        .mut_arg("event_lanes", |a| a.visible_alias("lanes").alias("threads"))
        .mut_arg("query_lanes", |a| a.visible_alias("readers"));
    let args = Args::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit());
    let opts = args.replay.options().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let stress = opts.stress.clone().unwrap_or_default();
    let (lanes_list, readers) = (stress.event_lanes.clone(), stress.query_lanes);
    let repeats = args.repeats.max(1);
    println!(
        "hashing: {} cases identical to dynamo-kv-router 1.6.1 (block and sequence hashes, LoRA and cache salt)",
        check_hashing()
    );
    let t0 = Instant::now();
    let data = Data::new(&opts, readers, args.engine_hashes).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let source = match &opts.workload {
        WorkloadSource::Trace(t) => format!(
            "{} (length factor {}, duplication {}, trace block {} -> block {} tokens)",
            t.path.display(),
            t.scaling.length_factor,
            t.scaling.duplication_factor,
            t.scaling.trace_block_size,
            t.scaling.block_size
        ),
        WorkloadSource::Synthetic(s) => format!(
            "synthetic (seed {}, {} s of sessions at {}/s, block {} tokens)",
            s.seed, s.duration_s, s.session_rate, s.block_size
        ),
    };
    println!(
        "timeline: {source}; {} workers x {} blocks, {} routing, {} external hashes; {} events ({} block ops), {} lookups ({} block ops) over {:.0} simulated s; built in {:.1} s",
        opts.sim.workers,
        opts.sim.engine.capacity_blocks,
        stress.policy,
        if args.engine_hashes {
            "the engines' (salted per worker)"
        } else {
            "deterministic"
        },
        data.events.len(),
        data.event_ops,
        data.queries.len(),
        data.query_ops,
        data.span_us as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "harness: 1 producer -> N event lanes, {readers} lookup threads; medians of {repeats} interleaved runs; {}",
        std::env::var("BENCH_DATE").unwrap_or_default()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    // The sequential pass first: its final answers check every run.
    let t0 = Instant::now();
    let ag = agreement(&data, &rt, !args.no_agreement);
    if !args.no_agreement {
        println!(
            "agreement, sequential (every lookup where it falls, quiescent): concurrent vs reference differ on {} of {} lookups; dynamo-crtc vs reference on {} ({} where Dynamo reports a longer prefix for some worker, {} only shorter or missing)",
            ag.ours_vs_reference, ag.lookups, ag.ours_vs_dynamo, ag.dynamo_over, ag.dynamo_under
        );
        if let Some(f) = &ag.first_dynamo {
            println!("  first dynamo-crtc disagreement: {f}");
        }
        println!(
            "  dynamo-crtc refused {} of {} events{}",
            ag.dynamo_refused,
            data.events.len(),
            ag.first_refused
                .as_ref()
                .map(|e| format!("; the first: {e}"))
                .unwrap_or_default()
        );
    }
    println!(
        "agreement, final state ({} lookups): concurrent vs reference differ on {}, concurrent vs dynamo-crtc on {} ({:.1} s)",
        data.queries.len(),
        ag.final_vs_reference,
        ag.final_vs_dynamo,
        t0.elapsed().as_secs_f64()
    );
    let mut final_bad = [0usize; 3];
    let mut runs = [0usize; 3];

    if let Some(only) = &args.only {
        for &lanes in &lanes_list {
            for _ in 0..repeats {
                let r = run_index(only, &data, lanes, None, &ag.final_scores, &rt);
                println!(
                    "{only}, {lanes} event lanes: {:.0} write ops/s, lookup p50/p99 {:.2}/{:.2} µs, {} final disagreements",
                    data.event_ops as f64 / r.write_s,
                    us(&r.service, 0.5),
                    us(&r.service, 0.99),
                    r.final_disagreements
                );
            }
        }
        return;
    }
    if !args.no_overload {
        for &lanes in &lanes_list {
            let mut res: Vec<Vec<RunStats>> = (0..NAMES.len()).map(|_| Vec::new()).collect();
            // Interleaved so load changes on a shared machine hit all.
            for _ in 0..repeats {
                for (i, name) in NAMES.iter().enumerate() {
                    let r = run_index(name, &data, lanes, None, &ag.final_scores, &rt);
                    final_bad[i] += r.final_disagreements;
                    runs[i] += 1;
                    res[i].push(r);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            println!("\noverload: {lanes} event lanes, {readers} lookup threads");
            println!(
                "{:<12} {:>16} {:>10} {:>10} {:>11} {:>11}",
                "index", "write ops/s", "p50 µs", "p99 µs", "writes ms", "lookups ms"
            );
            let mut ops = Vec::new();
            for (i, name) in NAMES.iter().enumerate() {
                let r = &res[i];
                let o = median(
                    r.iter()
                        .map(|x| data.event_ops as f64 / x.write_s)
                        .collect(),
                );
                ops.push(o);
                println!(
                    "{:<12} {:>16.0} {:>10.2} {:>10.2} {:>11.1} {:>11.1}",
                    name,
                    o,
                    median(r.iter().map(|x| us(&x.service, 0.5)).collect()),
                    median(r.iter().map(|x| us(&x.service, 0.99)).collect()),
                    median(r.iter().map(|x| x.write_s * 1e3).collect()),
                    median(r.iter().map(|x| x.lookup_s * 1e3).collect()),
                );
            }
            println!(
                "lanes {lanes}: concurrent / dynamo-crtc = {:.2}x, concurrent / reference = {:.2}x",
                ops[0] / ops[1],
                ops[0] / ops[2]
            );
        }
    }

    for &rate in &args.rate {
        let window = Duration::from_secs_f64(data.total_ops() as f64 / rate);
        for &lanes in &lanes_list {
            let mut res: Vec<Vec<RunStats>> = (0..NAMES.len()).map(|_| Vec::new()).collect();
            for _ in 0..repeats {
                for (i, name) in NAMES.iter().enumerate() {
                    let r = run_index(name, &data, lanes, Some(window), &ag.final_scores, &rt);
                    final_bad[i] += r.final_disagreements;
                    runs[i] += 1;
                    res[i].push(r);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            println!(
                "\nrate {rate:.3e} block ops/s (window {:.0} ms): {lanes} event lanes, {readers} lookup threads",
                window.as_secs_f64() * 1e3
            );
            println!(
                "{:<12} {:>8} {:>14} {:>11} {:>19} {:>19}",
                "index",
                "kept up",
                "achieved/s",
                "elapsed ms",
                "service p50/p99 µs",
                "queueing p50/p99 µs"
            );
            for (i, name) in NAMES.iter().enumerate() {
                let r = &res[i];
                let w = window.as_secs_f64();
                let kept = r.iter().filter(|x| x.elapsed_s() <= 1.1 * w).count();
                println!(
                    "{:<12} {:>8} {:>14.0} {:>11.1} {:>19} {:>19}",
                    name,
                    format!("{kept}/{}", r.len()),
                    median(
                        r.iter()
                            .map(|x| data.total_ops() as f64 / x.elapsed_s().max(w))
                            .collect()
                    ),
                    median(r.iter().map(|x| x.elapsed_s() * 1e3).collect()),
                    format!(
                        "{:.2}/{:.2}",
                        median(r.iter().map(|x| us(&x.service, 0.5)).collect()),
                        median(r.iter().map(|x| us(&x.service, 0.99)).collect())
                    ),
                    format!(
                        "{:.1}/{:.1}",
                        median(r.iter().map(|x| us(&x.queueing, 0.5)).collect()),
                        median(r.iter().map(|x| us(&x.queueing, 0.99)).collect())
                    ),
                );
            }
        }
    }
    if runs.iter().any(|r| *r > 0) {
        println!(
            "\nagreement, each run's final state against the sequential pass (lookups differing, summed over runs): {}",
            NAMES
                .iter()
                .zip(final_bad.iter().zip(&runs))
                .map(|(n, (b, r))| format!("{n} {b} in {r} runs"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    drop(ag);

    // Memory: each index populated alone on this thread.
    kvindex::reclaim_deferred();
    let before = live();
    let ours = ConcurrentIndex::new();
    let t = Instant::now();
    for ev in &data.events {
        ours.apply(ev).expect("applies");
    }
    let our_apply = t.elapsed();
    kvindex::reclaim_deferred();
    let our_bytes = live() - before;
    println!("concurrent heap by part: {:?}", ours.heap_bytes());
    let held: usize = ours
        .workers()
        .iter()
        .map(|w| ours.worker_block_count(*w))
        .sum();
    let before = live();
    let reference = ReferenceIndex::new();
    for ev in &data.events {
        reference.apply(ev).expect("applies");
    }
    let ref_bytes = live() - before;
    let ref_held: usize = reference
        .workers()
        .iter()
        .map(|w| reference.worker_block_count(*w))
        .sum();
    let before = live();
    let crtc = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, data.block_size);
    // Flushed every 256 events, so its queue stays short.
    let t = Instant::now();
    for chunk in data.dyn_events.chunks(256) {
        for ev in chunk {
            crtc.enqueue_event(ev.clone()).expect("enqueue");
        }
        rt.block_on(crtc.flush_and_wait()).expect("flush");
    }
    let dyn_apply = t.elapsed();
    let dyn_bytes = live() - before;
    println!(
        "\nevents applied alone (no lookups, populating for the memory figures): concurrent {:.1} ms on this thread, dynamo-crtc {:.1} ms on its lane (flushed every 256 events)",
        our_apply.as_secs_f64() * 1e3,
        dyn_apply.as_secs_f64() * 1e3
    );
    println!(
        "\nmemory: {held} held (worker, block) pairs (reference {ref_held}); bytes per stored block: concurrent {:.1}, dynamo-crtc {:.1} (with its 1-lane ThreadPoolIndexer's own state), reference {:.1}",
        our_bytes as f64 / held.max(1) as f64,
        dyn_bytes as f64 / held.max(1) as f64,
        ref_bytes as f64 / held.max(1) as f64
    );

    // Steady-state lookups (no writers), one thread, every lookup 3 times.
    let lat = |f: &dyn Fn(usize)| {
        let mut h = hist();
        for _ in 0..3 {
            for i in 0..data.queries.len() {
                let t = Instant::now();
                f(i);
                h.saturating_record(ns(t.elapsed()));
            }
        }
        (us(&h, 0.5), us(&h, 0.99))
    };
    let (o50, o99) = lat(&|i| {
        std::hint::black_box(ours.find_matches(&data.queries[i]));
    });
    let (d50, d99) = lat(&|i| {
        std::hint::black_box(crtc.backend().find_matches(&data.dyn_queries[i], false));
    });
    let (r50, r99) = lat(&|i| {
        std::hint::black_box(reference.find_matches(&data.queries[i]));
    });
    println!(
        "steady-state lookup p50/p99 µs (populated, no writers): concurrent {o50:.2}/{o99:.2}, dynamo-crtc {d50:.2}/{d99:.2}, reference {r50:.2}/{r99:.2}"
    );
}
/// Checks our hashing against Dynamo's own functions on random inputs.
fn check_hashing() -> usize {
    use dynamo_kv_router::protocols::{
        compute_block_hash_for_seq, compute_seq_hash_for_block, BlockHashOptions,
    };
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut cases = 0;
    for bs in [1usize, 4, 16, 32, 64, 100] {
        for salt in [
            (None, None),
            (Some("lora-a"), None),
            (None, Some("tenant")),
            (Some("l"), Some("s")),
            (Some(""), Some("")),
        ] {
            let tokens: Vec<u32> = (0..bs * 5 + 3)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u32
                })
                .collect();
            let ours = kvindex::local_block_hashes_salted(
                &tokens,
                bs,
                kvindex::BlockSalt {
                    lora_name: salt.0,
                    cache_salt: salt.1,
                },
            );
            let theirs = compute_block_hash_for_seq(
                &tokens,
                bs as u32,
                BlockHashOptions {
                    lora_name: salt.0,
                    cache_namespace: salt.1,
                    ..Default::default()
                },
            );
            assert_eq!(
                ours.iter().map(|h| h.0).collect::<Vec<_>>(),
                theirs.iter().map(|h| h.0).collect::<Vec<_>>(),
                "block hashes differ: bs={bs} salt={salt:?}"
            );
            assert_eq!(
                kvindex::sequence_hashes(&ours),
                compute_seq_hash_for_block(&theirs),
                "sequence hashes differ"
            );
            if salt.0.is_none() && salt.1.is_none() {
                assert_eq!(ours, kvindex::local_block_hashes(&tokens, bs, None));
            }
            if salt.1.is_none() {
                assert_eq!(ours, kvindex::local_block_hashes(&tokens, bs, salt.0));
            }
            cases += 1;
        }
    }
    cases
}

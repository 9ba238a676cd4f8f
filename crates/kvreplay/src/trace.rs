//! Mooncake JSONL traces: parsing, validation and the scaling knobs.
//!
//! A Mooncake trace has one JSON object per line:
//! `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [..]}`.
//! Each hash id names one block of `trace_block_size` (512) tokens; ids are
//! chained, so two requests with the same first `k` ids share a `k`-block
//! prefix.
//!
//! [`TraceScaling`] turns the parsed records into a [`Workload`] for the
//! simulator, with the knobs of Dynamo's `mooncake_bench`:
//! * `length_factor`: every id becomes that many consecutive ids (longer
//!   prefixes, same tree shape);
//! * `duplication_factor`: that many disjoint copies of the trace (same shape,
//!   distinct ids), interleaved in time;
//! * `trace_block_size` / `block_size`: each trace id covers
//!   `trace_block_size / block_size` engine blocks.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors from reading or scaling a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a valid trace record.
    #[error("trace line {line}: {message}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace has no usable request.
    #[error("the trace contains no requests")]
    Empty,
    /// The scaling knobs are inconsistent.
    #[error("invalid trace scaling: {0}")]
    Scaling(String),
}

/// One line of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Arrival time in milliseconds since the start of the trace.
    pub timestamp: f64,
    /// Prompt length in tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// Prefix-chained block ids, one per `trace_block_size` tokens.
    pub hash_ids: Vec<u64>,
}

/// A parsed trace and what was skipped.
#[derive(Debug, Clone, Default)]
pub struct ParsedTrace {
    /// The good records, in file order.
    pub records: Vec<TraceRecord>,
    /// Lines skipped under `skip_bad_lines`.
    pub skipped: usize,
    /// The first skipped line's error, for the report.
    pub first_skipped: Option<String>,
}

/// Parses one non-blank line.
fn parse_line(text: &str, line: usize) -> Result<TraceRecord, TraceError> {
    let rec: TraceRecord = serde_json::from_str(text).map_err(|e| TraceError::BadLine {
        line,
        message: e.to_string(),
    })?;
    if !rec.timestamp.is_finite() || rec.timestamp < 0.0 {
        return Err(TraceError::BadLine {
            line,
            message: format!(
                "timestamp {} is not a finite, non-negative number",
                rec.timestamp
            ),
        });
    }
    if rec.input_length > u64::from(u32::MAX) || rec.output_length > u64::from(u32::MAX) {
        return Err(TraceError::BadLine {
            line,
            message: "input_length/output_length exceed 2^32-1 tokens".into(),
        });
    }
    Ok(rec)
}

/// Parses a Mooncake JSONL stream. Blank lines are ignored. A malformed line
/// is an error naming its line number, or, with `skip_bad_lines`, is counted
/// and skipped.
pub fn parse_trace<R: BufRead>(reader: R, skip_bad_lines: bool) -> Result<ParsedTrace, TraceError> {
    let mut out = ParsedTrace::default();
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let text = line.map_err(|e| TraceError::BadLine {
            line: lineno,
            message: format!("unreadable line: {e}"),
        })?;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        match parse_line(text, lineno) {
            Ok(rec) => out.records.push(rec),
            Err(e) if skip_bad_lines => {
                out.skipped += 1;
                if out.first_skipped.is_none() {
                    out.first_skipped = Some(e.to_string());
                }
            }
            Err(e) => return Err(e),
        }
    }
    if out.records.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(out)
}

/// Reads and parses a trace file.
pub fn read_trace(path: &Path, skip_bad_lines: bool) -> Result<ParsedTrace, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_trace(std::io::BufReader::new(file), skip_bad_lines)
}

/// One request as the simulator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Arrival time in microseconds.
    pub arrival_us: u64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prefix-chained block ids, one per engine block (`block_size` tokens).
    /// Equal leading ids mean equal prefixes.
    pub blocks: Vec<u64>,
}

/// A request stream with its block size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Human-readable origin (file name or "synthetic").
    pub name: String,
    /// Tokens per block.
    pub block_size: usize,
    /// Requests sorted by arrival.
    pub requests: Vec<Request>,
}

impl Workload {
    /// Total blocks requested over all requests.
    pub fn total_blocks(&self) -> u64 {
        self.requests.iter().map(|r| r.blocks.len() as u64).sum()
    }

    /// Time from first to last arrival, in microseconds.
    pub fn span_us(&self) -> u64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.arrival_us - a.arrival_us,
            _ => 0,
        }
    }

    /// The prefix-cache hit rate of one infinite cache shared by all
    /// workers: a block is a hit when its prefix (the block and all before
    /// it) appeared in an earlier request. The upper bound for any router.
    pub fn infinite_cache_hit_rate(&self) -> f64 {
        let mut seen: HashSet<u64> = HashSet::new();
        let (mut hits, mut total) = (0u64, 0u64);
        for r in &self.requests {
            let mut chain = 0u64;
            let mut pending = Vec::with_capacity(r.blocks.len());
            for &b in &r.blocks {
                chain = chain_hash(chain, b);
                total += 1;
                if seen.contains(&chain) {
                    hits += 1;
                } else {
                    pending.push(chain);
                }
            }
            seen.extend(pending);
        }
        if total == 0 {
            0.0
        } else {
            hits as f64 / total as f64
        }
    }
}

/// SplitMix64 finaliser: a cheap, well-mixing bijection on u64.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hash of a prefix: the previous prefix's hash combined with the next block
/// id. Used as the engine's sequence hash and for the infinite-cache bound.
pub fn chain_hash(parent: u64, block: u64) -> u64 {
    mix64(parent.rotate_left(23) ^ mix64(block))
}

/// Engine blocks a workload may hold in all: 8 GiB of block ids
/// ([`TraceScaling::apply`] and the synthetic generator refuse more).
pub const MAX_SCALED_BLOCKS: u64 = 1 << 30;

/// Requests a scaled trace may hold in all.
pub const MAX_SCALED_REQUESTS: u64 = 1 << 26;

/// Mooncake-bench style scaling of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TraceScaling {
    /// Each hash id becomes this many consecutive ids (>= 1).
    pub length_factor: usize,
    /// Disjoint copies of the trace (>= 1).
    pub duplication_factor: usize,
    /// Tokens per trace hash id (Mooncake: 512).
    pub trace_block_size: usize,
    /// Tokens per engine block; must divide `trace_block_size`.
    pub block_size: usize,
}

impl Default for TraceScaling {
    fn default() -> Self {
        Self {
            length_factor: 1,
            duplication_factor: 1,
            trace_block_size: 512,
            block_size: 512,
        }
    }
}

impl TraceScaling {
    /// Engine blocks per original trace id.
    pub fn blocks_per_id(&self) -> Result<u64, TraceError> {
        if self.length_factor == 0 || self.duplication_factor == 0 {
            return Err(TraceError::Scaling(
                "length and duplication factors must be at least 1".into(),
            ));
        }
        if self.block_size == 0 || self.trace_block_size == 0 {
            return Err(TraceError::Scaling("block sizes must be at least 1".into()));
        }
        if !self.trace_block_size.is_multiple_of(self.block_size) {
            return Err(TraceError::Scaling(format!(
                "trace block size {} is not a multiple of block size {}",
                self.trace_block_size, self.block_size
            )));
        }
        ((self.trace_block_size / self.block_size) as u64)
            .checked_mul(self.length_factor as u64)
            .ok_or_else(|| TraceError::Scaling("blocks per trace id overflow u64".into()))
    }

    /// Applies the knobs and converts records into a workload sorted by
    /// arrival (stable, so equal timestamps keep file order).
    pub fn apply(&self, name: &str, records: &[TraceRecord]) -> Result<Workload, TraceError> {
        if records.is_empty() {
            return Err(TraceError::Empty);
        }
        let k = self.blocks_per_id()?;
        // Refused before anything is allocated: knobs that would scale the
        // trace past the memory of any machine this runs on.
        let dup = self.duplication_factor as u64;
        let ids: u64 = records.iter().map(|r| r.hash_ids.len() as u64).sum();
        let blocks = ids.checked_mul(k).and_then(|b| b.checked_mul(dup));
        if blocks.is_none_or(|b| b > MAX_SCALED_BLOCKS) {
            return Err(TraceError::Scaling(format!(
                "{ids} hash ids x {k} blocks per id x {dup} copies is more than \
                 {MAX_SCALED_BLOCKS} blocks"
            )));
        }
        let n = (records.len() as u64).checked_mul(dup);
        if n.is_none_or(|n| n > MAX_SCALED_REQUESTS) {
            return Err(TraceError::Scaling(format!(
                "{} requests x {dup} copies is more than {MAX_SCALED_REQUESTS} requests",
                records.len()
            )));
        }
        let overflow = || TraceError::Scaling("hash ids overflow u64 after scaling".into());
        let max_id = records
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .max()
            .unwrap_or(0);
        let base = max_id
            .checked_add(1)
            .and_then(|m| m.checked_mul(k))
            .ok_or_else(overflow)?;
        base.checked_mul(self.duplication_factor as u64)
            .ok_or_else(overflow)?;
        let lf = self.length_factor as u64;
        let mut requests = Vec::with_capacity(records.len() * self.duplication_factor);
        for r in records {
            let expanded: Vec<u64> = r
                .hash_ids
                .iter()
                .flat_map(|&h| (0..k).map(move |j| h * k + j))
                .collect();
            let input = r.input_length.saturating_mul(lf).min(u64::from(u32::MAX)) as u32;
            for d in 0..self.duplication_factor as u64 {
                requests.push(Request {
                    arrival_us: (r.timestamp * 1000.0).round() as u64,
                    input_tokens: input,
                    output_tokens: r.output_length as u32,
                    blocks: expanded.iter().map(|&h| h + d * base).collect(),
                });
            }
        }
        requests.sort_by_key(|r| r.arrival_us);
        Ok(Workload {
            name: name.to_string(),
            block_size: self.block_size,
            requests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str, skip: bool) -> Result<ParsedTrace, TraceError> {
        parse_trace(std::io::Cursor::new(s.as_bytes()), skip)
    }

    #[test]
    fn parses_good_lines_and_ignores_blank_ones() {
        let t = parse(
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\n\
             {\"timestamp\": 12.5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0], \"extra\": true}\n",
            false,
        )
        .unwrap();
        assert_eq!(t.records.len(), 2);
        assert_eq!(t.records[0].hash_ids, vec![0, 1]);
        assert_eq!(t.records[1].timestamp, 12.5);
        assert_eq!(t.skipped, 0);
    }

    #[test]
    fn malformed_line_reports_its_number() {
        let text =
            "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n\
                    {\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}\n";
        let err = parse(text, false).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, TraceError::BadLine { line: 2, .. }), "{msg}");
        assert!(msg.contains("hash_ids"), "{msg}");
    }

    #[test]
    fn negative_timestamp_and_garbage_are_errors() {
        let e = parse(
            "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
            false,
        )
        .unwrap_err();
        assert!(matches!(e, TraceError::BadLine { line: 1, .. }));
        let e = parse("not json", false).unwrap_err();
        assert!(matches!(e, TraceError::BadLine { line: 1, .. }));
        let e = parse(
            "{\"timestamp\": 0, \"input_length\": \"x\", \"output_length\": 1, \"hash_ids\": []}",
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 1"));
    }

    #[test]
    fn skip_bad_lines_counts_them() {
        let text = "garbage\n{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [3]}\n[1,2]\n";
        let t = parse(text, true).unwrap();
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.skipped, 2);
        assert!(t.first_skipped.unwrap().contains("line 1"));
    }

    #[test]
    fn empty_trace_is_an_error() {
        assert!(matches!(parse("\n\n", false), Err(TraceError::Empty)));
        assert!(matches!(parse("bad\n", true), Err(TraceError::Empty)));
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let e = read_trace(Path::new("/nonexistent/trace.jsonl"), false).unwrap_err();
        assert!(matches!(e, TraceError::Io { .. }));
    }

    fn rec(ts: f64, ids: &[u64]) -> TraceRecord {
        TraceRecord {
            timestamp: ts,
            input_length: 512 * ids.len() as u64,
            output_length: 10,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn length_and_duplication_factors_match_mooncake_bench() {
        let recs = vec![rec(0.0, &[0, 1, 2]), rec(1.0, &[0, 1, 3, 4])];
        let s = TraceScaling {
            length_factor: 2,
            duplication_factor: 2,
            ..Default::default()
        };
        let w = s.apply("t", &recs).unwrap();
        let mut got: Vec<Vec<u64>> = w.requests.iter().map(|r| r.blocks.clone()).collect();
        got.sort();
        let mut want = vec![
            vec![0, 1, 2, 3, 4, 5],
            vec![10, 11, 12, 13, 14, 15],
            vec![0, 1, 2, 3, 6, 7, 8, 9],
            vec![10, 11, 12, 13, 16, 17, 18, 19],
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(w.requests[0].input_tokens, 512 * 3 * 2);
        assert_eq!(w.requests[3].arrival_us, 1000);
    }

    #[test]
    fn block_size_split_and_bad_ratio() {
        let recs = vec![rec(0.0, &[7])];
        let s = TraceScaling {
            block_size: 128,
            ..Default::default()
        };
        let w = s.apply("t", &recs).unwrap();
        assert_eq!(w.requests[0].blocks, vec![28, 29, 30, 31]);
        let bad = TraceScaling {
            block_size: 100,
            ..Default::default()
        };
        assert!(matches!(bad.apply("t", &recs), Err(TraceError::Scaling(_))));
        let zero = TraceScaling {
            length_factor: 0,
            ..Default::default()
        };
        assert!(matches!(
            zero.apply("t", &recs),
            Err(TraceError::Scaling(_))
        ));
        let huge = vec![rec(0.0, &[u64::MAX / 2])];
        let s = TraceScaling {
            length_factor: 4,
            ..Default::default()
        };
        assert!(matches!(s.apply("t", &huge), Err(TraceError::Scaling(_))));
    }

    #[test]
    fn infinite_cache_counts_shared_prefixes_only() {
        let recs = vec![
            rec(0.0, &[0, 1, 2]),
            rec(1.0, &[0, 1, 3]),
            rec(2.0, &[5, 1]),
        ];
        let w = TraceScaling::default().apply("t", &recs).unwrap();
        // hits: 0 + 2 (0,1) + 0 (1 under a different parent is new)
        assert!((w.infinite_cache_hit_rate() - 2.0 / 8.0).abs() < 1e-12);
    }

    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn records() -> impl Strategy<Value = Vec<TraceRecord>> {
        prop::collection::vec((0u32..50, prop::collection::vec(0u64..6, 0..6)), 1..12).prop_map(
            |v| {
                v.into_iter()
                    .map(|(ts, ids)| rec(f64::from(ts), &ids))
                    .collect()
            },
        )
    }

    /// Longest common prefix.
    fn lcp(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    proptest! {
        /// Scaling against a model: every request becomes `d` copies whose
        /// blocks are each id expanded `k` times; prefix sharing within a
        /// copy scales by `k`, copies share nothing, arrivals stay sorted.
        #[test]
        fn scaling_preserves_prefix_structure(
            recs in records(),
            lf in 1usize..4,
            d in 1usize..4,
            split in 0u32..3,
        ) {
            let s = TraceScaling {
                length_factor: lf,
                duplication_factor: d,
                trace_block_size: 512,
                block_size: 512 >> split,
            };
            let k = (1usize << split) * lf;
            let w = s.apply("p", &recs).unwrap();
            prop_assert_eq!(w.requests.len(), recs.len() * d);
            prop_assert!(w.requests.windows(2).all(|p| p[0].arrival_us <= p[1].arrival_us));
            // Group copies: requests of copy c come from records in order.
            let mut sorted: Vec<(usize, &TraceRecord)> = recs.iter().enumerate().collect();
            sorted.sort_by(|a, b| a.1.timestamp.total_cmp(&b.1.timestamp).then(a.0.cmp(&b.0)));
            let mut copies: Vec<Vec<&Request>> = vec![Vec::new(); d];
            for (i, r) in w.requests.iter().enumerate() {
                copies[i % d].push(r);
            }
            for c in &copies {
                for (r, (_, orig)) in c.iter().zip(&sorted) {
                    prop_assert_eq!(r.blocks.len(), orig.hash_ids.len() * k);
                }
                for i in 0..c.len() {
                    for j in 0..c.len() {
                        let want = lcp(&sorted[i].1.hash_ids, &sorted[j].1.hash_ids) * k;
                        prop_assert_eq!(lcp(&c[i].blocks, &c[j].blocks), want);
                    }
                }
            }
            let ids: Vec<BTreeSet<u64>> = copies
                .iter()
                .map(|c| c.iter().flat_map(|r| r.blocks.iter().copied()).collect())
                .collect();
            for a in 0..d {
                for b in a + 1..d {
                    prop_assert!(ids[a].is_disjoint(&ids[b]));
                }
            }
            // The infinite-cache bound against a model over whole prefixes.
            let mut seen: BTreeSet<Vec<u64>> = BTreeSet::new();
            let (mut hits, mut total) = (0usize, 0usize);
            for r in &w.requests {
                for n in 1..=r.blocks.len() {
                    total += 1;
                    if !seen.insert(r.blocks[..n].to_vec()) {
                        hits += 1;
                    }
                }
            }
            let model = if total == 0 { 0.0 } else { hits as f64 / total as f64 };
            prop_assert!((w.infinite_cache_hit_rate() - model).abs() < 1e-12);
        }
    }

    /// Knobs that scale a trace past any machine's memory, or overflow,
    /// are a typed error before anything is allocated (these aborted the
    /// process: a 2^32-token trace block over 1-token blocks made each
    /// hash id 2^32 x 1024 blocks).
    #[test]
    fn oversized_scaling_is_refused_before_allocating() {
        let rec = |ids: Vec<u64>| TraceRecord {
            timestamp: 0.0,
            input_length: u64::from(u32::MAX),
            output_length: 1,
            hash_ids: ids,
        };
        let scaled = |length_factor, duplication_factor, trace_block_size, records: &[_]| {
            TraceScaling {
                length_factor,
                duplication_factor,
                trace_block_size,
                block_size: 1,
            }
            .apply("t", records)
        };
        let huge_blocks = scaled(1024, 1, u32::MAX as usize, &[rec(vec![0, 1])]);
        assert!(matches!(huge_blocks, Err(TraceError::Scaling(m)) if m.contains("blocks")));
        let overflow = scaled(usize::MAX, 1, 512, &[rec(vec![0])]);
        assert!(matches!(overflow, Err(TraceError::Scaling(_))));
        let huge_requests = scaled(1, 1 << 40, 1, &[rec(vec![])]);
        assert!(matches!(huge_requests, Err(TraceError::Scaling(m)) if m.contains("requests")));
        // Long prompts times the length factor saturate at 2^32 - 1 tokens.
        let w = scaled(1024, 2, 1, &[rec(vec![3])]).unwrap();
        assert_eq!(w.requests[0].input_tokens, u32::MAX);
        assert_eq!(w.total_blocks(), 2 * 1024);
    }

    #[test]
    #[ignore = "needs ../shared data"]
    fn bundled_trace_parses() {
        let p = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/mooncake/mooncake_trace_1000.jsonl"
        ));
        assert!(p.exists(), "{} is missing", p.display());
        let t = read_trace(p, false).unwrap();
        assert_eq!(t.records.len(), 1000);
        let w = TraceScaling::default().apply("m", &t.records).unwrap();
        let bound = w.infinite_cache_hit_rate();
        // The data set's README gives 38.0% for this file.
        assert!((bound - 0.380).abs() < 0.01, "{bound}");
    }
}

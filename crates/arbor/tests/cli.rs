//! End-to-end runs of the `arbor` binary on tiny workloads.

use std::path::Path;
use std::process::{Command, Output};

fn arbor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .output()
        .expect("run arbor")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The run failed with exit status 1 and said `needle` on stderr.
fn refused(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{err}");
}

/// A few seconds of synthetic traffic on four workers.
const TINY_WORKLOAD: &[&str] = &[
    "kv",
    "replay",
    "--synth-duration-s",
    "20",
    "--synth-session-rate",
    "2",
    "--workers",
    "4",
];

/// [`TINY_WORKLOAD`], routed and stress-replayed briefly.
const TINY_RUN: &[&str] = &[
    "--kv-blocks",
    "2000",
    "--window-ms",
    "50",
    "--event-lanes",
    "1",
    "--no-progress",
];

#[test]
fn tiny_synthetic_run_prints_both_sections_and_writes_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let svg = dir.path().join("r.svg");
    let mut args = [TINY_WORKLOAD, TINY_RUN].concat();
    let (j, s) = (json.to_str().unwrap(), svg.to_str().unwrap());
    args.extend(["--json", j, "--plot", s]);
    let out = arbor(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for want in [
        "Routing comparison",
        "random",
        "round-robin",
        "least-loaded",
        "kv-aware",
        "kv-balanced",
        "kv-balanced (ours) reaches",
        "Index stress replay",
        "ours",
        "reference",
        "upper bound",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in\n{stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 5);
    let hit = |name: &str| {
        policies.iter().find(|p| p["policy"] == name).unwrap()["hit_rate"]
            .as_f64()
            .unwrap()
    };
    let bound = report["workload"]["infinite_cache_hit_rate"]
        .as_f64()
        .unwrap();
    for kv in ["kv-aware", "kv-balanced"] {
        assert!(hit(kv) >= hit("random"), "{kv}");
        assert!(hit(kv) <= bound + 1e-9, "{kv}");
    }
    assert_eq!(
        report["fleet"]["balance"]["abs"], 8,
        "an eighth of the batch"
    );
    assert_eq!(report["stress"].as_array().unwrap().len(), 2);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert!(plot.contains("polyline"), "latency CDF drawn");
    assert!(plot.contains(">kv-balanced</text>"), "our policy plotted");
}

#[test]
fn stress_only_sweep_reports_sustained_rates() {
    let out = arbor(
        &[
            TINY_WORKLOAD,
            &[
                "--stress",
                "--sweep",
                "--window-ms",
                "32",
                "--sweep-min-ms",
                "8",
                "--sweep-max-ms",
                "128",
                "--sweep-steps",
                "1",
                "--event-lanes",
                "1",
                "--impls",
                "ours,null",
                "--no-progress",
            ],
        ]
        .concat(),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("Routing comparison"), "{stdout}");
    assert!(
        stdout.contains("sweep ours with 1 event lane(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sweep null with 1 event lane(s)"),
        "{stdout}"
    );
    assert!(!stdout.contains("WARNING"), "{stdout}");
}

#[test]
fn trace_run_and_malformed_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let mut lines = String::new();
    for i in 0..40u64 {
        lines.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": 1500, \"output_length\": 20, \"hash_ids\": [0, 1, {}]}}\n",
            i * 100,
            i + 2
        ));
    }
    std::fs::write(&path, &lines).unwrap();
    let p = path.to_str().unwrap();
    let ok = arbor(&[
        "kv",
        "replay",
        "--trace",
        p,
        "--workers",
        "3",
        "--no-stress",
        "--no-progress",
        "--trace-length-factor",
        "2",
        "--trace-duplication-factor",
        "2",
    ]);
    let stdout = text(&ok.stdout);
    assert!(ok.status.success(), "{stdout}{}", text(&ok.stderr));
    assert!(stdout.contains("80 requests"), "{stdout}");
    assert!(!stdout.contains("Index stress replay"));

    lines.push_str("{\"timestamp\": 5000, \"input_length\": 1}\n");
    std::fs::write(&path, &lines).unwrap();
    let bad = arbor(&["kv", "replay", "--trace", p, "--no-stress", "--no-progress"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert!(
        err.contains("line 41") && err.contains("missing field"),
        "{err}"
    );

    let skipping = [
        "kv",
        "replay",
        "--trace",
        p,
        "--no-stress",
        "--no-progress",
        "--skip-bad-lines",
    ];
    let skip = arbor(&[&skipping[..], &["--workers", "2"]].concat());
    assert!(skip.status.success());
    assert!(text(&skip.stdout).contains("skipped 1 malformed"));

    let missing = arbor(&[
        "kv",
        "replay",
        "--trace",
        "/nonexistent.jsonl",
        "--no-progress",
    ]);
    refused(&missing, "cannot read trace");

    // Knobs within their flags' ranges that scale the trace past any
    // memory: a clear error, not an abort (each hash id was 2^32 x 1024
    // one-token blocks).
    let huge = arbor(
        &[
            &skipping[..],
            &[
                "--trace-block-size",
                "4294967295",
                "--block-size",
                "1",
                "--trace-length-factor",
                "1024",
            ],
        ]
        .concat(),
    );
    refused(&huge, "more than");
}

#[test]
fn bad_flags_exit_2_with_clap_errors() {
    for args in [
        &["kv", "replay", "--workers", "0"][..],
        &["kv", "replay", "--policies", "fastest"],
        &["kv", "replay", "--impls", "btree"],
        &["kv", "replay", "--temperature", "-1"],
        &["kv", "replay", "--balance-ratio", "0.5"],
        &["kv", "replay", "--balance-abs", "0"],
        &["kv", "replay", "--cache-threshold", "1.5"],
        &["kv", "replay", "--pressure-half-life-s", "0"],
        &["kv", "replay", "--event-lanes", "0"],
        &["kv", "replay", "--no-such-flag"],
        &["kv", "replay", "--stress", "--no-stress"],
        &["kv"],
        &["frobnicate"],
    ] {
        let out = arbor(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(err.contains("error") || err.contains("Usage"), "{args:?}");
    }
    let scaling = arbor(&["kv", "replay", "--trace", "x", "--block-size", "100"]);
    assert_eq!(scaling.status.code(), Some(1));
    // In the flag's range, past any memory: refused before generating.
    let huge = arbor(&[
        "kv",
        "replay",
        "--no-progress",
        "--synth-system-prompt-tokens",
        "4294967295",
    ]);
    refused(&huge, "blocks");
    let t0 = std::time::Instant::now();
    let unwritable = arbor(&["kv", "replay", "--json", "/nonexistent-dir/r.json"]);
    refused(&unwritable, "cannot write");
    assert!(t0.elapsed().as_secs() < 5, "fails before running");
}

#[test]
fn help_explains_the_knobs() {
    let top = arbor(&["--help"]);
    assert!(top.status.success());
    assert!(text(&top.stdout).contains("kv"));
    let help = arbor(&["kv", "replay", "--help"]);
    assert!(help.status.success());
    let h = text(&help.stdout);
    for knob in [
        "--trace",
        "--trace-length-factor",
        "--trace-duplication-factor",
        "--trace-block-size",
        "--block-size",
        "--workers",
        "--skip-bad-lines",
        "--synth-session-rate",
        "--kv-blocks",
        "--prefill-tps",
        "--temperature",
        "--overlap-weight",
        "kv-balanced",
        "--balance-ratio",
        "--balance-abs",
        "--cache-threshold",
        "--pressure-half-life-s",
        "--stress",
        "--window-ms",
        "--event-lanes",
        "--query-lanes",
        "--sweep",
        "--json",
        "--plot",
        "--gateway",
        "--speedup",
        "--max-in-flight",
    ] {
        assert!(h.contains(knob), "help lacks {knob}");
    }
}

/// A real trace beside the repository (`.ci/run` runs it where it is).
#[test]
#[ignore = "needs ../shared data"]
fn bundled_trace_runs() {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/mooncake/mooncake_trace_1000.jsonl"
    );
    assert!(Path::new(p).exists(), "{p} is missing");
    let out = arbor(&[
        "kv",
        "replay",
        "--trace",
        p,
        "--max-requests",
        "200",
        "--workers",
        "8",
        "--window-ms",
        "50",
        "--event-lanes",
        "1",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("200 requests"));
}

/// Runs `arbor` with `args` and `--json FILE`; checks that it succeeded and
/// printed `shows`; returns what it printed and the JSON report.
fn json_run(args: Vec<&str>, shows: &str) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut args = args;
    let path = json.to_str().unwrap().to_string();
    args.extend(["--json", &path]);
    let out = arbor(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains(shows), "{stdout}");
    let r = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, r)
}

/// `--live`: the simulated engines publish over ZMQ in vLLM's wire format
/// to a router on loopback, which routes every request; each policy's hit
/// rate must equal the in-process simulation's within one point.
#[test]
fn live_routing_through_a_router_matches_the_simulation() {
    let mut args = TINY_WORKLOAD.to_vec();
    args.extend([
        "--kv-blocks",
        "2000",
        "--no-stress",
        "--no-progress",
        "--live",
    ]);
    let (stdout, r) = json_run(args, "Routed live by http://127.0.0.1:");
    let local = r["policies"].as_array().unwrap();
    let live = r["live"].as_array().unwrap();
    assert_eq!(live.len(), 5, "{stdout}");
    for l in live {
        let p = local.iter().find(|p| p["policy"] == l["policy"]).unwrap();
        let (a, b) = (
            l["hit_rate"].as_f64().unwrap(),
            p["hit_rate"].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() <= 0.01,
            "{}: live {a} vs in process {b}",
            l["policy"]
        );
        assert_eq!(l["requests"], p["requests"]);
    }
}

/// `--gateway`: the workload as streamed HTTP completions through a
/// fleet of simulated engines and the router's gateway, all started on
/// loopback for the run; every request is answered and later turns find
/// their conversation's blocks cached.
#[test]
fn gateway_replay_through_a_local_fleet() {
    let mut args = TINY_WORKLOAD.to_vec();
    args.extend(["--gateway", "--speedup", "50", "--max-output-tokens", "8"]);
    let (stdout, r) = json_run(args, "Gateway replay through http://127.0.0.1:");
    assert!(r["requests"].as_u64().unwrap() > 10, "{stdout}");
    assert_eq!(r["ok"], r["requests"], "{stdout}");
    let (prompt, cached) = (
        r["prompt_tokens"].as_u64().unwrap(),
        r["cached_tokens"].as_u64().unwrap(),
    );
    assert!(cached > 0 && cached < prompt, "{stdout}");
    // Four engines, each named in its responses.
    let engines = r["per_engine"].as_object().unwrap();
    assert!(engines.len() <= 4 && !engines.is_empty(), "{stdout}");
    for (bad, why) in [
        (&["--speedup", "0"][..], "positive"),
        (&["--max-in-flight", "0"], "at least 1"),
        (&["--max-output-tokens", "0"], "at least 1"),
    ] {
        let mut args = TINY_WORKLOAD.to_vec();
        args.push("--gateway");
        args.extend(bad);
        refused(&arbor(&args), why);
    }
    let mut args = TINY_WORKLOAD.to_vec();
    args.extend(["--gateway", "not a url"]);
    refused(&arbor(&args), "does not parse");
}

/// A process serving a `nodes` table over statedb's HTTP API, on a thread
/// of its own; the table handle writes to it.
struct DbServer {
    db: statedb::Db,
    nodes: statedb::Table<serde_json::Value>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DbServer {
    fn start() -> Self {
        use statedb::http::{Api, QueryIndex};
        use statedb::Index;
        let db = statedb::Db::new();
        let id = |v: &serde_json::Value| v["id"].as_u64().unwrap_or(0);
        let by_id = Index::unique("id", id);
        let by_name = Index::unique("name", |v: &serde_json::Value| {
            v["name"].as_str().unwrap_or_default().to_string()
        });
        let nodes = db
            .create_table("nodes", &by_id, &[by_name.erase()])
            .unwrap();
        let api = Api::new(&db).export(
            &nodes,
            &[QueryIndex::parsed(&by_id), QueryIndex::parsed(&by_name)],
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                api.serve(l, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let url = format!("http://{}", addr_rx.recv().unwrap());
        DbServer {
            db,
            nodes,
            url,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn put(&self, id: u64, name: &str) {
        let mut txn = self.db.write_txn(&[&self.nodes]).unwrap();
        self.nodes
            .insert(&mut txn, serde_json::json!({"id": id, "name": name}))
            .unwrap();
        txn.commit().unwrap();
    }
}

impl Drop for DbServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn db_shows_queries_and_watches_a_running_process() {
    use std::io::{BufRead, BufReader};
    let s = DbServer::start();
    for (id, name) in [(1, "a1"), (2, "a2"), (3, "b1")] {
        s.put(id, name);
    }
    let url = s.url.as_str();

    let out = arbor(&["db", "show", "--url", url, "nodes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[2]["object"]["name"], "b1");
    assert_eq!(lines[2]["revision"], 3);

    let out = arbor(&["db", "show", "--url", url]);
    assert_eq!(text(&out.stdout).trim(), "nodes\trevision 3\t3 objects");

    let out = arbor(&[
        "db", "query", "--url", url, "nodes", "name", "a", "--prefix",
    ]);
    let names: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["object"]["name"].to_string()
        })
        .collect();
    assert_eq!(names, vec!["\"a1\"", "\"a2\""]);
    let out = arbor(&[
        "db",
        "query",
        "--url",
        url,
        "nodes",
        "id",
        "2",
        "--lower-bound",
    ]);
    assert_eq!(text(&out.stdout).lines().count(), 2);
    let out = arbor(&["db", "query", "--url", url, "nodes", "id", "3"]);
    assert!(text(&out.stdout).contains("\"b1\""));

    // Errors: the server's message, exit status 1.
    refused(
        &arbor(&["db", "show", "--url", url, "edges"]),
        "no table \"edges\"",
    );
    refused(
        &arbor(&["db", "query", "--url", url, "nodes", "id", "x"]),
        "key \"x\"",
    );
    refused(
        &arbor(&["db", "query", "--url", url, "nodes", "zone", "x"]),
        "no queryable index",
    );
    let out = arbor(&[
        "db",
        "query",
        "--url",
        url,
        "nodes",
        "id",
        "1",
        "--prefix",
        "--lower-bound",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // watch: the objects, then a change as it commits.
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["db", "watch", "--url", url, "nodes"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for want in ["a1", "a2", "b1"] {
        let l: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        assert_eq!(l["object"]["name"], want);
        assert_eq!(l["kind"], "insert");
    }
    s.put(2, "a2-renamed");
    let l: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (l["kind"].as_str(), l["revision"].as_u64()),
        (Some("update"), Some(4))
    );
    assert_eq!(l["object"]["name"], "a2-renamed");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn engine_help_and_bad_flags() {
    let out = arbor(&["kv", "engine", "--help"]);
    let help = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for want in [
        "--tokenizer",
        "--events",
        "--replay",
        "--prefill-tps",
        "--speedup",
        "--fail-every",
    ] {
        assert!(help.contains(want), "{want} missing from\n{help}");
    }
    for bad in [
        &["--block-size", "0"][..],
        &["--speedup", "0"],
        &["--bogus"],
        &["--listen", "nowhere"],
    ] {
        let out = arbor(&[&["kv", "engine"][..], bad].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
    let out = arbor(&["kv", "engine", "--tokenizer", "/nonexistent/model"]);
    refused(&out, "--tokenizer /nonexistent/model");
}

/// The built-in tokenizer, free ports, one request, SIGTERM: a clean exit.
#[test]
fn engine_serves_a_completion_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args([
            "kv",
            "engine",
            "--listen",
            "127.0.0.1:0",
            "--events",
            "tcp://127.0.0.1:*",
            "--replay",
            "tcp://127.0.0.1:*",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {first:?}"))
        .trim_end_matches(',')
        .to_string();
    assert!(first.contains("events tcp://127.0.0.1:"), "{first}");
    let v: serde_json::Value = reqwest::blocking::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&serde_json::json!({"model": "arbor-sim", "prompt": "hello there", "max_tokens": 2}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    assert_eq!(
        v["usage"]["prompt_tokens"],
        "hello there".len(),
        "one token per byte"
    );
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let t = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "{s:?}");
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "still running"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

//! Per-table metrics reach the `metrics` facade.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::common::*;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use statedb::{Db, DbOptions};

#[derive(Default)]
struct Cell {
    last: Mutex<f64>,
    count: Mutex<u64>,
}

impl CounterFn for Cell {
    fn increment(&self, v: u64) {
        *self.last.lock().unwrap() += v as f64;
    }
    fn absolute(&self, v: u64) {
        *self.last.lock().unwrap() = v as f64;
    }
}
impl GaugeFn for Cell {
    fn increment(&self, v: f64) {
        *self.last.lock().unwrap() += v;
    }
    fn decrement(&self, v: f64) {
        *self.last.lock().unwrap() -= v;
    }
    fn set(&self, v: f64) {
        *self.last.lock().unwrap() = v;
    }
}
impl HistogramFn for Cell {
    fn record(&self, v: f64) {
        *self.last.lock().unwrap() = v;
        *self.count.lock().unwrap() += 1;
    }
}

#[derive(Default, Clone)]
struct Capture {
    cells: Arc<Mutex<HashMap<String, Arc<Cell>>>>,
}

impl Capture {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.cells.lock().unwrap().entry(name).or_default().clone()
    }
    fn get(&self, name: &str) -> (f64, u64) {
        let c = self.cells.lock().unwrap()[name].clone();
        let v = *c.last.lock().unwrap();
        let n = *c.count.lock().unwrap();
        (v, n)
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

#[test]
fn table_metrics_are_exported() {
    let rec = Capture::default();
    let db = Db::with_options(
        DbOptions::default()
            .with_gc_interval(None)
            .with_time_one_in(1),
    );
    let f = metrics::with_local_recorder(&rec, || table_in(&db, "nodes"));
    let t = &f.table;
    let mut w = db.write_txn(&[t]).unwrap();
    let mut ch = t.changes(&mut w).unwrap();
    for i in 0..5 {
        t.insert(&mut w, obj(i, &format!("n{i}"), &[], 0)).unwrap();
    }
    w.commit().unwrap();
    let mut w = db.write_txn(&[t]).unwrap();
    t.delete_key(&mut w, &0u32).unwrap();
    w.commit().unwrap();
    assert_eq!(rec.get("statedb_table_objects{table=nodes}").0, 4.0);
    assert_eq!(rec.get("statedb_table_revision{table=nodes}").0, 6.0);
    assert_eq!(
        rec.get("statedb_table_graveyard_objects{table=nodes}").0,
        1.0
    );
    assert_eq!(rec.get("statedb_commit_seconds{table=nodes}").1, 2);
    assert_eq!(rec.get("statedb_write_lock_wait_seconds{table=nodes}").1, 2);
    assert_eq!(rec.get("statedb_write_lock_hold_seconds{table=nodes}").1, 2);
    assert_eq!(rec.get("statedb_commits_total{table=nodes}").0, 2.0);
    // Collection updates the graveyard gauge.
    ch.next(&db.read_txn()).unwrap();
    assert_eq!(db.collect_garbage(), 1);
    assert_eq!(
        rec.get("statedb_table_graveyard_objects{table=nodes}").0,
        0.0
    );
}

/// With one transaction in four timed, the histograms get every fourth
/// hold and commit (the first included), the counters every one.
#[test]
fn holds_and_commits_are_timed_one_in_n() {
    let rec = Capture::default();
    let db = Db::with_options(
        DbOptions::default()
            .with_gc_interval(None)
            .with_time_one_in(4),
    );
    let f = metrics::with_local_recorder(&rec, || table_in(&db, "nodes"));
    for i in 0..10 {
        let mut w = db.write_txn(&[&f.table]).unwrap();
        f.table
            .insert(&mut w, obj(i, &format!("n{i}"), &[], 0))
            .unwrap();
        w.commit().unwrap();
    }
    // An aborted hold counts, and its turn is taken.
    let w = db.write_txn(&[&f.table]).unwrap();
    drop(w);
    let mut w = db.write_txn(&[&f.table]).unwrap();
    f.table.insert(&mut w, obj(10, "n10", &[], 0)).unwrap();
    w.commit().unwrap();
    // Holds 0, 4, 8 timed; 10 (the abort) was not, 11 was not.
    assert_eq!(rec.get("statedb_commit_seconds{table=nodes}").1, 3);
    assert_eq!(rec.get("statedb_write_lock_hold_seconds{table=nodes}").1, 3);
    assert_eq!(
        rec.get("statedb_write_lock_wait_seconds{table=nodes}").1,
        12
    );
    assert_eq!(rec.get("statedb_commits_total{table=nodes}").0, 11.0);
    let s = &db.stats()[0];
    assert_eq!((s.commit.count, s.commit.timed), (11, 3));
    assert_eq!((s.lock_hold.count, s.lock_hold.timed), (12, 3));
    assert_eq!((s.lock_wait.count, s.lock_wait.timed), (12, 12));
    assert!(s
        .lock_hold
        .mean()
        .is_some_and(|m| m >= s.commit.mean().unwrap()));

    // 0: nothing timed, everything counted.
    let db = Db::with_options(
        DbOptions::default()
            .with_gc_interval(None)
            .with_time_one_in(0),
    );
    let f = table_in(&db, "quiet");
    for i in 0..3 {
        let mut w = db.write_txn(&[&f.table]).unwrap();
        f.table
            .insert(&mut w, obj(i, &format!("n{i}"), &[], 0))
            .unwrap();
        w.commit().unwrap();
    }
    let s = &db.stats()[0];
    assert_eq!((s.commit.count, s.commit.timed), (3, 0));
    assert_eq!((s.lock_hold.count, s.lock_hold.timed), (3, 0));
    assert_eq!(s.commit.mean(), None);
}

/// `Timings::mean` divides the timed total by the timed count, whatever
/// its size.
#[test]
fn timings_mean() {
    use statedb::Timings;
    use std::time::Duration;
    let t = |timed, total| Timings {
        count: timed,
        timed,
        total,
        max: total,
    };
    assert_eq!(t(0, Duration::ZERO).mean(), None);
    assert_eq!(
        t(4, Duration::from_micros(10)).mean(),
        Some(Duration::from_nanos(2500))
    );
    let huge = u64::from(u32::MAX) * 4;
    assert_eq!(
        t(huge, Duration::from_nanos(huge * 3)).mean(),
        Some(Duration::from_nanos(3))
    );
}

//! Per-table metrics reach the `metrics` facade.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::*;
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
    let db = Db::with_options(DbOptions { gc_interval: None });
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
    // Collection updates the graveyard gauge.
    ch.next(&db.read_txn()).unwrap();
    assert_eq!(db.collect_garbage(), 1);
    assert_eq!(
        rec.get("statedb_table_graveyard_objects{table=nodes}").0,
        0.0
    );
}

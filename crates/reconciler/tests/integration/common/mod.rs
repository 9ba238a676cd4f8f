//! A table of items, a scripted fake external system, and helpers to wait
//! for the reconciler without sleeping for timing.
#![allow(dead_code)]

pub mod recorder;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use reconciler::{
    BatchEntry, Clock, Config, ManualClock, OpError, Operations, Reconciler, Status, StatusKind,
    Target, Timestamp,
};
use statedb::{Db, Index, Objects, ReadTxn, Revision, Table};

#[derive(Clone, Debug)]
pub struct Item {
    pub id: u32,
    pub value: u32,
    pub status: Status,
}

/// What the fake external system holds and how it is told to fail.
#[derive(Default, Debug)]
pub struct External {
    pub items: BTreeMap<u32, u32>,
    pub fail_update: BTreeSet<u32>,
    pub fail_delete: BTreeSet<u32>,
    pub fail_prune: bool,
    pub updates: usize,
    pub deletes: usize,
    pub prunes: usize,
    /// (op, batch size), in call order, when batching.
    pub batches: Vec<(&'static str, usize)>,
}

#[derive(Clone, Default)]
pub struct Fake {
    pub ext: Arc<Mutex<External>>,
    /// Whether to override the batch operations.
    pub batching: bool,
}

impl Fake {
    pub fn ext(&self) -> MutexGuard<'_, External> {
        self.ext.lock().unwrap()
    }
}

fn err(what: &str, id: u32) -> OpError {
    format!("{what} {id} failed").into()
}

impl Operations<Item> for Fake {
    fn update(&mut self, _: &ReadTxn, _: Revision, obj: &Item) -> Result<(), OpError> {
        let mut e = self.ext();
        e.updates += 1;
        if e.fail_update.contains(&obj.id) {
            return Err(err("update", obj.id));
        }
        e.items.insert(obj.id, obj.value);
        Ok(())
    }

    fn delete(&mut self, _: &ReadTxn, _: Revision, obj: &Item) -> Result<(), OpError> {
        let mut e = self.ext();
        e.deletes += 1;
        if e.fail_delete.contains(&obj.id) {
            return Err(err("delete", obj.id));
        }
        e.items.remove(&obj.id);
        Ok(())
    }

    fn prune(&mut self, _: &ReadTxn, desired: Objects<'_, Item>) -> Result<(), OpError> {
        let mut e = self.ext();
        e.prunes += 1;
        if e.fail_prune {
            return Err("prune failed".into());
        }
        let want: BTreeSet<u32> = desired.map(|o| o.id).collect();
        e.items.retain(|k, _| want.contains(k));
        Ok(())
    }

    fn update_batch(&mut self, txn: &ReadTxn, batch: &mut [BatchEntry<Item>]) {
        if self.batching {
            self.ext().batches.push(("update", batch.len()));
        }
        for e in batch {
            e.result = self.update(txn, e.revision, &e.object);
        }
    }

    fn delete_batch(&mut self, txn: &ReadTxn, batch: &mut [BatchEntry<Item>]) {
        if self.batching {
            self.ext().batches.push(("delete", batch.len()));
        }
        for e in batch {
            e.result = self.delete(txn, e.revision, &e.object);
        }
    }
}

pub struct Env {
    pub db: Db,
    pub table: Table<Item>,
    pub id: Index<Item, u32>,
    pub clock: ManualClock,
    pub fake: Fake,
}

pub const T0: Timestamp = Timestamp(1_000_000_000_000);

/// Test defaults: no round limit, no jitter, no periodic prune.
pub fn config() -> Config {
    Config {
        round_rate: None,
        retry_jitter: 0.0,
        prune_interval: None,
        ..Config::default()
    }
}

impl Env {
    pub fn new() -> Env {
        let db = Db::new();
        let id = Index::unique("id", |i: &Item| i.id);
        let table = db.create_table("items", &id, &[]).unwrap();
        Env {
            db,
            table,
            id,
            clock: ManualClock::new(T0),
            fake: Fake::default(),
        }
    }

    pub fn target(&self) -> Target<Item, u32> {
        Target::new(
            &self.table,
            &self.id,
            |i| i.id,
            |i| &i.status,
            |i, status| Item {
                status,
                ..i.clone()
            },
        )
    }

    pub fn start(&self, cfg: Config) -> Reconciler {
        Reconciler::start_with_clock(
            &self.db,
            self.target(),
            self.fake.clone(),
            cfg,
            self.clock.clone(),
        )
        .unwrap()
    }

    /// Writes items (id, value) as pending; returns the commit's revision.
    pub fn put(&self, items: &[(u32, u32)]) -> Revision {
        let mut w = self.db.write_txn(&[&self.table]).unwrap();
        for &(id, value) in items {
            self.table
                .insert(
                    &mut w,
                    Item {
                        id,
                        value,
                        status: Status::pending_at(self.clock.now()),
                    },
                )
                .unwrap();
        }
        let r = w.commit().unwrap();
        self.table.revision(&r).unwrap()
    }

    pub fn remove(&self, ids: &[u32]) -> Revision {
        let mut w = self.db.write_txn(&[&self.table]).unwrap();
        for &id in ids {
            self.table.delete_key(&mut w, &id).unwrap();
        }
        let r = w.commit().unwrap();
        self.table.revision(&r).unwrap()
    }

    pub fn status(&self, id: u32) -> Option<Status> {
        let r = self.db.read_txn();
        self.table
            .get(&r, &self.id, &id)
            .unwrap()
            .map(|o| o.status.clone())
    }

    pub fn kind(&self, id: u32) -> Option<StatusKind> {
        self.status(id).map(|s| s.kind())
    }

    /// The table as (id, value).
    pub fn desired(&self) -> BTreeMap<u32, u32> {
        let r = self.db.read_txn();
        self.table
            .all(&r)
            .unwrap()
            .map(|o| (o.id, o.value))
            .collect()
    }

    /// Waits until the loop sleeps until `deadline` (it has seen
    /// everything before and has nothing else to do until then).
    pub fn wait_deadline(&self, deadline: Timestamp) {
        let start = Instant::now();
        while self.clock.next_deadline() != Some(deadline) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "next deadline {:?}, not {deadline:?} (now {:?})",
                self.clock.next_deadline(),
                self.clock.now()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Polls `cond` until it holds (fails the test after 5 s).
pub fn wait_for(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "condition not reached in 5 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Polls `cond` for up to `timeout`; whether it came to hold.
pub fn holds_within(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

//! Concurrency stress: writer threads run random multi-table transactions
//! (about 10% aborted, locks taken in random order with repetitions) while
//! change-stream consumers check that revisions strictly increase and that
//! replaying the changes rebuilds each table exactly, and readers check
//! that a cross-table transfer is atomic. The collector runs every
//! millisecond meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use rand::prelude::*;
use statedb::{AnyTable, ChangeKind, Db, DbOptions, Error, KeyLayout};

const TOKENS: std::ops::Range<u32> = 1000..1010;
const WRITERS: usize = 4;
const TXNS: usize = 2000;

fn tok(id: u32) -> Obj {
    obj(id, &format!("tok{id}"), &["token"], 0)
}

#[test]
fn concurrent_txns_and_consumers() {
    let db =
        Db::with_options(DbOptions::default().with_gc_interval(Some(Duration::from_millis(1))));
    let layouts = [KeyLayout::Bytes, KeyLayout::Nibbles, KeyLayout::Bytes];
    let fs: Arc<Vec<Fixture>> = Arc::new(
        (0..3)
            .map(|i| table_with(&db, &format!("t{i}"), layouts[i]))
            .collect(),
    );
    // Tokens start in table 0.
    {
        let mut w = db.write_txn(&[&fs[0].table]).unwrap();
        for id in TOKENS {
            fs[0].table.insert(&mut w, tok(id)).unwrap();
        }
        w.commit().unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicUsize::new(0));
    let aborted = Arc::new(AtomicUsize::new(0));

    // Consumers: two per table, registered before the writers start.
    let mut consumers = Vec::new();
    for ti in 0..3 {
        for which in 0..2 {
            let mut w = db.write_txn(&[&fs[ti].table]).unwrap();
            let mut ch = fs[ti].table.changes(&mut w).unwrap();
            w.commit().unwrap();
            let (db, fs, done) = (db.clone(), fs.clone(), done.clone());
            consumers.push(std::thread::spawn(move || {
                let t = &fs[ti].table;
                let mut replica: BTreeMap<u32, (Obj, u64)> = BTreeMap::new();
                let mut last = 0u64;
                let mut batches = 0;
                loop {
                    let finished = done.load(Ordering::SeqCst);
                    let r = db.read_txn();
                    // The first consumer takes whole batches (`next`); the
                    // second borrows them (`iter`) a few at a time, dropping
                    // the iterator after each few: nothing may be lost.
                    let (changes, watch) = if which == 0 {
                        ch.next(&r).unwrap()
                    } else {
                        let mut all = Vec::new();
                        let mut chunk = 1 + batches % 4;
                        loop {
                            let (it, watch) = ch.iter(&r).unwrap();
                            let before = all.len();
                            all.extend(it.take(chunk).map(|c| c.to_owned()));
                            if all.len() - before < chunk {
                                break (all, watch);
                            }
                            chunk = 1 + (chunk + all.len()) % 5;
                        }
                    };
                    for c in &changes {
                        assert!(c.revision > last, "revisions must strictly increase");
                        last = c.revision;
                        match c.kind {
                            ChangeKind::Delete => {
                                replica.remove(&c.object.id);
                            }
                            ChangeKind::Insert | ChangeKind::Update => {
                                assert_eq!(c.object.revision(), c.revision);
                                replica.insert(c.object.id, (c.object.value().clone(), c.revision));
                            }
                        }
                    }
                    // The replica is exactly the table at this snapshot.
                    let actual: BTreeMap<u32, (Obj, u64)> = t
                        .all(&r)
                        .unwrap()
                        .map(|o| (o.id, (o.value().clone(), o.revision())))
                        .collect();
                    assert_eq!(replica, actual, "replay of {} diverged", t.name());
                    assert_eq!(ch.position(), t.revision(&r).unwrap());
                    batches += 1;
                    if finished {
                        return batches;
                    }
                    watch.wait_timeout(Duration::from_millis(20));
                }
            }));
        }
    }

    // Readers: the transfer between tables 0 and 1 is atomic.
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (db, fs, done) = (db.clone(), fs.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                let r = db.read_txn();
                let a = fs[0]
                    .table
                    .list(&r, &fs[0].by_tag, "token")
                    .unwrap()
                    .count();
                let b = fs[1]
                    .table
                    .list(&r, &fs[1].by_tag, "token")
                    .unwrap()
                    .count();
                assert_eq!(a + b, TOKENS.len(), "a transfer was seen half-done");
                n += 1;
                std::thread::yield_now();
            }
            n
        }));
    }

    let mut writers = Vec::new();
    for seed in 0..WRITERS as u64 {
        let (db, fs, committed, aborted) =
            (db.clone(), fs.clone(), committed.clone(), aborted.clone());
        writers.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            for _ in 0..TXNS {
                // Random lock order with repetitions.
                let mut lock: Vec<usize> = (0..rng.random_range(1..5))
                    .map(|_| rng.random_range(0..3))
                    .collect();
                lock.shuffle(&mut rng);
                let tables: Vec<&dyn AnyTable> = lock
                    .iter()
                    .map(|&i| &fs[i].table as &dyn AnyTable)
                    .collect();
                let mut w = db.write_txn(&tables).unwrap();
                for _ in 0..rng.random_range(1..8) {
                    let ti = lock[rng.random_range(0..lock.len())];
                    let t = &fs[ti].table;
                    let id = rng.random_range(0..64u32);
                    let r = match rng.random_range(0..10) {
                        0..=4 => t
                            .insert(
                                &mut w,
                                obj(
                                    id,
                                    &format!("n{}", rng.random_range(0..80)),
                                    &["a"],
                                    rng.random_range(-2..2),
                                ),
                            )
                            .map(|_| ()),
                        5 => t
                            .modify(&mut w, obj(id, &format!("m{id}"), &["b"], 0), |o, mut n| {
                                n.group = o.group.wrapping_add(1);
                                n
                            })
                            .map(|_| ()),
                        6..=7 => t.delete_key(&mut w, &id).map(|_| ()),
                        8 if ti == 2 => t.delete_all(&mut w).map(|_| ()),
                        _ => {
                            let cur = t.get(&w, &fs[ti].by_id, &id).unwrap().map(|o| o.revision());
                            match cur {
                                Some(rev) => t
                                    .compare_and_swap(
                                        &mut w,
                                        rev,
                                        obj(id, &format!("c{id}"), &[], 1),
                                    )
                                    .map(|_| ()),
                                None => Ok(()),
                            }
                        }
                    };
                    match r {
                        Ok(()) | Err(Error::UniqueConflict { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                if lock.contains(&0) && lock.contains(&1) {
                    // Move one token across.
                    let id = rng.random_range(TOKENS);
                    let (from, to) = if fs[0].table.get(&w, &fs[0].by_id, &id).unwrap().is_some() {
                        (0, 1)
                    } else {
                        (1, 0)
                    };
                    fs[from].table.delete_key(&mut w, &id).unwrap().unwrap();
                    fs[to].table.insert(&mut w, tok(id)).unwrap();
                }
                if rng.random_bool(0.1) {
                    drop(w);
                    aborted.fetch_add(1, Ordering::Relaxed);
                } else {
                    w.commit().unwrap();
                    committed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    for c in consumers {
        assert!(c.join().unwrap() > 1);
    }
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let (c, a) = (
        committed.load(Ordering::Relaxed),
        aborted.load(Ordering::Relaxed),
    );
    assert_eq!(c + a, WRITERS * TXNS);
    assert!(a > 0 && c > a * 4, "committed {c}, aborted {a}");
    // Every consumer is done and dropped: the graveyard empties.
    db.collect_garbage();
    for s in db.stats() {
        assert_eq!(s.graveyard, 0, "{}", s.name);
    }
}

//! The reconciler against a scripted fake external system, on a manual
//! clock.

use std::time::Duration;

use crate::common::recorder;
use crate::common::*;
use reconciler::{
    Clock, Config, ConfigError, Health, RateLimit, Reconciler, StartError, Status, StatusKind,
    StatusSet, Target, WaitError,
};
use statedb::{Db, Index, Table};

const LONG: Duration = Duration::from_secs(5);

#[test]
fn updates_become_done() {
    let env = Env::new();
    let rec = env.start(config());
    let rev = env.put(&[(1, 10), (2, 20), (3, 30)]);
    assert_eq!(rec.wait_until_reconciled(rev, LONG), Ok(rec.processed()));
    assert!(rec.processed() >= rev);
    for id in 1..=3 {
        let s = env.status(id).unwrap();
        assert_eq!(s.kind(), StatusKind::Done);
        assert_eq!(s.updated_at(), T0);
    }
    assert_eq!(env.fake.ext().items, env.desired());
    assert_eq!(env.fake.ext().updates, 3);
    wait_for(|| rec.health() == Health::Ok { objects: 3 });
    // An object changed without being marked pending is left alone.
    let mut w = env.db.write_txn(&[&env.table]).unwrap();
    let mut o = (*env.table.get(&w, &env.id, &1).unwrap().unwrap().value()).clone();
    o.value = 11;
    env.table.insert(&mut w, o).unwrap();
    let r = w.commit().unwrap();
    let rev = env.table.revision(&r).unwrap();
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().updates, 3);
    rec.stop();
    assert_eq!(rec.health(), Health::Stopped { error: None });
    assert_eq!(
        rec.wait_until_reconciled(rev + 1, LONG),
        Err(WaitError::Stopped)
    );
}

#[test]
fn failure_goes_to_error_and_recovers_by_retry() {
    let env = Env::new();
    let cfg = Config {
        retry_min: ms(100),
        retry_max: ms(300),
        ..config()
    };
    let rec = env.start(cfg);
    env.fake.ext().fail_update.insert(2);
    let rev = env.put(&[(1, 10), (2, 20)]);
    wait_for(|| env.kind(2) == Some(StatusKind::Error));
    assert_eq!(env.status(2).unwrap().error(), Some("update 2 failed"));
    assert_eq!(env.kind(1), Some(StatusKind::Done));
    // Backoff: 100 ms, then 200, then capped at 300.
    env.wait_deadline(T0.plus(ms(100)));
    match rec.wait_until_reconciled(rev, ms(1)) {
        Err(WaitError::Failing { errors }) => assert_eq!(errors, ["2: update 2 failed"]),
        other => panic!("{other:?}"),
    }
    match rec.health() {
        Health::Degraded { failing, errors } => {
            assert_eq!(failing, 1);
            assert_eq!(errors, ["2: update 2 failed"]);
        }
        h => panic!("{h}"),
    }
    env.clock.advance(ms(100));
    env.wait_deadline(T0.plus(ms(300)));
    assert_eq!(env.fake.ext().updates, 3);
    env.clock.advance(ms(200));
    env.wait_deadline(T0.plus(ms(600)));
    assert_eq!(env.fake.ext().updates, 4);
    // Fixed: the next retry succeeds.
    env.fake.ext().fail_update.clear();
    env.clock.advance(ms(300));
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.kind(2), Some(StatusKind::Done));
    assert_eq!(env.fake.ext().items, env.desired());
    wait_for(|| rec.health() == Health::Ok { objects: 2 });
}

#[test]
fn a_changed_object_drops_its_retry() {
    let env = Env::new();
    let rec = env.start(config());
    env.fake.ext().fail_update.insert(1);
    env.put(&[(1, 10)]);
    wait_for(|| env.kind(1) == Some(StatusKind::Error));
    env.fake.ext().fail_update.clear();
    // The new version is reconciled at once, not at the retry's time.
    let rev = env.put(&[(1, 11)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().items.get(&1), Some(&11));
    assert_eq!(env.fake.ext().updates, 2);
    // No retry left behind.
    wait_for(|| env.clock.next_deadline().is_none());
}

#[test]
fn deletes_and_failed_deletes() {
    let env = Env::new();
    let rec = env.start(config());
    let rev = env.put(&[(1, 10), (2, 20), (3, 30)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    env.fake.ext().fail_delete.insert(2);
    let rev = env.remove(&[1, 2]);
    wait_for(|| env.fake.ext().deletes == 2);
    assert_eq!(
        env.fake.ext().items.keys().copied().collect::<Vec<_>>(),
        [2, 3]
    );
    env.wait_deadline(T0.plus(ms(100)));
    assert!(matches!(
        rec.wait_until_reconciled(rev, ms(1)),
        Err(WaitError::Failing { .. })
    ));
    assert!(matches!(rec.health(), Health::Degraded { failing: 1, .. }));
    // The retry fails again, then succeeds.
    env.clock.advance(ms(100));
    env.wait_deadline(T0.plus(ms(300)));
    assert_eq!(env.fake.ext().deletes, 3);
    env.fake.ext().fail_delete.clear();
    env.clock.advance(ms(200));
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().items, env.desired());
    wait_for(|| rec.health() == Health::Ok { objects: 1 });
    // Deleting what is gone succeeds; a re-insert drops a failing delete.
    env.fake.ext().fail_delete.insert(3);
    env.remove(&[3]);
    wait_for(|| env.fake.ext().deletes == 5);
    env.fake.ext().fail_delete.clear();
    let rev = env.put(&[(3, 33)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().items.get(&3), Some(&33));
    wait_for(|| env.clock.next_deadline().is_none());
}

#[test]
fn batch_operations_delete_first_with_a_result_per_entry() {
    let mut env = Env::new();
    env.fake.batching = true;
    let rec = env.start(Config {
        round_size: 4,
        ..config()
    });
    let rev = env.put(&[(1, 1), (2, 2)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    env.fake.ext().batches.clear();
    env.fake.ext().fail_update.insert(5);
    // Held back by the table lock, so one round sees all of it.
    let mut w = env.db.write_txn(&[&env.table]).unwrap();
    env.table.delete_key(&mut w, &1u32).unwrap();
    for (id, v) in [(3, 3), (4, 4), (5, 5), (6, 6), (7, 7)] {
        env.table
            .insert(
                &mut w,
                Item {
                    id,
                    value: v,
                    status: Status::pending(),
                },
            )
            .unwrap();
    }
    let r = w.commit().unwrap();
    let rev = env.table.revision(&r).unwrap();
    wait_for(|| env.kind(5) == Some(StatusKind::Error) && env.kind(7) == Some(StatusKind::Done));
    // Rounds of at most 4 in revision order: the delete and three
    // updates (the delete's batch first), then two updates.
    assert_eq!(
        env.fake.ext().batches,
        [("delete", 1), ("update", 3), ("update", 2)]
    );
    assert_eq!(env.kind(4), Some(StatusKind::Done));
    assert!(matches!(
        rec.wait_until_reconciled(rev, ms(1)),
        Err(WaitError::Failing { .. })
    ));
    env.fake.ext().fail_update.clear();
    env.clock.advance(ms(100));
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().items, env.desired());
}

#[test]
fn prune_waits_for_initialization_then_runs_on_schedule_and_request() {
    let env = Env::new();
    let mut w = env.db.write_txn(&[&env.table]).unwrap();
    let init = env.table.register_initializer(&mut w, "sync").unwrap();
    w.commit().unwrap();
    env.fake.ext().items.insert(99, 0); // stray
    let rec = env.start(Config {
        prune_interval: Some(Duration::from_secs(60)),
        ..config()
    });
    let rev = env.put(&[(1, 10)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    // Not initialized: nothing pruned, not even on request.
    rec.trigger_prune();
    assert_eq!(env.fake.ext().prunes, 0);
    assert!(env.fake.ext().items.contains_key(&99));

    let mut w = env.db.write_txn(&[&env.table]).unwrap();
    env.table.initializer_done(&mut w, &init).unwrap();
    w.commit().unwrap();
    wait_for(|| env.fake.ext().prunes == 1);
    assert_eq!(env.fake.ext().items, env.desired());
    // The request made before initialization was kept for the first round
    // after it: at most one more.
    env.wait_deadline(T0.plus(Duration::from_secs(60)));
    let before = env.fake.ext().prunes;
    assert!(before <= 2);
    rec.trigger_prune();
    wait_for(|| env.fake.ext().prunes == before + 1);
    env.clock.advance(Duration::from_secs(60));
    wait_for(|| env.fake.ext().prunes == before + 2);
    assert_eq!(rec.counts().1 as usize, before + 2);

    // A failing prune degrades the health and is retried with backoff.
    env.fake.ext().fail_prune = true;
    rec.trigger_prune();
    wait_for(|| matches!(rec.health(), Health::Degraded { .. }));
    match rec.health() {
        Health::Degraded { failing, errors } => {
            assert_eq!(failing, 1);
            assert_eq!(errors, ["prune: prune failed"]);
        }
        h => panic!("{h}"),
    }
    let now = env.clock.now();
    env.wait_deadline(now.plus(ms(100)));
    env.fake.ext().fail_prune = false;
    env.clock.advance(ms(100));
    wait_for(|| rec.health().is_ok());
}

#[test]
fn refresh_updates_old_done_objects_again() {
    let env = Env::new();
    let rec = env.start(Config {
        refresh_interval: Some(Duration::from_secs(60)),
        refresh_rate: RateLimit::per_second(1, 1),
        ..config()
    });
    let rev = env.put(&[(1, 10), (2, 20)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().updates, 2);
    // Done at T0: due for refresh at T0 + 60 s.
    env.wait_deadline(T0.plus(Duration::from_secs(60)));
    env.clock.advance(Duration::from_secs(60));
    // One token a second: the first object now, the second a second later.
    wait_for(|| env.fake.ext().updates == 3);
    let t1 = env.clock.now();
    wait_for(|| env.status(1).map(|s| (s.kind(), s.updated_at())) == Some((StatusKind::Done, t1)));
    env.wait_deadline(t1.plus(Duration::from_secs(1)));
    assert_eq!(env.fake.ext().updates, 3);
    env.clock.advance(Duration::from_secs(1));
    wait_for(|| env.fake.ext().updates == 4);
    let t2 = env.clock.now();
    wait_for(|| env.status(2).map(|s| (s.kind(), s.updated_at())) == Some((StatusKind::Done, t2)));
    // Next due: the first object, refreshed at t1.
    env.wait_deadline(t1.plus(Duration::from_secs(60)));
}

#[derive(Clone, Debug)]
struct Shared {
    id: u32,
    statuses: StatusSet,
}

#[test]
fn two_reconcilers_share_one_object() {
    let db = Db::new();
    let id = Index::unique("id", |s: &Shared| s.id);
    let table: Table<Shared> = db.create_table("shared", &id, &[]).unwrap();
    let counts = std::sync::Arc::new(std::sync::Mutex::new([0usize; 2]));
    struct Count(std::sync::Arc<std::sync::Mutex<[usize; 2]>>, usize);
    impl reconciler::Operations<Shared> for Count {
        fn update(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Shared,
        ) -> Result<(), reconciler::OpError> {
            self.0.lock().unwrap()[self.1] += 1;
            Ok(())
        }
        fn delete(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Shared,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
        fn prune(
            &mut self,
            _: &statedb::ReadTxn,
            _: statedb::Objects<'_, Shared>,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
    }
    let clock = reconciler::ManualClock::new(T0);
    let start = |name: &str, n: usize| {
        let target = Target::with_status_set(
            &table,
            &id,
            |s| s.id,
            name,
            |s| &s.statuses,
            |s, statuses| Shared {
                statuses,
                ..s.clone()
            },
        );
        let cfg = Config {
            name: name.into(),
            ..config()
        };
        Reconciler::start_with_clock(&db, target, Count(counts.clone(), n), cfg, clock.clone())
            .unwrap()
    };
    let a = start("a", 0);
    let b = start("b", 1);
    let mut w = db.write_txn(&[&table]).unwrap();
    for i in 0..50 {
        table
            .insert(
                &mut w,
                Shared {
                    id: i,
                    statuses: StatusSet::new(),
                },
            )
            .unwrap();
    }
    let rev = table.revision(&w.commit().unwrap()).unwrap();
    a.wait_until_reconciled(rev, LONG).unwrap();
    b.wait_until_reconciled(rev, LONG).unwrap();
    wait_for(|| {
        let r = db.read_txn();
        let all_done = table.all(&r).unwrap().all(|o| {
            o.statuses.get("a").kind() == StatusKind::Done
                && o.statuses.get("b").kind() == StatusKind::Done
        });
        all_done
    });
    // Each reconciled each object once: the other's status write did not
    // make it pending again.
    assert_eq!(*counts.lock().unwrap(), [50, 50]);
    // Marking it pending again reaches both.
    let mut w = db.write_txn(&[&table]).unwrap();
    let o = table.get(&w, &id, &7).unwrap().unwrap().value().clone();
    table
        .insert(
            &mut w,
            Shared {
                statuses: o.statuses.pending(),
                ..o
            },
        )
        .unwrap();
    w.commit().unwrap();
    wait_for(|| *counts.lock().unwrap() == [51, 51]);
}

#[test]
fn wait_until_reconciled_times_out_before_the_revision() {
    let env = Env::new();
    // A round rate of one a minute holds the second round back.
    let rec = env.start(Config {
        round_rate: Some(RateLimit {
            interval: Duration::from_secs(60),
            burst: 1,
        }),
        ..config()
    });
    let rev = env.put(&[(1, 1)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    let rev2 = env.put(&[(2, 2)]);
    assert_eq!(
        rec.wait_until_reconciled(rev2, ms(5)),
        Err(WaitError::Timeout {
            processed: rec.processed()
        })
    );
    env.clock.advance(Duration::from_secs(60));
    rec.wait_until_reconciled(rev2, LONG).unwrap();
}

#[test]
fn metrics_count_operations_errors_and_prunes() {
    use reconciler::metrics::*;
    let m = recorder::TestRecorder::default();
    let env = Env::new();
    let rec = metrics::with_local_recorder(&m, || {
        env.start(Config {
            prune_interval: Some(Duration::from_secs(60)),
            ..config()
        })
    });
    env.fake.ext().fail_update.insert(3);
    env.put(&[(1, 1), (2, 2), (3, 3)]);
    wait_for(|| m.gauge(RECONCILIATION_CURRENT_ERRORS, Some("update")) == Some(1.0));
    assert_eq!(env.kind(3), Some(StatusKind::Error));
    assert_eq!(m.counter(RECONCILIATIONS, Some("update")), Some(3));
    assert_eq!(m.counter(RECONCILIATION_ERRORS, Some("update")), Some(1));
    assert!(m.recorded(RECONCILIATION_DURATION, Some("update")).unwrap() >= 1);
    assert_eq!(m.counter(PRUNES, None), Some(1));
    env.fake.ext().fail_update.clear();
    env.clock.advance(ms(100));
    wait_for(|| m.gauge(RECONCILIATION_CURRENT_ERRORS, Some("update")) == Some(0.0));
    env.fake.ext().fail_delete.insert(1);
    env.remove(&[1]);
    wait_for(|| m.gauge(RECONCILIATION_CURRENT_ERRORS, Some("delete")) == Some(1.0));
    assert_eq!(m.counter(RECONCILIATIONS, Some("update")), Some(4));
    assert_eq!(m.counter(RECONCILIATIONS, Some("delete")), Some(1));
    assert_eq!(m.counter(RECONCILIATION_ERRORS, Some("delete")), Some(1));
    env.fake.ext().fail_prune = true;
    rec.trigger_prune();
    wait_for(|| m.gauge(PRUNE_CURRENT_ERRORS, None) == Some(1.0));
    assert_eq!(m.counter(PRUNE_ERRORS, None), Some(1));
    assert_eq!(m.counter(PRUNES, None), Some(2));
    assert_eq!(m.recorded(PRUNE_DURATION, None), Some(2));
}

#[test]
fn bad_config_is_a_typed_error() {
    let env = Env::new();
    let e = Reconciler::start(
        &env.db,
        env.target(),
        env.fake.clone(),
        Config {
            round_size: 0,
            ..config()
        },
    )
    .unwrap_err();
    assert!(matches!(e, StartError::Config(ConfigError::ZeroRoundSize)));
    // Outside a runtime, `spawn` says so.
    struct Never;
    impl reconciler::AsyncOperations<Item> for Never {
        async fn update(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Item,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
        async fn delete(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Item,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
        async fn prune(
            &mut self,
            _: &statedb::ReadTxn,
            _: statedb::Objects<'_, Item>,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
    }
    let e = Reconciler::spawn(&env.db, env.target(), Never, config()).unwrap_err();
    assert!(matches!(e, StartError::NoRuntime));
    // A table of another database.
    let other = Db::new();
    let e = Reconciler::start(&other, env.target(), env.fake.clone(), config()).unwrap_err();
    assert!(matches!(e, StartError::Db(_)));
}

/// Async operations over the same fake, awaiting a tokio yield in each.
struct AsyncFake(Fake);

impl reconciler::AsyncOperations<Item> for AsyncFake {
    async fn update(
        &mut self,
        txn: &statedb::ReadTxn,
        rev: u64,
        obj: &Item,
    ) -> Result<(), reconciler::OpError> {
        tokio::task::yield_now().await;
        reconciler::Operations::update(&mut self.0, txn, rev, obj)
    }
    async fn delete(
        &mut self,
        txn: &statedb::ReadTxn,
        rev: u64,
        obj: &Item,
    ) -> Result<(), reconciler::OpError> {
        tokio::task::yield_now().await;
        reconciler::Operations::delete(&mut self.0, txn, rev, obj)
    }
    async fn prune(
        &mut self,
        txn: &statedb::ReadTxn,
        desired: statedb::Objects<'_, Item>,
    ) -> Result<(), reconciler::OpError> {
        tokio::task::yield_now().await;
        reconciler::Operations::prune(&mut self.0, txn, desired)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_operations_on_tokio() {
    let env = Env::new();
    let rec = Reconciler::spawn_with_clock(
        &env.db,
        env.target(),
        AsyncFake(env.fake.clone()),
        config(),
        env.clock.clone(),
    )
    .unwrap();
    env.fake.ext().fail_update.insert(2);
    let rev = env.put(&[(1, 1), (2, 2)]);
    let r = rec.wait_until_reconciled_async(rev, Some(ms(20))).await;
    assert!(matches!(r, Err(WaitError::Failing { .. })), "{r:?}");
    env.fake.ext().fail_update.clear();
    env.clock.advance(ms(100));
    rec.wait_until_reconciled_async(rev, None).await.unwrap();
    let rev = env.remove(&[1]);
    rec.wait_until_reconciled_async(rev, Some(LONG))
        .await
        .unwrap();
    assert_eq!(env.fake.ext().items, env.desired());
    drop(rec);
}

#[test]
fn a_panicking_operation_stops_the_loop_and_says_so() {
    struct Panics;
    impl reconciler::Operations<Item> for Panics {
        fn update(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Item,
        ) -> Result<(), reconciler::OpError> {
            panic!("operation bug")
        }
        fn delete(
            &mut self,
            _: &statedb::ReadTxn,
            _: u64,
            _: &Item,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
        fn prune(
            &mut self,
            _: &statedb::ReadTxn,
            _: statedb::Objects<'_, Item>,
        ) -> Result<(), reconciler::OpError> {
            Ok(())
        }
    }
    let env = Env::new();
    let rec =
        Reconciler::start_with_clock(&env.db, env.target(), Panics, config(), env.clock.clone())
            .unwrap();
    let rev = env.put(&[(1, 1)]);
    assert_eq!(
        rec.wait_until_reconciled(rev, LONG),
        Err(WaitError::Stopped)
    );
    assert!(matches!(rec.health(), Health::Stopped { error: Some(_) }));
    rec.stop();
}

#[test]
fn extreme_durations_do_not_panic() {
    let env = Env::new();
    let rec = env.start(Config {
        retry_min: Duration::MAX,
        retry_max: Duration::MAX,
        retry_jitter: 1.0,
        prune_interval: Some(Duration::MAX),
        refresh_interval: Some(Duration::MAX),
        ..config()
    });
    env.fake.ext().fail_update.insert(1);
    let rev = env.put(&[(1, 1), (2, 2)]);
    wait_for(|| env.kind(1) == Some(StatusKind::Error));
    assert!(matches!(
        rec.wait_until_reconciled(rev, ms(1)),
        Err(WaitError::Failing { .. })
    ));
    env.clock.advance(Duration::MAX);
    let rev = env.put(&[(2, 3)]);
    // No deadline overflows, and a timeout past `Instant`'s range is fine.
    env.fake.ext().fail_update.clear();
    env.remove(&[1]);
    let rev = rev.max(env.put(&[(3, 3)]));
    rec.wait_until_reconciled(rev, Duration::MAX).unwrap();
    assert!(!matches!(rec.health(), Health::Stopped { .. }));
}

#[test]
fn an_update_in_the_same_round_supersedes_a_failed_delete() {
    let env = Env::new();
    let rec = env.start(config());
    let rev = env.put(&[(4, 35)]);
    rec.wait_until_reconciled(rev, LONG).unwrap();
    env.fake.ext().fail_delete.insert(4);
    // One round sees the delete of the old version (which fails) and the
    // new version (which succeeds).
    let mut w = env.db.write_txn(&[&env.table]).unwrap();
    env.table.delete_key(&mut w, &4u32).unwrap();
    env.table
        .insert(
            &mut w,
            Item {
                id: 4,
                value: 16,
                status: Status::pending(),
            },
        )
        .unwrap();
    let rev = env.table.revision(&w.commit().unwrap()).unwrap();
    rec.wait_until_reconciled(rev, LONG).unwrap();
    assert_eq!(env.fake.ext().deletes, 1);
    assert_eq!(env.fake.ext().items.get(&4), Some(&16));
    // No retry of the old delete is left to remove the new version.
    wait_for(|| env.clock.next_deadline().is_none());
    env.fake.ext().fail_delete.clear();
    env.clock.advance(Duration::from_secs(3600));
    assert_eq!(env.fake.ext().items.get(&4), Some(&16));
}

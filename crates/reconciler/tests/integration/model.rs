//! Model test: random writes, deletes, injected operation failures and
//! clock moves while the reconciler runs; once failures stop and time
//! passes the longest backoff, the fake external system holds exactly the
//! table and every object is done.

use std::time::Duration;

use crate::common::*;
use proptest::prelude::*;
use reconciler::{Clock, Config, StatusKind};

#[derive(Clone, Debug)]
enum Step {
    Put(u32, u32),
    Delete(u32),
    FailUpdate(u32, bool),
    FailDelete(u32, bool),
    FailPrune(bool),
    Stray(u32),
    Advance(u64),
    Prune,
}

fn step() -> impl Strategy<Value = Step> {
    let id = 0u32..6;
    prop_oneof![
        4 => (id.clone(), 0u32..100).prop_map(|(i, v)| Step::Put(i, v)),
        2 => id.clone().prop_map(Step::Delete),
        1 => (id.clone(), any::<bool>()).prop_map(|(i, b)| Step::FailUpdate(i, b)),
        1 => (id.clone(), any::<bool>()).prop_map(|(i, b)| Step::FailDelete(i, b)),
        1 => any::<bool>().prop_map(Step::FailPrune),
        1 => (10u32..12).prop_map(Step::Stray),
        2 => (0u64..150).prop_map(Step::Advance),
        1 => Just(Step::Prune),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn external_system_converges_to_the_table(steps in proptest::collection::vec(step(), 1..40)) {
        let env = Env::new();
        let retry_max = Duration::from_millis(100);
        let rec = env.start(Config {
            round_size: 3,
            retry_min: Duration::from_millis(10),
            retry_max,
            retry_jitter: 0.5,
            prune_interval: Some(Duration::from_secs(1)),
            ..config()
        });
        for s in &steps {
            match *s {
                Step::Put(id, v) => {
                    env.put(&[(id, v)]);
                }
                Step::Delete(id) => {
                    env.remove(&[id]);
                }
                Step::FailUpdate(id, on) => {
                    let mut e = env.fake.ext();
                    if on { e.fail_update.insert(id); } else { e.fail_update.remove(&id); }
                }
                Step::FailDelete(id, on) => {
                    let mut e = env.fake.ext();
                    if on { e.fail_delete.insert(id); } else { e.fail_delete.remove(&id); }
                }
                Step::FailPrune(on) => env.fake.ext().fail_prune = on,
                Step::Stray(id) => {
                    env.fake.ext().items.insert(id, 0);
                }
                Step::Advance(ms) => env.clock.advance(Duration::from_millis(ms)),
                Step::Prune => rec.trigger_prune(),
            }
        }
        // Failures stop; stray entries go at the next prune.
        {
            let mut e = env.fake.ext();
            e.fail_update.clear();
            e.fail_delete.clear();
            e.fail_prune = false;
        }
        rec.trigger_prune();
        let rev = env.table.revision(&env.db.read_txn()).unwrap();
        let mut done = false;
        for _ in 0..100 {
            // Past every retry (and, in time, the next periodic prune).
            env.clock.advance(retry_max * 3);
            // The loop may not have run yet: give it a moment each time.
            if rec.wait_until_reconciled(rev, Duration::from_millis(20)).is_ok()
                && holds_within(Duration::from_millis(20), || env.fake.ext().items == env.desired())
            {
                done = true;
                break;
            }
        }
        prop_assert!(
            done,
            "not converged: {:?} vs {:?}, {}, {:?}, next deadline {:?}, now {:?}",
            env.fake.ext(),
            env.desired(),
            rec.health(),
            rec.counts(),
            env.clock.next_deadline(),
            env.clock.now()
        );
        let r = env.db.read_txn();
        for o in env.table.all(&r).unwrap() {
            prop_assert_eq!(o.status.kind(), StatusKind::Done, "{:?}", o);
        }
        wait_for(|| rec.health().is_ok());
    }
}

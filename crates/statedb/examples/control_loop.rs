//! A small control loop: a `desired` table of routes that an operator
//! edits, and a reconciler thread that follows its change stream, "applies"
//! each route and records the result in an `observed` table. Everything is
//! watch-driven: the reconciler waits for the desired table to be
//! initialized, then blocks on change-stream watches; the operator waits on
//! a watch of the observed table to see its edits applied.
//!
//! `cargo run -p statedb --example control_loop`

use std::net::IpAddr;
use std::thread;
use std::time::Duration;

use statedb::{ChangeKind, Db, Index, IpPrefix, Table};

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
struct Route {
    prefix: IpPrefix,
    via: IpAddr,
    dev: String,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
struct Applied {
    prefix: IpPrefix,
    via: IpAddr,
    /// Revision of the desired route this reflects.
    desired_revision: u64,
}

fn prefix(s: &str) -> IpPrefix {
    let (a, l) = s.split_once('/').expect("addr/len");
    IpPrefix::new(a.parse().expect("address"), l.parse().expect("length")).expect("prefix")
}

fn main() -> Result<(), statedb::Error> {
    let db = Db::new();
    let by_prefix = Index::unique("prefix", |r: &Route| r.prefix);
    let by_dev = Index::non_unique("dev", |r: &Route| r.dev.clone());
    let desired: Table<Route> = db.create_table("desired", &by_prefix, &[by_dev.erase()])?;
    let applied_by_prefix = Index::unique("prefix", |a: &Applied| a.prefix);
    let observed: Table<Applied> = db.create_table("observed", &applied_by_prefix, &[])?;

    // The desired table is not ready until its source has synced.
    let mut w = db.write_txn(&[&desired])?;
    let sync = desired.register_initializer(&mut w, "config-file")?;
    // Register the reconciler's change stream in the same transaction: no
    // change can slip between registration and its first read.
    let mut changes = desired.changes(&mut w)?;
    w.commit()?;

    let reconciler = {
        let (db, desired, observed) = (db.clone(), desired.clone(), observed.clone());
        thread::spawn(move || -> Result<usize, statedb::Error> {
            // Wait for initialization (watch-driven).
            loop {
                let r = db.read_txn();
                let (done, watch) = desired.initialized_watch(&r)?;
                if done {
                    break;
                }
                // No snapshot held while blocked: whoever lets go of a
                // version last frees it.
                drop(r);
                watch.wait();
            }
            println!("reconciler: desired state initialized, reconciling");
            let mut applied = 0;
            loop {
                let r = db.read_txn();
                let (batch, watch) = changes.next(&r)?;
                if !batch.is_empty() {
                    let mut w = db.write_txn(&[&observed])?;
                    for c in &batch {
                        match c.kind {
                            ChangeKind::Insert | ChangeKind::Update => {
                                println!(
                                    "reconciler: apply {:?} {} via {} (rev {})",
                                    c.kind, c.object.prefix, c.object.via, c.revision
                                );
                                observed.insert(
                                    &mut w,
                                    Applied {
                                        prefix: c.object.prefix,
                                        via: c.object.via,
                                        desired_revision: c.revision,
                                    },
                                )?;
                            }
                            ChangeKind::Delete => {
                                println!("reconciler: remove {}", c.object.prefix);
                                observed.delete_key(&mut w, &c.object.prefix)?;
                            }
                        }
                        applied += 1;
                    }
                    w.commit()?;
                }
                // The operator asks for shutdown with a sentinel route.
                if desired
                    .get(&r, &by_prefix, &prefix("0.0.0.0/0"))?
                    .is_some_and(|d| d.dev == "stop")
                {
                    return Ok(applied);
                }
                drop((batch, r));
                watch.wait_timeout(Duration::from_secs(5));
            }
        })
    };

    let set = |routes: &[(&str, &str, &str)]| -> Result<(), statedb::Error> {
        let mut w = db.write_txn(&[&desired])?;
        for (p, via, dev) in routes {
            desired.insert(
                &mut w,
                Route {
                    prefix: prefix(p),
                    via: via.parse().expect("address"),
                    dev: dev.to_string(),
                },
            )?;
        }
        w.commit()?;
        Ok(())
    };
    // Wait until `observed` reflects the desired table at revision `rev`.
    let converge = |rev: u64| -> Result<(), statedb::Error> {
        loop {
            let r = db.read_txn();
            let (objs, watch) = observed.all_watch(&r)?;
            let want: Vec<_> = desired.all(&r)?.map(|d| (d.prefix, d.via)).collect();
            let have: Vec<_> = objs.map(|a| (a.prefix, a.via)).collect();
            if want == have && desired.revision(&r)? >= rev {
                return Ok(());
            }
            drop(r);
            watch.wait_timeout(Duration::from_secs(5));
        }
    };

    set(&[
        ("10.0.0.0/8", "192.168.1.1", "eth0"),
        ("10.1.0.0/16", "192.168.1.2", "eth0"),
        ("fd00::/8", "fe80::1", "eth1"),
    ])?;
    let mut w = db.write_txn(&[&desired])?;
    desired.initializer_done(&mut w, &sync)?;
    let r = w.commit()?;
    converge(desired.revision(&r)?)?;
    println!("operator: initial routes applied");

    // Edit: change a next hop, delete a route.
    let mut w = db.write_txn(&[&desired])?;
    desired.insert(
        &mut w,
        Route {
            prefix: prefix("10.1.0.0/16"),
            via: "192.168.1.3".parse().expect("address"),
            dev: "eth0".into(),
        },
    )?;
    desired.delete_key(&mut w, &prefix("fd00::/8"))?;
    let r = w.commit()?;
    converge(desired.revision(&r)?)?;
    println!("operator: edits applied");
    let r = db.read_txn();
    let on_eth0: Vec<_> = desired
        .list(&r, &by_dev, "eth0")?
        .map(|d| d.prefix.to_string())
        .collect();
    println!("operator: routes on eth0: {on_eth0:?}");
    println!("desired:  {}", desired.to_json(&r)?);
    println!("observed: {}", observed.to_json(&r)?);

    set(&[("0.0.0.0/0", "0.0.0.0", "stop")])?;
    let applied = reconciler.join().expect("reconciler thread")?;
    println!("reconciler: {applied} changes applied");
    for s in db.stats() {
        println!(
            "stats: {} objects={} revision={} graveyard={} commits={}",
            s.name, s.objects, s.revision, s.graveyard, s.commit.count
        );
    }
    Ok(())
}

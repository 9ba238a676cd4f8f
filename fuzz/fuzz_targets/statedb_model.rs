//! statedb against a `BTreeMap` model under coverage-guided fuzzing.
//!
//! Two tables share a database: `a` (byte keys) with a unique name, a
//! multi-key tag index and a signed group; `b` (nibble keys) with unique
//! multi-key aliases, a non-unique name and the group. The input drives
//! write transactions over any lock list (repeats, either order) that
//! insert, merge, compare-and-swap, delete (by object, by key, all),
//! register and finish initializers and subscribe change consumers, then
//! commit, abort or drop. Every write's result is checked against the
//! model, refusals included: a unique conflict, a key past
//! `part::MAX_KEY_LEN`, a merge that moves the primary key, a wrong
//! revision, a table not locked, a finished transaction; a refused write
//! must leave the transaction as it was. Every query kind on every index
//! reads as the model inside the transaction, in its commit's snapshot and
//! in snapshots kept from earlier; a point watch fires exactly when its
//! object changed, a prefix watch on every change of its result and on
//! nothing but writes of names under it (see `Watches::judge`); change
//! consumers, advanced part way or to the end at any time, rebuild each
//! table exactly with strictly rising revisions and inserts told from
//! updates, whatever was deleted in between; a
//! collection leaves no graveyard once no consumer needs one; a
//! per-thread reader sees each commit, and a table's JSON dump lists what
//! the model holds.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use statedb::{
    AnyTable, ChangeKind, Changes, Db, DbOptions, Error, Index, Initializer, KeyLayout, ReadTxn,
    Reader, Table, TableOptions, TxnRead, Watch, WriteTxn,
};

/// Steps (transactions, consumer moves, snapshots, collections) per input.
const STEPS: usize = 48;
/// Writes per transaction, at most.
const WRITES: usize = 8;
const MAX: usize = part::MAX_KEY_LEN;
/// Names of these lengths straddle the key limit in each encoding.
const LONG: [usize; 7] = [
    MAX / 8,
    MAX / 8 + 1,
    MAX / 2 - 1,
    MAX / 2 + 1,
    MAX - 1,
    MAX,
    MAX + 1,
];
/// Short names and probes: prefixes of one another, 0x00, a two-byte char.
const NAMES: [&str; 8] = ["", "a", "a\0", "ab", "b", "\0", "\0\0", "\u{ff}"];
const TAGS: [&str; 5] = ["x", "x\0", "xy", "", "\0"];
const GROUPS: [i64; 8] = [i64::MIN, -301, -300, -1, 0, 1, 256, i64::MAX];

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
struct O {
    id: u32,
    name: String,
    tags: Vec<String>,
    group: i64,
    aliases: Vec<u16>,
}

/// A table and its indexes; `tags` only in `a`, `aliases` only in `b`.
struct T {
    table: Table<O>,
    id: Index<O, u32>,
    name: Index<O, String>,
    tags: Index<O, String>,
    group: Index<O, i64>,
    aliases: Index<O, u16>,
    /// `a`: the name index is unique and the tags index is the table's.
    is_a: bool,
}

fn table(db: &Db, name: &str, layout: KeyLayout, is_a: bool) -> T {
    let id = Index::unique("id", |o: &O| o.id);
    let nm = |o: &O| o.name.clone();
    let name_ix = if is_a {
        Index::unique("name", nm)
    } else {
        Index::non_unique("name", nm)
    };
    let tags = Index::non_unique_multi("tags", |o: &O| o.tags.clone());
    let group = Index::non_unique("group", |o: &O| o.group);
    let aliases = Index::unique_multi("aliases", |o: &O| o.aliases.clone());
    let extra = if is_a { tags.erase() } else { aliases.erase() };
    let table = db
        .create_table_with(
            name,
            &id,
            &[name_ix.erase(), extra, group.erase()],
            TableOptions::default().with_key_layout(layout),
        )
        .unwrap();
    T {
        table,
        id,
        name: name_ix,
        tags,
        group,
        aliases,
        is_a,
    }
}

/// One table's committed (or working) state.
#[derive(Clone, Default)]
struct M {
    /// id -> (object, revision, created revision).
    objs: BTreeMap<u32, (O, u64, u64)>,
    rev: u64,
    /// Pending initializers: (handle number, name).
    pending: Vec<(u64, String)>,
    /// Names the open transaction wrote or tried to write (an object's old
    /// name and its new one): a prefix watch on the name index may fire
    /// only if one is under the prefix.
    touched: Vec<String>,
}

/// How a name's length stands against the key limit.
#[derive(PartialEq)]
enum Long {
    Fits,
    /// Past the limit in some encoding (escapes, nibbles, suffixes).
    Maybe,
    Over,
}

impl M {
    fn conflict(&self, t: &T, o: &O) -> bool {
        self.objs.values().any(|(x, _, _)| {
            x.id != o.id
                && if t.is_a {
                    x.name == o.name
                } else {
                    x.aliases.iter().any(|a| o.aliases.contains(a))
                }
        })
    }

    /// The refusals storing `o` may meet, and whether one must.
    fn refusals(&self, t: &T, o: &O) -> (Vec<&'static str>, bool) {
        let long = match o.name.len() {
            n if n > MAX => Long::Over,
            n if n > MAX / 8 => Long::Maybe,
            _ => Long::Fits,
        };
        let conflict = self.conflict(t, o);
        let mut may = Vec::new();
        if conflict {
            may.push("UniqueConflict");
        }
        if long != Long::Fits {
            may.push("KeyTooLong");
        }
        (may, conflict || long == Long::Over)
    }

    /// Records a write of `o`, or of the object with `o`'s id, as touching
    /// both names.
    fn touch(&mut self, o: &O) {
        self.touched.push(o.name.clone());
        if let Some((old, _, _)) = self.objs.get(&o.id) {
            self.touched.push(old.name.clone());
        }
    }

    fn store(&mut self, o: O) -> Option<(O, u64)> {
        self.rev += 1;
        let created = self.objs.get(&o.id).map_or(self.rev, |x| x.2);
        let old = self.objs.insert(o.id, (o, self.rev, created));
        old.map(|(o, r, _)| (o, r))
    }

    fn remove(&mut self, id: u32) -> Option<(O, u64)> {
        let old = self.objs.remove(&id)?;
        self.rev += 1;
        Some((old.0, old.1))
    }
}

/// `STATEDB_FUZZ_TRACE=1`: prints each step (for reading a failing input).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("STATEDB_FUZZ_TRACE").is_some())
}

macro_rules! trace {
    ($($a:tt)*) => {
        if tracing() {
            eprintln!($($a)*);
        }
    };
}

/// An error's variant name.
fn kind(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

fn name(u: &mut Unstructured) -> Result<String> {
    if u.ratio(1, 24)? {
        let c = *u.choose(&['a', '\0'])?;
        return Ok(std::iter::repeat_n(c, *u.choose(&LONG)?).collect());
    }
    let n = u.int_in_range(0..=3)?;
    (0..n)
        .map(|_| Ok(*u.choose(&['\0', 'a', 'b', '\u{ff}'])?))
        .collect()
}

fn obj(u: &mut Unstructured) -> Result<O> {
    let id = if u.ratio(1, 10)? {
        u.arbitrary()?
    } else {
        u.int_in_range(0..=7)?
    };
    let name = name(u)?;
    let tags = (0..u.int_in_range(0..=2)?)
        .map(|_| Ok(u.choose(&TAGS)?.to_string()))
        .collect::<Result<_>>()?;
    let group = if u.ratio(1, 8)? {
        u.arbitrary()?
    } else {
        *u.choose(&GROUPS)?
    };
    let aliases = (0..u.int_in_range(0..=2)?)
        .map(|_| {
            if u.ratio(1, 8)? {
                u.arbitrary()
            } else {
                u.int_in_range(0..=5)
            }
        })
        .collect::<Result<_>>()?;
    Ok(O {
        id,
        name,
        tags,
        group,
        aliases,
    })
}

/// Ids in the order a query returned them.
fn ids<'a>(it: statedb::Result<impl Iterator<Item = &'a statedb::Obj<O>>>) -> Vec<u32> {
    vids(it.unwrap())
}

/// Ids in the order a query of a bound view (`Table::read`) returned them.
fn vids<'a>(it: impl Iterator<Item = &'a statedb::Obj<O>>) -> Vec<u32> {
    it.map(|o| o.id).collect()
}

/// A secondary index's entries as the model has them, sorted: an object
/// once per distinct key.
fn entries<K: Ord + Clone>(m: &M, keys: impl Fn(&O) -> Vec<K>) -> Vec<(K, u32)> {
    let mut v: Vec<(K, u32)> = Vec::new();
    for (o, _, _) in m.objs.values() {
        let mut ks = keys(o);
        ks.sort();
        ks.dedup();
        v.extend(ks.into_iter().map(|k| (k, o.id)));
    }
    v.sort();
    v
}

fn matching<K>(e: &[(K, u32)], f: impl Fn(&K) -> bool) -> Vec<u32> {
    e.iter().filter(|(k, _)| f(k)).map(|x| x.1).collect()
}

/// Every query kind on every index of `t` reads as `m`, through the
/// checked queries on `Table` and through the table's bound view alike.
fn check(t: &T, txn: &impl TxnRead, m: &M) {
    let tb = &t.table;
    let v = tb.read(txn).unwrap();
    assert_eq!(tb.len(txn).unwrap(), m.objs.len());
    assert_eq!(tb.revision(txn).unwrap(), m.rev);
    assert_eq!((v.len(), v.revision()), (m.objs.len(), m.rev));
    assert_eq!(ids(tb.all(txn)), m.objs.keys().copied().collect::<Vec<_>>());
    assert_eq!(vids(v.all()), m.objs.keys().copied().collect::<Vec<_>>());
    let mut probe: Vec<u32> = (0..=8).chain(m.objs.keys().copied()).collect();
    probe.push(u32::MAX);
    for id in probe {
        let got = tb.get(txn, &t.id, &id).unwrap();
        let want = m.objs.get(&id);
        assert_eq!(
            got.map(|o| (o.value(), o.revision(), o.created_revision())),
            want.map(|(o, r, c)| (o, *r, *c)),
            "get id {id}"
        );
        assert!(std::ptr::eq(
            got.map_or(std::ptr::null(), |o| &**o),
            v.get(&t.id, &id).map_or(std::ptr::null(), |o| &**o)
        ));
        let lb: Vec<u32> = m.objs.range(id..).map(|x| *x.0).collect();
        assert_eq!(ids(tb.lower_bound(txn, &t.id, &id)), lb);
        assert_eq!(vids(v.lower_bound(&t.id, &id)), lb);
    }
    // Names: unique in `a` (ordered by name), non-unique in `b` (by name,
    // then id); the model's own names are probes too.
    let names = entries(m, |o| vec![o.name.clone()]);
    let mut probes: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    probes.extend(names.iter().map(|x| x.0.clone()));
    for p in &probes {
        let list = matching(&names, |k| k == p);
        assert_eq!(ids(tb.list(txn, &t.name, p.as_str())), list);
        assert_eq!(vids(v.list(&t.name, p.as_str())), list);
        let got = tb.get(txn, &t.name, p.as_str()).unwrap().map(|o| o.id);
        assert_eq!(got, list.first().copied());
        assert_eq!(v.get(&t.name, p.as_str()).map(|o| o.id), got);
        let pre = matching(&names, |k| k.starts_with(p.as_str()));
        assert_eq!(ids(tb.prefix(txn, &t.name, p.as_str())), pre, "prefix");
        assert_eq!(vids(v.prefix(&t.name, p.as_str())), pre, "prefix");
        let lb = matching(&names, |k| k >= p);
        assert_eq!(ids(tb.lower_bound(txn, &t.name, p.as_str())), lb);
        assert_eq!(vids(v.lower_bound(&t.name, p.as_str())), lb);
    }
    let groups = entries(m, |o| vec![o.group]);
    let probes = GROUPS.iter().chain(groups.iter().map(|x| &x.0));
    for g in probes {
        let list = matching(&groups, |k| k == g);
        assert_eq!(ids(tb.list(txn, &t.group, g)), list);
        assert_eq!(vids(v.list(&t.group, g)), list);
        let lb = matching(&groups, |k| k >= g);
        assert_eq!(ids(tb.lower_bound(txn, &t.group, g)), lb, "group {g}");
        assert_eq!(vids(v.lower_bound(&t.group, g)), lb, "group {g}");
    }
    if t.is_a {
        let tags = entries(m, |o| o.tags.clone());
        for p in TAGS {
            let list = matching(&tags, |k| k == p);
            assert_eq!(ids(tb.list(txn, &t.tags, p)), list);
            assert_eq!(vids(v.list(&t.tags, p)), list);
            let pre = matching(&tags, |k| k.starts_with(p));
            assert_eq!(ids(tb.prefix(txn, &t.tags, p)), pre);
            assert_eq!(vids(v.prefix(&t.tags, p)), pre);
            let lb = matching(&tags, |k| k.as_str() >= p);
            assert_eq!(ids(tb.lower_bound(txn, &t.tags, p)), lb);
            assert_eq!(vids(v.lower_bound(&t.tags, p)), lb);
        }
        assert!(matches!(
            tb.get(txn, &t.aliases, &0),
            Err(Error::IndexNotInTable { .. })
        ));
    } else {
        let al = entries(m, |o| o.aliases.clone());
        let probes = (0..=6).chain([u16::MAX]).chain(al.iter().map(|x| x.0));
        for p in probes {
            let list = matching(&al, |k| *k == p);
            assert!(list.len() <= 1, "unique aliases {al:?}");
            let got = tb.get(txn, &t.aliases, &p).unwrap().map(|o| o.id);
            assert_eq!(got, list.first().copied());
            assert_eq!(v.get(&t.aliases, &p).map(|o| o.id), got);
            let lb = matching(&al, |k| *k >= p);
            assert_eq!(ids(tb.lower_bound(txn, &t.aliases, &p)), lb);
            assert_eq!(vids(v.lower_bound(&t.aliases, &p)), lb);
        }
    }
    let mut by_rev: Vec<(u64, u32)> = m.objs.values().map(|(o, r, _)| (*r, o.id)).collect();
    by_rev.sort();
    for from in [0, 1, m.rev / 2, m.rev, m.rev + 1] {
        let want = matching(&by_rev, |r| *r >= from);
        assert_eq!(ids(tb.list_revision(txn, from)), want);
        assert_eq!(vids(v.list_revision(from)), want);
    }
    let pending: Vec<String> = m.pending.iter().map(|x| x.1.clone()).collect();
    assert_eq!(tb.pending_initializers(txn).unwrap(), pending);
    assert_eq!(tb.initialized(txn).unwrap(), pending.is_empty());
}

/// A change consumer and the table it rebuilds.
struct Consumer {
    t: usize,
    ch: Changes<O>,
    replica: BTreeMap<u32, (O, u64)>,
    last: u64,
}

impl Consumer {
    /// Reads up to `n` changes (all with `None`) from the current snapshot;
    /// once at the end, the replica is the committed table.
    fn advance(&mut self, db: &Db, ts: &[T; 2], ms: &[M; 2], n: Option<usize>) {
        let r = db.read_txn();
        let end = ts[self.t].table.revision(&r).unwrap();
        // All at once, copied (`next`), or borrowed and maybe cut short.
        let got: Vec<statedb::Change<O>> = match n {
            None if end.is_multiple_of(2) => self.ch.next(&r).unwrap().0,
            _ => {
                let (it, _) = self.ch.iter(&r).unwrap();
                it.take(n.unwrap_or(usize::MAX))
                    .map(|c| c.to_owned())
                    .collect()
            }
        };
        for c in got {
            assert!(
                c.revision > self.last && c.revision <= end,
                "revision order"
            );
            self.last = c.revision;
            // An insert is the write that created the object.
            let created = c.object.created_revision();
            match c.kind {
                ChangeKind::Insert => assert_eq!(created, c.revision, "insert"),
                ChangeKind::Update => assert!(created < c.revision, "update"),
                ChangeKind::Delete => {}
            }
            if c.is_delete() {
                self.replica.remove(&c.object.id);
            } else {
                assert_eq!(c.object.revision(), c.revision);
                (self.replica).insert(c.object.id, (c.object.value().clone(), c.revision));
            }
        }
        if n.is_none() {
            let m = &ms[self.t];
            let want: BTreeMap<u32, (O, u64)> =
                (m.objs.iter().map(|(k, (o, r, _))| (*k, (o.clone(), *r)))).collect();
            assert!(self.replica == want, "a consumer's replica differs");
            assert_eq!(self.ch.position(), m.rev);
        }
    }
}

/// What writes add besides the tables: consumers and initializer handles.
#[derive(Default)]
struct Side {
    consumers: Vec<Consumer>,
    /// (table, handle, handle number).
    inits: Vec<(usize, Initializer, u64)>,
    next_init: u64,
}

/// Checks `res` against the model's refusals; `Ok` tells the caller to
/// apply the write to the model.
fn judged<R>(res: &statedb::Result<R>, may: &[&str], must: bool, what: &str) -> bool {
    match res {
        Ok(_) => {
            assert!(!must, "{what}: accepted, model refuses with one of {may:?}");
            true
        }
        Err(e) => {
            assert!(
                may.contains(&kind(e).as_str()),
                "{what}: {e:?}, model allows {may:?}"
            );
            false
        }
    }
}

fn same_old(got: Option<&statedb::Obj<O>>, want: Option<(O, u64)>) {
    assert_eq!(got.map(|o| (o.value().clone(), o.revision())), want);
}

/// One write into table `ti` of an open transaction.
fn write(
    u: &mut Unstructured,
    ts: &[T; 2],
    wd: &mut Side,
    w: &mut WriteTxn,
    m: &mut M,
    ti: usize,
) -> Result<()> {
    let t = &ts[ti];
    let tb = &t.table;
    let op = u.int_in_range(0..=11)?;
    trace!("  table {ti} op {op}");
    match op {
        0..=2 => {
            let o = obj(u)?;
            m.touch(&o);
            let (may, must) = m.refusals(t, &o);
            let res = tb.insert(w, o.clone());
            trace!("  insert {o:?}: {:?}", res.as_ref().map(|_| ()));
            if judged(&res, &may, must, "insert") {
                let old = m.store(o);
                same_old(res.unwrap().as_ref(), old);
            }
        }
        3 => {
            let o = obj(u)?;
            let moves = u.ratio(1, 5)?;
            let merge = move |old: &O, mut new: O| {
                new.tags = old.tags.iter().chain(&new.tags).cloned().collect();
                if moves {
                    new.id = new.id.wrapping_add(1);
                }
                new
            };
            let (stored, moved) = match m.objs.get(&o.id) {
                Some((old, _, _)) => (merge(old, o.clone()), moves),
                None => (o.clone(), false),
            };
            trace!("  modify {o:?} (moves {moves})");
            m.touch(&o);
            m.touch(&stored);
            let res = tb.modify(w, o, merge);
            if moved {
                assert!(matches!(res, Err(Error::MergeChangedKey)), "{res:?}");
            } else {
                let (may, must) = m.refusals(t, &stored);
                if judged(&res, &may, must, "modify") {
                    let old = m.store(stored);
                    same_old(res.unwrap().as_ref(), old);
                }
            }
        }
        4 => {
            let id = u.int_in_range(0..=8)?;
            if let Some((old, _, _)) = m.objs.get(&id) {
                m.touched.push(old.name.clone());
            }
            let res = if u.arbitrary()? {
                tb.delete(
                    w,
                    &O {
                        id,
                        name: String::new(),
                        tags: vec![],
                        group: 0,
                        aliases: vec![],
                    },
                )
            } else {
                tb.delete_key(w, &id)
            };
            same_old(res.unwrap().as_ref(), m.remove(id));
        }
        5 => {
            assert!(matches!(
                tb.delete_key(w, &1i32),
                Err(Error::KeyType { .. })
            ));
            assert_eq!(tb.delete_all(w).unwrap(), m.objs.len());
            let names: Vec<String> = m.objs.values().map(|x| x.0.name.clone()).collect();
            m.touched.extend(names);
            m.rev += m.objs.len() as u64;
            m.objs.clear();
        }
        6 | 7 => {
            let o = obj(u)?;
            let cur = m.objs.get(&o.id).map(|x| x.1);
            let rev = match (cur, u.arbitrary::<bool>()?) {
                (Some(r), true) => r,
                (Some(r), false) => r + 7,
                (None, _) => 1,
            };
            // What a wrong revision or a missing object is refused with.
            let wrong = if cur.is_none() {
                "ObjectNotFound"
            } else {
                "RevisionMismatch"
            };
            trace!("  compare at {rev} (current {cur:?}) {o:?}");
            m.touch(&o);
            if u.arbitrary()? {
                let res = tb.compare_and_swap(w, rev, o.clone());
                let (mut may, mut must) = m.refusals(t, &o);
                if cur != Some(rev) {
                    // Only a key past the limit may be refused first.
                    may.retain(|k| *k == "KeyTooLong");
                    may.push(wrong);
                    must = true;
                }
                if judged(&res, &may, must, "compare_and_swap") {
                    let old = m.store(o);
                    same_old(res.as_ref().ok(), old);
                }
            } else {
                let res = tb.compare_and_delete(w, rev, &o);
                if cur == Some(rev) {
                    same_old(res.as_ref().ok(), m.remove(o.id));
                } else {
                    judged(&res, &[wrong], true, "compare_and_delete");
                }
            }
        }
        8 | 9 => {
            if wd.inits.is_empty() || u.arbitrary()? {
                let n = name(u)?;
                let h = tb.register_initializer(w, &n).unwrap();
                wd.next_init += 1;
                m.pending.push((wd.next_init, n));
                wd.inits.push((ti, h, wd.next_init));
            } else {
                let (hi, h, num) = u.choose(&wd.inits)?;
                let res = tb.initializer_done(w, h);
                if *hi != ti {
                    assert!(
                        matches!(res, Err(Error::InitializerTable { .. })),
                        "{res:?}"
                    );
                } else if let Some(p) = m.pending.iter().position(|x| x.0 == *num) {
                    res.unwrap();
                    m.pending.remove(p);
                } else {
                    assert!(matches!(res, Err(Error::InitializerDone(_))), "{res:?}");
                }
            }
        }
        _ => {
            let ch = tb.changes(w).unwrap();
            wd.consumers.push(Consumer {
                t: ti,
                ch,
                replica: BTreeMap::new(),
                last: 0,
            });
        }
    }
    Ok(())
}

/// The watches a transaction's commit is judged by, taken before it.
struct Watches {
    /// (table, id, watch) for ids 0..=7 in each table.
    points: Vec<(usize, u32, Watch)>,
    /// (table, name prefix, watch).
    prefixes: Vec<(usize, &'static str, Watch)>,
}

impl Watches {
    fn take(ts: &[T; 2], snap: &ReadTxn) -> Watches {
        let mut points = Vec::new();
        let mut prefixes = Vec::new();
        for (ti, t) in ts.iter().enumerate() {
            for id in 0..=7u32 {
                points.push((ti, id, t.table.get_watch(snap, &t.id, &id).unwrap().1));
            }
            for p in ["", "a", "\0"] {
                prefixes.push((ti, p, t.table.prefix_watch(snap, &t.name, p).unwrap().1));
            }
        }
        Watches { points, prefixes }
    }

    fn none_fired(&self) {
        let all = self
            .points
            .iter()
            .map(|x| &x.2)
            .chain(self.prefixes.iter().map(|x| &x.2));
        assert!(
            all.into_iter().all(|w| !w.is_closed()),
            "a watch fired without a commit"
        );
    }

    /// A watch fires when its result changed. A point watch, on a present
    /// key or an absent one, fires for nothing else. A prefix's watch on
    /// the name index fires for nothing but a write of a name under it
    /// (part's design, "What fires": an object under it the transaction
    /// inserted and deleted again may fire it with its result unchanged).
    fn judge(&self, before: &[M; 2], after: &[M; 2]) {
        for (ti, id, w) in &self.points {
            let (old, new) = (before[*ti].objs.get(id), after[*ti].objs.get(id));
            if old != new {
                assert!(
                    w.is_closed(),
                    "table {ti} id {id} changed, its watch did not fire"
                );
            } else {
                assert!(
                    !w.is_closed(),
                    "table {ti} id {id} unchanged, its watch fired"
                );
            }
        }
        let under = |m: &M, p: &str| -> Vec<(u32, u64)> {
            let v = m.objs.values().filter(|x| x.0.name.starts_with(p));
            v.map(|(o, r, _)| (o.id, *r)).collect()
        };
        for (ti, p, w) in &self.prefixes {
            if under(&before[*ti], p) != under(&after[*ti], p) {
                assert!(w.is_closed(), "table {ti} prefix {p:?} changed, no fire");
            } else if !after[*ti].touched.iter().any(|n| n.starts_with(p)) {
                assert!(
                    !w.is_closed(),
                    "table {ti}: no name under {p:?} written, its prefix watch fired"
                );
            }
        }
    }
}

/// A write transaction: locks, writes, checks, then commit, abort or drop.
fn txn(
    u: &mut Unstructured,
    db: &Db,
    ts: &[T; 2],
    ms: &mut [M; 2],
    side: &mut Side,
    reader: &mut Reader,
) -> Result<()> {
    let n = u.int_in_range(1..=3)?;
    let lock: Vec<usize> = (0..n)
        .map(|_| u.int_in_range(0..=1))
        .collect::<Result<_>>()?;
    let watches = Watches::take(ts, &db.read_txn());
    let tabs: Vec<&dyn AnyTable> = lock
        .iter()
        .map(|&i| &ts[i].table as &dyn AnyTable)
        .collect();
    let mut w = db.write_txn(&tabs).unwrap();
    trace!("txn {lock:?}");
    let mut work = ms.clone();
    for _ in 0..u.int_in_range(0..=WRITES)? {
        let ti = u.int_in_range(0..=1)?;
        if !lock.contains(&ti) {
            let res = ts[ti].table.insert(&mut w, obj(u)?);
            assert!(matches!(res, Err(Error::TableNotLocked(_))), "{res:?}");
            continue;
        }
        write(u, ts, side, &mut w, &mut work[ti], ti)?;
    }
    for (t, m) in ts.iter().zip(&work) {
        check(t, &w, m);
    }
    let end = u.int_in_range(0..=4)?;
    trace!("end {end} (0 abort, 1 drop, else commit)");
    match end {
        0 => {
            w.abort().unwrap();
            assert!(matches!(w.commit(), Err(Error::TxnDone)));
            drop(w);
            watches.none_fired();
        }
        1 => {
            drop(w);
            watches.none_fired();
        }
        _ => {
            let r = w.commit().unwrap();
            assert!(matches!(w.commit(), Err(Error::TxnDone)));
            let late = ts[lock[0]].table.insert(&mut w, obj(u)?);
            assert!(matches!(late, Err(Error::TxnDone)), "{late:?}");
            drop(w);
            watches.judge(ms, &work);
            *ms = work;
            for m in ms.iter_mut() {
                m.touched.clear();
            }
            for (t, m) in ts.iter().zip(ms.iter()) {
                check(t, &r, m);
                dumped(t, reader.read_txn(), m);
            }
        }
    }
    Ok(())
}

fn run(u: &mut Unstructured) -> Result<()> {
    let db = Db::with_options(DbOptions::default().with_gc_interval(None));
    let ts = [
        table(&db, "a", KeyLayout::Bytes, true),
        table(&db, "b", KeyLayout::Nibbles, false),
    ];
    let mut ms: [M; 2] = Default::default();
    let mut side = Side::default();
    let mut snapshots: Vec<(ReadTxn, [M; 2])> = Vec::new();
    // Reads after each commit come through a per-thread reader, which
    // reuses its snapshot until the database's version moves.
    let mut reader = db.reader();
    for _ in 0..STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=9)? {
            0..=4 => txn(u, &db, &ts, &mut ms, &mut side, &mut reader)?,
            5 | 6 if !side.consumers.is_empty() => {
                let i = u.choose_index(side.consumers.len())?;
                let n = if u.arbitrary()? {
                    None
                } else {
                    Some(u.int_in_range(0..=4)?)
                };
                side.consumers[i].advance(&db, &ts, &ms, n);
            }
            7 if !side.consumers.is_empty() => {
                let i = u.choose_index(side.consumers.len())?;
                side.consumers.swap_remove(i);
            }
            8 => {
                if snapshots.len() < 4 && u.arbitrary()? {
                    snapshots.push((db.read_txn(), ms.clone()));
                } else if !snapshots.is_empty() {
                    let (r, then) = snapshots.swap_remove(u.choose_index(snapshots.len())?);
                    for (t, m) in ts.iter().zip(&then) {
                        check(t, &r, m);
                    }
                }
            }
            _ => collected(&db, &ts, &ms, &side),
        }
    }
    for (r, then) in &snapshots {
        for (t, m) in ts.iter().zip(then) {
            check(t, r, m);
        }
    }
    for c in &mut side.consumers {
        c.advance(&db, &ts, &ms, None);
    }
    collected(&db, &ts, &ms, &side);
    side.consumers.clear();
    collected(&db, &ts, &ms, &side);
    Ok(())
}

/// The table's JSON dump in `txn` (taken from a reader) lists the model's
/// objects with their revisions, in primary-key order.
fn dumped(t: &T, txn: &ReadTxn, m: &M) {
    let v: serde_json::Value = serde_json::from_str(&t.table.to_json(txn).unwrap()).unwrap();
    assert_eq!(v["revision"], m.rev);
    let rows = v["objects"].as_array().unwrap();
    assert_eq!(rows.len(), m.objs.len());
    for (row, (o, r, _)) in rows.iter().zip(m.objs.values()) {
        assert_eq!(row["revision"], *r);
        assert_eq!(row["object"]["id"], o.id);
        assert_eq!(row["object"]["name"].as_str(), Some(o.name.as_str()));
    }
}

/// Collects, then checks that no table whose consumers have all read to
/// its end keeps a graveyard.
fn collected(db: &Db, ts: &[T; 2], ms: &[M; 2], side: &Side) {
    db.collect_garbage();
    let r = db.read_txn();
    for (ti, t) in ts.iter().enumerate() {
        let behind = (side.consumers.iter()).any(|c| c.t == ti && c.ch.position() < ms[ti].rev);
        if !behind {
            assert_eq!(
                t.table.graveyard_len(&r).unwrap(),
                0,
                "table {ti}'s graveyard"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

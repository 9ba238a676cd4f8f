//! `part` against a `BTreeMap` model under coverage-guided fuzzing.
//!
//! The input is decoded into a run of transaction operations (single
//! writes, spans of writes that grow nodes to 48 and 256 children and back,
//! commits, aborts, clears, snapshots kept and dropped, owning scans,
//! watches) on trees with and without root-only watches. After each step
//! the open transaction reads as the model; each commit passes the
//! structural checker and every read and scan kind, both directions; kept
//! snapshots still read as they did when taken. Values are counted
//! (`Arc`): under AddressSanitizer a reference the tree loses or frees
//! twice shows as a leak or a use after free, which the model alone would
//! not see.
#![no_main]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use part::{check::check, Scan, Tree, Txn, Watch};

type V = Arc<u32>;
type Model = BTreeMap<Vec<u8>, u32>;
type Pairs = Vec<(Vec<u8>, u32)>;
type Range = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// Operations per input, at most.
const STEPS: usize = 400;
/// Snapshots kept at once, at most.
const SNAPSHOTS: usize = 8;

/// Keys that share prefixes, are prefixes of one another, hold 0x00 and
/// 0xff, fill wide nodes, or run past the 14 bytes a node keeps inline.
fn key(u: &mut Unstructured) -> Result<Vec<u8>> {
    Ok(match u.int_in_range(0u8..=5)? {
        0 | 1 => {
            let n = u.int_in_range(0..=5)?;
            let mut k = Vec::with_capacity(n);
            for _ in 0..n {
                k.push(*u.choose(&[0u8, 1, b'a', b'b', 0xff])?);
            }
            k
        }
        2 => {
            let n = u.int_in_range(1..=3)?;
            let mut k = Vec::with_capacity(n);
            for _ in 0..n {
                k.push(u.arbitrary::<u8>()?);
            }
            k
        }
        3 => {
            let first = u.arbitrary::<u8>()?;
            let n = u.int_in_range(0..=40)?;
            std::iter::once(first)
                .chain(std::iter::repeat_n(7, n))
                .collect()
        }
        4 => {
            // Prefixes of two fixed paths of distinct bytes, with a short
            // tail: long segments split and joined at every offset.
            let p = u.int_in_range(0u8..=1)?;
            let n = u.int_in_range(0u8..=35)?;
            let mut k: Vec<u8> = (0..n).map(|i| 40 + 90 * p + i).collect();
            for _ in 0..u.int_in_range(0..=2)? {
                k.push(u.int_in_range(0..=2)?);
            }
            k
        }
        _ => vec![u.int_in_range(0..=2)?, u.arbitrary()?],
    })
}

fn collect<'a>(it: impl Iterator<Item = (&'a [u8], &'a V)>) -> Pairs {
    it.map(|(k, v)| (k.to_vec(), **v)).collect()
}

fn rev(mut v: Pairs) -> Pairs {
    v.reverse();
    v
}

fn in_range(k: &[u8], lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> bool {
    let above = match lo {
        Bound::Included(l) => k >= l.as_slice(),
        Bound::Excluded(l) => k > l.as_slice(),
        Bound::Unbounded => true,
    };
    let below = match hi {
        Bound::Included(h) => k <= h.as_slice(),
        Bound::Excluded(h) => k < h.as_slice(),
        Bound::Unbounded => true,
    };
    above && below
}

/// The pairs of `all` between `lo` and `hi`.
fn within(all: &Pairs, lo: &Bound<Vec<u8>>, hi: &Bound<Vec<u8>>) -> Pairs {
    all.iter()
        .filter(|(k, _)| in_range(k, lo, hi))
        .cloned()
        .collect()
}

fn bounds(a: &[u8], b: &[u8]) -> [Range; 6] {
    [
        (Bound::Included(a.to_vec()), Bound::Excluded(b.to_vec())),
        (Bound::Included(a.to_vec()), Bound::Included(b.to_vec())),
        (Bound::Excluded(a.to_vec()), Bound::Included(b.to_vec())),
        (Bound::Excluded(a.to_vec()), Bound::Excluded(b.to_vec())),
        (Bound::Unbounded, Bound::Excluded(b.to_vec())),
        (Bound::Excluded(a.to_vec()), Bound::Unbounded),
    ]
}

/// Every read and scan kind of a committed tree, both directions,
/// borrowing and owning.
fn check_tree(t: &Tree<V>, m: &Model, a: &[u8], b: &[u8]) {
    if let Err(e) = check(t) {
        panic!("structure: {e}");
    }
    assert_eq!(t.len(), m.len());
    assert_eq!(t.is_empty(), m.is_empty());
    for (k, v) in m {
        assert_eq!(t.get(k).map(|v| **v), Some(*v), "get {k:?}");
    }
    assert_eq!(t.get(a).map(|v| **v), m.get(a).copied());
    let all: Pairs = m.iter().map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(collect(t.iter()), all);
    assert_eq!(collect(t.iter_rev()), rev(all.clone()));
    assert_eq!(
        t.first().map(|(k, v)| (k.to_vec(), **v)),
        all.first().cloned()
    );
    assert_eq!(
        t.last().map(|(k, v)| (k.to_vec(), **v)),
        all.last().cloned()
    );
    let pre: Pairs = all
        .iter()
        .filter(|(k, _)| k.starts_with(a))
        .cloned()
        .collect();
    assert_eq!(collect(t.prefix(a)), pre);
    assert_eq!(collect(t.prefix_rev(a)), rev(pre));
    let lb: Pairs = all
        .iter()
        .filter(|(k, _)| k.as_slice() >= a)
        .cloned()
        .collect();
    assert_eq!(collect(t.lower_bound(a)), lb);
    assert_eq!(collect(t.lower_bound_rev(a)), rev(lb));
    for (lo, hi) in bounds(a, b) {
        let want = within(&all, &lo, &hi);
        let scan = Scan::Range(lo, hi);
        assert_eq!(collect(t.scan(&scan, false)), want, "{scan:?}");
        assert_eq!(
            collect(t.scan(&scan, true)),
            rev(want.clone()),
            "rev {scan:?}"
        );
        let owned: Pairs = t
            .scan_owned(&scan, false)
            .map(|e| (e.key().to_vec(), **e.value()))
            .collect();
        assert_eq!(owned, want, "owned {scan:?}");
    }
}

/// The open transaction's reads.
fn check_txn(txn: &Txn<V>, m: &Model, a: &[u8], b: &[u8]) {
    assert_eq!(txn.len(), m.len());
    assert_eq!(txn.get(a).map(|v| **v), m.get(a).copied());
    let all: Pairs = m.iter().map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(collect(txn.iter()), all);
    let pre: Pairs = all
        .iter()
        .filter(|(k, _)| k.starts_with(a))
        .cloned()
        .collect();
    assert_eq!(collect(txn.prefix(a)), pre);
    for (lo, hi) in bounds(a, b) {
        let want = within(&all, &lo, &hi);
        let scan = Scan::Range(lo, hi);
        assert_eq!(
            collect(txn.scan(&scan, true)),
            rev(want),
            "txn rev {scan:?}"
        );
    }
}

/// A watch taken on the committed tree: on a key or on a prefix, and
/// whether the open transaction has changed what it covers.
struct Probe {
    key: Vec<u8>,
    prefix: bool,
    watch: Watch,
    changed: bool,
    /// With per-node watches: the watch must stay quiet unless `near`.
    exact: bool,
    /// The open transaction wrote a key under the watch (or the watched
    /// key).
    near: bool,
}

impl Probe {
    fn covers(&self, k: &[u8]) -> bool {
        if self.prefix {
            k.starts_with(&self.key)
        } else {
            k == self.key.as_slice()
        }
    }
}

/// Marks the probes that cover `k` (a write that changed the model).
fn touched(probes: &mut [Probe], k: &[u8]) {
    for p in probes.iter_mut().filter(|p| p.covers(k)) {
        p.changed = true;
    }
}

/// Whether a write of `k` may fire `p`.
fn reaches(p: &Probe, k: &[u8]) -> bool {
    !p.exact || p.covers(k)
}

/// Records a write of `k` in the open transaction.
fn wrote(probes: &mut [Probe], written: &mut Vec<(Vec<u8>, bool)>, k: &[u8], delete: bool) {
    for p in probes.iter_mut() {
        p.near |= reaches(p, k);
    }
    written.push((k.to_vec(), delete));
}

/// `PART_FUZZ_TRACE=1`: prints each step (for reading a failing input).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("PART_FUZZ_TRACE").is_some())
}

macro_rules! trace {
    ($($a:tt)*) => {
        if tracing() {
            eprintln!($($a)*);
        }
    };
}

fn committed_keys(m: &Model) -> Vec<&Vec<u8>> {
    m.keys().collect()
}

fn run(u: &mut Unstructured) -> Result<()> {
    let opts = part::Options {
        root_only_watch: u.arbitrary()?,
    };
    let mut tree: Tree<V> = Tree::with_options(opts);
    let mut committed = Model::new();
    let mut txn = tree.txn();
    let mut model = Model::new();
    let mut snapshots: Vec<(Tree<V>, Model)> = Vec::new();
    let mut owned = Vec::new();
    let mut probes: Vec<Probe> = Vec::new();
    // The open transaction's writes (a delete: one that removed its key).
    let mut written: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut cleared = false;

    for step in 0..STEPS {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0u8..=15)? {
            0..=3 => {
                let (k, v) = (key(u)?, u.arbitrary::<u32>()?);
                trace!("insert {k:?}");
                let old = txn.insert(&k, Arc::new(v)).expect("short key");
                assert_eq!(old.map(|o| *o), model.insert(k.clone(), v));
                touched(&mut probes, &k);
                wrote(&mut probes, &mut written, &k, false);
            }
            4 => {
                let (k, v) = (key(u)?, u.arbitrary::<u32>()?);
                let want = model.get(&k).map_or(v, |x| x ^ v);
                trace!("modify {k:?}");
                let old = txn
                    .modify(&k, |o| Arc::new(o.map_or(v, |x| **x ^ v)))
                    .expect("short key");
                assert_eq!(old.map(|o| *o), model.insert(k.clone(), want));
                touched(&mut probes, &k);
                wrote(&mut probes, &mut written, &k, false);
            }
            5 | 6 => {
                let k = key(u)?;
                let gone = model.remove(&k);
                trace!("delete {k:?}");
                assert_eq!(txn.delete(&k).map(|o| *o), gone);
                if gone.is_some() {
                    touched(&mut probes, &k);
                    wrote(&mut probes, &mut written, &k, true);
                }
            }
            7 => {
                // A span of one-byte children under a prefix: node48s,
                // node256s and their deltas, written or emptied.
                let mut k = key(u)?;
                k.truncate(3);
                let (lo, n) = (u.arbitrary::<u8>()?, u.int_in_range(1u16..=256)?);
                let delete = u.ratio(1u8, 3)?;
                let v = u.arbitrary::<u32>()?;
                trace!("span {k:?} from {lo} x{n} delete={delete}");
                k.push(0);
                for i in 0..n {
                    *k.last_mut().expect("pushed") = lo.wrapping_add(i as u8);
                    if delete {
                        let gone = model.remove(&k);
                        assert_eq!(txn.delete(&k).map(|o| *o), gone);
                        if gone.is_some() {
                            touched(&mut probes, &k);
                            wrote(&mut probes, &mut written, &k, true);
                        }
                    } else {
                        let old = txn
                            .insert(&k, Arc::new(v ^ u32::from(i)))
                            .expect("short key");
                        assert_eq!(old.map(|o| *o), model.insert(k.clone(), v ^ u32::from(i)));
                        touched(&mut probes, &k);
                        wrote(&mut probes, &mut written, &k, false);
                    }
                }
            }
            8 | 9 => {
                if let Err(e) = txn.check_invariants() {
                    panic!("transaction structure: {e}");
                }
                for p in &probes {
                    assert!(
                        !p.watch.is_closed(),
                        "watch on {:?} fired before commit",
                        p.key
                    );
                }
                tree = txn.commit();
                trace!("commit: {:?}", committed_keys(&model));
                for p in &probes {
                    // A missing key's watch fires if the key is there now
                    // (not for an insert deleted again).
                    // So does an empty prefix's once a key is under it.
                    let under = |m: &Model| m.keys().any(|k| k.starts_with(&p.key));
                    let must = if p.prefix && !under(&committed) {
                        under(&model)
                    } else if p.prefix || committed.contains_key(&p.key) {
                        p.changed
                    } else {
                        model.contains_key(&p.key)
                    };
                    if must {
                        assert!(p.watch.is_closed(), "watch on {:?} not fired", p.key);
                    }
                    if !p.near {
                        assert!(
                            !p.watch.is_closed(),
                            "watch on {:?} (prefix: {}) fired for writes that cannot reach it: {:?}",
                            p.key,
                            p.prefix,
                            written
                        );
                    }
                }
                probes.clear();
                written.clear();
                cleared = false;
                committed = model.clone();
                let (a, b) = (key(u)?, key(u)?);
                check_tree(&tree, &committed, &a, &b);
                txn = tree.txn();
            }
            10 => {
                trace!("abort");
                drop(txn);
                txn = tree.txn();
                model = committed.clone();
                written.clear();
                cleared = false;
                for p in probes.iter_mut() {
                    p.changed = false;
                    p.near = !p.exact;
                }
            }
            11 => {
                if snapshots.len() < SNAPSHOTS && u.ratio(2u8, 3)? {
                    snapshots.push((tree.clone(), committed.clone()));
                } else if !snapshots.is_empty() {
                    let i = u.choose_index(snapshots.len())?;
                    let (snap, m) = snapshots.swap_remove(i);
                    let (a, b) = (key(u)?, key(u)?);
                    check_tree(&snap, &m, &a, &b);
                }
            }
            12 => {
                if u.ratio(1u8, 8)? {
                    trace!("clear");
                    txn.clear();
                    model.clear();
                    cleared = true;
                    for p in probes.iter_mut() {
                        p.changed |= committed.keys().any(|k| p.covers(k));
                        p.near = true;
                    }
                } else if owned.len() < 4 {
                    owned.push((txn.scan_owned(&Scan::All, false), model.clone()));
                }
            }
            13 => {
                let k = key(u)?;
                let prefix = u.arbitrary()?;
                let watch = if prefix {
                    tree.prefix_watch(&k).1
                } else {
                    tree.get_watch(&k).1
                };
                // What the open transaction already changed under it.
                let changed = committed.iter().chain(model.iter()).any(|(x, _)| {
                    (if prefix { x.starts_with(&k) } else { *x == k })
                        && committed.get(x) != model.get(x)
                });
                let exact = !opts.root_only_watch;
                trace!("watch {k:?} prefix={prefix} exact={exact}");
                let mut probe = Probe {
                    key: k,
                    prefix,
                    watch,
                    changed,
                    exact,
                    near: !exact || cleared,
                };
                probe.near |= written.iter().any(|(x, _)| reaches(&probe, x));
                probes.push(probe);
            }
            _ => {
                let (a, b) = (key(u)?, key(u)?);
                check_txn(&txn, &model, &a, &b);
            }
        }
        if step % 16 == 15 {
            if let Err(e) = txn.check_invariants() {
                panic!("transaction structure: {e}");
            }
        }
    }
    let tree = txn.commit();
    check_tree(&tree, &model, b"a", b"b");
    for (snap, m) in &snapshots {
        check_tree(snap, m, b"\x01", b"\xff");
    }
    for (it, m) in owned {
        let got: Pairs = it.map(|e| (e.key().to_vec(), **e.value())).collect();
        assert_eq!(got, m.into_iter().collect::<Pairs>());
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});

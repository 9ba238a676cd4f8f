//! Node kinds, hysteresis, watches both ways, limits, snapshots across
//! threads, and a concurrent watch stress test.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use part::check::{check, kinds};
use part::{Error, Options, Tree, WatchSet, MAX_KEY_LEN};

fn tree_of(keys: &[&[u8]]) -> Tree<u32> {
    let mut t = Tree::new().txn();
    for (i, k) in keys.iter().enumerate() {
        t.insert(k, i as u32).unwrap();
    }
    t.commit()
}

/// Lookups skip inner segments and compare only the final leaf or terminal:
/// keys that leave the tree's paths inside a segment must still miss,
/// wherever the skipped path leads.
#[test]
fn lookups_that_leave_a_path_inside_a_segment_miss() {
    let t = tree_of(&[
        b"abcdef1",
        b"abcdef2",
        b"abcdef",
        b"abcxyz",
        b"zz",
        b"abcdef1tail",
    ]);
    for k in [
        &b"abXdef1"[..], // differs inside the shared segment, then a real child byte
        b"abcdeX1",
        b"abcdeX", // same length as a terminal's key
        b"abXdef",
        b"abcde",      // ends inside a segment
        b"abcdef1tai", // ends inside a leaf's suffix
        b"abcdef1taiX",
        b"zX",
        b"",
    ] {
        assert_eq!(t.get(k), None, "{:?}", String::from_utf8_lossy(k));
        assert_eq!(t.get_watch(k).0, None, "{:?}", String::from_utf8_lossy(k));
    }
    for (i, k) in [
        &b"abcdef1"[..],
        b"abcdef2",
        b"abcdef",
        b"abcxyz",
        b"zz",
        b"abcdef1tail",
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(t.get(k), Some(&(i as u32)));
    }
}

#[test]
fn grows_through_every_kind_and_back() {
    let mut t: Tree<u32> = Tree::new();
    for b in 0..=255u8 {
        t = t.insert(&[b, 1], b as u32).unwrap().0;
        check(&t).unwrap();
    }
    assert_eq!(kinds(&t)[4], 1, "root is a node256");
    for b in (0..=255u8).rev() {
        t = t.delete(&[b, 1]).0;
        check(&t).unwrap();
        let k = kinds(&t);
        let n = b as usize;
        match n {
            38.. => assert_eq!(k[4], 1, "node256 at {n}"),
            13..=37 => assert_eq!(k[3], 1, "node48 at {n}"),
            4..=12 => assert_eq!(k[2], 1, "node16 at {n}"),
            _ => assert_eq!(k[1], 1, "node4 at {n}"),
        }
    }
    assert!(t.is_empty());
}

#[test]
fn insert_delete_at_a_boundary_does_not_flap() {
    // 17 children: a node48. Delete one (16 left) and re-insert: still a node48.
    let keys: Vec<[u8; 1]> = (0..17u8).map(|b| [b]).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let mut t = tree_of(&refs);
    assert_eq!(kinds(&t)[3], 1);
    for _ in 0..10 {
        t = t.delete(&[16]).0;
        assert_eq!(kinds(&t)[3], 1, "no shrink on one delete");
        t = t.insert(&[16], 0).unwrap().0;
        assert_eq!(kinds(&t)[3], 1);
    }
}

#[test]
fn empty_key_and_prefix_keys() {
    let t = tree_of(&[b"", b"a", b"ab", b"abc", b"b"]);
    check(&t).unwrap();
    assert_eq!(t.get(b""), Some(&0));
    assert_eq!(t.get(b"ab"), Some(&2));
    let keys: Vec<_> = t.iter().map(|(k, _)| k.to_vec()).collect();
    assert_eq!(
        keys,
        vec![
            b"".to_vec(),
            b"a".to_vec(),
            b"ab".to_vec(),
            b"abc".to_vec(),
            b"b".to_vec()
        ]
    );
    let t = t.delete(b"ab").0;
    check(&t).unwrap();
    assert_eq!(t.get(b"abc"), Some(&3));
    let t = t.delete(b"").0;
    assert_eq!(t.get(b""), None);
    assert_eq!(t.len(), 3);
}

/// Keys and path segments of 13 to 17 bytes, either side of the 14 a node
/// holds inline: splits cut a heap segment into an inline one and merges
/// join two inline ones into a heap one, in both directions, with every
/// read checked against a map and the invariants after each step.
#[test]
fn segments_either_side_of_the_inline_limit() {
    use std::collections::BTreeMap;
    for opts in [
        Options::default(),
        Options {
            root_only_watch: true,
        },
    ] {
        let mut model = BTreeMap::new();
        let mut tree = Tree::with_options(opts);
        let mut keys = Vec::new();
        // Distinct bytes along the shared path, so that a segment joined
        // or cut in the wrong place reads as another key.
        let path = |n: usize| (1..=n as u8).collect::<Vec<u8>>();
        for common in 12..=17usize {
            for tail in [0u8, 1, 2] {
                let mut k = path(common);
                k.push(100 + tail);
                k.extend((0..(common + tail as usize) % 5).map(|i| 200 + i as u8));
                keys.push(k);
            }
            keys.push(path(common));
        }
        // In, then out again in another order (merges as nodes empty).
        for (i, k) in keys.iter().enumerate() {
            tree = tree.insert(k, i as u32).unwrap().0;
            model.insert(k.clone(), i as u32);
            check(&tree).unwrap();
        }
        for k in keys.iter().rev().step_by(2).chain(keys.iter().step_by(2)) {
            for (mk, v) in &model {
                assert_eq!(tree.get(mk), Some(v), "{mk:?}");
            }
            let want = model.remove(k);
            let (next, got) = tree.delete(k);
            assert_eq!(got, want, "{k:?}");
            tree = next;
            check(&tree).unwrap();
            let all: Vec<(Vec<u8>, u32)> = tree.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
            let expect: Vec<(Vec<u8>, u32)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
            assert_eq!(all, expect);
        }
        assert!(tree.is_empty());
    }
}

#[test]
fn long_keys_work_and_too_long_is_an_error() {
    let long = vec![7u8; 64 * 1024];
    let mut other = long.clone();
    other.push(1);
    let t = tree_of(&[&long, &other]);
    check(&t).unwrap();
    assert_eq!(t.get(&long), Some(&0));
    assert_eq!(t.get(&other), Some(&1));
    let too_long = vec![0u8; MAX_KEY_LEN + 1];
    let err = Tree::<u32>::new().insert(&too_long, 1).err();
    assert_eq!(
        err,
        Some(Error::KeyTooLong {
            len: MAX_KEY_LEN + 1,
            max: MAX_KEY_LEN
        })
    );
}

#[test]
fn deep_chain_of_prefix_keys_does_not_overflow_the_stack() {
    // Every key a prefix of the next: the tree is as deep as the keys are
    // long. Build, iterate, delete and drop it on a thread with a small
    // stack, where any walk or drop that recursed per level would overflow.
    let worker = std::thread::Builder::new()
        .stack_size(128 * 1024)
        .spawn(|| {
            let n = 6_000usize;
            let mut txn = Tree::new().txn();
            let mut key = Vec::new();
            for i in 0..n {
                key.push(b'x');
                txn.insert(&key, i as u32).unwrap();
            }
            let t = txn.commit();
            assert_eq!(t.len(), n);
            assert_eq!(t.iter().count(), n);
            assert_eq!(t.iter_rev().next().map(|(k, _)| k.len()), Some(n));
            let mut txn = t.txn();
            for i in (0..n).step_by(2) {
                txn.delete(&key[..i + 1]);
            }
            drop(t);
            let t = txn.commit();
            assert_eq!(t.len(), n / 2);
            drop(t);
        })
        .unwrap();
    worker.join().unwrap();
}

#[test]
fn dropping_a_txn_changes_nothing() {
    let t = tree_of(&[b"a", b"b"]);
    let (_, w) = t.get_watch(b"a");
    let mut txn = t.txn();
    txn.insert(b"a", 9).unwrap();
    txn.delete(b"b");
    drop(txn);
    assert_eq!(t.get(b"a"), Some(&0));
    assert_eq!(t.len(), 2);
    assert!(!w.is_closed());
}

/// Two subtrees, `alpha/` and `beta/`, and watches on: the key `alpha/1`,
/// the missing key `alpha/3`, the prefixes `alpha/` and `beta/`.
fn alpha_beta_watches() -> (Tree<u32>, [part::Watch; 4]) {
    let t = tree_of(&[b"alpha/1", b"alpha/2", b"beta/1", b"beta/2"]);
    let ws = [
        t.get_watch(b"alpha/1").1,
        t.get_watch(b"alpha/3").1,
        t.prefix_watch(b"alpha/").1,
        t.prefix_watch(b"beta/").1,
    ];
    (t, ws)
}

#[test]
fn watches_on_unrelated_subtrees_do_not_fire() {
    let (t, [key_w, missing_w, prefix_w, beta_w]) = alpha_beta_watches();
    let mut txn = t.txn();
    txn.insert(b"beta/3", 1).unwrap();
    txn.delete(b"beta/1");
    let t2 = txn.commit();
    assert!(beta_w.is_closed());
    assert!(!key_w.is_closed());
    assert!(!missing_w.is_closed());
    assert!(!prefix_w.is_closed());
    // A sibling under the same prefix changes: the prefix watch and the
    // missing-key watch fire, the untouched key's watch does not.
    let t3 = t2.insert(b"alpha/3", 5).unwrap().0;
    assert!(prefix_w.is_closed());
    assert!(missing_w.is_closed());
    assert!(!key_w.is_closed());
    t3.insert(b"alpha/1", 9).unwrap();
    assert!(key_w.is_closed());
}

/// `node-50` .. `node-59` hang under one node as single leaves: a prefix
/// that reaches one of them (`node-57`), or a missing key whose path ends at
/// one (`node-571`), watches that leaf alone. Its siblings' writes leave
/// those watches quiet; an insert under the prefix pushes the leaf down and
/// fires them, but not the leaf's point watch, which fires at the key's
/// next write, also for a reader of the snapshot before the push.
#[test]
fn a_narrow_prefix_watches_its_leaf_not_the_siblings() {
    let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("node-5{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    let t = tree_of(&refs);
    let (it, prefix_w) = t.prefix_watch(b"node-57");
    assert_eq!(it.count(), 1);
    let (v, point_w) = t.get_watch(b"node-57");
    assert!(v.is_some());
    let (v, missing_w) = t.get_watch(b"node-571");
    assert!(v.is_none());
    let mut txn = t.txn();
    txn.insert(b"node-53", 1).unwrap();
    txn.delete(b"node-58");
    txn.insert(b"node-5a", 2).unwrap();
    let t2 = txn.commit();
    assert!(!prefix_w.is_closed() && !point_w.is_closed() && !missing_w.is_closed());
    let t3 = t2.insert(b"node-571", 3).unwrap().0;
    assert!(prefix_w.is_closed() && missing_w.is_closed());
    assert!(!point_w.is_closed(), "node-57 kept its value");
    // A reader of a snapshot from before the push: its prefix watch is
    // closed at once (that snapshot's result is stale), its point watch
    // live until the key's next write.
    assert!(t2.prefix_watch(b"node-57").1.is_closed());
    let old_point = t2.get_watch(b"node-57").1;
    assert!(!old_point.is_closed());
    let (it, new_prefix) = t3.prefix_watch(b"node-57");
    assert_eq!(it.count(), 2);
    let t4 = t3.insert(b"node-59", 4).unwrap().0;
    assert!(!new_prefix.is_closed() && !point_w.is_closed() && !old_point.is_closed());
    t4.insert(b"node-57", 5).unwrap();
    assert!(point_w.is_closed() && old_point.is_closed() && new_prefix.is_closed());
    check(&t4).unwrap();
}

/// An insert that leaves a watched node's path inside its segment splits
/// the segment above the node: the node keeps its keys, so a prefix that
/// ends where the node does stays quiet, as does one ending inside the
/// segment below the split; one ending at or above it has the new key
/// under it and fires. The next write under the node fires the quiet ones.
#[test]
fn a_segment_split_above_a_node_reaches_only_the_shorter_prefixes() {
    let t = tree_of(&[b"user/alice/1", b"user/alice/2", b"zzz"]);
    let end = t.prefix_watch(b"user/alice/").1;
    let below = t.prefix_watch(b"user/alice").1;
    let above = t.prefix_watch(b"user/").1;
    let t2 = t.insert(b"user/bob/1", 1).unwrap().0;
    assert!(above.is_closed(), "user/bob/1 is under user/");
    assert!(!end.is_closed() && !below.is_closed());
    // A reader of the old snapshot still gets a live watch on the node.
    let late = t.prefix_watch(b"user/alice/").1;
    assert!(!late.is_closed());
    let t3 = t2.insert(b"zzz", 9).unwrap().0;
    assert!(!end.is_closed() && !below.is_closed() && !late.is_closed());
    t3.insert(b"user/alice/3", 3).unwrap();
    assert!(end.is_closed() && below.is_closed() && late.is_closed());
}

/// A delete that leaves a node's parent with the node alone merges the
/// parent into it: the node's keys stay, so its prefixes stay quiet; the
/// parent's prefix, which held the deleted key, fires.
#[test]
fn a_merge_into_a_node_keeps_its_prefixes_quiet() {
    let t = tree_of(&[b"k/a/x/1", b"k/a/x/2", b"k/a/y", b"z"]);
    let end = t.prefix_watch(b"k/a/x/").1;
    let inside = t.prefix_watch(b"k/a/x").1;
    let parent = t.prefix_watch(b"k/a/").1;
    let t2 = t.delete(b"k/a/y").0;
    assert!(parent.is_closed());
    assert!(!end.is_closed() && !inside.is_closed());
    let (it, merged) = t2.prefix_watch(b"k/a/x/");
    assert_eq!(it.count(), 2);
    t2.insert(b"k/a/x/3", 3).unwrap();
    assert!(end.is_closed() && inside.is_closed() && merged.is_closed());
}

/// Prefixes every key is under end in the root's segment. An insert that
/// leaves that segment splits the root: the root's own watch fires (it
/// watches the whole tree), and so do the prefixes the new key is under,
/// but not the longer ones. Also when the root had a single entry and
/// merges into it as it moves down.
#[test]
fn a_root_split_reaches_only_the_prefixes_the_new_key_is_under() {
    let t = tree_of(&[b"node-1", b"node-2"]);
    let (end, inside, short) = (
        t.prefix_watch(b"node-").1,
        t.prefix_watch(b"nod").1,
        t.prefix_watch(b"no").1,
    );
    let root = t.root_watch();
    let t2 = t.insert(b"noX", 1).unwrap().0;
    assert!(root.is_closed() && short.is_closed());
    assert!(!end.is_closed() && !inside.is_closed());
    let t3 = t2.insert(b"other", 2).unwrap().0;
    assert!(!end.is_closed() && !inside.is_closed());
    t3.insert(b"node-3", 3).unwrap();
    assert!(end.is_closed() && inside.is_closed());

    // A root left with one entry by a delete.
    let t = tree_of(&[b"a/x/1", b"a/x/2", b"a/y"]).delete(b"a/y").0;
    let (top, node) = (t.prefix_watch(b"a/").1, t.prefix_watch(b"a/x/").1);
    let t2 = t.insert(b"b", 1).unwrap().0;
    assert!(!top.is_closed() && !node.is_closed());
    assert_eq!(t2.prefix(b"a/").count(), 2);
    t2.delete(b"a/x/1");
    assert!(top.is_closed() && node.is_closed());
}

/// A lone leaf's prefix watches are kept by length: an insert sharing two
/// bytes with its key pushes it down and fires the prefixes of two bytes
/// or fewer, not the longer ones nor the key's point watch.
#[test]
fn a_push_down_reaches_only_the_leaf_prefixes_the_new_key_is_under() {
    let t = tree_of(&[b"abc123", b"zz"]);
    let long = t.prefix_watch(b"abc1").1;
    let short = t.prefix_watch(b"ab").1;
    let point = t.get_watch(b"abc123").1;
    let t2 = t.insert(b"abd", 1).unwrap().0;
    assert!(short.is_closed());
    assert!(!long.is_closed() && !point.is_closed());
    let t3 = t2.insert(b"abe", 2).unwrap().0;
    assert!(!long.is_closed() && !point.is_closed());
    t3.insert(b"abc123", 7).unwrap();
    assert!(long.is_closed() && point.is_closed());
}

/// Found by `part_model`: a point watch taken on the committed tree while
/// an open transaction has already pushed the key's leaf down (`[0]` under
/// `[0, 0]`) must not fire at that commit, and must fire at the key's next
/// write, also when that write is in the same transaction.
#[test]
fn a_point_watch_taken_during_a_push_down_carries_on() {
    let t = tree_of(&[b"", b"\x00"]);
    let mut txn = t.txn();
    txn.insert(b"\x00\x00", 1).unwrap();
    let w = t.get_watch(b"\x00").1;
    let t2 = txn.commit();
    assert!(!w.is_closed(), "the key kept its value");
    t2.insert(b"\x00", 2).unwrap();
    assert!(w.is_closed());

    let mut txn = t.txn();
    txn.insert(b"\x00\x00", 1).unwrap();
    let w = t.get_watch(b"\x00").1;
    txn.insert(b"\x00", 3).unwrap();
    let t3 = txn.commit();
    assert!(
        w.is_closed(),
        "the key changed in the transaction that pushed it"
    );
    check(&t3).unwrap();
}

#[test]
fn watch_on_a_superseded_snapshot_is_already_closed() {
    let t = tree_of(&[b"k"]);
    let t2 = t.insert(b"k", 1).unwrap().0;
    // Nobody watched `k` in `t` before the commit; asking now returns a closed
    // watch: the value has changed since that snapshot.
    assert!(t.get_watch(b"k").1.is_closed());
    assert!(!t2.get_watch(b"k").1.is_closed());
}

/// The watched snapshot is dropped after the writes and before the commit:
/// the superseded nodes are then the notifier's alone, which fires their
/// watches without the slot's compare-and-swap. Those watches still fire,
/// and the untouched ones do not.
#[test]
fn watches_fire_when_the_notifier_holds_the_last_reference() {
    let (t, [key_w, missing_w, prefix_w, beta_w]) = alpha_beta_watches();
    let mut txn = t.txn();
    txn.insert(b"alpha/1", 7).unwrap();
    txn.insert(b"alpha/3", 8).unwrap();
    drop(t);
    let (t2, notifier) = txn.commit_only();
    assert!(!key_w.is_closed(), "not before the notifier runs");
    notifier.notify();
    assert!(key_w.is_closed());
    assert!(missing_w.is_closed());
    assert!(prefix_w.is_closed());
    assert!(!beta_w.is_closed());
    // A watch asked for on the new version is live.
    assert!(!t2.get_watch(b"alpha/1").1.is_closed());
    check(&t2).unwrap();
}

#[test]
fn commit_only_defers_notification() {
    let t = tree_of(&[b"k"]);
    let (_, w) = t.get_watch(b"k");
    let mut txn = t.txn();
    txn.insert(b"k", 2).unwrap();
    let (t2, notifier) = txn.commit_only();
    assert!(!w.is_closed(), "not before the notifier runs");
    assert_eq!(t2.get(b"k"), Some(&2));
    notifier.notify();
    assert!(w.is_closed());
}

#[test]
fn root_only_watch_fires_on_any_change() {
    let t: Tree<u32> = Tree::with_options(Options {
        root_only_watch: true,
    });
    let t = t.insert(b"a", 1).unwrap().0.insert(b"b", 2).unwrap().0;
    let (_, w) = t.get_watch(b"a");
    let t2 = t.insert(b"zzz", 3).unwrap().0;
    assert!(w.is_closed());
    check(&t2).unwrap();
}

#[test]
fn watch_set_reports_the_first_to_fire() {
    let t = tree_of(&[b"a", b"b"]);
    let mut set = WatchSet::new();
    set.add(t.get_watch(b"a").1);
    set.add(t.get_watch(b"b").1);
    assert_eq!(set.wait_timeout(Duration::from_millis(5)), None);
    t.insert(b"b", 7).unwrap();
    assert_eq!(set.wait_timeout(Duration::from_secs(1)), Some(1));
}

#[test]
fn snapshots_and_owned_iterators_cross_threads() {
    let t = tree_of(&[b"a", b"b", b"c"]);
    let it = t.clone().into_iter();
    drop(t);
    let keys = std::thread::spawn(move || it.map(|e| e.key().to_vec()).collect::<Vec<_>>())
        .join()
        .unwrap();
    assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
}

/// A writer commits changes to one key while readers repeatedly take the
/// published snapshot, ask for a watch and wait: every watch on a snapshot
/// that is no longer the latest must fire. Run with several seeds of timing.
#[test]
fn concurrent_watchers_never_miss_a_commit() {
    let published = Arc::new(Mutex::new(tree_of(&[b"key", b"other"])));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Fired waits per reader: the writer goes on until every reader has
    // seen a few commits fire its watch (a fast writer could otherwise be
    // done before a reader starts).
    let fired: Arc<[std::sync::atomic::AtomicU32; 3]> = Arc::new(Default::default());
    let mut readers = Vec::new();
    for r in 0..3 {
        let published = published.clone();
        let stop = stop.clone();
        let fired = fired.clone();
        readers.push(std::thread::spawn(move || {
            let mut waited = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let snap = published.lock().unwrap().clone();
                let key: &[u8] = if r == 0 { b"key" } else { b"ke" };
                let w = if r == 2 {
                    snap.prefix_watch(key).1
                } else {
                    snap.get_watch(key).1
                };
                if !w.wait_timeout(Duration::from_secs(2)) {
                    // Only the final snapshot may stay unfired.
                    let latest = published.lock().unwrap().clone();
                    assert!(
                        latest.ptr_eq(&snap),
                        "watch lost on a superseded snapshot (reader {r}, ke present: {})",
                        snap.get(b"ke").is_some()
                    );
                    return waited;
                }
                waited += 1;
                fired[r].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            waited
        }));
    }
    for i in 0..2_000_000u32 {
        if i >= 3000
            && fired
                .iter()
                .all(|f| f.load(std::sync::atomic::Ordering::Relaxed) >= 10)
        {
            break;
        }
        let cur = published.lock().unwrap().clone();
        let mut txn = cur.txn();
        txn.insert(b"key", i).unwrap();
        txn.insert(&i.to_be_bytes(), i).unwrap();
        // Every commit changes `ke` too, missing and present by turns.
        if i % 2 == 0 {
            txn.insert(b"ke", i).unwrap();
        } else {
            txn.delete(b"ke");
        }
        let (next, notifier) = txn.commit_only();
        *published.lock().unwrap() = next;
        notifier.notify();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    // Wake readers blocked on the final snapshot: change `key` and `ke`.
    let cur = published.lock().unwrap().clone();
    let mut txn = cur.txn();
    txn.insert(b"key", 0).unwrap();
    if txn.delete(b"ke").is_none() {
        txn.insert(b"ke", 0).unwrap();
    }
    *published.lock().unwrap() = txn.commit();
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn snapshots_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Tree<u32>>();
    send_sync::<part::IntoIter<u32>>();
    send_sync::<part::Entry<String>>();
    send_sync::<part::Watch>();
    send::<part::Txn<u32>>();
    send::<part::Changed>();
}

/// A value that counts its live copies.
struct Counted(Arc<std::sync::atomic::AtomicIsize>);

impl Counted {
    fn new(live: &Arc<std::sync::atomic::AtomicIsize>) -> Self {
        live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Counted(live.clone())
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::new(&self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Regression: a tree nested deeper than the drop recursion limit (64) is
/// taken apart through a work list. A node256 there, plain or borrowing
/// from an older version, must still drop every child it owns (its
/// occupied-slot bitmap was cleared too early, leaking them).
#[test]
fn deep_trees_of_node256s_drop_every_value() {
    let live = Arc::new(std::sync::atomic::AtomicIsize::new(0));
    {
        // 80 levels; each holds 60 leaves (a node256) and the next level
        // under byte 0.
        let key = |depth: usize, b: u8| {
            let mut k = vec![0u8; depth];
            k.push(b);
            k
        };
        let mut txn = Tree::new().txn();
        for depth in 0..80 {
            for b in 1..=60u8 {
                txn.insert(&key(depth, b), Counted::new(&live)).unwrap();
            }
        }
        let t0 = txn.commit();
        // Rewrite 20 keys per level: each level's node256 is flattened into
        // one that borrows from `t0`'s.
        let mut txn = t0.txn();
        for depth in 0..80 {
            for b in 1..=20u8 {
                txn.insert(&key(depth, b), Counted::new(&live)).unwrap();
            }
        }
        let t1 = txn.commit();
        check(&t1).unwrap();
        assert_eq!(live.load(std::sync::atomic::Ordering::Relaxed), 80 * 80);
        // `t1`'s node256s still borrow from `t0`'s, which therefore keep
        // the 20 replaced values per level alive (one older version at most).
        drop(t0);
        assert_eq!(live.load(std::sync::atomic::Ordering::Relaxed), 80 * 80);
        drop(t1);
    }
    assert_eq!(live.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// The finger (where the last write ended) must not write into nodes an
/// owning iterator of the transaction shares: regression guard for the
/// stale flag `scan_owned` sets.
#[test]
fn owned_scan_of_a_txn_keeps_its_view_while_nearby_keys_are_written() {
    let mut txn = Tree::<u32>::new().txn();
    for i in 0..100u32 {
        txn.insert(&(1000 + i).to_be_bytes(), i).unwrap();
    }
    let it = txn.scan_owned(&part::Scan::All, false);
    // Same leaf parent as the last write: the finger's fast path.
    for i in 100..200u32 {
        txn.insert(&(1000 + i).to_be_bytes(), i).unwrap();
    }
    txn.modify(&1050u32.to_be_bytes(), |_| 7).unwrap();
    let seen: Vec<u32> = it.map(|e| *e.value()).collect();
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
    let t = txn.commit();
    check(&t).unwrap();
    assert_eq!(t.len(), 200);
    assert_eq!(t.get(&1050u32.to_be_bytes()), Some(&7));
}

/// Writes in key order through the finger, mixed with deletes and
/// snapshots, agree with a `BTreeMap` (the proptest covers random orders).
#[test]
fn ordered_batches_through_the_finger_match_a_btreemap() {
    let mut model = std::collections::BTreeMap::new();
    let mut tree = Tree::<u32>::new();
    let mut snaps = Vec::new();
    for round in 0..6u32 {
        let mut txn = tree.txn();
        for i in 0..700u32 {
            let k = (round * 97 + i * 3).to_be_bytes();
            if i % 11 == 5 {
                assert_eq!(txn.delete(&k), model.remove(k.as_slice()));
            } else {
                assert_eq!(txn.insert(&k, i).unwrap(), model.insert(k.to_vec(), i));
            }
            // Lookups near the last write start at the finger.
            for d in [0u32, 1, 3, 200] {
                let near = (round * 97 + i * 3).wrapping_sub(d).to_be_bytes();
                assert_eq!(txn.get(&near), model.get(near.as_slice()));
            }
        }
        txn.check_invariants().unwrap();
        tree = txn.commit();
        snaps.push((tree.clone(), model.clone()));
    }
    for (t, m) in &snaps {
        check(t).unwrap();
        let got: Vec<(Vec<u8>, u32)> = t.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
        assert_eq!(
            got,
            m.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>()
        );
    }
}

/// The root carries the prefix every key shares (path compression at the
/// root): watches that end inside it, or on the root, still fire when the
/// root is split or absorbs its only child; a prefix with no key under it
/// fires when one comes, not at the split.
#[test]
fn watches_across_the_compressed_root() {
    let keys: Vec<[u8; 4]> = (0..50u32).map(|i| i.to_be_bytes()).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let t = tree_of(&refs);
    let (_, inside) = t.prefix_watch(&[0]);
    let (_, missing) = t.get_watch(&[0, 1]);
    let (_, other) = t.prefix_watch(&[1]);
    let (_, key) = t.get_watch(&7u32.to_be_bytes());
    // A key under [0] that leaves the shared prefix splits the root.
    let t2 = t.insert(&[0, 1], 1).unwrap().0;
    check(&t2).unwrap();
    assert!(inside.is_closed());
    assert!(missing.is_closed());
    assert!(!key.is_closed());
    assert!(!other.is_closed(), "no key under [1] yet");
    assert_eq!(t2.get(&[0, 1]), Some(&1));
    let t3 = t2.insert(&[1, 0, 0, 0], 2).unwrap().0;
    assert!(other.is_closed());
    check(&t3).unwrap();

    // Root-only watches fire on a root split, and on the delete that
    // undoes it (the root then keeps its one child, still shared).
    let ro = Options {
        root_only_watch: true,
    };
    let mut txn = Tree::with_options(ro).txn();
    txn.insert(b"node/1", 1).unwrap();
    txn.insert(b"node/2", 2).unwrap();
    let t = txn.commit();
    let w = t.root_watch();
    let t2 = t.insert(b"nope", 3).unwrap().0;
    assert!(w.is_closed());
    let w = t2.root_watch();
    let t3 = t2.delete(b"nope").0;
    assert!(w.is_closed());
    check(&t3).unwrap();

    // A root left with one child shared by an older snapshot, which is then
    // dropped: a later commit that absorbs the child still wakes whoever
    // watched the old root, and the change after it is seen.
    let t = tree_of(&[b"aa1", b"aa2", b"b"]);
    let t2 = t.delete(b"b").0;
    drop(t);
    let (_, w) = t2.prefix_watch(b"");
    let txn = t2.txn();
    drop(t2);
    let t3 = txn.commit();
    let t4 = t3.insert(b"aa3", 3).unwrap().0;
    assert!(w.is_closed());
    check(&t4).unwrap();
    assert_eq!(t4.len(), 3);
}

/// The 8-byte big-endian key `7 * i`.
fn seventh(i: u64) -> [u8; 8] {
    (i * 7).to_be_bytes()
}

/// A tree (per-node watches) of the keys `seventh(i)` for `i < n`, valued `i`.
fn sevenths(n: u64) -> Tree<u32> {
    let mut txn = Tree::new().txn();
    for i in 0..n {
        txn.insert(&seventh(i), i as u32).unwrap();
    }
    txn.commit()
}

/// 20,000 keys deleted in a scattered order in one transaction: after the
/// first delete under each node, the path is private and a delete walks it
/// once, in place (`txn.rs`, `delete_in_place`). Misses change nothing, the
/// snapshot it started from stays whole, and the watches are right.
#[test]
fn deletes_of_a_large_txn_keep_snapshots_and_watches_right() {
    let key = seventh;
    let t0 = sevenths(20_000);
    let watches: Vec<_> = (1000..1040u64)
        .map(|i| (i, t0.get_watch(&key(i)).1))
        .collect();
    let mut model: std::collections::BTreeMap<[u8; 8], u32> =
        (0..20_000u64).map(|i| (key(i), i as u32)).collect();
    let mut txn = t0.txn();
    for step in 0..30_000u64 {
        // A fixed permutation of 0..2^15; every third key is kept.
        let i = step.wrapping_mul(0x9e37_79b1) & 0x7fff;
        if i % 3 == 1 {
            continue;
        }
        // Keys past 20,000 and keys between the multiples of 7 are misses.
        let k = if step % 5 == 0 {
            (i * 7 + 3).to_be_bytes()
        } else {
            key(i)
        };
        assert_eq!(txn.delete(&k), model.remove(&k), "step {step}");
        assert_eq!(txn.len(), model.len());
        if step % 1009 == 0 {
            txn.check_invariants().unwrap();
        }
    }
    let t1 = txn.commit();
    check(&t1).unwrap();
    let got: Vec<([u8; 8], u32)> = t1
        .iter()
        .map(|(k, v)| (k.try_into().unwrap(), *v))
        .collect();
    assert_eq!(got, model.into_iter().collect::<Vec<_>>());
    assert_eq!(t0.len(), 20_000);
    for i in 0..20_000u64 {
        assert_eq!(t0.get(&key(i)), Some(&(i as u32)));
    }
    // A key's watch fires exactly when the key was deleted.
    let deleted = watches
        .iter()
        .filter(|(i, _)| t1.get(&key(*i)).is_none())
        .count();
    assert!(
        deleted > 10 && deleted < 40,
        "{deleted} of the 40 watched keys deleted"
    );
    for (i, w) in &watches {
        assert_eq!(w.is_closed(), t1.get(&key(*i)).is_none(), "key {i}");
    }
}

/// A node the transaction owns alone (its snapshot was dropped) but that
/// someone watches must still hand its watch on when a delete changes it:
/// the one-walk delete leaves such a path to the careful one.
#[test]
fn a_delete_under_a_watched_node_the_txn_owns_alone_fires_its_watch() {
    let key = seventh;
    let t0 = sevenths(2_000);
    // The node256 that holds `key(500)`: its prefix's watch is the node's.
    let (_, node_w) = t0.prefix_watch(&key(500)[..7]);
    let (_, other_w) = t0.prefix_watch(&key(1900)[..7]);
    // A missing key beside it: its watch moves to the new node, unfired.
    let (_, missing_w) = t0.get_watch(&(500u64 * 7 + 1).to_be_bytes());
    // With the snapshot gone the transaction is the only owner of every
    // node on the path, and the watched one still holds its watch.
    let mut txn = t0.txn();
    drop(t0);
    assert_eq!(txn.delete(&key(500)), Some(500));
    let t1 = txn.commit();
    assert!(node_w.is_closed());
    assert!(!other_w.is_closed());
    assert!(!missing_w.is_closed(), "the missing key stayed missing");
    t1.insert(&(500u64 * 7 + 1).to_be_bytes(), 1).unwrap();
    assert!(missing_w.is_closed());
}

/// Versions that share most of their nodes, dropped on several threads at
/// once in different orders: each node is freed exactly once, by whichever
/// thread releases it last (the last release skips the read-modify-write
/// when the count is already 1; this races it against the others).
#[test]
fn shared_versions_dropped_on_many_threads_free_each_node_once() {
    let live = Arc::new(std::sync::atomic::AtomicIsize::new(0));
    for round in 0..20u64 {
        let mut versions = Vec::new();
        let mut t = Tree::new();
        for v in 0..32u64 {
            let mut txn = t.txn();
            for k in 0..300u64 {
                // Each version rewrites a different slice of the keys.
                if (k + v * 7 + round) % 5 == 0 || v == 0 {
                    txn.insert(&(k * 37).to_be_bytes(), Counted::new(&live))
                        .unwrap();
                }
            }
            t = txn.commit();
            versions.push(t.clone());
        }
        drop(t);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let mut mine: Vec<Tree<Counted>> =
                    versions.iter().skip(i).step_by(2).cloned().collect();
                if i % 2 == 1 {
                    mine.reverse();
                }
                std::thread::spawn(move || drop(mine))
            })
            .collect();
        drop(versions);
        for h in threads {
            h.join().unwrap();
        }
        assert_eq!(live.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}

/// Regression (found 2026-12-02 by `root_only_watch_fires_through_one_key_trees`):
/// a root left with one entry by deletes, split by a key outside its
/// segment, became an inner node of one entry below the new root.
#[test]
fn a_root_of_one_entry_split_off_merges_into_it() {
    for opts in [
        Options::default(),
        Options {
            root_only_watch: true,
        },
    ] {
        // Root segment [0] (compressed) with one leaf, then only a terminal.
        for (keys, gone) in [
            ([[0u8, 0], [0, 1]].as_slice(), [0u8, 0].as_slice()),
            (&[[0, 0], [0, 1]], &[0, 1]),
        ] {
            let mut t: Tree<u32> = Tree::with_options(opts);
            for k in keys {
                t = t.insert(k, 1).unwrap().0;
            }
            t = t.insert(&[0], 2).unwrap().0;
            t = t.delete(gone).0;
            t = t.delete(&[0]).0;
            check(&t).unwrap();
            t = t.insert(&[1], 3).unwrap().0;
            check(&t).unwrap();
            assert_eq!(t.len(), 2);
            assert_eq!(t.get(&[1]), Some(&3));
        }
        // A root with only its terminal.
        let mut t: Tree<u32> = Tree::with_options(opts);
        for k in [&[0u8][..], &[0, 1]] {
            t = t.insert(k, 1).unwrap().0;
        }
        t = t.delete(&[0, 1]).0;
        t = t.insert(&[1], 3).unwrap().0;
        check(&t).unwrap();
        assert_eq!(t.iter().count(), 2);
    }
}

//! Key encoding properties: order preserved, nested keys prefix-free, and no
//! leakage between non-unique keys in a table.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use statedb::{escape_nonunique, Db, DbOptions, Index, Key, KeyLayout, TableOptions};

fn esc(k: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    escape_nonunique(k, &mut v);
    v
}

fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0u8, 1, 0xfe, 0xff, b'a']), 0..6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn escape_preserves_order_and_is_prefix_free(a in small_bytes(), b in small_bytes()) {
        let (ea, eb) = (esc(&a), esc(&b));
        prop_assert_eq!(a.cmp(&b), ea.cmp(&eb));
        if a != b {
            prop_assert!(!eb.starts_with(&ea));
            prop_assert!(!ea.starts_with(&eb));
        }
    }

    #[test]
    fn escaped_entries_keep_their_order(a in small_bytes(), b in small_bytes(),
                                        pa in small_bytes(), pb in small_bytes()) {
        // Stored non-unique keys: esc(secondary) ++ primary.
        let mut ka = esc(&a);
        ka.extend_from_slice(&pa);
        let mut kb = esc(&b);
        kb.extend_from_slice(&pb);
        prop_assert_eq!((&a, &pa).cmp(&(&b, &pb)), ka.cmp(&kb));
    }

    #[test]
    fn integers_sort_numerically(a: i64, b: i64, c: i32, d: i32, e: i8, f: i8, g: u64, h: u64, x: i128, y: i128) {
        prop_assert_eq!(a.cmp(&b), a.to_key().cmp(&b.to_key()));
        prop_assert_eq!(c.cmp(&d), c.to_key().cmp(&d.to_key()));
        prop_assert_eq!(e.cmp(&f), e.to_key().cmp(&f.to_key()));
        prop_assert_eq!(g.cmp(&h), g.to_key().cmp(&h.to_key()));
        prop_assert_eq!(x.cmp(&y), x.to_key().cmp(&y.to_key()));
        prop_assert_eq!((a as i16).cmp(&(b as i16)), (a as i16).to_key().cmp(&(b as i16).to_key()));
    }

    #[test]
    fn tuples_sort_like_tuples(a in ".{0,3}", b in ".{0,3}", x: i16, y: i16, p: bool, q: bool) {
        let (k1, k2) = ((a.clone(), x, p), (b.clone(), y, q));
        prop_assert_eq!(k1.cmp(&k2), k1.to_key().cmp(&k2.to_key()));
        let (k1, k2) = ((x, a.clone()), (y, b.clone()));
        prop_assert_eq!(k1.cmp(&k2), k1.to_key().cmp(&k2.to_key()));
        let (k1, k2) = ((a.as_bytes().to_vec(), x), (b.as_bytes().to_vec(), y));
        prop_assert_eq!(k1.cmp(&k2), k1.to_key().cmp(&k2.to_key()));
    }

    #[test]
    fn addresses_sort_numerically(a: u32, b: u32, c: u128, d: u128) {
        let (x, y) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
        prop_assert_eq!(x.cmp(&y), x.to_key().cmp(&y.to_key()));
        let (x, y) = (Ipv6Addr::from(c), Ipv6Addr::from(d));
        prop_assert_eq!(x.cmp(&y), x.to_key().cmp(&y.to_key()));
        let (x, y) = (std::net::IpAddr::from(Ipv4Addr::from(a)), std::net::IpAddr::from(Ipv6Addr::from(c)));
        prop_assert!(x.to_key() < y.to_key());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Keys with 0x00 bytes and keys that are prefixes of others never leak
    /// into each other's get/list results; prefix and lower-bound results
    /// are exactly the model's, in key order.
    #[test]
    fn non_unique_keys_never_leak(keys in prop::collection::vec(small_bytes(), 1..24),
                                  probes in prop::collection::vec(small_bytes(), 1..12),
                                  nibbles: bool) {
        let db = Db::with_options(DbOptions::default().with_gc_interval(None));
        let pk = Index::unique("pk", |o: &(u32, Vec<u8>)| o.0);
        let sk = Index::non_unique("sk", |o: &(u32, Vec<u8>)| o.1.clone());
        let key_layout = if nibbles { KeyLayout::Nibbles } else { KeyLayout::Bytes };
        let t = db
            .create_table_with("t", &pk, &[sk.erase()], TableOptions::default().with_key_layout(key_layout))
            .unwrap();
        let mut w = db.write_txn(&[&t]).unwrap();
        for (i, k) in keys.iter().enumerate() {
            t.insert(&mut w, (i as u32, k.clone())).unwrap();
        }
        let r = w.commit().unwrap();
        let mut model: Vec<(Vec<u8>, u32)> = keys.iter().cloned().zip(0u32..).collect();
        model.sort();
        for p in probes.iter().chain(keys.iter()) {
            let got: Vec<u32> = t.list(&r, &sk, p).unwrap().map(|o| o.0).collect();
            let want: Vec<u32> = model.iter().filter(|(k, _)| k == p).map(|x| x.1).collect();
            prop_assert_eq!(got, want);
            let got: Vec<u32> = t.prefix(&r, &sk, p).unwrap().map(|o| o.0).collect();
            let want: Vec<u32> = model.iter().filter(|(k, _)| k.starts_with(p)).map(|x| x.1).collect();
            prop_assert_eq!(got, want);
            let got: Vec<u32> = t.lower_bound(&r, &sk, p).unwrap().map(|o| o.0).collect();
            let want: Vec<u32> = model.iter().filter(|(k, _)| k >= p).map(|x| x.1).collect();
            prop_assert_eq!(got, want);
        }
    }
}

//! A worker's map from external block hash to location, in 12-byte
//! entries.
//!
//! The per-worker maps are most of the index's memory (a (worker, block)
//! pair is one entry, and a hash table keeps 1.1 to 2.3 buckets per
//! entry). A `Loc` is two `u32`s, and with a `u64` key the entry is 16
//! bytes; but a worker's blocks sit in few nodes (its node table has tens
//! to thousands of slots) at depths below 65,536 (a million tokens at 16
//! per block). So the entry keeps its key as two `u32`s (alignment 4) and
//! the location packed into one `u32`: 12 bytes, 13 a bucket with its
//! control byte. A location that does not fit (slot or depth of 2^16 or
//! more) goes to a second map of full entries, empty in practice: every
//! read checks it only when it is not empty.

use std::hash::BuildHasher;

use hashbrown::hash_table::Entry;
use hashbrown::{HashMap, HashTable};

use super::Loc;
use crate::hash::ExternalHash;

type State = foldhash::fast::RandomState;

/// One entry: the external hash as two `u32`s (alignment 4, so 12 bytes
/// where a `u64` key would make 16) and the packed location.
#[derive(Clone, Copy)]
struct Slot {
    key: [u32; 2],
    loc: u32,
}

impl Slot {
    #[inline(always)]
    fn key(&self) -> u64 {
        u64::from(self.key[0]) | (u64::from(self.key[1]) << 32)
    }
}

/// Bits of the packed value for the depth; the slot takes the rest.
const DEPTH_BITS: u32 = 16;
const DEPTH_MASK: u32 = (1 << DEPTH_BITS) - 1;

#[inline(always)]
fn pack(loc: Loc) -> Option<u32> {
    (loc.slot < 1 << (32 - DEPTH_BITS) && loc.depth <= DEPTH_MASK)
        .then_some((loc.slot << DEPTH_BITS) | loc.depth)
}

#[inline(always)]
fn unpack(v: u32) -> Loc {
    Loc {
        slot: v >> DEPTH_BITS,
        depth: v & DEPTH_MASK,
    }
}

/// External hash -> location for one worker. A key is in at most one of
/// the two tables. A `HashTable` rather than a `HashMap` for the packed
/// one: a rebuild moves entries without comparing keys.
#[derive(Default)]
pub(crate) struct BlockMap {
    narrow: HashTable<Slot>,
    state: State,
    /// Locations that do not pack (usually empty).
    wide: HashMap<ExternalHash, Loc, State>,
}

impl BlockMap {
    #[inline(always)]
    fn hash(&self, e: u64) -> u64 {
        self.state.hash_one(e)
    }

    /// Where `e` is.
    #[inline(always)]
    pub(crate) fn get(&self, e: &ExternalHash) -> Option<Loc> {
        match self.narrow.find(self.hash(e.0), |s| s.key() == e.0) {
            Some(s) => Some(unpack(s.loc)),
            None if self.wide.is_empty() => None,
            None => self.wide.get(e).copied(),
        }
    }

    /// Records `e` at `loc` unless `e` is already present (then false and
    /// nothing changes).
    #[inline(always)]
    pub(crate) fn insert_new(&mut self, e: ExternalHash, loc: Loc) -> bool {
        if !self.wide.is_empty() && self.wide.contains_key(&e) {
            return false;
        }
        let h = self.hash(e.0);
        let state = &self.state;
        match self
            .narrow
            .entry(h, |s| s.key() == e.0, |s| state.hash_one(s.key()))
        {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                match pack(loc) {
                    Some(p) => {
                        v.insert(Slot {
                            key: [e.0 as u32, (e.0 >> 32) as u32],
                            loc: p,
                        });
                    }
                    None => {
                        self.wide.insert(e, loc);
                    }
                }
                true
            }
        }
    }

    /// Removes `e`; where it was.
    #[inline(always)]
    pub(crate) fn remove(&mut self, e: &ExternalHash) -> Option<Loc> {
        match self.narrow.find_entry(self.hash(e.0), |s| s.key() == e.0) {
            Ok(o) => Some(unpack(o.remove().0.loc)),
            Err(_) if self.wide.is_empty() => None,
            Err(_) => self.wide.remove(e),
        }
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.narrow.len() + self.wide.len()
    }

    /// Every entry, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (ExternalHash, Loc)> + '_ {
        let narrow = (self.narrow.iter()).map(|s| (ExternalHash(s.key()), unpack(s.loc)));
        narrow.chain(self.wide.iter().map(|(&e, &l)| (e, l)))
    }

    /// Makes room for `more` new entries. hashbrown, left to itself,
    /// doubles its table whenever the live entries are past half of it,
    /// counting the tombstones removals leave as used: a worker whose
    /// cache churns at a steady size then keeps two to four buckets per
    /// entry. Rebuilt here at 1.25x what is needed instead, which also
    /// drops the tombstones: amortized one move per removal, each a hash
    /// and a write (no key compared).
    pub(crate) fn reserve(&mut self, more: usize) {
        if self.narrow.capacity() - self.narrow.len() >= more {
            return;
        }
        let need = self.narrow.len() + more;
        let state = &self.state;
        let mut fresh = HashTable::with_capacity(need + need / 4);
        for s in self.narrow.drain() {
            fresh.insert_unique(state.hash_one(s.key()), s, |s| state.hash_one(s.key()));
        }
        self.narrow = fresh;
    }

    /// Whether one more new entry fits without the table growing (a
    /// growth moves every entry).
    pub(crate) fn has_room(&self) -> bool {
        self.narrow.capacity() > self.narrow.len()
    }

    /// Gives memory back once at most a quarter of the table is used.
    pub(crate) fn shrink_if_sparse(&mut self) {
        if self.narrow.capacity() > 64 && self.narrow.len() * 4 < self.narrow.capacity() {
            let state = &self.state;
            self.narrow.shrink_to_fit(|s| state.hash_one(s.key()));
        }
        if self.wide.capacity() > 64 && self.wide.len() * 4 < self.wide.capacity() {
            self.wide.shrink_to_fit();
        }
    }

    /// Heap bytes of both tables.
    pub(crate) fn allocation_size(&self) -> usize {
        self.narrow.allocation_size() + self.wide.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap as Model;

    #[test]
    fn an_entry_is_twelve_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 12);
    }

    #[test]
    fn packing_round_trips_at_the_limits() {
        for (slot, depth) in [(0, 0), (65_535, 65_535), (1, 65_535), (65_535, 0)] {
            let l = unpack(pack(Loc { slot, depth }).expect("fits"));
            assert_eq!((l.slot, l.depth), (slot, depth));
        }
        assert!(pack(Loc {
            slot: 65_536,
            depth: 0
        })
        .is_none());
        assert!(pack(Loc {
            slot: 0,
            depth: 65_536
        })
        .is_none());
        let s = Slot {
            key: [(u64::MAX - 5) as u32, ((u64::MAX - 5) >> 32) as u32],
            loc: 0,
        };
        assert_eq!(s.key(), u64::MAX - 5);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32, u32),
        Remove(u8),
        Reserve(u16),
        Shrink,
    }

    /// Slots and depths on both sides of the packing limit.
    fn big_or_small() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..4, 65_534u32..65_538, Just(u32::MAX - 1)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), big_or_small(), big_or_small()).prop_map(|(k, s, d)| Op::Insert(k, s, d)),
            3 => any::<u8>().prop_map(Op::Remove),
            1 => any::<u16>().prop_map(Op::Reserve),
            1 => Just(Op::Shrink),
        ]
    }

    /// Keys differ in both halves, so a half-compared key would collide.
    fn key(k: u8) -> ExternalHash {
        ExternalHash(u64::from(k % 8) << 40 | u64::from(k / 8))
    }

    proptest! {
        /// Against a plain map: every answer equal after every operation,
        /// whichever table an entry went to.
        #[test]
        fn agrees_with_a_plain_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut m = BlockMap::default();
            let mut model: Model<u64, (u32, u32)> = Model::new();
            for op in ops {
                match op {
                    Op::Insert(k, slot, depth) => {
                        let fresh = !model.contains_key(&key(k).0);
                        prop_assert_eq!(m.insert_new(key(k), Loc { slot, depth }), fresh);
                        if fresh {
                            model.insert(key(k).0, (slot, depth));
                        }
                    }
                    Op::Remove(k) => {
                        let got = m.remove(&key(k)).map(|l| (l.slot, l.depth));
                        prop_assert_eq!(got, model.remove(&key(k).0));
                    }
                    Op::Reserve(n) => m.reserve(usize::from(n)),
                    Op::Shrink => m.shrink_if_sparse(),
                }
                prop_assert_eq!(m.len(), model.len());
                for k in 0..=255u8 {
                    let got = m.get(&key(k)).map(|l| (l.slot, l.depth));
                    prop_assert_eq!(got, model.get(&key(k).0).copied());
                }
                let mut all: Vec<(u64, (u32, u32))> =
                    m.iter().map(|(e, l)| (e.0, (l.slot, l.depth))).collect();
                all.sort_unstable();
                let mut want: Vec<(u64, (u32, u32))> = model.iter().map(|(&k, &v)| (k, v)).collect();
                want.sort_unstable();
                prop_assert_eq!(all, want);
            }
        }
    }
}

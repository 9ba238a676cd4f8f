//! Key encoders: byte strings whose lexicographic order is the natural order
//! of the values they encode.
//!
//! * unsigned integers: big-endian, fixed width;
//! * signed integers: sign bit flipped, big-endian, so negatives sort before
//!   zero and positives (numeric order; Go statedb sorts them after);
//! * `bool`: one byte, `false < true`;
//! * strings and byte strings: their bytes;
//! * IP addresses: a family byte (4 or 6) then the address bytes, so every
//!   IPv4 address sorts before every IPv6 one and the two never collide;
//! * [`IpPrefix`]: the address then the prefix length;
//! * tuples: each component but the last in its *nested* (self-delimiting)
//!   form, the last plain, so a prefix query on a tuple may leave its last
//!   component partial.
//!
//! The nested form of a variable-length key is [`escape_nonunique`]: 0x00 is
//! written 0x00 0xff and the key ends with 0x00 0x00. It preserves order and
//! no nested key is a proper prefix of another; non-unique secondary indexes
//! store `nested(secondary key) ++ primary key`, so one key's entries never
//! show up in another key's results.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::Error;

/// A value that can be an index key.
pub trait Key {
    /// Which encoding the type has, so that a table can refuse a key of
    /// another type where no index names the type
    /// ([`Table::delete_key`](crate::Table::delete_key)): a `u32` and an
    /// `i32` of equal value encode differently, and a delete with the one
    /// would silently find nothing under keys of the other. Types that
    /// encode alike share a family (`String`, `str`, `Vec<u8>` and `[u8]`;
    /// `u64` and `usize`); see [`key_family`]. 0, the default for key types
    /// of your own, is never checked.
    const FAMILY: u64 = 0;

    /// Appends the order-preserving encoding of `self`.
    fn encode(&self, out: &mut Vec<u8>);

    /// Appends a self-delimiting order-preserving encoding (used inside
    /// tuples). Fixed-width keys override this with [`Key::encode`].
    fn encode_nested(&self, out: &mut Vec<u8>) {
        let mut tmp = Vec::new();
        self.encode(&mut tmp);
        escape_nonunique(&tmp, out);
    }

    /// Writes the encoding into `buf` and returns its length, when it fits
    /// in 16 bytes and needs no allocation (fixed-width keys, short strings
    /// and byte strings); `None` otherwise. Point lookups then skip the
    /// per-thread scratch buffer. Must agree with [`Key::encode`].
    #[inline]
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        let _ = buf;
        None
    }

    /// The encoding as a fresh vector.
    fn to_key(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// A [`Key::FAMILY`] from a name (FNV-1a), never 0: for key types of your
/// own whose encoding should be told apart from others'.
pub const fn key_family(name: &str) -> u64 {
    let b = name.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    nonzero(h)
}

/// The family of a tuple (or a fixed-size array) from its parts' families;
/// 0 (unchecked) when any part is.
const fn combine(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut i = 0;
    while i < parts.len() {
        if parts[i] == 0 {
            return 0;
        }
        h = (h ^ parts[i])
            .wrapping_mul(0x0100_0000_01b3)
            .rotate_left(29);
        i += 1;
    }
    nonzero(h)
}

/// `h`, or 1 for 0 (which means unchecked).
const fn nonzero(h: u64) -> u64 {
    if h == 0 {
        1
    } else {
        h
    }
}

/// `bytes` in `buf` when they fit.
#[inline(always)]
fn fixed(bytes: &[u8], buf: &mut [u8; 16]) -> Option<usize> {
    buf.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(bytes.len())
}

/// Appends `key` escaped (0x00 as 0x00 0xff) and terminated (0x00 0x00).
///
/// For any byte strings `a`, `b`: `esc(a) < esc(b)` iff `a < b`, and
/// `esc(a)` is never a proper prefix of `esc(b)`.
pub fn escape_nonunique(key: &[u8], out: &mut Vec<u8>) {
    out.reserve(key.len() + 2);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// How a table stores its index keys in its trees.
///
/// Copying a tree node on write bumps the reference count of each child
/// (and as many decrements when it is freed); `part` writes a shared
/// node256 as a delta, so the dense case costs one per write plus a flatten
/// every 16 patches. `Nibbles` stores each byte as two nibbles, so no node
/// has more than 16 children: small write transactions get cheaper still,
/// lookups and scans slower (deeper trees). Order and prefixes are preserved
/// either way; every query behaves the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyLayout {
    /// The encoded bytes as they are (the default): fastest reads.
    #[default]
    Bytes,
    /// Each byte as its high and low nibble: fastest small writes.
    Nibbles,
}

impl KeyLayout {
    /// Stored bytes per encoded byte.
    pub(crate) fn per_byte(self) -> usize {
        match self {
            KeyLayout::Bytes => 1,
            KeyLayout::Nibbles => 2,
        }
    }
}

/// Appends the stored form of an encoded key. Order- and prefix-preserving.
#[inline]
pub(crate) fn expand(layout: KeyLayout, raw: &[u8], out: &mut Vec<u8>) {
    match layout {
        KeyLayout::Bytes => out.extend_from_slice(raw),
        KeyLayout::Nibbles => {
            out.reserve(raw.len() * 2);
            for &b in raw {
                out.extend_from_slice(&nibbles(b));
            }
        }
    }
}

/// A byte's high and low nibble.
#[inline(always)]
fn nibbles(b: u8) -> [u8; 2] {
    [b >> 4, b & 0xf]
}

/// [`expand`] for a key of at most 16 bytes (an [`Key::encode_fixed`]
/// result), into a stack buffer.
#[inline]
pub(crate) fn expand_fixed<'a>(layout: KeyLayout, raw: &[u8], out: &'a mut [u8; 32]) -> &'a [u8] {
    match layout {
        KeyLayout::Bytes => {
            out[..raw.len()].copy_from_slice(raw);
            &out[..raw.len()]
        }
        KeyLayout::Nibbles => {
            for (pair, &b) in out.chunks_exact_mut(2).zip(raw) {
                pair.copy_from_slice(&nibbles(b));
            }
            &out[..2 * raw.len()]
        }
    }
}

/// Appends the stored form of `escape_nonunique(raw)` (terminated or, for
/// prefix queries, not).
pub(crate) fn expand_escaped(layout: KeyLayout, raw: &[u8], terminate: bool, out: &mut Vec<u8>) {
    out.reserve(raw.len() * layout.per_byte() + 4);
    for &b in raw {
        expand(layout, &[b], out);
        if b == 0 {
            expand(layout, &[0xff], out);
        }
    }
    if terminate {
        expand(layout, &[0, 0], out);
    }
}

/// The stored key of secondary key `k`: the key (unique) or
/// `escape(k) ++ pk` (non-unique).
pub(crate) fn stored<'b>(
    layout: KeyLayout,
    unique: bool,
    k: &[u8],
    pk: &[u8],
    scratch: &'b mut Vec<u8>,
) -> &'b [u8] {
    scratch.clear();
    if unique {
        expand(layout, k, scratch);
    } else {
        expand_escaped(layout, k, true, scratch);
        expand(layout, pk, scratch);
    }
    scratch
}

/// The length of [`stored`]'s key for encoded key `k`: `k` expanded (unique), or `escape(k)` then the
/// primary key's `pk_len` encoded bytes, expanded (non-unique). The key
/// length check uses this, so it agrees with the encoders above by
/// construction (`tests::stored_len_is_what_the_encoders_write`).
pub(crate) fn stored_len(layout: KeyLayout, unique: bool, k: &[u8], pk_len: usize) -> usize {
    let raw = if unique {
        k.len()
    } else {
        // Each 0x00 gains a 0xff; two terminating 0x00s; then the pk.
        k.len() + k.iter().filter(|&&b| b == 0).count() + 2 + pk_len
    };
    raw * layout.per_byte()
}

/// The stored key of a revision in the revision index and graveyard: its
/// big-endian bytes. (Nibble-expanded before part's delta node256; plain
/// bytes measured 14-28% faster on the multi-object write benchmarks since,
/// single-row writes unchanged: see docs/design.md.)
#[inline]
pub(crate) fn rev_key(r: u64) -> [u8; 8] {
    r.to_be_bytes()
}

/// The revision of a revision-index or graveyard key.
pub(crate) fn decode_rev(k: &[u8]) -> u64 {
    k.iter().take(8).fold(0, |r, &b| (r << 8) | b as u64)
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Key for $t {
            const FAMILY: u64 = key_family(stringify!($t));
            #[inline]
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
            #[inline]
            fn encode_nested(&self, out: &mut Vec<u8>) {
                self.encode(out)
            }
            #[inline]
            fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
                fixed(&self.to_be_bytes(), buf)
            }
        }
    )*};
}
unsigned!(u8, u16, u32, u64, u128);

macro_rules! signed {
    ($($t:ty => $u:ty),*) => {$(
        impl Key for $t {
            const FAMILY: u64 = key_family(stringify!($t));
            #[inline]
            fn encode(&self, out: &mut Vec<u8>) {
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                out.extend_from_slice(&flipped.to_be_bytes());
            }
            #[inline]
            fn encode_nested(&self, out: &mut Vec<u8>) {
                self.encode(out)
            }
            #[inline]
            fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
                let flipped = (*self as $u) ^ (1 << (<$u>::BITS - 1));
                fixed(&flipped.to_be_bytes(), buf)
            }
        }
    )*};
}
signed!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, i128 => u128);

impl Key for usize {
    const FAMILY: u64 = u64::FAMILY;
    fn encode(&self, out: &mut Vec<u8>) {
        (*self as u64).encode(out)
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        (*self as u64).encode_fixed(buf)
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
}

impl Key for isize {
    const FAMILY: u64 = i64::FAMILY;
    fn encode(&self, out: &mut Vec<u8>) {
        (*self as i64).encode(out)
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
}

impl Key for bool {
    const FAMILY: u64 = key_family("bool");
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
}

impl Key for str {
    const FAMILY: u64 = key_family("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(self.as_bytes(), buf)
    }
}

impl Key for String {
    const FAMILY: u64 = key_family("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(self.as_bytes(), buf)
    }
}

impl Key for [u8] {
    const FAMILY: u64 = key_family("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(self, buf)
    }
}

impl Key for Vec<u8> {
    const FAMILY: u64 = key_family("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(self, buf)
    }
}

impl<const N: usize> Key for [u8; N] {
    // Its own family: inside a tuple it is not escaped as `Vec<u8>` is.
    const FAMILY: u64 = combine(&[key_family("[u8; N]"), N as u64 + 1]);
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(self, buf)
    }
}

impl<T: Key + ?Sized> Key for &T {
    const FAMILY: u64 = T::FAMILY;
    fn encode(&self, out: &mut Vec<u8>) {
        (**self).encode(out)
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        (**self).encode_nested(out)
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        (**self).encode_fixed(buf)
    }
}

impl Key for Ipv4Addr {
    const FAMILY: u64 = key_family("ipv4");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(&self.octets(), buf)
    }
}

impl Key for Ipv6Addr {
    const FAMILY: u64 = key_family("ipv6");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.octets());
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
    fn encode_fixed(&self, buf: &mut [u8; 16]) -> Option<usize> {
        fixed(&self.octets(), buf)
    }
}

impl Key for IpAddr {
    const FAMILY: u64 = key_family("ip");
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            IpAddr::V4(a) => {
                out.push(4);
                a.encode(out)
            }
            IpAddr::V6(a) => {
                out.push(6);
                a.encode(out)
            }
        }
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        // The family byte fixes the length: already self-delimiting.
        self.encode(out)
    }
}

/// An IP prefix (CIDR): an address and a prefix length, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    /// The prefix `addr/len`; host bits are cleared. A length past the
    /// address width is an error.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, Error> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(Error::InvalidPrefixLen { len, max });
        }
        let addr = match addr {
            IpAddr::V4(a) => {
                let m = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
            }
            IpAddr::V6(a) => {
                let m = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
            }
        };
        Ok(IpPrefix { addr, len })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// Whether the prefix length is zero (the prefix covers everything).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Key for IpPrefix {
    const FAMILY: u64 = key_family("ip prefix");
    fn encode(&self, out: &mut Vec<u8>) {
        self.addr.encode(out);
        out.push(self.len);
    }
    fn encode_nested(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }
}

macro_rules! tuple {
    ($($name:ident)+ ; $last:ident) => {
        #[allow(non_snake_case)]
        impl<$($name: Key,)+ $last: Key> Key for ($($name,)+ $last) {
            const FAMILY: u64 = combine(&[$($name::FAMILY,)+ $last::FAMILY]);
            fn encode(&self, out: &mut Vec<u8>) {
                let ($($name,)+ $last) = self;
                $($name.encode_nested(out);)+
                $last.encode(out);
            }
            fn encode_nested(&self, out: &mut Vec<u8>) {
                let ($($name,)+ $last) = self;
                $($name.encode_nested(out);)+
                $last.encode_nested(out);
            }
        }
    };
}
tuple!(A; B);
tuple!(A B; C);
tuple!(A B C; D);
tuple!(A B C D; E);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The length the key check uses is the length the encoder writes.
        #[test]
        fn stored_len_is_what_the_encoders_write(
            k in proptest::collection::vec(prop_oneof![Just(0u8), Just(0xffu8), any::<u8>()], 0..40),
            pk in proptest::collection::vec(any::<u8>(), 0..20),
            unique in any::<bool>(),
            nibbles in any::<bool>(),
        ) {
            let layout = if nibbles { KeyLayout::Nibbles } else { KeyLayout::Bytes };
            let mut scratch = Vec::new();
            let written = stored(layout, unique, &k, &pk, &mut scratch).len();
            prop_assert_eq!(stored_len(layout, unique, &k, pk.len()), written);
        }
    }

    fn enc<K: Key>(k: K) -> Vec<u8> {
        k.to_key()
    }

    /// `encode_fixed` when it answers, and `None` only when it may.
    fn fixed_agrees<K: Key + ?Sized>(k: &K, must_fit: bool) {
        let mut buf = [0xaau8; 16];
        match k.encode_fixed(&mut buf) {
            Some(n) => assert_eq!(&buf[..n], k.to_key().as_slice()),
            None => assert!(!must_fit && k.to_key().len() > 16),
        }
    }

    #[test]
    fn fixed_encodings_agree_with_encode() {
        for v in [i64::MIN, -1, 0, 1, i64::MAX] {
            fixed_agrees(&v, true);
            fixed_agrees(&(v as i8), true);
            fixed_agrees(&(v as i128), true);
            fixed_agrees(&(v as u64), true);
            fixed_agrees(&(v as u16), true);
            fixed_agrees(&(v as usize), true);
            fixed_agrees(&(v as u128), true);
        }
        for s in ["", "a", "sixteen-bytes-ok", "seventeen-bytes-x"] {
            fixed_agrees(s, s.len() <= 16);
            fixed_agrees(&s.to_string(), s.len() <= 16);
            fixed_agrees(s.as_bytes(), s.len() <= 16);
            fixed_agrees(&s.as_bytes().to_vec(), s.len() <= 16);
        }
        fixed_agrees(&[1u8, 2, 3], true);
        fixed_agrees(&Ipv4Addr::new(10, 0, 0, 1), true);
        fixed_agrees(&"fe80::1".parse::<Ipv6Addr>().unwrap(), true);
        // Keys without a fixed form fall back to `encode`.
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(ip.encode_fixed(&mut [0; 16]), None);
        assert_eq!((1u8, 2u8).encode_fixed(&mut [0; 16]), None);
    }

    #[test]
    fn signed_order() {
        let v = [i64::MIN, -1000, -1, 0, 1, 1000, i64::MAX];
        for w in v.windows(2) {
            assert!(enc(w[0]) < enc(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert!(enc(-1i8) < enc(0i8));
        assert!(enc(i16::MIN) < enc(i16::MAX));
    }

    #[test]
    fn ip_family_order() {
        let a: IpAddr = "255.255.255.255".parse().unwrap();
        let b: IpAddr = "::".parse().unwrap();
        assert!(enc(a) < enc(b));
        let m: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
        assert_ne!(enc(m), enc(IpAddr::from([1, 2, 3, 4])));
    }

    #[test]
    fn prefix_validation() {
        let a: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            IpPrefix::new(a, 33),
            Err(Error::InvalidPrefixLen { len: 33, max: 32 })
        );
        let p = IpPrefix::new(a, 8).unwrap();
        assert_eq!(p.addr(), "10.0.0.0".parse::<IpAddr>().unwrap());
        assert!(IpPrefix::new("::1".parse().unwrap(), 129).is_err());
        assert_eq!(
            IpPrefix::new(a, 0).unwrap().addr(),
            "0.0.0.0".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn tuple_order() {
        assert!(enc(("a".to_string(), 2u8)) < enc(("a\0".to_string(), 1u8)));
        assert!(enc(("a".to_string(), 2u8)) < enc(("ab".to_string(), 1u8)));
        assert!(enc((-1i32, "z")) < enc((0i32, "a")));
    }

    /// Families tell apart every pair of built-in key types that encode
    /// differently, and only those.
    #[test]
    fn families_follow_encodings() {
        let fams = [
            u8::FAMILY,
            u16::FAMILY,
            u32::FAMILY,
            u64::FAMILY,
            u128::FAMILY,
            i8::FAMILY,
            i16::FAMILY,
            i32::FAMILY,
            i64::FAMILY,
            i128::FAMILY,
            bool::FAMILY,
            str::FAMILY,
            <[u8; 4]>::FAMILY,
            <[u8; 8]>::FAMILY,
            Ipv4Addr::FAMILY,
            Ipv6Addr::FAMILY,
            IpAddr::FAMILY,
            IpPrefix::FAMILY,
            <(u32, u8)>::FAMILY,
            <(u8, u32)>::FAMILY,
            <(Vec<u8>, u8)>::FAMILY,
            <([u8; 4], u8)>::FAMILY,
            <(u8, u8, u8)>::FAMILY,
        ];
        for (i, a) in fams.iter().enumerate() {
            assert_ne!(*a, 0, "family {i} unchecked");
            for (j, b) in fams.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "families {i} and {j} collide");
            }
        }
        assert_eq!(usize::FAMILY, u64::FAMILY);
        assert_eq!(isize::FAMILY, i64::FAMILY);
        assert_eq!(String::FAMILY, str::FAMILY);
        assert_eq!(<[u8]>::FAMILY, str::FAMILY);
        assert_eq!(<Vec<u8>>::FAMILY, str::FAMILY);
        assert_eq!(<&str>::FAMILY, str::FAMILY);
        assert_eq!(<(String, u8)>::FAMILY, <(&str, u8)>::FAMILY);
        // Same family, same encoding.
        assert_eq!(enc(7usize), enc(7u64));
        assert_eq!(enc(-7isize), enc(-7i64));
        assert_eq!(enc("ab"), enc(b"ab".to_vec()));

        /// A key type of a user's own: unchecked unless it names a family.
        struct Mine;
        impl Key for Mine {
            fn encode(&self, out: &mut Vec<u8>) {
                out.push(1);
            }
        }
        struct Named;
        impl Key for Named {
            const FAMILY: u64 = key_family("named");
            fn encode(&self, out: &mut Vec<u8>) {
                out.push(1);
            }
        }
        assert_eq!(Mine::FAMILY, 0);
        assert_eq!(<(Mine, u8)>::FAMILY, 0);
        assert_ne!(Named::FAMILY, 0);
        assert_ne!(<(Named, u8)>::FAMILY, 0);
    }
}

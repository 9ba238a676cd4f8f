//! Node key buffers ([`Bytes`]) and short byte-string comparisons without
//! a `memcmp` call: node segments and keys are mostly a few bytes long,
//! where a call costs more than the compare.

use thin_vec::ThinVec;

/// `a == b`.
#[inline(always)]
pub(crate) fn eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && eq_same_len(a, b)
}

/// `hay.starts_with(needle)`.
#[inline(always)]
pub(crate) fn starts_with(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len() && eq_same_len(&hay[..needle.len()], needle)
}

/// How many key bytes a node holds inline.
pub(crate) const INLINE: usize = 14;

/// A leaf's key or an inner node's path segment, in 16 bytes: up to
/// [`INLINE`] bytes in place, longer ones in one heap block that starts
/// with its length. A leaf with its count and a one-word value is then 40
/// bytes (a `SmallVec<[u8; 16]>` took 24 and made it 48, so that half the
/// leaves straddled two cache lines and a 1000-key rewrite allocated more
/// bytes per key than Go's part).
#[derive(Clone)]
pub(crate) enum Bytes {
    /// `buf[..len]`.
    Inline {
        /// At most [`INLINE`].
        len: u8,
        /// Zero past `len`.
        buf: [u8; INLINE],
    },
    /// More than [`INLINE`] bytes.
    Heap(ThinVec<u8>),
}

const _: () = assert!(std::mem::size_of::<Bytes>() == 16);

impl Default for Bytes {
    #[inline]
    fn default() -> Self {
        Bytes::Inline {
            len: 0,
            buf: [0; INLINE],
        }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    #[inline(always)]
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Inline { len, buf } => buf.get(..usize::from(*len)).unwrap_or_default(),
            Bytes::Heap(v) => v,
        }
    }
}

impl Bytes {
    /// The number of bytes, without building the slice.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        match self {
            Bytes::Inline { len, .. } => usize::from(*len),
            Bytes::Heap(v) => v.len(),
        }
    }

    /// `self == key`, the inline case compared in place.
    #[inline(always)]
    pub(crate) fn eq_key(&self, key: &[u8]) -> bool {
        match self {
            Bytes::Inline { len, buf } => {
                let n = key.len();
                usize::from(*len) == n && n <= INLINE && eq_same_len(&buf[..n], key)
            }
            Bytes::Heap(v) => eq(v, key),
        }
    }

    /// `a` followed by `b`.
    pub(crate) fn concat(a: &[u8], b: &[u8]) -> Bytes {
        if a.len() + b.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            buf[..a.len()].copy_from_slice(a);
            buf[a.len()..a.len() + b.len()].copy_from_slice(b);
            return Bytes::Inline {
                len: (a.len() + b.len()) as u8,
                buf,
            };
        }
        let mut v = ThinVec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        Bytes::Heap(v)
    }
}

/// A key buffer: short keys are copied inline with word moves rather than a
/// `memcpy` call.
#[inline(always)]
pub(crate) fn small(b: &[u8]) -> Bytes {
    let n = b.len();
    if n > INLINE {
        return Bytes::Heap(ThinVec::from(b));
    }
    let p = pad16(b);
    let mut buf = [0u8; INLINE];
    buf.copy_from_slice(&p[..INLINE]);
    Bytes::Inline { len: n as u8, buf }
}

/// `b` (at most 16 bytes) copied into a zeroed 16-byte buffer. Built from
/// two overlapping loads combined as integers: written as slice copies, the
/// branches were folded back into a `memcpy` call.
#[inline(always)]
pub(crate) fn pad16(b: &[u8]) -> [u8; 16] {
    let n = b.len();
    debug_assert!(n <= 16);
    // The bytes two overlapping loads share are equal, so OR-ing them is
    // a copy.
    let v: u128 = if n >= 8 {
        let head = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let tail = u64::from_le_bytes(b[n - 8..].try_into().unwrap_or_default());
        head as u128 | (tail as u128) << ((n - 8) * 8)
    } else if n >= 4 {
        let head = u32::from_le_bytes(b[..4].try_into().unwrap_or_default());
        let tail = u32::from_le_bytes(b[n - 4..].try_into().unwrap_or_default());
        (head as u128) | (tail as u128) << ((n - 4) * 8)
    } else if n >= 2 {
        let head = u16::from_le_bytes([b[0], b[1]]);
        let tail = u16::from_le_bytes([b[n - 2], b[n - 1]]);
        (head as u128) | (tail as u128) << ((n - 2) * 8)
    } else if n == 1 {
        b[0] as u128
    } else {
        0
    };
    v.to_le_bytes()
}

/// Compares two slices of equal length with (possibly overlapping) word
/// loads from both ends.
#[inline(always)]
fn eq_same_len(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    debug_assert_eq!(n, b.len());
    match n {
        0 => true,
        1 => a[0] == b[0],
        2..=3 => u16_at(a, 0) == u16_at(b, 0) && u16_at(a, n - 2) == u16_at(b, n - 2),
        4..=7 => u32_at(a, 0) == u32_at(b, 0) && u32_at(a, n - 4) == u32_at(b, n - 4),
        8..=16 => u64_at(a, 0) == u64_at(b, 0) && u64_at(a, n - 8) == u64_at(b, n - 8),
        _ => a == b,
    }
}

#[inline(always)]
fn u16_at(s: &[u8], i: usize) -> u16 {
    u16::from_ne_bytes([s[i], s[i + 1]])
}

#[inline(always)]
fn u32_at(s: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&s[i..i + 4]);
    u32::from_ne_bytes(w)
}

#[inline(always)]
fn u64_at(s: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[i..i + 8]);
    u64::from_ne_bytes(w)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_std(a in proptest::collection::vec(0u8..3, 0..40), b in proptest::collection::vec(0u8..3, 0..40)) {
            prop_assert_eq!(super::eq(&a, &b), a == b);
            prop_assert_eq!(super::starts_with(&a, &b), a.starts_with(&b));
            let same = a.clone();
            prop_assert!(super::eq(&a, &same));
            let copied = super::small(&a);
            prop_assert_eq!(&copied[..], a.as_slice());
            prop_assert_eq!(copied.len(), a.len());
            prop_assert!(copied.eq_key(&a));
            prop_assert_eq!(copied.eq_key(&b), a == b);
            let (x, y) = a.split_at(a.len() / 3);
            prop_assert_eq!(&super::Bytes::concat(x, y)[..], a.as_slice());
        }

        #[test]
        fn pad16_copies_and_zero_fills(a in proptest::collection::vec(any::<u8>(), 0..=16)) {
            let mut want = [0u8; 16];
            want[..a.len()].copy_from_slice(&a);
            prop_assert_eq!(super::pad16(&a), want);
        }
    }
}

//! Node16 key search: SSE2 on x86-64, NEON on aarch64, scalar elsewhere,
//! chosen at compile time. Keys are kept sorted; only the first `len` count.

/// Index of `b` among the first `len` keys.
#[inline]
pub(crate) fn find16(keys: &[u8; 16], len: usize, b: u8) -> Option<usize> {
    let mask = eq_mask(keys, b) & live_mask(len);
    if mask == 0 {
        None
    } else {
        Some(mask.trailing_zeros() as usize)
    }
}

/// Index of the first of the first `len` keys that is `>= b` (or `len`).
#[inline]
pub(crate) fn lower_bound16(keys: &[u8; 16], len: usize, b: u8) -> usize {
    let less = lt_mask(keys, b) & live_mask(len);
    // Keys are sorted, so the keys below `b` form a run from index 0.
    less.count_ones() as usize
}

#[inline]
fn live_mask(len: usize) -> u32 {
    if len >= 16 {
        0xffff
    } else {
        (1u32 << len) - 1
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    #[inline]
    fn load(keys: &[u8; 16]) -> __m128i {
        // SAFETY: `keys` is 16 readable bytes and `_mm_loadu_si128` has no
        // alignment requirement; SSE2 is part of the x86-64 baseline.
        unsafe { _mm_loadu_si128(keys.as_ptr().cast()) }
    }

    #[inline]
    pub(super) fn eq_mask(keys: &[u8; 16], b: u8) -> u32 {
        // SAFETY: SSE2 is part of the x86-64 baseline, so these intrinsics'
        // target feature is always present.
        unsafe {
            let cmp = _mm_cmpeq_epi8(load(keys), _mm_set1_epi8(b as i8));
            _mm_movemask_epi8(cmp) as u32
        }
    }

    #[inline]
    pub(super) fn lt_mask(keys: &[u8; 16], b: u8) -> u32 {
        // Unsigned compare through the signed one: flip the sign bits.
        // SAFETY: SSE2 is part of the x86-64 baseline.
        unsafe {
            let flip = _mm_set1_epi8(i8::MIN);
            let k = _mm_xor_si128(load(keys), flip);
            let x = _mm_xor_si128(_mm_set1_epi8(b as i8), flip);
            _mm_movemask_epi8(_mm_cmplt_epi8(k, x)) as u32
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use std::arch::aarch64::*;

    #[inline]
    fn load(keys: &[u8; 16]) -> uint8x16_t {
        // SAFETY: `keys` is 16 readable bytes; NEON is part of the aarch64 baseline.
        unsafe { vld1q_u8(keys.as_ptr()) }
    }

    /// One bit per lane from a lane-wise all-ones/all-zeros vector.
    #[inline]
    fn movemask(v: uint8x16_t) -> u32 {
        const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        // SAFETY: NEON is part of the aarch64 baseline; BITS is 16 readable bytes.
        unsafe {
            let bits = vandq_u8(v, vld1q_u8(BITS.as_ptr()));
            let lo = vaddv_u8(vget_low_u8(bits)) as u32;
            let hi = vaddv_u8(vget_high_u8(bits)) as u32;
            lo | (hi << 8)
        }
    }

    #[inline]
    pub(super) fn eq_mask(keys: &[u8; 16], b: u8) -> u32 {
        // SAFETY: NEON is part of the aarch64 baseline.
        movemask(unsafe { vceqq_u8(load(keys), vdupq_n_u8(b)) })
    }

    #[inline]
    pub(super) fn lt_mask(keys: &[u8; 16], b: u8) -> u32 {
        // SAFETY: NEON is part of the aarch64 baseline.
        movemask(unsafe { vcltq_u8(load(keys), vdupq_n_u8(b)) })
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    pub(super) fn eq_mask(keys: &[u8; 16], b: u8) -> u32 {
        super::scalar::eq_mask(keys, b)
    }
    pub(super) fn lt_mask(keys: &[u8; 16], b: u8) -> u32 {
        super::scalar::lt_mask(keys, b)
    }
}

/// The portable definition every vector path must agree with.
#[cfg_attr(any(target_arch = "x86_64", target_arch = "aarch64"), allow(dead_code))]
mod scalar {
    pub(super) fn eq_mask(keys: &[u8; 16], b: u8) -> u32 {
        keys.iter()
            .enumerate()
            .fold(0, |m, (i, &k)| m | (u32::from(k == b) << i))
    }
    pub(super) fn lt_mask(keys: &[u8; 16], b: u8) -> u32 {
        keys.iter()
            .enumerate()
            .fold(0, |m, (i, &k)| m | (u32::from(k < b) << i))
    }
}

use imp::{eq_mask, lt_mask};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn simd_masks_match_scalar(keys in proptest::array::uniform16(any::<u8>()), b in any::<u8>()) {
            prop_assert_eq!(eq_mask(&keys, b), scalar::eq_mask(&keys, b));
            prop_assert_eq!(lt_mask(&keys, b), scalar::lt_mask(&keys, b));
        }

        #[test]
        fn simd_search_on_sorted_keys(mut keys in proptest::collection::vec(any::<u8>(), 0..=16), b in any::<u8>()) {
            keys.sort_unstable();
            keys.dedup();
            let len = keys.len();
            let mut arr = [0xAAu8; 16];
            arr[..len].copy_from_slice(&keys);
            prop_assert_eq!(find16(&arr, len, b), keys.iter().position(|&k| k == b));
            prop_assert_eq!(lower_bound16(&arr, len, b), keys.iter().position(|&k| k >= b).unwrap_or(len));
        }
    }
}

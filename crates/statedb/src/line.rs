//! Keeping data that different cores write apart.

/// `T` alone on its own pair of cache lines (Intel's adjacent-line
/// prefetcher fetches lines in 128-byte pairs), so writes to what sits
/// beside it do not take it away from the cores that read it.
#[repr(align(128))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

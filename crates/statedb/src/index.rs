//! Index declarations: a name, uniqueness, and a function from an object to
//! its keys.

use std::borrow::Borrow;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::key::{expand, expand_escaped, expand_fixed, Key, KeyLayout};

/// The encoded keys of one object in one index: one buffer, end offsets.
#[derive(Default, Debug, Clone)]
pub(crate) struct KeyBuf {
    pub(crate) bytes: Vec<u8>,
    pub(crate) ends: SmallVec<[usize; 4]>,
}

impl KeyBuf {
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    pub(crate) fn push<K: Key + ?Sized>(&mut self, k: &K) {
        k.encode(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    #[inline]
    pub(crate) fn get(&self, i: usize) -> &[u8] {
        // One look through the `SmallVec` (each index re-checks whether it
        // spilled).
        let ends = &self.ends[..];
        let start = if i == 0 { 0 } else { ends[i - 1] };
        &self.bytes[start..ends[i]]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).map(|i| self.get(i))
    }

    pub(crate) fn contains(&self, k: &[u8]) -> bool {
        self.iter().any(|x| x == k)
    }
}

thread_local! {
    /// (encoded key, stored key) scratch buffers for point lookups.
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

type KeyFn<T> = dyn Fn(&T, &mut KeyBuf) + Send + Sync;

pub(crate) struct IndexInner<T> {
    pub(crate) name: String,
    pub(crate) unique: bool,
    /// Exactly one key per object (required of primary indexes).
    pub(crate) single: bool,
    pub(crate) keys: Box<KeyFn<T>>,
    /// The key type's [`Key::FAMILY`] and name, for a key given without
    /// the index (`Table::delete_key`).
    pub(crate) key_type: (u64, &'static str),
    /// (table uid, position in the table, the table's key layout) once the
    /// index joins a table.
    pub(crate) slot: OnceLock<(u64, usize, KeyLayout)>,
}

/// An index without its key type: what a table is declared with.
pub struct AnyIndex<T> {
    pub(crate) inner: Arc<IndexInner<T>>,
}

impl<T> Clone for AnyIndex<T> {
    fn clone(&self) -> Self {
        AnyIndex {
            inner: self.inner.clone(),
        }
    }
}

impl<T> std::fmt::Debug for AnyIndex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("name", &self.inner.name)
            .field("unique", &self.inner.unique)
            .finish()
    }
}

impl<T> AnyIndex<T> {
    /// The index's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether each key maps to at most one object.
    pub fn is_unique(&self) -> bool {
        self.inner.unique
    }

    /// Encoded keys of `obj` into `buf` (cleared first).
    pub(crate) fn keys_of(&self, obj: &T, buf: &mut KeyBuf) {
        buf.clear();
        (self.inner.keys)(obj, buf);
    }
}

/// An index of objects `T` by keys `K`: a name, whether it is unique, and a
/// function from an object to its key(s). Cheap to clone; it joins exactly
/// one table.
pub struct Index<T, K> {
    any: AnyIndex<T>,
    _k: PhantomData<fn(&K)>,
}

impl<T, K> Clone for Index<T, K> {
    fn clone(&self) -> Self {
        Index {
            any: self.any.clone(),
            _k: PhantomData,
        }
    }
}

impl<T, K> std::fmt::Debug for Index<T, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.any.fmt(f)
    }
}

impl<T: 'static, K: Key + 'static> Index<T, K> {
    fn build(name: &str, unique: bool, single: bool, keys: Box<KeyFn<T>>) -> Self {
        Index {
            any: AnyIndex {
                inner: Arc::new(IndexInner {
                    name: name.to_string(),
                    unique,
                    single,
                    keys,
                    key_type: (K::FAMILY, std::any::type_name::<K>()),
                    slot: OnceLock::new(),
                }),
            },
            _k: PhantomData,
        }
    }

    /// A unique index with one key per object (what a primary index is).
    pub fn unique(name: &str, f: impl Fn(&T) -> K + Send + Sync + 'static) -> Self {
        Self::build(name, true, true, Box::new(move |o, b| b.push(&f(o))))
    }

    /// A non-unique index with one key per object.
    pub fn non_unique(name: &str, f: impl Fn(&T) -> K + Send + Sync + 'static) -> Self {
        Self::build(name, false, true, Box::new(move |o, b| b.push(&f(o))))
    }

    /// A unique index with any number of keys per object.
    pub fn unique_multi<I>(name: &str, f: impl Fn(&T) -> I + Send + Sync + 'static) -> Self
    where
        I: IntoIterator<Item = K>,
    {
        Self::build(
            name,
            true,
            false,
            Box::new(move |o, b| {
                for k in f(o) {
                    b.push(&k)
                }
            }),
        )
    }

    /// A non-unique index with any number of keys per object.
    pub fn non_unique_multi<I>(name: &str, f: impl Fn(&T) -> I + Send + Sync + 'static) -> Self
    where
        I: IntoIterator<Item = K>,
    {
        Self::build(
            name,
            false,
            false,
            Box::new(move |o, b| {
                for k in f(o) {
                    b.push(&k)
                }
            }),
        )
    }
}

impl<T, K> Index<T, K> {
    /// The index without its key type, to declare a table with.
    pub fn erase(&self) -> AnyIndex<T> {
        self.any.clone()
    }

    /// The index's name.
    pub fn name(&self) -> &str {
        &self.any.inner.name
    }

    /// Whether each key maps to at most one object.
    pub fn is_unique(&self) -> bool {
        self.any.inner.unique
    }

    pub(crate) fn any(&self) -> &AnyIndex<T> {
        &self.any
    }

    /// The stored-key form of a point query: the key itself (unique) or its
    /// escaped, terminated form (non-unique: a prefix of exactly the
    /// entries of this key).
    pub(crate) fn point<Q: Key + ?Sized>(&self, layout: KeyLayout, q: &Q) -> Vec<u8>
    where
        K: Borrow<Q>,
    {
        self.query(layout, q, true)
    }

    /// A query key in stored form; non-unique keys are escaped, and
    /// terminated for point queries (not for prefix queries).
    fn query<Q: Key + ?Sized>(&self, layout: KeyLayout, q: &Q, terminated: bool) -> Vec<u8> {
        let plain = q.to_key();
        let mut out = Vec::with_capacity(plain.len() * 2 + 4);
        self.expand_query(layout, &plain, terminated, &mut out);
        out
    }

    #[inline]
    fn expand_query(&self, layout: KeyLayout, plain: &[u8], terminated: bool, out: &mut Vec<u8>) {
        if self.is_unique() {
            expand(layout, plain, out);
        } else {
            expand_escaped(layout, plain, terminated, out);
        }
    }

    /// The stored-key form of a point query in `out`, if the index is
    /// unique and the key fixed-width: a short key of a unique index is
    /// stored as `expand` makes it, so it is built on the stack.
    #[inline(always)]
    pub(crate) fn fixed_point<'b, Q>(
        &self,
        layout: KeyLayout,
        q: &Q,
        out: &'b mut [u8; 32],
    ) -> Option<&'b [u8]>
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        if !self.is_unique() {
            return None;
        }
        let mut buf = [0u8; 16];
        let n = q.encode_fixed(&mut buf)?;
        Some(expand_fixed(layout, &buf[..n], out))
    }

    /// Runs `f` on the stored-key form of a point query, built in a
    /// per-thread buffer (no allocation on the lookup path).
    #[inline]
    pub(crate) fn with_point<Q, R>(&self, layout: KeyLayout, q: &Q, f: impl FnOnce(&[u8]) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        match self.fixed_point(layout, q, &mut [0u8; 32]) {
            Some(k) => f(k),
            None => self.with_encoded_point(layout, q, f),
        }
    }

    /// [`Index::with_point`] without its fixed-width shortcut: for callers
    /// that already tried [`Index::fixed_point`] (any key works here).
    pub(crate) fn with_encoded_point<Q, R>(
        &self,
        layout: KeyLayout,
        q: &Q,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Key + ?Sized,
    {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut bufs) => {
                let (raw, out) = &mut *bufs;
                raw.clear();
                q.encode(raw);
                // A unique key in the bytes layout is stored as encoded.
                if layout == KeyLayout::Bytes && self.is_unique() {
                    return f(raw);
                }
                out.clear();
                self.expand_query(layout, raw, true, out);
                f(out)
            }
            // Re-entered (a key encoder that queries): allocate instead.
            Err(_) => f(&self.point(layout, q)),
        })
    }

    /// The stored-key form of a prefix query.
    pub(crate) fn prefix<Q: Key + ?Sized>(&self, layout: KeyLayout, q: &Q) -> Vec<u8>
    where
        K: Borrow<Q>,
    {
        self.query(layout, q, false)
    }
}

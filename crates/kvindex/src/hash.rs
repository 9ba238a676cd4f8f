//! Block hashing, compatible with NVIDIA Dynamo's kv-router.
//!
//! * A **local block hash** is XXH3-64 over the block's token ids written as
//!   little-endian `u32` bytes, with seed [`XXH3_SEED`] (1337). Only full
//!   blocks are hashed; a trailing partial block is ignored.
//! * A LoRA adapter name (or a cache salt) folds into the seed: the seed
//!   becomes `1337.wrapping_add(xxh3_64(name))`, exactly as Dynamo's
//!   `compute_block_hash_for_seq` does for `lora_name`. An empty name is the
//!   same as no name. [`BlockSalt`] can carry both a LoRA name and a separate
//!   cache salt; the cache salt adds `xxh3_64_with_seed(salt, 1)`, as Dynamo's
//!   `compute_salt_hash` does.
//! * A **sequence hash** chains a block to its prefix: the first block's
//!   sequence hash is its local hash, every later one is XXH3-64 (seed 1337)
//!   over the 16 bytes `parent_sequence_hash.to_le_bytes() ++
//!   local_hash.to_le_bytes()`.
//! * Engine ("external") block hashes are opaque `u64` ids ([`ExternalHash`]).
//!
//! Cross-checks: the unit tests pin values computed with Python's `xxhash`
//! (the C reference implementation), and `benches-peers/dynamo-crtc` checks
//! block and sequence hashes, with LoRA names and cache salts, against
//! `dynamo-kv-router` 1.6.1's own `compute_block_hash_for_seq` and
//! `compute_seq_hash_for_block`.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Seed Dynamo uses for every XXH3 block and sequence hash.
pub const XXH3_SEED: u64 = 1337;

/// Position-independent hash of one full block of tokens (the router's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalHash(pub u64);

/// Opaque block id published by an engine (usually its own sequence hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExternalHash(pub u64);

/// Optional per-request inputs that isolate cache entries: a LoRA adapter
/// name and a cache salt. Both default to "none".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockSalt<'a> {
    /// LoRA adapter name (Dynamo's `lora_name`).
    pub lora_name: Option<&'a str>,
    /// Cache salt / namespace (Dynamo's `cache_salt`).
    pub cache_salt: Option<&'a str>,
}

impl BlockSalt<'_> {
    /// The XXH3 seed for block hashes under this salt.
    pub fn seed(&self) -> u64 {
        let mut seed = XXH3_SEED;
        if let Some(name) = self.lora_name.filter(|n| !n.is_empty()) {
            seed = seed.wrapping_add(xxh3_64(name.as_bytes()));
        }
        if let Some(salt) = self.cache_salt.filter(|s| !s.is_empty()) {
            seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
        }
        seed
    }
}

/// Hashes one block of token ids with the given seed.
pub fn hash_block(tokens: &[u32], seed: u64) -> LocalHash {
    let mut bytes = [0u8; 256];
    if tokens.len() * 4 <= bytes.len() {
        for (dst, t) in bytes.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        LocalHash(xxh3_64_with_seed(&bytes[..tokens.len() * 4], seed))
    } else {
        let v: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        LocalHash(xxh3_64_with_seed(&v, seed))
    }
}

/// Local hashes of every full block of `tokens` (a trailing partial block is
/// ignored). `salt` is a LoRA name in Dynamo's sense; `None` and `Some("")`
/// give the plain seed 1337. A `block_size` of 0 yields no blocks.
pub fn local_block_hashes(tokens: &[u32], block_size: usize, salt: Option<&str>) -> Vec<LocalHash> {
    local_block_hashes_salted(
        tokens,
        block_size,
        BlockSalt {
            lora_name: salt,
            cache_salt: None,
        },
    )
}

/// Like [`local_block_hashes`] with both a LoRA name and a cache salt.
pub fn local_block_hashes_salted(
    tokens: &[u32],
    block_size: usize,
    salt: BlockSalt<'_>,
) -> Vec<LocalHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let seed = salt.seed();
    tokens
        .chunks_exact(block_size)
        .map(|chunk| hash_block(chunk, seed))
        .collect()
}

/// Sequence hash of a block whose parent has sequence hash `parent`.
pub fn next_sequence_hash(parent: u64, local: LocalHash) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&local.0.to_le_bytes());
    xxh3_64_with_seed(&bytes, XXH3_SEED)
}

/// Chained sequence hashes (Dynamo's `compute_seq_hash_for_block`): the first
/// equals the first local hash, each later one hashes its parent's sequence
/// hash with its own local hash.
pub fn sequence_hashes(locals: &[LocalHash]) -> Vec<u64> {
    let mut out = Vec::with_capacity(locals.len());
    let mut prev: Option<u64> = None;
    for &l in locals {
        let h = match prev {
            None => l.0,
            Some(p) => next_sequence_hash(p, l),
        };
        out.push(h);
        prev = Some(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition written out the slow way, as Dynamo publishes it.
    fn dynamo_block(tokens: &[u32], seed: u64) -> u64 {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed)
    }

    #[test]
    fn full_blocks_only_and_zero_block_size() {
        let toks: Vec<u32> = (0..10).collect();
        assert_eq!(local_block_hashes(&toks, 4, None).len(), 2);
        assert!(local_block_hashes(&toks, 0, None).is_empty());
        assert!(local_block_hashes(&toks, 11, None).is_empty());
        assert_eq!(local_block_hashes(&toks, 10, None).len(), 1);
    }

    #[test]
    fn matches_published_definition_for_many_block_sizes() {
        let toks: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(2654435761)).collect();
        for bs in [1usize, 2, 3, 16, 32, 63, 64, 65, 100] {
            let got = local_block_hashes(&toks, bs, None);
            let want: Vec<u64> = toks
                .chunks_exact(bs)
                .map(|c| dynamo_block(c, 1337))
                .collect();
            assert_eq!(got.iter().map(|h| h.0).collect::<Vec<_>>(), want, "bs={bs}");
        }
    }

    #[test]
    fn fixed_vectors() {
        // Pinned values, cross-checked independently with Python's `xxhash`
        // package (the C reference implementation):
        //   xxh3_64_intdigest(struct.pack('<4I', 1, 2, 3, 4), seed=1337)
        //   xxh3_64_intdigest(struct.pack('<2Q', s0, xxh3(<5,6,7,8>)), seed=1337)
        let h = local_block_hashes(&[1, 2, 3, 4], 4, None);
        assert_eq!(h[0].0, dynamo_block(&[1, 2, 3, 4], 1337));
        assert_eq!(h[0].0, PINNED_1234);
        let s = sequence_hashes(&local_block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4, None));
        assert_eq!(s[0], PINNED_1234);
        assert_eq!(s[1], PINNED_SEQ_5678);
    }

    const PINNED_1234: u64 = 14643705804678351452;
    const PINNED_SEQ_5678: u64 = 4945711292740353085;

    #[test]
    fn lora_and_salt_fold_into_seed() {
        let toks: Vec<u32> = (0..32).collect();
        let plain = local_block_hashes(&toks, 16, None);
        assert_eq!(plain, local_block_hashes(&toks, 16, Some("")));
        let lora = local_block_hashes(&toks, 16, Some("adapter-a"));
        assert_ne!(plain, lora);
        let seed = 1337u64.wrapping_add(xxh3_64(b"adapter-a"));
        assert_eq!(lora[0].0, dynamo_block(&toks[..16], seed));
        let salted = local_block_hashes_salted(
            &toks,
            16,
            BlockSalt {
                lora_name: None,
                cache_salt: Some("tenant"),
            },
        );
        let seed = 1337u64.wrapping_add(xxh3_64_with_seed(b"tenant", 1));
        assert_eq!(salted[0].0, dynamo_block(&toks[..16], seed));
        assert_ne!(salted, lora);
    }

    #[test]
    fn sequence_chain_definition() {
        let locals = [LocalHash(7), LocalHash(9), LocalHash(11)];
        let s = sequence_hashes(&locals);
        assert_eq!(s[0], 7);
        let b: Vec<u8> = [7u64, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(s[1], xxh3_64_with_seed(&b, 1337));
        let b: Vec<u8> = [s[1], 11].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(s[2], xxh3_64_with_seed(&b, 1337));
        assert!(sequence_hashes(&[]).is_empty());
    }
}

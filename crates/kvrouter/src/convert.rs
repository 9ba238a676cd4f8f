//! From the engine's events to the index's: recompute each block's local
//! hash from its tokens, check the block size, filter by storage tier.
use kvindex::{
    local_block_hashes, ExternalHash, KvEvent, KvEventData, LocalHash, StoredBlock, WorkerKey,
};

use crate::wire::WireEvent;

/// Why an engine event does not enter the index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The event's block size is not the one the worker registered with.
    #[error("block_size {got} in an event, but the worker registered block size {want}")]
    BlockSize {
        /// Registered.
        want: u64,
        /// In the event.
        got: u64,
    },
    /// Token count and block count disagree.
    #[error("{tokens} token ids for {blocks} blocks of {block_size}")]
    TokenCount {
        /// Token ids in the event.
        tokens: usize,
        /// Block hashes in the event.
        blocks: usize,
        /// Tokens per block.
        block_size: u64,
    },
    /// The event could not be decoded.
    #[error("malformed event: {0}")]
    Malformed(String),
}

/// What became of one engine event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It maps to this index event.
    Index(KvEventData),
    /// Blocks on a tier the index does not track.
    OtherTier,
    /// An event kind this router does not know.
    Unknown,
    /// Rejected.
    Rejected(Rejected),
}

/// Converts engine events for one worker.
#[derive(Debug, Clone)]
pub struct Converter {
    /// The worker's registered block size.
    pub block_size: u64,
    /// Storage tiers (upper case) that enter the index besides GPU.
    pub extra_media: Vec<String>,
    /// Token ids one event may carry.
    pub max_tokens: usize,
}

impl Converter {
    fn tier_tracked(&self, medium: Option<&str>) -> bool {
        match medium {
            None => true,
            Some(m) => {
                m.eq_ignore_ascii_case("gpu")
                    || self.extra_media.iter().any(|x| m.eq_ignore_ascii_case(x))
            }
        }
    }

    /// Maps one event.
    pub fn convert(&self, ev: &WireEvent) -> Outcome {
        match ev {
            WireEvent::Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                medium,
                lora_name,
            } => {
                if *block_size != self.block_size {
                    return Outcome::Rejected(Rejected::BlockSize {
                        want: self.block_size,
                        got: *block_size,
                    });
                }
                if token_ids.len() > self.max_tokens {
                    return Outcome::Rejected(Rejected::Malformed(format!(
                        "{} token ids, over the limit of {}",
                        token_ids.len(),
                        self.max_tokens
                    )));
                }
                if (token_ids.len() as u64) != block_hashes.len() as u64 * self.block_size {
                    return Outcome::Rejected(Rejected::TokenCount {
                        tokens: token_ids.len(),
                        blocks: block_hashes.len(),
                        block_size: self.block_size,
                    });
                }
                if !self.tier_tracked(medium.as_deref()) {
                    return Outcome::OtherTier;
                }
                let locals: Vec<LocalHash> =
                    local_block_hashes(token_ids, self.block_size as usize, lora_name.as_deref());
                let blocks = block_hashes
                    .iter()
                    .zip(locals)
                    .map(|(&e, local)| StoredBlock {
                        external: ExternalHash(e),
                        local,
                    })
                    .collect();
                Outcome::Index(KvEventData::Stored {
                    parent: parent.map(ExternalHash),
                    blocks,
                })
            }
            WireEvent::Removed {
                block_hashes,
                medium,
            } => {
                if !self.tier_tracked(medium.as_deref()) {
                    return Outcome::OtherTier;
                }
                Outcome::Index(KvEventData::Removed {
                    hashes: block_hashes.iter().map(|&h| ExternalHash(h)).collect(),
                })
            }
            WireEvent::Cleared => Outcome::Index(KvEventData::Cleared),
            WireEvent::Unknown { .. } => Outcome::Unknown,
            WireEvent::Invalid { reason } => Outcome::Rejected(Rejected::Malformed(reason.clone())),
        }
    }
}

/// Numbers a worker's index events consecutively, as the index expects.
#[derive(Debug, Default, Clone)]
pub struct EventIds {
    next: u64,
}

impl EventIds {
    /// Numbering from `n`.
    pub fn starting_at(n: u64) -> Self {
        Self { next: n }
    }

    /// Wraps `data` as the worker's next event.
    pub fn event(&mut self, worker: WorkerKey, data: KvEventData) -> KvEvent {
        let event_id = self.next;
        self.next += 1;
        KvEvent {
            worker,
            event_id,
            data,
        }
    }

    /// Starts over (the index forgot the worker).
    pub fn reset(&mut self) {
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Converter {
        Converter {
            block_size: 2,
            extra_media: vec![],
            max_tokens: 100,
        }
    }

    fn stored(bs: u64, toks: Vec<u32>, medium: Option<&str>) -> WireEvent {
        WireEvent::Stored {
            block_hashes: vec![10, 11],
            parent: Some(9),
            token_ids: toks,
            block_size: bs,
            medium: medium.map(str::to_string),
            lora_name: Some("ad".into()),
        }
    }

    #[test]
    fn stored_blocks_are_rehashed_from_their_tokens() {
        let Outcome::Index(KvEventData::Stored { parent, blocks }) =
            conv().convert(&stored(2, vec![1, 2, 3, 4], Some("GPU")))
        else {
            panic!()
        };
        assert_eq!(parent, Some(ExternalHash(9)));
        let want = local_block_hashes(&[1, 2, 3, 4], 2, Some("ad"));
        assert_eq!(blocks.iter().map(|b| b.local).collect::<Vec<_>>(), want);
        assert_eq!(blocks[1].external, ExternalHash(11));
    }

    #[test]
    fn mismatches_tiers_and_limits() {
        let c = conv();
        assert_eq!(
            c.convert(&stored(4, vec![0; 8], None)),
            Outcome::Rejected(Rejected::BlockSize { want: 2, got: 4 })
        );
        assert!(matches!(
            c.convert(&stored(2, vec![0; 3], None)),
            Outcome::Rejected(Rejected::TokenCount { .. })
        ));
        assert!(matches!(
            c.convert(&stored(2, vec![0; 102], None)),
            Outcome::Rejected(Rejected::Malformed(_))
        ));
        assert_eq!(
            c.convert(&stored(2, vec![0; 4], Some("CPU"))),
            Outcome::OtherTier
        );
        let with_cpu = Converter {
            extra_media: vec!["cpu".into()],
            ..conv()
        };
        assert!(matches!(
            with_cpu.convert(&stored(2, vec![0; 4], Some("CPU"))),
            Outcome::Index(_)
        ));
        assert_eq!(
            c.convert(&WireEvent::Unknown { kind: "X".into() }),
            Outcome::Unknown
        );
    }
}

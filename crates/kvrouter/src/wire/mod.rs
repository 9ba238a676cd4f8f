//! The engines' wire format: msgpack `KVEventBatch` payloads as vLLM and
//! SGLang publish them.
//!
//! A batch's envelope is `[ts, events, data_parallel_rank]`, the older
//! two-element `[ts, events]`, or a map with those names (SGLang says
//! `attn_dp_rank`). Each event is a tagged map (`{"type": "BlockStored",
//! "block_hashes": ..}`, current vLLM) or a tagged array (`["BlockStored",
//! block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//! lora_name, extra_keys, ..]`, older vLLM and SGLang, which stops after
//! `lora_id`). Unknown keys and trailing fields are ignored; unknown kinds
//! decode as [`WireEvent::Unknown`].
//!
//! Block hashes are msgpack integers (unsigned from vLLM, signed from
//! SGLang: both become the same 64 bits) or byte strings (vLLM's 16- or
//! 32-byte digests), which fold to 64 bits with XXH3.
//!
//! One malformed event does not sink its batch: it decodes as
//! [`WireEvent::Invalid`] and the rest stand. A malformed envelope is a
//! [`WireError`].
/// Deepest nesting a batch may have (envelope, events, event, fields, and
/// `extra_keys`' tuples). Deeper input is rejected, not recursed into.
const MAX_DEPTH: usize = 16;

mod decode;
pub mod reference;

pub use decode::decode_batch;

/// A decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The engine's timestamp, seconds since the epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<WireEvent>,
    /// The data-parallel rank the envelope names, if any.
    pub dp_rank: Option<i64>,
}

/// One event as the engine described it.
#[derive(Debug, Clone, PartialEq)]
pub enum WireEvent {
    /// Blocks were stored, parent first.
    Stored {
        /// The engine's block hashes, one per block.
        block_hashes: Vec<u64>,
        /// The engine hash of the first block's parent.
        parent: Option<u64>,
        /// The tokens of all the blocks, `block_size` per block.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u64,
        /// Where the blocks live (`GPU`, `CPU`, ...); absent means GPU.
        medium: Option<String>,
        /// The LoRA adapter the blocks were computed under.
        lora_name: Option<String>,
    },
    /// Blocks were evicted.
    Removed {
        /// The engine's hashes of the evicted blocks.
        block_hashes: Vec<u64>,
        /// Where they were evicted from; absent means GPU.
        medium: Option<String>,
    },
    /// The engine dropped its whole cache.
    Cleared,
    /// An event kind this router does not know; skipped.
    Unknown {
        /// Its tag.
        kind: String,
    },
    /// An event that could not be decoded; skipped.
    Invalid {
        /// Why.
        reason: String,
    },
}

/// Why a payload is not a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not msgpack, truncated, trailing bytes, or nested too deep.
    #[error("payload is not a msgpack value: {0}")]
    Msgpack(String),
    /// Msgpack, but not a batch envelope.
    #[error("payload is not an event batch: {0}")]
    Envelope(&'static str),
}

/// Encodes a batch as vLLM publishes it (array-like envelope and events,
/// integer hashes), for test and benchmark publishers. `Unknown` and
/// `Invalid` events are left out.
pub fn encode_batch(ts: f64, events: &[WireEvent], dp_rank: Option<i64>) -> Vec<u8> {
    use rmpv::Value;
    let opt = |s: &Option<String>| s.as_deref().map_or(Value::Nil, Value::from);
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&x| Value::from(x)).collect());
    let evs = events
        .iter()
        .filter_map(|e| {
            Some(match e {
                WireEvent::Stored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    medium,
                    lora_name,
                } => Value::Array(vec![
                    Value::from("BlockStored"),
                    hashes(block_hashes),
                    parent.map_or(Value::Nil, Value::from),
                    Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                    Value::from(*block_size),
                    Value::Nil,
                    opt(medium),
                    opt(lora_name),
                ]),
                WireEvent::Removed {
                    block_hashes,
                    medium,
                } => Value::Array(vec![
                    Value::from("BlockRemoved"),
                    hashes(block_hashes),
                    opt(medium),
                ]),
                WireEvent::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
                WireEvent::Unknown { .. } | WireEvent::Invalid { .. } => return None,
            })
        })
        .collect();
    let env = Value::Array(vec![
        Value::F64(ts),
        Value::Array(evs),
        dp_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut out = Vec::new();
    // Writing to a vector cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &env);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn stored_array(hashes: Vec<Value>, parent: Value) -> Value {
        Value::Array(vec![
            s("BlockStored"),
            Value::Array(hashes),
            parent,
            Value::Array((0..8u32).map(Value::from).collect()),
            Value::from(4),
            Value::Nil,
            s("GPU"),
            Value::Nil,
            Value::Nil,
            Value::from(0), // group_idx tail: ignored
        ])
    }

    #[test]
    fn array_envelope_and_array_events() {
        let b = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                stored_array(vec![Value::from(7u64), Value::from(u64::MAX)], Value::Nil),
                Value::Array(vec![
                    s("BlockRemoved"),
                    Value::Array(vec![Value::from(-1i64)]),
                ]),
                Value::Array(vec![s("AllBlocksCleared")]),
                Value::Array(vec![s("SomethingNew"), Value::from(1)]),
            ]),
            Value::from(2),
        ]);
        let got = decode_batch(&enc(&b)).unwrap();
        assert_eq!(got.ts, 1.5);
        assert_eq!(got.dp_rank, Some(2));
        assert_eq!(
            got.events,
            vec![
                WireEvent::Stored {
                    block_hashes: vec![7, u64::MAX],
                    parent: None,
                    token_ids: (0..8).collect(),
                    block_size: 4,
                    medium: Some("GPU".into()),
                    lora_name: None,
                },
                WireEvent::Removed {
                    block_hashes: vec![u64::MAX],
                    medium: None
                },
                WireEvent::Cleared,
                WireEvent::Unknown {
                    kind: "SomethingNew".into()
                },
            ]
        );
    }

    #[test]
    fn map_envelope_map_events_and_sglang_short_arrays() {
        let ev = Value::Map(vec![
            (s("type"), s("BlockStored")),
            (
                s("token_ids"),
                Value::Array(vec![Value::from(1), Value::from(2)]),
            ),
            (
                s("block_hashes"),
                Value::Array(vec![Value::Binary(vec![9; 32])]),
            ),
            (s("parent_block_hash"), Value::Binary(vec![8; 16])),
            (s("block_size"), Value::from(2)),
            (s("lora_name"), s("ad")),
            (s("unheard_of"), Value::from(true)),
        ]);
        let sglang = Value::Array(vec![
            s("BlockStored"),
            Value::Array(vec![Value::from(-5i64)]),
            Value::from(-6i64),
            Value::Array(vec![Value::from(3), Value::from(4)]),
            Value::from(2),
            Value::Nil,
        ]);
        let b = Value::Map(vec![
            (s("ts"), Value::from(3)),
            (s("events"), Value::Array(vec![ev, sglang])),
            (s("attn_dp_rank"), Value::from(1)),
        ]);
        let got = decode_batch(&enc(&b)).unwrap();
        assert_eq!(got.dp_rank, Some(1));
        assert_eq!(
            got.events[0],
            WireEvent::Stored {
                block_hashes: vec![xxhash_rust::xxh3::xxh3_64(&[9; 32])],
                parent: Some(xxhash_rust::xxh3::xxh3_64(&[8; 16])),
                token_ids: vec![1, 2],
                block_size: 2,
                medium: None,
                lora_name: Some("ad".into()),
            }
        );
        assert_eq!(
            got.events[1],
            WireEvent::Stored {
                block_hashes: vec![-5i64 as u64],
                parent: Some(-6i64 as u64),
                token_ids: vec![3, 4],
                block_size: 2,
                medium: None,
                lora_name: None,
            }
        );
        // The legacy two-element envelope.
        let legacy = Value::Array(vec![Value::F64(0.0), Value::Array(vec![])]);
        assert_eq!(decode_batch(&enc(&legacy)).unwrap().dp_rank, None);
    }

    #[test]
    fn bad_events_are_invalid_and_the_rest_stand() {
        let b = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![
                Value::from(3),
                Value::Array(vec![]),
                Value::Array(vec![Value::from(1)]),
                stored_array(vec![s("x")], Value::Nil),
                stored_array(vec![Value::Binary(vec![])], Value::Nil),
                Value::Array(vec![s("BlockRemoved"), Value::Array(vec![Value::F64(1.0)])]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
        ]);
        let got = decode_batch(&enc(&b)).unwrap();
        assert_eq!(got.events.len(), 7);
        for e in &got.events[..6] {
            assert!(matches!(e, WireEvent::Invalid { .. }), "{e:?}");
        }
        assert_eq!(got.events[6], WireEvent::Cleared);
    }

    #[test]
    fn encoded_batches_decode_to_themselves() {
        let evs = vec![
            WireEvent::Stored {
                block_hashes: vec![1, u64::MAX],
                parent: Some(7),
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                medium: Some("GPU".into()),
                lora_name: Some("a".into()),
            },
            WireEvent::Removed {
                block_hashes: vec![1],
                medium: None,
            },
            WireEvent::Cleared,
        ];
        let b = decode_batch(&encode_batch(2.5, &evs, Some(3))).unwrap();
        assert_eq!((b.ts, b.events, b.dp_rank), (2.5, evs, Some(3)));
    }

    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Nil),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (0u32..300).prop_map(Value::from),
            any::<f64>().prop_map(Value::F64),
            any::<f32>().prop_map(Value::F32),
            prop::sample::select(vec![
                "BlockStored",
                "BlockRemoved",
                "AllBlocksCleared",
                "Other",
                "type",
                "ts",
                "events",
                "attn_dp_rank",
                "data_parallel_rank",
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "medium",
                "lora_name",
                "GPU",
            ])
            .prop_map(Value::from),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
            proptest::collection::vec(any::<u8>(), 0..3).prop_map(|b| Value::String(
                rmpv::Utf8String::from(String::from_utf8_lossy(&b).into_owned())
            )),
            (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..5))
                .prop_map(|(t, d)| Value::Ext(t, d)),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 48, 10, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..10).prop_map(Value::Array),
                proptest::collection::vec((inner.clone(), inner), 0..6).prop_map(Value::Map),
            ]
        })
    }

    fn event() -> impl Strategy<Value = Value> {
        (
            prop::sample::select(vec!["BlockStored", "BlockRemoved", "AllBlocksCleared", "X"]),
            proptest::collection::vec(value(), 0..9),
            any::<bool>(),
        )
            .prop_map(|(tag, fields, as_map)| {
                let names = [
                    "block_hashes",
                    "parent_block_hash",
                    "token_ids",
                    "block_size",
                    "lora_id",
                    "medium",
                    "lora_name",
                    "extra_keys",
                ];
                if as_map {
                    let mut m = vec![(Value::from("type"), Value::from(tag))];
                    m.extend(names.iter().zip(fields).map(|(n, v)| (Value::from(*n), v)));
                    Value::Map(m)
                } else {
                    let mut a = vec![Value::from(tag)];
                    a.extend(fields);
                    Value::Array(a)
                }
            })
    }

    proptest! {
        /// The fast decoder answers as the decoder over `rmpv` values does,
        /// on batch-shaped input and on anything else.
        #[test]
        fn equals_the_reference(
            events in proptest::collection::vec(prop_oneof![event(), value()], 0..6),
            ts in value(),
            rank in value(),
            shape in 0u8..4,
            noise in value(),
        ) {
            let env = match shape {
                0 => Value::Array(vec![ts, Value::Array(events), rank]),
                1 => Value::Array(vec![Value::F64(1.0), Value::Array(events)]),
                2 => Value::Map(vec![
                    (Value::from("events"), Value::Array(events)),
                    (Value::from("ts"), ts),
                    (Value::from("attn_dp_rank"), rank),
                ]),
                _ => noise,
            };
            let b = enc(&env);
            let fast = decode_batch(&b);
            let slow = reference::decode_batch(&b);
            match (fast, slow) {
                (Ok(f), Ok(s)) => {
                    prop_assert_eq!(f.events, s.events);
                    prop_assert_eq!(f.dp_rank, s.dp_rank);
                    prop_assert!(f.ts == s.ts || (f.ts.is_nan() && s.ts.is_nan()));
                }
                (f, s) => prop_assert_eq!(f.is_ok(), s.is_ok(), "{:?} vs {:?}", f, s),
            }
            // Truncations and a flipped byte agree on success too.
            for cut in [b.len() / 2, b.len().saturating_sub(1)] {
                prop_assert_eq!(decode_batch(&b[..cut]).is_ok(), reference::decode_batch(&b[..cut]).is_ok());
            }
        }
    }

    proptest! {
        /// Token arrays, read in one pass where every id is a small
        /// unsigned integer and by the general path otherwise, decode as
        /// the oracle decodes them.
        #[test]
        fn token_arrays_equal_the_reference(
            tokens in proptest::collection::vec(prop_oneof![
                4 => (0u64..128).prop_map(Value::from),
                2 => (128u64..1 << 32).prop_map(Value::from),
                1 => any::<u64>().prop_map(Value::from),
                1 => (-200i64..0).prop_map(Value::from),
                1 => Just(Value::Nil),
            ], 0..40),
            as_map in any::<bool>(),
            wrap in 0usize..3,
        ) {
            let n = tokens.len() as u64;
            let mut toks = Value::Array(tokens);
            for _ in 0..wrap {
                toks = Value::Array(vec![toks]);
            }
            let hashes = Value::Array((0..n / 4).map(Value::from).collect());
            let ev = if as_map {
                Value::Map(vec![
                    (Value::from("type"), Value::from("BlockStored")),
                    (Value::from("block_hashes"), hashes),
                    (Value::from("token_ids"), toks),
                    (Value::from("block_size"), Value::from(4)),
                ])
            } else {
                Value::Array(vec![Value::from("BlockStored"), hashes, Value::Nil, toks, Value::from(4)])
            };
            // Nested under the envelope at the depth limit's edge too.
            let mut events = Value::Array(vec![ev]);
            for _ in 0..wrap {
                events = Value::Array(vec![Value::Nil, events]);
            }
            let b = enc(&Value::Array(vec![Value::F64(1.0), events]));
            let fast = decode_batch(&b);
            let slow = reference::decode_batch(&b);
            match (fast, slow) {
                (Ok(f), Ok(s)) => prop_assert_eq!(f.events, s.events),
                (f, s) => prop_assert_eq!(f.is_ok(), s.is_ok(), "{:?} vs {:?}", f, s),
            }
        }
    }

    /// One integer in the msgpack form `form` picks (the minimal one or a
    /// wider one, both valid), or another value's marker.
    fn int_in_form(v: u64, form: u8) -> Vec<u8> {
        match form {
            0 if v < 0x80 => vec![v as u8],
            1 if v <= 0xff => vec![0xcc, v as u8],
            2 if v <= 0xffff => [&[0xcd][..], &(v as u16).to_be_bytes()].concat(),
            3 if v <= 0xffff_ffff => [&[0xce][..], &(v as u32).to_be_bytes()].concat(),
            4 => [&[0xcf][..], &v.to_be_bytes()].concat(),
            5 => [&[0xd3][..], &v.to_be_bytes()].concat(),
            6 => vec![0xff],          // -1
            7 => vec![0xc0],          // nil
            8 => vec![0xc4, 1, 0xab], // a one-byte bin
            _ => rmp_value(v),
        }
    }

    fn rmp_value(v: u64) -> Vec<u8> {
        enc(&Value::from(v))
    }

    proptest! {
        /// Token ids and block hashes in every integer form, minimal or
        /// not, with other values among them, decode as the oracle decodes
        /// them, whole and cut anywhere (the bulk readers stop 8 bytes
        /// before the end and at any other marker).
        #[test]
        fn integers_in_every_form_equal_the_reference(
            tokens in proptest::collection::vec((any::<u64>(), 0u8..10), 0..40),
            hashes in proptest::collection::vec((any::<u64>(), 0u8..10), 0..12),
            small in any::<bool>(),
        ) {
            let arr = |xs: &[(u64, u8)], small: bool| {
                let mut b = vec![0xdc];
                b.extend((xs.len() as u16).to_be_bytes());
                for &(v, f) in xs {
                    b.extend(int_in_form(if small { v % 150_000 } else { v }, f));
                }
                b
            };
            // ["BlockStored", hashes, nil, tokens, 4] in a batch.
            let mut b = vec![0x92, 0xcb];
            b.extend(1.0f64.to_be_bytes());
            b.extend([0x91, 0x95]);
            b.extend(enc(&Value::from("BlockStored")));
            b.extend(arr(&hashes, false));
            b.push(0xc0);
            b.extend(arr(&tokens, small));
            b.push(0x04);
            for cut in (0..=b.len()).rev() {
                let (fast, slow) = (decode_batch(&b[..cut]), reference::decode_batch(&b[..cut]));
                match (fast, slow) {
                    (Ok(f), Ok(s)) => prop_assert_eq!(f.events, s.events),
                    (f, s) => prop_assert_eq!(f.is_ok(), s.is_ok(), "{:?} vs {:?}", f, s),
                }
            }
        }
    }

    #[test]
    fn bad_envelopes_are_errors() {
        let cases = [
            vec![],
            vec![0xc1],                         // never-used marker
            vec![0x92, 0xcb],                   // truncated float
            vec![0xdd, 0xff, 0xff, 0xff, 0xff], // a 4G-element array with nothing in it
            enc(&Value::from(1)),
            enc(&Value::Array(vec![Value::F64(0.0)])),
            enc(&Value::Array(vec![s("t"), Value::Array(vec![])])),
            enc(&Value::Array(vec![Value::F64(0.0), Value::from(1)])),
            enc(&Value::Array(vec![
                Value::F64(0.0),
                Value::Array(vec![]),
                s("r"),
            ])),
            enc(&Value::Map(vec![(s("events"), Value::Array(vec![]))])),
        ];
        for c in cases {
            assert!(decode_batch(&c).is_err(), "{c:?}");
        }
        let mut two = enc(&Value::Array(vec![Value::F64(0.0), Value::Array(vec![])]));
        two.push(0xc0);
        assert!(decode_batch(&two).is_err());
        // Nesting past the limit is refused, not recursed into.
        let mut deep = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
        deep.extend(std::iter::repeat_n(0x91, 10_000));
        deep.push(0xc0);
        assert!(decode_batch(&deep).is_err());
    }
}

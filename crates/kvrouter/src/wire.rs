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
use rmpv::ValueRef;

/// Deepest nesting a batch may have (envelope, events, event, fields, and
/// `extra_keys`' tuples). Deeper input is rejected, not recursed into.
const MAX_DEPTH: usize = 16;

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

/// Decodes one `KVEventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value_ref_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| WireError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(WireError::Msgpack(format!(
            "{} bytes after the batch",
            rd.len()
        )));
    }
    let (ts, events, rank) = match &v {
        ValueRef::Array(a) => {
            if a.len() < 2 {
                return Err(WireError::Envelope("an envelope array needs [ts, events]"));
            }
            (&a[0], &a[1], a.get(2))
        }
        ValueRef::Map(m) => {
            let ts = field(m, &["ts"]).ok_or(WireError::Envelope("no \"ts\""))?;
            let ev = field(m, &["events"]).ok_or(WireError::Envelope("no \"events\""))?;
            (
                ts,
                ev,
                field(m, &["data_parallel_rank", "attn_dp_rank", "dp_rank"]),
            )
        }
        _ => return Err(WireError::Envelope("neither an array nor a map")),
    };
    let ts = as_f64(ts).ok_or(WireError::Envelope("ts is not a number"))?;
    let ValueRef::Array(events) = events else {
        return Err(WireError::Envelope("events is not an array"));
    };
    let dp_rank = match rank {
        None | Some(ValueRef::Nil) => None,
        Some(r) => Some(as_i64(r).ok_or(WireError::Envelope("the rank is not an integer"))?),
    };
    Ok(Batch {
        ts,
        events: events.iter().map(decode_event).collect(),
        dp_rank,
    })
}

fn field<'v, 'a>(
    m: &'v [(ValueRef<'a>, ValueRef<'a>)],
    names: &[&str],
) -> Option<&'v ValueRef<'a>> {
    m.iter().find_map(|(k, v)| match k {
        ValueRef::String(s) if s.as_str().is_some_and(|s| names.contains(&s)) => Some(v),
        _ => None,
    })
}

fn as_f64(v: &ValueRef<'_>) -> Option<f64> {
    match v {
        ValueRef::F64(f) => Some(*f),
        ValueRef::F32(f) => Some(f64::from(*f)),
        ValueRef::Integer(i) => i.as_f64(),
        _ => None,
    }
}

fn as_i64(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Integer(i) => i.as_i64(),
        _ => None,
    }
}

/// A block hash: 64-bit integers as their bits, byte digests folded.
fn as_hash(v: &ValueRef<'_>) -> Result<u64, String> {
    match v {
        ValueRef::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|s| s as u64))
            .ok_or_else(|| "block hash out of 64-bit range".to_string()),
        ValueRef::Binary(b) if !b.is_empty() => Ok(xxhash_rust::xxh3::xxh3_64(b)),
        _ => Err(format!("block hash is {}", kind_of(v))),
    }
}

fn kind_of(v: &ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Nil => "nil",
        ValueRef::Boolean(_) => "a boolean",
        ValueRef::Integer(_) => "an integer",
        ValueRef::F32(_) | ValueRef::F64(_) => "a float",
        ValueRef::String(_) => "a string",
        ValueRef::Binary([]) => "empty bytes",
        ValueRef::Binary(_) => "bytes",
        ValueRef::Array(_) => "an array",
        ValueRef::Map(_) => "a map",
        ValueRef::Ext(..) => "an extension",
    }
}

fn hashes(v: Option<&ValueRef<'_>>, what: &str) -> Result<Vec<u64>, String> {
    match v {
        Some(ValueRef::Array(a)) => a.iter().map(as_hash).collect(),
        Some(other) => Err(format!("{what} is {}", kind_of(other))),
        None => Err(format!("no {what}")),
    }
}

fn opt_hash(v: Option<&ValueRef<'_>>) -> Result<Option<u64>, String> {
    match v {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(h) => as_hash(h).map(Some),
    }
}

fn opt_str(v: Option<&ValueRef<'_>>, what: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(ValueRef::Nil) => Ok(None),
        Some(ValueRef::String(s)) => s
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| format!("{what} is not UTF-8")),
        Some(other) => Err(format!("{what} is {}", kind_of(other))),
    }
}

fn tokens(v: Option<&ValueRef<'_>>) -> Result<Vec<u32>, String> {
    match v {
        Some(ValueRef::Array(a)) => a
            .iter()
            .map(|t| match t {
                ValueRef::Integer(i) => i
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| "a token id is out of 32-bit range".to_string()),
                other => Err(format!("a token id is {}", kind_of(other))),
            })
            .collect(),
        Some(other) => Err(format!("token_ids is {}", kind_of(other))),
        None => Err("no token_ids".to_string()),
    }
}

fn block_size(v: Option<&ValueRef<'_>>) -> Result<u64, String> {
    match v {
        Some(ValueRef::Integer(i)) => i
            .as_u64()
            .filter(|&b| b > 0)
            .ok_or_else(|| "block_size is not a positive integer".to_string()),
        Some(other) => Err(format!("block_size is {}", kind_of(other))),
        None => Err("no block_size".to_string()),
    }
}

/// The fields of an event, by name, whichever encoding it came in.
struct Fields<'v, 'a> {
    positional: Option<&'v [ValueRef<'a>]>,
    named: Option<&'v [(ValueRef<'a>, ValueRef<'a>)]>,
}

impl<'v, 'a> Fields<'v, 'a> {
    /// The field called `name`, at position `pos` in the array form.
    fn get(&self, name: &str, pos: usize) -> Option<&'v ValueRef<'a>> {
        match (self.positional, self.named) {
            (Some(a), _) => a.get(pos),
            (_, Some(m)) => field(m, &[name]),
            _ => None,
        }
    }
}

fn decode_event(v: &ValueRef<'_>) -> WireEvent {
    let (tag, fields) = match v {
        ValueRef::Array(a) => (
            a.first(),
            Fields {
                positional: Some(a),
                named: None,
            },
        ),
        ValueRef::Map(m) => (
            field(m, &["type"]),
            Fields {
                positional: None,
                named: Some(m),
            },
        ),
        other => {
            return WireEvent::Invalid {
                reason: format!("an event is {}", kind_of(other)),
            }
        }
    };
    let tag = match tag {
        Some(ValueRef::String(s)) => match s.as_str() {
            Some(t) => t,
            None => {
                return WireEvent::Invalid {
                    reason: "the event tag is not UTF-8".into(),
                }
            }
        },
        Some(other) => {
            return WireEvent::Invalid {
                reason: format!("the event tag is {}", kind_of(other)),
            }
        }
        None => {
            return WireEvent::Invalid {
                reason: "an event has no tag".into(),
            }
        }
    };
    let decoded = match tag {
        "BlockStored" => stored(&fields),
        "BlockRemoved" => (|| {
            Ok(WireEvent::Removed {
                block_hashes: hashes(fields.get("block_hashes", 1), "block_hashes")?,
                medium: opt_str(fields.get("medium", 2), "medium")?,
            })
        })(),
        "AllBlocksCleared" => Ok(WireEvent::Cleared),
        other => Ok(WireEvent::Unknown {
            kind: other.chars().take(64).collect(),
        }),
    };
    decoded.unwrap_or_else(|reason| WireEvent::Invalid {
        reason: format!("{tag}: {reason}"),
    })
}

fn stored(f: &Fields<'_, '_>) -> Result<WireEvent, String> {
    Ok(WireEvent::Stored {
        block_hashes: hashes(f.get("block_hashes", 1), "block_hashes")?,
        parent: opt_hash(f.get("parent_block_hash", 2))?,
        token_ids: tokens(f.get("token_ids", 3))?,
        block_size: block_size(f.get("block_size", 4))?,
        medium: opt_str(f.get("medium", 6), "medium")?,
        lora_name: opt_str(f.get("lora_name", 7), "lora_name")?,
    })
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

//! The decoder written over `rmpv` values: simple, allocating a value per
//! msgpack element. It is the fast decoder's oracle (a differential
//! property test and the `kvrouter_wire` fuzz target hold them equal).
use rmpv::ValueRef;

use super::{Batch, WireError, WireEvent, MAX_DEPTH};

/// Decodes one `KVEventBatch` payload through `rmpv` values.
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

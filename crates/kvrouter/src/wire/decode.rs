//! The batch decoder: reads the msgpack bytes in place (with `rmp`'s
//! markers), allocating only the vectors of the events it returns. A
//! batch is mostly token ids; building a value per id first (as
//! [`super::reference`] does) took most of an ingest thread's time.
//!
//! Each value's extent is found by a structural skip before it is
//! interpreted, so a malformed element inside an event makes that event
//! [`WireEvent::Invalid`] and never desynchronises the rest.
use rmp::Marker;

use super::{Batch, WireError, WireEvent, MAX_DEPTH};

/// One msgpack item: scalars decoded, containers as their element count
/// (their elements follow in the input).
#[derive(Debug, Clone, Copy)]
enum Item<'a> {
    Nil,
    Bool,
    Int(i128),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext,
}

fn kind_of(i: &Item<'_>) -> &'static str {
    match i {
        Item::Nil => "nil",
        Item::Bool => "a boolean",
        Item::Int(_) => "an integer",
        Item::Float(_) => "a float",
        Item::Str(_) => "a string",
        Item::Bin([]) => "empty bytes",
        Item::Bin(_) => "bytes",
        Item::Array(_) => "an array",
        Item::Map(_) => "a map",
        Item::Ext => "an extension",
    }
}

fn truncated() -> WireError {
    WireError::Msgpack("truncated".into())
}

/// A reader over a byte slice.
#[derive(Clone, Copy)]
struct Rd<'a> {
    b: &'a [u8],
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(truncated());
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn len_u8(&mut self) -> Result<usize, WireError> {
        Ok(usize::from(self.be::<1>()?[0]))
    }

    fn len_u16(&mut self) -> Result<usize, WireError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len_u32(&mut self) -> Result<usize, WireError> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|_| truncated())
    }

    /// The next item (a container's elements are left to read).
    fn item(&mut self) -> Result<Item<'a>, WireError> {
        let m = Marker::from_u8(self.be::<1>()?[0]);
        Ok(match m {
            Marker::FixPos(v) => Item::Int(i128::from(v)),
            Marker::FixNeg(v) => Item::Int(i128::from(v)),
            Marker::Null => Item::Nil,
            Marker::True | Marker::False => Item::Bool,
            Marker::U8 => Item::Int(i128::from(self.be::<1>()?[0])),
            Marker::U16 => Item::Int(i128::from(u16::from_be_bytes(self.be()?))),
            Marker::U32 => Item::Int(i128::from(u32::from_be_bytes(self.be()?))),
            Marker::U64 => Item::Int(i128::from(u64::from_be_bytes(self.be()?))),
            Marker::I8 => Item::Int(i128::from(i8::from_be_bytes(self.be()?))),
            Marker::I16 => Item::Int(i128::from(i16::from_be_bytes(self.be()?))),
            Marker::I32 => Item::Int(i128::from(i32::from_be_bytes(self.be()?))),
            Marker::I64 => Item::Int(i128::from(i64::from_be_bytes(self.be()?))),
            Marker::F32 => Item::Float(f64::from(f32::from_be_bytes(self.be()?))),
            Marker::F64 => Item::Float(f64::from_be_bytes(self.be()?)),
            Marker::FixStr(n) => Item::Str(self.take(usize::from(n))?),
            Marker::Str8 => {
                let n = self.len_u8()?;
                Item::Str(self.take(n)?)
            }
            Marker::Str16 => {
                let n = self.len_u16()?;
                Item::Str(self.take(n)?)
            }
            Marker::Str32 => {
                let n = self.len_u32()?;
                Item::Str(self.take(n)?)
            }
            Marker::Bin8 => {
                let n = self.len_u8()?;
                Item::Bin(self.take(n)?)
            }
            Marker::Bin16 => {
                let n = self.len_u16()?;
                Item::Bin(self.take(n)?)
            }
            Marker::Bin32 => {
                let n = self.len_u32()?;
                Item::Bin(self.take(n)?)
            }
            Marker::FixArray(n) => Item::Array(usize::from(n)),
            Marker::Array16 => Item::Array(self.len_u16()?),
            Marker::Array32 => Item::Array(self.len_u32()?),
            Marker::FixMap(n) => Item::Map(usize::from(n)),
            Marker::Map16 => Item::Map(self.len_u16()?),
            Marker::Map32 => Item::Map(self.len_u32()?),
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => {
                let n = self.len_u8()?;
                self.ext(n)?
            }
            Marker::Ext16 => {
                let n = self.len_u16()?;
                self.ext(n)?
            }
            Marker::Ext32 => {
                let n = self.len_u32()?;
                self.ext(n)?
            }
            // Never used by encoders; read as nil, as `rmpv` reads it.
            Marker::Reserved => Item::Nil,
        })
    }

    fn ext(&mut self, n: usize) -> Result<Item<'a>, WireError> {
        self.take(1 + n)?;
        Ok(Item::Ext)
    }

    /// Skips one whole value, checking its structure. `depth` bounds the
    /// nesting exactly as `rmpv`'s reader counts it (its oracle must agree
    /// on what is too deep): any value takes one level, a byte string one
    /// more, a string or extension two more, a container one more and its
    /// elements start two below it.
    fn skip(&mut self, depth: usize) -> Result<(), WireError> {
        let deep = || WireError::Msgpack("nested too deep".into());
        if depth < 1 {
            return Err(deep());
        }
        let n = match self.item()? {
            Item::Array(n) => n,
            Item::Map(n) => n.checked_mul(2).ok_or_else(truncated)?,
            Item::Str(_) | Item::Ext if depth < 3 => return Err(deep()),
            Item::Bin(_) if depth < 2 => return Err(deep()),
            _ => return Ok(()),
        };
        if depth < 2 {
            return Err(deep());
        }
        for _ in 0..n {
            self.skip(depth - 2)?;
        }
        Ok(())
    }

    /// The bytes of the next whole value.
    fn value(&mut self, depth: usize) -> Result<&'a [u8], WireError> {
        let start = self.b;
        self.skip(depth)?;
        Ok(&start[..start.len() - self.b.len()])
    }
}

/// Reads the single item of a value's bytes (validated already).
fn item_of(v: &[u8]) -> Item<'_> {
    Rd { b: v }.item().unwrap_or(Item::Nil)
}

fn str_of<'a>(i: &Item<'a>) -> Option<&'a str> {
    match i {
        Item::Str(s) => std::str::from_utf8(s).ok(),
        _ => None,
    }
}

/// Decodes one `KVEventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = Rd { b: payload };
    let whole = rd.value(MAX_DEPTH)?;
    if !rd.b.is_empty() {
        return Err(WireError::Msgpack(format!(
            "{} bytes after the batch",
            rd.b.len()
        )));
    }
    let mut rd = Rd { b: whole };
    let (ts, events, rank) = match rd.item()? {
        Item::Array(n) => {
            if n < 2 {
                return Err(WireError::Envelope("an envelope array needs [ts, events]"));
            }
            let ts = rd.value(MAX_DEPTH)?;
            let events = rd.value(MAX_DEPTH)?;
            let rank = if n >= 3 {
                Some(rd.value(MAX_DEPTH)?)
            } else {
                None
            };
            (Some(ts), Some(events), rank)
        }
        Item::Map(n) => {
            let (mut ts, mut events, mut rank) = (None, None, None);
            for _ in 0..n {
                let k = item_of(rd.value(MAX_DEPTH)?);
                let v = rd.value(MAX_DEPTH)?;
                match str_of(&k) {
                    Some("ts") if ts.is_none() => ts = Some(v),
                    Some("events") if events.is_none() => events = Some(v),
                    Some("data_parallel_rank" | "attn_dp_rank" | "dp_rank") if rank.is_none() => {
                        rank = Some(v)
                    }
                    _ => {}
                }
            }
            (
                Some(ts.ok_or(WireError::Envelope("no \"ts\""))?),
                Some(events.ok_or(WireError::Envelope("no \"events\""))?),
                rank,
            )
        }
        _ => return Err(WireError::Envelope("neither an array nor a map")),
    };
    let ts = match ts.map(item_of) {
        Some(Item::Float(f)) => f,
        Some(Item::Int(i)) => i as f64,
        _ => return Err(WireError::Envelope("ts is not a number")),
    };
    let dp_rank = match rank.map(item_of) {
        None | Some(Item::Nil) => None,
        Some(Item::Int(i)) => {
            Some(i64::try_from(i).map_err(|_| WireError::Envelope("the rank is not an integer"))?)
        }
        Some(_) => return Err(WireError::Envelope("the rank is not an integer")),
    };
    let mut er = Rd {
        b: events.unwrap_or_default(),
    };
    let Item::Array(n) = er.item()? else {
        return Err(WireError::Envelope("events is not an array"));
    };
    let mut out = Vec::with_capacity(n.min(er.b.len()));
    for _ in 0..n {
        out.push(decode_event(er.value(MAX_DEPTH)?));
    }
    Ok(Batch {
        ts,
        events: out,
        dp_rank,
    })
}

/// An event's fields, by position (array form) or name (map form).
enum Fields<'a> {
    Positional(Vec<&'a [u8]>),
    Named(Vec<(&'a str, &'a [u8])>),
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str, pos: usize) -> Option<&'a [u8]> {
        match self {
            Fields::Positional(v) => v.get(pos).copied(),
            Fields::Named(v) => v.iter().find(|(k, _)| *k == name).map(|(_, v)| *v),
        }
    }
}

/// Positions of the array form read: the tag and eight fields.
const POSITIONS: usize = 9;

fn decode_event(v: &[u8]) -> WireEvent {
    let mut r = Rd { b: v };
    let invalid = |reason: String| WireEvent::Invalid { reason };
    // `v` was validated whole: reads inside it do not fail.
    let (tag, fields) = match r.item() {
        Ok(Item::Array(n)) => {
            let mut f = Vec::with_capacity(n.min(POSITIONS));
            for _ in 0..n.min(POSITIONS) {
                match r.value(MAX_DEPTH) {
                    Ok(x) => f.push(x),
                    Err(e) => return invalid(e.to_string()),
                }
            }
            (f.first().copied(), Fields::Positional(f))
        }
        Ok(Item::Map(n)) => {
            let mut f = Vec::with_capacity(n.min(16));
            let mut tag = None;
            for _ in 0..n {
                let (Ok(k), Ok(x)) = (r.value(MAX_DEPTH), r.value(MAX_DEPTH)) else {
                    return invalid("a malformed field".into());
                };
                if let Some(k) = str_of(&item_of(k)) {
                    if k == "type" && tag.is_none() {
                        tag = Some(x);
                    }
                    f.push((k, x));
                }
            }
            (tag, Fields::Named(f))
        }
        Ok(other) => return invalid(format!("an event is {}", kind_of(&other))),
        Err(e) => return invalid(e.to_string()),
    };
    let tag = match tag.map(item_of) {
        Some(Item::Str(s)) => match std::str::from_utf8(s) {
            Ok(t) => t,
            Err(_) => return invalid("the event tag is not UTF-8".into()),
        },
        Some(other) => return invalid(format!("the event tag is {}", kind_of(&other))),
        None => return invalid("an event has no tag".into()),
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

fn stored(f: &Fields<'_>) -> Result<WireEvent, String> {
    Ok(WireEvent::Stored {
        block_hashes: hashes(f.get("block_hashes", 1), "block_hashes")?,
        parent: opt_hash(f.get("parent_block_hash", 2))?,
        token_ids: tokens(f.get("token_ids", 3))?,
        block_size: block_size(f.get("block_size", 4))?,
        medium: opt_str(f.get("medium", 6), "medium")?,
        lora_name: opt_str(f.get("lora_name", 7), "lora_name")?,
    })
}

/// A block hash: 64-bit integers as their bits, byte digests folded.
fn as_hash(i: &Item<'_>) -> Result<u64, String> {
    match *i {
        Item::Int(v) => u64::try_from(v)
            .or_else(|_| i64::try_from(v).map(|s| s as u64))
            .map_err(|_| "block hash out of 64-bit range".to_string()),
        Item::Bin(b) if !b.is_empty() => Ok(xxhash_rust::xxh3::xxh3_64(b)),
        ref other => Err(format!("block hash is {}", kind_of(other))),
    }
}

/// The elements of an array value, each read as one item (scalars; a
/// container element reads as its header, which every caller refuses).
fn elements<'a>(
    v: &'a [u8],
    what: &str,
) -> Result<(usize, impl Iterator<Item = Item<'a>> + 'a), String> {
    let mut r = Rd { b: v };
    match r.item() {
        Ok(Item::Array(n)) => Ok((
            n,
            (0..n).map(move |_| {
                // Elements were validated with the value; a container's
                // own elements are never read (the caller stops at it).
                r.item().unwrap_or(Item::Nil)
            }),
        )),
        Ok(other) => Err(format!("{what} is {}", kind_of(&other))),
        Err(e) => Err(e.to_string()),
    }
}

fn hashes(v: Option<&[u8]>, what: &str) -> Result<Vec<u64>, String> {
    let v = v.ok_or_else(|| format!("no {what}"))?;
    let (n, items) = elements(v, what)?;
    let mut out = Vec::with_capacity(n.min(v.len()));
    for i in items {
        out.push(as_hash(&i)?);
    }
    Ok(out)
}

fn opt_hash(v: Option<&[u8]>) -> Result<Option<u64>, String> {
    match v.map(item_of) {
        None | Some(Item::Nil) => Ok(None),
        Some(h) => as_hash(&h).map(Some),
    }
}

fn opt_str(v: Option<&[u8]>, what: &str) -> Result<Option<String>, String> {
    match v.map(item_of) {
        None | Some(Item::Nil) => Ok(None),
        Some(Item::Str(s)) => std::str::from_utf8(s)
            .map(|s| Some(s.to_string()))
            .map_err(|_| format!("{what} is not UTF-8")),
        Some(other) => Err(format!("{what} is {}", kind_of(&other))),
    }
}

fn tokens(v: Option<&[u8]>) -> Result<Vec<u32>, String> {
    let v = v.ok_or_else(|| "no token_ids".to_string())?;
    let (n, items) = elements(v, "token_ids")?;
    let mut out = Vec::with_capacity(n.min(v.len()));
    for i in items {
        match i {
            Item::Int(t) => out.push(
                u32::try_from(t).map_err(|_| "a token id is out of 32-bit range".to_string())?,
            ),
            other => return Err(format!("a token id is {}", kind_of(&other))),
        }
    }
    Ok(out)
}

fn block_size(v: Option<&[u8]>) -> Result<u64, String> {
    match v.map(item_of) {
        Some(Item::Int(i)) => u64::try_from(i)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| "block_size is not a positive integer".to_string()),
        Some(other) => Err(format!("block_size is {}", kind_of(&other))),
        None => Err("no block_size".to_string()),
    }
}

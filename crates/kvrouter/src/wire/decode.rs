//! The batch decoder: reads the msgpack bytes in place (with `rmp`'s
//! markers), allocating only the vectors of the events it returns. A
//! batch is mostly token ids; building a value per id first (as
//! [`super::reference`] does) took most of an ingest thread's time.
//!
//! Each value's extent is found by a structural skip before it is
//! interpreted, so a malformed element inside an event makes that event
//! [`WireEvent::Invalid`] and never desynchronises the rest. Token arrays
//! of small unsigned integers (nearly all of a batch) are read and bounded
//! in the same pass; any other token array takes the general path.
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
        // Fixed-size scalars (most of a batch: token ids) without decoding.
        let fixed = match self.b.first() {
            Some(0x00..=0x7f | 0xe0..=0xff | 0xc0..=0xc3) => 1,
            Some(0xcc | 0xd0) => 2,
            Some(0xcd | 0xd1) => 3,
            Some(0xca | 0xce | 0xd2) => 5,
            Some(0xcb | 0xcf | 0xd3) => 9,
            _ => 0,
        };
        if fixed > 0 {
            self.take(fixed)?;
            return Ok(());
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

    /// An unsigned integer of up to 32 bits, the common case of token ids,
    /// read without the general decoder; `None` for anything else (the
    /// input is left as it was).
    #[inline]
    fn small_uint(&mut self) -> Option<u32> {
        let (&m, rest) = self.b.split_first()?;
        let (v, used) = match m {
            0x00..=0x7f => (u32::from(m), 0),
            0xcc => (u32::from(*rest.first()?), 1),
            0xcd => (
                u32::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
                2,
            ),
            0xce => (u32::from_be_bytes(rest.get(..4)?.try_into().ok()?), 4),
            _ => return None,
        };
        self.b = &rest[used..];
        Some(v)
    }

    /// Up to `n` small unsigned integers into `out` without a branch on
    /// their encoding (token ids mix 3- and 5-byte forms at random, so a
    /// branch per id mispredicts about half the time): each is read from
    /// an 8-byte big-endian window, shifted and masked by its marker's
    /// row of [`UINT_FORMS`], its length computed from the marker. Stops
    /// at the first other marker or where fewer than 8 bytes remain;
    /// returns how many it read.
    #[inline]
    fn small_uints(&mut self, n: usize, out: &mut Vec<u32>) -> usize {
        let mut b = self.b;
        let mut read = 0;
        while read < n {
            let Some(w) = b.first_chunk::<8>() else { break };
            // The marker's own load starts the next step's address: its
            // row goes to the value, its length by arithmetic alone.
            let m = w[0];
            let len = if m < 0x80 {
                1
            } else if m.wrapping_sub(0xcc) < 3 {
                (0x05_03_02u32 >> ((m & 3) * 8)) as usize & 0xff
            } else {
                break;
            };
            let (shift, mask) = UINT_FORMS[usize::from(m)];
            out.push(((u64::from_be_bytes(*w) >> shift) as u32) & mask);
            b = &b[len..];
            read += 1;
        }
        self.b = b;
        read
    }

    /// A token array in one pass, the bulk of a batch: an array of
    /// unsigned integers of up to 32 bits, read and bounded together.
    /// Anything else (another element type, too deep, truncated) is left
    /// to the general path: `None`, the reader unmoved.
    fn token_array(&mut self, depth: usize) -> Option<Vec<u32>> {
        // An array's elements sit two levels below it and take one each.
        if depth < 3 {
            return None;
        }
        let start = *self;
        let n = match self.item() {
            Ok(Item::Array(n)) => n,
            _ => {
                *self = start;
                return None;
            }
        };
        // What the claimed length may reserve: the rest of the payload can
        // be megabytes of something else, so grow past this as ids come.
        let mut out = Vec::with_capacity(n.min(self.b.len()).min(1 << 14));
        let bulk = self.small_uints(n, &mut out);
        for _ in bulk..n {
            match self.small_uint() {
                Some(t) => out.push(t),
                None => {
                    *self = start;
                    return None;
                }
            }
        }
        Some(out)
    }

    /// The bytes of the next whole value.
    fn value(&mut self, depth: usize) -> Result<&'a [u8], WireError> {
        let start = self.b;
        self.skip(depth)?;
        Ok(&start[..start.len() - self.b.len()])
    }
}

/// Per msgpack marker byte, how an unsigned integer of up to 32 bits in
/// that form is read from the 8 bytes starting at the marker: (right
/// shift, mask). Only the rows of those forms are ever read.
static UINT_FORMS: [(u8, u32); 256] = {
    let mut t = [(0u8, 0u32); 256];
    let mut m = 0;
    while m < 0x80 {
        t[m] = (56, 0x7f);
        m += 1;
    }
    t[0xcc] = (48, 0xff);
    t[0xcd] = (40, 0xffff);
    t[0xce] = (24, u32::MAX);
    t
};

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
    // Depths as `rmpv` counts them from MAX_DEPTH: the envelope's
    // elements two below it, and so on down.
    let inner = MAX_DEPTH - 2;
    let (ts, events, rank) = match rd.item()? {
        Item::Array(n) => {
            let ts = if n > 0 { Some(rd.value(inner)?) } else { None };
            let events = if n > 1 {
                Some(decode_events(&mut rd, inner)?)
            } else {
                None
            };
            let rank = if n > 2 { Some(rd.value(inner)?) } else { None };
            for _ in 3..n {
                rd.skip(inner)?;
            }
            check_end(&rd)?;
            if n < 2 {
                return Err(WireError::Envelope("an envelope array needs [ts, events]"));
            }
            (ts, events, rank)
        }
        Item::Map(n) => {
            let (mut ts, mut events, mut rank) = (None, None, None);
            for _ in 0..n {
                let k = item_of(rd.value(inner)?);
                match str_of(&k) {
                    Some("ts") if ts.is_none() => ts = Some(rd.value(inner)?),
                    Some("events") if events.is_none() => {
                        events = Some(decode_events(&mut rd, inner)?)
                    }
                    Some("data_parallel_rank" | "attn_dp_rank" | "dp_rank") if rank.is_none() => {
                        rank = Some(rd.value(inner)?)
                    }
                    _ => rd.skip(inner)?,
                }
            }
            check_end(&rd)?;
            (
                Some(ts.ok_or(WireError::Envelope("no \"ts\""))?),
                Some(events.ok_or(WireError::Envelope("no \"events\""))?),
                rank,
            )
        }
        _ => {
            check_end(&rd)?;
            return Err(WireError::Envelope("neither an array nor a map"));
        }
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
    let events = events
        .unwrap_or(Ok(Vec::new()))
        .map_err(|()| WireError::Envelope("events is not an array"))?;
    Ok(Batch {
        ts,
        events,
        dp_rank,
    })
}

fn check_end(rd: &Rd<'_>) -> Result<(), WireError> {
    if rd.b.is_empty() {
        Ok(())
    } else {
        Err(WireError::Msgpack(format!(
            "{} bytes after the batch",
            rd.b.len()
        )))
    }
}

/// The events array at `depth`, decoded as it is read; `Err(())` inside
/// if it is not an array (after it is skipped, so structure errors after
/// it still win, as in a whole-value parse).
#[allow(clippy::type_complexity)]
fn decode_events(rd: &mut Rd<'_>, depth: usize) -> Result<Result<Vec<WireEvent>, ()>, WireError> {
    let mut peek = *rd;
    let Item::Array(n) = peek.item()? else {
        rd.skip(depth)?;
        return Ok(Err(()));
    };
    if depth < 2 {
        return Err(WireError::Msgpack("nested too deep".into()));
    }
    *rd = peek;
    let mut out = Vec::with_capacity(n.min(rd.b.len()));
    for _ in 0..n {
        out.push(decode_event(rd, depth - 2)?);
    }
    Ok(Ok(out))
}

/// An event's fields, by position (array form) or name (map form), and
/// its token ids when they were read with its structure.
struct Fields<'a> {
    by: By<'a>,
    tokens: Option<Vec<u32>>,
}

enum By<'a> {
    Positional(Vec<&'a [u8]>),
    Named(Vec<(&'a str, &'a [u8])>),
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str, pos: usize) -> Option<&'a [u8]> {
        match &self.by {
            By::Positional(v) => v.get(pos).copied(),
            By::Named(v) => v.iter().find(|(k, _)| *k == name).map(|(_, v)| *v),
        }
    }
}

/// The array form's position of `token_ids`.
const TOKENS_AT: usize = 3;

/// Positions of the array form read: the tag and eight fields.
const POSITIONS: usize = 9;

fn decode_event(rd: &mut Rd<'_>, depth: usize) -> Result<WireEvent, WireError> {
    let invalid = |reason: String| Ok(WireEvent::Invalid { reason });
    let mut peek = *rd;
    let head = peek.item()?;
    if !matches!(head, Item::Array(_) | Item::Map(_)) {
        rd.skip(depth)?;
        return invalid(format!("an event is {}", kind_of(&head)));
    }
    if depth < 2 {
        return Err(WireError::Msgpack("nested too deep".into()));
    }
    *rd = peek;
    let inner = depth - 2;
    let mut tokens = None;
    let (tag, by) = match head {
        Item::Array(n) => {
            let mut f = Vec::with_capacity(n.min(POSITIONS));
            for i in 0..n {
                if i == TOKENS_AT {
                    let at = rd.b;
                    if let Some(t) = rd.token_array(inner) {
                        tokens = Some(t);
                        f.push(&at[..at.len() - rd.b.len()]);
                        continue;
                    }
                }
                if i < POSITIONS {
                    f.push(rd.value(inner)?);
                } else {
                    rd.skip(inner)?;
                }
            }
            (f.first().copied(), By::Positional(f))
        }
        _ => {
            let Item::Map(n) = head else {
                return invalid("an event is not a container".into());
            };
            let mut f = Vec::with_capacity(n.min(16));
            let mut tag = None;
            for _ in 0..n {
                let k = rd.value(inner)?;
                let k = str_of(&item_of(k));
                let at = rd.b;
                // The first `token_ids` is the one read (as `get` finds).
                let fused = if k == Some("token_ids") && tokens.is_none() {
                    rd.token_array(inner)
                } else {
                    None
                };
                let x = if let Some(t) = fused {
                    tokens = Some(t);
                    &at[..at.len() - rd.b.len()]
                } else {
                    rd.value(inner)?
                };
                if let Some(k) = k {
                    if k == "type" && tag.is_none() {
                        tag = Some(x);
                    }
                    f.push((k, x));
                }
            }
            (tag, By::Named(f))
        }
    };
    Ok(interpret(tag, Fields { by, tokens }))
}

fn interpret(tag: Option<&[u8]>, mut fields: Fields<'_>) -> WireEvent {
    let invalid = |reason: String| WireEvent::Invalid { reason };
    let tag = match tag.map(item_of) {
        Some(Item::Str(s)) => match std::str::from_utf8(s) {
            Ok(t) => t,
            Err(_) => return invalid("the event tag is not UTF-8".into()),
        },
        Some(other) => return invalid(format!("the event tag is {}", kind_of(&other))),
        None => return invalid("an event has no tag".into()),
    };
    let decoded = match tag {
        "BlockStored" => stored(&mut fields),
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

fn stored(f: &mut Fields<'_>) -> Result<WireEvent, String> {
    Ok(WireEvent::Stored {
        block_hashes: hashes(f.get("block_hashes", 1), "block_hashes")?,
        parent: opt_hash(f.get("parent_block_hash", 2))?,
        token_ids: match f.tokens.take() {
            Some(t) => t,
            None => tokens(f.get("token_ids", TOKENS_AT))?,
        },
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

/// The block hashes of an array value (validated already). 64-bit
/// integers, what engines send, are read straight from their 8 bytes
/// (signed ones as their bits, as [`as_hash`] reads them); anything else
/// through [`as_hash`].
fn hashes(v: Option<&[u8]>, what: &str) -> Result<Vec<u64>, String> {
    let v = v.ok_or_else(|| format!("no {what}"))?;
    let mut r = Rd { b: v };
    let n = match r.item() {
        Ok(Item::Array(n)) => n,
        Ok(other) => return Err(format!("{what} is {}", kind_of(&other))),
        Err(e) => return Err(e.to_string()),
    };
    let mut out = Vec::with_capacity(n.min(v.len()));
    for _ in 0..n {
        if let [0xcf | 0xd3, rest @ ..] = r.b {
            if let Some(h) = rest.first_chunk::<8>() {
                out.push(u64::from_be_bytes(*h));
                r.b = &rest[8..];
                continue;
            }
        }
        // A container element reads as its header, which `as_hash` refuses.
        out.push(as_hash(&r.item().unwrap_or(Item::Nil))?);
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
    let mut r = Rd { b: v };
    let n = match r.item() {
        Ok(Item::Array(n)) => n,
        Ok(other) => return Err(format!("token_ids is {}", kind_of(&other))),
        Err(e) => return Err(e.to_string()),
    };
    let mut out = Vec::with_capacity(n.min(v.len()));
    for _ in 0..n {
        if let Some(t) = r.small_uint() {
            out.push(t);
            continue;
        }
        match r.item() {
            Ok(Item::Int(t)) => out.push(
                u32::try_from(t).map_err(|_| "a token id is out of 32-bit range".to_string())?,
            ),
            Ok(other) => return Err(format!("a token id is {}", kind_of(&other))),
            Err(e) => return Err(e.to_string()),
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

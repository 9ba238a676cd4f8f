"""An inference engine's KV-event publisher, written independently of the
router: the event structs declared as vLLM declares them (msgspec, tagged,
array-like or map), published through a ZMQ PUB socket as
[topic, seq (8 bytes big-endian), payload], with a ROUTER socket answering
replay requests as vLLM's publisher does.

Driven by JSON lines on stdin; answers one JSON line per command on stdout.
Usage: publisher.py ENCODING HASHES [TOPIC]
  ENCODING: array (vLLM, array_like), map (vLLM, tagged maps), sglang
            (short positional BlockStored, signed hashes, attn_dp_rank)
  HASHES:   int (64-bit integers) or bytes (32-byte digests)
Commands:
  {"op": "batch", "events": [...], "drop": false, "dp_rank": null}
      events: {"kind": "stored", "hashes": [..], "parent": h|null,
               "tokens": [..], "block_size": n, "medium": "GPU"|null,
               "lora_name": null} | {"kind": "removed", "hashes": [..]}
               | {"kind": "cleared"} | {"kind": "other"}
      drop: take a seq and keep the batch for replay, but do not send it.
  {"op": "garbage", "what": "frames" | "payload" | "seq"}
  {"op": "restart"}           seq back to 0, replay buffer emptied
  {"op": "buffer", "size": n} replay buffer length
  {"op": "quit"}
"""
import json
import sys
import threading
from collections import deque
from typing import Any, Optional, Union

import msgspec
import zmq

ENCODING = sys.argv[1]
HASHES = sys.argv[2]
TOPIC = (sys.argv[3] if len(sys.argv) > 3 else "").encode()
ARRAY = ENCODING in ("array", "sglang")

ExternalBlockHash = Union[int, bytes]


class EventBatch(msgspec.Struct, array_like=ARRAY, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class SGLangBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=ARRAY, omit_defaults=True, gc=False, tag=True):
    """Base of every KV cache event."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str] = None


class SGLangBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]


class AllBlocksCleared(KVCacheEvent):
    pass


class SomethingNew(KVCacheEvent):
    payload: int = 1


def ext(h):
    if h is None:
        return None
    if HASHES == "bytes":
        return int(h).to_bytes(32, "big")
    if ENCODING == "sglang":
        # SGLang publishes signed 64-bit hashes.
        return h - (1 << 64) if h >= (1 << 63) else h
    return h


def event(e):
    k = e["kind"]
    if k == "stored":
        if ENCODING == "sglang":
            return SGLangBlockStored(
                [ext(h) for h in e["hashes"]], ext(e.get("parent")), e["tokens"], e["block_size"], None
            )
        return BlockStored(
            [ext(h) for h in e["hashes"]],
            ext(e.get("parent")),
            e["tokens"],
            e["block_size"],
            None,
            e.get("medium", "GPU"),
            e.get("lora_name"),
        )
    if k == "removed":
        return BlockRemoved([ext(h) for h in e["hashes"]], e.get("medium", "GPU"))
    if k == "cleared":
        return AllBlocksCleared()
    return SomethingNew()


ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
replay = ctx.socket(zmq.ROUTER)
replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
encoder = msgspec.msgpack.Encoder()
lock = threading.Lock()
state = {"seq": 0, "buffer": deque(maxlen=10000), "replays": 0}
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def serve_replays():
    while True:
        try:
            frames = replay.recv_multipart()
        except zmq.ZMQError:
            return
        if len(frames) != 3:
            continue
        client, _, start = frames
        start = int.from_bytes(start, "big")
        with lock:
            state["replays"] += 1
            held = [(s, b) for s, b in state["buffer"] if s >= start]
        for s, b in held:
            replay.send_multipart((client, b"", s.to_bytes(8, "big"), b))
        replay.send_multipart((client, b"", END_SEQ, b""))


threading.Thread(target=serve_replays, daemon=True).start()
print(json.dumps({"pub": pub_port, "replay": replay_port}), flush=True)

for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    out = {"ok": True}
    with lock:
        if op == "batch":
            evs = [event(e) for e in cmd["events"]]
            if ENCODING == "sglang":
                batch = SGLangBatch(1.0, evs, cmd.get("dp_rank"))
            else:
                batch = EventBatch(1.0, evs, cmd.get("dp_rank"))
            payload = encoder.encode(batch)
            seq = state["seq"]
            state["seq"] += 1
            state["buffer"].append((seq, payload))
            if not cmd.get("drop"):
                pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), payload))
            out["seq"] = seq
        elif op == "garbage":
            what = cmd["what"]
            seq = state["seq"]
            if what == "frames":
                pub.send_multipart((TOPIC, b"\x01\x02"))
            elif what == "seq":
                pub.send_multipart((TOPIC, b"\x00\x01", b"\x90"))
            else:
                state["seq"] += 1
                bad = b"\xdd\xff\xff\xff\xff\x01"
                state["buffer"].append((seq, bad))
                pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), bad))
                out["seq"] = seq
        elif op == "restart":
            state["seq"] = 0
            state["buffer"].clear()
        elif op == "buffer":
            state["buffer"] = deque(state["buffer"], maxlen=cmd["size"])
        elif op == "quit":
            break
        out["replays"] = state["replays"]
    print(json.dumps(out), flush=True)

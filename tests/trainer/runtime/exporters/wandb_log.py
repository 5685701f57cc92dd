"""Reading a W&B offline run back: its ``.wandb`` file, decoded with wandb's own protobuf.

wandb 0.31 no longer ships a Python reader of its transaction log (``wandb sync`` reads it in
wandb-core). The framing is LevelDB's log format, as wandb documents it: a 7-byte header
(``:W&B``, a 2-byte magic, a version byte), then 32 KiB blocks of records, each a 4-byte
checksum, a 2-byte little-endian length, a 1-byte type (full, first, middle, last) and the
data; a block's tail shorter than a record header is padding. The records are wandb's
``Record`` protobuf messages.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

_HEADER, _BLOCK, _RECORD_HEADER = 7, 32 * 1024, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What an offline run's log holds: its id, config and history rows."""

    run_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None


def _payloads(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B transaction log"
    payloads, pending, offset = [], b"", _HEADER
    while offset + _RECORD_HEADER <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < _RECORD_HEADER:
            offset += left_in_block  # padding at the end of a block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + _RECORD_HEADER])
        offset += _RECORD_HEADER
        chunk, offset = data[offset : offset + length], offset + length
        if kind == _FULL:
            payloads.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            payloads.append(pending + chunk)
        elif kind == 0 and length == 0:
            break  # zeroes: the end of what was written
    return payloads


def read_offline_run(path: Path) -> OfflineRun:
    """Decode ``run-<id>.wandb``."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun()
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.config.update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
        elif kind == "history":
            run.history.append(
                {
                    "/".join(item.nested_key) if item.nested_key else item.key: json.loads(
                        item.value_json
                    )
                    for item in record.history.item
                }
            )
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run

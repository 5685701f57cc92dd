"""Atomic, verified checkpoints: write a temporary file, fsync it, rename it into place;
check it against its recorded checksum when it is read back.

A checkpoint is one ``step-NNNNNNNN.pt`` file (``torch.save`` of a plain dict). Because the
rename is atomic, a reader sees either the previous checkpoint or the complete new one,
never a torn file, even if the process is killed in the middle of a save. Leftover
temporary files from such a kill are removed the next time the folder is opened.

Next to each file, ``step-NNNNNNNN.pt.sha256`` records its SHA-256 in ``sha256sum``'s format
(``sha256sum -c`` checks it), renamed into place before the checkpoint itself. A file that
changed after it was written (a disk, copy or memory error flipping a few bytes of a
tensor loads without a word and trains NaN) no longer matches and is skipped like a
truncated one, and so is a checkpoint the store's ``check`` rejects (non-finite weights:
the trainer's second line of defence) and one whose state records another ``step`` than
its name (an older checkpoint copied in under a later name). A checkpoint found bad is
remembered: it is not read or reported again while it stays as it is, so no recovery
restores it twice. A checkpoint without a checksum file (written before they were
recorded) is read unverified.

A save can be *abandoned* (its caller's deadline passed while the write hung): it then never
renames, so a write that finishes late cannot replace a checkpoint written after it, and a
new save of the same step writes a temporary file of its own.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import pickle
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import BinaryIO

import torch

from ..rl import why_unreadable
from ._folder_paths import NotARegularFile
from ._folder_paths import open_fd

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "NoCheckpointLoads",
    "StoredCheckpoint",
    "UnreadableCheckpoint",
]

logger = logging.getLogger("trainbus.checkpoint")

_NAME = re.compile(r"^step-(\d{8})\.pt$")
_TMP_SUFFIX = ".tmp"
_SUM_SUFFIX = ".sha256"
_SUM_LINE = re.compile(r"^([0-9a-f]{64})  (\S+)\n?$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint file that does not load, or loads but must not be used.

    Attributes:
        path: The file.
        reason: Why, in a few words.
    """

    def __init__(self, path: str | Path, reason: str, what: str = "unreadable") -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{what} checkpoint {path}: {reason}")


class NoCheckpointLoads(CheckpointError):
    """There are checkpoints, and none of them loads.

    Attributes:
        unreadable: The checkpoints that could not be read, newest first.
    """

    def __init__(self, where: str, unreadable: list[UnreadableCheckpoint]) -> None:
        self.unreadable = unreadable
        newest = unreadable[0]
        super().__init__(
            f"no checkpoint in {where} loads ({len(unreadable)} unreadable; "
            f"the newest, {newest.path.name}: {newest.reason})"
        )


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint file on disk."""

    step: int
    path: Path
    size_bytes: int


class CheckpointStore:
    """The ``checkpoints/`` folder of a run.

    Args:
        folder: Where checkpoints live (created if missing); None keeps them in memory (a
            trainer without a run folder can still restore after a failure).
        keep: How many of the newest checkpoints to keep (older ones are deleted after a
            successful save).
        before_rename: Test and fault-injection hook called with the step, the temporary
            path and the save's ``abandoned`` event after it is written and synced, before
            the rename (a crash here must lose nothing).
        check: Why a checkpoint that loaded must not be used (None: it may): a checkpoint
            it rejects is skipped like an unreadable one.
    """

    def __init__(
        self,
        folder: str | Path | None,
        *,
        keep: int = 3,
        before_rename: Callable[[int, Path, threading.Event], None] | None = None,
        check: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint keep must be >= 1, got {keep}")
        self.folder = Path(folder) if folder is not None else None
        self._memory: dict[int, tuple[bytes, str]] = {}  # step -> (file, its SHA-256)
        self.keep = keep
        self.before_rename = before_rename
        self.check = check
        self._cleaned = False
        self._lock = threading.Lock()
        self._writing: set[Path] = set()  # temporary files being written (abandoned ones too)
        # Checkpoints found bad, by file and its (size, mtime): skipped unread while unchanged.
        self._bad: dict[tuple[Path, int, int], UnreadableCheckpoint] = {}
        self._refused: set[Path] = set()  # entries named like checkpoints that are not files

    def list(self) -> list[StoredCheckpoint]:
        """Checkpoints on disk, oldest first."""
        if self.folder is None:
            return [
                StoredCheckpoint(step, Path(f"memory/step-{step:08d}.pt"), len(data))
                for step, (data, _) in sorted(self._memory.items())
            ]
        if not self.folder.is_dir():
            return []
        found = []
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if not match:
                continue
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue  # (pruned meanwhile)
            if not stat.S_ISREG(info.st_mode):
                self._refuse_once(path)  # a link, a FIFO, a folder: never read
                continue
            found.append(StoredCheckpoint(int(match.group(1)), path, info.st_size))
        return sorted(found, key=lambda c: c.step)

    def _refuse_once(self, path: Path) -> None:
        if path not in self._refused:
            self._refused.add(path)
            logger.error("%s is not a regular file: not a checkpoint, never read", path)

    def save(
        self, step: int, state: dict[str, Any], abandoned: threading.Event | None = None
    ) -> StoredCheckpoint:
        """Write ``state`` as the checkpoint of ``step`` atomically and durably.

        Args:
            step: The step it is the checkpoint of.
            state: What it holds.
            abandoned: Set by a caller that stopped waiting: the write is then discarded
                before its rename.

        Raises:
            CheckpointError: It could not be written, or it was abandoned.
        """
        abandoned = abandoned or threading.Event()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getbuffer()
        digest = hashlib.sha256(data).hexdigest()
        if self.folder is None:
            self._memory[step] = (bytes(data), digest)
            self._prune()
            return self.list()[-1] if self._memory else StoredCheckpoint(step, Path(), 0)
        self._remove_partial_writes()
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"step-{step:08d}.pt"
        temporary = self._claim(final)
        checksum = _sum_path(final)
        checksum_temporary = checksum.with_name(temporary.name + _SUM_SUFFIX)
        try:
            _write_synced(temporary, data)
            if self.before_rename is not None:
                self.before_rename(step, temporary, abandoned)
            if abandoned.is_set():
                temporary.unlink(missing_ok=True)
                logger.warning("discarded the abandoned write of checkpoint %s", final.name)
                raise CheckpointError(f"the write of checkpoint {final} was abandoned")
            # The checksum first: a kill between the two renames leaves a checksum that an
            # older file of the same step does not match (skipped), never a file unchecked.
            _write_synced(checksum_temporary, f"{digest}  {final.name}\n".encode())
            os.replace(checksum_temporary, checksum)
            os.replace(temporary, final)
            _fsync_folder(self.folder)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            checksum_temporary.unlink(missing_ok=True)
            raise CheckpointError(f"could not write checkpoint {final}: {exc}") from exc
        finally:
            with self._lock:
                self._writing.discard(temporary)
        self._prune()
        return StoredCheckpoint(step, final, len(data))

    def _claim(self, final: Path) -> Path:
        """A temporary path for writing ``final`` that no other write uses (an abandoned
        write of the same step may still be running)."""
        with self._lock:
            temporary, n = final.with_name(final.name + _TMP_SUFFIX), 1
            while temporary in self._writing:
                n += 1
                temporary = final.with_name(f"{final.name}.{n}{_TMP_SUFFIX}")
            self._writing.add(temporary)
        return temporary

    def load_latest(self) -> tuple[StoredCheckpoint, dict[str, Any]] | None:
        """The newest checkpoint that loads and passes its checks, or None when there is no
        checkpoint.

        A checkpoint that fails to load, does not match its checksum or is rejected by
        ``check`` (it should not happen, thanks to the atomic rename, but disks do fail) is
        skipped in favour of the one before it, and logged (once) when one loads. One
        found bad before is skipped without being read again.

        Raises:
            NoCheckpointLoads: There are checkpoints and none of them loads.
        """
        self._remove_partial_writes()
        skipped: list[UnreadableCheckpoint] = []
        found: list[UnreadableCheckpoint] = []  # bad, and not known before
        for stored in reversed(self.list()):
            key = self._key(stored)
            known = self._bad.get(key)
            if known is not None:
                skipped.append(known)
                continue
            try:
                state = self._verified(stored)
            except UnreadableCheckpoint as exc:
                self._bad[key] = exc
                skipped.append(exc)
                found.append(exc)
                continue
            for bad in found:
                logger.error("skipping %s", bad)
            return stored, state
        if skipped:
            where = str(self.folder) if self.folder is not None else "memory"
            raise NoCheckpointLoads(where, skipped)
        return None

    def _verified(self, stored: StoredCheckpoint) -> dict[str, Any]:
        if self.folder is None:
            data, digest = self._memory[stored.step]
            if hashlib.sha256(data).hexdigest() != digest:
                raise UnreadableCheckpoint(stored.path, "it changed in memory", "damaged")
            state = _load(io.BytesIO(data), stored.path)
        else:
            state = self.load(stored.path)
        recorded = state.get("step")
        if isinstance(recorded, int) and recorded != stored.step:
            # Resuming from it would redo the steps after its own, under a later name.
            raise UnreadableCheckpoint(
                stored.path,
                f"it holds step {recorded}, not {stored.step} (a copy of another checkpoint "
                "under a later name)",
                "unusable",
            )
        why = self.check(state) if self.check is not None else None
        if why:
            raise UnreadableCheckpoint(stored.path, why, "unusable")
        return state

    def _key(self, stored: StoredCheckpoint) -> tuple[Path, int, int]:
        if self.folder is None:
            return stored.path, stored.size_bytes, 0
        try:
            info = stored.path.stat()
        except OSError:
            return stored.path, -1, -1
        return stored.path, info.st_size, info.st_mtime_ns

    @staticmethod
    def load(path: str | Path) -> dict[str, Any]:
        """Read one checkpoint file, checked against its checksum file when it has one.

        Raises:
            UnreadableCheckpoint: It does not load, or does not match its checksum.
        """
        path = Path(path)
        try:
            file = _open(path)
        except OSError as exc:
            raise UnreadableCheckpoint(path, why_unreadable(exc, "torch checkpoint")) from exc
        with file:
            state = _load(file, path)  # first: its own reason (cut short, ...) says more
        _verify(path)
        return state

    def _prune(self) -> None:
        for stale in self.list()[: -self.keep]:
            if self.folder is None:
                del self._memory[stale.step]
            else:
                stale.path.unlink(missing_ok=True)
                _sum_path(stale.path).unlink(missing_ok=True)

    def _remove_partial_writes(self) -> None:
        if self._cleaned or self.folder is None or not self.folder.is_dir():
            return
        for path in self.folder.glob(f"*{_TMP_SUFFIX}"):
            logger.warning(
                "removing partial checkpoint write %s (the writer was interrupted)", path
            )
            path.unlink(missing_ok=True)
        for path in self.folder.glob(f"*.pt{_SUM_SUFFIX}"):
            if not path.with_suffix("").exists():  # its checkpoint was never renamed in
                path.unlink(missing_ok=True)
        self._cleaned = True


def _sum_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + _SUM_SUFFIX)


def _write_synced(path: Path, data: bytes | memoryview) -> None:
    with path.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _verify(path: Path) -> None:
    """Check ``path`` against its checksum file, if it has one.

    Raises:
        UnreadableCheckpoint: The file does not match, or the checksum file is unreadable.
    """
    checksum = _sum_path(path)
    try:
        with _open(checksum) as file:
            line = file.read(200).decode("ascii")
    except FileNotFoundError:
        return  # written before checksums were recorded
    except (OSError, ValueError) as exc:
        raise UnreadableCheckpoint(
            path, f"its checksum file {checksum.name} is unreadable ({exc})", "damaged"
        ) from exc
    match = _SUM_LINE.match(line)
    if match is None:
        raise UnreadableCheckpoint(
            path, f"its checksum file {checksum.name} is not a SHA-256 line", "damaged"
        )
    digest = hashlib.sha256()
    try:
        with _open(path) as file:
            while block := file.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise UnreadableCheckpoint(path, why_unreadable(exc, "torch checkpoint")) from exc
    if digest.hexdigest() != match.group(1):
        raise UnreadableCheckpoint(
            path,
            f"its content does not match the SHA-256 in {checksum.name} (it changed after it "
            "was written: a disk, copy or memory error)",
            "damaged",
        )


def _open(path: Path) -> BinaryIO:
    """``path`` opened to read, only if it is a regular file (a link is not followed, and a
    FIFO does not block the reader).

    Raises:
        FileNotFoundError: It is missing.
        OSError: It is not a regular file (the message says what it is), or cannot be read.
    """
    try:
        return os.fdopen(open_fd(path, os.O_RDONLY), "rb")
    except NotARegularFile as exc:
        raise OSError(errno.EINVAL, f"it is {exc.kind}, not a file") from None


def _load(source: BinaryIO | io.BytesIO, name: str | Path) -> dict[str, Any]:
    # weights_only: a checkpoint holds tensors and plain data only (extension state too),
    # so loading one never runs code from the file.
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise UnreadableCheckpoint(name, why_unreadable(exc, "torch checkpoint")) from exc
    if not isinstance(state, dict):
        raise UnreadableCheckpoint(name, "it does not hold a dict")
    return state


def _fsync_folder(folder: Path) -> None:
    # The rename itself must reach the disk, or a power cut could forget it.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

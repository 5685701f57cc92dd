"""One version of the policy's weights on its way to the rollout workers.

The learner publishes each version once, as a :class:`PolicyWeights`: a copy of the policy's
parameters and buffers on the learner's own device, cast to the dtype rollouts sample in
(bf16 on a GPU by default). A copy, because the learner keeps training (in async mode, while
workers still sample) and a worker must never read a half-updated version; on a GPU it is one
device-side cast-and-copy, queued without waiting.

How a version reaches a worker depends on where the worker is:

* a co-located worker (the local backend) copies it straight into its own model,
  :meth:`PolicyWeights.load_into`: device to device, nothing serialised, into the model's
  existing tensors (a captured CUDA graph keeps reading the same addresses);
* a Ray actor gets it as bytes, :meth:`PolicyWeights.to_bytes`, serialised once per version
  however many actors fetch it.

Tensors shared inside the policy (tied input and output embeddings) are copied once.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping

import torch
from torch import Tensor
from torch import nn

__all__ = ["PolicyWeights"]


def _identity(tensor: Tensor) -> tuple[object, ...]:
    """What makes two state-dict entries the same tensor (tied weights share all of it)."""
    return (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())


class PolicyWeights:
    """A policy's state dict as rollout workers load it (see the module docstring).

    Build it with :meth:`of` (from a policy) or :meth:`from_bytes` (what :meth:`to_bytes`
    wrote). It never changes after it is built, so any number of threads may read it.

    Args:
        tensors: The state dict (names as ``policy.state_dict()`` gives them).
        partial: The tensors are part of the state dict: what training changes (a LoRA
            adapter; the workers hold the frozen base already). A worker keeps the rest.
    """

    def __init__(self, tensors: Mapping[str, Tensor], *, partial: bool = False) -> None:
        self.tensors = dict(tensors)
        self.partial = partial
        self._bytes: bytes | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(
        cls,
        policy: nn.Module,
        dtype: torch.dtype | None = None,
        *,
        state: Mapping[str, Tensor] | None = None,
    ) -> PolicyWeights:
        """A copy of ``policy``'s state dict (or of ``state``, the part of it that training
        changes: then :attr:`partial`), on its device, floating-point tensors cast to
        ``dtype`` (None: as they are). Queued on the current stream without waiting."""
        copies: dict[tuple[object, ...], Tensor] = {}
        out: dict[str, Tensor] = {}
        with torch.no_grad():
            for name, tensor in (policy.state_dict() if state is None else state).items():
                key = _identity(tensor)
                copy = copies.get(key)
                if copy is None:
                    target = dtype if dtype is not None and tensor.is_floating_point() else None
                    copy = tensor.detach().to(dtype=target or tensor.dtype, copy=True)
                    copies[key] = copy
                out[name] = copy
        return cls(out, partial=state is not None)

    @classmethod
    def from_bytes(cls, data: bytes) -> PolicyWeights:
        """What :meth:`to_bytes` wrote (on the CPU)."""
        saved = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return cls(saved["tensors"], partial=saved["partial"])

    @property
    def nbytes(self) -> int:
        """Bytes the tensors hold (shared ones once)."""
        unique = {_identity(t): t for t in self.tensors.values()}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def to_bytes(self) -> bytes:
        """The tensors serialised on the CPU (made once, then kept: one per version)."""
        with self._lock:
            if self._bytes is None:
                moved: dict[tuple[object, ...], Tensor] = {}
                cpu = {}
                for name, tensor in self.tensors.items():
                    key = _identity(tensor)
                    if key not in moved:
                        moved[key] = tensor.cpu()
                    cpu[name] = moved[key]  # shared storage is saved once
                buffer = io.BytesIO()
                torch.save({"tensors": cpu, "partial": self.partial}, buffer)
                self._bytes = buffer.getvalue()
            return self._bytes

    def load_into(self, module: nn.Module) -> None:
        """Copy these weights into ``module``'s own tensors, wherever they are (casting to
        their dtype); the module's tensors keep their storage.

        Raises:
            KeyError: The names differ from the module's (another architecture).
            RuntimeError: A shape differs.
        """
        targets = module.state_dict()
        missing = set() if self.partial else targets.keys() - self.tensors.keys()
        unexpected = self.tensors.keys() - targets.keys()
        if missing or unexpected:
            raise KeyError(
                f"the weights do not fit the model: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unexpected)[:3]}"
            )
        written: set[tuple[object, ...]] = set()
        with torch.no_grad():
            for name, target in targets.items():
                if name not in self.tensors:
                    continue  # partial: the frozen base the worker holds already
                key = _identity(target)
                if key in written:
                    continue  # tied to one already written
                written.add(key)
                source = self.tensors[name]
                # Asynchronous on one device (ordered on its stream); across devices a copy
                # into pageable memory must complete before the caller reads it.
                target.copy_(source, non_blocking=source.device == target.device)

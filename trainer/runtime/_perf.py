"""How hard a step worked the hardware: tokens per second, generation speed, GPU memory, MFU.

:class:`PerfMeter` turns what a step did (the tokens it generated and trained on, how long
it took) into the ``perf/*`` metrics. Model FLOP utilisation (``perf/mfu``) is the step's
model FLOPs over its wall time times the device's peak, the way PaLM defines it: a forward
pass costs ``2 N`` FLOPs per token and a forward and backward pass ``6 N``, for ``N`` the
parameters that multiply (attention's own term is left out: small at RL completion
lengths). A step counts the generation (prompt and completion tokens, once), the update
(prompt and response tokens, each epoch) and the reference forward when the KL term is on.
The peaks are the vendors' dense (no sparsity) figures in :data:`PEAK_FLOPS`; a device not
in it, and the CPU, report no MFU, and the CPU no GPU memory either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["PEAK_FLOPS", "PerfMeter", "StepWork", "model_parameters", "peak_flops"]

PEAK_FLOPS: Mapping[str, tuple[float, float]] = {
    # Name as torch.cuda.get_device_name reports it (a part of it; the first match wins, so
    # the more specific names come first): (bf16 tensor-core dense, plain fp32) FLOP/s.
    "GB200": (2.5e15, 80e12),
    "B200": (2.25e15, 75e12),
    "GH200": (989e12, 67e12),
    "H200": (989e12, 67e12),
    "H100 PCIe": (756e12, 51e12),
    "H100 NVL": (835e12, 60e12),
    "H100": (989e12, 67e12),
    "H800": (989e12, 67e12),
    "H20": (148e12, 44e12),
    "A100": (312e12, 19.5e12),
    "A800": (312e12, 19.5e12),
    "L40S": (362e12, 91.6e12),
    "L40": (181e12, 90.5e12),
    "L4": (121e12, 30.3e12),
    "A10": (125e12, 31.2e12),
    "RTX 6000 Ada": (364e12, 91.1e12),
    "RTX A6000": (155e12, 38.7e12),
    "RTX 5090": (210e12, 104.8e12),
    "RTX 4090": (165e12, 82.6e12),
    "RTX 3090": (71e12, 35.6e12),
    "MI300X": (1307e12, 163.4e12),
    "MI250X": (383e12, 47.9e12),
}
"""Peak FLOP/s of common accelerators by (part of) their name: bf16 on tensor cores (dense,
no sparsity) and plain fp32 (what float32 matmuls get without TF32, torch's default)."""


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The peak FLOP/s of ``device`` computing in ``dtype`` (None: the CPU, or a device not
    in :data:`PEAK_FLOPS`)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for part, (bf16, fp32) in PEAK_FLOPS.items():
        if part in name:
            return bf16 if dtype in (torch.bfloat16, torch.float16) else fp32
    return None


def model_parameters(policy: nn.Module) -> int:
    """The parameters that multiply: all of them (tied ones once), less an input embedding
    that is only looked up (one tied to the output layer multiplies there)."""
    seen = {p.data_ptr(): p.numel() for p in policy.parameters()}
    inputs = getattr(getattr(policy, "model", policy), "get_input_embeddings", None)
    outputs = getattr(getattr(policy, "model", policy), "get_output_embeddings", None)
    if inputs is not None and outputs is not None:
        embedding, head = inputs(), outputs()
        if embedding is not None and head is not None:
            weight = embedding.weight
            if head.weight.data_ptr() != weight.data_ptr():
                seen.pop(weight.data_ptr(), None)
    return sum(seen.values())


@dataclass(frozen=True, slots=True)
class StepWork:
    """What a step computed.

    Attributes:
        prompt_tokens: Prompt tokens of the samples trained on.
        response_tokens: Their response tokens.
        generated_tokens: Tokens the rollout workers generated during the step.
        generate_s: Seconds they spent generating them (summed over workers).
        step_s: The step's wall time.
    """

    prompt_tokens: int
    response_tokens: int
    generated_tokens: int
    generate_s: float
    step_s: float


class PerfMeter:
    """The ``perf/*`` metrics of each step (see the module docstring).

    Args:
        policy: The policy being trained (its size, its device).
        dtype: The dtype it computes in (which peak applies).
        epochs: Passes of the update over each batch.
        reference: Whether a reference forward scores each batch (the KL term).
    """

    def __init__(
        self, policy: nn.Module, dtype: torch.dtype, *, epochs: int, reference: bool
    ) -> None:
        self.device = next(policy.parameters()).device
        self.parameters = model_parameters(policy)
        self.peak = peak_flops(self.device, dtype)
        # Forward passes per trained token: the update's 3 (forward and backward) per epoch,
        # the generation's 1, the reference's 1.
        self._passes = 3 * epochs + 1 + (1 if reference else 0)

    def begin_step(self) -> None:
        """Start measuring a step (its peak memory)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def metrics(self, work: StepWork) -> dict[str, float]:
        """The step's ``perf/*`` metrics."""
        tokens = work.prompt_tokens + work.response_tokens
        out = {
            "perf/tokens_per_s": tokens / work.step_s if work.step_s > 0 else 0.0,
            "perf/gen_tokens_per_s": (
                work.generated_tokens / work.generate_s if work.generate_s > 0 else 0.0
            ),
        }
        if self.device.type == "cuda":
            out["perf/gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        if self.peak is not None and work.step_s > 0:
            flops = 2 * self.parameters * tokens * self._passes
            out["perf/mfu"] = flops / (work.step_s * self.peak)
        return out

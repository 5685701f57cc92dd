"""The perf metrics: tokens per second, generation speed and, on a GPU, peak memory and MFU
against the table of device peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.helpers import tiny_config
from trainer import PPOTrainer
from trainer.rl._hf_policy import HFPolicy
from trainer.rl._policy import PolicyConfig
from trainer.rl._policy import build_policy
from trainer.runtime._perf import PerfMeter
from trainer.runtime._perf import StepWork
from trainer.runtime._perf import model_parameters
from trainer.runtime._perf import peak_flops

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", torch.bfloat16, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
        ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
        ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
        ("NVIDIA A10", torch.bfloat16, 125e12),
        ("NVIDIA L4", torch.bfloat16, 121e12),
        ("NVIDIA L40S", torch.bfloat16, 362e12),
        ("NVIDIA GeForce RTX 4090", torch.bfloat16, 165e12),
        ("AMD Instinct MI300X", torch.bfloat16, 1307e12),
        ("Some Future GPU", torch.bfloat16, None),
    ],
)
def test_a_devices_peak_is_looked_up_by_its_name(
    name: str, dtype: torch.dtype, peak: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda"), dtype) == peak


def test_the_cpu_has_no_peak() -> None:
    assert peak_flops(torch.device("cpu"), torch.float32) is None


def test_mfu_counts_six_n_a_trained_token_an_epoch_and_two_n_to_generate_it() -> None:
    policy = build_policy(PolicyConfig(), seed=0)
    meter = PerfMeter(policy, torch.bfloat16, epochs=2, reference=True)
    n = sum(p.numel() for p in policy.parameters())
    assert meter.parameters == n
    work = StepWork(
        prompt_tokens=700, response_tokens=300, generated_tokens=320, generate_s=0.5, step_s=2.0
    )
    metrics = meter.metrics(work)
    assert metrics == {"perf/tokens_per_s": 500.0, "perf/gen_tokens_per_s": 640.0}  # CPU
    meter.peak = 1e9  # as a GPU in the table would have it
    flops = (6 * 2 + 2 + 2) * n * 1000  # update (two epochs), generation, reference
    assert meter.metrics(work)["perf/mfu"] == pytest.approx(flops / (2.0 * 1e9))


def test_the_parameters_that_multiply_count_a_tied_embedding_once(hf_model: Path) -> None:
    policy = HFPolicy.load(hf_model)
    model = policy.model
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert model_parameters(policy) == sum(unique.values())  # tied: the head multiplies
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie
    untied = sum(p.numel() for p in model.parameters())
    assert untied > sum(unique.values())
    looked_up = model.get_input_embeddings().weight.numel()  # only looked up now
    assert model_parameters(policy) == untied - looked_up


def test_every_step_of_a_run_reports_its_throughput(tmp_path: Path) -> None:
    PPOTrainer(tiny_config(run__steps=2), out_dir=tmp_path).run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        tokens = row["batch/samples"] * (row["prompt_length/mean"] + row["response_length/mean"])
        assert row["perf/tokens_per_s"] == pytest.approx(tokens / row["timing_s/step"], rel=1e-3)
        assert row["perf/gen_tokens_per_s"] > 0
        assert "perf/mfu" not in row and "perf/gpu_mem_peak_gb" not in row  # the CPU

"""LoRA (``[model.lora]``): only the adapter trains, the reference is the base under it, the
adapter is what travels, what checkpoints hold and what ``model/`` holds; merge writes a
plain model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer import PPOTrainer
from trainer import TrainerConfig
from trainer.rl._hf_policy import HFPolicy
from trainer.rl._weights import PolicyWeights

from ..helpers import tiny_config

torch.set_num_threads(1)

LORA = {"model__lora": {"r": 4, "alpha": 8.0}}


def lora_config(model: Path, **overrides: Any) -> TrainerConfig:
    """reverse-3 rendered as text, on a LoRA adapter of ``model``."""
    values = {"model__path": str(model), "task__params": {"length": 3}, **LORA}
    return tiny_config(**{**values, **overrides})


def adapter(fit: PPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in fit.learner.policy_state().items()}


def base(fit: PPOTrainer) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().clone()
        for name, p in fit.policy.named_parameters()
        if ".lora_" not in name
    }


async def test_only_the_adapter_trains_and_the_optimizer_holds_only_it(
    hf_model: Path, tmp_path: Path
) -> None:
    fit = PPOTrainer(lora_config(hf_model), out_dir=tmp_path)
    trainable = [p for p in fit.policy.parameters() if p.requires_grad]
    held = [p for group in fit.learner.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in held] == [id(p) for p in trainable]
    names = {name for name, p in fit.policy.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    frozen, tuned = base(fit), adapter(fit)

    await fit.fit()

    assert all(torch.equal(frozen[n], v) for n, v in base(fit).items())  # the base is untouched
    assert not all(torch.equal(tuned[n], v) for n, v in adapter(fit).items())


async def test_the_reference_is_the_base_model_under_the_adapter_not_a_copy(
    hf_model: Path,
) -> None:
    fit = PPOTrainer(lora_config(hf_model, ppo__kl_coef=0.1))
    reference = fit.learner.reference
    assert reference is not None and not isinstance(reference, torch.nn.Module)
    # The reference's parameters are the policy's own base tensors: no second copy.
    policy_base = {p.data_ptr() for n, p in fit.policy.named_parameters() if ".lora_" not in n}
    assert {p.data_ptr() for p in reference.parameters()} == policy_base  # type: ignore[union-attr]
    await fit.fit()  # the adapter moves away from the base
    plain = HFPolicy.load(hf_model)
    prompts, responses = [(1, 2, 3)], [(4, 5, 6)]
    with torch.no_grad():
        expected, _, _ = plain.response_logprobs(prompts, responses)
        got, _, _ = reference.response_logprobs(prompts, responses)
        tuned, _, _ = fit.policy.response_logprobs(prompts, responses)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(tuned, expected, atol=1e-6)
    assert fit.learner.state_dict()["reference"] is None  # nothing of it is checkpointed


def test_weight_sync_ships_only_the_adapter(hf_model: Path) -> None:
    fit = PPOTrainer(lora_config(hf_model))
    weights = fit.learner.weights()
    trainable = {name for name, p in fit.policy.named_parameters() if p.requires_grad}
    assert set(weights.tensors) == trainable and weights.partial
    whole = PolicyWeights.of(fit.policy)
    assert weights.nbytes < whole.nbytes / 5
    assert len(weights.to_bytes()) < len(whole.to_bytes()) / 5  # what a Ray actor is sent
    # A worker's model takes it into its adapter and keeps its own base.
    worker = HFPolicy.load(hf_model, lora=fit.config.model.lora, seed=99)
    base = {n: t.clone() for n, t in worker.state_dict().items() if n not in trainable}
    PolicyWeights.from_bytes(weights.to_bytes()).load_into(worker)
    for name, value in worker.state_dict().items():
        expected = weights.tensors[name] if name in trainable else base[name]
        assert torch.equal(value, expected), name


async def test_a_lora_run_resumes_bit_for_bit_from_checkpoints_of_the_adapter(
    hf_model: Path, tmp_path: Path
) -> None:
    config = {"ppo__kl_coef": 0.05, "optimizer__warmup_steps": 2}
    straight = PPOTrainer(lora_config(hf_model, run__steps=4, **config), out_dir=tmp_path / "a")
    await straight.fit()
    first = PPOTrainer(lora_config(hf_model, run__steps=2, **config), out_dir=tmp_path / "b")
    await first.fit()
    second = PPOTrainer(lora_config(hf_model, run__steps=4, **config), out_dir=tmp_path / "b")
    assert (await second.fit()).start_step == 2

    for name, value in adapter(straight).items():
        assert torch.equal(value, adapter(second)[name])
    checkpoint = torch.load(tmp_path / "b" / "checkpoints" / "step-00000002.pt", weights_only=True)
    assert set(checkpoint["policy"]) == set(adapter(second))  # the adapter, not the base
    metrics = [
        [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("a", "b")
    ]
    assert [m["reward/mean"] for m in metrics[0]] == [m["reward/mean"] for m in metrics[1]]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_model_folder_holds_the_adapter_and_merge_writes_a_plain_model(
    hf_model: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    fit = PPOTrainer(lora_config(hf_model, run__steps=2), out_dir=run)
    fit.run()
    assert (run / "model" / "adapter_config.json").is_file()
    assert not (run / "model" / "config.json").exists()  # not a copy of the base
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        trained = fit.policy.model(input_ids=ids).logits
        base_model = AutoModelForCausalLM.from_pretrained(hf_model, local_files_only=True)
        loaded = PeftModel.from_pretrained(base_model, run / "model").eval()
        assert torch.allclose(loaded(input_ids=ids).logits, trained, atol=1e-6)

    done = subprocess.run(
        [sys.executable, "-m", "trainer", "model", "merge", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no library warning reaches the user
    merged = AutoModelForCausalLM.from_pretrained(run / "merged", local_files_only=True)
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, trained, atol=1e-5)
    assert (run / "merged" / "tokenizer.json").is_file()

    again = subprocess.run(
        [sys.executable, "-m", "trainer", "model", "merge", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: model merge: --out {run / 'merged'}: already exists and is not empty; "
        "choose another --out"
    ]


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("nowhere", "does not exist (expected a run folder)"),
        ("full", "holds the whole model already"),
        ("empty", "has no model/adapter_config.json"),
    ],
)
def test_merge_of_what_is_not_an_adapter_is_one_line(
    hf_model: Path, tmp_path: Path, folder: str, message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model").symlink_to(hf_model)
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "model", "merge", str(tmp_path / folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model merge: ") and message in lines[0]


class NotATensor:
    """What a pickled adapter_model.bin may hold beside its tensors."""


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            "pickled",
            "adapter_model.bin: it holds objects other than tensors and plain data "
            f"(a {__name__}.NotATensor)",
        ),
        ("cut", "adapter_model.safetensors: it is corrupt, cut short or not a weights file"),
    ],
)
def test_merge_of_adapter_weights_it_cannot_read_is_one_line(
    hf_model: Path,
    tmp_path: Path,
    damage: str,
    why: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from peft import LoraConfig
    from peft import get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trainer.cli._main import main

    folder = tmp_path / "run" / "model"
    base_model = AutoModelForCausalLM.from_pretrained(hf_model, local_files_only=True)
    get_peft_model(
        base_model, LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
    ).save_pretrained(folder)
    weights = folder / "adapter_model.safetensors"
    if damage == "pickled":  # torch.save of the adapter, with an object that is no tensor
        torch.save({**load_file(weights), "extra": NotATensor()}, folder / "adapter_model.bin")
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:100])
    assert main(["model", "merge", str(tmp_path / "run"), "--base", str(hf_model)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: model merge: cannot read the adapter's weights in {folder}: ")
    assert why in line and "weights_only" not in line  # not torch's advice to load it unsafely
    assert not (tmp_path / "run" / "merged").exists()


def test_adapter_dropout_is_on_only_where_gradients_are(hf_model: Path) -> None:
    from trainer.rl._hparams import LoraConfig

    policy = HFPolicy.load(hf_model, lora=LoraConfig(r=4, dropout=0.5))
    with torch.no_grad():  # make the adapter matter
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_()
    prompts, responses = [(1, 2, 3)], [(4, 5, 6, 7)]
    with torch.no_grad():
        a, _, _ = policy.response_logprobs(prompts, responses)
        b, _, _ = policy.response_logprobs(prompts, responses)
    assert torch.equal(a, b)  # scoring and sampling see no dropout
    torch.manual_seed(0)
    c, _, _ = policy.response_logprobs(prompts, responses)
    d, _, _ = policy.response_logprobs(prompts, responses)
    assert not torch.equal(c, d)  # the update's forward does
    with torch.no_grad():
        e, _, _ = policy.response_logprobs(prompts, responses)
    assert torch.equal(a, e)  # and it is off again after


def test_lora_r_flag_sets_the_adapter(hf_model: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--model", str(hf_model), "--lora-r", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: model.lora.r: expected `int` >= 1"


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
async def test_a_lora_run_on_ray_samples_with_the_shipped_adapter(
    hf_model: Path, tmp_path: Path
) -> None:
    config = lora_config(
        hf_model, rollout__backend="ray", rollout__wait_timeout_s=120.0, run__steps=2
    )
    local = PPOTrainer(lora_config(hf_model, run__steps=2), out_dir=tmp_path / "local")
    await local.fit()
    remote = PPOTrainer(config, out_dir=tmp_path / "ray")
    summary = await remote.fit()
    assert summary.status == "finished" and summary.steps == 2
    # The actors sampled from the adapter they were sent: the same rollouts as the local run.
    rewards = [
        [json.loads(line)["reward/mean"] for line in (tmp_path / run / "metrics.jsonl").open()]
        for run in ("local", "ray")
    ]
    assert rewards[0] == rewards[1]
    assert (tmp_path / "ray" / "model" / "adapter_config.json").is_file()

"""A Hugging Face causal LM as a policy: loading, sampling with the cache, the update."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainer.rl._grpo import PPOConfig
from trainer.rl._grpo import Sample
from trainer.rl._grpo import group_samples
from trainer.rl._grpo import ppo_update
from trainer.rl._hf import ModelLoadError
from trainer.rl._hf_init import init_model
from trainer.rl._hf_policy import HFPolicy
from trainer.rl._hf_policy import resolve_device

torch.set_num_threads(1)


@pytest.fixture
def policy(hf_model: Path) -> HFPolicy:
    return HFPolicy.load(hf_model)


def test_model_init_writes_what_the_auto_classes_load(hf_model: Path) -> None:
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_model, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(hf_model, local_files_only=True)
    assert 40_000 < sum(p.numel() for p in model.parameters()) < 70_000  # like the built-in
    ids = tokenizer("31415=").input_ids
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7  # one token per character
    assert tokenizer.decode(ids, skip_special_tokens=True) == "31415="


def test_model_init_covers_the_characters_it_is_given(tmp_path: Path) -> None:
    init_model(tmp_path, texts=["héllo wörld"], context=16)
    policy = HFPolicy.load(tmp_path)
    assert policy.decode(policy.encode("héllo wörld")) == "héllo wörld"
    assert policy.tokenizer.unk_token_id not in policy.encode("héllo wörld")


CUSTOM_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
"""


def with_custom_code(hf_model: Path, folder: Path, file: str, marker: Path) -> Path:
    """A copy of ``hf_model`` whose ``file`` (config.json or tokenizer_config.json) names a
    Python file of the folder's own that writes ``marker`` when it runs."""
    shutil.copytree(hf_model, folder)
    (folder / "custom.py").write_text(CUSTOM_CODE.format(marker=str(marker)))
    data = json.loads((folder / file).read_text())
    if file == "config.json":
        data["model_type"] = "custom"  # no class of transformers' own builds it
        data["auto_map"] = {"AutoConfig": "custom.Config", "AutoModelForCausalLM": "custom.LM"}
    else:
        data["tokenizer_class"] = "CustomTokenizer"
        data["auto_map"] = {"AutoTokenizer": ["custom.CustomTokenizer", None]}
    (folder / file).write_text(json.dumps(data))
    return folder


def test_a_folder_asking_to_run_its_own_code_is_refused_and_its_code_never_runs(
    hf_model: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    folder = with_custom_code(hf_model, tmp_path / "model", "config.json", marker)
    with pytest.raises(ModelLoadError) as refused:
        HFPolicy.load(folder)
    assert str(refused.value) == (
        f"{folder / 'config.json'} asks to run Python code from the model folder (custom.py, "
        "through its auto_map); trainbus runs no code it was not asked to: set [model] "
        "trust_remote_code = true to run that code, only for a folder you trust"
    )
    assert not marker.exists()


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_folder_naming_code_is_refused_even_where_transformers_has_a_class_of_its_own(
    hf_model: Path, tmp_path: Path, file: str
) -> None:
    # The model's own type (gpt2) has classes of transformers' own: they would be used in
    # silence, and the folder's code, which says how it wants to be built, ignored.
    marker = tmp_path / "ran"
    folder = with_custom_code(hf_model, tmp_path / "model", file, marker)
    data = json.loads((folder / "config.json").read_text())
    data["model_type"] = json.loads((hf_model / "config.json").read_text())["model_type"]
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ModelLoadError) as refused:
        HFPolicy.load(folder)
    assert str(refused.value).startswith(
        f"{folder / file} asks to run Python code from the model folder (custom.py, "
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("config.json", "has no config.json"),
        ("model.safetensors", "has no weights"),
        ("tokenizer.json", "has no tokenizer"),
    ],
)
def test_a_folder_missing_a_part_names_it(
    hf_model: Path, tmp_path: Path, remove: str, message: str
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(hf_model, folder)
    (folder / remove).unlink()
    if remove == "tokenizer.json":
        (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ModelLoadError, match=message):
        HFPolicy.load(folder)
    with pytest.raises(ModelLoadError, match="does not exist"):
        HFPolicy.load(tmp_path / "nowhere")


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        (folder / name).write_bytes(data)

    return damage


def _as_pytorch_bin(data: bytes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(data)

    return damage


def _without_tokenizer_json(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()


def _drop_the_mlp_weights(folder: Path) -> None:
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    weights = load_file(folder / "model.safetensors")
    kept = {name: tensor for name, tensor in weights.items() if ".mlp." not in name}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})


def _narrow_the_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["n_embd"] = 32
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            _write("model.safetensors", b"garbage\n"),
            "cannot read the weights of {folder}: model.safetensors: it is corrupt, cut short "
            "or not a weights file (Error while deserializing header: header too large)",
        ),
        (_write("model.safetensors", b""), "model.safetensors: it is corrupt, cut short or not"),
        # The words of a damaged checkpoint: one wording for a damaged torch file.
        (
            _as_pytorch_bin(b"garbage\n"),
            "pytorch_model.bin: it is corrupt, or not a weights file (unsupported operand 103)",
        ),
        (
            _as_pytorch_bin(b"PK\x03\x04garbage"),
            "pytorch_model.bin: it is corrupt or cut short (not a complete zip archive)",
        ),
        (
            _without_tokenizer_json,
            "cannot build the tokenizer in {folder} from the files there: it has "
            "tokenizer_config.json but none of tokenizer.json, tokenizer.model, vocab.json, "
            "which a tokenizer is built from (save the tokenizer with save_pretrained)",
        ),
        (
            _write("tokenizer.json", b"garbage"),
            "cannot build the tokenizer in {folder}: tokenizer.json is not valid JSON",
        ),
        (_write("config.json", b"garbage"), "cannot load the model in {folder}: It looks like"),
        # transformers initialises what the file lacks at random and only warns (a warning
        # trainbus keeps off the terminal); a shape mismatch it reports in a log "above".
        (
            _drop_the_mlp_weights,
            "the weights in {folder} do not fit its config.json: model.safetensors lacks 4 "
            "of the model's tensors (transformer.h.0.mlp.c_fc.bias, ",
        ),
        (
            _narrow_the_config,
            "the weights in {folder} do not fit its config.json: 16 tensors have another "
            "shape in model.safetensors (transformer.h.0.attn.c_attn.bias is [192] there, "
            "[96] in the model, ",
        ),
    ],
    ids=[
        "garbage-safetensors",
        "empty-safetensors",
        "garbage-bin",
        "garbage-zip-bin",
        "no-tokenizer-json",
        "garbage-tokenizer-json",
        "garbage-config",
        "missing-tensors",
        "other-shapes",
    ],
)
def test_a_damaged_file_is_one_line_naming_it(
    hf_model: Path, tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(hf_model, folder)
    damage(folder)
    with pytest.raises(ModelLoadError) as caught:
        HFPolicy.load(folder)
    assert message.format(folder=folder) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_tokenizer_without_a_pad_token_pads_with_eos_and_says_so(
    hf_model: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(hf_model, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("pad_token", None)
    config_path.write_text(json.dumps(config))
    policy = HFPolicy.load(folder)
    assert policy.pad_id == policy.eos_id
    assert any("no pad token" in notice for notice in policy.notices)


def test_auto_device_is_the_cpu_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        resolve_device("cuda")


def _prompts(policy: HFPolicy) -> list[tuple[int, ...]]:
    return [policy.encode("12345="), policy.encode("7="), policy.encode("906=")]  # 3 lengths


@pytest.mark.parametrize("lengths", ["mixed", "equal"])
def test_generation_with_and_without_the_cache_samples_the_same_tokens(
    policy: HFPolicy, lengths: str
) -> None:
    prompts = _prompts(policy)
    if lengths == "equal":
        prompts = [policy.encode("123="), policy.encode("456=")]
    cached = policy.generate(prompts, 4, 8, torch.Generator().manual_seed(3))
    plain = policy.generate(prompts, 4, 8, torch.Generator().manual_seed(3), use_cache=False)
    assert [[c.tokens for c in g] for g in cached] == [[c.tokens for c in g] for g in plain]
    again = policy.generate(prompts, 4, 8, torch.Generator().manual_seed(3))
    assert again == cached
    other = policy.generate(prompts, 4, 8, torch.Generator().manual_seed(4))
    assert other != cached


@pytest.mark.parametrize("lengths", ["mixed", "equal"])  # padded, and the unpadded fast path
def test_sampled_logprobs_are_what_the_update_recomputes(policy: HFPolicy, lengths: str) -> None:
    prompts = _prompts(policy)
    if lengths == "equal":
        prompts = [policy.encode("123="), policy.encode("456="), policy.encode("789=")]
    for temperature in (1.0, 0.7):
        groups = policy.generate(prompts, 3, 6, torch.Generator().manual_seed(1), temperature)
        rows = [(p, c) for p, g in zip(prompts, groups, strict=True) for c in g]
        logprobs, _, mask = policy.response_logprobs(
            [p for p, _ in rows], [c.tokens for _, c in rows], temperature
        )
        for row, (_, completion) in enumerate(rows):
            n = len(completion.tokens)
            assert mask[row, :n].all() and not mask[row, n:].any()
            torch.testing.assert_close(
                logprobs[row, :n], torch.tensor(completion.logprobs), atol=1e-5, rtol=0
            )


def test_generation_stops_at_eos_the_budget_and_the_context(policy: HFPolicy) -> None:
    with torch.no_grad():
        policy.model.lm_head.weight[policy.eos_id] += 0.5  # tied: EOS becomes likely
    prompts = _prompts(policy)
    groups = policy.generate(prompts, 8, 6, torch.Generator().manual_seed(0))
    lengths = set()
    for group in groups:
        for completion in group:
            assert len(completion.tokens) <= 6
            assert policy.eos_id not in completion.tokens[:-1]
            if len(completion.tokens) < 6:
                assert completion.tokens[-1] == policy.eos_id
            lengths.add(len(completion.tokens))
    assert len(lengths) > 1
    context = policy.context_length
    assert context == 32
    long_prompt = tuple(policy.encode("1" * 29))  # 30 tokens: room for 2
    (group,) = policy.generate([long_prompt], 2, 10, torch.Generator().manual_seed(0))
    assert all(len(c.tokens) <= context - len(long_prompt) for c in group)
    with pytest.raises(ValueError, match="fills the context"):
        policy.generate([policy.encode("1" * 40)], 1, 4, torch.Generator())


def test_top_p_draws_only_from_the_nucleus(policy: HFPolicy) -> None:
    prompts = _prompts(policy)
    greedy = policy.generate(prompts, 1, 5, torch.Generator(), temperature=0.0)
    tiny = policy.generate(prompts, 4, 5, torch.Generator().manual_seed(0), top_p=1e-6)
    for g, t in zip(greedy, tiny, strict=True):
        assert all(c.tokens == g[0].tokens for c in t)  # only the most likely token is left


def test_ppo_on_an_hf_model_reduces_the_loss_on_a_fixed_batch(policy: HFPolicy) -> None:
    prompts = _prompts(policy)
    groups = policy.generate(prompts, 8, 5, torch.Generator().manual_seed(0))
    samples: list[Sample] = []
    for prompt, group in zip(prompts, groups, strict=True):
        rewards = [float(policy.decode(c.tokens).count("1")) for c in group]
        samples += group_samples(prompt, group, rewards)
    assert any(s.advantage != 0 for s in samples)
    config = PPOConfig(epochs=1, dual_clip=None)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    first = ppo_update(policy, None, optimizer, samples, config)
    later = [ppo_update(policy, None, optimizer, samples, config)["loss"] for _ in range(5)]
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # sampled log-probs are valid
    assert later[-1] < first["loss"]


def test_kl_entropy_and_clip_options_apply_to_hf_models(policy: HFPolicy) -> None:
    from trainer.rl._policy import frozen_copy

    prompts = _prompts(policy)
    groups = policy.generate(prompts, 4, 5, torch.Generator().manual_seed(0))
    samples: list[Sample] = []
    for prompt, group in zip(prompts, groups, strict=True):
        samples += group_samples(prompt, group, [float(len(c.tokens)) for c in group])
    reference = frozen_copy(policy)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    config = PPOConfig(epochs=3, kl_coef=0.1, entropy_coef=0.01, clip_eps_high=0.3)
    metrics = ppo_update(policy, reference, optimizer, samples, config)
    assert metrics["kl"] > 0  # the policy moved away from the reference during the epochs
    assert metrics["entropy"] > 0

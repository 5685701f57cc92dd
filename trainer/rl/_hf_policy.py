"""A Hugging Face causal LM as a trainbus policy: loading, sampling with the KV cache, and
the log-probs the update needs.

:class:`HFPolicy` wraps any ``transformers`` causal LM saved with ``save_pretrained`` and
its tokenizer, loaded from disk only. It samples with its own decoding rather than
``generate()`` (:mod:`._sampler`: batches bounded by a token budget, a static KV cache,
CUDA graphs on a GPU): draws come from an explicit ``torch.Generator`` (so a piece of work
samples the same tokens whichever worker runs it, and two worker threads never share the
global RNG) and the log-prob of every sampled token is recorded under the tempered
distribution, exactly what :meth:`response_logprobs` recomputes for the update, so
on-policy ratios start at 1. Prompts of different lengths are left-padded for sampling
(with position ids that skip the padding) and right-padded for the update; dropout is off in
both (``eval()``), so both evaluate the same function.

Precision: the weights are stored in the dtype the policy is loaded in (the learner's in
float32, a sampler's in bf16 on a GPU by default), and :attr:`HFPolicy.autocast` runs the
forward passes under autocast (the learner's bf16 compute over float32 master weights).

With ``[model.lora]`` the model is wrapped in a peft LoRA adapter: only the adapter's
parameters require gradients, :meth:`HFPolicy.base_reference` scores with the adapter
switched off (the base model, without a second copy), and :meth:`HFPolicy.trainable_state`
is what changes in training (the adapter), for weight sync and checkpoints.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
import threading
import warnings
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch import nn

from ._hf import ModelLoadError
from ._hf import check_model_folder
from ._hf import fit_error
from ._hf import load_error
from ._hf import peft
from ._hf import tokenizer_error
from ._hf import transformers
from ._hf import weights_error
from ._hparams import Completion
from ._hparams import DtypeName
from ._hparams import LoraConfig
from ._hparams import WorkloadError
from ._policy import Scores
from ._policy import TokenBatch
from ._policy import score_responses
from ._sampler import DecoderCache
from ._sampler import DecodeSettings
from ._sampler import StaticDecoder
from ._sampler import auto_batch_tokens
from ._sampler import cache_length
from ._sampler import graph_rows
from ._sampler import pick
from ._sampler import plan_batches

__all__ = [
    "BaseReference",
    "HFPolicy",
    "ModelLoadError",
    "check_model_folder",
    "resolve_device",
    "resolve_dtype",
]


# from_pretrained builds the model under a process-wide "meta device" context: two threads
# loading at once (local rollout workers) corrupt each other's models. One at a time.
_LOAD_LOCK = threading.Lock()


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when there is one, else the CPU; ``cuda`` without one is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(name: DtypeName, device: torch.device) -> torch.dtype:
    """The compute dtype ``[model] dtype`` names on ``device``: ``auto`` is bf16 on a CUDA
    device that supports it, float32 elsewhere (the CPU included)."""
    if name == "bfloat16":
        return torch.bfloat16
    if name == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def _explicit_mask_attention(model: Any) -> str:
    """Make ``model`` attend with SDPA, else eager attention (the two that take an explicit
    mask, which the static-cache decoder builds), and say which; a model that takes neither
    keeps its own."""
    for name in ("sdpa", "eager"):
        try:
            model.set_attn_implementation(name)
        except (ValueError, ImportError, AttributeError):
            continue
        return name
    return "other"


def _weight_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged weights file raises: safetensors' header errors, torch.load's
    unpickling and zip-archive errors (RuntimeError), a file that ends early."""
    from safetensors import SafetensorError

    return (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError)


class HFPolicy(nn.Module):
    """A causal LM and its tokenizer, sampling and scoring token ids.

    Build it with :meth:`load`. Its ``state_dict`` is the model's (prefixed ``model.``), so
    weight sync and checkpoints treat it like the built-in policies.

    Attributes:
        model: The ``transformers`` model (kept in eval mode: no dropout).
        tokenizer: Its tokenizer.
        path: The folder it was loaded from.
        notices: What loading had to assume (e.g. EOS used as the pad token), for the user
            (its caller shows them: the run's workload logs them, the command line prints
            them).
        autocast: Run forward passes under autocast to this dtype (None: in the weights'
            own dtype). The learner sets bf16 over its float32 master weights.
        attention: The model's attention implementation, ``sdpa`` or ``eager`` (both take
            the explicit masks the static-cache decoder passes); another: decoded with the
            model's own cache.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        path: Path,
        notices: list[str],
        *,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.path = path
        self.notices = notices
        if tokenizer.eos_token_id is None:
            raise ModelLoadError(f"the tokenizer in {path} has no EOS token")
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.pad_id: int = int(tokenizer.pad_token_id)
        # transformers renamed ``past_key_values`` to ``cache`` within 5.x: take either.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's
        accepted = inspect.signature(inner.forward).parameters
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"
        self.autocast: torch.dtype | None = None
        self.attention = attention
        self._decoders = DecoderCache()
        self._static: bool | None = None  # whether the static-cache decoder fits the model
        self._auto_batch_tokens: int | None = None
        # The adapters' dropout layers: on only while the update computes gradients.
        self._lora_dropout = [
            module
            for name, module in model.named_modules()
            if name.endswith("lora_dropout.default") and isinstance(module, nn.Dropout)
        ]

    @property
    def adapter(self) -> bool:
        """Whether the model is a LoRA adapter over a frozen base (``[model.lora]``)."""
        return hasattr(self.model, "disable_adapter")

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        *,
        lora: LoraConfig | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
    ) -> HFPolicy:
        """Load a model folder written by ``save_pretrained`` (nothing is downloaded),
        its weights in ``dtype``.

        Args:
            path: The model folder.
            device: Where to put it (``auto``: CUDA when there is one).
            dtype: The weights' dtype.
            lora: Wrap the model in a new LoRA adapter (its initial weights drawn from
                ``seed``); None trains the whole model.
            seed: Seeds the adapter's initialisation (without touching the global RNG).
            trust_remote_code: Run the Python code the folder names for its config, model
                or tokenizer (``auto_map``); off, such a folder is refused, its code unrun.

        Raises:
            ModelLoadError: The folder lacks a config, weights or tokenizer, one of them
                cannot be read (naming the file), the weights do not fit the config, or
                it does not hold a causal LM (one line naming it).
        """
        folder = check_model_folder(path, trust_remote_code=trust_remote_code)
        hf = transformers()
        target = resolve_device(device) if isinstance(device, str) else device
        # The config first: the tokenizer reads it too, and would take the blame for it.
        with _LOAD_LOCK:
            try:
                config = hf.AutoConfig.from_pretrained(
                    folder, local_files_only=True, trust_remote_code=trust_remote_code
                )
            except (OSError, ValueError, KeyError) as exc:
                raise load_error(folder, exc) from None
            try:
                tokenizer = hf.AutoTokenizer.from_pretrained(
                    folder, local_files_only=True, trust_remote_code=trust_remote_code
                )
            except (OSError, ValueError, KeyError) as exc:
                raise tokenizer_error(folder, exc) from None
            try:
                # Mismatched sizes load (at random) so that fit_error can name them: raised,
                # the library's error only points at a log record.
                model, info = hf.AutoModelForCausalLM.from_pretrained(
                    folder,
                    config=config,
                    local_files_only=True,
                    trust_remote_code=trust_remote_code,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                    dtype=dtype,
                )
            except _weight_errors() as exc:
                raise weights_error(folder, exc) from None
            except (OSError, ValueError, KeyError) as exc:
                raise load_error(folder, exc) from None
            unfit = fit_error(folder, info)
            if unfit is not None:
                raise unfit
            attention = _explicit_mask_attention(model)
            if lora is not None:  # on the CPU, so that its initialisation is the CPU RNG's
                model = _with_adapter(model, lora, folder, seed)
            model = model.to(target)
        notices = []
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
            notices.append(f"the tokenizer in {folder} has no pad token: using EOS for padding")
        return cls(model, tokenizer, folder, notices, attention=attention)

    def train(self, mode: bool = True) -> HFPolicy:
        """Always eval mode: dropout would make the sampled log-probs differ from the
        update's (the built-in policies have none either)."""
        super().train(False)
        return self

    @property
    def device(self) -> torch.device:
        """Where the parameters are."""
        device: torch.device = next(self.model.parameters()).device
        return device

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model takes (None when its config does not say)."""
        config = self.model.config
        for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    # --- text ---------------------------------------------------------------------------

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """The characters of the tokenizer's longest token (its added tokens too)."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def encode(self, prompt: str | Sequence[dict[str, Any]]) -> tuple[int, ...]:
        """Token ids of a prompt: a string, or chat messages rendered with the tokenizer's
        chat template (with the generation prompt).

        Raises:
            WorkloadError: Chat messages but the tokenizer has no chat template.
        """
        if isinstance(prompt, str):
            return tuple(self.tokenizer(prompt).input_ids)
        if not getattr(self.tokenizer, "chat_template", None):
            raise WorkloadError(
                f"the prompt is chat messages but the tokenizer in {self.path} has no chat template"
            )
        text = self.tokenizer.apply_chat_template(
            list(prompt), tokenize=False, add_generation_prompt=True
        )
        # The template writes the special tokens itself (as TRL does it).
        return tuple(self.tokenizer(text, add_special_tokens=False).input_ids)

    def decode(self, tokens: Sequence[int]) -> str:
        """A completion's text (special tokens such as EOS left out, as TRL does)."""
        text: str = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        return text

    def save_pretrained(self, folder: str | Path) -> None:
        """Write the model and tokenizer in Hugging Face format (with ``[model.lora]``, the
        adapter in peft's format: ``PeftModel.from_pretrained(base, folder)`` loads it)."""
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def trainable_state(self) -> dict[str, Tensor]:
        """The entries of ``state_dict()`` that training changes: the adapter's with
        ``[model.lora]``, else all of them."""
        state = self.state_dict()
        if not self.adapter:
            return state
        names = {name for name, p in self.named_parameters() if p.requires_grad}
        return {name: value for name, value in state.items() if name in names}

    def base_reference(self) -> BaseReference:
        """The base model (the adapter switched off) as the KL reference: no second copy."""
        return BaseReference(self)

    # --- scoring ------------------------------------------------------------------------

    @contextlib.contextmanager
    def amp(self) -> Iterator[None]:
        """Autocast to :attr:`autocast` for the block (nothing when it is None)."""
        if self.autocast is None:
            yield
            return
        # No cast cache: a CUDA graph captured in here must cast the weights as it replays
        # (a cached cast is freed when the block ends, and the weights move on anyway).
        with torch.autocast(self.device.type, dtype=self.autocast, cache_enabled=False):
            yield

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype forward passes compute in."""
        if self.autocast is not None:
            return self.autocast
        dtype: torch.dtype = next(self.model.parameters()).dtype
        return dtype

    def _forward(self, tokens: Tensor, attention: Tensor) -> Tensor:
        # Right padding: a real token only ever attends to the real tokens before it, so the
        # plain causal mask gives it the same logits as the padding mask would, and lets the
        # model skip building a mask (a fifth of the update's time at this size).
        del attention
        with self.amp():
            logits: Tensor = self.model(input_ids=tokens).logits
        return logits

    def response_logprobs(
        self, prompts: TokenBatch, responses: TokenBatch, temperature: float = 1.0
    ) -> Scores:
        """Per-token log-probs and entropies of ``responses`` (see
        :func:`~trainer.rl._policy.score_responses`), right-padded. The adapters' dropout
        (``[model.lora] dropout``) is on when gradients are, else off."""
        with self._adapter_dropout(torch.is_grad_enabled()):
            return score_responses(
                self._forward, prompts, responses, temperature, pad=self.pad_id, device=self.device
            )

    @contextlib.contextmanager
    def _adapter_dropout(self, on: bool) -> Iterator[None]:
        for module in self._lora_dropout:
            module.train(on)
        try:
            yield
        finally:
            for module in self._lora_dropout:
                module.train(False)

    # --- sampling -----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompts: TokenBatch,
        n: int,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float = 1.0,
        *,
        top_p: float = 1.0,
        use_cache: bool = True,
        max_batch_tokens: int | None = None,
        cuda_graphs: bool = True,
        eos_check_every: int | None = None,
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, in as few batches as ``max_batch_tokens``
        allows (see :mod:`._sampler`).

        A row stops after EOS, after ``max_new_tokens`` tokens, or when it fills the model's
        context. Deterministic for a given ``generator`` state, weights and batch budget;
        the static-cache decoder, the model's own cache and no cache at all sample the same
        tokens (up to floating-point ties).

        Args:
            prompts: Prompt token ids (each shorter than the context).
            n: Completions per prompt.
            max_new_tokens: Token budget per completion.
            generator: The RNG to sample from (on the model's device).
            temperature: Softmax temperature; 0 is greedy. Recorded log-probs are those of
                the tempered distribution (untempered when greedy).
            top_p: Nucleus sampling: draw from the smallest set of tokens whose probability
                reaches ``top_p`` (the recorded log-prob is still the tempered one, the
                quantity the update recomputes).
            use_cache: Decode with a KV cache (the static one where the model allows it,
                else the model's own); False recomputes the whole sequence each token (for
                tests).
            max_batch_tokens: Most rows x (padded prompt + ``max_new_tokens``) one batch
                holds; None: :func:`~._sampler.auto_batch_tokens`, at the first batch.
            cuda_graphs: Replay the decode step as a CUDA graph (a CUDA device only).
            eos_check_every: Tokens between two checks whether every row has ended (each
                check waits for the device); None: 1 on the CPU, where it costs nothing,
                8 on a GPU.

        Returns:
            For each prompt in order, ``n`` :class:`Completion`.

        Raises:
            ValueError: A prompt that leaves no room for a token in the context.
        """
        if not prompts:
            return []
        device = self.device
        context = self.context_length
        lengths = [len(p) for p in prompts]
        if context is not None and max(lengths) >= context:
            raise ValueError(f"a prompt of {max(lengths)} tokens fills the context ({context})")
        # Row r samples completion r % n of prompt r // n; its budget: max_new_tokens, or
        # what is left of the context.
        rows = [prompts[r // n] for r in range(len(prompts) * n)]
        budgets = [
            max_new_tokens if context is None else min(max_new_tokens, context - len(p))
            for p in rows
        ]
        static = use_cache and self._supports_static()
        graphs = static and cuda_graphs and device.type == "cuda"
        if max_batch_tokens is None and self._auto_batch_tokens is None:
            # Sized once, at the first batch: a budget that moved with the free memory
            # would change the batch shapes, and with them the captured graphs.
            self._auto_batch_tokens = auto_batch_tokens(self.model, device, self.compute_dtype)
        capacity = max_batch_tokens or self._auto_batch_tokens or 1
        check = eos_check_every or (1 if device.type == "cpu" else 8)
        settings = DecodeSettings(temperature, top_p, self.eos_id, self.pad_id, context)
        drawn: list[tuple[list[int], list[float]]] = [([], [])] * len(rows)
        batches = plan_batches([len(p) for p in rows], max_new_tokens, capacity, graphs=graphs)
        with self.amp():
            for batch in batches:
                batch_rows = [rows[r] for r in batch]
                batch_budgets = [budgets[r] for r in batch]
                if static:
                    slots = cache_length(len(batch_rows[0]), max_new_tokens, graphs)
                    size = (
                        graph_rows(len(batch), max(1, capacity // slots)) if graphs else len(batch)
                    )
                    decoder = self._decoder(size, slots, max_new_tokens, settings, graphs)
                    out = decoder.run(batch_rows, batch_budgets, generator, check)
                else:
                    out = self._decode_plain(
                        batch_rows, batch_budgets, generator, settings, use_cache, check
                    )
                for row, tokens, logprobs in zip(batch, *out, strict=True):
                    drawn[row] = (tokens, logprobs)
        groups: list[list[Completion]] = [[] for _ in prompts]
        for row, ((tokens, logprobs), budget) in enumerate(zip(drawn, budgets, strict=True)):
            length = min(len(tokens), budget)
            if self.eos_id in tokens[:length]:
                length = tokens.index(self.eos_id) + 1
            groups[row // n].append(Completion(tuple(tokens[:length]), tuple(logprobs[:length])))
        return groups

    def _supports_static(self) -> bool:
        if self._static is None:
            self._static = self.attention in ("sdpa", "eager") and StaticDecoder.supports(
                self.model
            )
        return self._static

    def _decoder(
        self, rows: int, slots: int, max_new_tokens: int, settings: DecodeSettings, graphs: bool
    ) -> StaticDecoder:
        def build() -> StaticDecoder:
            return StaticDecoder(
                self.model,
                self._cache_arg,
                rows=rows,
                slots=slots,
                max_new_tokens=max_new_tokens,
                settings=settings,
                graphs=graphs,
                mask_dtype=self.compute_dtype if self.attention == "eager" else None,
            )

        return self._decoders.get((rows, slots, max_new_tokens, settings, graphs), build)

    def _decode_plain(
        self,
        prompts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        generator: torch.Generator,
        settings: DecodeSettings,
        use_cache: bool,
        eos_check_every: int,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One batch with the model's own cache (``use_cache``) or none: the decoding of a
        model the static decoder does not fit, and the reference the tests compare it with.
        It draws exactly as :meth:`StaticDecoder.run` does."""
        device = self.device
        width = max(len(p) for p in prompts)
        sequence = torch.tensor(
            [[settings.pad_id] * (width - len(p)) + list(p) for p in prompts], device=device
        )
        pads = torch.tensor([width - len(p) for p in prompts], device=device)
        mask = (torch.arange(width, device=device).unsqueeze(0) >= pads.unsqueeze(1)).long()
        limit = torch.tensor(list(budgets), device=device)
        steps = max(budgets)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        tokens_out: list[Tensor] = []
        logprobs_out: list[Tensor] = []
        past: Any = None
        step_input = sequence
        while True:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            if use_cache:
                out = self.model(
                    input_ids=step_input,
                    attention_mask=mask,
                    position_ids=positions[:, -step_input.shape[1] :],
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_arg: past},
                )
                past = getattr(out, self._cache_arg)
            else:
                out = self.model(
                    input_ids=sequence,
                    attention_mask=mask,
                    position_ids=positions,
                    logits_to_keep=1,
                )
            logits = out.logits[:, -1, :].float()
            noise = torch.empty_like(logits)
            if settings.temperature > 0:
                noise.exponential_(generator=generator)
            nxt, logp = pick(logits, noise, settings.temperature, settings.top_p)
            nxt = nxt.masked_fill(done, settings.pad_id)
            tokens_out.append(nxt)
            logprobs_out.append(logp)
            done = done | (nxt == settings.eos_id) | (limit <= len(tokens_out))
            drawn = len(tokens_out)
            if drawn >= steps or (drawn % eos_check_every == 0 and bool(done.all())):
                break
            step_input = nxt.unsqueeze(1)
            sequence = torch.cat([sequence, step_input], dim=1)
            mask = torch.cat([mask, torch.ones_like(step_input)], dim=1)
        return (
            torch.stack(tokens_out, dim=1).tolist(),
            torch.stack(logprobs_out, dim=1).tolist(),
        )


class BaseReference:
    """A LoRA policy's base model as the KL reference: it scores with the adapter off.

    It holds no weights of its own (:meth:`parameters` are the policy's frozen base
    parameters, the same tensors), so the reference costs no memory.
    """

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy

    def response_logprobs(
        self, prompts: TokenBatch, responses: TokenBatch, temperature: float = 1.0
    ) -> Scores:
        """The base model's log-probs of ``responses`` (see :meth:`HFPolicy.response_logprobs`)."""
        with self.policy.model.disable_adapter():
            return self.policy.response_logprobs(prompts, responses, temperature)

    def parameters(self) -> Iterator[nn.Parameter]:
        """The base model's parameters (the policy's, without the adapter's)."""
        return (p for name, p in self.policy.named_parameters() if ".lora_" not in name)


def _with_adapter(model: Any, lora: LoraConfig, folder: Path, seed: int) -> Any:
    """``model`` wrapped in a new LoRA adapter (peft), its initial weights drawn from ``seed``."""
    library = peft()
    config = library.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
        # PeftModel.from_pretrained(base, run/model) users find the base here.
        base_model_name_or_path=str(folder.resolve()),
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft's notices (a GPT-2 Conv1D layer transposed, a deprecated transformers
        # property it reads) say nothing to act on.
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        try:
            wrapped = library.get_peft_model(model, config)
        except ValueError as exc:  # e.g. target_modules naming no module of the model
            raise ModelLoadError(f"model.lora: {exc}") from None
    wrapped.peft_config["default"].base_model_name_or_path = str(folder.resolve())
    return wrapped.eval()

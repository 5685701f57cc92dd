"""A Hugging Face causal LM as a trainbus policy: loading, sampling with the KV cache, and
the log-probs the update needs.

:class:`HFPolicy` wraps any ``transformers`` causal LM saved with ``save_pretrained`` and
its tokenizer, loaded from disk only. It samples with its own loop over the model's
``past_key_values`` rather than ``generate()``: the loop draws from an explicit
``torch.Generator`` (so a piece of work samples the same tokens whichever worker runs it,
and two worker threads never share the global RNG) and records the log-prob of every
sampled token under the tempered distribution, exactly what :meth:`response_logprobs`
recomputes for the update, so on-policy ratios start at 1. Prompts of different lengths
are left-padded for sampling (with position ids that skip the padding) and right-padded
for the update; dropout is off in both (``eval()``), so both evaluate the same function.
"""

from __future__ import annotations

import inspect
import pickle
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch import nn

from ._hf import ModelLoadError
from ._hf import check_model_folder
from ._hf import fit_error
from ._hf import load_error
from ._hf import tokenizer_error
from ._hf import transformers
from ._hf import weights_error
from ._hparams import Completion
from ._hparams import WorkloadError
from ._policy import Scores
from ._policy import TokenBatch
from ._policy import score_responses

__all__ = ["HFPolicy", "ModelLoadError", "check_model_folder", "resolve_device"]


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
    """

    def __init__(self, model: Any, tokenizer: Any, path: Path, notices: list[str]) -> None:
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
        accepted = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        *,
        trust_remote_code: bool = False,
    ) -> HFPolicy:
        """Load a model folder written by ``save_pretrained`` (nothing is downloaded).

        Args:
            path: The folder.
            device: Where the model goes.
            trust_remote_code: Run the Python code the folder names for its config, model
                or tokenizer (``auto_map``); off, such a folder is refused, its code unrun.

        Raises:
            ModelLoadError: The folder lacks a config, weights or tokenizer, one of them
                cannot be read (naming the file), the weights do not fit the config, or
                it does not hold a causal LM (one line naming it).
        """
        folder = check_model_folder(path)
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
                )
            except _weight_errors() as exc:
                raise weights_error(folder, exc) from None
            except (OSError, ValueError, KeyError) as exc:
                raise load_error(folder, exc) from None
            unfit = fit_error(folder, info)
            if unfit is not None:
                raise unfit
            model = model.to(target)
        notices = []
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
            notices.append(f"the tokenizer in {folder} has no pad token: using EOS for padding")
        return cls(model, tokenizer, folder, notices)

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
        """Write the model and tokenizer in Hugging Face format."""
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    # --- scoring ------------------------------------------------------------------------

    def _forward(self, tokens: Tensor, attention: Tensor) -> Tensor:
        # Right padding: a real token only ever attends to the real tokens before it, so the
        # plain causal mask gives it the same logits as the padding mask would, and lets the
        # model skip building a mask (a fifth of the update's time at this size).
        del attention
        logits: Tensor = self.model(input_ids=tokens).logits
        return logits

    def response_logprobs(
        self, prompts: TokenBatch, responses: TokenBatch, temperature: float = 1.0
    ) -> Scores:
        """Per-token log-probs and entropies of ``responses`` (see
        :func:`~trainer.rl._policy.score_responses`), right-padded."""
        return score_responses(
            self._forward, prompts, responses, temperature, pad=self.pad_id, device=self.device
        )

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
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt, in one left-padded batch.

        A row stops after EOS, after ``max_new_tokens`` tokens, or when it fills the model's
        context. Deterministic for a given ``generator`` state and weights; with and without
        ``use_cache`` it samples the same tokens (up to floating-point ties).

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
            use_cache: Reuse the model's key/value cache (``past_key_values``); False
                recomputes the whole sequence each token (for tests).

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
        width = max(lengths)
        rows = torch.tensor(
            [[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=device
        ).repeat_interleave(n, dim=0)
        pads = torch.tensor([width - length for length in lengths], device=device)
        attention = (torch.arange(width, device=device).unsqueeze(0) >= pads.unsqueeze(1)).long()
        attention = attention.repeat_interleave(n, dim=0)
        # Each row's budget: max_new_tokens, or what is left of the context.
        prompt_lens = torch.tensor(lengths, device=device).repeat_interleave(n)
        budget = torch.full_like(prompt_lens, max_new_tokens)
        if context is not None:
            budget = torch.minimum(budget, context - prompt_lens)
        steps = int(budget.max())
        done = torch.zeros(rows.shape[0], dtype=torch.bool, device=device)
        tokens_out: list[Tensor] = []
        logprobs_out: list[Tensor] = []
        past: Any = None
        sequence, mask = rows, attention
        step_input = rows
        for t in range(steps):
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
            nxt, logp = _draw(logits, generator, temperature, top_p)
            logprobs_out.append(logp)
            nxt = nxt.masked_fill(done, self.pad_id)
            tokens_out.append(nxt)
            done = done | (nxt == self.eos_id) | (budget <= t + 1)
            if bool(done.all()):
                break
            step_input = nxt.unsqueeze(1)
            sequence = torch.cat([sequence, step_input], dim=1)
            mask = torch.cat([mask, torch.ones_like(step_input)], dim=1)
        return self._completions(tokens_out, logprobs_out, budget, len(prompts), n)

    def _completions(
        self, tokens: list[Tensor], logprobs: list[Tensor], budget: Tensor, prompts: int, n: int
    ) -> list[list[Completion]]:
        if not tokens:
            return [[Completion((), ()) for _ in range(n)] for _ in range(prompts)]
        all_tokens = torch.stack(tokens, dim=1).tolist()
        all_logprobs = torch.stack(logprobs, dim=1).tolist()
        limits = budget.tolist()
        out: list[list[Completion]] = [[] for _ in range(prompts)]
        for row, (toks, lps, limit) in enumerate(
            zip(all_tokens, all_logprobs, limits, strict=True)
        ):
            length = min(len(toks), int(limit))
            if self.eos_id in toks[:length]:
                length = toks.index(self.eos_id) + 1
            out[row // n].append(Completion(tuple(toks[:length]), tuple(lps[:length])))
        return out


def _draw(
    logits: Tensor, generator: torch.Generator, temperature: float, top_p: float
) -> tuple[Tensor, Tensor]:
    """One token per row and its log-prob (see :meth:`HFPolicy.generate`)."""
    if temperature <= 0:
        logp = F.log_softmax(logits, dim=-1)
        nxt = logp.argmax(dim=-1)
        return nxt, logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
    logp = F.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep each token whose preceding mass is below top_p (the first always stays).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
    nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return nxt, logp.gather(1, nxt.unsqueeze(1)).squeeze(1)

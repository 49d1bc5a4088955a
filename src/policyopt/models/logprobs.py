"""Per-token log-probs, entropies and hidden states of a response, without full-vocab logits.

Sequences are laid out as `[left-padded prompt, width P | response, width R, right-padded]`.
For response token t (sequence position P + t) the model's distribution comes from the final
hidden state h at position P + t - 1:

    z = W h (+ b) / T          logits at temperature T
    log p(y_t) = z[y_t] - logsumexp(z)
    H_t = logsumexp(z) - sum_v softmax(z)_v z_v      entropy of the sampling distribution

The trunk runs once; the LM head is applied to at most `chunk_size` rows of (batch * time) at
a time, and no chunk's logits are kept for backward: the backward recomputes them one chunk
at a time (a custom autograd Function for a plain `nn.Linear` head, activation checkpointing
for any other head module), so neither pass holds a [B, R, V] tensor.

Rows with the same prompt (a group's G responses) share its computation: the trunk runs
once over each distinct prompt, keeping its KV cache, then over every row's response with
that cache copied to the row. Causal attention makes a prompt's hidden states independent of
what follows, so this is the same function, and gradients from all copies flow back into
the one prompt pass; with G responses per prompt it saves (G - 1) / G of the prompt tokens.

`allowed_bits` [B, R, ceil(V / 32)] int32 (rollouts decoded under a grammar,
`rollout/grammar.py`; packed, `core.token_bits`, and unpacked one chunk at a time): the
distribution is the constrained one, the disallowed tokens' logits -inf before the
logsumexp, so log p(y_t) = z[y_t] - logsumexp_{v allowed} z_v, the log-prob the sampler
recorded; its gradient (1[v = y] - p_v) / T has p_v = 0 off the allowed set.

The trunk runs in whatever autocast the caller entered (bf16-mixed, `models.precision`); the
LM head always runs outside it, in its weights' dtype, so that logits, logsumexp and
log-probs are float32 for float32 weights.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from policyopt.core.token_bits import unpack_token_bits
from policyopt.models.precision import head_logits

try:  # transformers >= 4.56 keeps the cache as one object per layer
    from transformers.cache_utils import DynamicCache, DynamicLayer
except ImportError:  # pragma: no cover - older transformers: no prompt sharing
    DynamicCache = DynamicLayer = None


@dataclass
class LogProbOutput:
    """`logp[b, t]` = log p(response token t); `entropy` and `hidden` when asked for.

    `hidden[b, t]` is the final (normed) hidden state that the LM head maps to the
    distribution of response token t; it stays attached to the autograd graph.
    Positions past a response's end are computed too; the caller masks them.
    """

    logp: torch.Tensor
    entropies: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (cumsum - 1, clamped at 0), so left padding
    does not shift a prompt's positions."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _check_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, temperature: float
) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from "
            f"input_ids shape {tuple(input_ids.shape)}"
        )
    if not 1 <= response_len < input_ids.shape[1]:
        raise ValueError(
            f"response_len must be in [1, {input_ids.shape[1] - 1}] (the prompt needs at least "
            f"one column), got {response_len}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _check_plain_head(model: nn.Module) -> None:
    """Refuse models whose logits are post-processed after the LM head (we would miss it)."""
    config = getattr(model, "config", None)
    for key in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, key, None) not in (None, 1.0):
            raise NotImplementedError(
                f"response_logprobs: model config sets {key}={getattr(config, key)!r}; "
                "logits transformed after the LM head are not supported"
            )


def trunk_of(model: nn.Module) -> nn.Module:
    """The decoder stack that outputs the final normed hidden states (no LM head)."""
    get_decoder = getattr(model, "get_decoder", None)
    trunk = get_decoder() if callable(get_decoder) else None
    if trunk is None or trunk is model:
        prefix = getattr(model, "base_model_prefix", "")
        trunk = getattr(model, prefix, None) if prefix else None
    if trunk is None or trunk is model:
        raise TypeError(f"cannot find the decoder trunk of {type(model).__name__}")
    return trunk


def _linear_logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """z = (W h + b) / T as a fresh float32 [n, V] tensor (float32 even for bf16 models);
    -inf off `allowed` [n, >= V] bool when given (columns past V unused; module docstring).
    Outside autocast, in the weights' dtype: under bf16-mixed the head stays float32
    (`models.precision`)."""
    with torch.autocast(h.device.type, enabled=False):
        z = nn.functional.linear(h.to(weight.dtype), weight, bias).float()
    z = z.div_(temperature)
    return z if allowed is None else z.masked_fill_(~allowed[:, : z.shape[-1]], float("-inf"))


def _entropy_of_logp(logp: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v from log-probs [n, V]; a -inf (disallowed) term counts 0."""
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)


class _LinearHeadLogProb(torch.autograd.Function):
    """log p(y) and entropy for one chunk through a plain `nn.Linear` head.

    Saves only h, W, b, y and logsumexp(z) ([n]); the backward recomputes z in one [n, V]
    buffer and turns it in place into the gradient
        d log p(y) / d (W h + b)_v = (1[v = y] - p_v) / T,
    so backward holds one chunk of logits, forward two (z and logsumexp's temporary).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        h: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        y: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        allowed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = _linear_logits(h, weight, bias, temperature, allowed)
        lse = torch.logsumexp(z, -1)
        logp = z.gather(-1, y[:, None]).squeeze(-1) - lse
        entropy = logp.new_empty(0)
        if with_entropy:
            z.sub_(lse[:, None])  # z := log p
            entropy = _entropy_of_logp(z) if allowed is not None else -(z.exp().mul_(z)).sum(-1)
        ctx.save_for_backward(h, weight, bias, y, lse, allowed)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_logp: torch.Tensor, _grad_entropy: None
    ) -> tuple[torch.Tensor | None, ...]:
        h, weight, bias, y, lse, allowed = ctx.saved_tensors
        grad = _linear_logits(h, weight, bias, ctx.temperature, allowed)
        grad.sub_(lse[:, None]).exp_()  # p
        grad[torch.arange(len(y), device=y.device), y] -= 1.0  # p - onehot(y)
        grad.mul_((-grad_logp / ctx.temperature)[:, None])  # g (onehot - p) / T
        grad = grad.to(weight.dtype)
        with torch.autocast(h.device.type, enabled=False):  # in the forward's dtypes
            grad_h = (grad @ weight).to(h.dtype) if ctx.needs_input_grad[0] else None
            grad_w = grad.T @ h.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _module_logp_entropy(
    h: torch.Tensor,
    y: torch.Tensor,
    head: nn.Module,
    temperature: float,
    with_entropy: bool,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(y) and entropy for one chunk through any head module (e.g. a LoRA-wrapped one);
    the head outside autocast, as `_linear_logits`."""
    z = head_logits(head, h).float() / temperature
    if allowed is not None:
        z = z.masked_fill(~allowed[:, : z.shape[-1]], float("-inf"))
    lse = z.logsumexp(-1)
    logp = z.gather(-1, y[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, logp.new_empty(0)
    with torch.no_grad():  # entropy is a metric: no gradient, nothing saved for backward
        if allowed is None:  # the unconstrained formula, bit for bit as before
            entropy = lse - (torch.softmax(z, -1) * z).sum(-1)
        else:
            entropy = _entropy_of_logp(z - lse[:, None])
    return logp, entropy


def _chunk_logp_entropy(
    h: torch.Tensor,
    y: torch.Tensor,
    head: nn.Module,
    temperature: float,
    with_entropy: bool,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if type(head) is nn.Linear:
        return _LinearHeadLogProb.apply(
            h, head.weight, head.bias, y, temperature, with_entropy, allowed
        )
    needs_grad = torch.is_grad_enabled() and (
        h.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    if not needs_grad:
        return _module_logp_entropy(h, y, head, temperature, with_entropy, allowed)
    # Other heads: non-reentrant checkpoint saves only the chunk's inputs and the backward
    # recomputes the chunk's logits, so at most one chunk of [n, V] (and its autograd
    # intermediates) exists at any time.
    return checkpoint(
        _module_logp_entropy, h, y, head, temperature, with_entropy, allowed, use_reentrant=False
    )


def chunked_head_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: nn.Module,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    allowed_bits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) [N] (and entropy [N]) for hidden [N, d], `chunk_size` rows at a time;
    over the allowed tokens only when `allowed_bits` [N, ceil(V / 32)] (packed,
    `core.token_bits`) is given, unpacked one chunk at a time (module docstring)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        logp, entropy = _chunk_logp_entropy(
            hidden[rows],
            targets[rows],
            head,
            temperature,
            with_entropy,
            None if allowed_bits is None else _unpacked(allowed_bits[rows], hidden.device),
        )
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _unpacked(words: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[n, W] words -> [n, 32 W] bool on `device`; the head's V <= 32 W columns are used."""
    return unpack_token_bits(words.to(device), 32 * words.shape[-1])


def naive_head_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, *, temperature: float = 1.0
) -> torch.Tensor:
    """The straightforward version of `chunked_head_logprobs`: full [N, V] log-softmax."""
    logprobs = torch.log_softmax(head(hidden).float() / temperature, -1)
    return logprobs.gather(-1, targets[:, None]).squeeze(-1)


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    with_hidden: bool = False,
    share_prompts: bool = True,
    allowed_bits: torch.Tensor | None = None,
) -> LogProbOutput:
    """Log-probs [B, R] of the last `response_len` tokens of each row, chunked over the vocab
    head (see module docstring); works for a Hugging Face causal LM or a PEFT-wrapped one.
    `share_prompts=False` always runs the trunk once (FSDP2 needs every rank to call each
    layer the same number of times, whatever its rows' prompts).

    A policy of another kind (a Plackett–Luce ranker, `models.ranker`) computes its own
    per-action log-probs: one that defines `response_logprobs` is called with these inputs.
    `allowed_bits` [B, response_len, ceil(V / 32)]: the constrained distribution (module
    docstring)."""
    _check_inputs(input_ids, attention_mask, response_len, temperature)
    own = getattr(model, "response_logprobs", None)
    if own is not None:
        if allowed_bits is not None:
            raise ValueError(f"{type(model).__name__} takes no grammar-constrained log-probs")
        return own(
            input_ids,
            attention_mask,
            response_len,
            temperature=temperature,
            with_entropy=with_entropy,
            with_hidden=with_hidden,
        )
    _check_plain_head(model)
    batch = input_ids.shape[0]
    hidden = response_hidden(
        model, input_ids, attention_mask, response_len, share_prompts=share_prompts
    )  # [B, R, d]
    logp, entropy = chunked_head_logprobs(
        hidden.reshape(batch * response_len, -1),
        input_ids[:, -response_len:].reshape(-1),
        model.get_output_embeddings(),
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        allowed_bits=None
        if allowed_bits is None
        else allowed_bits.reshape(batch * response_len, -1),
    )
    return LogProbOutput(
        logp=logp.view(batch, response_len),
        entropies=entropy.view(batch, response_len) if entropy is not None else None,
        hidden=hidden if with_hidden else None,
    )


def response_hidden(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    share_prompts: bool = True,
) -> torch.Tensor:
    """The final hidden states [B, R, d] that the LM head maps to the distributions of the
    last R = `response_len` tokens: those of positions P - 1 .. L - 2 (P = L - R).

    Rows with identical prompts (the first P columns of ids and mask) share one trunk pass
    over the prompt (module docstring); otherwise the trunk runs once over positions
    0 .. L - 2 (the last token predicts nothing we need)."""
    trunk = trunk_of(model)
    positions = position_ids_from_mask(attention_mask)
    prompt_len = input_ids.shape[1] - response_len
    shared = (
        _shared_prompt_hidden(trunk, input_ids, attention_mask, positions, prompt_len)
        if share_prompts
        else None
    )
    if shared is not None:
        return shared
    out = trunk(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=positions[:, :-1],
        use_cache=False,
    )
    return out.last_hidden_state[:, prompt_len - 1 :]


def _shared_prompt_hidden(
    trunk: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    prompt_len: int,
) -> torch.Tensor | None:
    """`response_hidden` with one prompt pass per distinct prompt, or None when no two rows
    share a prompt, when the trunk's cache is not made of plain full-attention layers (a
    sliding-window or recurrent layer would not see the same past) or when activation
    checkpointing is on (checkpointed layers drop the cache, or replay its updates)."""
    if torch.is_grad_enabled() and any(
        getattr(m, "gradient_checkpointing", False) for m in trunk.modules()
    ):
        return None
    prompt = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], 1)
    unique, copy = torch.unique(prompt, dim=0, return_inverse=True)
    if len(unique) == len(prompt):
        return None
    cache = _empty_full_attention_cache(trunk)
    if cache is None:
        return None
    ids, mask = unique[:, :prompt_len], unique[:, prompt_len:]
    cache_kw = cache_kwarg(trunk)
    out = trunk(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        use_cache=True,
        **{cache_kw: cache},
    )
    last = out.last_hidden_state[copy, -1:]  # position P - 1 predicts response token 0
    if input_ids.shape[1] - prompt_len == 1:
        return last
    cache.batch_select_indices(copy)  # each row attends to its own copy of the prompt's KV
    out = trunk(
        input_ids=input_ids[:, prompt_len:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=positions[:, prompt_len:-1],
        use_cache=True,
        **{cache_kw: cache},
    )
    return torch.cat([last, out.last_hidden_state], 1)


def _empty_full_attention_cache(trunk: nn.Module) -> object | None:
    """A fresh `DynamicCache` for `trunk`, if every layer of it is a plain `DynamicLayer`."""
    config = getattr(trunk, "config", None)
    if DynamicCache is None or config is None:
        return None
    try:
        cache = DynamicCache(config=config)
    except (TypeError, ValueError, KeyError):  # a config this transformers cannot lay out
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return cache


def cache_kwarg(module: nn.Module) -> str:
    """The keyword `module.forward` takes its KV cache by (a PEFT wrapper's: its base
    model's): transformers 5.2x names it `cache`, earlier releases `past_key_values`."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def naive_response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_hidden: bool = False,
) -> LogProbOutput:
    """Same as `response_logprobs`, the straightforward way: the model's full [B, L, V]
    logits, a log-softmax, and the LM head's input captured with a hook."""
    _check_inputs(input_ids, attention_mask, response_len, temperature)
    prompt_len = input_ids.shape[1] - response_len
    captured: list[torch.Tensor] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda _module, args: captured.append(args[0])
    )
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
    finally:
        hook.remove()
    window = slice(prompt_len - 1, -1)  # positions whose outputs predict response tokens
    logprobs = torch.log_softmax(out.logits[:, window].float() / temperature, -1)
    logp = logprobs.gather(-1, input_ids[:, prompt_len:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1)
    hidden = captured[0][:, window] if with_hidden else None
    return LogProbOutput(logp=logp, entropies=entropy, hidden=hidden)

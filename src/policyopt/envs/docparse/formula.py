"""DocPO's formula reward (SPEC §5):

    R = v_syn · (0.8 · r_sem + 0.2 · r_struct)

- v_syn = 0 if the predicted LaTeX does not parse (latex2sympy2_extended), else 1;
- r_sem = 1 if prediction and reference are symbolically equivalent, else 0 (or the value of a
  pluggable `judge(prediction, reference) -> float in [0, 1]`, e.g. an LLM judge as in the
  paper). Expressions are equivalent if sympy simplifies their difference to 0; equations
  `a = b` and `c = d` if a − b and c − d are equal, opposite, or a constant non-zero multiple
  of each other; other objects (sets, matrices, inequalities) if they simplify to equal
  objects. Numeric probes at fixed points reject most non-equivalent pairs before the
  (slow) simplifications: a difference that is clearly non-zero at a point is not 0, and a
  ratio of two equations' sides d1/d2 that takes two clearly different values (evaluated to
  30 digits) is not a constant;
- r_struct = 1 − normalised Levenshtein distance of the two normalised LaTeX strings.

Normalisation (for both parsing and r_struct): outer math delimiters ($…$, $$…$$, \\(…\\),
\\[…\\]) and thin spaces (\\, \\; \\: \\!) are removed, and whitespace is dropped except the
one space that separates a control word from a following letter (`\\alpha x`). Symbols are
compared case-sensitively: `X` and `x` are different variables (latex2sympy2_extended lowercases
every symbol by default, `lowercase_symbols`, which we turn off). Parsing
tries ANTLR's fast SLL prediction first, with full LL only where SLL misleads on common
input; a parse that succeeds that way is the one full LL gives (`_fast_latex2sympy`), and a
failure is retried with full LL.

sympy can hang or exhaust memory on some inputs (`10^{10^{10}}`, `(x+1)^{100000}`), inside C
code that no signal or thread can interrupt. So parsing and equivalence run in persistent
worker processes with a time limit per stage (`timeout_s`) and an address-space cap; on a
timeout the worker is killed (and restarted for the next check), a parse that times out
counts as not parsing and an equivalence check that times out as not equivalent.
`timeout_s=None` runs everything in this process without a limit (trusted inputs only).

`formula_rewards` scores a batch (a training step's formulas): its distinct checks that are
not in a bounded cache of earlier results run on one worker, or on up to `MAX_WORKERS` at
once where cores are idle. A check's result does not depend on which worker ran it, nor on
the batch it came in. `prefetch_formula_rewards` queues checks to a background thread that
runs them into the cache (while the trainer is still sampling the longer responses);
`formula_rewards` first waits for that queue to empty, so it finds them there and its values
are the same as without a prefetch.

This module imports only the standard library and rapidfuzz at the top, so the worker can
load it by path without importing the rest of the package.
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from rapidfuzz.distance import Levenshtein

from policyopt.rewards.workers import TIMED_OUT, Worker, WorkerError

SEMANTIC_WEIGHT = 0.8  # SPEC §5: 0.8 r_sem + 0.2 r_struct
STRUCTURE_WEIGHT = 0.2
DEFAULT_TIMEOUT_S = 5.0  # per stage (parse, equivalence); covers slow simplifications
WORKER_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine
WORKER_MEMORY_BYTES = 4 << 30  # address-space cap of each worker (Linux)
# sympy is single-threaded: a second worker uses a core that the trainer's threads leave
# idle while it waits for rewards (when no other process needs it: `_worker_count`). Each
# holds ~80 MB.
MAX_WORKERS = 2
CACHE_SIZE = 8192  # (prediction, reference) checks kept: a few hundred steps of formulas
_PROBE_POINTS = (0.7236, 1.3719, 2.1183, 0.4142, 1.7321)  # fixed: results must be reproducible

Judge = Callable[[str, str], float]
Check = tuple[str, str | None]  # (normalised prediction, normalised reference or None)


def formula_reward(
    prediction: str,
    reference: str,
    judge: Judge | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> float:
    """DocPO formula reward in [0, 1]; see the module docstring."""
    return formula_rewards([prediction], [reference], judge=judge, timeout_s=timeout_s)[0]


def formula_rewards(
    predictions: Sequence[str],
    references: Sequence[str],
    judge: Judge | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> list[float]:
    """`formula_reward` of each (prediction, reference) pair, the same values one by one
    would give; the checks run in parallel workers (module docstring)."""
    if len(predictions) != len(references):
        raise ValueError(
            f"formula_rewards: {len(predictions)} predictions for {len(references)} references"
        )
    for name, values in (("prediction", predictions), ("reference", references)):
        for value in values:
            if not isinstance(value, str):
                raise TypeError(f"formula_reward: {name} must be a str, got {type(value).__name__}")
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"formula_reward: timeout_s must be > 0 or None, got {timeout_s}")
    preds = [normalise_latex(p) for p in predictions]
    refs = [normalise_latex(r) for r in references]
    # With a judge only the parse is checked here (ref None); the judge gives r_sem.
    keys = list(zip(preds, refs, strict=True)) if judge is None else [(p, None) for p in preds]
    _wait_for_prefetch()
    checks = _checks(keys, timeout_s)
    rewards = []
    for i, (parsed, equivalent) in enumerate(checks):
        if not parsed:
            rewards.append(0.0)
            continue
        if judge is None:
            r_sem = float(equivalent)
        else:
            r_sem = _judged(judge, predictions[i], references[i])
        r_struct = Levenshtein.normalized_similarity(preds[i], refs[i])
        rewards.append(min(1.0, SEMANTIC_WEIGHT * r_sem + STRUCTURE_WEIGHT * r_struct))
    return rewards


def prefetch_formula_rewards(
    predictions: Sequence[str],
    references: Sequence[str],
    judge: Judge | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> None:
    """Start the checks that `formula_rewards` with these arguments will need, in the
    background; returns at once. Without a time limit (in-process checks) it does nothing."""
    if timeout_s is None or not predictions:
        return
    keys = [
        (normalise_latex(p), None if judge is not None else normalise_latex(r))
        for p, r in zip(predictions, references, strict=True)
    ]
    _prefetcher().put((keys, timeout_s))


_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"))
_THIN_SPACES = re.compile(r"\\[,;:!]")
_WHITESPACE = re.compile(r"(\\[A-Za-z]+)?\s+")


def normalise_latex(latex: str) -> str:
    """Strip outer delimiters and thin spaces; drop whitespace except after control words."""
    s = latex.strip()
    for opening, closing in _DELIMITERS:
        if len(s) >= len(opening) + len(closing) and s.startswith(opening) and s.endswith(closing):
            s = s[len(opening) : len(s) - len(closing)].strip()
            break
    s = _THIN_SPACES.sub("", s)

    def keep_word_break(m: re.Match[str]) -> str:
        word = m.group(1) or ""
        follows_letter = m.end() < len(s) and s[m.end()].isalpha()
        return word + " " if word and follows_letter else word

    return _WHITESPACE.sub(keep_word_break, s)


def _judged(judge: Judge, prediction: str, reference: str) -> float:
    value = float(judge(prediction, reference))
    if not math.isfinite(value):
        raise ValueError(f"formula_reward: judge returned {value} for {prediction!r}")
    return min(1.0, max(0.0, value))


# Results of earlier checks, oldest first. Within a group of rollouts and across steps the same
# (prediction, reference) recurs; a check's result depends only on the key (with the time
# limit: a check that timed out under one limit might finish under a longer one).
_cache: OrderedDict[tuple[str, str | None, float | None], tuple[bool, bool]] = OrderedDict()
_cache_lock = threading.Lock()


def _checks(
    keys: list[Check], timeout_s: float | None, caller_waits: bool = True
) -> list[tuple[bool, bool]]:
    """(pred parses, pred equivalent to ref) of each key; ref None: parse only.
    `caller_waits`: see `_worker_count`."""
    found: dict[Check, tuple[bool, bool]] = {}
    with _cache_lock:
        for key in keys:
            result = _cache.get((*key, timeout_s))
            if result is not None:
                _cache.move_to_end((*key, timeout_s))
                found[key] = result
    todo = [key for key in dict.fromkeys(keys) if key not in found]
    if todo:
        if timeout_s is None:
            computed = [_check_here(pred, ref) for pred, ref in todo]
        else:
            computed = _run_in_workers(todo, timeout_s, caller_waits)
        with _cache_lock:
            for key, result in zip(todo, computed, strict=True):
                found[key] = result
                _cache[(*key, timeout_s)] = result
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return [found[key] for key in keys]


# The background prefetch: one daemon thread per process, fed batches of keys.
_prefetch_queue: queue.Queue[tuple[list[Check], float]] | None = None
_prefetch_pid: int | None = None
_prefetch_lock = threading.Lock()


def _prefetcher() -> queue.Queue[tuple[list[Check], float]]:
    """This process's prefetch queue, with its thread started on first use (and anew in a
    forked child, which inherits the queue but not the thread)."""
    global _prefetch_queue, _prefetch_pid
    with _prefetch_lock:
        if _prefetch_queue is None or _prefetch_pid != os.getpid():
            _prefetch_queue, _prefetch_pid = queue.Queue(), os.getpid()
            threading.Thread(target=_prefetch_loop, args=(_prefetch_queue,), daemon=True).start()
        return _prefetch_queue


def _prefetch_loop(todo: queue.Queue[tuple[list[Check], float]]) -> None:
    while True:
        batches = [todo.get()]
        while True:  # what queued up meanwhile goes to the workers as one batch
            try:
                batches.append(todo.get_nowait())
            except queue.Empty:
                break
        by_timeout: dict[float, list[Check]] = {}
        for keys, timeout_s in batches:
            by_timeout.setdefault(timeout_s, []).extend(keys)
        try:
            for timeout_s, keys in by_timeout.items():
                _checks(keys, timeout_s, caller_waits=False)  # sampling goes on meanwhile
        except Exception:  # noqa: S110 - the real call recomputes and raises it
            pass
        finally:
            for _ in batches:
                todo.task_done()


def _wait_for_prefetch() -> None:
    """Block until every queued prefetch has run (its results are then in the cache)."""
    with _prefetch_lock:
        current = _prefetch_queue if _prefetch_pid == os.getpid() else None
    if current is not None:
        current.join()


# ---------------------------------------------------------------------------------------
# Parsing and equivalence (run inside the worker, or here when timeout_s is None)


@lru_cache(maxsize=1024)
def _parse(latex: str) -> Any:
    """The sympy object of `latex` (latex2sympy2_extended's `latex2sympy`); raises if it
    does not parse."""
    from latex2sympy2_extended import latex2sympy

    if not latex:
        raise ValueError("empty formula")
    fast = _fast_latex2sympy()
    if fast is not None:
        try:
            return fast(latex)
        except Exception:  # a syntax error of the input, or one of SLL's: full LL decides
            pass
    return latex2sympy(latex, conversion_config=_conversion_config())


def _conversion_config() -> Any:
    """latex2sympy2_extended's defaults, but symbols keep their case (`X` is not `x`)."""
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig

    return ConversionConfig(lowercase_symbols=False)


@lru_cache(maxsize=1)
def _fast_latex2sympy() -> Callable[[str], Any] | None:
    """`latex2sympy` with ANTLR's SLL prediction in every decision but those of the rule
    `atom_expr`, which keep full LL; None if latex2sympy2_extended's internals are not the
    ones this was written against.

    Full-LL prediction (the default) is most of the parse time: it runs whenever the
    context-free SLL lookahead is ambiguous, and its results are not cached. ANTLR
    guarantees that SLL prediction yields the full-LL parse tree or a syntax error; the
    argument holds decision by decision (an SLL choice that differs from LL's is one that
    LL ruled out for this input in its real context, so parsing on with it fails). So a
    parse that succeeds here is `latex2sympy`'s, and `_parse` retries a failure with full
    LL. `atom_expr` keeps LL because SLL picks wrongly there on common input (`(k+3)^{2}`),
    which would make the retry the rule."""
    try:
        from antlr4.atn.ParserATNSimulator import ParserATNSimulator
        from antlr4.atn.PredictionMode import PredictionMode
        from latex2sympy2_extended import latex2sympy2 as l2s

        parser_class = l2s.PSParser
        ll_decisions = frozenset(
            d
            for d, state in enumerate(parser_class.atn.decisionToState)
            if state.ruleIndex == parser_class.RULE_atom_expr
        )
        base, normalize = l2s._Latex2Sympy, l2s.normalize_latex
        normalization = l2s.NormalizationConfig
    except (ImportError, AttributeError):
        return None
    if not callable(getattr(base, "create_parser", None)):  # the method overridden below
        return None

    class Simulator(ParserATNSimulator):
        def adaptivePredict(self, input: Any, decision: int, outerContext: Any) -> int:
            self.predictionMode = (
                PredictionMode.LL if decision in ll_decisions else PredictionMode.SLL
            )
            return super().adaptivePredict(input, decision, outerContext)

    class Converter(base):
        def create_parser(self, latex_str: str) -> Any:
            parser = super().create_parser(latex_str)
            parser._interp = Simulator(
                parser, parser.atn, parser.decisionsToDFA, parser.sharedContextCache
            )
            return parser

    def convert(latex: str) -> Any:
        # latex2sympy(latex, conversion_config=_conversion_config()), through Converter.
        converter = Converter(None, None, False, config=_conversion_config())
        return converter.parse(normalize(latex, normalization()))

    return convert


def _check_here(pred: str, ref: str | None) -> tuple[bool, bool]:
    parsed, equivalent = _check_stages(pred, ref)
    return parsed, equivalent


def _check_stages(pred: str, ref: str | None):
    """Yields `parsed`, then `equivalent` (the worker reports each as soon as it is known)."""
    try:
        a = _parse(pred)
    except Exception:
        yield False
        yield False
        return
    yield True
    if ref is None:
        yield False
        return
    if pred == ref:
        yield True
        return
    try:
        yield bool(_equivalent(a, _parse(ref)))
    except Exception:
        yield False


def _equivalent(a: Any, b: Any) -> bool:
    import sympy

    if a == b:
        return True
    if isinstance(a, sympy.Equality) and isinstance(b, sympy.Equality):
        d1, d2 = a.lhs - a.rhs, b.lhs - b.rhs
        if _is_zero(d1 - d2) or _is_zero(d1 + d2):
            return True
        if d2 == 0 or _ratio_varies(d1, d2):
            return False
        ratio = sympy.simplify(d1 / d2)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    if isinstance(a, sympy.Equality) or isinstance(b, sympy.Equality):
        return False
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return _is_zero(a - b)
    return bool(sympy.simplify(a) == sympy.simplify(b))


def _ratio_varies(d1: Any, d2: Any) -> bool:
    """d1/d2 takes two clearly different values at probe points, so it is not a constant and
    simplify cannot make it one: skips the simplification that costs most of the time of
    comparing two different equations. Exact rational points and 30-digit evaluation that
    raises rather than return fewer correct digits (strict): rounding cannot make a constant
    ratio look varying; a point where the ratio is undefined or not evaluable is skipped."""
    import sympy

    ratio = d1 / d2
    symbols = sorted(ratio.free_symbols, key=str)
    if not symbols:
        return False
    points = [sympy.Rational(str(p)) for p in _PROBE_POINTS]
    seen: list[complex] = []
    for shift in range(3):
        point = {s: points[(k + shift) % len(points)] for k, s in enumerate(symbols)}
        try:
            value = complex(ratio.evalf(30, subs=point, strict=True))
        except Exception:  # zoo, nan, unevaluated objects, precision exhausted
            continue
        if not math.isfinite(abs(value)):
            continue
        if any(abs(value - v) > 1e-9 * max(abs(value), abs(v)) for v in seen):
            return True
        seen.append(value)
    return False


def _is_zero(d: Any) -> bool:
    """d ≡ 0: a numeric probe rejects quickly, expand settles polynomial identities, then
    sympy's simplify decides."""
    import sympy

    if d == 0:
        return True
    symbols = sorted(d.free_symbols, key=str)
    for shift in range(3):
        point = {s: _PROBE_POINTS[(k + shift) % len(_PROBE_POINTS)] for k, s in enumerate(symbols)}
        try:
            value = complex(d.subs(point).evalf())
        except Exception:  # unevaluated objects, zoo, nan: the probe cannot tell
            continue
        if math.isfinite(abs(value)) and abs(value) > 1e-9:
            return False
    return bool(sympy.expand(d) == 0 or sympy.simplify(d) == 0)


# ---------------------------------------------------------------------------------------
# The worker process


_pool_lock = threading.Lock()  # one batch at a time drives the workers
_workers: list[_Worker | None] = []  # slot i is driven by one thread of a batch


def _worker_count(caller_waits: bool = True) -> int:
    """One worker per core that the rest of the machine leaves free, at least one, at most
    MAX_WORKERS. The load that counts is the 1-minute load average, less this process's own
    (`_own_load`) when `caller_waits`: while the trainer waits for rewards, the cores its
    sampling and training threads keep busy are free; a prefetch runs while they are busy
    (`caller_waits=False`). On a busy machine a second worker only competes for the same cores
    (measured: 1.2-1.5x slower at a load of 3.5-4 on 2 cores, 1.6-1.9x faster at 1-2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        others = max(0.0, os.getloadavg()[0] - (_own_load() if caller_waits else 0.0))
    except OSError:  # load average unavailable: assume the machine is busy
        others = float(cpus)
    return max(1, min(MAX_WORKERS, round(cpus - others)))


_usage: deque[tuple[float, float]] = deque()  # (wall, CPU) seconds of this process


def _own_load(window_s: float = 60.0) -> float:
    """Busy threads of this process, on average over about the last `window_s` seconds (the
    load average's horizon): CPU seconds over wall seconds since the oldest sample kept."""
    now = (time.monotonic(), time.process_time())
    _usage.append(now)
    while len(_usage) > 2 and now[0] - _usage[1][0] >= window_s:
        _usage.popleft()  # keep one sample at least window_s old
    wall, cpu = now[0] - _usage[0][0], now[1] - _usage[0][1]
    return cpu / wall if wall > 0 else 0.0


def _worker(slot: int) -> _Worker:
    """The live worker of `slot`, started on first use (and again after a kill or a fork)."""
    current = _workers[slot]
    if current is None or not current.alive():
        current = _workers[slot] = _Worker()
    return current


def _run_in_workers(
    keys: list[Check], timeout_s: float, caller_waits: bool = True
) -> list[tuple[bool, bool]]:
    """Checks of `keys`, each handed to the next free worker (a worker parses a reference
    once: its parse cache)."""
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(keys)):
        todo.put(i)
    results: list[tuple[bool, bool] | None] = [None] * len(keys)
    errors: list[BaseException] = []

    def drive(slot: int) -> None:
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = _worker(slot).check(*keys[i], timeout_s)
        except BaseException as error:  # re-raised by the calling thread
            errors.append(error)

    with _pool_lock:
        n = min(_worker_count(caller_waits), len(keys))
        _workers.extend([None] * (n - len(_workers)))
        helpers = [
            threading.Thread(target=drive, args=(slot,), daemon=True) for slot in range(1, n)
        ]
        for thread in helpers:
            thread.start()
        drive(0)
        for thread in helpers:
            thread.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]  # every index was filled


@atexit.register
def _stop_workers() -> None:
    for current in _workers:
        if current is not None and current.alive():
            current.kill()


class _Worker:
    """A `policyopt.rewards.workers.Worker` checking (pred, ref): two replies, `parsed` then
    `equal`, each within the time limit."""

    def __init__(self) -> None:
        self.worker = Worker(
            __name__,
            "_check_stages",
            memory_bytes=WORKER_MEMORY_BYTES,
            warm_up="_warm_up",
            startup_timeout_s=WORKER_STARTUP_TIMEOUT_S,
        )
        try:
            self.worker.start()
        except WorkerError:
            raise RuntimeError(
                "formula_reward: the sympy worker process did not start (is "
                "latex2sympy2_extended installed?); timeout_s=None runs in this process"
            ) from None

    def alive(self) -> bool:
        return self.worker.alive()

    def kill(self) -> None:
        self.worker.kill()

    def check(self, pred: str, ref: str | None, timeout_s: float) -> tuple[bool, bool]:
        if not self.worker.request([pred, ref]):  # it died since alive() (a crash)
            return False, False
        parsed = self.worker.reply(timeout_s)  # TIMED_OUT: timed out or died on this input
        if parsed is TIMED_OUT:
            return False, False
        equal = self.worker.reply(timeout_s)  # after a failed parse, the matching False
        if not parsed:
            return False, False
        return True, equal is not TIMED_OUT and bool(equal)


def _warm_up() -> None:
    """Import and warm up sympy and the LaTeX parser (in the worker, before it is ready)."""
    _check_here("x+1", "1+x")

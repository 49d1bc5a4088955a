"""DocPO's formula reward (SPEC §5):

    R = v_syn · (0.8 · r_sem + 0.2 · r_struct)

- v_syn = 0 if the predicted LaTeX does not parse (latex2sympy2_extended), else 1;
- r_sem = 1 if prediction and reference are symbolically equivalent, else 0 (or the value of a
  pluggable `judge(prediction, reference) -> float in [0, 1]`, e.g. an LLM judge as in the
  paper). Expressions are equivalent if sympy simplifies their difference to 0; equations
  `a = b` and `c = d` if a − b and c − d are equal, opposite, or a constant non-zero multiple
  of each other; other objects (sets, matrices, inequalities) if they simplify to equal
  objects. A numeric probe at fixed points rejects most non-equivalent pairs before the
  (slow) simplification;
- r_struct = 1 − normalised Levenshtein distance of the two normalised LaTeX strings.

Normalisation (for both parsing and r_struct): outer math delimiters ($…$, $$…$$, \\(…\\),
\\[…\\]) and thin spaces (\\, \\; \\: \\!) are removed, and whitespace is dropped except the
one space that separates a control word from a following letter (`\\alpha x`). Symbols are
compared case-insensitively (latex2sympy2_extended's default `lowercase_symbols`).

sympy can hang or exhaust memory on some inputs (`10^{10^{10}}`, `(x+1)^{100000}`), inside C
code that no signal or thread can interrupt. So parsing and equivalence run in a separate
worker process with a time limit per stage (`timeout_s`) and an address-space cap; on a
timeout the worker is killed (and restarted on the next call), a parse that times out counts
as not parsing and an equivalence check that times out as not equivalent. `timeout_s=None`
runs everything in this process without a limit (trusted inputs only).

This module imports only the standard library and rapidfuzz at the top, so the worker can
load it by path without importing the rest of the package.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from rapidfuzz.distance import Levenshtein

SEMANTIC_WEIGHT = 0.8  # SPEC §5: 0.8 r_sem + 0.2 r_struct
STRUCTURE_WEIGHT = 0.2
DEFAULT_TIMEOUT_S = 5.0  # per stage (parse, equivalence); covers slow simplifications
WORKER_STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine
WORKER_MEMORY_BYTES = 4 << 30  # address-space cap of the worker (Linux)
_PROBE_POINTS = (0.7236, 1.3719, 2.1183, 0.4142, 1.7321)  # fixed: results must be reproducible

Judge = Callable[[str, str], float]


def formula_reward(
    prediction: str,
    reference: str,
    judge: Judge | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> float:
    """DocPO formula reward in [0, 1]; see the module docstring."""
    for name, value in (("prediction", prediction), ("reference", reference)):
        if not isinstance(value, str):
            raise TypeError(f"formula_reward: {name} must be a str, got {type(value).__name__}")
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"formula_reward: timeout_s must be > 0 or None, got {timeout_s}")
    pred, ref = normalise_latex(prediction), normalise_latex(reference)
    if judge is None:
        parsed, equivalent = _check(pred, ref, timeout_s)
        r_sem = float(equivalent)
    else:
        parsed = _check(pred, None, timeout_s)[0]
        r_sem = _judged(judge, prediction, reference) if parsed else 0.0
    if not parsed:
        return 0.0
    r_struct = Levenshtein.normalized_similarity(pred, ref)
    return min(1.0, SEMANTIC_WEIGHT * r_sem + STRUCTURE_WEIGHT * r_struct)


def latex_parses(latex: str, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
    """Whether latex2sympy2_extended parses `latex` (normalised) within the time limit."""
    return _check(normalise_latex(latex), None, timeout_s)[0]


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


@lru_cache(maxsize=4096)  # a group's rollouts often repeat the same formula
def _check(pred: str, ref: str | None, timeout_s: float | None) -> tuple[bool, bool]:
    """(pred parses, pred equivalent to ref); ref None: parse only."""
    if timeout_s is None:
        return _check_here(pred, ref)
    with _worker_lock:
        return _worker().check(pred, ref, timeout_s)


# ---------------------------------------------------------------------------------------
# Parsing and equivalence (run inside the worker, or here when timeout_s is None)


@lru_cache(maxsize=1024)
def _parse(latex: str) -> Any:
    """The sympy object of `latex`; raises if it does not parse."""
    from latex2sympy2_extended import latex2sympy

    if not latex:
        raise ValueError("empty formula")
    return latex2sympy(latex)


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
        yield _equivalent(a, _parse(ref))
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
        if d2 == 0:
            return False
        ratio = sympy.simplify(d1 / d2)
        return bool(ratio.is_number and ratio != 0 and ratio.is_finite)
    if isinstance(a, sympy.Equality) or isinstance(b, sympy.Equality):
        return False
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return _is_zero(a - b)
    return bool(sympy.simplify(a) == sympy.simplify(b))


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


_worker_lock = threading.Lock()
_current: _Worker | None = None


def _worker() -> _Worker:
    """The live worker, started on first use (and again after a kill or a fork)."""
    global _current
    if _current is None or not _current.alive():
        _current = _Worker()
    return _current


@atexit.register
def _stop_worker() -> None:
    if _current is not None and _current.alive():
        _current.kill()


class _Worker:
    """A child Python process answering JSON lines: {"pred", "ref"} -> {"parsed"}, {"equal"}."""

    _BOOT = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('_docparse_formula_worker', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "module._serve()\n"
    )

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self._BOOT, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        self.replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        if self._reply(WORKER_STARTUP_TIMEOUT_S) != {"ready": True}:
            self.kill()
            raise RuntimeError(
                "formula_reward: the sympy worker process did not start (is "
                "latex2sympy2_extended installed?); timeout_s=None runs in this process"
            )

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def check(self, pred: str, ref: str | None, timeout_s: float) -> tuple[bool, bool]:
        try:
            self.proc.stdin.write(json.dumps({"pred": pred, "ref": ref}) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker died since alive() (e.g. a crash on the last input)
            self.kill()
            return False, False
        parsed = self._reply(timeout_s)  # None: timed out or died on this input
        if parsed is None:
            self.kill()
            return False, False
        if not parsed["parsed"]:
            if self._reply(timeout_s) is None:  # the matching {"equal": false}, to stay in step
                self.kill()
            return False, False
        equal = self._reply(timeout_s)
        if equal is None:
            self.kill()
            return True, False
        return True, bool(equal["equal"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def _reply(self, timeout_s: float) -> dict | None:
        """The next reply, or None on a timeout or a dead worker."""
        try:
            line = self.replies.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return None if line is None else json.loads(line)


def _serve() -> None:
    """Worker loop: replies go to the original stdout; anything else printed goes to stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = (
            WORKER_MEMORY_BYTES
            if hard == resource.RLIM_INFINITY
            else min(hard, WORKER_MEMORY_BYTES)
        )
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):  # not on this platform
        pass
    _check_here("x+1", "1+x")  # import and warm up sympy and the LaTeX parser
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        for key, value in zip(
            ("parsed", "equal"), _check_stages(request["pred"], request["ref"]), strict=True
        ):
            out.write(json.dumps({key: bool(value)}) + "\n")
            out.flush()

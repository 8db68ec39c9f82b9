"""Math answer equality: light normalization, exact rationals, then sympy in a worker.

Symbolic checks run in a separate Python process (`python -m
agentenv.tasks._mathworker`) that is killed when a check runs past its timeout, so
a hostile answer (`9^{9^{9^9}}`) cannot hang or exhaust training. Before any
text reaches sympy it is converted from LaTeX to a plain expression and checked
against a whitelist of characters and names: `parse_expr` evaluates Python, and
the model writes the answer.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 2.0

# ----------------------------------------------------------------------------- normalization

_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname|mbox)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def unwrap_text(s: str) -> str:
    r"""`\text{Paris}` -> `Paris` (also \mathrm, \textbf, ...), innermost first."""
    prev = None
    while prev != s:
        prev, s = s, _TEXT_WRAPPERS.sub(r"\1", s)
    return s


def normalize_math(s: str) -> str:
    r"""Light normalization of a math answer for string comparison.

    Drops `$`, spaces, `\left`/`\right`, thin spaces, `\text{}` wrappers, degree
    and percent signs, a trailing period, thousands separators and a leading
    `x =`; writes `\dfrac`/`\tfrac` as `\frac`.
    """
    s = unwrap_text(s.strip())
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                     ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("$", ""),
                     ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", ""), ("%", ""), ("\\displaystyle", "")):  # fmt: skip
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s).rstrip(".")
    m = re.fullmatch(r"[a-zA-Z]=(.+)", s)
    if m:
        s = m[1]
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def as_rational(s: str) -> Fraction | None:
    r"""`12`, `-0.5`, `3/4`, `\frac{3}{4}`, `-\frac34` as an exact Fraction, else None."""
    s = normalize_math(s)
    m = re.fullmatch(r"([+-]?)\\frac\{?(\d+)\}?\{?(\d+)\}?", s)
    if m and (len(m[2]) == 1 or "{" in s):
        s = f"{m[1]}{m[2]}/{m[3]}"
    if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)(/\d+)?", s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


# ----------------------------------------------------------------------------- LaTeX -> safe plain text

_FUNCS = {"sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "asin", "acos", "atan", "Abs"}
_CONSTS = {"pi", "I", "E", "oo"}
_COMMANDS = {
    "\\cdot": "*", "\\times": "*", "\\div": "/", "\\pi": "pi", "\\infty": "oo", "\\ln": "log", "\\log": "log",
    "\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\cot": "cot", "\\sec": "sec", "\\csc": "csc",
    "\\exp": "exp", "\\arcsin": "asin", "\\arccos": "acos", "\\arctan": "atan", "\\le": "<=", "\\ge": ">=",
}  # fmt: skip
_MAX_LEN = 300


def _group(s: str, i: int) -> tuple[str, int] | None:
    """The argument starting at s[i]: a {...} group (nested) or one character. Returns (text, next index)."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    return None


def _expand(s: str) -> str | None:
    r"""Rewrite \frac, \sqrt and their arguments to plain parentheses, recursively."""
    out: list[str] = []
    i = 0
    while i < len(s):
        if s.startswith("\\frac", i):
            num = _group(s, i + 5)
            den = num and _group(s, num[1])
            if not den or not num:  # den is falsy whenever num is
                return None
            a, b = _expand(num[0]), _expand(den[0])
            if a is None or b is None:
                return None
            out.append(f"(({a})/({b}))")
            i = den[1]
        elif s.startswith("\\sqrt", i):
            j, index = i + 5, None
            if j < len(s) and s[j] == "[":
                k = s.find("]", j)
                if k < 0:
                    return None
                index, j = _expand(s[j + 1 : k]), k + 1
            arg = _group(s, j)
            if not arg:
                return None
            a = _expand(arg[0])
            if a is None:
                return None
            out.append(f"(({a})**(1/({index})))" if index else f"sqrt({a})")
            i = arg[1]
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def to_sympy_text(latex: str) -> str | None:
    """A LaTeX-ish or plain answer as text for sympy's `parse_expr`, or None if unsafe/unsupported.

    Only digits, operators, parentheses, single-letter symbols and a few known
    function and constant names survive; anything else (quotes, underscores,
    attribute access, unknown commands) gives None.
    """
    s = normalize_math(latex)
    if not s or len(s) > _MAX_LEN:
        return None
    expanded = _expand(s)
    if expanded is None:
        return None
    s = expanded
    for cmd in sorted(_COMMANDS, key=len, reverse=True):
        s = s.replace(cmd, f" {_COMMANDS[cmd]} ")
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if "\\" in s or not re.fullmatch(r"[0-9A-Za-z+\-*/().<=> ]*", s):
        return None
    if re.search(r"\.\D|\D\.|\.$", s.replace(" ", "")):  # dots only inside numbers
        return None
    for name in re.findall(r"[A-Za-z]+", s):
        if len(name) > 1 and name not in _FUNCS | _CONSTS:
            return None
    if s.count("(") != s.count(")"):
        return None
    return s


# ----------------------------------------------------------------------------- worker side


def _limit_resources() -> None:
    """Cap the worker's memory (2 GiB) so a huge expression fails instead of swapping the host."""
    try:
        import resource

        cap = 2 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):
        pass


def sympy_equal(a: str, b: str) -> bool:
    """Symbolic equality of two whitelisted plain expressions (see `to_sympy_text`). Runs in the worker."""
    import sympy
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    names = {n: getattr(sympy, n) for n in _FUNCS | {"pi", "I", "E", "oo"}}
    names["i"] = sympy.I  # "1+274i"
    names["e"] = sympy.E
    transformations = (*standard_transformations, implicit_multiplication_application)

    def parse(t: str):
        return parse_expr(t, local_dict=dict(names), global_dict={"__builtins__": {}, **_sympy_globals()},
                          transformations=transformations)  # fmt: skip

    x, y = parse(a), parse(b)
    if isinstance(x, sympy.core.relational.Relational) or isinstance(y, sympy.core.relational.Relational):
        return bool(x == y)
    if x == y or sympy.simplify(x - y) == 0:
        return True
    xv, yv = complex(sympy.N(x)), complex(sympy.N(y))
    return abs(xv - yv) <= 1e-8 * max(1.0, abs(yv))


def _sympy_globals() -> dict:
    """What parse_expr's generated code needs: sympy's atom constructors, nothing from builtins."""
    import sympy

    return {"Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational, "Symbol": sympy.Symbol}


def worker_main() -> None:
    """Answer `{"a", "b"}` JSON lines on stdin with `{"equal": bool}` (or `{"error": ...}`) on stdout."""
    _limit_resources()
    import sympy  # noqa: F401  (warm: the first request should not pay for the import)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            reply: dict[str, Any] = {"equal": bool(sympy_equal(req["a"], req["b"]))}
        except Exception as e:  # noqa: BLE001 (any parse failure means "not shown equal")
            reply = {"error": f"{type(e).__name__}: {e}"[:200]}
        print(json.dumps(reply), flush=True)


# ----------------------------------------------------------------------------- client side


class SympyWorker:
    """A long-lived sympy process; killed and restarted when a check times out."""

    def __init__(self, start_timeout_s: float = 30.0):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        """How many times the worker was killed (timeouts, crashes)."""

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentenv.tasks._mathworker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env,
        )  # fmt: skip
        if self._readline(proc, self.start_timeout_s) is None:
            self._kill(proc)
            raise RuntimeError(f"the sympy worker ({sys.executable} -m agentenv.tasks._mathworker) did not start")
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any] | None:
        assert proc.stdout is not None  # started with stdout=PIPE
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = proc.stdout.readline()
        return json.loads(line) if line else None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f:
                f.close()

    def equal(self, a: str, b: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
        """True/False from sympy; None when it failed to decide within `timeout_s` (or crashed)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.write(json.dumps({"a": a, "b": b}) + "\n")
                proc.stdin.flush()
                reply = self._readline(proc, timeout_s)
            except (BrokenPipeError, OSError, ValueError):
                reply = None
            if reply is None:
                log.debug("sympy check of %r vs %r gave no answer in %.1fs; worker restarted", a, b, timeout_s)
                self._kill(proc)
                self._proc = None
                self.restarts += 1
                return None
            return reply.get("equal") if "equal" in reply else False

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._kill(self._proc)
                self._proc = None


_worker: SympyWorker | None = None
_worker_lock = threading.Lock()


def get_worker() -> SympyWorker:
    """The process-wide sympy worker (started on first use, killed at exit)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = SympyWorker()
            atexit.register(_worker.close)
        return _worker


def _split_top_level(s: str) -> list[str]:
    """Split on commas outside (), [], {}: tuples and intervals compare element-wise."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _brackets(s: str) -> str:
    """The enclosing bracket pair of a tuple or interval ("()", "[)", ...), or ""."""
    return s[0] + s[-1] if len(s) > 1 and s[0] in "([" and s[-1] in ")]" else ""


def math_equal(pred: str, truth: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    r"""Whether a predicted math answer equals the reference.

    Order: normalized string match; exact rationals (`0.5` = `\frac{1}{2}`);
    element-wise for comma-separated tuples; else sympy (`\sqrt{8}` = `2\sqrt{2}`)
    in a worker process with a timeout, where anything not shown equal in time is
    unequal.
    """
    p, t = normalize_math(pred), normalize_math(truth)
    if not p or not t:
        return False
    if p == t:
        return True
    rp, rt = as_rational(p), as_rational(t)
    if rp is not None and rt is not None:
        return rp == rt
    pp, tp = _split_top_level(p), _split_top_level(t)
    if len(pp) > 1 or len(tp) > 1:
        bp, bt = _brackets(p), _brackets(t)
        if bp and bt and bp != bt:  # "(1,2)" and "[1,2]" are different intervals
            return False
        pp, tp = _split_top_level(p[1:-1] if bp else p), _split_top_level(t[1:-1] if bt else t)
        return len(pp) == len(tp) and all(math_equal(a, b, timeout_s) for a, b in zip(pp, tp, strict=True))
    a, b = to_sympy_text(p), to_sympy_text(t)
    if a is None or b is None:
        return False
    return get_worker().equal(a, b, timeout_s) is True


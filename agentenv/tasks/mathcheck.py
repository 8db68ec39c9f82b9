"""Math answer equality: light normalization, exact rationals, then sympy in a worker.

Symbolic checks run in the verifier worker (`agentenv.tasks.worker`), a
process that is killed when a check runs past its timeout, so
a hostile answer (`9^{9^{9^9}}`) cannot hang or exhaust training. Before any
text reaches sympy it is converted from LaTeX to a plain expression and checked
against a whitelist of characters and names: `parse_expr` evaluates Python, and
the model writes the answer.
"""

from __future__ import annotations

import re
from fractions import Fraction

from agentenv.tasks.worker import VerifierFailed, VerifierTimeout, get_worker

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


# ----------------------------------------------------------------------------- in the verifier worker


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
    try:
        return get_worker().call("agentenv.tasks.mathcheck:sympy_equal", a, b, timeout_s=timeout_s) is True
    except (VerifierTimeout, VerifierFailed):  # not shown equal in time, or sympy could not parse it
        return False


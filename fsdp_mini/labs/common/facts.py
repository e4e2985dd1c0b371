"""Facts about a divergence, over every configuration a check ran: what a formula exercise's hint
says in numbers. Each is a predicate or a measure of the answer's values beside the reference's,
never a recognition of a known answer.

    constant_ratio(d, "bytes")          # 8.0: yours is 8x the reference's everywhere
    right_wherever(d)                   # "right in every configuration with latency us 0"
    same_as_at(d, "bytes", "strategy")  # ("fsdp", "ddp"): your fsdp is the reference's ddp
    fit_terms(rows)                     # least squares of yours - the reference's on terms
"""

from __future__ import annotations

import math

import torch

from .records import shown


def number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def pairs(d, observable: str, **where):
    """(config, yours, the reference's) where both are finite numbers."""
    return [(c, m, w) for c, m, w in d.pairs(observable, **where) if number(m) and number(w)]


def constant_ratio(d, observable: str, **where) -> float | None:
    """yours / the reference's where that is one number (not 1) in every configuration with
    non-zero values (two at least)."""
    r = [m / w for _, m, w in pairs(d, observable, **where) if w]
    if len(r) < 2 or any(abs(x / r[0] - 1) > 1e-6 for x in r) or abs(r[0] - 1) < 1e-9:
        return None
    return r[0]


UNITS = {8: "bits, not bytes", 1 / 8: "bytes counted where bits were asked",
         1e3: "milliseconds, not seconds", 1e-9: "in units of 10⁹", 1e9: "in units of 10⁻⁹",
         1e9 / 2**30: "GiB (2³⁰ B), not GB (10⁹ B)", 2**30 / 1e9: "GB read as GiB (2³⁰ B)"}


def unit_words(ratio: float | None, units: dict = UNITS) -> str:
    """What a constant ratio means, from ``units`` ({ratio: words}), or ''."""
    return next((w for k, w in units.items() if ratio and abs(ratio / k - 1) < 1e-3), "")


def right_wherever(d, least: int = 3) -> list[tuple[str, list]]:
    """(axis, values): every configuration with one of these values agrees (``least`` of them
    at least), and no differing configuration has one (where the answer is right whatever the
    rest)."""
    out, every = [], d.agree + d.differ
    for axis in (every[0] if every else {}):
        if axis.startswith("_"):
            continue
        bad = {repr(c[axis]) for c in d.differ}
        seen = [repr(c[axis]) for c in d.agree]
        good = sorted({v for v in seen if seen.count(v) >= least} - bad)
        if good and bad and len({repr(c[axis]) for c in every}) > 1:
            out.append((axis, [next(c[axis] for c in every if repr(c[axis]) == g) for g in good]))
    return out


def right_wherever_words(d) -> str:
    found = right_wherever(d)
    return "; ".join(f"right in every configuration with {a.replace('_', ' ')} "
                     f"{', '.join(shown(v) for v in vs)}" for a, vs in found)


def right_only_with(d, axis: str, test) -> bool:
    """Every configuration whose ``axis`` passes ``test`` agrees, some differing one exists, and
    ``axis`` is what separates them: a differing configuration agrees with ``axis`` alone changed
    to a value that passes (not an axis that merely never met the mistake)."""
    if not d.differ or any(test(c[axis]) for c in d.differ):
        return False
    rest = lambda c: sorted((k, repr(v)) for k, v in c.items() if k != axis)  # noqa: E731
    passing = [rest(c) for c in d.agree if test(c[axis])]
    return any(rest(c) in passing for c in d.differ)


def same_as_at(d, observable: str, axis: str, rel: float = 1e-6):
    """(v, v'): in every differing configuration with ``axis`` = v, yours is the reference's of
    the same configuration with ``axis`` = v' (v' != v, one v' for all), else None."""
    table = {tuple(sorted((k, repr(x)) for k, x in c.items() if k != axis)): {}
             for c in d.table}
    for c, (mine, want) in d.table.items():
        table[tuple(sorted((k, repr(x)) for k, x in c.items() if k != axis))][repr(c[axis])] = (
            c[axis], mine.get(observable), want.get(observable))
    found = None
    for c in d.differ:
        row = table[tuple(sorted((k, repr(x)) for k, x in c.items() if k != axis))]
        value, mine, _ = row[repr(c[axis])]
        if not number(mine):
            return None
        hits = {v for v, _, w in row.values() if v != value and number(w) and
                abs(mine - w) <= rel * max(abs(w), 1e-12)}
        if found is None:
            found = (value, hits)
        elif found[0] != value:
            return None
        else:
            found = (value, found[1] & hits)
        if not found[1]:
            return None
    return (found[0], sorted(found[1], key=repr)[0]) if found else None


def fit_terms(rows: list[tuple[dict, float]], tol: float = 1e-6) -> dict | None:
    """Least squares of y on the named terms of each row ({term: x}, y); the coefficients when
    they explain y within ``tol`` (relative to y's size), rounded to 3 digits, else None."""
    if len(rows) < 2:
        return None
    names = sorted({k for x, _ in rows for k in x})
    a = torch.tensor([[x.get(k, 0.0) for k in names] for x, _ in rows], dtype=torch.float64)
    y = torch.tensor([v for _, v in rows], dtype=torch.float64)
    scale = a.abs().amax(0).clamp_min(1e-300)
    coef = torch.linalg.lstsq(a / scale, y.unsqueeze(1)).solution.squeeze(1) / scale
    if float((a @ coef - y).norm()) > tol * max(float(y.norm()), 1e-300):
        return None
    return {k: round(float(c), 3) + 0.0 for k, c in zip(names, coef)}


def terms_words(fit: dict, model: dict) -> str:
    """'compute x1, latency x0 (the model: x1: ...)': each fitted term beside the model's."""
    return ", ".join(
        f"{k} x{v:g}" + (f" (the model: x{model.get(k, 0):g}{': ' * bool(u)}{u})"
                         if abs(v - model.get(k, 0)) > 1e-3 else "")
        for k, v in fit.items() if abs(v) > 1e-3 or k in model for u in [unit_words(v)])


def only_at_two_words(what: str) -> str:
    """The words for an answer right at 2 ranks only, where (N−1)/N = 1/2 and N − 1 = 1."""
    return (f"right only at world size 2, where (N−1)/N = 1/2 and N − 1 = 1: {what} written for "
            "2 ranks must follow world_size (N)")


def right_only_at_two(d) -> bool:
    return right_only_with(d, "world_size", lambda v: v == 2)

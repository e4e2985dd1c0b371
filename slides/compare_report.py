"""The report of ``fsdp-mini compare --json`` that ``slides/build.py --compare-json`` reads:
every field the build uses, checked once, where it is read (a bad file is one line naming the
flag, the file and the field, exit status 2)."""

from __future__ import annotations

import json
import math

STRATEGIES = ("single", "ddp", "zero1", "zero2", "fsdp")  # what the decks compare

class ReportError(ValueError):
    """A ``--compare-json`` file the decks cannot be built from: the message names the flag, the
    file as it was given and what is wrong with it, on one line."""


# What the build reads of a report (report_numbers, describe, fsdp_mini.plots.reports), by field:
# every field is checked once, here, so that a file that is not such a report is one clear error.
RANK_FIELDS = {  # field -> (what it is, the least it may be)
    "peak_bytes": ("bytes at the rank's peak", 0),
    "persistent_bytes": ("bytes kept between steps", 0),
    "sent_bytes_per_step": ("bytes sent per step", 0),
    "step_seconds": ("seconds per step", 0),
    "final_loss": ("the last step's loss", None)}
THEORY_FIELDS = ("persistent_bytes", "sent_bytes_per_step")
RUN_FIELDS = ("device", "backend", "torch")


def read_report(path: str) -> dict:
    """A report written by ``fsdp-mini compare --json``, checked for everything the decks read;
    a :class:`ReportError` (``--compare-json PATH: what is wrong``) for anything else."""
    where = f"--compare-json {path}"
    if not isinstance(path, str) or not path:
        raise ReportError(f"--compare-json {path!r}: give the path of a file that "
                          f"`fsdp-mini compare --json FILE` wrote")
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except json.JSONDecodeError as err:
        raise ReportError(f"{where}: not JSON: {err.msg} at line {err.lineno} column "
                          f"{err.colno}; give the file `fsdp-mini compare --json FILE` wrote") \
            from None
    except UnicodeDecodeError as err:
        raise ReportError(f"{where}: not JSON: not UTF-8 text (byte {err.start} is "
                          f"{err.object[err.start]:#04x}); give the file `fsdp-mini compare "
                          f"--json FILE` wrote") from None
    except RecursionError:
        raise ReportError(f"{where}: not a report: its JSON is nested too deeply") from None
    except OSError as err:
        raise ReportError(f"{where}: cannot be read: {err.strerror or err}") from None
    return check_report(report, where)


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return {dict: "an object", list: "an array (a list)", str: "a string"}.get(
        type(value), "a number")


def _shown(value) -> str:
    """``value`` as JSON writes it (cut at 40 characters), and its kind: ``"4" (a string)``."""
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= 40 else text[:37] + "..."
    return text if value is None else f"{text} ({_json_kind(value)})"


def _field(where: str, parent: dict, key: str, field: str, kind: type, what: str):
    """``parent[key]``, which must be a ``kind`` (dict, list or str)."""
    if key not in parent:
        raise ReportError(f"{where}: field {field} is missing (it should hold {what}); is this "
                          f"the report `fsdp-mini compare --json` writes?")
    value = parent[key]
    if not isinstance(value, kind):
        expected = {dict: "an object", list: "an array", str: "a string"}[kind]
        raise ReportError(f"{where}: field {field} must be {expected} ({what}), got "
                          f"{_shown(value)}")
    return value


def _number(where: str, parent: dict, key: str, field: str, what: str,
            at_least: float | None = 0, whole: bool = False):
    """``parent[key]``, a finite JSON number (not true/false, not a string) >= ``at_least``;
    with ``whole``, a whole one, returned as an int."""
    kind = "a whole number" if whole else "a number"
    wanted = f"{kind}{f' >= {at_least:g}' if at_least is not None else ''} ({what})"
    if key not in parent:
        raise ReportError(f"{where}: field {field} is missing (it should hold {wanted}); is "
                          f"this the report `fsdp-mini compare --json` writes?")
    value = parent[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{where}: field {field} must be {wanted}, got {_shown(value)}")
    # Note: an int of JSON has no bound; one past 2**63 would overflow float() further on
    if (isinstance(value, int) and abs(value) >= 2**63) or not math.isfinite(value) \
            or (whole and not float(value).is_integer()) \
            or (at_least is not None and value < at_least):
        raise ReportError(f"{where}: field {field} must be {wanted}, got {_shown(value)}")
    return int(value) if whole else value


def check_report(report, where: str) -> dict:
    """``report`` (parsed JSON) if it holds every field the decks read, of the right type and
    range; world_size and params made ints. ``where`` starts each error (the flag and file)."""
    if not isinstance(report, dict):
        raise ReportError(f"{where}: {_json_kind(report)} where an object is expected: the "
                          f"report `fsdp-mini compare --json FILE` writes (world_size, params, "
                          f"strategies, run)")
    report["world_size"] = world_size = _number(
        where, report, "world_size", "world_size", "the ranks it was measured on: the decks "
        "compare strategies across ranks, record it with --world-size 2 or more", at_least=2,
        whole=True)
    report["params"] = _number(where, report, "params", "params", "the model's parameters",
                               at_least=1, whole=True)
    strategies = _field(where, report, "strategies", "strategies", dict,
                        "per strategy, its formulas and its ranks' figures")
    missing = [s for s in STRATEGIES if s not in strategies]
    if missing:
        raise ReportError(f"{where}: the decks need every strategy of `fsdp-mini compare`; "
                          f"{', '.join(missing)} missing (record it without --strategies)")
    for name, entry in strategies.items():
        at = f"strategies.{name}"
        if not isinstance(entry, dict):
            raise ReportError(f"{where}: field {at} must be an object (theory, ranks), got "
                              f"{_shown(entry)}")
        theory = _field(where, entry, "theory", f"{at}.theory", dict, "the ZeRO formulas")
        for key in THEORY_FIELDS:
            _number(where, theory, key, f"{at}.theory.{key}", "bytes, by the formula")
        ranks = _field(where, entry, "ranks", f"{at}.ranks", list, "one object per rank")
        expected, why = ((1, "single runs on one rank") if name == "single"
                         else (world_size, f"world_size is {world_size}"))
        if len(ranks) != expected:
            raise ReportError(f"{where}: field {at}.ranks holds {len(ranks)} rank(s), but "
                              f"{why}: it should hold {expected}")
        for i, rank in enumerate(ranks):
            here = f"{at}.ranks[{i}]"
            if not isinstance(rank, dict):
                raise ReportError(f"{where}: field {here} must be an object (one rank's "
                                  f"figures), got {_shown(rank)}")
            for key, (what, least) in RANK_FIELDS.items():
                _number(where, rank, key, f"{here}.{key}", what, at_least=least)
            categories = _field(where, rank, "peak_by_category", f"{here}.peak_by_category",
                                dict, "bytes at the peak, by category")
            for key in categories:
                _number(where, categories, key, f"{here}.peak_by_category.{key}",
                        "bytes at the peak")
            # Note: what the slides' own run adds (a report of `fsdp-mini compare --json` has
            # neither; its figures then say the breakdown is missing)
            for extra, what in (("at_peak", "bytes by category at the moment of the peak"),
                                ("state_by_category", "bytes kept after a step, by category")):
                if extra in rank:
                    found = _field(where, rank, extra, f"{here}.{extra}", dict, what)
                    for key in found:
                        _number(where, found, key, f"{here}.{extra}.{key}", what)
    # Note: the decks show DDP's state as a multiple of FSDP's, and the bytes sent as multiples
    # of DDP's
    for name, key in (("fsdp", "persistent_bytes"), ("ddp", "sent_bytes_per_step")):
        if strategies[name]["ranks"][0][key] == 0:
            raise ReportError(f"{where}: field strategies.{name}.ranks[0].{key} is 0; the decks "
                              f"divide by it (a report of {world_size} ranks never has 0 there)")
    run = report.get("run")
    if run is not None:
        if not isinstance(run, dict):
            raise ReportError(f"{where}: field run must be an object (device, backend, torch) "
                              f"or null, got {_shown(run)}")
        for key in RUN_FIELDS:
            if key in run and not isinstance(run[key], str):
                raise ReportError(f"{where}: field run.{key} must be a string (the slides "
                                  f"say where the numbers came from), got {_shown(run[key])}")
    return report

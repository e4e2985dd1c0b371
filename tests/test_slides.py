"""The workshop decks (slides/): built from a real run of the kit, self-contained, with speaker
notes on every slide and every number from the run; a deck breaking those rules is refused; a
report recorded elsewhere (`fsdp-mini compare --json`) feeds the same decks. The build runs here
at CI size; `tests/test_slides_browser.py` opens the decks in Chromium."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "slides"))

import build  # noqa: E402
import deck  # noqa: E402
import kit_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not (build.REVEAL / "dist" / "reveal.js").is_file() and shutil.which("npm") is None:
        pytest.skip("reveal.js is not in slides/node_modules and there is no npm to get it")
    out = tmp_path_factory.mktemp("slides")
    written, measured = build.build(out, "ci", make_pdf=False)
    return out, written, measured


class _References(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found = {"link": [], "script": [], "img": []}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" or (tag == "script" and "src" in attrs):
            self.found[tag].append(attrs.get("href") or attrs.get("src"))
        elif tag == "img":
            self.found["img"].append(attrs.get("src", ""))


def references(html: str) -> dict[str, list[str]]:
    """What the page would load: <link> and <script src> tags, and every image's source."""
    parser = _References()
    parser.feed(html)
    return parser.found


def sections(html: str) -> list[str]:
    return re.findall(r"<section\b.*?</section>", html, re.S)


def test_every_deck_is_one_self_contained_file_with_notes_and_real_figures(built):
    out, written, _ = built
    assert set(written) == set(build.decks()) == {"workshop-3h", "full-day"}
    for name, info in written.items():
        html = (out / f"{name}.html").read_text()
        slides = sections(html)
        assert len(slides) == info["slides"] >= 20, name
        # nothing fetched at show time: every script and style is inline, every image data
        refs = references(html)
        assert refs["link"] == [] and refs["script"] == [], (name, refs)
        assert all(src.startswith("data:image/png;base64,") for src in refs["img"]), name
        styles = "".join(re.findall(r"<style>(.*?)</style>", html, re.S))
        assert "@import" not in styles and not re.search(r"url\((?!data:)", styles), name
        text = "".join(slides)
        assert "{{" not in text and "FIGURE-" not in text and "figure:" not in text, name
        for s in slides:
            notes = re.search(r'<aside class="notes">(.*?)</aside>', s, re.S)
            assert notes and len(re.sub(r"<[^>]+>", "", notes.group(1)).strip()) > 40, s[:120]
        images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', text)
        assert len(images) >= 6 and len(images) == len(refs["img"]), name
        assert all(base64.b64decode(i).startswith(PNG) for i in images)
        assert "Reveal.initialize" in html and "RevealNotes" in html  # speaker view: press S


def test_every_number_on_the_slides_is_the_runs(built):
    """The slides show the main job's own figures (rank 0's bytes, formatted) and say where they
    came from; the rules of deck.py keep every other number off the slides."""
    out, _, measured = built
    html = (out / "workshop-3h.html").read_text()
    assert "measured at build time: 2 ranks, cpu/gloo" in html
    s = measured.report["strategies"]
    expected = {"ddp.state": s["ddp"]["ranks"][0]["persistent_bytes"],
                "fsdp.state": s["fsdp"]["ranks"][0]["persistent_bytes"],
                "fsdp.sent": s["fsdp"]["ranks"][0]["sent_bytes_per_step"]}
    from fsdp_mini.telemetry.units import fmt_bytes
    for key, value in expected.items():
        assert measured.numbers[key] == fmt_bytes(value) and fmt_bytes(value) in html, key
    ratio = s["fsdp"]["ranks"][0]["sent_bytes_per_step"] / s["ddp"]["ranks"][0]["sent_bytes_per_step"]
    assert f"{ratio:.2f}×" in html and 1.4 < ratio <= 1.5  # FSDP's 3Ψ against DDP's 2Ψ


def test_the_rise_notebook_has_every_slide_its_notes_and_the_live_cells(built):
    out, written, _ = built
    for name, info in written.items():
        nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
        assert kinds.count("slide") == info["slides"] and kinds.count("notes") == info["slides"]
        assert any(c.cell_type == "code" and "lab_config" in c.source for c in nb.cells)
        figures = [c for c in nb.cells if "attachment:" in c.get("source", "")]
        assert figures and all(base64.b64decode(a["image/png"]).startswith(PNG)
                               for c in figures for a in c.attachments.values())


def test_a_recorded_report_feeds_the_decks(built, tmp_path):
    """A report from a GPU box (here: this machine's, relabelled and scaled) is what the slides
    show: its numbers, and where it came from in words, never the file's path on this machine."""
    report = copy.deepcopy(built[2].report)
    report["run"].update(backend="nccl", device="NVIDIA H200")
    for entry in report["strategies"].values():
        for r in entry["ranks"]:
            r["persistent_bytes"] *= 3
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(report))
    build.build(tmp_path / "out", "ci", str(path), ["workshop-3h"], make_pdf=False)
    html = (tmp_path / "out" / "workshop-3h.html").read_text()
    assert "recorded with fsdp-mini compare --json: 2 ranks, NVIDIA H200/nccl" in html
    tripled = kit_run.report_numbers(report)["fsdp.state"]
    assert tripled != built[2].numbers["fsdp.state"] and tripled in html
    shown = re.sub(r"data:image/png;base64,[^\"]+", "", html)  # Note: base64 has slashes
    for where in (str(path), str(tmp_path), "gpu.json", str(Path.home()), str(ROOT)):
        assert where not in shown, f"{where!r} is on a slide"
    with pytest.raises(ValueError, match="fsdp missing"):
        del report["strategies"]["fsdp"]
        path.write_text(json.dumps(report))
        kit_run.read_report(str(path))


@pytest.mark.parametrize("text, problem", [
    ("## A slide\nFSDP sends 1.5x the bytes.\nNote:\nsay it", "sections/bad.md:2: the number '1.5'"),
    ("## A slide\nNo notes here.\n", "sections/bad.md:1: the slide has no speaker notes"),
    ("## A slide\n{{ fsdp.nonsense }}\nNote:\nsay it", "{{ fsdp.nonsense }} is no number of"),
    ("## A\nok\nNote:\nfine\n---\n## B\n\n`16Ψ` is fine, 3 GPUs are not\nNote:\nx",
     "sections/bad.md:8: the number '3'"),
])
def test_a_deck_breaking_the_rules_is_refused_with_its_line(tmp_path, text, problem):
    folder = tmp_path / "sections"
    folder.mkdir()
    (folder / "bad.md").write_text(text)
    with pytest.raises(deck.DeckError) as info:
        deck.parse(folder / "bad.md", {"fsdp.state": "1 MiB"})
    assert problem in str(info.value), str(info.value)


def test_names_and_formulas_with_digits_are_allowed():
    deck.check_numbers("ZeRO-3 and FSDP2 in bf16, lab 05, `16Ψ/N`, `(N−1)/N`, {{ a.b }}",
                       "x.md", 1)
    deck.check_numbers("```python\nlaunch(fn, 4)\n```\n", "x.md", 1)


# -- slides that tell the truth: every number and label read back from the run ---------------

import cloudpickle  # noqa: E402

import fsdp_mini  # noqa: E402
from fsdp_mini import plots  # noqa: E402
from fsdp_mini.comm.ledger import ring_bytes  # noqa: E402
from fsdp_mini.plots import diagrams  # noqa: E402
from fsdp_mini.telemetry.units import fmt_bytes, fmt_seconds  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import tests/

NUMBER = re.compile(r"(?<![\[\d])\d{1,2}:\d\d(?![\d\]])|\d[\d,]*(?:\.\d+)?")  # 1:05, 2,624
CLAIMS_OF_OVERLAP = re.compile(r"hidden behind|hides? behind|overlaps? with|under backward|"
                               r"behind backward|under the units' compute", re.I)


def slide_parts(section: str) -> dict:
    """What a slide shows: its text without notes, code or images; its kind and timing."""
    body = re.sub(r'<aside class="notes">.*?</aside>', "", section, flags=re.S)
    notes = re.search(r'<aside class="notes">(.*?)</aside>', section, re.S)
    text = re.sub(r"<pre>.*?</pre>|<code>.*?</code>", " ", body, flags=re.S)
    text = re.sub(r'<img [^>]*>', " ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    import html as _html
    head = re.search(r"<h[12][^>]*>(.*?)</h[12]>", body, re.S)
    return {"text": " ".join(_html.unescape(text).split()),
            "notes": _html.unescape(re.sub(r"<[^>]+>", " ", notes.group(1))) if notes else "",
            "title": _html.unescape(re.sub(r"<[^>]+>", "", head.group(1))).strip() if head else "",
            "kind": re.search(r'data-kind="([^"]*)"', section).group(1),
            "timing": int(re.search(r'data-timing="(\d+)"', section).group(1)),
            "source": re.search(r'data-source="([^"]*)"', section).group(1),
            "figures": re.findall(r'data-figure="(\w+)"', section)}


def numbers_in(text: str) -> set[str]:
    """The numbers a reader sees, names with digits (ZeRO-3, lab 05, bf16) left out."""
    text = deck.NAMES_WITH_DIGITS.sub(" ", text)
    text = re.sub(r"\b\w*[A-Za-z_]\d\w*\b|\b\d\d_\w+", " ", text)  # identifiers: w0, 04_zero1
    return {m.replace(",", "") for m in NUMBER.findall(text)}


def expected_numbers(measured, specs) -> set[str]:
    """Every number the run and the plan produced, formatted as the slides may show it,
    computed here from the raw report, telemetry, layouts, ring record and decks.toml."""
    out: set[str] = set()

    def add(*values):
        for v in values:
            out.update(m.replace(",", "") for m in NUMBER.findall(str(v)))
    report = measured.report
    add(report["world_size"], f"{report['params'] / 1e6:.2f}",
        (report.get("run") or {}).get("torch"))
    s = report["strategies"]
    for name, entry in s.items():
        add(fmt_bytes(entry["theory"]["persistent_bytes"]),
            fmt_bytes(entry["theory"]["sent_bytes_per_step"]))
        for r in entry["ranks"]:
            add(r["rank"], fmt_bytes(r["peak_bytes"]), fmt_bytes(r["persistent_bytes"]),
                fmt_bytes(r["sent_bytes_per_step"]), f"{r['step_seconds'] * 1e3:.0f}",
                f"{r['final_loss']:.4f}")
            for field in ("peak_by_category", "at_peak", "state_by_category"):
                add(*(fmt_bytes(v) for v in r.get(field, {}).values()))
    r0 = {k: v["ranks"][0] for k, v in s.items()}
    add(f"{r0['ddp']['persistent_bytes'] / r0['fsdp']['persistent_bytes']:.2f}",
        f"{r0['fsdp']['sent_bytes_per_step'] / r0['ddp']['sent_bytes_per_step']:.2f}",
        f"{r0['zero2']['sent_bytes_per_step'] / r0['ddp']['sent_bytes_per_step']:.2f}",
        f"{r0['fsdp']['peak_by_category']['activations'] / r0['ddp']['peak_by_category']['activations']:.2f}")  # noqa: E501
    for name in s:
        losses = [r["final_loss"] for r in s[name]["ranks"]]
        add(f"{sum(losses) / len(losses):.4f}")
    for run in measured.runs.runs.values():  # the timelines
        step = run.last_step()
        add(step, *range(step + 1), run.world_size)
        for r in run.rank_ids():
            found = plots.compute_and_comm(run, r, step)
            if found:
                start, end, _compute, comm = found
                busy = plots._union([(a, b) for a, b, _o, _l in comm])
                add(fmt_seconds(end - start), fmt_seconds(sum(b - a for a, b in busy)))
        for value in (run.theory_persistent(), run.theory_with_unit()):
            if value is not None:
                add(fmt_bytes(value))
    for name, found in measured.overlap.items():
        for v in found["ranks"].values():
            add(fmt_seconds(v["comm"]), fmt_seconds(v["hidden"]), fmt_seconds(v["step"]),
                f"{100 * v['hidden'] / v['comm']:.0f}" if v["comm"] else 0)
    for layout in measured.layouts.values():  # the flat buffers: every bound and count
        n = layout.world_size
        add(n, layout.numel, layout.padded_numel, layout.shard_numel,
            layout.padded_numel - layout.numel, len(layout.slots))
        for slot in layout.slots:
            add(slot.numel, *range(slot.numel if slot.numel < 16 else 0))
        for r in range(n):
            lo, hi = r * layout.shard_numel, (r + 1) * layout.shard_numel
            add(r, lo, hi, max(0, hi - max(lo, layout.numel)))
            for slot in layout.slots:
                a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
                if a < b:
                    add(a - slot.offset, b - slot.offset)
    ring = measured.ring
    add(*{"".join(map(str, sorted(cell))) for state in ring["states"] for row in state
          for cell in row})  # a cell's label: the ranks summed in it
    add(ring["world_size"], *range(2 * ring["world_size"]),
        f"{ring['sent'] / ring['payload']:.2f}", f"{ring['ring_bytes'] / ring['payload']:.2f}")
    for key, kwargs in kit_run.PLANS.items():  # the planner, again
        planned = fsdp_mini.plan(**kwargs)
        add(f"{planned.params / 1e9:.1f}", f"{planned.params / 1e9:.3g}", planned.gpus,
            f"{planned.gpu_mem_bytes / 1e9:g}",
            f"{(planned.gpu_mem_bytes - planned.reserve_bytes) / 1e9:.3g}")
        for strategy in planned.strategies.values():
            add(f"{strategy.persistent_bytes / 1e9:.1f}", f"{strategy.peak_bytes / 1e9:.1f}")
    for spec in specs.values():  # the agenda, the breaks, "your turn"
        at, pages = 0, 2
        for part in spec["sections"]:
            talk, hands = part.get("minutes", 0), part.get("hands_on", 0)
            add(talk, hands, f"{at // 60}:{at % 60:02d}",
                f"{(at + talk) // 60}:{(at + talk) % 60:02d}",
                f"{(at + talk + hands) // 60}:{(at + talk + hands) % 60:02d}")
            at += talk + hands
        add(*range(1, pages + 1))
    return out


def test_every_number_on_every_slide_and_figure_is_read_back_from_the_run(built):
    """Each number a slide shows (its text, and each text of its figures but the axes' scales)
    is one the run produced or decks.toml planned, recomputed here from the raw report,
    telemetry, layouts, ring and plan; and every text of a figure lies inside the picture."""
    out, _, measured = built
    specs = build.decks()
    expected = expected_numbers(measured, specs)
    for name in specs:
        for section in sections((out / f"{name}.html").read_text()):
            part = slide_parts(section)
            stray = numbers_in(part["text"]) - expected
            assert not stray, f"{name} {part['source']} ({part['title']!r}): {sorted(stray)} " \
                              f"came from no run"
    for figure, texts in measured.texts.items():
        for t in texts:
            assert t["inside"], f"{figure}: {t['text']!r} is cut by the picture's frame"
            assert t["in_frame"], f"{figure}: {t['text']!r} runs across its plot's frame"
            if t["kind"] != "tick":
                stray = numbers_in(t["text"]) - expected
                assert not stray, f"{figure}: {t['text']!r} holds {sorted(stray)}, from no run"


def test_the_memory_figure_shows_the_measured_peak_and_the_breakdown_at_that_moment(built):
    """Each bar's label is the strategy's measured peak (its largest rank's), never the sum of
    each category's own peak; its stack is what the categories held at the peak."""
    _, _, measured = built
    labels = {t["text"] for t in measured.texts["memory_by_strategy"] if t["kind"] == "text"}
    ax = diagrams.peak_memory(measured.report).axes[0]
    on_bar = {round(t.get_position()[0]): t.get_text() for t in ax.texts}
    apart = 0
    for i, (name, entry) in enumerate(measured.report["strategies"].items()):
        rank = max(entry["ranks"], key=lambda r: r["peak_bytes"])
        assert sum(rank["at_peak"].values()) == rank["peak_bytes"], name
        assert on_bar[i] == fmt_bytes(rank["peak_bytes"]) and on_bar[i] in labels, name
        own = sum(rank["peak_by_category"].values())  # what the old figure stacked
        apart += own > rank["peak_bytes"]
        bars = [p for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - i) < 1e-9]
        assert sum(p.get_height() for p in bars) == rank["peak_bytes"], name
    assert apart  # the categories do peak at different moments in this run
    title = next(t["text"] for t in measured.texts["memory_by_strategy"] if t["kind"] == "title")
    assert "at that moment" in title


def _report_with_own_peaks_apart():
    """A report whose categories peak at different moments: their own peaks add up to more
    than the peak of the step."""
    rank = {"rank": 0, "peak_bytes": 100, "persistent_bytes": 60, "sent_bytes_per_step": 1,
            "step_seconds": 0.1, "final_loss": 1.0,
            "peak_by_category": {"params": 40, "grads": 40, "activations": 50},
            "at_peak": {"params": 40, "grads": 20, "activations": 40},
            "state_by_category": {"params": 40, "grads": 20, "optimizer_state": 0}}
    theory = {"persistent_bytes": 60, "sent_bytes_per_step": 1}
    return {"world_size": 2, "params": 10, "strategies": {
        "single": {"theory": theory, "ranks": [dict(rank)]},
        "ddp": {"theory": theory, "ranks": [dict(rank), dict(rank, rank=1)]}}}


def test_the_memory_figure_stacks_the_moment_of_the_peak_not_each_categorys_own():
    report = _report_with_own_peaks_apart()
    ax = diagrams.peak_memory(report).axes[0]
    for i in range(2):
        bars = [p for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - i) < 1e-9]
        assert sum(p.get_height() for p in bars) == 100  # not 130
    without = copy.deepcopy(report)
    for entry in without["strategies"].values():
        for r in entry["ranks"]:
            del r["at_peak"], r["state_by_category"]
    texts = [t.get_text() for t in diagrams.peak_memory(without).findobj(
        __import__("matplotlib").text.Text)]
    assert any("no breakdown" in t for t in texts)
    assert any("no state by category" in t.get_text() for t in diagrams.zero_partition(
        without).findobj(__import__("matplotlib").text.Text))


def _covered(a, b):
    """Seconds two sorted lists of disjoint intervals share (written apart from kit_run's)."""
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_an_overlap_is_claimed_only_beside_a_timeline_that_shows_it(built):
    """The DDP and FSDP timeline slides say how much communication ran under compute, as the
    timeline measured it; a deck claims an overlap only where every rank showed one, and
    otherwise says what CPU ranks cannot show and what a GPU box's run would."""
    out, _, measured = built
    timelines = {}
    for name, figure in (("ddp", "ddp_step_timeline"), ("fsdp", "fsdp_step_timeline")):
        run = measured.runs.runs[name]
        step, shares = run.last_step(), []
        for r in run.rank_ids():
            _start, _end, compute, comm = plots.compute_and_comm(run, r, step)
            busy = plots._union([(a, b) for a, b, _o, _l in comm])
            shares.append(_covered(busy, compute) / sum(b - a for a, b in busy))
            if r == 0:
                hidden0 = fmt_seconds(_covered(busy, compute))
        shows = min(shares) >= kit_run.SHOWS_OVERLAP
        assert measured.overlap[name]["shows"] == shows
        timelines[figure] = (shows, hidden0)
    for deck_name in build.decks():
        for section in sections((out / f"{deck_name}.html").read_text()):
            part = slide_parts(section)
            claims = CLAIMS_OF_OVERLAP.search(part["text"] + " " + part["title"])
            drawn = [f for f in part["figures"] if f in timelines]
            if not drawn:
                assert not claims, (f"{deck_name} {part['source']}: an overlap claim with no "
                                    f"timeline beside it: {claims.group()!r}")
                continue
            shows, hidden0 = timelines[drawn[0]]
            assert hidden0 in part["text"], (deck_name, part["text"])
            if shows:
                assert claims, part["text"]
            else:
                assert not claims, (deck_name, part["title"], part["text"])
                assert "what CPU ranks cannot show" in part["title"]
                assert "GPU" in part["text"] and "--compare-json" in section


def test_the_overlap_sentence_follows_the_measurement():
    ranks = {0: {"step": 0.1, "comm": 0.04, "hidden": 0.03}}
    shown = kit_run.overlap_numbers("ddp", {"ranks": ranks, "shows": True}, "nccl", 4)
    assert "under backward" in shown["ddp.overlap_title"] and "30.0 ms of" in shown["ddp.overlap"]
    hidden = kit_run.overlap_numbers("ddp", {"ranks": ranks, "shows": False}, "gloo", 4)
    assert hidden["ddp.overlap_title"] == "what CPU ranks cannot show"
    assert not CLAIMS_OF_OVERLAP.search(hidden["ddp.overlap_title"])


def root_unit_on_rank(rank, world_size, model):
    """What FSDP itself builds for the root unit on this rank: its flat buffer's parameters,
    their offsets and sizes, the padded size, and the pieces this rank holds."""
    from fsdp_mini.models import GPTConfig, make_model
    net = make_model(GPTConfig.sized(model))
    net, _ = fsdp_mini.parallelize(net, "fsdp", units=list(net.blocks))
    group = net.fsdp_mini.root.groups[0]
    return {"slots": [(s.names[0], s.offset, s.numel) for s in group.layout.slots],
            "padded": group.layout.padded_numel, "pieces": group.pieces.in_params()}


def test_the_flat_buffer_figure_is_what_fsdp_builds_on_the_ranks(built):
    """The root unit drawn is the one FSDP builds on real ranks (names, offsets, padding, each
    rank's pieces), and the figure says, per rank, exactly the pieces it holds."""
    _, _, measured = built
    layout = measured.layouts["root"]
    n = layout.world_size
    on_ranks = fsdp_mini.launch(root_unit_on_rank, n, kit_run.SIZES["ci"]["model"], timeout=120)
    assert [(s.names[0], s.offset, s.numel) for s in layout.slots] == on_ranks[0]["slots"]
    assert layout.padded_numel == on_ranks[0]["padded"]
    lines = [t["text"] for t in measured.texts["flat_layout"] if t["text"].startswith("rank ")
             and ":" in t["text"]]
    example = measured.layouts["example"]
    assert example.padded_numel - example.numel == 3 and example.world_size == 4
    for lay, ranks in ((example, None), (layout, on_ranks)):
        shard = lay.padded_numel // lay.world_size
        for r in range(lay.world_size):
            lo, hi = r * shard, (r + 1) * shard
            held = []
            for k, slot in enumerate(lay.slots):
                a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
                if a < b:
                    held.append(f"{slot.names[0]}[{a - slot.offset:,}:{b - slot.offset:,}]")
                    if ranks:
                        assert tuple(ranks[r]["pieces"][k]) == (a - slot.offset, b - slot.offset)
            pad = max(0, hi - max(lo, lay.numel))
            if pad:
                held.append(f"padding ×{pad:,}")
            line = f"rank {r} [{lo:,}:{hi:,}]: " + ("  ".join(held) or "nothing")
            assert line in lines, (line, lines)
    assert "rank 3 [9:12]: padding ×3" in lines  # a rank that holds only padding


def test_the_ring_figure_is_lab_02s_ring_step_by_step(built):
    """Each step of the recorded ring is the textbook one (recomputed here with sets), each
    rank sent 2(N-1)/N of the tensor as the ledger says, and every cell's label is drawn."""
    _, _, measured = built
    ring = measured.ring
    n = ring["world_size"]
    held = [[frozenset([r]) for _c in range(n)] for r in range(n)]
    expected = [[list(row) for row in held]]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            sent = [(r, (r - step if phase == "reduce-scatter" else r + 1 - step) % n)
                     for r in range(n)]
            new = [list(row) for row in held]
            for r, c in sent:
                to = (r + 1) % n
                new[to][c] = held[to][c] | held[r][c] if phase == "reduce-scatter" else held[r][c]
            held = new
            expected.append([list(row) for row in held])
    assert ring["states"] == expected
    assert all(len(c) == n for row in ring["states"][-1] for c in row)
    assert ring["sent"] == ring_bytes("all_reduce", ring["payload"], n) == ring["ring_bytes"]
    labels = [t["text"] for t in measured.texts["ring_steps"]]
    for state in ring["states"]:
        for row in state:
            for cell in row:
                assert diagrams.ring_label(cell, n) in labels


def test_the_zero_figure_partitions_the_measured_state(built):
    """Each strategy's row is cut as the measured bytes say: a category every rank keeps whole
    (labelled with its bytes) or slices per rank; DDP keeps all three whole, ZeRO-1 slices the
    optimizer state, ZeRO-2 the gradients too, FSDP everything; each rank's total is drawn."""
    _, _, measured = built
    s, texts = measured.report["strategies"], [t["text"] for t in measured.texts["zero_partition"]]
    whole = s["single"]["ranks"][0]["state_by_category"]
    sliced = {"ddp": set(), "zero1": {"optimizer_state"},
              "zero2": {"optimizer_state", "grads"},
              "fsdp": {"optimizer_state", "grads", "params"}}
    for name, cut in sliced.items():
        for r in s[name]["ranks"]:
            assert sum(r["state_by_category"].values()) == r["persistent_bytes"], name
            for cat, value in r["state_by_category"].items():
                assert (value < 0.9 * whole[cat]) == (cat in cut), (name, cat, value)
                if cat not in cut:
                    assert f"every rank: {fmt_bytes(value)}" in texts
        state = max(r["persistent_bytes"] for r in s[name]["ranks"])
        assert f"{fmt_bytes(state)} per rank" in texts


def test_every_figure_reads_at_slide_size(built):
    """No text of a slide's figure under the size the browser test needs (14 px shown), and
    every figure at most as tall as a slide shows it."""
    out, _, measured = built
    for name, texts in measured.texts.items():
        assert min(t["px"] for t in texts) >= diagrams.SLIDE_PT * diagrams.SLIDE_DPI / 72 - 0.01
        assert deck.png_size(measured.figures[name])[1] <= deck.FIGURE_MAX_PX, name
    for name in build.decks():
        for code in re.findall(r"<pre><code[^>]*>(.*?)</code></pre>",
                               (out / f"{name}.html").read_text(), re.S):
            for line in __import__("html").unescape(code).splitlines():
                assert len(line) <= 76, f"{name}: a code line too wide for 26 px: {line!r}"


# -- readable and paced: timings, "your turn" and breaks, notes, the plan, the PDF -------------

def test_every_slide_has_its_share_of_the_plans_minutes(built):
    """data-timing on every slide; a section's slides share its talk minutes, a "your turn"
    slide has the hands-on minutes, a break its own; they add up to the deck's plan."""
    out, written, _ = built
    for name, spec in build.decks().items():
        parts = [slide_parts(s) for s in sections((out / f"{name}.html").read_text())]
        total = sum(p.get("minutes", 0) + p.get("hands_on", 0) for p in spec["sections"])
        assert sum(p["timing"] for p in parts) == total * 60, name
        assert written[name]["minutes"] == total
        by_file: dict[str, int] = {}
        for p in parts:
            if p["kind"] in ("slide", "agenda"):
                file = p["source"].split(":")[0].removeprefix("sections/")
                by_file[file] = by_file.get(file, 0) + p["timing"]
        for part in spec["sections"]:
            if "file" in part:
                assert by_file.pop(part["file"]) == part["minutes"] * 60, (name, part["file"])


def test_your_turn_and_break_slides_come_from_the_plan(built):
    out, _, _ = built
    for name, spec in build.decks().items():
        parts = [slide_parts(s) for s in sections((out / f"{name}.html").read_text())]
        made = [(p["kind"], p["title"], p["timing"]) for p in parts
                if p["kind"] in ("your-turn", "break")]
        planned = []
        for part in spec["sections"]:
            if "pause" in part:
                planned.append(("break", f"{part['pause']}, {part['minutes']} min",
                                part["minutes"] * 60))
            elif part.get("hands_on"):
                planned.append(("your-turn", f"Your turn: lab {part['lab'][:2]}, "
                                f"{part['hands_on']} min", part["hands_on"] * 60))
        assert made == planned, name
        for i, p in enumerate(parts):
            if p["kind"] == "your-turn":
                lab = re.search(r"labs/(\d\d_\w+)\.ipynb", sections(
                    (out / f"{name}.html").read_text())[i]).group(1)
                assert (ROOT / "labs" / f"{lab}.ipynb").is_file()
                for exercise in re.findall(r"<code>(\d\d_[a-z0-9_]+)</code>", sections(
                        (out / f"{name}.html").read_text())[i]):
                    assert (ROOT / "labs" / "solutions" / f"{exercise}.py").is_file(), exercise
                assert parts[i - 1]["kind"] == "slide" and parts[i - 1]["source"].startswith(
                    "sections/")


def test_each_deck_notes_its_own_minutes(built):
    """The agenda's notes give the deck's own talk, hands-on and break minutes and, per lab,
    its hands-on against the lab's own; never 'the lab's own' for a deck that differs."""
    out, _, _ = built
    notes = {}
    for name, spec in build.decks().items():
        agenda = [slide_parts(s) for s in sections((out / f"{name}.html").read_text())
                  if 'data-kind="agenda"' in s]
        assert agenda and all(len(re.findall(r"<tr>", s)) <= build.AGENDA_ROWS + 2 for s in
                              sections((out / f"{name}.html").read_text())
                              if 'data-kind="agenda"' in s)
        text = " ".join(agenda[0]["notes"].split())
        talk = sum(p["minutes"] for p in spec["sections"] if "pause" not in p)
        hands = sum(p.get("hands_on", 0) for p in spec["sections"])
        pauses = sum(p["minutes"] for p in spec["sections"] if "pause" in p)
        assert f"{talk} min of slides, {hands} min of hands-on, {pauses} min of breaks" in text
        for part in spec["sections"]:
            if part.get("hands_on"):
                assert f"{part['lab']} {part['hands_on']} min" in text, (name, part["lab"])
        assert "hands-on time is the lab's own" not in text
        notes[name] = text
    assert notes["workshop-3h"] != notes["full-day"]


def _prerequisites(lab: str) -> set[str]:
    first = json.loads((ROOT / "labs" / f"{lab}.ipynb").read_text())["cells"][0]["source"]
    line = re.search(r"\*\*Prerequisites:\*\*(.*?)(?:\n\n|$)", "".join(first), re.S)
    labs = {p.stem[:2]: p.stem for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb")}
    return {labs[n] for n in re.findall(r"\blab (\d\d)\b", line.group(1) if line else "")
            if labs[n] != lab}


def test_no_deck_starts_exercises_before_the_labs_they_build_on():
    """A lab's exercises come after the hands-on of every lab its notebook lists as a
    prerequisite, or after a talk the plan says covers it; the three-hour deck does lab 04's
    exercises (the flat buffer, ZeroScaffold) before lab 05's. Today's old plan is refused."""
    for name, spec in build.decks().items():
        done, talked = set(), set()
        for part in spec["sections"]:
            lab = part.get("lab")
            if lab and part.get("hands_on"):
                for needed in _prerequisites(lab):
                    assert needed in done or (needed in talked and needed in
                                              part.get("talk_covers", [])), (name, lab, needed)
                done.add(lab)
            if lab:
                talked.add(lab)
    three = [p.get("lab") for p in build.decks()["workshop-3h"]["sections"] if p.get("hands_on")]
    assert three.index("04_zero") < three.index("05_fsdp")
    old = copy.deepcopy(build.decks()["workshop-3h"])
    for part in old["sections"]:
        if part.get("lab") == "04_zero":
            part.pop("hands_on"), part.pop("talk_covers")
    with pytest.raises(deck.DeckError, match=r"05_fsdp's exercises .* build on 04_zero"):
        build.check_plan("workshop-3h", old)


class _FakePlaywright:
    def __init__(self, path):
        self.chromium = type("C", (), {"executable_path": path})()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_build_finds_a_chromium_or_says_loudly_that_no_pdf_was_made(built, monkeypatch,
                                                                         tmp_path, capsys):
    pytest.importorskip("playwright.sync_api")
    import playwright.sync_api as api
    monkeypatch.setattr(deck.shutil, "which", lambda name: None)
    bundled = tmp_path / "chrome"
    bundled.write_text("")
    monkeypatch.setattr(api, "sync_playwright", lambda: _FakePlaywright(str(bundled)))
    assert deck.find_chromium() == (str(bundled), "Playwright's own Chromium")
    monkeypatch.setattr(api, "sync_playwright", lambda: _FakePlaywright(str(tmp_path / "no")))
    exe, why = deck.find_chromium()
    assert exe is None and "apt-get install chromium" in why
    monkeypatch.setattr(deck.shutil, "which", lambda name: "/usr/bin/chromium"
                        if name == "chromium" else None)
    assert deck.find_chromium() == ("/usr/bin/chromium", "chromium on the PATH")
    # the whole build, with no Chromium anywhere (and the run behind it reused, for speed)
    monkeypatch.setattr(deck.shutil, "which", lambda name: None)
    monkeypatch.setattr(build.kit_run, "measure", lambda *args: built[2])
    assert build.main(["--size", "ci", "--out", str(tmp_path / "out"), "workshop-3h"]) == 0
    err = capsys.readouterr().err
    assert "NO PDF WAS MADE" in err and "WITHOUT the PDF of workshop-3h" in err
    assert not (tmp_path / "out" / "workshop-3h.pdf").exists()
    assert (tmp_path / "out" / "workshop-3h.html").is_file()
    assert build.main(["--size", "ci", "--out", str(tmp_path / "out"), "--require-pdf",
                       "workshop-3h"]) == 3


def test_a_recorded_breakdown_is_checked_like_every_other_field(built, tmp_path):
    report = copy.deepcopy(built[2].report)
    report["strategies"]["ddp"]["ranks"][1]["at_peak"]["grads"] = "12"
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=r"strategies\.ddp\.ranks\[1\]\.at_peak\.grads must be"):
        kit_run.read_report(str(path))

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
    show: its numbers, and where it came from, not the laptop run's."""
    report = copy.deepcopy(built[2].report)
    report["run"].update(backend="nccl", device="NVIDIA H200")
    for entry in report["strategies"].values():
        for r in entry["ranks"]:
            r["persistent_bytes"] *= 3
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(report))
    build.build(tmp_path / "out", "ci", str(path), ["workshop-3h"], make_pdf=False)
    html = (tmp_path / "out" / "workshop-3h.html").read_text()
    assert f"from {path}: 2 ranks, NVIDIA H200/nccl" in html
    tripled = kit_run.report_numbers(report)["fsdp.state"]
    assert tripled != built[2].numbers["fsdp.state"] and tripled in html
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

"""The workshop decks in headless Chromium: every slide of every deck renders (its figures loaded,
its content inside the slide, no console error), the PDF has a page per slide, and a deck is
presented live inside JupyterLab by RISE (jupyterlab-rise), its figures there, and one of its
live code cells run on stage. Screenshots are kept (``FSDP_MINI_SCREENSHOTS`` or the test's tmp dir; a few are copied
to /tmp/slides_*.png).

    python -m pytest -m browser tests/test_slides_browser.py -s
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from browser_helpers import running_lab
from browser_notebook import CHROMIUM, CHROMIUM_ARGS, requirements, wait_until

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "slides"))
import build  # noqa: E402

pytestmark = pytest.mark.browser

READ_SLIDE = r"""() => {
  const s = Reveal.getCurrentSlide();
  const imgs = [...s.querySelectorAll("img")];
  return {images: imgs.length, loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
          height: s.scrollHeight, room: Reveal.getConfig().height,
          title: (s.querySelector("h1, h2") || {}).textContent || ""};
}"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    requirements()
    out = tmp_path_factory.mktemp("decks")
    written, _ = build.build(out, "ci", make_pdf=True)
    return out, written


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _shots(tmp_path) -> Path:
    shots = Path(os.environ.get("FSDP_MINI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    return shots


@pytest.mark.parametrize("name", ["workshop-3h", "full-day"])
def test_every_slide_renders_with_its_figures_and_no_error(built, browser, name, tmp_path):
    out, written = built
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"failed to load {r.url}"))
    page.goto((out / f"{name}.html").as_uri())
    page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=30_000)
    page.evaluate("Reveal.configure({transition: 'none', backgroundTransition: 'none'})")
    total = page.evaluate("Reveal.getTotalSlides()")
    assert total == written[name]["slides"]
    shots, kept = _shots(tmp_path), []
    for i in range(total):
        page.evaluate(f"Reveal.slide({i})")
        assert wait_until(lambda: page.evaluate(READ_SLIDE)["loaded"] ==
                          page.evaluate(READ_SLIDE)["images"], 10), f"slide {i}: an image"
        seen = page.evaluate(READ_SLIDE)
        assert seen["height"] <= seen["room"] * 1.02, \
            f"{name} slide {i} ({seen['title']!r}) runs off the slide: {seen['height']} px"
        if i in (0, 1) or (seen["images"] and len(kept) < 4):
            shot = shots / f"{name}_{i:02d}.png"
            page.screenshot(path=str(shot))
            kept.append(shot)
    assert errors == [], errors
    for shot in kept[:3]:
        shutil.copy(shot, f"/tmp/slides_{shot.name}")
    pdf = (out / f"{name}.pdf").read_bytes()
    assert len(re.findall(rb"/Type\s*/Page[^s]", pdf)) == total  # one page per slide
    print(f"\n{name}: {total} slides rendered, screenshots {[s.name for s in kept]} in {shots}")
    page.close()


def test_a_deck_is_presented_live_in_jupyterlab_by_rise(built, browser, tmp_path):
    """jupyterlab-rise's slideshow of the deck's notebook: its slides, figures and code cells."""
    out, written = built
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(out / "workshop-3h.ipynb", served)
    with running_lab(served, tmp_path / "jupyterlab.log", tmp_path / "state") as lab:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(lab.url("rise/workshop-3h.ipynb"), timeout=60_000)
        page.wait_for_function("document.querySelectorAll('.reveal .slides > section').length > 0",
                               timeout=90_000)
        slides = page.evaluate("document.querySelectorAll('.reveal .slides > section').length")
        assert slides == written["workshop-3h"]["slides"]
        assert wait_until(lambda: page.evaluate(
            "[...document.querySelectorAll('.reveal img')].every(i => i.complete && "
            "i.naturalWidth > 0) && document.querySelectorAll('.reveal img').length >= 6"), 30)
        # on stage: go to the slide with the live cell and run it (its kernel is the lab's)
        live = page.evaluate("[...document.querySelectorAll('.reveal .slides > section')]"
                             ".findIndex(s => s.querySelector('.jp-CodeCell'))")
        assert live > 0, "no slide with a live code cell"
        page.keyboard.press("Escape")  # Note: command mode: the arrows move between slides
        shown = "document.querySelector('.reveal .slides > section.present .jp-CodeCell')"
        for _ in range(live * 3):
            if page.evaluate(f"!!{shown}"):
                break
            page.keyboard.press("ArrowRight")
            page.wait_for_timeout(300)
        assert page.evaluate(f"!!{shown}"), "could not reach the slide with the live cell"
        cell = page.locator(".reveal .jp-CodeCell").first
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        assert wait_until(lambda: "lab config:" in cell.locator(".jp-OutputArea").inner_text(),
                          60), "the live cell did not run"
        shot = _shots(tmp_path) / "rise_workshop-3h.png"
        page.screenshot(path=str(shot))
        shutil.copy(shot, "/tmp/slides_rise.png")
        page.close()

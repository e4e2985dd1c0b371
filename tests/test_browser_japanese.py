"""The Japanese project-lead notebook in headless Chromium: it runs to the end in JupyterLab, and
its Japanese text is drawn with a CJK font (Debian's fonts-noto-cjk), not as boxes of missing
glyphs: the browser itself says which font drew the title, and how many glyphs it took from it.

    python -m pytest -m browser tests/test_browser_japanese.py -s     # needs chromium, the font
"""

from __future__ import annotations

import pathlib
import shutil

import pytest
from browser_notebook import assert_nothing_left, assert_ran_cleanly, open_notebook, run_to_the_end

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "labs" / "project_lead.ja.ipynb"
TITLE = "プロジェクトリーダー向け"


def _fonts_of(page, selector: str) -> list[dict]:
    """The platform fonts Chromium used for the text of the first element ``selector`` matches:
    [{"familyName": ..., "glyphCount": ...}] (the DevTools protocol's CSS.getPlatformFontsForNode)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    assert node, f"nothing matches {selector!r}"
    return cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]


def test_the_japanese_notebook_runs_and_draws_its_text_with_a_cjk_font(tmp_path):
    with open_notebook(NOTEBOOK, tmp_path) as nb:
        state, took = run_to_the_end(nb, 240.0)
        assert_ran_cleanly(state, nb.code)
        title = nb.page.locator(".jp-MarkdownOutput h1").first
        assert TITLE in title.inner_text()
        fonts = _fonts_of(nb.page, ".jp-MarkdownOutput h1")
        cjk = [f for f in fonts if "CJK" in f["familyName"] and f["glyphCount"] > 0]
        assert cjk, f"the title was drawn without a CJK font (boxes for the kana and kanji): {fonts}"
        drawn = sum(f["glyphCount"] for f in cjk)
        kana_kanji = sum(1 for ch in title.inner_text() if ord(ch) > 0x2FFF)
        assert drawn >= kana_kanji, f"{drawn} CJK glyphs for {kana_kanji} characters: {fonts}"
        outputs = " ".join(c["output"] for c in state["cells"])
        assert "要点" in "".join(c["source"] for c in state["cells"]) or "シャーディング" in outputs
        shot = nb.shots / "project_lead_ja.png"
        nb.page.screenshot(path=str(shot))
    shutil.copy(shot, "/tmp/browser_project_lead_ja.png")
    print(f"\nproject_lead.ja: run all cells took {took:.1f} s; the title was drawn with "
          f"{', '.join(f['familyName'] + ' (' + str(f['glyphCount']) + ' glyphs)' for f in fonts)};"
          f" screenshot {shot} (copied to /tmp/browser_project_lead_ja.png)")
    assert_nothing_left(nb, "fsdp_mini.launcher.rank_entry")

"""A deck's Markdown source -> self-contained reveal.js HTML, a notebook for RISE, and a PDF.

The source of a section (``slides/sections/*.md``) is Markdown, one slide after another::

    ## FSDP keeps 1/N of the state                 <- a slide
    Each rank keeps {{ fsdp.state }}: ...          <- a number the build's run produced
    ![memory per strategy](figure:memory_by_strategy)   <- a figure drawn by fsdp_mini.plots
    ```python live                                 <- code to run on stage (a cell in RISE)
    fsdp_mini.launch(...)
    ```
    Note:                                          <- the speaker notes, to the slide's end
    Say that ...
    ---                                            <- the next slide

Rules the build enforces, so that every number on a slide is one the run produced: every slide
has speaker notes; every ``{{ key }}`` is a number of the run; and outside placeholders and
code (inline or fenced), the prose holds no digits except in names (ZeRO-3, FSDP2, bf16, lab 05,
α-β...). Formulas go in backticks: ``16Ψ/N``.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import mistune
import nbformat

PLACEHOLDER = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")
FIGURE = re.compile(r"!\[([^\]]*)\]\(figure:(\w+)\)")
LIVE = re.compile(r"^```python live\n(.*?)^```\n?", re.S | re.M)
NAMES_WITH_DIGITS = re.compile(r"ZeRO-[123]|FSDP[12]|DDP2|bf16|fp16|fp32|nccl-tests|[Ll]abs? "
                               r"\d\d(?:[–-]\d\d)?|α-β|GPT-2|[AHL]\d+(?:-\d+GB)?|T4|H200|"
                               r"NCCL_\w+")


class DeckError(ValueError):
    """A deck source breaks one of the rules above; the message names the file and line."""


@dataclass
class Slide:
    body: str    # Markdown, placeholders filled
    notes: str   # Markdown
    where: str   # "sections/05_fsdp.md:12", for errors
    timing: int | None = None  # seconds the speaker has for it (reveal.js's data-timing)
    kind: str = "slide"        # "slide", or one the build makes: "agenda", "your-turn", "break"


def parse(path: Path, numbers: dict[str, str]) -> list[Slide]:
    """The slides of one section file, checked and with its numbers filled in."""
    slides, line = [], 1
    for chunk in re.split(r"^---[ \t]*$", path.read_text(encoding="utf-8"), flags=re.M):
        start, line = line, line + chunk.count("\n")
        if not chunk.strip():
            continue
        where = f"{path.parent.name}/{path.name}:{start + len(chunk) - len(chunk.lstrip())}"
        body, sep, notes = chunk.partition("\nNote:")
        if not sep or not notes.strip():
            raise DeckError(f"{where}: the slide has no speaker notes (a 'Note:' line, then "
                            f"what to say)")
        check_numbers(body, f"{path.parent.name}/{path.name}", start)
        slides.append(Slide(fill(body.strip(), numbers, where),
                            fill(notes.strip(), numbers, where), where))
    return slides


def fill(text: str, numbers: dict[str, str], where: str) -> str:
    def number(match):
        key = match.group(1)
        if key not in numbers:
            raise DeckError(f"{where}: {{{{ {key} }}}} is no number of the build's run; known: "
                            f"{', '.join(sorted(numbers))}")
        return numbers[key]
    return PLACEHOLDER.sub(number, text)


def check_numbers(body: str, file: str, first_line: int) -> None:
    """No digit in the prose but in placeholders, code and names (see the module docstring)."""
    fenced = False
    for number, text in enumerate(body.split("\n"), first_line):
        if text.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for pattern in (PLACEHOLDER, re.compile(r"`[^`]*`"), FIGURE, NAMES_WITH_DIGITS,
                        re.compile(r"^#+ .*\b\d\d_\w+")):
            text = pattern.sub("", text)
        digits = re.search(r"\d[\d.,]*", text)
        if digits:
            raise DeckError(f"{file}:{number}: the number {digits.group()!r} did not come from "
                            f"the run; use a {{{{ placeholder }}}}, or backticks for a formula")


# -- reveal.js HTML --------------------------------------------------------------------------------

_markdown = mistune.create_markdown(plugins=["table", "strikethrough"])


def slide_html(slide: Slide, figures: dict[str, bytes], sources: dict[str, str],
               min_font_px: dict[str, float] | None = None) -> str:
    wanted = []

    def mark(match):  # Note: a token mistune leaves alone; the figure goes in after rendering
        wanted.append((match.group(2), match.group(1)))
        return f"FIGURE-{len(wanted) - 1}-HERE"

    def image(match):
        name, caption = wanted[int(match.group(1))]
        if name not in figures:
            raise DeckError(f"{slide.where}: no figure {name!r}; known: {', '.join(figures)}")
        data = base64.b64encode(figures[name]).decode()
        width, height = png_size(figures[name])
        smallest = (min_font_px or {}).get(name)
        size = f' data-min-font-px="{smallest:.1f}"' if smallest else ""
        return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}" '
                f'width="{width}" height="{height}" data-figure="{name}"{size}>'
                f'<figcaption>{html.escape(caption)} ({html.escape(sources[name])})'
                f'</figcaption></figure>')
    body = LIVE.sub(lambda m: f"```python\n{m.group(1)}```\n", slide.body)
    body = re.sub(r"FIGURE-(\d+)-HERE", image, _markdown(FIGURE.sub(mark, body)))
    timing = f' data-timing="{slide.timing}"' if slide.timing is not None else ""
    return (f'<section data-source="{html.escape(slide.where)}" data-kind="{slide.kind}"'
            f'{timing}>{body}<aside class="notes">{_markdown(slide.notes)}</aside></section>')


def png_size(png: bytes) -> tuple[int, int]:
    """A PNG's width and height in pixels (its IHDR chunk)."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


WIDTH, HEIGHT, MARGIN = 1280, 720, 0.04  # reveal.js's design size (16:9) and its margin
# Note: the speaker view paces the talk only when defaultTiming (or totalTime) is set; every
# slide the build makes carries its own data-timing, which wins over this default.
DEFAULT_TIMING = 120


def reveal_html(title: str, slides: list[Slide], figures, sources, reveal: Path,
                min_font_px: dict[str, float] | None = None) -> str:
    """One file: reveal.js, its theme and the notes plugin inlined, figures as data URIs."""
    def asset(rel: str) -> str:
        return (reveal / rel).read_text(encoding="utf-8")
    theme = re.sub(r"@import url\([^)]*\);", "", asset("dist/theme/white.css"))
    sections = "\n".join(slide_html(s, figures, sources, min_font_px) for s in slides)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<style>{asset("dist/reset.css")}</style><style>{asset("dist/reveal.css")}</style>
<style>{theme}</style><style>{STYLE}</style></head>
<body><div class="reveal"><div class="slides">
{sections}
</div></div>
<script>{asset("dist/reveal.js")}</script><script>{asset("plugin/notes/notes.js")}</script>
<script>Reveal.initialize({{hash: true, slideNumber: "c/t", width: {WIDTH}, height: {HEIGHT},
  margin: {MARGIN}, defaultTiming: {DEFAULT_TIMING}, plugins: [RevealNotes]}});</script>
</body></html>
"""


# Sizes are in the design's pixels (1280 x 720): shown on a 1280 x 720 screen, reveal.js scales
# them by (1 - MARGIN), so code 26 px shows at 25 px, a figure's 16.7 px text at 16 px.
CODE_PX, TEXT_PX, TABLE_PX, CAPTION_PX = 26, 26, 22, 16
FIGURE_MAX_PX = 430  # a figure's height on a slide; the figures are drawn at most this tall
STYLE = f"""
:root {{ --r-main-font: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif;
        --r-heading-font: var(--r-main-font); --r-main-font-size: {TEXT_PX}px;
        --r-heading-text-transform: none; --r-code-font: "DejaVu Sans Mono", monospace; }}
.reveal h1 {{ font-size: 1.6em; }} .reveal h2 {{ font-size: 1.3em; margin-bottom: 0.4em; }}
.reveal .slides section {{ text-align: left; padding: 0 0.8em; }}
.reveal p {{ margin: 0 0 0.4em 0; }}
.reveal ul, .reveal ol {{ margin: 0 0 0.4em 1.1em; }}
.reveal li {{ margin-bottom: 0.15em; }}
.reveal figure {{ margin: 0.1em 0; text-align: center; }}
.reveal figure img {{ max-height: {FIGURE_MAX_PX}px; max-width: 100%; width: auto; height: auto;
                      margin: 0; }}
.reveal figcaption {{ font-size: {CAPTION_PX}px; color: #555; }}
.reveal table {{ font-size: {TABLE_PX}px; }}
.reveal table th, .reveal table td {{ padding: 0.2em 0.5em; }}
.reveal pre {{ font-size: {CODE_PX}px; width: 100%; margin: 0.3em 0; box-shadow: none;
               background: #f6f6f6; }}
.reveal pre code {{ max-height: 420px; padding: 0.3em 0.4em; line-height: 1.25; }}
.reveal code {{ font-family: var(--r-code-font); }}
.reveal section[data-kind="your-turn"] h2, .reveal section[data-kind="break"] h2 {{
  font-size: 1.7em; color: #1b6f66; }}
"""


# -- a notebook for RISE (jupyterlab-rise): present in JupyterLab, run a cell on stage ---------

def rise_notebook(title: str, slides: list[Slide], figures: dict[str, bytes]):
    """Each slide a Markdown cell (figures as attachments), its live code as code cells, its
    notes a "notes" cell: ``slideshow`` metadata as RISE reads it."""
    cells = []
    for slide in slides:
        parts = LIVE.split(slide.body)  # text, code, text, code, ...
        for i, part in enumerate(parts):
            kind = "slide" if i == 0 else "-"
            if i % 2:
                cell = nbformat.v4.new_code_cell(part.rstrip("\n"))
            elif part.strip() or i == 0:
                cell = _markdown_cell(part.strip(), figures)
            else:
                continue
            cell.metadata["slideshow"] = {"slide_type": kind}
            cells.append(cell)
        notes = nbformat.v4.new_markdown_cell(slide.notes)
        notes.metadata["slideshow"] = {"slide_type": "notes"}
        cells.append(notes)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["title"] = title
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}  # Note: else RISE asks for a kernel
    nb.metadata["rise"] = {"scroll": True, "enable_chalkboard": False, "autolaunch": False}
    return nb


def _markdown_cell(text: str, figures: dict[str, bytes]):
    attachments = {}

    def attach(match):
        name = f"{match.group(2)}.png"
        attachments[name] = {"image/png": base64.b64encode(figures[match.group(2)]).decode()}
        return f"![{match.group(1)}](attachment:{name})"
    cell = nbformat.v4.new_markdown_cell(FIGURE.sub(attach, text))
    if attachments:
        cell.attachments = attachments
    return cell


# -- PDF -----------------------------------------------------------------------------------------

SYSTEM_CHROMIUMS = ("chromium", "chromium-browser", "google-chrome")
INSTALL_CHROMIUM = ("install one: `apt-get install chromium` (Debian), or `pip install playwright "
                    "&& playwright install chromium`")


def find_chromium() -> tuple[str | None, str]:
    """(the Chromium to print with, where it was found), or (None, why there is none): the
    system's on the PATH (Debian's ``chromium``), else Playwright's own (``playwright install
    chromium``). Printing goes through Playwright's Python package either way."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "the Python package playwright is not installed (`pip install playwright`)"
    for name in SYSTEM_CHROMIUMS:
        found = shutil.which(name)
        if found:
            return found, f"{name} on the PATH"
    try:
        with sync_playwright() as p:
            bundled = p.chromium.executable_path
    except Exception as err:  # noqa: BLE001 (Playwright's driver failing to start: said below)
        return None, f"no Chromium on the PATH, and Playwright's driver failed: {err}"
    if bundled and Path(bundled).is_file():
        return bundled, "Playwright's own Chromium"
    return None, (f"no Chromium on the PATH ({', '.join(SYSTEM_CHROMIUMS)}) and none of "
                  f"Playwright's own; {INSTALL_CHROMIUM}")


def pdf(html_file: Path, out: Path, executable: str, timeout_ms: int = 120_000) -> Path:
    """Print the deck from reveal.js's print view in headless Chromium (``executable``, through
    Playwright): one page per slide. Returns ``out``; an error says why no PDF was made."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{html_file.resolve().as_uri()}?print-pdf", timeout=timeout_ms)
            page.wait_for_function("window.Reveal && Reveal.isReady()", timeout=timeout_ms)
            # Note: ready is not laid out: reveal.js builds the print pages after it, one
            # .pdf-page per slide, and again once fonts and images have loaded; printed
            # before that, Chromium 150 wrote one page. So: every page there, and still there.
            pages = ("document.querySelectorAll('.pdf-page').length > 0 && document"
                     ".querySelectorAll('.pdf-page').length >= Reveal.getTotalSlides()")
            page.evaluate("document.fonts.ready.then(() => true)")
            page.wait_for_load_state("networkidle", timeout=timeout_ms)
            for _ in range(2):
                page.wait_for_function(pages, timeout=timeout_ms)
                page.wait_for_timeout(500)
            page.pdf(path=str(out), prefer_css_page_size=True, print_background=True)
        finally:
            browser.close()
    if not (out.is_file() and out.stat().st_size > 0):
        raise OSError(f"Chromium wrote no PDF at {out}")
    return out

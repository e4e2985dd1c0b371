"""The course site (``mkdocs.yml``, ``docs/``): built offline by the README's command, without
executing the labs, in well under a minute of CPU; every page of its navigation is there (the
labs, the guides, the API reference), its search finds "reduce-scatter", and no page loads a
script, a style sheet, a font or an image from another host. The browser test opens every page
in headless Chromium from a server on 127.0.0.1: no request fails, none leaves the machine, the
search answers; a screenshot of each page is kept (``FSDP_MINI_SCREENSHOTS`` or the test's tmp
dir; the home page and a lab are copied to /tmp/docs_*.png).

    python -m pytest tests/test_docs.py
    python -m pytest -m browser tests/test_docs.py -s
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CPU_SECONDS = 60  # the build's own CPU time; its wall time on a busy 2-core machine is more


def _site_command() -> list[str]:
    """The README's build command (the course site's first bash line), without its comment."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The course site.*?```bash\n(.*?)```", readme, re.S).group(1)
    return block.splitlines()[0].split("  #")[0].split()


@dataclass
class Site:
    out: Path
    wall_seconds: float
    cpu_seconds: float
    log: str


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    command = _site_command()
    assert command[:4] == ["python", "-m", "mkdocs", "build"] and command[-2:] == ["-d", "build/site"]
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("FSDP_MINI_DOCS_EXECUTE", None)  # as CI builds it: the labs as stored
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *command[1:-1], str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    print(f"\nsite built in {wall:.1f} s ({cpu:.1f} s of CPU) into {out}")
    return Site(out, wall, cpu, proc.stdout + proc.stderr)


def _nav_sources(nav) -> list[str]:
    """Every page named in mkdocs.yml's nav (a tree of lists and one-key dicts)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [s for value in nav.values() for s in _nav_sources(value)]
    return [s for item in nav for s in _nav_sources(item)]


def _nav() -> list[str]:
    return _nav_sources(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def _page(src: str) -> str:
    """Where a page of the nav lands (use_directory_urls is off: ``a/b.md`` -> ``a/b.html``)."""
    return re.sub(r"\.(md|ipynb)$", ".html", src)


def _hooks():
    spec = importlib.util.spec_from_file_location("fsdp_mini_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_quickly_and_without_a_warning(site):
    assert site.cpu_seconds < CPU_SECONDS, f"{site.cpu_seconds:.0f} s of CPU to build the site"
    warnings = [line for line in site.log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)  # broken links, pages outside the nav, docstrings
    assert "executing" not in site.log  # CI renders the labs as stored


def test_every_page_of_the_nav_is_built(site):
    nav = _nav()
    missing = [src for src in nav if not (site.out / _page(src)).is_file()]
    assert not missing, f"pages of the nav that were not built: {missing}"
    # every notebook of labs/ is a page, and every Markdown file of docs/ is in the nav
    hooks = _hooks()
    notebooks = [f"labs/{p.name}" for p in hooks.notebooks()]
    assert [s for s in nav if s.startswith("labs/") and s.endswith(".ipynb")] == notebooks
    labs = sorted(p.name for p in (ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
    assert set(f"labs/{name}" for name in labs) <= set(notebooks)
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(s for s in nav if s.endswith(".md") and s != "labs/index.md") == pages
    for guide in ("guides/hsdp.md", "guides/multinode.md", "guides/no-sync.md",
                  "guides/fsdp-options.md", "guides/link.md", "guides/mixed-precision.md",
                  "guides/meta-init.md", "guides/checkpoints.md", "guides/planner.md",
                  "guides/watching.md", "inside/design.md", "inside/vs-torch.md",
                  "inside/tests.md", "reference/index.md", "index.md"):
        assert guide in nav, guide
    # the API reference is made from the docstrings
    api = (site.out / "reference" / "index.html").read_text()
    assert 'id="fsdp_mini.parallelize"' in api and "Apply <code>strategy</code>" in api
    # the labs are rendered: lab 05's text and its code
    lab = (site.out / "labs" / "05_fsdp.html").read_text()
    assert "jp-Notebook" in lab and "reduce-scatter" in lab and "labs.lab_config" in lab
    assert (site.out / "assets" / "dashboard.png").is_file()


def test_the_search_index_finds_reduce_scatter(site):
    index = json.loads((site.out / "search" / "search_index.json").read_text())
    found = {doc["location"].split("#")[0] for doc in index["docs"]
             if "reduce-scatter" in doc["text"]}
    for page in ("guides/hsdp.html", "guides/no-sync.html", "labs/05_fsdp.html"):
        assert page in found, f"the search does not find reduce-scatter in {page}: {sorted(found)}"


class _Resources(HTMLParser):
    """What a page makes the browser load: scripts, style sheets, fonts, icons, images, frames,
    and URLs inside inline styles and scripts (``url(...)``, ``@import``, ``import(...)``).
    Links (``<a href>``) are not loads."""

    LOADS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "video": "src",
             "audio": "src", "embed": "src", "object": "data", "input": "src"}
    LINK_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut", "apple-touch-icon",
                 "manifest", "prefetch", "preconnect", "dns-prefetch"}

    def __init__(self):
        super().__init__()
        self.urls, self._inline = [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in self.LOADS and attrs.get(self.LOADS[tag]):
            self.urls.append(attrs[self.LOADS[tag]])
        if tag == "img" and attrs.get("srcset"):
            self.urls += [part.split()[0] for part in attrs["srcset"].split(",")]
        if tag == "link" and set((attrs.get("rel") or "").lower().split()) & self.LINK_RELS:
            self.urls.append(attrs.get("href") or "")
        if attrs.get("style"):
            self.urls += _css_urls(attrs["style"])
        self._inline = tag if tag in ("style", "script") else None

    def handle_endtag(self, tag):
        self._inline = None

    def handle_data(self, data):
        if self._inline == "style":
            self.urls += _css_urls(data)
        elif self._inline == "script":
            self.urls += re.findall(r"""(?:import\s*\(|src\s*=)\s*["'`](https?://[^"'`]+)""", data)


def _css_urls(css: str) -> list[str]:
    return (re.findall(r"""url\(\s*["']?([^"')]+)""", css) +
            re.findall(r"""@import\s+(?:url\()?\s*["']([^"']+)""", css))


def _external(url: str) -> bool:
    return urlparse(url.strip()).scheme in ("http", "https") or url.strip().startswith("//")


def test_no_page_loads_anything_from_another_host(site):
    pages = sorted(site.out.rglob("*.html"))
    assert len(pages) >= len(_nav())
    offending = {}
    for page in pages:
        parser = _Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        if bad := [u for u in parser.urls if _external(u)]:
            offending[str(page.relative_to(site.out))] = bad
    for css in site.out.rglob("*.css"):
        if bad := [u for u in _css_urls(css.read_text(encoding="utf-8")) if _external(u)]:
            offending[str(css.relative_to(site.out))] = bad
    assert not offending, offending
    # what would betray a fetch: web fonts, a CDN, the GitHub API for a repository's stars
    home = (site.out / "index.html").read_text()
    assert "fonts.googleapis" not in home and "fonts.gstatic" not in home
    for page in (site.out / "labs").glob("*.html"):
        text = page.read_text()
        assert "cdnjs.cloudflare.com" not in text and "cdn.jsdelivr.net" not in text, page.name


def test_the_execution_is_chosen_by_name_and_a_wrong_name_is_refused():
    hooks = _hooks()
    assert hooks.to_execute(None) == [] and hooks.to_execute("0") == []
    assert hooks.to_execute("1") == hooks.notebooks()
    assert [p.stem for p in hooks.to_execute("05, 07")] == ["05_fsdp", "07_bigger"]
    from mkdocs.exceptions import PluginError
    with pytest.raises(PluginError, match=r"no notebook starts with 99; the notebooks are: 00_"):
        hooks.to_execute("05,99")


# -- in a real browser ------------------------------------------------------------------------

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site.out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.browser
def test_every_page_opens_in_a_browser_with_nothing_from_another_host(site, served, tmp_path):
    from browser_notebook import CHROMIUM, CHROMIUM_ARGS, requirements
    requirements()
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("FSDP_MINI_SCREENSHOTS") or tmp_path / "screenshots") / "docs"
    shots.mkdir(parents=True, exist_ok=True)
    local, failed, foreign, errors = urlparse(served).netloc, [], [], []
    pages = [_page(src) for src in _nav()]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("request", lambda r: foreign.append(r.url)
                if urlparse(r.url).scheme not in ("data", "blob") and
                urlparse(r.url).netloc != local else None)
        page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: failed.append(f"{r.url}: HTTP {r.status}")
                if r.status >= 400 else None)
        page.on("console", lambda m: errors.append(f"{page.url}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
        for rel in pages:
            page.goto(f"{served}/{rel}", wait_until="networkidle")
            assert page.locator("article h1, .jp-Notebook h1").count() >= 1, rel
            page.screenshot(path=str(shots / (rel.replace("/", "__")[:-5] + ".png")))
        # the search, as a reader uses it: type, and the results list the pages
        page.goto(f"{served}/index.html", wait_until="networkidle")
        page.keyboard.press("/")
        # Note: typed key by key; fill() sets the value without the key events the theme reads
        page.locator("input.md-search__input").press_sequentially("reduce-scatter", delay=20)
        results = page.locator(".md-search-result__item")
        results.first.wait_for(timeout=30_000)
        found = page.locator(".md-search-result__meta").inner_text()
        hits = results.count()
        page.screenshot(path=str(shots / "search_reduce-scatter.png"))
        browser.close()
    for name in ("index", "labs__05_fsdp", "search_reduce-scatter"):
        shutil.copy(shots / f"{name}.png", f"/tmp/docs_{name}.png")
    print(f"\n{len(pages)} pages opened; search: {found!r}; screenshots in {shots} "
          f"(copied to /tmp/docs_index.png, /tmp/docs_labs__05_fsdp.png, "
          f"/tmp/docs_search_reduce-scatter.png)")
    assert not foreign, f"requests to another host: {foreign}"
    assert not failed, f"failed requests: {failed}"
    assert not errors, f"errors in the console: {errors}"
    assert hits >= 3, found

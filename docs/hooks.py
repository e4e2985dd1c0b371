"""MkDocs hooks of the course site (``mkdocs.yml`` names this file).

- The labs stay where learners open them, in ``labs/``: each notebook there, ``labs/README.md``
  (as the Labs section's first page) and the README's figure are added to the site's files.
- ``FSDP_MINI_DOCS_EXECUTE=1`` executes every lab before the site is built (``=05,07``: those
  labs only), the way ``fsdp-mini render-labs`` does: a fresh kernel per lab, in ``labs/``, with
  the reference solutions, at this machine's size (``CI=true``: CI size). The widgets' state is
  not stored, so each widget shows the static figure it leaves behind: the site has no widget
  manager, which would come from a CDN. A lab that fails is shown as stored and the build ends
  in an error naming it. Unset or ``0``, the stored notebooks are rendered as they are (outputs
  stripped: the code and the text), in seconds.
- nbconvert's template adds loaders of MathJax and Mermaid from a CDN to every notebook page;
  the labs have neither formulas in ``$`` nor diagrams, so they are removed: every resource a
  page loads is in the site.
- Sphinx roles in docstrings (``:class:`~fsdp_mini.Ledger```) are shown as code (``Ledger``), and
  reST's ``::`` before a literal block as ``:``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
LABS = ROOT / "labs"
EXECUTE_ENV = "FSDP_MINI_DOCS_EXECUTE"
LAB_NAME = re.compile(r"\d\d_[a-z0-9]+")  # as fsdp_mini.jobs.render_labs: 06_fast, not a copy
OTHER_NOTEBOOKS = ("demo_dashboard", "project_lead", "project_lead.ja")
FIGURE = ROOT / "slides" / "dashboard.png"

log = logging.getLogger("mkdocs.plugins.fsdp_mini")
_executed_dir: str | None = None
_failed: dict[str, str] = {}  # notebook -> the last line of its error


def notebooks() -> list[Path]:
    """The notebooks the site shows: the labs in order, then the demo and the project lead's."""
    labs = sorted(p for p in LABS.glob("[0-9][0-9]_*.ipynb") if LAB_NAME.fullmatch(p.stem))
    return labs + [LABS / f"{name}.ipynb" for name in OTHER_NOTEBOOKS]


def to_execute(value: str | None) -> list[Path]:
    """The notebooks ``FSDP_MINI_DOCS_EXECUTE`` asks for: none, all, or those named by prefix."""
    value = (value or "").strip().lower()
    if value in ("", "0", "false", "no"):
        return []
    if value in ("1", "true", "yes", "all"):
        return notebooks()
    wanted = [w.strip() for w in value.split(",") if w.strip()]
    chosen = [p for p in notebooks() if any(p.stem.startswith(w) for w in wanted)]
    unknown = [w for w in wanted if not any(p.stem.startswith(w) for p in notebooks())]
    if unknown:
        raise PluginError(f"{EXECUTE_ENV}={value}: no notebook starts with {', '.join(unknown)}; "
                          f"the notebooks are: {', '.join(p.stem for p in notebooks())}")
    return chosen


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _execute(paths: list[Path]) -> dict[Path, Path]:
    """Run each notebook; write the executed copy to a temporary folder; return where. A lab
    that fails is shown as stored, and the build ends in an error naming it (on_post_build)."""
    global _executed_dir
    if not paths:
        return {}
    from fsdp_mini.jobs.render_labs import Interrupted, executing

    _executed_dir = tempfile.mkdtemp(prefix="fsdp-mini-docs-")
    (Path(_executed_dir) / "labs").mkdir()
    size = "CI size" if _ci() else "this machine's size"
    log.info(f"executing {len(paths)} notebook(s) at {size} with the reference solutions")
    done, start = {}, time.perf_counter()
    for path in paths:
        try:
            for _, nb, seconds in executing([path], ci=_ci(), widget_state=False):
                done[path] = Path(_executed_dir) / "labs" / path.name
                nbformat.write(nb, done[path])
                log.info(f"executed {path.stem} in {seconds:.0f} s")
        except Interrupted as stop:
            raise PluginError(f"interrupted ({stop.signal_name}) while running {stop.lab}; its "
                              f"kernel and ranks were stopped") from None
        except Exception as err:  # a cell raised: go on, and fail the build at its end
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # nbclient's colours
            _failed[path.stem] = text.splitlines()[-1] if text else type(err).__name__
            log.error(f"{path.stem} failed while executing (its page shows it as stored):\n"
                      f"{text[-3000:]}")
    log.info(f"executed {len(done)} of {len(paths)} notebook(s) in "
             f"{time.perf_counter() - start:.0f} s")
    return done


@event_priority(100)  # before mkdocs-jupyter's on_files, which takes the notebooks as pages
def on_files(files, config):
    executed = _execute(to_execute(os.environ.get(EXECUTE_ENV)))
    for path in notebooks():
        # Note: a File in a folder of its own, not File.generated: mkdocs-jupyter wraps the file
        # and reads its abs_src_path, which a generated file's wrapper does not pass on.
        source = executed.get(path, path)
        files.append(File(f"labs/{path.name}", src_dir=str(source.parent.parent),
                          dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls))
    files.append(File.generated(config, "labs/index.md", abs_src_path=str(LABS / "README.md")))
    files.append(File.generated(config, "assets/dashboard.png", abs_src_path=str(FIGURE)))
    return files


_CDN_LOADERS = [
    # MathJax 2 from cdnjs, and the configuration that calls it
    re.compile(r'<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S),
    # Mermaid from cdnjs, imported when a page holds a diagram
    re.compile(r'<script type="module">\s*document\.addEventListener\("DOMContentLoaded", '
               r'async \(\) => \{\s*const diagrams = .*?</script>', re.S),
]


def on_post_page(output, page, config):
    if page.file.src_uri.endswith(".ipynb"):
        for loader in _CDN_LOADERS:
            output = loader.sub("", output)
    return output


def on_page_content(html, page, config, files):
    """``:class:`~fsdp_mini.Ledger``` in a docstring arrives as ``:class:<code>~fsdp_mini.Ledger
    </code>``: keep the code, drop the role (and, after ``~``, the path)."""
    if page.file.src_uri.startswith("reference/"):
        html = re.sub(r":(?:mod|class|func|meth|attr|data|exc|obj|const):<code>~([\w.]+)</code>",
                      lambda m: f"<code>{m.group(1).rsplit('.', 1)[-1]}</code>", html)
        html = re.sub(r":(?:mod|class|func|meth|attr|data|exc|obj|const):(<code>)", r"\1", html)
        html = html.replace("::</p>", ":</p>")  # reST's "::" before a literal block
    return html


def _clean_up():
    global _executed_dir
    if _executed_dir:
        shutil.rmtree(_executed_dir, ignore_errors=True)
        _executed_dir = None


def on_post_build(config):
    _clean_up()
    if _failed:
        failed = "; ".join(f"{name}: {error}" for name, error in _failed.items())
        _failed.clear()
        raise PluginError(f"the site is written, but these notebooks failed while executing "
                          f"and are shown as stored: {failed}")


def on_build_error(error):
    _clean_up()
    _failed.clear()

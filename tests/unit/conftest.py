"""tests/unit/: single-process tests of one building block each; every item here is marked
``unit`` (``pytest -m unit`` runs them alone, in seconds)."""

from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # Note: this hook sees every item of the session, not only this folder's
    for item in items:
        if UNIT_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.unit)

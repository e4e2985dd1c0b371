"""Shared test settings: small thread counts (ranks oversubscribe 2 cores), tests/ importable."""

import os
import sys
import tempfile

import pytest
import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)  # so ranks can import `workers` by reference

torch.set_num_threads(1)

# Notebooks size their runs from one config cell: in tests they always run small (the CI size).
os.environ.setdefault("CI", "true")
# Checks run outside CI keep no progress file in the repository (tests of it set their own)
os.environ.setdefault("FSDP_MINI_PROGRESS", "0")


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_stay_in_pytests_folder(tmp_path_factory):
    """Ranks, launches that fail on purpose (their logs are kept for the error) and torchrun write
    temporary folders; here they go under pytest's own folder, which pytest rotates, not /tmp."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    yield
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]

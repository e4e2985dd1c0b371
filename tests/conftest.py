"""Shared test settings: small thread counts (ranks oversubscribe 2 cores), tests/ importable."""

import os
import sys

import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)  # so ranks can import `workers` by reference

torch.set_num_threads(1)

# Notebooks size their runs from one config cell: in tests they always run small (the CI size).
os.environ.setdefault("CI", "true")

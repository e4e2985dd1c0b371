"""Helpers for tests/test_launch.py: worker functions in an importable module (pickled by reference)."""

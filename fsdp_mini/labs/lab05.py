"""Checkers and helpers of lab 05 (being written)."""

"""Checkers and helpers of lab 04 (being written)."""

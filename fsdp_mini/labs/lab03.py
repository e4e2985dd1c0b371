"""Checkers and helpers of lab 03 (being written)."""

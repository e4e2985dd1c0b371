"""Checkers and helpers of lab 01 (being written)."""

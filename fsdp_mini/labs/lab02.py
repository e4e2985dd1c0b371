"""Checkers and helpers of lab 02 (being written)."""

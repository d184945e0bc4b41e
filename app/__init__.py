"""Lemon Desk: run large language models locally."""

__version__ = "0.1.0"

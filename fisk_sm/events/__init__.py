"""Typed events and the adapters that deliver them (structlog, JSON Lines)."""

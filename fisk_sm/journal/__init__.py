"""Durable runs: records, the journal protocol, fold, the file store and the state dir."""

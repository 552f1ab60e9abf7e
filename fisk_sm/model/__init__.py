"""The model adapter: one Messages API call under a deadline, every reply validated."""

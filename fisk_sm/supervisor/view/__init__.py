"""The supervisor's read model: each run's row (`tracked`, `rows`), the listings and lookups
(`book`), and the event hub (`hub`). It reads journals and drives nothing: no module here
imports the host, the API or the cluster (tests/test_layers.py).
"""

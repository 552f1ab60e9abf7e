"""The supervisor's read model: each run's row (`tracked`, `rows`, `entry`: the registry's
record of it), the listings and lookups (`book`: the `RunBook` a host keeps), the event hub
(`hub`), and the rows of other cluster members' runs (`cluster_rows`). It reads journals and
drives nothing: no module here imports the host or the API (tests/test_layers.py).
"""

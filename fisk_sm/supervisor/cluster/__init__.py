"""The NATS parts a cluster member's host uses: the work queue of submissions (`workqueue`) and
the runs' leases (`lease`). They import no host, read model or API (tests/test_layers.py)."""

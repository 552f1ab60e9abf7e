"""The NATS parts a cluster member's host uses: the work queue of submissions (`workqueue`),
the runs' leases (`lease`) and the approvals bucket's mirror (`approvals`). They import no host,
read model or API (tests/test_layers.py)."""

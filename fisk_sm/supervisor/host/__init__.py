"""The host: drives runs on the loop (`host.Host`: `slots`, `drive`, the approval `desk`, the
`registry` through an `ownership`) and implements the control API's `HostControl`
(`fisk_sm.supervisor.interface`): `control.LocalControl` over one in-process host; a NATS
cluster member is a plain `Host` given parts (`cluster_setup`): a `leased.LeaseOwnership`, an
`intake.QueueIntake`, a book with the other members' rows, the cluster's approvals mirror."""

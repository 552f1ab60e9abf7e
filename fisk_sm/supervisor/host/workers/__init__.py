"""`fisk-sm supervise --workers N`: N worker processes, each driving its share of the runs,
behind one front that holds the state directory, the registry and the event stream.

The front (`front.Front`, a `HostControl`) places each run on one worker and routes every call
about it there, over one socketpair per worker (`channel.Channel`, the frames of `frames`). A
worker (`child`, started by `pool.WorkerPool`) is one `Supervisor` whose registry writes go back
to the front (the one writer of runs.jsonl) and whose events go up only while the front says
someone watches them. A worker that dies has its runs resumed on the others by the crash rules:
the session's lock is the ownership lease, its journal the truth.

Nothing outside this package imports it but the CLI, lazily.
"""

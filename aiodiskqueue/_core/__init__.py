"""The machinery behind :class:`~aiodiskqueue.DiskQueue`: options, the ioLoop engine, the
segment store and open-time recovery, the I/O thread and the native write lane."""

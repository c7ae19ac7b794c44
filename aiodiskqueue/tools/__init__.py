"""Offline, synchronous tools on queue directories: inspect, verify, repair, dump, stats,
and the ``aiodiskqueue`` command line."""

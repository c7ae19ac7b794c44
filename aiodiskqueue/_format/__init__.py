"""The on-disk format: go-diskqueue's segment and meta files, the lock file, and nsqd's
message layout. Synchronous rules only, no asyncio; every other package builds on these."""

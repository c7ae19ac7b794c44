"""Queue groups: many producer processes into one logical queue, consumers that divide
its shards. On-disk names: :mod:`.layout`."""

"""The controller: topics and their placement, partition states, replication (heartbeats,
AlterPartition), elections, and the pushes and creation calls that carry them to the nodes."""

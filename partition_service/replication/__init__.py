"""Replicated partitions: the leader's view of its followers (ISR, high watermark), the
follower's protocol (truncate by leader epoch, copy frames), and the node's side of the
controller (heartbeats, roles). ``docs/design.md`` section 7 is the contract."""

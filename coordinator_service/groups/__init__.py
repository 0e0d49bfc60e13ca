"""The group coordinator: KIP-848 consumer group membership, assignment and fencing."""

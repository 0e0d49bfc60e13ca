"""What every role of a coordinator instance shares: the leases that divide the work, the
instance registry, and the link to the storage nodes."""

"""Authentication and authorisation shared by the coordinator and the storage nodes."""

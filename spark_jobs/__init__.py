"""PySpark jobs that use the SDK for exactly-once consume-transform-produce."""

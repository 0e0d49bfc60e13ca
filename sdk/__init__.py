"""EOS Python SDK: transactional and idempotent producers, consumer and admin over HTTP."""

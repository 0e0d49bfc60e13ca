"""The EOS storage node: durable partition logs with idempotent and transactional writes."""

"""The EOS storage node: durable partition logs with idempotent and transactional writes."""

# Before any route of this service is defined: path parameters read an escaped "/" back
# (eos_server.path_segments), whichever of its modules is imported first.
import eos_server  # noqa: F401

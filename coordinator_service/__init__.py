"""The transaction coordinator and metadata authority of an EOS cluster."""

# Before any route of this service is defined: path parameters read an escaped "/" back
# (eos_server.path_segments), whichever of its modules is imported first.
import eos_server  # noqa: F401

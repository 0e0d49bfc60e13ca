"""The wire contract of EOS (docs/design.md): models, error catalogue, ACL model, states,
partition placement and the path and address rules every party follows.

The single home of the contract: the SDK, both services and the Spark jobs import from
here. It depends on pydantic and the standard library only, so a client never loads
server code and a server never loads the client.
"""

from eos_protocol.errors import CATALOGUE, EosError, ErrorClass, error_for
from eos_protocol.states import TransactionState

__all__ = ["CATALOGUE", "EosError", "ErrorClass", "TransactionState", "error_for"]

"""The wire contract: models, error catalogue and transaction states (docs/design.md).

The single home of the contract: both services and the SDK import from here.
"""

from sdk.protocol import common, coordinator, errors, node, states
from sdk.protocol.errors import CATALOGUE, EosError, ErrorClass, error_for
from sdk.protocol.states import TransactionState, TxnEvent, decide

__all__ = [
    "CATALOGUE",
    "EosError",
    "ErrorClass",
    "TransactionState",
    "TxnEvent",
    "common",
    "coordinator",
    "decide",
    "error_for",
    "errors",
    "node",
    "states",
]

"""The service-side kit both services share: the error envelope, request-shape
middleware, the fast path of the hot calls, the internal token and HTTP client, flags
generated from settings, logging and the process runner.

Nothing in the SDK imports this package, so a client install needs none of FastAPI,
Starlette or uvicorn.
"""

# Before any service defines a route: ``{name}`` path parameters read ``%2F`` back as ``/``
# (path_segments.py), so an id holding ``/`` is one segment, as the contract says.
from eos_server.path_segments import install_convertor as _install_convertor

_install_convertor()

"""The service-side kit both services share: the error envelope, request-shape
middleware, the fast path of the hot calls, the internal token and HTTP client, flags
generated from settings, logging and the process runner.

Nothing in the SDK imports this package, so a client install needs none of FastAPI,
Starlette or uvicorn.
"""

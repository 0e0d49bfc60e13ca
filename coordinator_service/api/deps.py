"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from coordinator_service.services import Services
from eos_protocol.common import MAX_ID_LENGTH


async def get_services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a plain ``def`` dependency on a worker thread, a
    thread hop per request for a single attribute read."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]
TransactionalIdPath = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="The transactional id.")
]

"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from coordinator_service.services import Services
from sdk.protocol.common import MAX_ID_LENGTH


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]
TransactionalIdPath = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, description="The transactional id.")
]

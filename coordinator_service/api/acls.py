"""ACL administration (Kafka's CreateAcls, DescribeAcls, DeleteAcls).

Listing needs describe on the cluster, changes need alter on it; the super users of the
coordinator's settings hold both without any binding, which is how the first rules get in.
Changes are durable before they are answered and take effect at this instance at once, at
the other instances and on the storage nodes within ``acl_refresh_ms``.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, status

from coordinator_service.api.access import Caller
from coordinator_service.api.deps import ServicesDep
from eos_protocol.acl import (
    AclFilter,
    AclsResponse,
    CreateAclsRequest,
    DeleteAclsRequest,
    DeleteAclsResponse,
    Operation,
    Principal,
    ResourceType,
)
from eos_server.envelope import error_responses

router = APIRouter(prefix="/v1/acls", tags=["acls"])

_AUTH = ("UNAUTHENTICATED", "CLUSTER_AUTHORIZATION_FAILED")


@router.get(
    "",
    operation_id="listAcls",
    summary="List ACL bindings (DescribeAcls)",
    description="Every binding matching the given fields; needs describe on the cluster.",
    response_model=AclsResponse,
    responses=error_responses(*_AUTH),
)
async def list_acls(
    services: ServicesDep,
    caller: Caller,
    principal: Principal | None = Query(default=None),
    resource_type: ResourceType | None = Query(default=None),
    resource_name: str | None = Query(default=None, min_length=1, max_length=249),
) -> AclsResponse:
    await services.access.require_cluster(caller, Operation.DESCRIBE)
    await services.acl_rules.reload()
    wanted = AclFilter(
        principal=principal, resource_type=resource_type, resource_name=resource_name
    )
    return AclsResponse(acls=[b for b in services.access.authorizer.bindings if wanted.matches(b)])


@router.post(
    "",
    operation_id="createAcls",
    summary="Create ACL bindings (CreateAcls)",
    description="Creating a binding that exists is harmless. Needs alter on the cluster.",
    status_code=status.HTTP_201_CREATED,
    response_model=AclsResponse,
    responses=error_responses("INVALID_REQUEST", *_AUTH),
)
async def create_acls(
    body: CreateAclsRequest, services: ServicesDep, caller: Caller
) -> AclsResponse:
    await services.access.require_cluster(caller, Operation.ALTER)
    await services.acl_rules.create(body.acls, services.clock.now_ms())
    return AclsResponse(acls=body.acls)


@router.post(
    "/delete",
    operation_id="deleteAcls",
    summary="Delete ACL bindings (DeleteAcls)",
    description="Deletes every binding some filter matches and answers them. Needs alter on "
    "the cluster.",
    response_model=DeleteAclsResponse,
    responses=error_responses("INVALID_REQUEST", *_AUTH),
)
async def delete_acls(
    body: DeleteAclsRequest, services: ServicesDep, caller: Caller
) -> DeleteAclsResponse:
    await services.access.require_cluster(caller, Operation.ALTER)
    return DeleteAclsResponse(deleted=await services.acl_rules.delete(body.filters))

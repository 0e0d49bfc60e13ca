# Generated from sdk/aio/admin.py by sdk/_unasync.py: edit that file, not this one.
"""``AdminClient``: topics, cluster metadata, transactions, consumer groups and ACLs
(blocking twin).

Cluster-wide questions go to the coordinator named by ``bootstrap_url`` (any instance
answers them from the shared store); ``describe_producers`` asks the partition's storage
node; deleting a group or resetting its offsets goes to the group's coordinator, the one
instance that may write it. Answers are the wire models of ``eos_protocol``, so they are
typed and validated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpx

from eos_protocol.acl import (
    AclBinding,
    AclFilter,
    AclsResponse,
    CreateAclsRequest,
    DeleteAclsRequest,
    DeleteAclsResponse,
    ResourceType,
)
from eos_protocol.common import read_answer
from eos_protocol.coordinator import (
    AlterTopicConfigRequest,
    DeleteTopicResponse,
    FindCoordinatorResponse,
    MetadataResponse,
    TopicInfo,
    TransactionDescription,
    TransactionListing,
)
from eos_protocol.errors import (
    GroupIdNotFoundError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from eos_protocol.groups import (
    GroupDescription,
    GroupList,
    GroupListing,
    ResetOffset,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
)
from eos_protocol.hanging import (
    AbortHangingRequest,
    AbortHangingResponse,
    HangingTransactionsResponse,
)
from eos_protocol.node import PartitionOffsets, ProducerDescription
from eos_protocol.paths import segment
from eos_protocol.states import TransactionState
from eos_protocol.versions import PROTOCOL_0_3_0, PROTOCOL_TOPIC_DELETION, ClusterFeatures
from sdk._config import USE_DEFAULT, RetryConfig, TimeoutArg, resolve_timeout
from sdk._metadata import (
    Bootstrap,
    MetadataCache,
    find_coordinator_params,
    group_path,
    partition_path,
    topic_path,
)
from sdk._transport import MEMBERS_PARAMS, MEMBERS_PATH, UNKNOWN_OUTCOME, Req, SyncTransport
from sdk._types import TopicPartition, as_topic_partition
from sdk._versions import require_protocol

_DEFAULT_TIMEOUT_MS = 30_000
#: Failures that prove a request never reached the server (no connection was made).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class AdminClient:
    """Administration of an EOS cluster.

    Example::

        with AdminClient("http://127.0.0.1:8080") as admin:
            admin.create_topic("orders", partitions=3, exist_ok=True)
            for txn in admin.list_transactions(min_duration_ms=60_000):
                admin.abort_transaction(txn.transactional_id)
    """

    def __init__(
        self,
        bootstrap_url: Bootstrap,
        *,
        retry: RetryConfig | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._metadata = MetadataCache(bootstrap_url)
        self._http = SyncTransport(
            retry or RetryConfig(), transport=transport, headers=headers or {}, token=token,
            ca_file=ca_file,
        )
        self._http.on_unreachable = self._metadata.unreachable

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _bootstrap(self) -> str:
        return self._http.bootstrap(self._metadata)

    def _get(
        self, req: Req, path: str, timeout: TimeoutArg, params: dict[str, Any] | None = None
    ) -> Any:
        return self._http.call(
            req,
            "GET",
            path,
            base=self._bootstrap,
            params=params,
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )

    # --- topics and cluster --------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool = False,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> TopicInfo:
        """Create a topic; with ``exist_ok`` an existing one is described instead.

        ``replication_factor`` (default: the coordinator's) copies of each partition on
        distinct nodes; ``min_insync_replicas`` (default min(2, replication_factor)) of
        them must be in sync for an acks=all produce. ``retention_ms``/``retention_bytes``
        (default: the coordinator's; -1 unlimited) bound how long and how much each
        partition keeps. Options left at their defaults are not sent, so a coordinator
        from before replication still takes the request.
        """
        request: dict[str, Any] = {"name": name, "partitions": partitions}
        if replication_factor is not None:
            request["replication_factor"] = replication_factor
        if min_insync_replicas is not None:
            request["min_insync_replicas"] = min_insync_replicas
        if unclean_leader_election:
            request["unclean_leader_election"] = True
        if retention_ms is not None:
            request["retention_ms"] = retention_ms
        if retention_bytes is not None:
            request["retention_bytes"] = retention_bytes
        options = sorted(set(request) - {"name", "partitions"})
        if options:  # the releases before 0.3.0 refuse every one of them
            require_protocol(
                self._features(timeout), PROTOCOL_0_3_0,
                f"create_topic with {', '.join(options)}",
                "leave the options out to take the cluster's defaults",
            )  # fmt: skip
        try:
            body = self._http.call(
                Req.CREATE_TOPIC,
                "POST",
                "/v1/topics",
                base=self._bootstrap,
                json=request,
                timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
            )
        except TopicAlreadyExistsError:
            if not exist_ok:
                raise
            return self.describe_topic(name, timeout=timeout)
        return read_answer(TopicInfo, body)

    def alter_topic(
        self,
        name: str,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> TopicInfo:
        """Change a topic's retention (-1: unlimited); what is not given is kept. Needs
        alter on the topic; the storage nodes apply it within a heartbeat."""
        require_protocol(self._features(timeout), PROTOCOL_0_3_0, "alter_topic")
        request = AlterTopicConfigRequest(
            retention_ms=retention_ms, retention_bytes=retention_bytes
        ).model_dump(exclude_none=True)
        body = self._http.call(
            Req.ALTER_TOPIC,
            "PATCH",
            topic_path(name),
            base=self._bootstrap,
            json=request,
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )
        return read_answer(TopicInfo, body)

    def delete_topic(
        self, name: str, *, missing_ok: bool = False, timeout: TimeoutArg = USE_DEFAULT
    ) -> DeleteTopicResponse | None:
        """Delete a topic (needs delete on it). It is gone from the metadata when this
        returns; the storage nodes remove its replicas in the background, and the name
        can be created again once they have (``pending_nodes`` of the answer; a create
        before that answers TOPIC_ALREADY_EXISTS). With ``missing_ok`` a topic that does
        not exist is no error (None)."""
        require_protocol(self._features(timeout), PROTOCOL_TOPIC_DELETION, "delete_topic")
        try:
            body = self._http.call(
                Req.DELETE_TOPIC,
                "DELETE",
                topic_path(name),
                base=self._bootstrap,
                timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
            )
        except UnknownTopicOrPartitionError:
            if not missing_ok:
                raise
            return None
        finally:
            self._metadata.invalidate_topic(name)
        return read_answer(DeleteTopicResponse, body)

    def create_topics(
        self, topics: dict[str, int], *, exist_ok: bool = False, timeout: TimeoutArg = USE_DEFAULT
    ) -> list[TopicInfo]:
        """Create several topics (name -> partitions), one request each."""
        return [
            self.create_topic(name, count, exist_ok=exist_ok, timeout=timeout)
            for name, count in topics.items()
        ]

    def describe_topic(self, name: str, *, timeout: TimeoutArg = USE_DEFAULT) -> TopicInfo:
        return read_answer(TopicInfo, self._get(Req.TOPIC, topic_path(name), timeout))

    def describe_cluster(self, *, timeout: TimeoutArg = USE_DEFAULT) -> MetadataResponse:
        """The cluster id, the storage nodes, every topic with its partitions' leaders, and
        the cluster's ``features`` (the previous release's when it names none)."""
        body = self._get(Req.METADATA, "/v1/metadata", timeout)
        self._metadata.update_metadata(body)
        return read_answer(MetadataResponse, body)

    def find_coordinator(
        self, key: str, key_type: str = "transaction", *, timeout: TimeoutArg = USE_DEFAULT
    ) -> FindCoordinatorResponse:
        """Who serves a transactional id (a coordinator) or a group (a storage node)."""
        body = self._get(
            Req.FIND_COORDINATOR,
            "/v1/coordinators",
            timeout,
            params=find_coordinator_params(key, key_type),
        )
        return read_answer(FindCoordinatorResponse, body)

    def list_offsets(
        self, partition: TopicPartition | tuple[str, int], *, timeout: TimeoutArg = USE_DEFAULT
    ) -> PartitionOffsets:
        """Log start, high watermark and last stable offset of one partition. A partition
        with no live leader for the moment (a node restarting, an election under way) is
        looked up again within ``timeout``, as Kafka's admin client does."""
        tp = as_topic_partition(partition)
        body = self._http.call(
            Req.LIST_OFFSETS,
            "GET",
            partition_path(tp, "offsets"),
            base=lambda: self._leader(tp, timeout),
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
            invalidate=lambda _exc: self._metadata.invalidate_topic(tp.topic),
        )
        return read_answer(PartitionOffsets, body)

    # --- transactions (KIP-664) ----------------------------------------------------------

    def list_transactions(
        self,
        state: TransactionState | str | None = None,
        min_duration_ms: int | None = None,
        *,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> list[TransactionListing]:
        """Transactional ids, optionally only those in ``state`` or open for at least
        ``min_duration_ms`` (the hanging ones)."""
        params: dict[str, Any] = {}
        if state is not None:
            params["state"] = str(TransactionState(state).value)
        if min_duration_ms is not None:
            params["min_duration_ms"] = min_duration_ms
        body = self._get(Req.LIST_TRANSACTIONS, "/v1/transactions", timeout, params)
        return [read_answer(TransactionListing, t) for t in body["transactions"]]

    def describe_transaction(
        self, transactional_id: str, *, timeout: TimeoutArg = USE_DEFAULT
    ) -> TransactionDescription:
        path = f"/v1/transactions/{segment(transactional_id)}"
        body = self._get(Req.DESCRIBE_TRANSACTION, path, timeout)
        return read_answer(TransactionDescription, body)

    def describe_producers(
        self, partition: TopicPartition | tuple[str, int], *, timeout: TimeoutArg = USE_DEFAULT
    ) -> list[ProducerDescription]:
        """Producers with state on one partition, with their open transaction's first
        offset (what holds the last stable offset back)."""
        tp = as_topic_partition(partition)
        url = self._leader(tp, timeout)
        body = self._http.call(
            Req.DESCRIBE_PRODUCERS,
            "GET",
            partition_path(tp, "producers"),
            base=lambda: self._const(url),
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )
        return [read_answer(ProducerDescription, p) for p in body["producers"]]

    def abort_transaction(
        self, transactional_id: str, *, timeout: TimeoutArg = USE_DEFAULT
    ) -> TransactionState:
        """Abort a hanging transaction and fence its producer; returns the new state."""
        path = f"/v1/admin/transactions/{segment(transactional_id)}/abort"

        def owner() -> str:
            return self._coordinator(transactional_id, timeout)

        body = self._http.call(
            Req.FORCE_ABORT,
            "POST",
            path,
            base=owner,
            json={},
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
            invalidate=self._metadata.invalidate_txn_coordinator,
        )
        return TransactionState(body["state"])

    def list_hanging_transactions(
        self, *, timeout: TimeoutArg = USE_DEFAULT
    ) -> HangingTransactionsResponse:
        """Transactions open on a partition that the coordinators cannot end (KIP-664's
        find-hanging), from a fresh look at every storage node; needs describe on the
        cluster."""
        require_protocol(
            self._features(timeout), PROTOCOL_0_3_0, "list_hanging_transactions"
        )
        body = self._get(Req.LIST_TRANSACTIONS, "/v1/admin/hanging-transactions", timeout)
        return read_answer(HangingTransactionsResponse, body)

    def abort_hanging_transaction(
        self,
        partition: TopicPartition | tuple[str, int],
        producer_id: int,
        producer_epoch: int,
        *,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> AbortHangingResponse:
        """Abort one hanging transaction on one partition: an abort marker with the bumped
        epoch on its leader (KIP-664). Refused (``InvalidTxnStateError``) for committed
        data and for transactions the coordinator holds; ``NotFoundError`` when none is
        open (a retry after a lost answer finds it aborted already). Needs alter on the
        cluster."""
        require_protocol(
            self._features(timeout), PROTOCOL_0_3_0, "abort_hanging_transaction"
        )
        tp = as_topic_partition(partition)
        request = AbortHangingRequest(
            topic=tp.topic, partition=tp.partition, producer_id=producer_id,
            producer_epoch=producer_epoch,
        )  # fmt: skip
        body = self._http.call(
            Req.FORCE_ABORT,
            "POST",
            "/v1/admin/hanging-transactions/abort",
            base=self._bootstrap,
            json=request.model_dump(mode="json"),
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )
        return read_answer(AbortHangingResponse, body)

    # --- consumer groups -----------------------------------------------------------------

    def list_groups(self, *, timeout: TimeoutArg = USE_DEFAULT) -> list[GroupListing]:
        """Every consumer group on record with its state, member count and epoch
        (ListGroups); only the groups the caller may describe."""
        body = self._get(Req.LIST_GROUPS, "/v1/groups", timeout)
        return read_answer(GroupList, body).groups

    def describe_group(
        self, group_id: str, *, lag: bool = True, timeout: TimeoutArg = USE_DEFAULT
    ) -> GroupDescription:
        """Members, epochs and assignments of one group (DescribeGroups); with ``lag``,
        each subscribed partition's committed offset against its last stable offset.
        ``GroupIdNotFoundError`` when the group is not on record. Lag the nodes could not
        give is left out with the reason in ``lag_error``: the rest still stands."""
        params = {"lag": "true" if lag else "false"}
        body = self._get(Req.DESCRIBE_GROUP, _group_root(group_id), timeout, params)
        return read_answer(GroupDescription, body)

    def delete_group(self, group_id: str, *, timeout: TimeoutArg = USE_DEFAULT) -> None:
        """Delete an empty group's state (DeleteGroups); its committed offsets stay
        (``reset_group_offsets`` moves them). ``NonEmptyGroupError`` while it has members,
        ``GroupIdNotFoundError`` when it is not on record. A retry after a lost answer
        finds the group gone: that counts as deleted, so the error is raised only when no
        attempt may have reached the coordinator before."""
        lost: list[BaseException] = []
        try:
            self._group_call(
                Req.DELETE_GROUP, "DELETE", _group_root(group_id), group_id, timeout,
                on_retry=lost.append,
            )  # fmt: skip
        except GroupIdNotFoundError:
            if not any(isinstance(e, UNKNOWN_OUTCOME) and not isinstance(e, _NOT_SENT)
                       for e in lost):  # fmt: skip
                raise

    def reset_group_offsets(
        self,
        group_id: str,
        topics: str | Iterable[str],
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_timestamp_ms: int | None = None,
        to_offset: int | None = None,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> list[ResetOffset]:
        """Move an empty group's committed offsets on every partition of ``topics`` (one
        name or several) to exactly one target: the log start, the last stable offset,
        the first committed record at or after ``to_timestamp_ms``, or ``to_offset``
        (clamped to what each partition holds). Returns the offsets written.
        ``NonEmptyGroupError`` while the group has members: a member would go on from
        its own position and commit over the reset. ``ValueError`` for no target or
        several, before anything is sent."""
        names = [topics] if isinstance(topics, str) else list(topics)
        targets = [to_earliest, to_latest, to_timestamp_ms is not None, to_offset is not None]
        if sum(targets) != 1:
            raise ValueError(
                "name exactly one of to_earliest, to_latest, to_timestamp_ms, to_offset"
            )
        request = ResetOffsetsRequest(
            topics=names, to_earliest=to_earliest, to_latest=to_latest,
            to_timestamp_ms=to_timestamp_ms, to_offset=to_offset,
        )  # fmt: skip
        body = self._group_call(
            Req.RESET_GROUP_OFFSETS, "POST", group_path(group_id, "offsets/reset"), group_id,
            timeout, json=request.model_dump(mode="json", exclude_defaults=True),
        )  # fmt: skip
        return read_answer(ResetOffsetsResponse, body).offsets

    def _group_call(
        self,
        req: Req,
        method: str,
        path: str,
        group_id: str,
        timeout: TimeoutArg,
        *,
        json: Any = None,
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> Any:
        """A request only the group's coordinator answers, routed as a consumer routes
        its heartbeats: to the coordinator the metadata cache holds for the group (found
        first if none), to the owner a NOT_COORDINATOR names, found again after a lost
        answer. ``on_retry`` sees each such failure before the next attempt."""

        def invalidate(exc: BaseException) -> None:
            if on_retry is not None:
                on_retry(exc)
            self._metadata.invalidate_group_coordinator(group_id, exc)

        def owner() -> str:
            return self._group_coordinator(group_id, timeout)

        return self._http.call(
            req, method, path, base=owner, json=json, invalidate=invalidate,
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )  # fmt: skip

    # --- access control lists --------------------------------------------------------------

    def list_acls(
        self,
        *,
        principal: str | None = None,
        resource_type: ResourceType | str | None = None,
        resource_name: str | None = None,
        timeout: TimeoutArg = USE_DEFAULT,
    ) -> list[AclBinding]:
        """The ACL bindings matching the given fields (DescribeAcls); needs describe on the
        cluster."""
        params = {
            name: str(value)
            for name, value in (
                ("principal", principal),
                ("resource_type", resource_type),
                ("resource_name", resource_name),
            )
            if value is not None
        }
        body = self._get(Req.LIST_ACLS, "/v1/acls", timeout, params)
        return read_answer(AclsResponse, body).acls

    def create_acls(
        self, acls: list[AclBinding], *, timeout: TimeoutArg = USE_DEFAULT
    ) -> None:
        """Add ACL bindings (CreateAcls); existing ones are left as they are. Needs alter on
        the cluster."""
        self._http.call(
            Req.CREATE_ACLS,
            "POST",
            "/v1/acls",
            base=self._bootstrap,
            json=CreateAclsRequest(acls=acls).model_dump(mode="json"),
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )

    def delete_acls(
        self, filters: list[AclFilter], *, timeout: TimeoutArg = USE_DEFAULT
    ) -> list[AclBinding]:
        """Delete every binding a filter matches (DeleteAcls); returns those deleted."""
        body = self._http.call(
            Req.DELETE_ACLS,
            "POST",
            "/v1/acls/delete",
            base=self._bootstrap,
            json=DeleteAclsRequest(filters=filters).model_dump(mode="json", exclude_none=True),
            timeout_s=resolve_timeout(timeout, _DEFAULT_TIMEOUT_MS),
        )
        return read_answer(DeleteAclsResponse, body).deleted

    # --- lookups -------------------------------------------------------------------------

    def _const(self, url: str) -> str:
        return url

    def _leader(self, tp: TopicPartition, timeout: TimeoutArg) -> str:
        url = self._metadata.leader(tp)
        if url is None:
            self._metadata.update_topic(
                (self.describe_topic(tp.topic, timeout=timeout)).model_dump()
            )
            url = self._metadata.leader(tp)
            assert url is not None
        return url

    def _features(self, timeout: TimeoutArg) -> ClusterFeatures:
        """What the cluster understands: learned with the live coordinators at the first
        request (and refreshed with them); asked for here only if that learning failed."""
        self._bootstrap()
        if self._metadata.features is None:
            body = self._get(Req.METADATA, MEMBERS_PATH, timeout, dict(MEMBERS_PARAMS))
            self._metadata.update_metadata(body)
        features = self._metadata.features
        assert features is not None
        return features

    def _coordinator(self, transactional_id: str, timeout: TimeoutArg) -> str:
        if self._metadata.txn_coordinator is None:
            found = self.find_coordinator(transactional_id, timeout=timeout)
            self._metadata.txn_coordinator = found.url.rstrip("/")
        return self._metadata.txn_coordinator

    def _group_coordinator(self, group_id: str, timeout: TimeoutArg) -> str:
        url = self._metadata.group_coordinator(group_id)
        if url is None:
            found = self.find_coordinator(group_id, "consumer_group", timeout=timeout)
            self._metadata.set_group_coordinator(group_id, found.url)
            url = found.url.rstrip("/")
        return url


def _group_root(group_id: str) -> str:
    return f"/v1/groups/{segment(group_id)}"

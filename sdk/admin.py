# Generated from sdk/aio/admin.py by sdk/_unasync.py: edit that file, not this one.
"""``AdminClient``: topics, cluster metadata, transactions and ACLs (blocking twin).

Cluster-wide questions go to the coordinator named by ``bootstrap_url`` (any instance
answers them from the shared store); ``describe_producers`` asks the partition's storage
node. Answers are the wire models of ``eos_protocol``, so they are typed and validated.
"""

from __future__ import annotations

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
    FindCoordinatorResponse,
    MetadataResponse,
    TopicInfo,
    TransactionDescription,
    TransactionListing,
)
from eos_protocol.errors import TopicAlreadyExistsError
from eos_protocol.hanging import (
    AbortHangingRequest,
    AbortHangingResponse,
    HangingTransactionsResponse,
)
from eos_protocol.node import PartitionOffsets, ProducerDescription
from eos_protocol.paths import segment
from eos_protocol.states import TransactionState
from eos_protocol.versions import PROTOCOL_0_3_0, ClusterFeatures
from sdk._config import USE_DEFAULT, RetryConfig, TimeoutArg, resolve_timeout
from sdk._metadata import (
    Bootstrap,
    MetadataCache,
    find_coordinator_params,
    partition_path,
    topic_path,
)
from sdk._transport import MEMBERS_PARAMS, MEMBERS_PATH, Req, SyncTransport
from sdk._types import TopicPartition, as_topic_partition
from sdk._versions import require_protocol

_DEFAULT_TIMEOUT_MS = 30_000


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

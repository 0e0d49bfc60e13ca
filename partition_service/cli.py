"""``eos node``: run a storage node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eos_server.process import serve, settings_or_exit
from partition_service.settings import NodeSettings


def run_node(settings: NodeSettings) -> None:
    from partition_service.app import create_app

    serve(
        "node",
        lambda: create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_format=settings.log_format,
        graceful_shutdown_s=10,
        tls_cert=str(settings.tls_cert) if settings.tls_cert else None,
        tls_key=str(settings.tls_key) if settings.tls_key else None,
    )


def register(app: typer.Typer) -> None:
    @app.command("node")
    def node(
        node_id: Annotated[int, typer.Option(envvar="EOS_NODE_ID", help="Node id.")] = 1,
        host: Annotated[str, typer.Option(envvar="EOS_HOST")] = "127.0.0.1",
        port: Annotated[int, typer.Option(envvar="EOS_PORT")] = 9091,
        data_dir: Annotated[Path, typer.Option(envvar="EOS_DATA_DIR")] = Path("./data/node-1"),
        internal_token: Annotated[
            str | None, typer.Option(envvar="EOS_INTERNAL_TOKEN", help="Coordinators' token.")
        ] = None,
        coordinator_url: Annotated[
            str | None,
            typer.Option(
                envvar="EOS_COORDINATOR_URL",
                help="Coordinators, comma-separated; the node falls over between them.",
            ),
        ] = None,
        learn_coordinators: Annotated[
            bool,
            typer.Option(
                "--learn-coordinators/--no-learn-coordinators",
                envvar="EOS_LEARN_COORDINATORS",
                help="Also ask the live coordinators the cluster names.",
            ),
        ] = True,
        coordinator_timeout_ms: Annotated[
            int,
            typer.Option(
                envvar="EOS_COORDINATOR_TIMEOUT_MS",
                help="How long a coordinator may take before the next one is asked.",
            ),
        ] = 2_000,
        txn_verification: Annotated[
            str, typer.Option(envvar="EOS_TXN_VERIFICATION", help="coordinator | off")
        ] = "coordinator",
        fsync: Annotated[bool, typer.Option("--fsync/--no-fsync", envvar="EOS_FSYNC")] = True,
        segment_bytes: Annotated[int, typer.Option(envvar="EOS_SEGMENT_BYTES")] = 64 << 20,
        index_interval_bytes: Annotated[
            int, typer.Option(envvar="EOS_INDEX_INTERVAL_BYTES")
        ] = 4096,
        checkpoint_interval_ms: Annotated[
            int, typer.Option(envvar="EOS_CHECKPOINT_INTERVAL_MS")
        ] = 5000,
        producer_expiration_ms: Annotated[
            int, typer.Option(envvar="EOS_PRODUCER_EXPIRATION_MS")
        ] = 86_400_000,
        max_record_bytes: Annotated[int, typer.Option(envvar="EOS_MAX_RECORD_BYTES")] = 1 << 20,
        max_request_bytes: Annotated[int, typer.Option(envvar="EOS_MAX_REQUEST_BYTES")] = 64 << 20,
        group_offset_partitions: Annotated[
            int, typer.Option(envvar="EOS_GROUP_OFFSET_PARTITIONS")
        ] = 50,
        auth_tokens_file: Annotated[
            Path | None,
            typer.Option(envvar="EOS_AUTH_TOKENS_FILE", help="Client tokens: turns auth on."),
        ] = None,
        acl_refresh_ms: Annotated[int, typer.Option(envvar="EOS_ACL_REFRESH_MS")] = 5_000,
        tls_cert: Annotated[
            Path | None, typer.Option(envvar="EOS_TLS_CERT", help="PEM certificate: HTTPS.")
        ] = None,
        tls_key: Annotated[
            Path | None, typer.Option(envvar="EOS_TLS_KEY", help="PEM key of --tls-cert.")
        ] = None,
        tls_ca_file: Annotated[
            Path | None,
            typer.Option(envvar="EOS_TLS_CA_FILE", help="CA bundle for calls to coordinators."),
        ] = None,
        log_level: Annotated[str, typer.Option(envvar="EOS_LOG_LEVEL")] = "info",
        log_format: Annotated[
            str, typer.Option(envvar="EOS_LOG_FORMAT", help="json | text")
        ] = "json",
    ) -> None:
        """Run a storage node: partition logs with idempotent and transactional writes."""
        settings = settings_or_exit(
            NodeSettings,
            node_id=node_id,
            host=host,
            port=port,
            data_dir=data_dir,
            internal_token=internal_token,
            coordinator_url=coordinator_url,
            coordinator_timeout_ms=coordinator_timeout_ms,
            learn_coordinators=learn_coordinators,
            txn_verification=txn_verification,
            fsync=fsync,
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            checkpoint_interval_ms=checkpoint_interval_ms,
            producer_expiration_ms=producer_expiration_ms,
            max_record_bytes=max_record_bytes,
            max_request_bytes=max_request_bytes,
            group_offset_partitions=group_offset_partitions,
            auth_tokens_file=auth_tokens_file,
            acl_refresh_ms=acl_refresh_ms,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca_file=tls_ca_file,
            log_level=log_level,
            log_format=log_format,
        )
        run_node(settings)

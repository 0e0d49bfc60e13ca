"""What authentication and ACLs cost a storage node: produce and read_committed fetch with
auth off, then on, beside the machine's HTTP limit measured in the same run.

With auth on, every request carries a bearer token that the node hashes and looks up, and
is checked against the ACLs it caches from the coordinator (one dictionary lookup once a
decision is cached). Both runs use ``--no-fsync`` so the disk does not hide the CPU cost;
the no-op FastAPI server parsing the same produce bodies is the machine's limit.

Run: ``python -m eos_bench.bench_auth [--seconds 5] [--rounds 3] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from eos_bench.harness import TOKEN, Conn, HttpError, Server, bearer, call, free_port
from eos_bench.load import LoadResult, Step, drive
from eos_security.tokens import new_token, token_entry

CLIENTS = 8
BATCH = 100
FETCH_RECORDS = 1000
RECORDS = orjson.dumps([{"key": f"key-{i:04d}", "value": "v" * 100} for i in range(BATCH)])
BODY = b'{"records":' + RECORDS + b"}"


@dataclass
class Mode:
    name: str
    produce: LoadResult
    fetch: LoadResult


def _node(tmp: Path, port: int, coordinator: str, auth: list[str]) -> Server:
    argv = [sys.executable, "-m", "partition_service", "--node-id", "1", "--port", str(port),
            "--data-dir", str(tmp / "node"), "--internal-token", TOKEN, "--no-fsync",
            "--coordinator-url", coordinator, "--group-offset-partitions", "1",
            "--log-level", "warning", *auth]
    return Server(argv, port, tmp / "node.log")


def _coordinator(tmp: Path, port: int, node_url: str, auth: list[str]) -> Server:
    argv = [sys.executable, "-m", "coordinator_service", "--port", str(port),
            "--data-dir", str(tmp / "coordinator"), "--nodes", f"1={node_url}",
            "--internal-token", TOKEN, "--group-offset-partitions", "1",
            "--super-users", "User:admin", "--log-level", "warning", *auth]
    return Server(argv, port, tmp / "coordinator.log")


async def _grant(port: int, admin: str) -> None:
    conn = await Conn(port).open()
    try:
        body = orjson.dumps({"acls": [
            {"principal": "User:bench", "resource_type": "topic", "resource_name": "bench",
             "operation": op} for op in ("read", "write")
        ]})
        status, answer = await conn.request("POST", "/v1/acls", body, bearer(admin))
        if status != 201:
            raise HttpError(f"grant: {status} {answer[:200]!r}")
    finally:
        await conn.close()


def _credentials(name: str, tmp: Path) -> tuple[list[str], dict[str, str], str]:
    """The services' auth flags, the client's header and the admin token of a mode."""
    tmp.mkdir(parents=True)
    admin = new_token()
    if name != "on":
        return [], {}, admin
    client = new_token()
    tokens = tmp / "tokens.toml"
    tokens.write_text(token_entry("User:admin", admin) + token_entry("User:bench", client))
    return ["--auth-tokens-file", str(tokens)], bearer(client), admin


async def run_mode(name: str, seconds: float, tmp: Path) -> Mode:
    auth, headers, admin = _credentials(name, tmp)
    node_port, coord_port = free_port(), free_port()
    node = _node(tmp, node_port, f"http://127.0.0.1:{coord_port}", auth)
    coordinator = _coordinator(tmp, coord_port, f"http://127.0.0.1:{node_port}", auth)
    node.start()
    try:
        coordinator.start()
        if name == "on":
            await _grant(coord_port, admin)
        await call(node_port, "PUT", "/internal/v1/partitions/bench/0", internal=True)

        async def produce(conn: Conn) -> tuple[int, int]:
            status, answer = await conn.request(
                "POST", "/v1/partitions/bench/0/records", BODY, headers)
            if status != 200:
                raise HttpError(f"produce: {status} {answer[:200]!r}")
            return BATCH, len(BODY)

        fetch_path = (f"/v1/partitions/bench/0/records?offset=0&max_records={FETCH_RECORDS}"
                      "&isolation_level=read_committed")

        async def fetch(conn: Conn) -> tuple[int, int]:
            status, answer = await conn.request("GET", fetch_path, b"", headers)
            if status != 200:
                raise HttpError(f"fetch: {status} {answer[:200]!r}")
            return FETCH_RECORDS, len(answer)

        steps: list[Step] = [produce] * CLIENTS
        produced = await drive(node_port, node.pid, steps, 1.0, seconds)
        fetched = await drive(node_port, node.pid, [fetch] * CLIENTS, 1.0, seconds)
    finally:
        coordinator.stop()
        node.stop()
    return Mode(name, produced, fetched)


async def noop_limit(seconds: float, tmp: Path) -> LoadResult:
    port = free_port()
    argv = [sys.executable, "-m", "eos_bench.noop_server", "--port", str(port)]
    server = Server(argv, port, tmp / "noop.log")
    server.start()

    async def produce(conn: Conn) -> tuple[int, int]:
        status, _ = await conn.request("POST", "/raw/bench/0/records", BODY)
        if status != 200:
            raise HttpError(f"noop: {status}")
        return BATCH, len(BODY)

    try:
        return await drive(port, server.pid, [produce] * CLIENTS, 1.0, seconds)
    finally:
        server.stop()


def _cpu_us(result: LoadResult) -> float:
    return 1e6 * result.server_cpu * result.seconds / max(result.requests, 1)


async def main_async(seconds: float, rounds: int = 1) -> dict[str, float]:
    """Off and on alternate ``rounds`` times (a busy spell of the machine then falls on
    both); each figure is the median over the rounds."""
    runs: dict[str, list[Mode]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="eos-bench-auth-") as scratch:
        tmp = Path(scratch)
        for i in range(rounds):
            for name in ("off", "on"):
                runs[name].append(await run_mode(name, seconds, tmp / f"{name}-{i}"))
        limit = await noop_limit(seconds, tmp)
    figures = {"noop_produce_records_per_s": limit.records_per_s, "rounds": float(rounds)}
    for name, modes in runs.items():
        for kind in ("produce", "fetch"):
            results = [getattr(mode, kind) for mode in modes]
            figures[f"{kind}_records_per_s_auth_{name}"] = statistics.median(
                r.records_per_s for r in results)
            figures[f"{kind}_node_cpu_us_per_request_auth_{name}"] = statistics.median(
                _cpu_us(r) for r in results)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3, help="off/on pairs (median)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main_async(args.seconds, args.rounds))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    off_p = figures["produce_records_per_s_auth_off"]
    on_p = figures["produce_records_per_s_auth_on"]
    off_f = figures["fetch_records_per_s_auth_off"]
    on_f = figures["fetch_records_per_s_auth_on"]
    print(f"{'':34}{'auth off':>14}{'auth on':>14}{'on/off':>9}")
    print(f"{'produce records/s (8 clients)':34}{off_p:>14,.0f}{on_p:>14,.0f}{on_p / off_p:>9.2f}")
    print(f"{'  node CPU us per request':34}"
          f"{figures['produce_node_cpu_us_per_request_auth_off']:>14,.0f}"
          f"{figures['produce_node_cpu_us_per_request_auth_on']:>14,.0f}")
    print(f"{'read_committed fetch records/s':34}{off_f:>14,.0f}{on_f:>14,.0f}{on_f / off_f:>9.2f}")
    print(f"{'  node CPU us per request':34}"
          f"{figures['fetch_node_cpu_us_per_request_auth_off']:>14,.0f}"
          f"{figures['fetch_node_cpu_us_per_request_auth_on']:>14,.0f}")
    print(f"{'machine limit: no-op produce':34}{figures['noop_produce_records_per_s']:>14,.0f}")


if __name__ == "__main__":
    main()

"""The machine's HTTP limit for the storage node benchmark.

A FastAPI app served by uvicorn exactly like the node (one process, the same loop and HTTP
implementation chosen by uvicorn), whose endpoints do no storage work:

* ``POST /typed/{topic}/{partition}/records`` takes a ``ProduceRequest`` parameter, so
  FastAPI parses and validates the body its default way;
* ``POST /raw/{topic}/{partition}/records`` validates the body bytes with
  ``ProduceRequest.model_validate_json``, the collector paused as the node does;
* ``GET /fetch`` answers a prebuilt fetch response of the size the node's fetches have.

Run: ``python -m eos_bench.noop_server --port PORT [--fetch-records N]``.
"""

from __future__ import annotations

import argparse
import gc

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from eos_protocol.node import ProduceRequest

VALUE = "v" * 100


def fetch_body(records: int) -> bytes:
    return orjson.dumps(
        {
            "records": [
                {
                    "offset": i,
                    "key": f"key-{i:08d}",
                    "value": VALUE,
                    "headers": {},
                    "timestamp_ms": 1_700_000_000_000,
                    "encoding": "utf8",
                }
                for i in range(records)
            ],
            "next_offset": records,
            "high_watermark": records,
            "last_stable_offset": records,
            "log_start_offset": 0,
        }
    )


def create_app(fetch_records: int) -> FastAPI:
    app = FastAPI(title="noop")
    canned_fetch = fetch_body(fetch_records)

    def answer(count: int) -> Response:
        return Response(
            orjson.dumps(
                {
                    "base_offset": 0,
                    "last_offset": count - 1,
                    "duplicate": False,
                    "log_append_time_ms": 0,
                }
            ),
            media_type="application/json",
        )

    @app.post("/typed/{topic}/{partition}/records")
    async def typed(topic: str, partition: int, body: ProduceRequest) -> Response:
        return answer(len(body.records))

    @app.post("/raw/{topic}/{partition}/records")
    async def raw(topic: str, partition: int, request: Request) -> Response:
        # Parsed as the node parses it: from the bytes, with the cyclic collector paused
        # while the per-record models exist.
        raw = await request.body()
        gc.disable()
        try:
            body = ProduceRequest.model_validate_json(raw)
            count = len(body.records)
            del body
        finally:
            gc.enable()
        return answer(count)

    @app.get("/fetch")
    async def fetch() -> Response:
        return Response(canned_fetch, media_type="application/json")

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fetch-records", type=int, default=5000)
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.fetch_records),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()

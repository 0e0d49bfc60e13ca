"""``eos-healthcheck``: the container health check of every EOS image.

A container's ``HEALTHCHECK`` runs a command inside it every few seconds, so the command
must be small, present in the image and independent of curl (which the images leave out).
This one asks the service in its own container for ``/readyz`` on ``EOS_PORT``: a
coordinator is ready once its leases are loaded, a storage node once its partitions are
open. Under TLS (``EOS_TLS_CERT`` set) it speaks HTTPS without checking the certificate,
since it talks to its own process over loopback. ``--url`` checks any other address, such
as a Spark master's web UI.

Exit status 0 when the answer is 2xx, 1 otherwise, with the reason on one line: what a
container engine records as the health check's output.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = "8080"
READY_PATH = "/readyz"


def default_url(environ: dict[str, str]) -> str:
    """The readiness address of the service configured by ``environ``."""
    scheme = "https" if environ.get("EOS_TLS_CERT") else "http"
    port = environ.get("EOS_PORT") or DEFAULT_PORT
    return f"{scheme}://127.0.0.1:{port}{READY_PATH}"


def check(url: str, timeout_s: float) -> str | None:
    """None when ``url`` answers 2xx, else why not."""
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} did not answer: {exc}"
    return None if 200 <= status < 300 else f"{url} answered {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eos-healthcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="Address to check (default: /readyz on EOS_PORT).")
    parser.add_argument("--timeout", type=float, default=2.5, help="Seconds to wait.")
    args = parser.parse_args(argv)
    url = args.url or default_url(dict(os.environ))
    problem = check(url, args.timeout)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print(f"{url} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

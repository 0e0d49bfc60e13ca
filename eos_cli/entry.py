"""The ``eos`` console script.

The script is installed with every install of the distribution, but the command line
runs and starts services, so it needs the ``[server]`` extra. Without it a user gets one
line saying what to install instead of an ``ImportError`` traceback.
"""

from __future__ import annotations

import sys

SERVER_EXTRA_HINT = "eos: the command line needs the server extra: pip install 'eos[server]'"


def main() -> None:
    try:
        from eos_cli.main import app
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in _SERVER_ONLY:
            raise
        print(f"{SERVER_EXTRA_HINT} ({exc.name} is missing)", file=sys.stderr)
        raise SystemExit(2) from None
    app()


_SERVER_ONLY = frozenset(
    {"typer", "rich", "click", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic",
     "psycopg", "pydantic_settings", "prometheus_client"}
)


if __name__ == "__main__":
    main()

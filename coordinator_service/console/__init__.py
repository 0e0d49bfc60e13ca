"""The web console at ``/console``: the cluster as an operator looks at it.

Server-rendered HTML (Jinja2 templates and a small style sheet and script, shipped as
package data) over the coordinator's own state and the storage nodes' answers:
``snapshot.py`` gathers a page's rows (``topics.py`` those of the topics pages, one
request per storage node; ``groups.py`` those of the consumer groups pages),
``render.py`` turns them into HTML,
``session.py`` holds the login cookie and the CSRF token, ``routes.py`` the pages and the
abort forms. Authentication and ACLs are the API's (``eos_security.access``); docs/console.md
describes the pages and what each number means.
"""

from __future__ import annotations

from fastapi import FastAPI

from coordinator_service.console.routes import router

__all__ = ["install"]


def install(app: FastAPI) -> None:
    app.include_router(router)

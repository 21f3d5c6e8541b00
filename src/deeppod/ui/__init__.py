"""The web console (server-rendered pages, htmx, uPlot; every file served from here, no CDN):
it calls the same service functions as the API, so every permission rule exists once."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from deeppod.ui import auth
from deeppod.ui.render import STATIC
from deeppod.ui.routes import cluster, datasets, jobs
from deeppod.ui.routes.datasets import is_upload

ASSETS = "/static/console"


def install(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=str(STATIC)), name="console")
    for r in (auth, cluster, jobs, datasets):
        app.include_router(r.router)


__all__ = ["install", "is_upload"]

"""The web console (server-rendered pages, htmx, uPlot; every file served from here, no CDN):
it calls the same service functions as the API, so every permission rule exists once."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from deeppod.ui import auth
from deeppod.ui.render import STATIC
from deeppod.ui.routes import (
    admin,
    cluster,
    datasets,
    deployments,
    experiments,
    jobs,
    labeling,
    models,
    notebook_proxy,
    notebooks,
)

ASSETS = "/static/console"


def install(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=str(STATIC)), name="console")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # what browsers ask for before any page names an icon
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                            headers={"Cache-Control": "public, max-age=86400"})
    # labeling before datasets: /datasets/REF/label is not a version called 'REF/label'
    for r in (auth, cluster, jobs, experiments, labeling, datasets, models, deployments, admin, notebooks,
              notebook_proxy):
        app.include_router(r.router)


def is_upload(method: str, path: str) -> bool:
    """Console requests whose bodies are streamed past the body limit (they have their own)."""
    return datasets.is_upload(method, path) or deployments.is_predict(method, path) or \
        path.startswith("/notebooks/")  # to its Jupyter server, which has its own limit


__all__ = ["install", "is_upload"]

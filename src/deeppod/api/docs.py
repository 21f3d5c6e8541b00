"""The API's Swagger UI at /docs, with its assets served from this server: an offline
cluster gets the page too (FastAPI's default loads them from a CDN)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/swagger"


def install(app: FastAPI) -> None:
    # the fastapi-swagger package ships a current Swagger UI (OpenAPI 3.1) as plain files
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_swagger") / "resources")), name="swagger")

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")

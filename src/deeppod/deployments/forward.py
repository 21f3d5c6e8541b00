"""A predict request's body to a deployment's least-loaded replica, and the replica's answer back:
the API's predict route and the console's test form both forward through here."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from deeppod.deployments.balancer import Balancer
from deeppod.serve import inputs


async def forward_predict(request: Request, balancer: Balancer, dep_id: int, max_bytes: int) -> Response:
    """The replica's answer, with the replica and version that gave it in headers."""
    body = await inputs.read_body(request, max_bytes, " (DEEPPOD_PREDICT_MAX_BYTES)")
    query = request.url.query
    answer = await balancer.forward(dep_id, "/predict" + (f"?{query}" if query else ""), body,
                                    request.headers.get("content-type", ""))
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type,
                    headers={"x-deeppod-replica": str(answer.replica.job_id), "x-deeppod-version":
                             str(answer.replica.version)} if answer.replica else None)

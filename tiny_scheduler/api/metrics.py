"""GET /metrics: the scheduler's Prometheus metrics (open without a token, like /health).

The metric objects and their wiring live in `tiny_scheduler.metrics`; this view only encodes
them, in the format the scraper's Accept header asks for (Prometheus text or OpenMetrics).
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request
from prometheus_client.exposition import choose_encoder

from ..metrics import metrics_of

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    """Every metric of this scheduler, in the Prometheus exposition format."""
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encode(metrics_of(current_app).registry), content_type=content_type)

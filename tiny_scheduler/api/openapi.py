"""GET /openapi.json: the OpenAPI 3.1 description of this API, shipped in the package.

The document (`tiny_scheduler/openapi.json`) is written by hand and kept true by
tests/test_openapi.py: every route is documented and every documented route exists, the error
messages are the ones `errors` defines, and schemathesis checks the live server's answers
against it. It is open without a key, like /health: it describes the API, it holds no data.
"""

from __future__ import annotations

from importlib import resources

import orjson
from flask import Blueprint, Response

bp = Blueprint("openapi", __name__)

# Compact, like every other success body; read once, it never changes while running.
_DOCUMENT = orjson.dumps(
    orjson.loads(resources.files("tiny_scheduler").joinpath("openapi.json").read_bytes())
)


@bp.get("/openapi.json")
def openapi() -> Response:
    """This API's OpenAPI description."""
    return Response(_DOCUMENT, mimetype="application/json")

"""What the OpenAPI schema (drf-spectacular, ``/api/schema/``) adds to the views' own description.

* ``AutoSchema`` (``DEFAULT_SCHEMA_CLASS``):

  - a string field checked by a name rule of ``tenants.validators`` gets that rule's ``pattern``
    (``tenants.validators.SCHEMA_PATTERNS``);
  - every operation lists the error responses it can give, each a JSON body: ``400`` (``ValidationError``: field
    name, or ``non_field_errors``, -> messages; ``{"detail": ...}`` for a body that cannot be parsed), and
    ``401``, ``403``, ``404``, ``409``, ``413``, ``415``, ``429`` (``Error``: ``{"detail": "<reason>"}``).
* ``document_api`` (a ``POSTPROCESSING_HOOKS`` entry), on every operation:

  - the ``Error`` and ``ValidationError`` components;
  - ids in paths: integers in ``[1, 2**63 - 1]``;
  - every query parameter ``allowEmptyValue``: a blank value means the parameter is absent
    (``dashboard.api.params``).
"""
from __future__ import annotations

from types import FunctionType
from typing import Any

from drf_spectacular import openapi
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme

from tenants.validators import MAX_OBJECT_ID, SCHEMA_PATTERNS

ERROR = "Error"
VALIDATION_ERROR = "ValidationError"


class TokenScheme(KnoxTokenScheme):
    """The security scheme of ``dashboard.api.authentication.TokenAuthentication``: knox's (``knoxApiToken``)."""

    target_class = "dashboard.api.authentication.TokenAuthentication"

_COMPONENTS: dict[str, dict[str, Any]] = {
    ERROR: {
        "type": "object",
        "description": "Why the request was refused.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    VALIDATION_ERROR: {
        "type": "object",
        "description": "Input refused: each key names a field (a body field or a query parameter; "
        "``non_field_errors`` for the object as a whole) and holds its messages; a field of a list or nested "
        "object holds the same shape keyed by index or name. A body that cannot be parsed gives "
        "``{\"detail\": \"<reason>\"}``.",
        "additionalProperties": {
            "anyOf": [{"type": "array", "items": {}}, {"type": "object"}, {"type": "string"}],
        },
    },
}

_DESCRIPTIONS = {
    "400": "Invalid input: a body field, a query parameter, or the body itself (not parseable, nested too deep, "
           "a Content-Length that is not a byte count).",
    "401": "No credentials, or an unknown token.",
    "403": "Authenticated, but the user lacks the permission named in the message.",
    "404": "No object has this id or name (also for an id that is not ASCII digits in [1, 2**63 - 1]).",
    "409": "The object is still referenced by others; the message names them.",
    "413": "The body is larger than the limit (KVPOOL_MAX_REQUEST_BYTES, 1 MiB by default).",
    "415": "The body's Content-Type is not one this operation parses.",
    "429": "Too many requests from this client (throttled, or locked out after wrong passwords); retry later.",
}


def _response(code: str) -> dict[str, Any]:
    component = VALIDATION_ERROR if code == "400" else ERROR
    return {
        "description": _DESCRIPTIONS[code],
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}},
    }


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's ``AutoSchema``, also turning name-rule validators into ``pattern`` and listing each
    operation's error responses."""

    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is not None:
            responses = operation.setdefault("responses", {})
            throttled = bool(self.view.get_throttles())
            for code in _error_codes(self.path, self.method.lower(), operation, throttled=throttled):
                responses.setdefault(code, _response(code))
        return operation

    def _insert_field_validators(self, field, schema):
        super()._insert_field_validators(field, schema)
        if schema.get("type") != "string" or "pattern" in schema:
            return
        for validator in field.validators:
            # the name rules are plain functions (other validators may be unhashable objects)
            pattern = SCHEMA_PATTERNS.get(validator) if isinstance(validator, FunctionType) else None
            if pattern is not None:
                if getattr(field, "allow_blank", False):  # DRF skips the validators of a blank value
                    pattern = f"^(?:{pattern[1:-1]})?$"
                schema["pattern"] = pattern
                return


def _error_codes(path: str, method: str, operation: dict[str, Any], *, throttled: bool) -> list[str]:
    """HTTP status codes of the errors ``operation`` can answer with (besides 5xx)."""
    parameters = operation.get("parameters", [])
    # 401 for a missing or unknown token (also on an endpoint open to anonymous callers, when one sends a bad
    # token), 403 for a missing permission or a session request without its CSRF token.
    codes = {"401", "403", "429"} if throttled else {"401", "403"}
    if "requestBody" in operation:
        codes |= {"400", "413", "415"}
    if any(parameter.get("in") == "query" for parameter in parameters):
        codes.add("400")
    if any(parameter.get("in") == "path" for parameter in parameters):
        codes.add("404")
    if method == "delete" and path.startswith("/api/v1/") and "{id}" in path:
        codes.add("409")
    return sorted(codes)


def document_api(result: dict[str, Any], generator=None, request=None, public=None) -> dict[str, Any]:
    """drf-spectacular post-processing hook: see the module docstring. Returns ``result``, changed in place."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, component in _COMPONENTS.items():
        schemas.setdefault(name, component)
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query":
                    parameter["allowEmptyValue"] = True
                elif parameter.get("in") == "path" and schema.get("type") == "integer":
                    schema.update({"format": "int64", "minimum": 1, "maximum": MAX_OBJECT_ID})
    return result

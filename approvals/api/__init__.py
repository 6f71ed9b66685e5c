"""The HTTP API, version 1 (contract: docs/api.md). Built on django-ninja, which also serves the OpenAPI
document (/api/v1/openapi.json) and its docs page."""

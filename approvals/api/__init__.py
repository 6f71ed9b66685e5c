"""The HTTP API, version 1 (contract: API.md). Built on django-ninja, which also serves the OpenAPI docs."""

"""The OpenAI-compatible HTTP server (Litestar): routes, request and response schemas, errors, metrics."""

"""The REST app (Conductor API v2 subset): app factory, dependencies, routes, schemas, problems, OpenAPI."""

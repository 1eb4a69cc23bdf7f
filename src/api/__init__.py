"""The HTTP API: the app factory, its input limits and the server."""

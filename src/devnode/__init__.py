"""The one-machine node (``chronolog dev``): its parts, its supervisor, its live view and
the embedded PostgreSQL launcher."""

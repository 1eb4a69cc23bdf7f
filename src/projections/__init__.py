"""Projections: pure event -> row changes, the PostgreSQL store, the projector and replay."""

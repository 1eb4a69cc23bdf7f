"""The read side: the read model's queries, their documents, worker liveness and the metrics,
shared by the HTTP API, the command line and the dev node's live view."""

"""The effect runner (a consumer-group process on ``events``) and reconciliation views."""

"""Effect adapters (webhook, email, postgres inbox, kafka) and their port (``base``)."""

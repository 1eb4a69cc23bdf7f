"""Effect adapters (webhook, email, postgres inbox, kafka) and the effect runner."""

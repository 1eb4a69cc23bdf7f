"""The pure deciders (decide/evolve): schedules, tenant quotas and routing views.

The command client is ``chronolog.client``."""

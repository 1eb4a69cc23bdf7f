"""The pure deciders (decide/evolve): schedules, tenant quotas and routing views, each an
``Aggregate`` (``chronolog.commands.aggregate``); a partition's registry of them is
``chronolog.commands.registry``.

The command client is ``chronolog.client``."""

"""Helpers shared by every test folder (``tests/`` is on pytest's ``pythonpath``, so a test
imports them as ``support.<module>``): one polling helper (``support.polling``), free
loopback ports (``support.net``) and the decider's given/when/then helpers
(``support.decider``)."""

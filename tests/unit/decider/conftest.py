"""The decider tests' fixture: ``gwt``, the given/when/then helpers of
``support.decider``."""

from __future__ import annotations

import pytest

from support.decider import GivenWhenThen


@pytest.fixture
def gwt() -> GivenWhenThen:
    """The given/when/then helpers (``support.decider``)."""
    return GivenWhenThen()

"""The planner's error: no plan exists, or the search gave up (a `ValueError`, with what
was asked and what to try, see `parop.distributed.plan`)."""


class PlanningError(ValueError):
    """No plan exists, or the search gave up."""

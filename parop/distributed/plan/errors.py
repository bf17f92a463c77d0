"""The planner's error: no plan exists, or the search gave up (a `ValueError`, with what
was asked and what to try, see `parop.distributed.plan`)."""


class PlanningError(ValueError):
    """No plan exists (`gave_up` False: the search proved it), or the search gave up
    after its budget of states (`gave_up` True: a plan may exist).

    >>> PlanningError("the planner gave up after 20 states", gave_up=True).gave_up
    True
    """

    def __init__(self, message: str, gave_up: bool = False):
        super().__init__(message)
        self.gave_up = gave_up

"""Distribution: layouts, the planner, the lowering to `shard_map`, and the operator
users hold. (`po.plan` is `parop.distributed.operator.plan`: here `plan` names the planner's
package.)"""

from .calibrate import calibrate
from .chain import distribute_chain
from .operator import DistributedOperator, distribute
from .plan import CostModel, Plan

__all__ = ["calibrate", "CostModel", "DistributedOperator", "Plan", "distribute", "distribute_chain"]

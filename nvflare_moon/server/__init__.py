"""Server components: aggregators for NVFlare's FedAvg controller and the once-per-round global evaluation."""

from .aggregators import WeightedFedAvgAggregator
from .dual_aggregation import DualAggregator
from .evaluator import GlobalModelEvaluator
from .prototypes import PrototypeSharingAggregator
from .sampling import SampledFedAvg
from .scaffold import ScaffoldAggregator
from .settings import SettingsFedAvg

__all__ = [
    "WeightedFedAvgAggregator", "GlobalModelEvaluator", "SampledFedAvg", "ScaffoldAggregator",
    "PrototypeSharingAggregator", "DualAggregator", "SettingsFedAvg",
]

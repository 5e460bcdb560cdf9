"""Server components: aggregators for NVFlare's FedAvg controller and the once-per-round global evaluation."""

from .aggregators import WeightedFedAvgAggregator
from .evaluator import GlobalModelEvaluator

__all__ = ["WeightedFedAvgAggregator", "GlobalModelEvaluator"]

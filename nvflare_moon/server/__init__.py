"""Server components: aggregators for NVFlare's FedAvg controller, the once-per-round global evaluation and the
checks that make a job fail loudly. Importing it changes nothing of NVFlare's (the simulator's fixes are the job's
:class:`nvflare_moon.sim.fixes.SimulatorFixes` component)."""

from .aggregators import WeightedFedAvgAggregator
from .data_check import DataCheckController
from .dual_aggregation import DualAggregator
from .evaluator import GlobalModelEvaluator, SiteMetricsRecorder
from .prototypes import PrototypeSharingAggregator
from .run_checks import RunOutcomeCheck, ShardCoverageCheck
from .sampling import SampledFedAvg
from .scaffold import ScaffoldAggregator
from .settings import SettingsFedAvg, TrainTaskSettings

__all__ = [
    "WeightedFedAvgAggregator",
    "DataCheckController",
    "GlobalModelEvaluator",
    "SampledFedAvg",
    "ScaffoldAggregator",
    "PrototypeSharingAggregator",
    "DualAggregator",
    "SettingsFedAvg",
    "ShardCoverageCheck",
    "RunOutcomeCheck",
    "SiteMetricsRecorder",
    "TrainTaskSettings",
]

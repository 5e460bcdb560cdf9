"""Server components: aggregators for NVFlare's FedAvg controller, the once-per-round global evaluation and the
checks that make a job fail loudly.

Importing this package inside NVFlare's simulator also keeps the simulator's site names apart
(:mod:`nvflare_moon.simulator_sites`): the server app loads it before any site starts.
"""

from ..simulator_sites import keep_simulator_site_names_apart

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

keep_simulator_site_names_apart()

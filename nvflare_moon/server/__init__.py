"""Server components: aggregators for NVFlare's FedAvg controller, the once-per-round global evaluation and the
checks that make a job fail loudly.

Importing this package inside NVFlare's simulator also keeps the simulator's site names apart
(:mod:`nvflare_moon.simulator_sites`), starts only sites that the server waits on (:mod:`nvflare_moon.simulator_schedule`)
and forks the sites' workers from a process that has imported torch already (:mod:`nvflare_moon.simulator_workers`):
the server app loads it before any site starts.
"""

from ..simulator_schedule import schedule_simulator_sites
from ..simulator_sites import keep_simulator_site_names_apart
from ..simulator_workers import start_simulator_workers_warm

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
schedule_simulator_sites()
start_simulator_workers_warm()

"""Client API helpers: MOON, FedSSC, FedSiam-DA, SCAFFOLD and DP-SGD inside a user's own NVFlare training script
(``flare.init() / receive() / send()``), on the same core (:mod:`nvflare_moon.core`) as the executors. Run the script
with the recipes in :mod:`nvflare_moon.recipes`. See ``docs/client_api.md``."""

from .dp import PTDPHelper
from .fedsiam_da import PTFedSiamDAHelper
from .moon import PTFedSSCHelper, PTMoonHelper
from .scaffold import PTPersistentScaffoldHelper
from .state import StateFolderNotFound, state_folder

__all__ = [
    "PTMoonHelper",
    "PTFedSSCHelper",
    "PTFedSiamDAHelper",
    "PTPersistentScaffoldHelper",
    "PTDPHelper",
    "StateFolderNotFound",
    "state_folder",
]

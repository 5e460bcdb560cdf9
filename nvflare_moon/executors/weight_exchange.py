"""How the weights travel between a site and the server: what the site reads from the global model it receives, and
the reply it sends back (the weights or their difference, the sample count, the round's meta), in the clear or under
NVFlare's homomorphic encryption."""

from typing import Any, Dict

import numpy as np
import torch.nn as nn
from nvflare.apis.fl_constant import FLMetaKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from ..core.aggregation import NUM_SAMPLES
from ..core.validation import check_flag
from ..core.weights import restore_shapes, state_dict_to_numpy

HE_CLIENT_CONTEXT = "client_context.tenseal"  # what NVFlare's HEBuilder writes into a site's kit (with the secret key)


class WeightExchange:
    """The site's side of the exchange.

    Args:
        send_weight_diff: send w_local − w_global (``params_type`` DIFF) instead of the weights, for task-result
            filters made for differences (NVFlare's ``PercentilePrivacy``, ``SVTPrivacy``); our aggregators add it
            back to the global model. The site's own state (previous models, controls) is unaffected.
        encrypted_aggregation: the job runs NVFlare's HE filters (the recipes' ``encryption="ckks"``): the site
            checks at start that its kit holds the HE context (:func:`check_he_context`), restores the shapes of the
            decrypted global model (CKKS vectors are flat), and puts its sample count n_k in
            ``NUM_STEPS_CURRENT_ROUND``, the number NVFlare's ``HEModelEncryptor`` multiplies the weights by before
            encrypting them (its aggregator divides the encrypted sum by Σ n_k), so that the aggregate stays FedAvg's
            n_k-weighted mean.
    """

    def __init__(self, send_weight_diff: bool, encrypted_aggregation: bool):
        check_flag("send_weight_diff", send_weight_diff)
        check_flag("encrypted_aggregation", encrypted_aggregation)
        self.send_weight_diff = send_weight_diff
        self.encrypted_aggregation = encrypted_aggregation

    def received_params(self, received: FLModel, net: nn.Module) -> Dict[str, Any]:
        """The received weights, in the local network's shapes."""
        params = received.params or {}
        return restore_shapes(params, net.state_dict()) if self.encrypted_aggregation else params

    def reply(
        self,
        net: nn.Module,
        received: FLModel,
        metrics: Dict[str, float],
        steps: int,
        num_samples: int,
        meta: Dict[str, Any],
    ) -> FLModel:
        """The trained weights (or their difference to the received ones) with the metrics and the upload's meta."""
        params = state_dict_to_numpy(net)
        if self.send_weight_diff:
            params = {name: value - np.asarray(received.params[name]) for name, value in params.items()}
        # NVFlare's HE encryptor weighs by NUM_STEPS_CURRENT_ROUND; FedAvg's weight is the sample count
        steps_or_samples = num_samples if self.encrypted_aggregation else steps
        return FLModel(
            params=params,
            params_type=ParamsType.DIFF if self.send_weight_diff else ParamsType.FULL,
            metrics=metrics,
            meta={NUM_SAMPLES: num_samples, FLMetaKey.NUM_STEPS_CURRENT_ROUND: steps_or_samples, **meta},
        )


def check_he_context(fl_ctx: FLContext) -> None:
    """Raise ValueError, with NVFlare's reason and the fix, unless this site's kit holds the HE context."""
    from nvflare.app_opt.he.homomorphic_encrypt import load_tenseal_context_from_workspace  # imports tenseal

    try:
        load_tenseal_context_from_workspace(HE_CLIENT_CONTEXT, fl_ctx)
    except Exception as e:  # NVFlare raises ValueError for a missing file; TenSEAL a TypeError for no content
        raise ValueError(
            f"this job aggregates encrypted updates (encryption='ckks') and this site has no usable HE context: {e}. "
            "Re-provision the federation with NVFlare's HEBuilder (deploy/project.yml; on the POC: python "
            "poc/prepare.py --he --force) and restart the site with its new startup kit"
        ) from e

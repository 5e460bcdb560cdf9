"""The base of the Client API recipes: NVFlare's ``FedAvgRecipe`` with our aggregator and the method's settings in
every training model's meta (see :mod:`nvflare_moon.recipes`)."""

from typing import Any, Dict, Optional

from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe

from ..filters.privacy import (
    add_update_filters,
    check_quantization,
)
from ..server import (
    SettingsFedAvg,
    WeightedFedAvgAggregator,
)
from ..sim.fixes import COMPONENT_ID, SimulatorFixes


class ClientAPIRecipe(FedAvgRecipe):
    """FedAvgRecipe with our aggregator and the method's settings in every training model's meta."""

    def __init__(self, *, quantization: Optional[str] = None, **kwargs):
        check_quantization(quantization)
        self.quantization = quantization
        if kwargs.get("aggregator") is not None:
            raise ValueError(
                f"{type(self).__name__} brings its own aggregator (the method's server side); do not pass aggregator="
            )
        kwargs.pop("aggregator", None)
        super().__init__(aggregator=self.make_aggregator(), **kwargs)
        # our classes come from the installed package; a copy in the job's custom/ would shadow it, partially
        self._job.set_app_packages(["nvflare_moon"])
        self._job.to_server(SimulatorFixes(), id=COMPONENT_ID)

    def _ensure_client_apps_prepared(self) -> None:
        """The clients' filters go in once their apps exist, so that ``set_per_site_config`` still works after
        construction (NVFlare closes it once a client filter is added)."""
        if self._client_apps_prepared:
            return
        super()._ensure_client_apps_prepared()
        add_update_filters(self, self.quantization, [], "train", ["validate", "submit_model"])  # ClientAPIExecutor's

    def make_aggregator(self) -> ModelAggregator:
        return WeightedFedAvgAggregator()

    def client_settings(self) -> Dict[str, Any]:
        """Meta key → value sent with every training model."""
        raise NotImplementedError

    def _create_controller(self, persistor_id: str, model_params, model_aggregator) -> FedAvg:
        # FedAvgRecipe's controller, of our class (same arguments), plus the settings
        return SettingsFedAvg(
            num_clients=self.min_clients,
            num_rounds=self.num_rounds,
            persistor_id=persistor_id,
            model=model_params,
            save_filename=self.save_filename,
            aggregator=model_aggregator,
            stop_cond=self.stop_cond,
            patience=self.patience,
            task_name="train",
            exclude_vars=self.exclude_vars,
            aggregation_weights=self.aggregation_weights,
            memory_gc_rounds=self.server_memory_gc_rounds,
            enable_tensor_disk_offload=self.enable_tensor_disk_offload,
            client_settings=self.client_settings(),
            **self._get_controller_kwargs(),
        )

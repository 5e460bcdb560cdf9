"""The recipes' ``encryption`` option: the aggregation under NVFlare's homomorphic encryption (CKKS through TenSEAL),
so that the server never sees a site's weights in the clear (``docs/deployment.md``, "Encrypted aggregation").

The job takes NVFlare 2.9's HE shape (its ``FedAvgRecipeWithHE``): the server runs ``ScatterAndGather`` with
``HEInTimeAccumulateWeightedAggregator`` on ciphertexts, ``HEModelShareableGenerator`` and a ``PTFileModelPersistor``
that saves through ``HEModelSerializeFilter``; the sites decrypt the global model (``HEModelDecryptor``) and encrypt
their results (``HEModelEncryptor``). The server holds the public context only, so it cannot evaluate or check the
aggregate: the global evaluation moves to the sites (:class:`~nvflare_moon.server.SiteMetricsRecorder`), and the
executors weight by sample count through the encryptor (their ``encrypted_aggregation``).
"""

from typing import Optional, Sequence

from nvflare.apis.dxo import DataKind
from nvflare.apis.filter import Filter
from nvflare.app_opt.pt.file_model_persistor import PTFileModelPersistor
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import Recipe

from ..core.validation import check_optional_choice

ENCRYPTION_CHOICES = ("ckks",)
SERIALIZE_FILTER_ID = "model_serialize_filter"

# why a method cannot run under encryption (the recipes' ``option_limits``)
WHY_NOT_ENCRYPTED = {
    "scaffold": (
        "SCAFFOLD's control difference Δc_i = (w_global − w_local)/(K·lr) − c travels in the update's meta, which "
        "the HE filters do not encrypt, so the site's whole update would reach the server in the clear"
    ),
    "fedsiam_da": (
        "its dual aggregation weights each site by the cosine between plaintext models, which a server "
        "holding only the public HE context cannot compute"
    ),
    "fedssc": (
        "its class prototypes travel in the update's meta, which the HE filters do not encrypt, and the server "
        "draws from them in the clear (PrototypeSharingAggregator), which NVFlare's HE aggregator cannot do"
    ),
}


def check_encryption(
    encryption: Optional[str],
    *,
    quantization: Optional[str],
    privacy_filters: Sequence[Filter],
    server_evaluation: bool,
    sample_fraction: float,
    stop_cond: Optional[str],
) -> None:
    """Raise ValueError, naming ``encryption`` and the option in the way, unless ``encryption`` is None, or
    ``"ckks"`` with TenSEAL installed and no option that needs plaintext weights on the server."""
    check_optional_choice(
        "encryption",
        encryption,
        ENCRYPTION_CHOICES,
        module="tenseal",
        needs="TenSEAL on the server and every site (pip install 'nvflare-moon[he]')",
    )
    if encryption is None:
        return
    conflicts = {
        "quantization": (
            quantization is not None,
            "the quantizer cannot read CKKS ciphertexts, and the encryptor works on float64 values anyway",
        ),
        "privacy_filters": (
            bool(privacy_filters),
            "PercentilePrivacy and SVTPrivacy send weight differences and ExcludeVars partial updates, and NVFlare's "
            "HE aggregator here takes full weights only (its global model would lose the excluded entries)",
        ),
        "server_evaluation": (
            server_evaluation,
            "the server holds no secret key and cannot evaluate the global model; set server_evaluation=False (the "
            "key metric is then the sites' weighted mean accuracy of the global model they decrypted)",
        ),
        "sample_fraction": (
            sample_fraction < 1,
            "site sampling runs in our FedAvg controller, and NVFlare's HE workflow is ScatterAndGather",
        ),
        "stop_cond": (
            stop_cond is not None,
            "early stopping runs in NVFlare's FedAvg controller, and NVFlare's HE workflow is ScatterAndGather",
        ),
    }
    for option, (is_set, why) in conflicts.items():
        if is_set:
            raise ValueError(f"encryption={encryption!r} cannot be combined with {option}: {why}")


def add_encrypted_server(job: FedJob, network, min_clients: int, num_rounds: int, train_task: str) -> None:
    """NVFlare's HE server on ``job``: the persistor (id ``persistor``, saving through the HE serialize filter),
    the HE shareable generator and aggregator, and ``ScatterAndGather`` (id ``controller``)."""
    from nvflare.app_common.workflows.scatter_and_gather import ScatterAndGather
    from nvflare.app_opt.he.intime_accumulate_model_aggregator import HEInTimeAccumulateWeightedAggregator
    from nvflare.app_opt.he.model_serialize_filter import HEModelSerializeFilter
    from nvflare.app_opt.he.model_shareable_generator import HEModelShareableGenerator

    job.to_server(HEModelSerializeFilter(), id=SERIALIZE_FILTER_ID)
    persistor = PTFileModelPersistor(model=network, filter_id=SERIALIZE_FILTER_ID)
    job.comp_ids = job.to_server(PTModel(model=network, persistor=persistor), id="persistor")
    job.to_server(HEModelShareableGenerator(), id="shareable_generator")
    # the sites' encryptor multiplies by n_k (NUM_STEPS_CURRENT_ROUND), the aggregator divides by Σ n_k
    aggregator = HEInTimeAccumulateWeightedAggregator(expected_data_kind=DataKind.WEIGHTS, weigh_by_local_iter=False)
    job.to_server(aggregator, id="aggregator")
    controller = ScatterAndGather(
        min_clients=min_clients,
        num_rounds=num_rounds,
        wait_time_after_min_received=0,
        aggregator_id="aggregator",
        persistor_id=job.comp_ids["persistor_id"],
        shareable_generator_id="shareable_generator",
        train_task_name=train_task,
    )
    job.to_server(controller, id="controller")


def add_encryption_filters(recipe: Recipe, train_task: str, validate_task: str, submit_model_task: str) -> None:
    """The sites' HE filters: decrypt the global model of ``train`` and ``validate``; encrypt the ``train`` result
    weighted by its n_k, and the local model a site submits for cross-site evaluation unweighted."""
    from nvflare.app_opt.he.model_decryptor import HEModelDecryptor
    from nvflare.app_opt.he.model_encryptor import HEModelEncryptor

    recipe.add_client_input_filter(HEModelDecryptor(), tasks=[train_task, validate_task])
    recipe.add_client_output_filter(HEModelEncryptor(weigh_by_local_iter=True), tasks=[train_task])
    recipe.add_client_output_filter(HEModelEncryptor(weigh_by_local_iter=False), tasks=[submit_model_task])

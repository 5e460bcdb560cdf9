"""Drop MOON into an NVFlare job built with the Job API, with your own network; each site trains on its own images.

python job.py --class-names normal,pneumonia --export-to /tmp/jobs
nvflare simulator /tmp/jobs/hospital_moon -n 2 -t 2      # each site finds its folder: see docs/hospital_data.md
"""

import argparse
from typing import List, Optional

from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob

from nvflare_moon.core.moon import MoonSettings
from nvflare_moon.core.specs import DataSpec, TrainingSpec
from nvflare_moon.executors import MoonExecutor
from nvflare_moon.server import GlobalModelEvaluator, WeightedFedAvgAggregator

from hospital_net import HospitalNet


def build_job(
    class_names: List[str], site_path: Optional[str] = None, num_sites: int = 2, num_rounds: int = 3
) -> FedJob:
    job = FedJob(name="hospital_moon", min_clients=num_sites)
    job.set_app_packages(["nvflare_moon"])  # installed on every site: not copied into the job
    model = HospitalNet(num_classes=len(class_names))
    job.to_server(PTModel(model=model), id="persistor")
    job.to_server(
        FedAvg(num_clients=num_sites, num_rounds=num_rounds, aggregator=WeightedFedAvgAggregator()), id="controller"
    )
    # the server holds no images: it records the sites' accuracy of each global model
    job.to_server(GlobalModelEvaluator(model=model, dataset=None), id="evaluator")
    # Each site trains on all of its own images. site_path=None: the site's own setting decides where they are
    # ($NVFLARE_MOON_SITE_DATA or local/nvflare_moon_data.json); a path here may hold {SITE_NAME}.
    site_data = {"class_names": class_names, "image_size": 32, "channels": 3}
    executor = MoonExecutor(
        model=model,
        data=DataSpec(dataset="image_folder", site_data=site_data, site_path=site_path),
        training=TrainingSpec(local_epochs=2, batch_size=16),
        settings=MoonSettings(mu=5.0),
    )
    job.to_clients(executor, tasks=["train", "validate", "submit_model"])
    return job


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--class-names", required=True, help="comma-separated, the label order of every site")
    parser.add_argument("--site-path", help="the sites' folder, e.g. /data/{SITE_NAME}; default: each site's own")
    parser.add_argument("--export-to", default="/tmp/nvflare_moon_jobs")
    args = parser.parse_args()
    build_job(args.class_names.split(","), args.site_path).export_job(args.export_to)
    print(f"exported {args.export_to}/hospital_moon")

"""Drop MOON into an NVFlare job built with the Job API, with your own network and data.

python job.py --train-root /data/site_images --test-root /data/test_images --export-to /tmp/jobs
nvflare simulator /tmp/jobs/hospital_moon -n 2 -t 2
"""

import argparse

from hospital_net import HospitalImages, HospitalNet

from nvflare.app_common.workflows.fedavg import FedAvg
from nvflare.app_opt.pt.job_config.model import PTModel
from nvflare.job_config.api import FedJob

from nvflare_moon.executors import MoonExecutor
from nvflare_moon.server import GlobalModelEvaluator, WeightedFedAvgAggregator


def build_job(train_root: str, test_root: str, num_sites: int = 2, num_rounds: int = 3) -> FedJob:
    job = FedJob(name="hospital_moon", min_clients=num_sites)
    job.set_app_packages(["nvflare_moon"])  # installed on every site: not copied into the job
    job.to_server(PTModel(model=HospitalNet()), id="persistor")
    job.to_server(
        FedAvg(num_clients=num_sites, num_rounds=num_rounds, aggregator=WeightedFedAvgAggregator()), id="controller"
    )
    job.to_server(GlobalModelEvaluator(model=HospitalNet(), dataset=HospitalImages(test_root)), id="evaluator")
    # Each site reads its own folder at train_root; the whole dataset is the site's data (no partitioning).
    job.to_clients(
        MoonExecutor(model=HospitalNet(), dataset=HospitalImages(train_root), mu=5.0, local_epochs=2, batch_size=16),
        tasks=["train"],
    )
    return job


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-root", required=True)
    parser.add_argument("--test-root", required=True)
    parser.add_argument("--export-to", default="/tmp/nvflare_moon_jobs")
    args = parser.parse_args()
    build_job(args.train_root, args.test_root).export_job(args.export_to)
    print(f"exported {args.export_to}/hospital_moon")

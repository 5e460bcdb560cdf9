#!/usr/bin/env bash
# The paper pair's first rounds on a GPU machine, prepared for a short lease (about 12 minutes at the defaults on one
# modern GPU): seconds per round for MOON and FedAvg at the paper's settings with device="auto", then the split of a
# round at -t 10 and -t 4 (NVFlare's simulator as it ships, and with nvflare_moon's scheduling and warm workers).
#
#   bash benchmarks/gpu_protocol.sh DATA OUT [ROUNDS]
#
# DATA holds cifar-10-batches-py/, or is a folder with this project's JPEG copy of CIFAR-10 (build_batches.py
# beside cifar10-jpeg-q75.tar.gz), which is unpacked first. OUT receives paper/ (the benchmark's records, summary
# and logs: seconds per round in each run record) and overhead_e<EPOCHS>.json. ROUNDS (default 5) is per method; the paper
# runs 100, so a method's full run takes about 100/ROUNDS times the time printed for it. EPOCHS (environment, default
# the paper's 10) sets the local epochs of both parts. On a CPU,
# `EPOCHS=1 bash benchmarks/gpu_protocol.sh .data /tmp/gpu_check 2` checks the script end to end;
# tests/test_gpu_protocol.py checks every command it runs against our command lines' parsers.
set -euo pipefail
data=${1:?DATA: a folder with cifar-10-batches-py/, or the JPEG copy of CIFAR-10 with build_batches.py}
out=${2:?OUT: where the records go}
rounds=${3:-5}
epochs=${EPOCHS:-10}
mkdir -p "$out"
if [ ! -d "$data/cifar-10-batches-py" ]; then
  python "$data/build_batches.py" "$out/data"
  data="$out/data"
fi
data=$(cd "$data" && pwd)  # the simulator's workers run in their own folders
python -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')"
started=$(date +%s)
python -m nvflare_moon.benchmark --protocol paper --methods moon,fedavg --seeds 0 --rounds "$rounds" \
  --local-epochs "$epochs" --device auto --data-root "$data" --out "$out/paper"
echo "paper pair, $rounds rounds each: $(( $(date +%s) - started )) s"
NVFLARE_MOON_DATA="$data" python benchmarks/simulator_overhead.py --compare-threads 10,4 --epochs "$epochs" --rounds 2 \
  --record "$out/overhead_e$epochs.json"

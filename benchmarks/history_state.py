"""Bytes of MOON's stored history per site: the whole previous network (the paper) against its projection head only
(``light_history=True``), for the simple-CNN and ResNet-50.

    python benchmarks/history_state.py [--json history_state.json]

The figures are the sizes of the state file that :class:`~nvflare_moon.executors.MoonExecutor` writes after a round
(``<run folder>/nvflare_moon/moon_state.pt``: the last m + 1 uploads, m = 1), built by the executor's own code
(:attr:`~nvflare_moon.core.moon.MoonRound.history_network` and :class:`~nvflare_moon.core.previous_uploads.PreviousUploads`) and serialised as the
state store does. With the light history the site also keeps its whole last local model in a separate record, for
``submit_model`` (cross-site evaluation); that record's size is printed too, and so are the bytes of the tensors of
one previous model (the whole network, or its head) that a site holds in memory while it trains.

The sizes are deterministic (they do not depend on the seed, the machine or its load). ``--json PATH`` also writes
them to a record with the command line, the date, the commit and the machine.
"""

import argparse
import io

import torch

from nvflare_moon.benchmark.runner import RecordHeader
from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.core.previous_uploads import PreviousUploads
from nvflare_moon.models import Network, ProjectionHead

NETWORKS = {"simple_cnn": 10, "resnet50": 100}  # arch -> classes (CIFAR-10, CIFAR-100 as in the paper)


def serialized_bytes(payload) -> int:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.tell()


def history_bytes(kept: torch.nn.Module) -> int:
    """The state payload after rounds 0 and 1: two uploads of ``kept``."""
    uploads = PreviousUploads(keep=1)
    uploads.uploads = [(0, {k: v.clone() for k, v in kept.state_dict().items()})]
    return serialized_bytes(uploads.payload_after(1, kept))


def tensor_bytes(module: torch.nn.Module) -> int:
    """The bytes of ``module``'s parameters and buffers: one copy of it held in memory."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--json", help="also write a record to this file: the command, date, commit, machine and the sizes in bytes"
    )
    args = parser.parse_args()
    header = RecordHeader("benchmarks/history_state.py")

    sizes = {}
    print(
        f"{'network':<12}{'full history':>16}{'light history':>16}{'ratio':>8}{'local model record':>22}"
        f"{'in memory, full → light':>28}"
    )
    for arch, classes in NETWORKS.items():
        net = Network(arch=arch, num_classes=classes, seed=0)
        head = ProjectionHead(net)
        full, light = history_bytes(net), history_bytes(head)
        local_model = serialized_bytes({"model": net.state_dict()})
        sizes[arch] = {
            "num_classes": classes,
            "full_history_bytes": full,
            "light_history_bytes": light,
            "local_model_record_bytes": local_model,
            "network_tensor_bytes": tensor_bytes(net),
            "head_tensor_bytes": tensor_bytes(head),
        }
        figures = f"{full / 1e6:>13.2f} MB{light / 1e6:>13.2f} MB{light / full:>8.3f}{local_model / 1e6:>19.2f} MB"
        memory = f"{tensor_bytes(net) / 1e6:>12.2f} → {tensor_bytes(head) / 1e6:.2f} MB"
        print(f"{arch:<12}{figures}{memory}")
    if args.json:
        record = {
            **header.fields(),
            "history_kept": "m = 1: the last two uploads (rounds 0 and 1)",
            "sizes": sizes,
        }
        write_json_atomic(args.json, record)


if __name__ == "__main__":
    main()

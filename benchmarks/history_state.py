"""Bytes of MOON's stored history per site: the whole previous network (the paper) against its projection head only
(``light_history=True``), for the simple-CNN and ResNet-50.

    python benchmarks/history_state.py

The figures are the sizes of the state file that :class:`~nvflare_moon.executors.MoonExecutor` writes after a round
(``<run folder>/nvflare_moon/moon_state.pt``: the last m + 1 uploads, m = 1), built by the executor's own code
(:attr:`~nvflare_moon.core.moon.MoonRound.history_network` and :class:`~nvflare_moon.core.previous_uploads.PreviousUploads`) and serialised as the
state store does. With the light history the site also keeps its whole last local model in a separate record, for
``submit_model`` (cross-site evaluation); that record's size is printed too.
"""

import io

import torch

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


def main() -> None:
    print(f"{'network':<12}{'full history':>16}{'light history':>16}{'ratio':>8}{'local model record':>22}")
    for arch, classes in NETWORKS.items():
        net = Network(arch=arch, num_classes=classes, seed=0)
        full, light = history_bytes(net), history_bytes(ProjectionHead(net))
        local_model = serialized_bytes({"model": net.state_dict()})
        sizes = f"{full / 1e6:>13.2f} MB{light / 1e6:>13.2f} MB{light / full:>8.3f}{local_model / 1e6:>19.2f} MB"
        print(f"{arch:<12}{sizes}")


if __name__ == "__main__":
    main()

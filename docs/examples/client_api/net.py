"""The user's model and data, as in NVFlare's hello-pt: a small CNN and CIFAR-10 (or tiny synthetic images).

The network exposes its representation: ``features(x)`` is the 84-dimensional input of the classifier, which MOON and
FedSSC contrast; ``forward`` is ``classifier(features(x))``. ``with_predictor=True`` adds the small SimSiam predictor
FedSiam-DA needs (84 → 32 → 84). ``num_classes`` sizes the classifier (10 for CIFAR-10; a hospital's own classes in
``client_moon_site_data.py``).
"""

import argparse
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset


class Net(nn.Module):
    def __init__(self, with_predictor: bool = False, num_classes: int = 10):
        super().__init__()
        self.with_predictor = with_predictor
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.classifier = nn.Linear(84, num_classes)
        if with_predictor:
            self.predictor = nn.Sequential(nn.Linear(84, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 84))

    def features(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return F.relu(self.fc2(F.relu(self.fc1(x))))

    def forward(self, x):
        return self.classifier(self.features(x))


def parse_script_args(site_data: bool = False) -> argparse.Namespace:
    """The settings every script of this example takes (``job.py`` passes them as ``train_args``). ``site_data``:
    those of ``client_moon_site_data.py``, the site's own image folder, instead of CIFAR-10's."""
    parser = argparse.ArgumentParser()
    if site_data:
        parser.add_argument(
            "--site_path",
            "--site-path",
            "--data_root",
            "--data-root",
            dest="site_path",
            default=None,
            help="the site's folder (default: by its name); --data_root is its old name",
        )
        parser.add_argument("--class_names", required=True, help="the label order, comma-separated, on every site")
    else:
        parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "synthetic"])
        parser.add_argument("--data_root", default="/tmp/nvflare/data")
        parser.add_argument("--num_sites", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def load_data(dataset: str, site: str, data_root: str, num_sites: int):
    """``(train, test)`` of this site: every ``num_sites``-th image of CIFAR-10's training set from its number on, or
    a few hundred synthetic images (class templates plus noise) that need no download."""
    if dataset == "synthetic":
        return _synthetic(site, 160), _synthetic("test", 100)
    import torchvision
    import torchvision.transforms as transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    train = torchvision.datasets.CIFAR10(root=data_root, train=True, download=True, transform=transform)
    test = torchvision.datasets.CIFAR10(root=data_root, train=False, download=True, transform=transform)
    first = int(site.rsplit("-", 1)[-1]) - 1
    return torch.utils.data.Subset(train, range(first, len(train), num_sites)), test


def _synthetic(name: str, size: int) -> Dataset:
    templates = torch.rand(10, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    templates = F.interpolate(templates, size=(32, 32), mode="bilinear", align_corners=False) * 2 - 1
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    labels = torch.randint(0, 10, (size,), generator=g)
    return TensorDataset(templates[labels] + 0.5 * torch.randn(size, 3, 32, 32, generator=g), labels)


def round_generator(seed: int, site: str, round_number: int) -> torch.Generator:
    """The shuffle of a round as a function of (seed, site, round) alone: a script that NVFlare restarts for every
    task (``-t < -n``) trains exactly as one that lives for the whole job."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{site}/{round_number}".encode()))


@torch.no_grad()
def evaluate(model: nn.Module, loader, device) -> float:
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predicted = model(images.to(device)).argmax(1)
        correct += int((predicted == labels.to(device)).sum())
        total += len(labels)
    return correct / total

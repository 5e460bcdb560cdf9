"""The user's own code: a backbone, the network MOON trains, and a site's own image folder."""

import torch.nn as nn
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from nvflare_moon.models import ProjectionModel


class TinyBackbone(nn.Module):
    """Any encoder works; it only has to map a batch to [B, feat_dim] features."""

    def __init__(self, feat_dim: int = 64):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, feat_dim),
            nn.ReLU(),
        )

    def forward(self, x):
        return self.layers(x)


class HospitalNet(ProjectionModel):
    """The backbone with MOON's projection head and classifier. Plain-valued arguments, so job configs can build it."""

    def __init__(self, num_classes: int = 2):
        super().__init__(TinyBackbone(feat_dim=64), feat_dim=64, num_classes=num_classes, out_dim=32)
        self.num_classes = num_classes


class HospitalImages(Dataset):
    """This site's own images, ``root/<class>/<image>``, as normalised 32×32 tensors."""

    def __init__(self, root: str, image_size: int = 32):
        self.root = root
        self.image_size = image_size
        to_tensor = transforms.Compose(
            [transforms.Resize((image_size, image_size)), transforms.ToTensor(), transforms.Normalize(0.5, 0.5)]
        )
        self._images = datasets.ImageFolder(root, transform=to_tensor)

    def __len__(self):
        return len(self._images)

    def __getitem__(self, index):
        return self._images[index]

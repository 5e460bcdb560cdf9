"""The user's own code: a backbone and the network MOON trains. The sites' images need no code (``dataset="image_folder"``)."""

import torch.nn as nn

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

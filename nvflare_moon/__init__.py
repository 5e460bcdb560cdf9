"""nvflare-moon: representation-level federated learning for non-IID data on NVIDIA FLARE."""

__version__ = "0.1.0"

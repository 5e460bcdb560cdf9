"""A Client API training script for the end-to-end tests: MOON through PTMoonHelper on tiny synthetic data.

Each training task appends one JSON line to ``--records``: the site, round and PID, the hashes of the previous models
the helper gave the round and of the model sent, and the round's mean contrastive term and loss.
"""

import argparse
import hashlib
import json
import os
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import nvflare.client as flare
from nvflare_moon.client import PTMoonHelper


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.classifier = nn.Linear(16, 4)

    def forward(self, x):
        return self.classifier(self.encoder(x))


def state_hash(state) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def site_data(site: str):
    g = torch.Generator().manual_seed(zlib.crc32(site.encode()))
    labels = torch.randint(0, 4, (64,), generator=g)
    templates = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    return templates[labels] + 0.3 * torch.randn(64, 3, 8, 8, generator=g), labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    flare.init()
    site = flare.get_site_name()
    x_all, y_all = site_data(site)
    model = TinyNet()
    helper = PTMoonHelper(model, representation_fn=lambda net, x: net.encoder(x))
    while flare.is_running():
        input_model = flare.receive()
        model.load_state_dict(input_model.params)
        if not flare.is_train():
            flare.send(flare.FLModel(metrics={"accuracy": 0.0}))
            continue
        round_number = input_model.current_round
        helper.start_round(input_model)
        previous = [state_hash(m.state_dict()) for m in helper.previous_models]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        shuffle = torch.Generator().manual_seed(zlib.crc32(f"{site}/{round_number}".encode()))
        order = torch.randperm(64, generator=shuffle)
        losses = []
        for epoch in range(2):
            for batch in order.split(16):
                x, y = x_all[batch], y_all[batch]
                z = model.encoder(x)
                loss = F.cross_entropy(model.classifier(z), y) + helper.loss(x, z)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss))
        helper.save_local_model()
        sent = model.state_dict()
        record = {
            "site": site, "round": round_number, "pid": os.getpid(), "previous": previous, "sent": state_hash(sent),
            "contrastive": helper.mean_terms().get("contrastive"), "loss": sum(losses) / len(losses), "mu": helper.mu,
        }  # fmt: skip
        with open(args.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        flare.send(flare.FLModel(params=sent, meta=helper.upload_meta(num_samples=len(y_all))))


if __name__ == "__main__":
    main()

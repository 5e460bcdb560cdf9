"""A Client API training script for the end-to-end tests, on tiny synthetic data: MOON through PTMoonHelper, or
SCAFFOLD through PTPersistentScaffoldHelper (``--method scaffold``).

Each training task appends one JSON line to ``--records``: the site, round and PID, the hashes of the state the helper
gave the round (MOON: the previous models; SCAFFOLD: the control c_i) and of what it kept for the next round (MOON: the
model sent; SCAFFOLD: c_i⁺), and MOON's mean contrastive term and the mean loss.
"""

import argparse
import hashlib
import json
import os
import zlib

import nvflare.client as flare
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvflare_moon.client import PTMoonHelper, PTPersistentScaffoldHelper


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
    parser.add_argument("--method", default="moon", choices=["moon", "scaffold"])
    args = parser.parse_args()
    moon = args.method == "moon"
    torch.set_num_threads(1)
    flare.init()
    site = flare.get_site_name()
    x_all, y_all = site_data(site)
    model = TinyNet()
    if moon:
        helper = PTMoonHelper(model, representation_fn=lambda net, x: net.encoder(x))
    else:
        helper = PTPersistentScaffoldHelper(model)
    while flare.is_running():
        input_model = flare.receive()
        model.load_state_dict(input_model.params)
        if not flare.is_train():
            flare.send(flare.FLModel(metrics={"accuracy": 0.0}))
            continue
        round_number = input_model.current_round
        if moon:
            helper.start_round(input_model)
            previous = [state_hash(m.state_dict()) for m in helper.previous_models]
        else:
            helper.start_round(input_model, lr=0.05)
            previous = [state_hash(helper.round.local_control)]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9 if moon else 0.0)
        shuffle = torch.Generator().manual_seed(zlib.crc32(f"{site}/{round_number}".encode()))
        order = torch.randperm(64, generator=shuffle)
        losses = []
        for epoch in range(2):
            for batch in order.split(16):
                x, y = x_all[batch], y_all[batch]
                z = model.encoder(x)
                loss = F.cross_entropy(model.classifier(z), y) + (helper.loss(x, z) if moon else 0.0)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if not moon:
                    helper.step()
                losses.append(float(loss))
        sent = model.state_dict()
        if moon:
            helper.save_local_model()
            meta, kept = helper.upload_meta(num_samples=len(y_all)), state_hash(sent)
        else:
            meta = {"num_samples": len(y_all), **helper.finish()}
            kept = state_hash(helper.round.local_control)
        record = {
            "site": site,
            "round": round_number,
            "pid": os.getpid(),
            "previous": previous,
            "sent": kept,
            "contrastive": helper.mean_terms().get("contrastive") if moon else None,
            "loss": sum(losses) / len(losses),
            "mu": helper.mu if moon else None,
        }
        with open(args.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        flare.send(flare.FLModel(params=sent, meta=meta))


if __name__ == "__main__":
    main()

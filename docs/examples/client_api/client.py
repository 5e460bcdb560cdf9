"""A plain NVFlare Client API training script of the hello-pt kind: FedAvg on CIFAR-10."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import nvflare.client as flare
from net import Net, evaluate, load_data, round_generator


def main():
    parser = argparse.ArgumentParser()
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
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    flare.init()
    site = flare.get_site_name()
    train_set, test_set = load_data(args.dataset, site, args.data_root, args.num_sites)
    test_loader = DataLoader(test_set, batch_size=256)
    model = Net()
    criterion = nn.CrossEntropyLoss()

    while flare.is_running():
        input_model = flare.receive()
        round_number = input_model.current_round
        model.load_state_dict(input_model.params)
        model.to(device)
        accuracy = evaluate(model, test_loader, device)
        if flare.is_evaluate():
            flare.send(flare.FLModel(metrics={"accuracy": accuracy}))
            continue
        if flare.is_submit_model():
            flare.send(flare.FLModel(params=model.cpu().state_dict()))
            continue

        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loader = DataLoader(
            train_set,
            batch_size=args.batch_size,
            shuffle=True,
            drop_last=True,
            generator=round_generator(args.seed, site, round_number),
        )
        model.train()
        for epoch in range(args.epochs):
            for images, labels in loader:
                images, labels = images.to(device), labels.to(device)
                outputs = model(images)
                loss = criterion(outputs, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        print(f"{site}: round {round_number}: global accuracy {accuracy:.4f}, last loss {loss.item():.4f}")
        flare.send(
            flare.FLModel(
                params=model.cpu().state_dict(), metrics={"accuracy": accuracy}, meta={"num_samples": len(train_set)}
            )
        )


if __name__ == "__main__":
    main()

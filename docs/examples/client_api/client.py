"""A plain NVFlare Client API training script of the hello-pt kind: FedAvg on CIFAR-10."""

import nvflare.client as flare
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from net import Net, evaluate, load_data, parse_script_args, round_generator


def main():
    args = parse_script_args()
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

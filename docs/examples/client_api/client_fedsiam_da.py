"""The plain script (client.py) turned into FedSiam-DA with PTFedSiamDAHelper: the lines marked `# FedSiam-DA`."""

import nvflare.client as flare
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from nvflare_moon.client import PTFedSiamDAHelper

from net import Net, evaluate, load_data, parse_script_args, round_generator


def main():
    args = parse_script_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    flare.init()
    site = flare.get_site_name()
    train_set, test_set = load_data(args.dataset, site, args.data_root, args.num_sites)
    test_loader = DataLoader(test_set, batch_size=256)
    model = Net(with_predictor=True)  # FedSiam-DA: the SimSiam predictor
    criterion = nn.CrossEntropyLoss()
    siam = PTFedSiamDAHelper(model, representation_fn=lambda net, x: net.features(x))  # FedSiam-DA

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
        siam.start_round(input_model, optimizer)  # FedSiam-DA: μ from the meta; working global copy; history model
        loader = DataLoader(
            train_set,
            batch_size=args.batch_size,
            shuffle=True,
            drop_last=True,
            generator=round_generator(args.seed, site, round_number),
        )
        model.train()
        for epoch in range(args.epochs):
            siam.start_epoch(epoch)  # FedSiam-DA: the previous epoch's model becomes the history model
            for images, labels in loader:
                images, labels = images.to(device), labels.to(device)
                z = model.features(images)  # FedSiam-DA: the representation...
                outputs = model.classifier(z)  # ... and the logits from it
                loss = criterion(outputs, labels) + siam.loss(images, z)  # FedSiam-DA
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                siam.step()  # FedSiam-DA: the working global copy steps with the optimizer
        siam.save_local_model()  # FedSiam-DA: next round's history model
        print(f"{site}: round {round_number}: global accuracy {accuracy:.4f}, last loss {loss.item():.4f}")
        print(f"{site}: round {round_number}: mean FedSiam-DA terms {siam.mean_terms()}")
        flare.send(
            flare.FLModel(
                params=model.cpu().state_dict(), metrics={"accuracy": accuracy}, meta={"num_samples": len(train_set)}
            )
        )


if __name__ == "__main__":
    main()

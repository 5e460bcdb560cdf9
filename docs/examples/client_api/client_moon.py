"""The plain script (client.py) turned into MOON with PTMoonHelper: the lines marked `# MOON`."""

import nvflare.client as flare
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from nvflare_moon.client import PTMoonHelper

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
    moon = PTMoonHelper(model, representation_fn=lambda net, x: net.features(x))  # MOON

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

        moon.start_round(input_model)  # MOON: μ, τ from the meta; frozen global model; previous local model
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
                z = model.features(images)  # MOON: the representation...
                outputs = model.classifier(z)  # ... and the logits from it
                loss = criterion(outputs, labels) + moon.loss(images, z)  # MOON
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        moon.save_local_model()  # MOON: next round's previous model
        print(f"{site}: round {round_number}: global accuracy {accuracy:.4f}, last loss {loss.item():.4f}")
        print(f"{site}: round {round_number}: mean MOON terms {moon.mean_terms()}")  # MOON: the log shows the term
        flare.send(
            flare.FLModel(
                params=model.cpu().state_dict(), metrics={"accuracy": accuracy}, meta={"num_samples": len(train_set)}
            )
        )


if __name__ == "__main__":
    main()

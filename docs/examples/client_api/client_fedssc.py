"""The plain script (client.py) turned into FedSSC with PTFedSSCHelper: the lines marked `# FedSSC`."""

import nvflare.client as flare
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from nvflare_moon.client import PTFedSSCHelper

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
    fedssc = PTFedSSCHelper(model, num_classes=10, representation_fn=lambda net, x: net.features(x))  # FedSSC

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

        fedssc.start_round(input_model)  # FedSSC: settings and shared prototypes from the meta; previous model
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
            if epoch == args.epochs - 1:
                fedssc.record_class_means()  # FedSSC: upload the class means of the last local epoch
            for images, labels in loader:
                images, labels = images.to(device), labels.to(device)
                z = model.features(images)  # FedSSC: the representation...
                outputs = model.classifier(z)  # ... and the logits from it
                loss = criterion(outputs, labels) + fedssc.loss(images, z, labels)  # FedSSC
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        fedssc.save_local_model()  # FedSSC: next round's previous model
        print(f"{site}: round {round_number}: global accuracy {accuracy:.4f}, last loss {loss.item():.4f}")
        print(f"{site}: round {round_number}: mean FedSSC terms {fedssc.mean_terms()}")
        flare.send(
            flare.FLModel(
                params=model.cpu().state_dict(),
                metrics={"accuracy": accuracy},
                meta=fedssc.upload_meta(len(train_set)),  # FedSSC: num_samples and the class means
            )
        )


if __name__ == "__main__":
    main()

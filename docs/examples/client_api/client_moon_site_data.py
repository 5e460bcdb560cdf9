"""client_moon.py on the site's own images: each site finds its folder, decodes it once and streams batches from it.

The folder is ``--site_path`` from the script's ``train_args`` (one per site with NVFlare's ``set_per_site_config``),
else ``/tmp/nvflare/site_data/<site name>``. It holds ``train/<class>/<image>`` (and optionally ``test/``), read with
nvflare_moon's data layer: the first process decodes every image into a uint8 copy beside them (memory-mapped by
every later one, so a restart per task costs seconds), and batches are read row by row from it. See
``docs/client_api_site_data.md``.
"""

import os

import nvflare.client as flare
import torch
import torch.nn as nn

from nvflare_moon.client import PTMoonHelper
from nvflare_moon.data import TensorBatchLoader
from nvflare_moon.data.site_data import SiteDataSettings, load_site_data

from net import Net, evaluate, parse_script_args, round_generator

DEFAULT_PARENT = "/tmp/nvflare/site_data"  # without --site_path, a site reads DEFAULT_PARENT/<its name>


def site_folder(site_path, site: str) -> str:
    """The site's image folder: ``site_path`` when its train_args give one, else one named after the site."""
    return site_path or os.path.join(DEFAULT_PARENT, site)


def main():
    args = parse_script_args(site_data=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    flare.init()
    site = flare.system_info()["site_name"]
    root = site_folder(args.site_path, site)
    class_names = tuple(args.class_names.split(","))
    settings = SiteDataSettings("image_folder", class_names=class_names, image_size=32, channels=3)  # Net's input
    # decoded once into <root>/.nvflare_moon_decoded/, or into the working folder where <root> is read-only
    data = load_site_data(settings, root, site, workspace_root=os.getcwd())
    counts = ", ".join(f"{n} {c}" for c, n in zip(class_names, data.class_counts(data.train_index)))
    print(f"{site}: {len(data.train_index)} training images ({counts}) from {root}; held out: {data.held_out}")
    if len(data.test_index) == 0:
        raise SystemExit(f"{site}: {root} leaves no image to measure accuracy on: add a test/ split or more images")
    test_loader = TensorBatchLoader(
        data.images, 256, settings.test_transform(), shuffle=False, drop_last=False, indices=data.test_index
    )
    model = Net(num_classes=len(class_names))
    criterion = nn.CrossEntropyLoss()
    moon = PTMoonHelper(model, representation_fn=lambda net, x: net.features(x))

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

        moon.start_round(input_model)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loader = TensorBatchLoader(  # the round's shuffle and augmentation, read from the copy batch by batch
            data.images,
            args.batch_size,
            settings.train_transform(),
            shuffle=True,
            drop_last=True,
            seed=round_generator(args.seed, site, round_number).initial_seed(),
            indices=data.train_index,
        )
        model.train()
        for epoch in range(args.epochs):
            for images, labels in loader:
                images, labels = images.to(device), labels.to(device)
                z = model.features(images)
                loss = criterion(model.classifier(z), labels) + moon.loss(images, z)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        moon.save_local_model()
        print(f"{site}: round {round_number}: global accuracy {accuracy:.4f}, mean MOON terms {moon.mean_terms()}")
        flare.send(
            flare.FLModel(
                params=model.cpu().state_dict(),
                metrics={"accuracy": accuracy},
                meta={"num_samples": len(data.train_index)},
            )
        )


if __name__ == "__main__":
    main()

"""A large site folder: decode time and peak memory of one site process, first start against cached start, and
training throughput from the memory-mapped uint8 copy against CIFAR-10 in memory (issue 25, item 3).

    python benchmarks/site_images.py [--images 20000] [--size 256] [--channels 3] [--classes 4] [--folder DIR]
                                     [--data-root .data] [--steps 20] [--repeats 3] [--threads 2]
                                     [--out docs/results/hospital_data/large_data.json] [--note TEXT]

1. Writes ``--images`` synthetic PNGs of ``--size`` px into ``<folder>/train/class_<k>/`` (deterministic: image i is a
   function of i alone; a smooth random field plus the class's brightness and noise). The writing is timed apart and
   skipped when the folder already holds the same set (``<folder>/generated.json``).
2. Removes the folder's decoded copies, then runs ``load_site_data`` in a fresh process twice: the first start decodes
   every file into ``<folder>/.nvflare_moon_decoded/<key>/images.u8``, the cached start only maps it. Each process
   reports the call's time, its high-water RSS and, at the end, its private (``RssAnon``) and file-backed
   (``RssFile``) resident memory. Between the two, the copy's file must stay the same one (no second decoding).
3. Streams one whole epoch of training batches (augmented, no network) in a fresh process: the peak RSS of a site
   that reads every image once.
4. Times SGD steps of the MOON paper's simple CNN, batch ``--batch-size``, interleaved ``--repeats`` times in one
   process (the best of each kept, as in ``throughput.py``), on three inputs: the folder at ``--size`` px, the same
   folder decoded at 32 px, and CIFAR-10 in memory (:class:`PartitionedSource`, one site holding all 50 000 images).
   Each is also timed without the network (batches only: the data path alone).

Which figure answers "is training from the memory-mapped copy slower than from memory": the folder at 32 px against
CIFAR-10, the same network on the same input size, where only the data path differs. The ``--size`` px figure adds
the network's cost on larger inputs (the simple CNN's first layers cost about (size/32)² as much): it tells how fast a
site trains on such images, not what the data path costs.

Peak RSS is the process's own high-water mark (``VmHWM``). It counts the mapped copy's pages once they are read: they
are file-backed page cache, shared by every process on the machine and dropped by the kernel under pressure, not
memory the process holds. ``RssAnon`` is the private part. The two goals of the issue are judged on the site
processes (first start, cached start, epoch stream): peak RSS below 1.5x the copy's size, and a cached
``load_site_data`` below 5 s (the process's whole time, interpreter and imports included, is reported beside it).
The page cache is warm in the cached start (the copy was just written), as on a machine that ran the site before.
"""

import argparse
import collections
import itertools
import json
import multiprocessing
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR_VERSION = 1  # bump when the synthetic images change
GOAL_RSS_RATIO, GOAL_CACHED_SECONDS = 1.5, 5.0
REFERENCE_SIZE = 32  # CIFAR's
WARM_UP_STEPS = 3
MB = 2**20


# ---- the synthetic folder ------------------------------------------------------------------------------------------


def class_names(classes: int) -> tuple:
    return tuple(f"class_{k}" for k in range(classes))


def synthetic_image(index: int, classes: int, size: int, channels: int):
    """Image ``index`` (class ``index % classes``): a smooth random field, the class's brightness and tint, noise."""
    from PIL import Image

    label = index % classes
    rng = np.random.default_rng([GENERATOR_VERSION, index])
    coarse = Image.fromarray(rng.uniform(0, 255, (8, 8)).astype(np.uint8), "L").resize((size, size), Image.BILINEAR)
    level = 40.0 + 150.0 * label / max(1, classes - 1) + 0.3 * (np.asarray(coarse, np.float64) - 128.0)
    level = level + rng.normal(0.0, 6.0, (size, size))
    if channels == 1:
        return Image.fromarray(np.clip(level, 0, 255).astype(np.uint8), "L")
    tint = np.array([1.0, 0.7 + 0.3 * label / max(1, classes - 1), 0.6])
    return Image.fromarray(np.clip(level[..., None] * tint, 0, 255).astype(np.uint8), "RGB")


def image_path(folder: str, index: int, classes: int) -> str:
    return os.path.join(folder, "train", f"class_{index % classes}", f"{index:06d}.png")


def _write_images(job) -> int:
    folder, indices, classes, size, channels = job
    for i in indices:
        synthetic_image(i, classes, size, channels).save(image_path(folder, i, classes), compress_level=1)
    return len(indices)


def generate_folder(folder: str, images: int, size: int, channels: int, classes: int, processes: int) -> dict:
    """Write the synthetic folder unless ``folder`` already holds this very set; ``{"seconds", "generated",
    "disk_bytes"}`` (seconds 0 when it was there)."""
    spec = dict(version=GENERATOR_VERSION, images=images, size=size, channels=channels, classes=classes)
    marker = os.path.join(folder, "generated.json")
    try:
        with open(marker) as f:
            if json.load(f) == spec and count_images(folder) == images:
                return dict(seconds=0.0, generated=False, disk_bytes=folder_bytes(os.path.join(folder, "train")))
    except (OSError, ValueError):
        pass
    started = time.perf_counter()
    partial = folder.rstrip(os.sep) + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    for name in class_names(classes):
        os.makedirs(os.path.join(partial, "train", name))
    chunks = [(partial, range(k, min(k + 200, images)), classes, size, channels) for k in range(0, images, 200)]
    if processes > 1:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            sum(pool.imap_unordered(_write_images, chunks))
    else:
        sum(map(_write_images, chunks))
    with open(os.path.join(partial, "generated.json"), "w") as f:
        json.dump(spec, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(partial, folder)
    return dict(
        seconds=time.perf_counter() - started, generated=True, disk_bytes=folder_bytes(os.path.join(folder, "train"))
    )


def count_images(folder: str) -> int:
    train = os.path.join(folder, "train")
    return sum(len([n for n in os.listdir(os.path.join(train, c)) if n.endswith(".png")]) for c in os.listdir(train))


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)


def decoded_copies(folder: str) -> list:
    """The decoded copies of ``folder`` (one per image size and channel count), staging folders left out."""
    from_cache = os.path.join(folder, ".nvflare_moon_decoded")
    return sorted(n for n in os.listdir(from_cache) if not n.startswith(".")) if os.path.isdir(from_cache) else []


# ---- the measured processes ------------------------------------------------------------------------------------------


def memory() -> dict:
    """This process's peak RSS (``VmHWM``; ``ru_maxrss`` beside it) and its private and file-backed RSS now."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return dict(
        peak_rss_bytes=fields["VmHWM"],
        ru_maxrss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        rss_anon_bytes=fields["RssAnon"],
        rss_file_bytes=fields["RssFile"],
    )


def site_settings(spec: dict, size: int):
    from nvflare_moon.data.site_data import SiteDataSettings

    return SiteDataSettings(
        "image_folder", class_names=class_names(spec["classes"]), image_size=size, channels=spec["channels"]
    )


def measure_start(spec: dict) -> dict:
    """One site process's start: ``load_site_data`` (decoding the folder if it has no copy for these settings)."""
    from nvflare_moon.data.site_data import load_site_data

    settings = site_settings(spec, spec["size"])
    started, cpu_started = time.perf_counter(), time.process_time()
    data = load_site_data(settings, spec["folder"], "site-1", spec["workspace"])
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    copy = os.path.join(data.decoded.folder, "images.u8")
    return dict(
        load_seconds=seconds,
        load_cpu_seconds=cpu_seconds,
        images=len(data.images),
        train_images=len(data.train_index),
        copy_folder=data.decoded.folder,
        cache_bytes=os.path.getsize(copy),
        copy_mtime_ns=os.stat(copy).st_mtime_ns,
        **memory(),
    )


def measure_stream(spec: dict) -> dict:
    """One whole epoch of augmented training batches from the mapped copy, no network."""
    import torch

    from nvflare_moon.data.sources import SiteImagesSource

    torch.set_num_threads(spec["threads"])
    source = SiteImagesSource(site_settings(spec, spec["size"]), spec["folder"], "site-1", spec["workspace"])
    started, cpu_started = time.perf_counter(), time.process_time()
    count = sum(len(y) for _, y in source.train_batches(spec["batch_size"], seed=0))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return dict(seconds=seconds, cpu_seconds=cpu_seconds, images=count, images_per_second=count / seconds, **memory())


def measure_training(spec: dict) -> dict:
    """Images/s of the data path alone and of full SGD steps, per input, the best of ``repeats`` interleaved."""
    import torch

    from nvflare_moon.core.objectives import CrossEntropyObjective
    from nvflare_moon.core.training import sgd, train_local
    from nvflare_moon.data.sources import PartitionedSource, SiteImagesSource
    from nvflare_moon.models import Network

    torch.set_num_threads(spec["threads"])
    cpu = torch.device("cpu")
    channels, classes = spec["channels"], spec["classes"]
    inputs = {}  # name -> (endless batches, network)
    for size in dict.fromkeys([REFERENCE_SIZE, spec["size"]]):
        source = SiteImagesSource(site_settings(spec, size), spec["folder"], "site-1", spec["workspace"])
        network = Network(arch="simple_cnn", num_classes=classes, in_channels=channels, image_size=size)
        inputs[f"site_{size}px"] = (source.train_batches(spec["batch_size"], seed=0), network)
    reference = spec["reference_dataset"]
    in_memory = PartitionedSource(reference, spec["data_root"], False, "site-1", 1, "iid", 0.5, 0)
    network = Network(arch="simple_cnn", num_classes=in_memory.num_classes)
    inputs[f"{reference}_in_memory"] = (in_memory.train_batches(spec["batch_size"], seed=0), network)

    def batches(loader):
        return itertools.chain.from_iterable(itertools.repeat(loader))

    def timed(run, *args) -> tuple:
        """(images per wall second, images per CPU second of this process) of ``run(*args)`` over ``steps`` batches."""
        started, cpu_started = time.perf_counter(), time.process_time()
        run(*args)
        images = spec["steps"] * spec["batch_size"]
        return images / (time.perf_counter() - started), images / (time.process_time() - cpu_started)

    figures = ("loader", "loader_cpu", "train", "train_cpu")
    best = {name: dict.fromkeys(figures, 0.0) for name in inputs}
    optimizers = {name: sgd(net, 0.01, 0.9, 1e-5) for name, (_, net) in inputs.items()}
    objective = CrossEntropyObjective()
    for name, (loader, net) in inputs.items():
        train_local(net, itertools.islice(batches(loader), WARM_UP_STEPS), objective, optimizers[name], 1, cpu)
    for _ in range(spec["repeats"]):
        for name, (loader, net) in inputs.items():
            read = timed(collections.deque, itertools.islice(batches(loader), spec["steps"]), 0)
            steps = itertools.islice(batches(loader), spec["steps"])
            train = timed(train_local, net, steps, objective, optimizers[name], 1, cpu)
            for figure, value in zip(figures, read + train):
                best[name][figure] = max(best[name][figure], value)
    return dict(images_per_second=best, reference_images=in_memory.num_samples, **memory())


MEASUREMENTS = {"start": measure_start, "stream": measure_stream, "train": measure_training}


def run_child(kind: str, spec: dict) -> dict:
    """Run measurement ``kind`` in a fresh Python process; its figures plus ``process_seconds`` (start to exit)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {kind} measurement failed:\n{done.stdout[-3000:]}")
    return dict(json.loads(lines[-1][len("RESULT ") :]), process_seconds=seconds)


# ---- the driver ------------------------------------------------------------------------------------------------------


def run_benchmark(args) -> dict:
    """Every measurement of the module docstring; the record (also written to ``args.out`` when given)."""
    folder = args.folder or os.path.join(
        tempfile.gettempdir(), "nvflare_moon_large_data", f"{args.images}x{args.size}px-{args.channels}ch"
    )
    from nvflare_moon.benchmark.runner import environment  # here, as the other imports: the children time theirs

    record = dict(
        command=shlex.join(["python", os.path.relpath(os.path.abspath(__file__), os.getcwd()), *args.argv]),
        environment=environment(),  # the benchmark's own: date, commit, machine, scheduling
        load_average_before=os.getloadavg(),
        note=args.note,
        settings=dict(
            images=args.images,
            size=args.size,
            channels=args.channels,
            classes=args.classes,
            batch_size=args.batch_size,
            steps=args.steps,
            repeats=args.repeats,
            threads=args.threads,
            reference_dataset=args.reference_dataset,
            folder=folder,
        ),
    )
    record["generation"] = generate_folder(
        folder, args.images, args.size, args.channels, args.classes, processes=os.cpu_count() or 1
    )
    shutil.rmtree(os.path.join(folder, ".nvflare_moon_decoded"), ignore_errors=True)
    workspace = tempfile.mkdtemp(prefix="nvflare_moon_large_data_ws_")
    spec = dict(record["settings"], workspace=workspace, data_root=args.data_root)  # what each child process reads
    try:
        first = run_child("start", spec)
        cached = run_child("start", spec)
        record["copies_after_cached_start"] = len(decoded_copies(folder))
        record["cached_start_decoded_again"] = cached["copy_mtime_ns"] != first["copy_mtime_ns"]
        record["starts"] = {"first": first, "cached": cached}
        if args.size != REFERENCE_SIZE:
            record["starts"][f"first_{REFERENCE_SIZE}px"] = run_child("start", dict(spec, size=REFERENCE_SIZE))
        record["epoch_stream"] = run_child("stream", spec)
        record["training"] = run_child("train", spec)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    record["load_average_after"] = os.getloadavg()
    record["cache_bytes"] = cache = first["cache_bytes"]
    site_peaks = {
        "first start": first["peak_rss_bytes"],
        "cached start": cached["peak_rss_bytes"],
        "epoch stream": record["epoch_stream"]["peak_rss_bytes"],
    }
    worst = max(site_peaks, key=site_peaks.get)
    record["goals"] = dict(
        peak_rss_below_1_5x_cache=site_peaks[worst] < GOAL_RSS_RATIO * cache,
        peak_rss_ratio=site_peaks[worst] / cache,
        peak_rss_process=worst,
        cached_start_below_5_s=cached["load_seconds"] < GOAL_CACHED_SECONDS,
        cached_start_seconds=cached["load_seconds"],
    )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return record


def print_record(record: dict) -> None:
    s, gen, cache = record["settings"], record["generation"], record["cache_bytes"]
    made = f"written in {gen['seconds']:.0f} s, not counted" if gen["generated"] else "already there"
    print(
        f"{s['images']} synthetic PNGs, {s['size']} px, {s['channels']} channel(s), {s['classes']} classes: "
        f"{gen['disk_bytes'] / MB:.0f} MB on disk ({made}); decoded uint8 copy {cache / MB:.0f} MB"
    )
    print(
        f"{'site process':<24}{'wall s':>8}{'CPU s':>8}{'process s':>11}{'peak RSS MB':>13}{'x copy':>8}"
        f"{'anon MB':>9}{'file MB':>9}"
    )
    rows = [
        (f"{name.replace('_', ' ')} start", r, r["load_seconds"], r["load_cpu_seconds"])
        for name, r in record["starts"].items()
    ]
    stream = record["epoch_stream"]
    rows.append(("epoch stream (batches)", stream, stream["seconds"], stream["cpu_seconds"]))
    for name, r, seconds, cpu_seconds in rows:
        print(
            f"{name:<24}{seconds:>8.2f}{cpu_seconds:>8.2f}{r['process_seconds']:>11.1f}{r['peak_rss_bytes'] / MB:>13.0f}"
            f"{r['peak_rss_bytes'] / cache:>8.2f}{r['rss_anon_bytes'] / MB:>9.0f}{r['rss_file_bytes'] / MB:>9.0f}"
        )
    print("(wall s / CPU s: the load_site_data call, or the epoch; process s: the whole process, imports included;")
    print(" anon / file: private and file-backed resident memory at the end)")
    training = record["training"]["images_per_second"]
    reference = next(name for name in training if name.endswith("_in_memory"))
    print(
        f"\nsimple CNN, batch {s['batch_size']}, {s['threads']} threads, best of {s['repeats']} x {s['steps']} steps; "
        f"img/s per wall second (per CPU second of the process)"
    )
    print(f"{'input':<22}{'batches only':>20}{'SGD steps':>18}{'vs ' + reference:>30}")
    for name, f in training.items():
        ratio, cpu_ratio = f["train"] / training[reference]["train"], f["train_cpu"] / training[reference]["train_cpu"]
        print(
            f"{name:<22}{f['loader']:>10.0f} ({f['loader_cpu']:>6.0f}){f['train']:>10.0f} ({f['train_cpu']:>5.0f})"
            f"{ratio:>21.2f}x ({cpu_ratio:.2f}x)"
        )
    goals = record["goals"]
    print(
        f"\ngoals: peak RSS < {GOAL_RSS_RATIO}x the copy: {'met' if goals['peak_rss_below_1_5x_cache'] else 'NOT met'} "
        f"({goals['peak_rss_ratio']:.2f}x, {goals['peak_rss_process']}); cached start < {GOAL_CACHED_SECONDS:.0f} s: "
        f"{'met' if goals['cached_start_below_5_s'] else 'NOT met'} ({goals['cached_start_seconds']:.2f} s)"
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256, help="image side in px (written and decoded)")
    parser.add_argument("--channels", type=int, default=3, choices=[1, 3], help="3: RGB PNGs; 1: grayscale")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--folder", help="where the PNGs go (default: a folder per setting under the temp dir)")
    parser.add_argument(
        "--data-root", default=None, help="folder with cifar-10-batches-py/ (default: $NVFLARE_MOON_DATA)"
    )
    parser.add_argument("--reference-dataset", default="cifar10", help="the in-memory dataset compared against")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed SGD steps per input and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of the measured processes")
    parser.add_argument("--out", help="write the record (JSON) here")
    parser.add_argument("--note", default="", help="stored in the record, e.g. what else the machine ran")
    args = parser.parse_args(argv)
    args.argv = list(argv)
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print("RESULT " + json.dumps(MEASUREMENTS[argv[1]](json.loads(argv[2]))))
        return
    print_record(run_benchmark(parse_args(argv)))


if __name__ == "__main__":
    main()

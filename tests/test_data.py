"""Tests for nvflare_moon.data: partitions (MOON reference check values), datasets, batched transforms, loader."""

from __future__ import annotations

import gzip
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nvflare_moon import data as D
from nvflare_moon.data import partition as P
from nvflare_moon.data import transforms as T
from nvflare_moon.data.datasets import make_synthetic

# the 50,000 CIFAR-10 training labels in the official data_batch_1..5 order (they come with the dataset)
TRAIN_LABELS = Path(__file__).resolve().parent / "data" / "cifar10_train_labels.txt.gz"
CIFAR_ROOT = Path(D.resolve_data_root(None))  # where the loader looks: $NVFLARE_MOON_DATA or ~/.cache/nvflare_moon/data

SIZES = [5307, 3688, 4435, 5047, 5189, 3803, 5202, 4325, 8078, 4926]
BATCHES = [82, 57, 69, 78, 81, 59, 81, 67, 126, 76]
PARTY0_COUNTS = [953, 142, 141, 75, 695, 819, 0, 2482, 0, 0]


@pytest.fixture(scope="module")
def cifar_labels() -> np.ndarray:
    y = np.array(gzip.decompress(TRAIN_LABELS.read_bytes()).split(), dtype=np.int64)
    assert y.shape == (50000,)
    return y


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    D.clear_dataset_cache()
    yield
    D.clear_dataset_cache()


# ---------------------------------------------------------------------------------------------------------------------
# partition


def test_dirichlet_matches_moon_reference_check_values(cifar_labels):
    parts = D.dirichlet_partition(cifar_labels, 10, 0.5, 0)
    assert [len(p) for p in parts] == SIZES
    assert [len(p) // 64 for p in parts] == BATCHES
    assert np.bincount(cifar_labels[parts[0]], minlength=10).tolist() == PARTY0_COUNTS
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(50000))  # disjoint and complete
    assert all(p.dtype == np.int64 for p in parts)
    # each party's list is shuffled at the end (not grouped by class)
    assert not np.all(np.diff(cifar_labels[parts[0]]) >= 0)
    # partition_indices dispatches to the same thing
    for a, b in zip(D.partition_indices(cifar_labels, 10, "dirichlet", 0.5, 0), parts):
        assert np.array_equal(a, b)


def test_dirichlet_restores_global_rng_and_is_reproducible(cifar_labels):
    np.random.seed(123)
    expected = np.random.rand(3)
    np.random.seed(123)
    a = D.dirichlet_partition(cifar_labels, 10, 0.5, 0)
    assert np.array_equal(np.random.rand(3), expected)
    b = D.dirichlet_partition(cifar_labels, 10, 0.5, 0)
    c = D.dirichlet_partition(cifar_labels, 10, 0.5, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [len(x) for x in c] != SIZES


def test_dirichlet_min_size_and_skew():
    y = np.repeat(np.arange(10), 60)
    for seed in range(5):
        parts = D.dirichlet_partition(y, 3, 0.5, seed, min_size=10)
        assert min(len(p) for p in parts) >= 10
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(600))
    # large beta -> nearly uniform class mix; small beta -> skewed
    frac = lambda parts: max(np.bincount(y[p], minlength=10).max() / len(p) for p in parts)  # noqa: E731
    assert frac(D.dirichlet_partition(y, 3, 1000.0, 0)) < 0.2
    assert frac(D.dirichlet_partition(y, 3, 0.05, 0, min_size=1)) > 0.3


def test_dirichlet_stops_giving_to_a_party_that_holds_its_share(monkeypatch):
    # 8 samples, 2 parties: a share is 8 / 2 = 4. Class 0 (4 samples) all goes to party 0, which then holds its
    # share, so class 1 goes wholly to party 1 whatever its own draw says (the reference's ``len(idx_j) < N / n``).
    draws = iter([np.array([1.0, 0.0]), np.array([0.5, 0.5])])
    monkeypatch.setattr(np.random, "dirichlet", lambda alpha: next(draws))
    labels = np.array([0, 1] * 4)
    parts = D.dirichlet_partition(labels, 2, 0.5, 0, min_size=1)
    assert [sorted(labels[p].tolist()) for p in parts] == [[0, 0, 0, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(num_parties=0), "num_parties"),
        (dict(beta=0.0), "beta"),
        (dict(beta=float("nan")), "beta"),
        (dict(min_size=201), "min_size"),
        (dict(min_size=-1), "min_size"),
    ],
)
def test_dirichlet_argument_errors(kwargs, word):
    args = dict(labels=np.repeat(np.arange(10), 60), num_parties=3, beta=0.5, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word):
        D.dirichlet_partition(**args)


def test_dirichlet_unreachable_min_size_stops(monkeypatch):
    # 600 samples, 3 parties, min_size 200 needs an exact 200/200/200 split: the reference would loop (nearly) forever
    monkeypatch.setattr(P, "MAX_DIRICHLET_TRIES", 5)
    with pytest.raises(ValueError, match=r"min_size=200 .*5 tries"):
        D.dirichlet_partition(np.repeat(np.arange(10), 60), 3, 0.5, 0, min_size=200)


def test_dirichlet_label_errors():
    with pytest.raises(ValueError, match="labels"):
        D.dirichlet_partition(np.array([0.5, 1.0]), 2, 0.5, 0, min_size=0)
    with pytest.raises(ValueError, match="labels"):
        D.dirichlet_partition(np.zeros((3, 3), dtype=int), 2, 0.5, 0, min_size=0)


def test_iid_partition_matches_reference():
    parts = D.iid_partition(1003, 10, 7)
    np.random.seed(7)
    ref = np.array_split(np.random.permutation(1003), 10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, ref))
    assert sorted(len(p) for p in parts) == [100] * 7 + [101] * 3
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1003))
    via = D.partition_indices(np.zeros(1003, dtype=np.int64), 10, "iid", seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, via))
    with pytest.raises(ValueError, match="num_parties"):
        D.iid_partition(5, 6, 0)


def test_partition_indices_unknown_method():
    with pytest.raises(ValueError, match=r"method.*dirichlet.*iid"):
        D.partition_indices(np.zeros(10, dtype=np.int64), 2, "pathological")


def test_site_index_mapping_and_errors():
    assert D.site_index("site-1", 10) == 0
    assert D.site_index("site-10", 10) == 9
    assert D.site_index("hospital_3", 3) == 2
    assert D.site_index("my-org-site-2", 2) == 1
    for bad in ("server", "site-0", "site-11", "site1x", ""):
        with pytest.raises(ValueError) as e:
            D.site_index(bad, 10)
        msg = str(e.value)
        assert "site-1" in msg and "site-10" in msg and repr(bad) in msg
    with pytest.raises(ValueError, match=r"num_sites.*-n"):
        D.site_index("site-4", 3)
    with pytest.raises(ValueError, match="num_sites"):
        D.site_index("site-1", 0)


# ---------------------------------------------------------------------------------------------------------------------
# ImageArrays / synthetic / memoisation / site shards


def test_image_arrays_validation_and_subset():
    imgs = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 3, 2, 2).contiguous()
    a = D.ImageArrays(imgs, torch.arange(5))
    assert len(a) == 5
    s = a.subset(np.array([4, 0, 2]))
    assert s.labels.tolist() == [4, 0, 2] and s.images[:, 0, 0, 0].tolist() == [4, 0, 2]
    assert a.subset(torch.tensor([1])).labels.tolist() == [1]
    with pytest.raises(ValueError, match="images"):
        D.ImageArrays(imgs.float(), torch.arange(5))
    with pytest.raises(ValueError, match="labels"):
        D.ImageArrays(imgs, torch.arange(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="same length"):
        D.ImageArrays(imgs, torch.arange(4))


def test_synthetic_dataset_properties():
    s = D.load_dataset("synthetic", "/nonexistent/ignored")
    assert s.name == "synthetic" and s.num_classes == 10
    assert s.train.images.shape == (600, 3, 32, 32) and s.train.images.dtype == torch.uint8
    assert s.test.images.shape == (200, 3, 32, 32) and s.test.labels.dtype == torch.int64
    assert torch.bincount(s.train.labels, minlength=10).tolist() == [60] * 10
    assert torch.bincount(s.test.labels, minlength=10).tolist() == [20] * 10
    again = make_synthetic()
    assert torch.equal(again.train.images, s.train.images) and torch.equal(again.test.labels, s.test.labels)
    # memoised: same object, data_root ignored
    assert D.load_dataset("synthetic", "elsewhere") is s
    for seed in range(5):
        parts = D.partition_indices(s.train.labels.numpy(), 3, "dirichlet", 0.5, seed)
        assert min(len(p) for p in parts) >= 10


def test_synthetic_is_learnable():
    torch.manual_seed(0)
    s = D.load_dataset("synthetic", "")
    net = nn.Sequential(
        nn.Conv2d(3, 6, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, 10),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
    train = D.TensorBatchLoader(s.train, 64, D.train_transform("synthetic"), shuffle=True, drop_last=True, seed=0)
    for _ in range(6):
        for x, y in train:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
    x = D.test_transform("synthetic")(s.test.images)
    with torch.no_grad():
        acc = (net(x).argmax(1) == s.test.labels).float().mean().item()
    assert acc > 0.3, acc  # chance is 0.1


def test_site_train_arrays_shards_and_memoisation():
    s = D.load_dataset("synthetic", "")
    shards = [D.site_train_arrays(s, f"site-{k}", 3) for k in (1, 2, 3)]
    parts = D.partition_indices(s.train.labels.numpy(), 3, "dirichlet", 0.5, 0)
    for shard, idx in zip(shards, parts):
        assert torch.equal(shard.labels, s.train.labels[torch.as_tensor(idx)])
        assert torch.equal(shard.images, s.train.images[torch.as_tensor(idx)])
    assert sum(len(x) for x in shards) == 600
    assert D.site_partition(s, 3) is D.site_partition(s, 3)
    iid = D.site_train_arrays(s, "site-2", 3, partition="iid", seed=0)
    assert len(iid) == 200
    # a different dataset with the same name does not reuse the memoised partition
    other = D.DatasetSplits("synthetic", s.train.subset(np.arange(300)), s.test, 10)
    assert sum(len(D.site_train_arrays(other, f"site-{k}", 3)) for k in (1, 2, 3)) == 300
    with pytest.raises(ValueError, match="site-1"):
        D.site_train_arrays(s, "site-4", 3)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match=r"dataset.*cifar10.*tinyimagenet"):
        D.load_dataset("mnist", "/tmp")
    with pytest.raises(ValueError, match="dataset"):
        D.train_transform("mnist")


# ---------------------------------------------------------------------------------------------------------------------
# CIFAR pickles


def _write_cifar(root: Path, name: str = "cifar10", n_per_batch: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A tiny CIFAR folder in the official layout; returns (train rows [N, 3072], train labels)."""
    rng = np.random.default_rng(0)
    if name == "cifar10":
        folder, train_files, test_files = (
            root / "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)],
            ["test_batch"],
        )
        key, meta, meta_obj = "labels", "batches.meta", {"label_names": [f"c{k}" for k in range(10)]}
        k = 10
    else:
        folder, train_files, test_files = root / "cifar-100-python", ["train"], ["test"]
        key, meta, meta_obj = "fine_labels", "meta", {"fine_label_names": [f"f{k}" for k in range(100)]}
        k = 100
    folder.mkdir(parents=True)
    rows_all, labels_all = [], []
    for f in train_files + test_files:
        rows = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, k, n_per_batch).tolist()
        with open(folder / f, "wb") as fh:
            pickle.dump({"data": rows, key: labels}, fh)
        if f in train_files:
            rows_all.append(rows)
            labels_all += labels
    with open(folder / meta, "wb") as fh:
        pickle.dump(meta_obj, fh)
    return np.concatenate(rows_all), np.array(labels_all)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_reader_layout(tmp_path, name):
    rows, labels = _write_cifar(tmp_path, name)
    s = D.load_dataset(name, str(tmp_path))
    n = len(labels)
    assert s.train.images.shape == (n, 3, 32, 32) and s.train.images.dtype == torch.uint8
    assert s.train.labels.tolist() == labels.tolist()
    # row layout: 1024 R, then 1024 G, then 1024 B values, each row-major
    assert s.train.images[1, 0, 0, 5].item() == rows[1, 5]
    assert s.train.images[1, 1, 2, 3].item() == rows[1, 1024 + 2 * 32 + 3]
    assert s.train.images[n - 1, 2, 31, 31].item() == rows[n - 1, 3071]
    assert len(s.test) == 4
    assert s.num_classes == (10 if name == "cifar10" else 100)
    assert s.class_names[0] == ("c0" if name == "cifar10" else "f0")
    assert D.load_dataset(name, str(tmp_path) + "/") is s  # memoised per absolute path
    # data_root may also be the batches folder itself
    D.clear_dataset_cache()
    inner = D.load_dataset(name, str(next(tmp_path.iterdir())))
    assert torch.equal(inner.train.images, s.train.images)


def test_cifar_is_decoded_once_then_mapped_and_decoded_again_when_the_files_change(tmp_path, monkeypatch):
    from nvflare_moon.data import datasets, decoded_cache

    rows, labels = _write_cifar(tmp_path)
    first = D.load_dataset("cifar10", str(tmp_path))
    copies = sorted(p.name for p in (tmp_path / "cifar-10-batches-py" / decoded_cache.CACHE_FOLDER).iterdir())
    assert [c.rsplit("-", 1)[0] for c in copies] == ["cifar10-data_batch_1", "cifar10-test_batch"]

    decoded = []
    real_decode = datasets._decode_cifar_batches
    monkeypatch.setattr(datasets, "_decode_cifar_batches", lambda *a: decoded.append(a[1]) or real_decode(*a))
    D.clear_dataset_cache()  # a new process
    mapped = D.load_dataset("cifar10", str(tmp_path))
    assert decoded == [] and mapped is not first
    assert torch.equal(mapped.train.images, first.train.images) and torch.equal(mapped.test.labels, first.test.labels)
    assert mapped.train.images[1, 1, 2, 3].item() == rows[1, 1024 + 2 * 32 + 3]

    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"  # the dataset is rebuilt: never read a stale copy
    with open(batch, "rb") as f:
        content = pickle.load(f)
    content["data"] = 255 - content["data"]
    with open(batch, "wb") as f:
        pickle.dump(content, f)
    D.clear_dataset_cache()
    rebuilt = D.load_dataset("cifar10", str(tmp_path))
    assert len(decoded) == 1 and not torch.equal(rebuilt.train.images, first.train.images)


def test_cifar_in_a_folder_that_cannot_be_written_is_decoded_every_time(tmp_path, monkeypatch):
    from nvflare_moon.data import decoded_cache

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    _write_cifar(tmp_path)
    monkeypatch.setattr(decoded_cache.tempfile, "mkdtemp", read_only)
    splits = D.load_dataset("cifar10", str(tmp_path))
    assert len(splits.train) == 20
    assert not list((tmp_path / "cifar-10-batches-py").glob(f"{decoded_cache.CACHE_FOLDER}/*"))  # no copy, no error


def test_cifar_missing_folder_error(tmp_path):
    with pytest.raises(D.DatasetNotFoundError) as e:
        D.load_dataset("cifar10", str(tmp_path))
    msg = str(e.value)
    assert str(tmp_path / "cifar-10-batches-py") in msg and "download" in msg and "cifar10" in msg
    assert isinstance(e.value, FileNotFoundError)


def test_cifar_incomplete_folder_error(tmp_path):
    _write_cifar(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_4")
    with pytest.raises(D.DatasetNotFoundError, match="data_batch_4"):
        D.load_dataset("cifar10", str(tmp_path))


def test_cifar_corrupt_pickle_error(tmp_path):
    _write_cifar(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    bad.write_bytes(b"this is not a pickle")
    with pytest.raises(D.DatasetNotFoundError) as e:
        D.load_dataset("cifar10", str(tmp_path))
    assert str(bad) in str(e.value) and isinstance(e.value.__cause__, Exception)
    with open(bad, "wb") as fh:  # a pickle, but not a batch
        pickle.dump({"data": np.zeros(10, dtype=np.uint8), "labels": [0]}, fh)
    with pytest.raises(D.DatasetNotFoundError, match="data_batch_3"):
        D.load_dataset("cifar10", str(tmp_path))


def test_cifar_download_uses_torchvision(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    calls = []

    def fake_cifar10(root, train, download):
        calls.append((root, train, download))
        _write_cifar(Path(root))

    monkeypatch.setattr(tvd, "CIFAR10", fake_cifar10)
    s = D.load_dataset("cifar10", str(tmp_path), download=True)
    assert calls == [(str(tmp_path), True, True)] and len(s.train) == 20

    def failing(root, train, download):
        raise RuntimeError("no network")

    monkeypatch.setattr(tvd, "CIFAR10", failing)
    with pytest.raises(D.DatasetNotFoundError, match="no network"):
        D.load_dataset("cifar10", str(tmp_path / "empty"), download=True)


def test_real_cifar10(cifar_labels):
    if not (CIFAR_ROOT / "cifar-10-batches-py").is_dir():
        pytest.skip(
            f"needs the CIFAR-10 images at {CIFAR_ROOT}/cifar-10-batches-py "
            "(see 'The data' in the README; offline: docs/notebook.md)"
        )
    s = D.load_dataset("cifar10", str(CIFAR_ROOT))
    assert s.train.images.shape == (50000, 3, 32, 32) and s.test.images.shape == (10000, 3, 32, 32)
    assert np.array_equal(s.train.labels.numpy(), cifar_labels)
    assert torch.bincount(s.test.labels).tolist() == [1000] * 10
    assert s.class_names[:2] == ("airplane", "automobile")
    mean = s.train.images[:5000].float().mean(dim=(0, 2, 3)) / 255
    assert torch.allclose(mean, torch.tensor([0.4913, 0.4821, 0.4465]), atol=0.01)
    assert D.load_dataset("cifar10", str(CIFAR_ROOT)) is s
    shard = D.site_train_arrays(s, "site-1", 10)
    assert len(shard) == SIZES[0] and torch.bincount(shard.labels, minlength=10).tolist() == PARTY0_COUNTS
    assert [
        len(
            D.TensorBatchLoader(
                D.site_train_arrays(s, f"site-{k + 1}", 10),
                64,
                D.train_transform("cifar10"),
                shuffle=True,
                drop_last=True,
            )
        )
        for k in range(10)
    ] == BATCHES


# ---------------------------------------------------------------------------------------------------------------------
# Tiny-ImageNet and image folders


def _save(path: Path, color, size=(64, 64), mode="RGB"):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)


def _red(k: int) -> int:
    return 30 + 60 * k


def _write_tiny(root: Path) -> None:
    base = root / "tiny-imagenet-200"
    wnids = ["n03", "n01", "n02"]  # deliberately unsorted on creation; class order must be sorted: n01, n02, n03
    order = sorted(wnids)
    for w in wnids:
        k = order.index(w)
        for i in range(2):
            _save(base / "train" / w / "images" / f"{w}_{i}.JPEG", (_red(k), 100, 200))
        (base / "train" / w / f"{w}_boxes.txt").write_text("")
    # odd images: grayscale and wrong size
    _save(base / "train" / "n01" / "images" / "n01_gray.JPEG", 128, mode="L")
    _save(base / "train" / "n02" / "images" / "n02_small.JPEG", (_red(1), 100, 200), size=(50, 40))
    ann = []
    for i, w in enumerate(["n02", "n03", "n01", "n02"]):
        _save(base / "val" / "images" / f"val_{i}.JPEG", (_red(order.index(w)), 100, 200))
        ann.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")


def test_tinyimagenet_loader_labels_and_cache(tmp_path):
    _write_tiny(tmp_path)
    s = D.load_dataset("tinyimagenet", str(tmp_path))
    assert s.class_names == ("n01", "n02", "n03") and s.num_classes == 3
    assert s.train.images.shape == (8, 3, 64, 64) and s.train.images.dtype == torch.uint8
    assert s.train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert s.test.labels.tolist() == [1, 2, 0, 1]  # from val_annotations.txt
    # pixels agree with labels (red channel encodes the class; JPEG is lossy, so approximately)
    for arrays in (s.train, s.test):
        for img, k in zip(arrays.images, arrays.labels.tolist()):
            r, g = img[0].float().mean().item(), img[1].float().mean().item()
            if abs(g - 100) < 5:
                assert abs(r - _red(k)) < 6
    gray = s.train.images[2]  # n01_0, n01_1, n01_gray
    assert torch.equal(gray[0], gray[1]) and abs(gray.float().mean().item() - 128) < 3
    cache = tmp_path / "tiny-imagenet-200" / "decoded_uint8.pt"
    assert cache.is_file() and not list(cache.parent.glob("*.tmp*"))
    # a later process start reads the cache, even without the source images
    import shutil

    shutil.rmtree(tmp_path / "tiny-imagenet-200" / "train")
    D.clear_dataset_cache()
    again = D.load_dataset("tinyimagenet", str(tmp_path))
    assert torch.equal(again.train.images, s.train.images) and torch.equal(again.test.labels, s.test.labels)
    # a corrupt cache with no source left is a clear error
    cache.write_bytes(b"garbage")
    D.clear_dataset_cache()
    with pytest.warns(UserWarning, match="cache"), pytest.raises(D.DatasetNotFoundError, match="tiny-imagenet-200"):
        D.load_dataset("tinyimagenet", str(tmp_path))


def test_tinyimagenet_corrupt_cache_is_rebuilt(tmp_path):
    _write_tiny(tmp_path)
    (tmp_path / "tiny-imagenet-200" / "decoded_uint8.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="cache"):
        s = D.load_dataset("tinyimagenet", str(tmp_path))
    assert len(s.train) == 8
    obj = torch.load(tmp_path / "tiny-imagenet-200" / "decoded_uint8.pt", weights_only=True)
    assert torch.equal(obj["train_images"], s.train.images)


def test_tinyimagenet_missing(tmp_path):
    with pytest.raises(D.DatasetNotFoundError) as e:
        D.load_dataset("tinyimagenet", str(tmp_path), download=True)
    msg = str(e.value)
    assert str(tmp_path / "tiny-imagenet-200") in msg and "download" in msg and "val_annotations.txt" in msg


def test_load_image_folder(tmp_path):
    _save(tmp_path / "imgs" / "dog" / "b.jpg", (0, 0, 250), size=(20, 40))
    _save(tmp_path / "imgs" / "cat" / "a.png", (10, 200, 30), size=(40, 20))
    _save(tmp_path / "imgs" / "cat" / "c.png", 77, mode="L")
    (tmp_path / "imgs" / "cat" / "notes.txt").write_text("ignored")
    arrays, classes = D.load_image_folder(str(tmp_path / "imgs"), image_size=16)
    assert classes == ["cat", "dog"]
    assert arrays.images.shape == (3, 3, 16, 16) and arrays.images.dtype == torch.uint8
    assert arrays.labels.tolist() == [0, 0, 1]
    assert arrays.images[0, :, 8, 8].tolist() == [10, 200, 30]
    assert arrays.images[1, :, 8, 8].tolist() == [77, 77, 77]
    with pytest.raises(D.DatasetNotFoundError, match="missing"):
        D.load_image_folder(str(tmp_path / "missing"))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(D.DatasetNotFoundError, match="empty"):
        D.load_image_folder(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="image_size"):
        D.load_image_folder(str(tmp_path / "imgs"), image_size=0)


# ---------------------------------------------------------------------------------------------------------------------
# transforms


def _windows(padded, offsets, flips):
    h, w = padded.shape[-2] - 8, padded.shape[-1] - 8
    out = []
    for img, (i, j), f in zip(padded, offsets.tolist(), flips.tolist()):
        win = img[:, i : i + h, j : j + w]
        out.append(win.flip(-1) if f else win)
    return torch.stack(out)


@pytest.mark.parametrize("name, mode", [("cifar10", "reflect"), ("cifar100", "constant"), ("synthetic", "reflect")])
def test_crop_flip_equals_window_of_padded_input(name, mode):
    t = D.train_transform(name)
    assert t.pad == 4 and t.pad_mode == mode and t.flip
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=g)
    offsets = torch.randint(0, 9, (40, 2), generator=g)
    offsets[0] = torch.tensor([0, 0])
    offsets[1] = torch.tensor([8, 8])
    offsets[2] = torch.tensor([0, 8])
    flips = torch.rand(40, generator=g) < 0.5
    padded = F.pad(x.float(), (4, 4, 4, 4), mode=mode).to(torch.uint8)
    assert torch.equal(t.crop_flip(x, offsets, flips), _windows(padded, offsets, flips))
    # centre window without flip is the identity; flip alone mirrors
    centre = torch.full((40, 2), 4)
    assert torch.equal(t.crop_flip(x, centre, torch.zeros(40, dtype=torch.bool)), x)
    assert torch.equal(t.crop_flip(x, centre, torch.ones(40, dtype=torch.bool)), x.flip(-1))


def test_crop_flip_non_square():
    t = T.BatchTransform((0.5,), (0.5,), pad=2, pad_mode="reflect", flip=True)
    x = torch.randint(0, 256, (6, 1, 5, 7), dtype=torch.uint8)
    offsets = torch.tensor([[0, 0], [4, 4], [1, 3], [2, 0], [0, 4], [3, 1]])
    flips = torch.tensor([False, True, True, False, True, False])
    padded = F.pad(x.float(), (2, 2, 2, 2), mode="reflect").to(torch.uint8)
    expect = torch.stack(
        [
            (lambda wnd, f: wnd.flip(-1) if f else wnd)(padded[b, :, i : i + 5, j : j + 7], flips[b])
            for b, (i, j) in enumerate(offsets.tolist())
        ]
    )
    assert torch.equal(t.crop_flip(x, offsets, flips), expect)


def test_normalisation_values():
    x = torch.tensor([0, 128, 255], dtype=torch.uint8).view(3, 1, 1, 1).expand(3, 3, 2, 2).contiguous()
    for name in ("cifar10", "cifar100", "tinyimagenet", "synthetic"):
        mean, std = T.NORMALIZATION[name]
        y = D.test_transform(name)(x)
        assert y.dtype == torch.float32 and y.shape == x.shape
        for i, v in enumerate((0, 128, 255)):
            for c in range(3):
                assert torch.allclose(y[i, c], torch.tensor((v / 255 - mean[c]) / std[c]), atol=1e-5)
    assert np.allclose(T.NORMALIZATION["cifar10"][0], np.array([125.3, 123.0, 113.9]) / 255)
    assert np.allclose(T.NORMALIZATION["cifar10"][1], np.array([63.0, 62.1, 66.7]) / 255)
    assert np.allclose(T.NORMALIZATION["cifar100"][0], [0.5071, 0.4865, 0.4409], atol=5e-5)
    assert np.allclose(T.NORMALIZATION["cifar100"][1], [0.2673, 0.2564, 0.2762], atol=5e-5)
    y = D.test_transform("tinyimagenet")(x)
    assert torch.allclose(y[0], torch.tensor(-1.0)) and torch.allclose(y[2], torch.tensor(1.0))


def test_transform_configs_and_test_transforms_are_deterministic():
    assert D.train_transform("cifar100").rotation == 15 and D.train_transform("cifar10").rotation == 0
    tiny = D.train_transform("tinyimagenet")
    assert not tiny.is_random
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    assert torch.equal(tiny(x, torch.Generator().manual_seed(1)), D.test_transform("tinyimagenet")(x))
    for name in ("cifar10", "cifar100", "synthetic"):
        assert not D.test_transform(name).is_random
    with pytest.raises(ValueError, match="uint8"):
        D.train_transform("cifar10")(x.float())
    with pytest.raises(ValueError, match="pad_mode"):
        T.BatchTransform((0.5,), (0.5,), pad=1, pad_mode="edge")


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_transform_call_is_sample_then_apply_and_reproducible(name):
    t = D.train_transform(name)
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    y1 = t(x, torch.Generator().manual_seed(5))
    y2 = t(x, torch.Generator().manual_seed(5))
    y3 = t(x, torch.Generator().manual_seed(6))
    assert y1.dtype == torch.float32 and y1.shape == x.shape
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)
    params = t.sample_params(16, torch.Generator().manual_seed(5))
    assert torch.equal(t.apply(x, *params), y1)


def test_random_parameter_distribution():
    t = D.train_transform("cifar100")
    offsets, flips, angles = t.sample_params(20000, torch.Generator().manual_seed(0))
    for axis in (0, 1):
        counts = torch.bincount(offsets[:, axis], minlength=9)
        assert counts.shape == (9,) and offsets.min() == 0 and offsets.max() == 8
        assert (counts - 20000 / 9).abs().max() < 200  # ~6 sigma
    assert abs(flips.float().mean().item() - 0.5) < 0.02
    assert angles.min() >= -15 and angles.max() <= 15
    assert abs(angles.mean().item()) < 0.3 and abs(angles.std().item() - 30 / math.sqrt(12)) < 0.2
    # independent per image: the two offsets are uncorrelated
    corr = np.corrcoef(offsets[:, 0].numpy(), offsets[:, 1].numpy())[0, 1]
    assert abs(corr) < 0.05


def test_transform_output_reflects_random_crop():
    # zero padding + an all-255 image: the number of zero rows/cols shows the offset actually used
    t = T.BatchTransform((0.0,), (1 / 255,), pad=4, pad_mode="constant")
    x = torch.full((3000, 1, 8, 8), 255, dtype=torch.uint8)
    y = t(x, torch.Generator().manual_seed(0))  # values are 0 or 255
    for dim in (2, 1):  # fully zero rows (cols): |row offset - 4| (|col offset - 4|), above/left or below/right
        zero = (y[:, 0] == 0).all(dim=dim).sum(1)
        assert set(zero.tolist()) == {0, 1, 2, 3, 4}
        assert abs((zero == 0).float().mean().item() - 1 / 9) < 0.03
        assert abs((zero == 4).float().mean().item() - 2 / 9) < 0.04


def test_rotation():
    t = D.train_transform("cifar100")
    x = torch.rand(5, 3, 32, 32) * 255
    assert torch.equal(t.rotate(x, torch.zeros(5)), x)
    r = t.rotate(x, torch.full((5,), 90.0))
    assert torch.equal(r, torch.rot90(x, 1, (2, 3)))  # counter-clockwise, like torchvision
    # 45 degrees of a constant image: zero fill in the corners, centre kept
    ones = torch.ones(1, 1, 32, 32)
    r = t.rotate(ones, torch.tensor([45.0]))
    assert r[0, 0, 0, 0] == 0 and r[0, 0, 16, 16] == 1
    # with angles of at most 15 degrees the corners of a bright image turn dark only sometimes
    full = torch.full((400, 3, 32, 32), 255, dtype=torch.uint8)
    out = t(full, torch.Generator().manual_seed(0))
    corner_zero = (out[:, 0, 0, 0] < 0).float().mean().item()  # 0 -> (0 - mean) / std < 0
    assert 0.5 < corner_zero < 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_transform_same_on_cuda():
    t = D.train_transform("cifar100")
    x = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    cpu = t(x, torch.Generator().manual_seed(3))
    gpu = t(x.cuda(), torch.Generator().manual_seed(3))
    assert gpu.is_cuda and torch.allclose(gpu.cpu(), cpu, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# loader


def _ids(n: int) -> D.ImageArrays:
    """Images whose pixel (0,0,0) identifies the sample (for n <= 256), labels = index."""
    imgs = torch.zeros(n, 3, 8, 8, dtype=torch.uint8)
    imgs[:, 0, 0, 0] = torch.arange(n, dtype=torch.uint8)
    return D.ImageArrays(imgs, torch.arange(n))


def _raw(x, g):
    return x.float()


def test_loader_batch_counts_and_order():
    a = _ids(130)
    keep = D.TensorBatchLoader(a, 64, _raw, shuffle=False, drop_last=False)
    drop = D.TensorBatchLoader(a, 64, _raw, shuffle=False, drop_last=True)
    assert len(keep) == 3 and len(drop) == 2
    batches = list(keep)
    assert [len(y) for _, y in batches] == [64, 64, 2]
    assert torch.equal(torch.cat([y for _, y in batches]), torch.arange(130))
    x, y = batches[2]
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x[:, 0, 0, 0].tolist() == [128.0, 129.0]
    assert [len(y) for _, y in drop] == [64, 64]
    for n in SIZES:
        assert (
            len(
                D.TensorBatchLoader(
                    _ids(n)
                    if n <= 256
                    else D.ImageArrays(torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.zeros(n, dtype=torch.int64)),
                    64,
                    _raw,
                    True,
                    True,
                )
            )
            == n // 64
        )


def test_loader_shuffle_epochs_and_reproducibility():
    a = _ids(200)
    t = D.train_transform("synthetic")
    l1 = D.TensorBatchLoader(a, 32, _raw, shuffle=True, drop_last=False, seed=11)
    e1 = torch.cat([y for _, y in l1])
    e2 = torch.cat([y for _, y in l1])
    assert torch.equal(e1.sort().values, torch.arange(200)) and torch.equal(e2.sort().values, torch.arange(200))
    assert not torch.equal(e1, e2)  # a new permutation every epoch
    # images follow their labels
    for x, y in l1:
        assert torch.equal(x[:, 0, 0, 0].long(), y)

    # same seed -> identical runs (order and augmentation); another seed -> different
    def run(seed):
        ld = D.TensorBatchLoader(a, 32, t, shuffle=True, drop_last=True, seed=seed)
        return [(x.clone(), y.clone()) for _ in range(2) for x, y in ld]

    r1, r2, r3 = run(3), run(3), run(4)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(r1, r2))
    assert not all(torch.equal(y1, y3) for (_, y1), (_, y3) in zip(r1, r3))


def test_loader_argument_errors_and_warning():
    a = _ids(10)
    with pytest.raises(ValueError, match="batch_size"):
        D.TensorBatchLoader(a, 0, _raw, True, True)
    with pytest.raises(ValueError, match="transform"):
        D.TensorBatchLoader(a, 4, None, True, True)
    with pytest.raises(ValueError, match="arrays"):
        D.TensorBatchLoader(a.images, 4, _raw, True, True)
    with pytest.warns(UserWarning, match="0 batches"):
        ld = D.TensorBatchLoader(a, 64, _raw, True, True)
    assert len(ld) == 0 and list(ld) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loader_device():
    a = _ids(100)
    ld = D.TensorBatchLoader(a, 10, D.train_transform("synthetic"), True, True, seed=0, device="cuda")
    cpu = D.TensorBatchLoader(a, 10, D.train_transform("synthetic"), True, True, seed=0)
    for (xg, yg), (xc, yc) in zip(ld, cpu):
        assert xg.is_cuda and yg.is_cuda and torch.equal(yg.cpu(), yc) and torch.allclose(xg.cpu(), xc)

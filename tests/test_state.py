import json
import os

import pytest
import torch

from nvflare_moon.core.files import write_json_atomic
from nvflare_moon.core.state import FORMAT_VERSION, SiteStateStore, StateUnusable, tensor_signature


def store(tmp_path, site="site-1", job="job-a"):
    return SiteStateStore(str(tmp_path / "run" / "nvflare_moon"), "moon_state", site, job)


def test_round_trip(tmp_path):
    s = store(tmp_path)
    assert s.load() is None
    s.save(3, {"previous_models": [{"w": torch.ones(2, 2)}]})
    record = s.load()
    assert record["round"] == 3
    torch.testing.assert_close(record["payload"]["previous_models"][0]["w"], torch.ones(2, 2))
    assert os.listdir(os.path.dirname(s.path)) == ["moon_state.pt"]  # no temporary file left behind


def test_a_failed_write_keeps_the_previous_state(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.save(1, {"x": torch.zeros(1)})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        s.save(2, {"x": torch.ones(1)})
    monkeypatch.undo()
    assert s.load()["round"] == 1
    assert os.listdir(os.path.dirname(s.path)) == ["moon_state.pt"]  # the half-written temporary file removed


def test_a_json_file_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "new_folder" / "record.json"
    write_json_atomic(str(path), {"round": 1})
    assert json.loads(path.read_text()) == {"round": 1}
    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"round": 2, "model": object()})  # fails half-way through the dump
    assert json.loads(path.read_text()) == {"round": 1}
    assert os.listdir(path.parent) == ["record.json"]


def test_corrupt_file_is_reported_and_kept_aside(tmp_path):
    s = store(tmp_path)
    os.makedirs(os.path.dirname(s.path))
    with open(s.path, "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(StateUnusable, match="cannot be used"):
        s.load()
    assert not os.path.exists(s.path)
    kept = [f for f in os.listdir(os.path.dirname(s.path)) if ".unusable-corrupt-" in f]
    assert len(kept) == 1
    assert s.load() is None  # the next round starts clean


@pytest.mark.parametrize("other,reason", [({"site": "site-2"}, "other-site"), ({"job": "job-b"}, "other-job")])
def test_state_of_another_site_or_job_is_refused_and_set_aside_saying_why(tmp_path, other, reason):
    store(tmp_path, **other).save(1, {"x": torch.zeros(1)})
    original = open(store(tmp_path).path, "rb").read()
    with pytest.raises(StateUnusable, match="belongs to") as refused:
        store(tmp_path).load()
    (kept,) = os.listdir(os.path.dirname(store(tmp_path).path))
    assert kept.startswith(f"moon_state.pt.unusable-{reason}-")
    assert open(os.path.join(os.path.dirname(store(tmp_path).path), kept), "rb").read() == original
    assert str(refused.value).startswith(f"site-1: state file {store(tmp_path).path} cannot be used")


def test_state_of_another_method_is_refused(tmp_path):
    other = SiteStateStore(str(tmp_path / "run" / "nvflare_moon"), "scaffold_state", "site-1", "job-a")
    other.save(1, {"x": torch.zeros(1)})
    os.replace(other.path, store(tmp_path).path)  # a file copied under the wrong name
    with pytest.raises(StateUnusable, match="holds 'scaffold_state' state"):
        store(tmp_path).load()
    assert ".unusable-other-method-" in os.listdir(os.path.dirname(other.path))[0]


def test_setting_aside_never_overwrites_an_earlier_file(tmp_path):
    s = store(tmp_path)
    for content in (b"first", b"second"):  # the same second: the names must still differ
        os.makedirs(s.directory, exist_ok=True)
        with open(s.path, "wb") as f:
            f.write(content)
        s.set_aside("other-network", "test")
    kept = sorted(os.listdir(s.directory))
    assert len(kept) == 2 and {open(os.path.join(s.directory, f), "rb").read() for f in kept} == {b"first", b"second"}


def test_signature_names_shapes_and_dtypes():
    sig = tensor_signature({"a": torch.zeros(2, 3), "n": torch.tensor(1)})
    assert sig == {"a": ((2, 3), "torch.float32"), "n": ((), "torch.int64")}


def record(**changes):
    """A valid record of site-1 in job-a with ``changes``; a change to None removes the field."""
    fields = {"format_version": FORMAT_VERSION, "site": "site-1", "job_id": "job-a", "round": 1, "payload": {}}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


@pytest.mark.parametrize(
    "saved, reason",
    [
        (record(format_version=FORMAT_VERSION + 1), f"not a format-{FORMAT_VERSION}"),
        (record(format_version=None), f"not a format-{FORMAT_VERSION}"),
        ([record()], f"not a format-{FORMAT_VERSION}"),
        (record(round=None), "round or payload missing"),
        (record(round="1"), "round or payload missing"),
        (record(payload=None), "round or payload missing"),
        (record(payload=[1]), "round or payload missing"),
        (record(site=None), "belongs to site None"),
    ],
)
def test_a_record_of_another_format_or_with_a_missing_field_is_refused_and_kept_aside(tmp_path, saved, reason):
    s = store(tmp_path)
    os.makedirs(os.path.dirname(s.path))
    torch.save(saved, s.path)
    with pytest.raises(StateUnusable, match=reason):
        s.load()
    assert [".unusable-" in f for f in os.listdir(os.path.dirname(s.path))] == [True]
    assert s.load() is None

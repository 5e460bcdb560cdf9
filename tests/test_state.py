import os

import pytest
import torch

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


def test_corrupt_file_is_reported_and_kept_aside(tmp_path):
    s = store(tmp_path)
    os.makedirs(os.path.dirname(s.path))
    with open(s.path, "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(StateUnusable, match="cannot be used"):
        s.load()
    assert not os.path.exists(s.path)
    kept = [f for f in os.listdir(os.path.dirname(s.path)) if ".unusable-" in f]
    assert len(kept) == 1
    assert s.load() is None  # the next round starts clean


@pytest.mark.parametrize("other", [{"site": "site-2"}, {"job": "job-b"}])
def test_state_of_another_site_or_job_is_refused(tmp_path, other):
    store(tmp_path, **other).save(1, {"x": torch.zeros(1)})
    with pytest.raises(StateUnusable, match="belongs to"):
        store(tmp_path).load()


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

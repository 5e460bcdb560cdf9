"""benchmarks/site_images.py on a tiny folder (40 images of 32 px): the record holds every figure, and the cached start
maps the copy that the first start wrote instead of decoding the folder again."""

import importlib
import json

import numpy as np

FIGURES = ("peak_rss_bytes", "ru_maxrss_bytes", "rss_anon_bytes", "rss_file_bytes", "process_seconds")


def benchmark():
    """The script as ``benchmarks.site_images`` (the repository is on pytest's path): a name its writer processes can
    import too."""
    return importlib.import_module("benchmarks.site_images")


def test_synthetic_images_are_a_function_of_their_index():
    bench = benchmark()
    one, again, other = (np.asarray(bench.synthetic_image(i, 4, 32, 3)) for i in (5, 5, 6))
    assert one.shape == (32, 32, 3) and np.array_equal(one, again) and not np.array_equal(one, other)
    assert np.asarray(bench.synthetic_image(5, 4, 24, 1)).shape == (24, 24)


def test_record_of_a_tiny_folder(tmp_path, capsys):
    bench = benchmark()
    folder, out = tmp_path / "site", tmp_path / "results" / "large_data.json"
    argv = ["--images", "40", "--size", "32", "--folder", str(folder), "--reference-dataset", "synthetic"]
    argv += ["--steps", "2", "--repeats", "1", "--batch-size", "8", "--out", str(out), "--note", "tiny"]
    record = bench.run_benchmark(bench.parse_args(argv))
    bench.print_record(record)

    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    assert "site_images.py --images 40 --size 32" in record["command"] and record["note"] == "tiny"
    assert {"date", "commit", "machine", "scheduling"} <= set(record["environment"])
    assert len(record["load_average_before"]) == len(record["load_average_after"]) == 3
    assert record["generation"]["generated"] and bench.count_images(str(folder)) == 40
    assert record["cache_bytes"] == 40 * 3 * 32 * 32

    first, cached = record["starts"]["first"], record["starts"]["cached"]
    assert sorted(record["starts"]) == ["cached", "first"]  # at 32 px the folder has no second copy to time
    for start in (first, cached):
        assert start["images"] == 40 and start["train_images"] == 36  # val_fraction 0.1 of each class's 10
        assert start["load_seconds"] > 0 and start["load_cpu_seconds"] >= 0
        assert all(start[figure] > 0 for figure in FIGURES)
    assert cached["copy_folder"] == first["copy_folder"] and cached["copy_mtime_ns"] == first["copy_mtime_ns"]
    assert record["copies_after_cached_start"] == 1 and record["cached_start_decoded_again"] is False
    assert len(bench.decoded_copies(str(folder))) == 1

    stream = record["epoch_stream"]
    assert stream["images"] == 32 and stream["images_per_second"] > 0  # 36 training images, full batches of 8
    training = record["training"]["images_per_second"]
    assert sorted(training) == ["site_32px", "synthetic_in_memory"]
    assert all(value > 0 for figures in training.values() for value in figures.values())
    goals = record["goals"]
    assert goals["peak_rss_process"] in ("first start", "cached start", "epoch stream")
    assert goals["cached_start_below_5_s"] == (cached["load_seconds"] < 5)
    assert goals["peak_rss_below_1_5x_cache"] == (goals["peak_rss_ratio"] < 1.5)
    assert "goals: peak RSS < 1.5x the copy" in capsys.readouterr().out

    again = bench.generate_folder(str(folder), 40, 32, 3, 4, processes=1)
    assert again["generated"] is False and again["seconds"] == 0  # the same set is not written twice

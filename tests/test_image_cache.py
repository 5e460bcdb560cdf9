"""The decoding of a site's folder runs at most a window of images ahead of the writer of its decoded copy."""

import time
from concurrent.futures import ThreadPoolExecutor

from nvflare_moon.data.image_cache import map_ahead


def test_workers_wait_for_a_slow_consumer_and_results_keep_their_order():
    submitted = []

    def work(i):
        submitted.append(i)
        return i * i

    consumed = []
    with ThreadPoolExecutor(4) as pool:
        for result in map_ahead(pool, work, range(60), window=8):
            time.sleep(0.002)  # a writer slower than the workers
            assert len(submitted) <= len(consumed) + 8
            consumed.append(result)
    assert consumed == [i * i for i in range(60)]

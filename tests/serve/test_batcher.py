"""Dynamic batching: batches form under concurrency, results equal unbatched ones, and a
failing batch fails only its own requests."""

import asyncio
import threading

import pytest
import torch

from deeppod.runtime import inference
from deeppod.serve.batcher import Batcher
from tests.helpers import image_model, wait_until


def test_concurrent_requests_share_forward_passes_and_get_their_own_answers():
    sizes = []
    gate = threading.Event()

    def run(items):
        gate.wait(5)  # hold the first batch so the rest queue up behind it
        sizes.append(len(items))
        return [x * 10 for x in items]

    b = Batcher(run, max_batch=8, max_wait=0.05)

    async def main():
        tasks = [asyncio.create_task(b([i])) for i in range(20)]
        await asyncio.sleep(0.1)
        gate.set()
        return await asyncio.gather(*tasks)

    out = asyncio.run(main())
    b.close()
    assert out == [[i * 10] for i in range(20)]
    assert max(sizes) == 8 and sum(sizes) == 20 and len(sizes) <= 4, sizes


def test_a_lone_request_waits_at_most_max_wait():
    sizes = []
    b = Batcher(lambda items: sizes.append(len(items)) or items, max_batch=32, max_wait=0.02)
    # it runs alone once max_wait is over (no company comes): well before the result's own timeout
    assert [f.result(30) for f in b.submit(["x"])] == ["x"] and sizes == [1]
    b.close()


def test_with_nothing_on_its_way_a_lone_request_runs_at_once():
    b = Batcher(lambda items: items, max_batch=32, max_wait=600.0, coming=lambda: 0)
    # had it waited for company that was not coming, the result would take max_wait (600 s)
    assert [f.result(30) for f in b.submit(["x"])] == ["x"]
    b.close()


def test_the_batch_waits_for_a_request_on_its_way_and_takes_it_along():
    sizes, on_its_way = [], [1]
    b = Batcher(lambda items: sizes.append(len(items)) or items, max_batch=32, max_wait=600.0,
                coming=lambda: on_its_way[0])
    first = b.submit(["a"])  # one more request is still being decoded
    wait_until(lambda: b.depth == 0, 30, interval=0.01, what="the batcher to hold the first request")
    second = b.submit(["b"])
    on_its_way[0] = 0
    assert [first[0].result(5), second[0].result(5)] == ["a", "b"] and sizes == [2]
    b.close()


def test_a_failing_batch_fails_its_items_and_the_batcher_goes_on():
    calls = []

    def run(items):
        calls.append(items)
        if "boom" in items:
            raise RuntimeError("bad batch")
        return items

    b = Batcher(run, max_batch=1, max_wait=0)
    bad = b.submit(["boom"])[0]
    with pytest.raises(RuntimeError, match="bad batch"):
        bad.result(5)
    assert b.submit(["fine"])[0].result(5) == "fine"
    b.close()


def test_max_batch_must_be_positive():
    with pytest.raises(ValueError):
        Batcher(lambda i: i, max_batch=0)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    folder = image_model(tmp_path_factory.mktemp("model"))
    return inference.load(folder, device="cpu")


def test_batched_answers_equal_unbatched_ones(small_model):
    g = torch.Generator().manual_seed(1)
    items = [torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=g) for _ in range(24)]
    one_by_one = torch.cat([inference.forward(small_model, [x]) for x in items])
    sizes = []

    def run(batch):
        sizes.append(len(batch))
        return list(inference.forward(small_model, batch))

    b = Batcher(run, max_batch=16, max_wait=0.2)
    futures = [f for x in items for f in b.submit([x])]
    batched = torch.stack([f.result(10) for f in futures])
    b.close()
    assert max(sizes) > 1
    torch.testing.assert_close(batched, one_by_one, rtol=1e-4, atol=1e-5)


def test_images_and_tensors_mix_in_one_batch_in_order(small_model):
    from deeppod.runtime.data import normalize

    img = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    tensor = normalize(img[None], [0.5] * 3, [0.25] * 3)[0]
    out = inference.forward(small_model, [img, tensor, img])
    torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[0], out[2])

"""The DALI baseline for benchmarks/data_loader.py: NVIDIA DALI's CPU pipeline on the same JPEG
files, decoding only the random crop (fn.decoders.image_random_crop: the fused decode+crop),
resize to 224, random horizontal flip, uint8 CHW out, as the other loaders hand over.
Run with a Python that has nvidia-dali (its own environment):
``python benchmarks/dali_pipeline.py IMAGE_FOLDER THREADS BATCH EPOCHS`` prints JSON
{"img_s": ..., "images": ...}. One process; THREADS decoding threads (= cores)."""

from __future__ import annotations

import json
import sys
import time

from nvidia.dali import fn, pipeline_def, types


def main() -> None:
    root, threads, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224, antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(), mean=[0.0], std=[1.0])
        return images, labels

    p = pipe()
    p.build()
    per_epoch = p.epoch_size("Reader")
    steps = (per_epoch + batch - 1) // batch
    n, began = 0, None
    for e in range(epochs + 1):  # epoch 0 warms the page cache and the threads
        if e == 1:
            began = time.perf_counter()
        for _ in range(steps):
            images, labels = p.run()
            if e >= 1:
                n += len(labels)
    print(json.dumps({"img_s": n / (time.perf_counter() - began), "images": n}))


if __name__ == "__main__":
    main()

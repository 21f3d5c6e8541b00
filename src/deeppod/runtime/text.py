"""Reading a text dataset in a job: the examples of one split, as the ingest checked them
(datasets/text.py on the server: chat ``{"messages": [...]}``, ``{"prompt", "completion"}``
or ``{"text"}``, one form per version)::

    from deeppod.runtime.text import read_examples
    for example in read_examples("chats", "train"):
        ...
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from deeppod.runtime.shards import SPLITS, dataset_path


def split_file(name_or_folder: str | os.PathLike, split: str = "train") -> Path:
    """The JSON Lines file of ``split`` in a staged dataset (a name given with --dataset) or a
    version folder."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    folder = Path(name_or_folder) if os.sep in str(name_or_folder) else dataset_path(str(name_or_folder))
    path = folder / "text" / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a text dataset version (no text/{split}.jsonl): ingest JSON Lines "
                                "with 'deeppod data ingest NAME FILE.jsonl'")
    return path


def read_examples(name_or_folder: str | os.PathLike, split: str = "train") -> Iterator[dict]:
    with open(split_file(name_or_folder, split), encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)

"""Dataset versions for end-to-end tests, built with the platform's own ingest (no server)."""

from __future__ import annotations

import shutil
from pathlib import Path

from deeppod.datasets.ingest import Limits, build
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import Policy
from deeppod.runtime.trainers.digits import write_digits


def digits_version(root: Path, val: float = 0.2) -> Path:
    """scikit-learn's digits as a DeepPod dataset version folder (shards, index, classes)."""
    folder = write_digits(root / "digits")
    archive = shutil.make_archive(str(root / "digits"), "tar", root_dir=root, base_dir="digits")
    out = root / "version"
    build(Path(archive), out, ObjectStore(root / "objects"), Policy(val=val), Limits(1 << 30, 1 << 31))
    shutil.rmtree(folder)
    return out

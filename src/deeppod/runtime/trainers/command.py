"""The built-in image classifier as a job's command, checked before the job is submitted:
shared by the CLI ('deeppod train', 'deeppod tune') and the web console's trainer form."""

from __future__ import annotations

import contextlib
import io
import sys

from deeppod.errors import InvalidRequest
from deeppod.runtime.trainers.models import NAMES

MODULE = "deeppod.runtime.trainers.image_classifier"


def image_classifier(args: list[str]) -> list[str]:
    """The worker command that runs the trainer with ``args``, in this Python."""
    return [sys.executable, "-m", MODULE, *args]


def check_args(args: list[str], model: str) -> None:
    """Mistakes the trainer would make the job fail on, caught before it is submitted."""
    from deeppod.runtime.trainers import image_classifier as trainer

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            trainer.parse_args(args)
    except SystemExit:
        why = said.getvalue().strip().splitlines()[-1:] or ["invalid options"]
        raise InvalidRequest(f"the trainer refuses these options: {why[0].removeprefix('image_classifier.py: ')}"
                             ) from None
    if model not in NAMES:  # from a list: importing torchvision to ask it takes seconds
        close = [n for n in NAMES if n.startswith(model[:4])][:8]
        raise InvalidRequest(f"--model {model!r} is not a model the trainer knows: use auto (resnet18 on a GPU, "
                             f"small-cnn on CPU), small-cnn or a torchvision classification model "
                             f"({', '.join(close or NAMES[2:14])}, ...; {len(NAMES)} in all)")

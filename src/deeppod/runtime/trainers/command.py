"""The built-in image classifier as a job's command, checked before the job is submitted:
shared by the CLI ('deeppod train', 'deeppod tune') and the web console's trainer form."""

from __future__ import annotations

import contextlib
import io
import sys

from deeppod.errors import InvalidRequest

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
    try:
        names = trainer.model_names()
    except ImportError:  # a client without torchvision: the trainer checks it on the cluster
        return
    if model not in names:
        close = [n for n in names if n.startswith(model[:4])][:8]
        raise InvalidRequest(f"--model {model!r} is not a model the trainer knows: use small-cnn or a torchvision "
                             f"classification model ({', '.join(close or names[:12])}, ...; "
                             f"{len(names)} in all)")

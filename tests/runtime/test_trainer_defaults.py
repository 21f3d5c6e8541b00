"""The built-in trainer's defaults follow the data and the hardware, and its model names are
checked without importing torch (the CLI answers in well under a second)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from deeppod.errors import InvalidRequest
from deeppod.runtime.trainers import image_classifier as trainer
from deeppod.runtime.trainers.command import check_args
from deeppod.runtime.trainers.models import NAMES, TORCHVISION


def test_the_model_list_is_the_installed_torchvisions():
    torchvision = pytest.importorskip("torchvision")
    assert list(TORCHVISION) == torchvision.models.list_models(module=torchvision.models)


@pytest.mark.slow  # it starts processes
def test_a_model_name_is_checked_without_importing_torch():
    code = ("import sys\nfrom deeppod.runtime.trainers.command import check_args\n"
            "try:\n    check_args(['--data', '.', '--model', 'resnt18'], 'resnt18')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n"
            "check_args(['--data', '.', '--model', 'resnet50'], 'resnet50')\n"
            "print('torch' in sys.modules, 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "InvalidRequest --model 'resnt18' is not a model" in out and "resnet18" in out
    assert out.strip().endswith("False False")


def test_auto_and_small_cnn_are_models():
    assert NAMES[:2] == ("auto", "small-cnn")
    for name in ("auto", "small-cnn", "resnet18"):
        check_args(["--data", ".", "--model", name], name)
    with pytest.raises(InvalidRequest, match="auto"):
        check_args(["--data", ".", "--model", "resnet"], "resnet")


@pytest.mark.parametrize("sizes, want", [([(8, 8)] * 5, 16), ([(32, 32)] * 9 + [(500, 500)], 32),
                                         ([(500, 375)] * 3, 224), ([(64, 48), (96, 96), (128, 100)], 96), ([], 224)])
def test_the_image_size_follows_the_images(sizes, want):
    assert trainer.native_size(sizes) == want


def args(**kw):
    return SimpleNamespace(**{"model": "auto", "image_size": 0, **kw})


def test_auto_picks_small_cnn_on_cpu_and_resnet18_on_a_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DEEPPOD_CHECKPOINT_DIR", raising=False)
    cpu, gpu = args(), args()
    trainer.resolve_auto(cpu, lambda: [(32, 32)], cuda=False)
    trainer.resolve_auto(gpu, lambda: [(300, 300)], cuda=True)
    assert (cpu.model, cpu.image_size, gpu.model, gpu.image_size) == ("small-cnn", 32, "resnet18", 224)
    assert "auto: model small-cnn (CPU only; --model to choose), image size 32 px" in capsys.readouterr().out


def test_what_was_chosen_is_kept_across_restarts_and_hardware(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPPOD_CHECKPOINT_DIR", str(tmp_path))
    first = args()
    trainer.resolve_auto(first, lambda: [(40, 40)], cuda=False)
    assert json.loads((tmp_path / trainer.CHOICES_FILE).read_text()) == {"model": "small-cnn", "image_size": 40}
    again = args()  # resumed on a GPU node: the checkpoint is a small-cnn's at 40 px
    trainer.resolve_auto(again, lambda: [(300, 300)], cuda=True)
    assert (again.model, again.image_size) == ("small-cnn", 40)
    chosen = args(model="resnet34", image_size=64)  # what the user said is never replaced
    trainer.resolve_auto(chosen, lambda: [(300, 300)], cuda=True)
    assert (chosen.model, chosen.image_size) == ("resnet34", 64)


@pytest.mark.parametrize("n_train, want", [(25, 8), (40, 8), (100, 16), (300, 64), (511, 64), (512, 128),
                                           (1437, 128), (3, 8)])
def test_the_default_batch_gives_an_epoch_four_steps_on_few_images(n_train, want):
    assert trainer.default_batch(n_train) == want
    assert trainer.parse_args(["--data", "."]).batch_size is None  # None: decided once the images are counted


def test_a_model_no_better_than_chance_is_not_registered(tmp_path, monkeypatch, capsys):
    registered = []
    monkeypatch.setattr(trainer, "write_artifact", lambda *a, **k: None)
    monkeypatch.setattr(trainer, "register", lambda name, out: registered.append(name))

    def finish(val_accuracy, classes=10, *flags):
        run = SimpleNamespace(args=trainer.parse_args(["--data", ".", "--register", "digits", "--output",
                                                       str(tmp_path), *flags]),
                              ctx=SimpleNamespace(job_dir=None), classes=[str(i) for i in range(classes)],
                              version_dir=None)
        trainer.Run.write_model(run, {"val_accuracy": val_accuracy, "val_loss": 2.3}, model=None)

    finish(0.1)  # 1 of 10 classes: a guess
    assert registered == []
    assert ("not registered as 'digits': val_accuracy 0.1 is no better than chance (0.1, 1 of 10 classes)"
            in capsys.readouterr().out)
    finish(0.1, 10, "--register-at-chance")  # asked for all the same
    finish(0.45)
    finish(float("nan"))  # no validation set: nothing says it is at chance
    assert registered == ["digits"] * 3

"""An S3 access key written as a named AWS profile, so that ``aws --profile NAME s3 ls`` and
``boto3.Session(profile_name=NAME)`` reach DeepPod's endpoint with no flags: the key in the
shared credentials file, the endpoint, region and path-style addressing in the config file
(where the AWS tools look: $AWS_SHARED_CREDENTIALS_FILE and $AWS_CONFIG_FILE, else ~/.aws).
An existing profile is never overwritten: it may hold someone's real AWS keys."""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path

from deeppod.errors import InvalidRequest

REGION = "us-east-1"  # what the endpoint signs for (docs/datasets.md, "S3")


def files() -> tuple[Path, Path]:
    """The credentials and config files the AWS tools read."""
    home = Path.home() / ".aws"
    return (Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / "credentials").expanduser(),
            Path(os.environ.get("AWS_CONFIG_FILE") or home / "config").expanduser())


def _section(name: str) -> str:
    return name if name == "default" else f"profile {name}"


def _read(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, configparser.Error) as exc:
        raise InvalidRequest(f"cannot read {path} ({exc}): fix it, or choose where with AWS_CONFIG_FILE and "
                             "AWS_SHARED_CREDENTIALS_FILE") from None
    return parser


def check_free(name: str) -> None:
    """Refuse a bad name or one that is taken, before a key is made for it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise InvalidRequest(f"--aws-profile {name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
    credentials, config = files()
    if _read(credentials).has_section(name) or _read(config).has_section(_section(name)):
        raise InvalidRequest(f"an AWS profile {name!r} exists already ({credentials} or {config}): choose another "
                             "--aws-profile name, or remove that one first")


def write(name: str, key_id: str, secret: str, endpoint: str) -> tuple[Path, Path]:
    """Add profile ``name``; the files it was written to."""
    check_free(name)
    credentials, config = files()
    _append(credentials, name, {"aws_access_key_id": key_id, "aws_secret_access_key": secret})
    _append(config, _section(name), {"region": REGION, "endpoint_url": endpoint,
                                     "s3": "\n    addressing_style = path"})
    return credentials, config


def _append(path: Path, section: str, values: dict[str, str]) -> None:
    """One more section at the end of an INI file (0600: it may hold secrets), keeping the rest."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = "".join(f"{k} = {v}\n" for k, v in values.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell():
            f.write("\n")
        f.write(f"[{section}]\n{text}")

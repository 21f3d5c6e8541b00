"""S3 over DeepPod's storage: datasets and models read-only, inboxes to write a dataset's next
version into (docs/datasets.md, "S3"). A part of the server's app (server.http_app)."""

from deeppod.s3.app import is_s3


def install(app) -> None:
    from deeppod.s3.app import install as mount

    mount(app)


def is_upload(method: str, path: str) -> bool:
    """Bodies here stream to files under S3's own limits, not the JSON API's."""
    return is_s3(path)

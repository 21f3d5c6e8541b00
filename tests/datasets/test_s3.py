"""s3:// sources against a real S3 endpoint on loopback (moto's server), through boto3."""


import pytest

from deeppod.contract import free_port
from tests.datasets.images import image_bytes

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture
def s3(monkeypatch):
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    url = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket="scans")
    yield url, client
    server.stop()


def test_ingest_from_an_s3_prefix(api, s3):
    from deeppod.sdk.sources import open_source

    url, client = s3
    for c in ("normal", "pneumonia"):
        for i in range(3):
            client.put_object(Bucket="scans", Key=f"2026/xray/{c}/{i}.jpg", Body=image_bytes(i + len(c)))
    client.put_object(Bucket="scans", Key="2026/other/skip.jpg", Body=b"not under the prefix")
    src = open_source("s3://scans/2026/xray", s3_endpoint=url)
    assert src.files == 6
    seen = []
    body = b"".join(src.chunks(lambda *p: seen.append(p)))
    assert seen[-1][:2] == (6, 6)
    r = api.http.post("/v1/datasets/xray/versions", content=body, params={"source": src.description},
                      headers={**api.as_(api.admin), "content-type": src.content_type})
    assert r.status_code == 201, r.text
    v = r.json()["versions"][0]
    assert v["classes"] == ["normal", "pneumonia"] and v["samples"] == 6
    assert v["lineage"]["source"] == "s3://scans/2026/xray"


def test_s3_errors_are_clear(s3):
    from deeppod.errors import InvalidRequest
    from deeppod.sdk.sources import open_source

    url, _ = s3
    with pytest.raises(InvalidRequest, match="holds no objects"):
        open_source("s3://scans/nothing-here", s3_endpoint=url)
    with pytest.raises(InvalidRequest, match="cannot list"):
        open_source("s3://no-such-bucket/x", s3_endpoint=url)

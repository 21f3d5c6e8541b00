"""The S3 endpoint as its users reach it, against a live server (sandboxed as root, the default):
a folder of images uploaded to an inbox with the aws CLI, committed, trained on with the
built-in trainer, its registered model downloaded with ``aws s3 cp``; boto3 and s3fs reading
the same version; another tenant, a bad signature, a read-only or revoked key, a presigned
URL and an upload cut mid-way each get what S3 gives them, and leave nothing behind; either
server of a failover pair answers."""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import boto3
import numpy as np
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from PIL import Image

from deeppod import Client
from tests.e2e.browser import shot, sign_in
from tests.helpers import LiveServer, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path):
    s = LiveServer(tmp_path / "home", isolation=None).start()
    yield s
    s.stop()
    s.cleanup_jobs()


def s3(key, **config):
    return boto3.client("s3", endpoint_url=key["endpoint"], aws_access_key_id=key["key_id"],
                        aws_secret_access_key=key["secret"], region_name="us-east-1", config=Config(**config))


def aws(key, *args, cwd=None):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key["key_id"], "AWS_SECRET_ACCESS_KEY": key["secret"],
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
           "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    p = subprocess.run([sys.executable, "-m", "awscli", "--endpoint-url", key["endpoint"], *args], env=env,
                       capture_output=True, text=True, timeout=120, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def images(root, per_class=20):
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray((rng.random((16, 16, 3)) * 80 + c * 60).astype("uint8")).save(root / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.timeout(600)
def test_upload_commit_train_and_download_the_model_through_s3(server, tmp_path):
    c = Client(server.url, server.admin_token)
    key = c.create_access_key("lab")
    assert key["endpoint"] == server.url + "/s3"
    folder = images(tmp_path / "shapes")
    aws(key, "s3", "cp", "--recursive", str(folder), "s3://inbox/shapes/")
    listed = aws(key, "s3", "ls", "s3://inbox/shapes/c1/")
    assert listed.count(".png") == 20
    before = c.commit("shapes")
    version = before["versions"][-1]
    assert version["samples"] == 60 and version["lineage"]["source"] == "s3"
    assert version["lineage"]["via"] == "api by admin"
    assert aws(key, "s3", "ls", "--recursive", "s3://inbox/") == ""  # the inbox is empty again

    # the version's files are the files ingest stored: same bytes, read through boto3 and s3fs
    b = s3(key)
    page = b.list_objects_v2(Bucket="datasets", Prefix="shapes/v1/", MaxKeys=25)
    assert page["IsTruncated"] and page["KeyCount"] == 25
    rest = b.list_objects_v2(Bucket="datasets", Prefix="shapes/v1/", ContinuationToken=page["NextContinuationToken"])
    keys = [o["Key"] for o in page["Contents"] + rest["Contents"]]
    assert len(keys) == 62 and "shapes/v1/.manifest.jsonl" in keys and "shapes/v1/.stats.json" in keys
    local = (folder / "c2" / "7.png").read_bytes()
    assert b.get_object(Bucket="datasets", Key="shapes/v1/c2/7.png")["Body"].read() == local
    import hashlib

    assert b.head_object(Bucket="datasets", Key="shapes/v1/c2/7.png")["ETag"] == f'"{hashlib.md5(local).hexdigest()}"'
    import s3fs

    fs = s3fs.S3FileSystem(key=key["key_id"], secret=key["secret"], client_kwargs={
        "endpoint_url": key["endpoint"], "region_name": "us-east-1"})
    assert fs.cat("datasets/shapes/v1/c2/7.png") == local
    assert sorted(fs.ls("datasets/shapes/v1/", detail=False))[-3:] == [
        "datasets/shapes/v1/c0", "datasets/shapes/v1/c1", "datasets/shapes/v1/c2"]

    # train on it with the built-in trainer, register the model, download it with aws s3 cp
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token,
                "DEEPPOD_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "200"})
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", "train", "image-classifier", "--dataset", "shapes@1",
                        "--epochs", "1", "--batch-size", "16", "--register", "shapes-model",
                        "--register-at-chance", "-f"],  # one epoch: what is tested is S3, not the model
                       env=env, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    aws(key, "s3", "cp", "s3://models/shapes-model/v1/model.pt2", str(tmp_path / "model.pt2"))
    signature = json.loads(b.get_object(Bucket="models", Key="shapes-model/v1/signature.json")["Body"].read())
    assert signature["dataset"] == "shapes@1" and (tmp_path / "model.pt2").stat().st_size > 1000
    job_id = int(p.stdout.split()[1])
    assert b.get_object(Bucket="jobs", Key=f"{job_id}/model/signature.json")["Body"].read() == \
        (server.home / "jobs" / str(job_id) / "model" / "signature.json").read_bytes()


PLANT = """
import os, pathlib
out = pathlib.Path(os.environ["DEEPPOD_CHECKPOINT_DIR"]).parent / "outputs"
out.mkdir(exist_ok=True)
(out / "result.txt").write_text("42")
os.symlink("/etc/shadow", out / "secret")            # a link to what only root may read
os.symlink("/etc", out / "etc")
"""


@pytest.mark.timeout(300)
def test_a_jobs_outputs_read_back_without_following_its_links(server):
    c = Client(server.url, server.admin_token)
    job = c.submit([sys.executable, "-c", PLANT], gpus_per_worker=0, own_folder=True,
                   env={"PATH": os.environ["PATH"]})
    assert c.wait(job["id"], timeout=120)["state"] == "succeeded"
    b = s3(c.create_access_key())
    keys = [o["Key"] for o in b.list_objects_v2(Bucket="jobs", Prefix=f"{job['id']}/")["Contents"]]
    assert keys == [f"{job['id']}/outputs/result.txt"]
    assert b.get_object(Bucket="jobs", Key=f"{job['id']}/outputs/result.txt")["Body"].read() == b"42"
    for planted in ("outputs/secret", "outputs/etc/passwd"):
        with pytest.raises(ClientError) as e:
            b.get_object(Bucket="jobs", Key=f"{job['id']}/{planted}")
        assert e.value.response["Error"]["Code"] == "NoSuchKey"


@pytest.mark.timeout(300)
def test_tenants_signatures_scopes_presigned_urls_and_cut_uploads(server, tmp_path):
    admin = Client(server.url, server.admin_token)
    admin.create_tenant("b")
    bob = Client(server.url, admin.create_user("bob", "b")["token"])
    mine, theirs = admin.create_access_key(), bob.create_access_key()
    b = s3(mine)
    b.put_object(Bucket="inbox", Key="cats/c0/a.png", Body=b"not yet an image")
    other = s3(theirs)
    with pytest.raises(ClientError) as e:
        other.get_object(Bucket="inbox", Key="cats/c0/a.png")
    assert e.value.response["Error"]["Code"] == "NoSuchKey"  # another tenant's inbox is simply not there
    assert other.list_objects_v2(Bucket="inbox")["KeyCount"] == 0

    wrong = s3({**mine, "secret": "x" * 40})
    with pytest.raises(ClientError) as e:
        wrong.list_objects_v2(Bucket="inbox")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:
        b.put_object(Bucket="inbox", Key="cats/../../etc/passwd", Body=b"x")
    assert e.value.response["Error"]["Code"] == "InvalidArgument"
    # an object and a folder of keys of the same name, as S3 allows: the object is kept in the
    # folder (its hidden .object), keeps its key, bytes and ETag, and goes when it is deleted
    before = b.head_object(Bucket="inbox", Key="cats/c0/a.png")["ETag"]
    b.put_object(Bucket="inbox", Key="cats/c0/a.png/more.png", Body=b"x")
    b.put_object(Bucket="inbox", Key="cats/c1", Body=b"beside")  # and the other way round
    b.put_object(Bucket="inbox", Key="cats/c1/z.png", Body=b"z")
    got = b.get_object(Bucket="inbox", Key="cats/c0/a.png")
    assert got["Body"].read() == b"not yet an image" and got["ETag"] == before
    assert b.get_object(Bucket="inbox", Key="cats/c1")["Body"].read() == b"beside"
    listed = b.list_objects_v2(Bucket="inbox", Prefix="cats/", Delimiter="/")
    assert [o["Key"] for o in listed.get("Contents", [])] == ["cats/c1"]
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["cats/c0/", "cats/c1/"]
    assert [o["Key"] for o in b.list_objects_v2(Bucket="inbox", Prefix="cats/c")["Contents"]] == [
        "cats/c0/a.png", "cats/c0/a.png/more.png", "cats/c1", "cats/c1/z.png"]
    b.delete_objects(Bucket="inbox", Delete={"Objects": [{"Key": "cats/c0/a.png/more.png"}, {"Key": "cats/c1"},
                                                         {"Key": "cats/c1/z.png"}]})
    assert [o["Key"] for o in b.list_objects_v2(Bucket="inbox", Prefix="cats/")["Contents"]] == ["cats/c0/a.png"]
    assert b.get_object(Bucket="inbox", Key="cats/c0/a.png")["Body"].read() == b"not yet an image"

    read_only = admin.create_access_key(scope="read")
    with pytest.raises(ClientError) as e:
        s3(read_only).put_object(Bucket="inbox", Key="cats/c0/b.png", Body=b"x")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    assert s3(read_only).get_object(Bucket="inbox", Key="cats/c0/a.png")["Body"].read() == b"not yet an image"

    # presigned URLs, in boto3's default form and in SigV4's
    for signer in (b, s3(mine, signature_version="s3v4")):
        put = signer.generate_presigned_url("put_object", Params={"Bucket": "inbox", "Key": "cats/c0/p.png"},
                                            ExpiresIn=60)
        assert requests.put(put, data=b"presigned", timeout=30).status_code == 200
        get = signer.generate_presigned_url("get_object", Params={"Bucket": "inbox", "Key": "cats/c0/p.png"},
                                            ExpiresIn=60)
        assert requests.get(get, timeout=30).content == b"presigned"
        assert requests.get(get.replace("p.png", "a.png"), timeout=30).status_code == 403  # for that key only
    expired = s3(mine, signature_version="s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": "inbox", "Key": "cats/c0/p.png"}, ExpiresIn=1)
    wait_until(lambda: requests.get(expired, timeout=30).status_code == 403, 30, what="the URL to expire")
    assert "Request has expired" in requests.get(expired, timeout=30).text

    # an upload cut mid-way leaves nothing, not even a temporary file
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    request = s3(mine).generate_presigned_url("put_object", Params={"Bucket": "inbox", "Key": "cats/c0/cut.png"},
                                               ExpiresIn=60)
    path = request.split(str(port), 1)[1]
    with socket.create_connection((host, port)) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 1000000\r\n\r\n".encode()
                     + b"x" * 1000)
        time.sleep(0.2)
    tmp = server.home / "data" / "hot" / ".s3"
    wait_until(lambda: not any(p.is_file() for p in tmp.glob("*/tmp/*")), 30, what="the cut upload's file to go")
    keys = [o["Key"] for o in b.list_objects_v2(Bucket="inbox")["Contents"]]
    assert keys == ["cats/c0/a.png", "cats/c0/p.png"]
    gone = b.delete_objects(Bucket="inbox", Delete={"Objects": [{"Key": "cats/c0/p.png"}, {"Key": "cats/../p.png"}]})
    assert [d["Key"] for d in gone["Deleted"]] == ["cats/c0/p.png"]
    assert [(e["Key"], e["Code"]) for e in gone["Errors"]] == [("cats/../p.png", "InvalidArgument")]
    b.put_object(Bucket="inbox", Key="cats/c0/p.png", Body=b"presigned")

    # a revoked key stops working within a second or so
    admin.revoke_access_key(mine["key_id"])
    wait_until(lambda: _refused(b), 10, what="the revoked key to be refused")


@pytest.mark.timeout(300)
def test_folder_markers_as_hadoop_s3a_and_the_aws_console_make_them(server, tmp_path):
    """A "mkdir" through S3A writes an empty ``DIR/`` object (application/x-directory): it is
    kept, listed, read and deleted as S3 does, sits beside the files put under it, and is not
    a sample when the inbox is committed."""
    c = Client(server.url, server.admin_token)
    b = s3(c.create_access_key())
    for folder in ("shapes/", "shapes/c0/", "shapes/c1/", "shapes/empty/"):
        b.put_object(Bucket="inbox", Key=folder, Body=b"", ContentType="application/x-directory")
    head = b.head_object(Bucket="inbox", Key="shapes/c0/")
    assert head["ContentLength"] == 0 and head["ContentType"] == "application/x-directory"
    assert b.get_object(Bucket="inbox", Key="shapes/c0/")["Body"].read() == b""
    with pytest.raises(ClientError) as e:  # a folder without a marker is not an object (S3 says the same)
        b.head_object(Bucket="inbox", Key="shapes/other/")
    assert e.value.response["Error"]["Code"] == "404"
    for c_ in (0, 1):
        for i in range(6):
            png = tmp_path / f"{c_}-{i}.png"
            Image.fromarray(np.full((16, 16, 3), 40 + 120 * c_ + i, "uint8")).save(png)
            b.upload_file(str(png), "inbox", f"shapes/c{c_}/{i}.png")
    top = b.list_objects_v2(Bucket="inbox", Prefix="shapes/", Delimiter="/")
    assert [o["Key"] for o in top["Contents"]] == ["shapes/"]  # the marker of the prefix itself
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["shapes/c0/", "shapes/c1/", "shapes/empty/"]
    flat = [o["Key"] for o in b.list_objects_v2(Bucket="inbox", Prefix="shapes/c0/")["Contents"]]
    assert flat == ["shapes/c0/"] + [f"shapes/c0/{i}.png" for i in range(6)]
    assert b.list_objects_v2(Bucket="inbox", Prefix="shapes/empty/")["Contents"][0]["Size"] == 0
    with pytest.raises(ClientError) as e:  # none in the read-only buckets
        b.head_object(Bucket="datasets", Key="shapes/")
    assert e.value.response["Error"]["Code"] == "404"
    # deleting the empty folder's marker removes the folder; the others' files stay
    b.delete_object(Bucket="inbox", Key="shapes/empty/")
    b.delete_objects(Bucket="inbox", Delete={"Objects": [{"Key": "shapes/c1/"}]})
    keys = [o["Key"] for o in b.list_objects_v2(Bucket="inbox", Prefix="shapes/")["Contents"]]
    assert "shapes/empty/" not in keys and "shapes/c1/" not in keys and "shapes/c1/5.png" in keys
    assert b.list_objects_v2(Bucket="inbox", Prefix="shapes/empty")["KeyCount"] == 0
    version = c.commit("shapes")["versions"][-1]
    assert version["samples"] == 12 and version["stats"]["per_class"] == {"c0": 6, "c1": 6}  # markers: no samples
    assert version["stats"]["quarantined"] == 0


def test_a_text_dataset_through_the_inbox_and_its_splits_read_back(server):
    """JSON Lines put in the inbox commit as a text version; S3 serves its split files."""
    c = Client(server.url, server.admin_token)
    b = s3(c.create_access_key())
    lines = [json.dumps({"text": f"note {i}"}) for i in range(20)] + ["not json"]
    b.put_object(Bucket="inbox", Key="notes/part-1.jsonl", Body="\n".join(lines[:10]).encode())
    b.put_object(Bucket="inbox", Key="notes/part-2.jsonl", Body="\n".join(lines[10:]).encode())
    version = c.commit("notes")["versions"][-1]
    assert version["samples"] == 20 and version["stats"]["format"] == "text"
    assert [q["path"] for q in version["quarantined"]] == ["part-2.jsonl:11"]
    keys = sorted(o["Key"] for o in b.list_objects_v2(Bucket="datasets", Prefix="notes/v1/")["Contents"])
    assert "notes/v1/train.jsonl" in keys and "notes/v1/val.jsonl" in keys
    body = b.get_object(Bucket="datasets", Key="notes/v1/train.jsonl")["Body"].read().decode()
    assert sorted(json.loads(x)["text"] for x in body.splitlines()) == sorted(f"note {i}" for i in range(20))


def test_objects_keep_their_headers_and_metadata_and_writes_can_be_conditional(server):
    """What ceph/s3-tests found missing (docs/s3-tests.md): metadata, copies' directives, a
    signed GET's response-* overrides, conditional PUTs, a repeated multipart completion, one
    part of a multipart object, UploadPartCopy."""
    b = s3(Client(server.url, server.admin_token).create_access_key())
    b.put_object(Bucket="inbox", Key="docs/a.txt", Body=b"hello", ContentType="text/bla", CacheControl="no-cache",
                 Metadata={"camera": "3", "site": "north"})
    for got in (b.get_object(Bucket="inbox", Key="docs/a.txt"), b.head_object(Bucket="inbox", Key="docs/a.txt")):
        assert got["ContentType"] == "text/bla" and got["CacheControl"] == "no-cache"
        assert got["Metadata"] == {"camera": "3", "site": "north"}
        # the endpoint shares the console's origin: nothing it serves runs there
        assert got["ResponseMetadata"]["HTTPHeaders"]["content-security-policy"] == "sandbox"
    url = b.generate_presigned_url("get_object", Params={"Bucket": "inbox", "Key": "docs/a.txt",
                                                         "ResponseContentType": "foo/bar",
                                                         "ResponseContentDisposition": "attachment"})
    r = requests.get(url, timeout=30)
    assert r.headers["content-type"] == "foo/bar" and r.headers["content-disposition"] == "attachment"
    put = b.put_object(Bucket="inbox", Key="docs/sum.txt", Body=b"summed", ChecksumAlgorithm="SHA256")
    head = b.head_object(Bucket="inbox", Key="docs/sum.txt", ChecksumMode="ENABLED")
    assert put["ChecksumSHA256"] == head["ChecksumSHA256"] == "QHKsIYbvviQZoyq4DDuZaDyMjrwSCbRvmyj4QnKR+YY="
    # boto3 asks for checksums on every GET and checks the body: a range must not carry the whole's
    assert b.get_object(Bucket="inbox", Key="docs/sum.txt", Range="bytes=1-3", ChecksumMode="ENABLED")[
        "Body"].read() == b"umm"
    assert "ChecksumSHA256" not in b.get_object(Bucket="inbox", Key="docs/sum.txt", Range="bytes=1-3",
                                                ChecksumMode="ENABLED")
    # a large object: its ETag the MD5 of its blocks, hashed as they came; its body sent from its
    # file to the socket (transport/zerocopy.py), whole or a range
    large = os.urandom(9 * 2**20 + 7)
    put = b.put_object(Bucket="inbox", Key="docs/large.bin", Body=large)
    assert put["ETag"] == f'"{hashlib.md5(large).hexdigest()}"'
    assert b.get_object(Bucket="inbox", Key="docs/large.bin", ChecksumMode="ENABLED")["Body"].read() == large
    assert b.get_object(Bucket="inbox", Key="docs/large.bin", Range="bytes=3-6000000")["Body"].read() == \
        large[3:6000001]
    with pytest.raises(ClientError) as e:
        b.put_object(Bucket="inbox", Key="docs/big.txt", Body=b"x", Metadata={"m": "v" * 2100})
    assert e.value.response["Error"]["Code"] == "MetadataTooLarge"

    # copies: the source's metadata unless REPLACE; onto itself only with REPLACE
    b.copy_object(Bucket="inbox", Key="docs/b.txt", CopySource="inbox/docs/a.txt")
    assert b.head_object(Bucket="inbox", Key="docs/b.txt")["Metadata"] == {"camera": "3", "site": "north"}
    with pytest.raises(ClientError) as e:
        b.copy_object(Bucket="inbox", Key="docs/a.txt", CopySource="inbox/docs/a.txt")
    assert e.value.response["Error"]["Code"] == "InvalidRequest"
    with pytest.raises(ClientError) as e:
        b.copy_object(Bucket="inbox", Key="docs/c.txt", CopySource="inbox/docs/a.txt", CopySourceIfMatch='"0123"')
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    b.copy_object(Bucket="inbox", Key="docs/a.txt", CopySource="inbox/docs/a.txt", MetadataDirective="REPLACE",
                  ContentType="text/plain", Metadata={"camera": "4"})
    got = b.get_object(Bucket="inbox", Key="docs/a.txt")
    assert got["ContentType"] == "text/plain" and got["Metadata"] == {"camera": "4"} and got["Body"].read() == b"hello"

    # conditional writes: nothing replaced when the condition fails
    with pytest.raises(ClientError) as e:
        b.put_object(Bucket="inbox", Key="docs/a.txt", Body=b"other", IfNoneMatch="*")
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    with pytest.raises(ClientError) as e:
        b.put_object(Bucket="inbox", Key="docs/a.txt", Body=b"other", IfMatch='"0123"')
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    assert b.get_object(Bucket="inbox", Key="docs/a.txt")["Body"].read() == b"hello"
    etag = b.head_object(Bucket="inbox", Key="docs/a.txt")["ETag"]
    b.put_object(Bucket="inbox", Key="docs/a.txt", Body=b"newer", IfMatch=etag)
    assert b.get_object(Bucket="inbox", Key="docs/a.txt")["Body"].read() == b"newer"

    # conditional reads (a whole-object GET reads its body with its entry: what the answer drops is closed)
    etag = b.head_object(Bucket="inbox", Key="docs/a.txt")["ETag"]
    with pytest.raises(ClientError) as e:
        b.get_object(Bucket="inbox", Key="docs/a.txt", IfNoneMatch=etag)
    assert e.value.response["Error"]["Code"] == "304"
    with pytest.raises(ClientError) as e:
        b.get_object(Bucket="inbox", Key="docs/a.txt", IfMatch='"0123"')
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    assert b.get_object(Bucket="inbox", Key="docs/a.txt", IfMatch=etag)["Body"].read() == b"newer"
    assert b.get_object(Bucket="inbox", Key="docs/a.txt", Range="bytes=1-2")["Body"].read() == b"ew"
    b.put_object(Bucket="inbox", Key="docs/empty.txt", Body=b"")
    assert b.get_object(Bucket="inbox", Key="docs/empty.txt")["Body"].read() == b""
    assert not list((server.home / "data" / "hot" / ".s3").glob("*/tmp/*"))  # the refused bodies are gone

    # multipart: its metadata, a completion repeated (a client's retry), one part read back, a copied part
    part = b"p" * (5 << 20)
    up = b.create_multipart_upload(Bucket="inbox", Key="docs/big.bin", ContentType="audio/ogg",
                                   Metadata={"take": "7"})["UploadId"]
    one = b.upload_part(Bucket="inbox", Key="docs/big.bin", UploadId=up, PartNumber=1, Body=part)["ETag"]
    two = b.upload_part_copy(Bucket="inbox", Key="docs/big.bin", UploadId=up, PartNumber=2,
                             CopySource="inbox/docs/b.txt", CopySourceRange="bytes=1-3")["CopyPartResult"]["ETag"]
    with pytest.raises(ClientError) as e:
        b.upload_part_copy(Bucket="inbox", Key="docs/big.bin", UploadId=up, PartNumber=3,
                           CopySource="inbox/docs/b.txt", CopySourceRange="bytes=0-21")
    assert e.value.response["Error"]["Code"] == "InvalidRange"
    with pytest.raises(ClientError) as e:
        b.upload_part_copy(Bucket="inbox", Key="docs/big.bin", UploadId=up, PartNumber=3,
                           CopySource="inbox/docs/b.txt", CopySourceRange="bytes=0-")
    assert e.value.response["Error"]["Code"] == "InvalidArgument"
    assert b.head_object(Bucket="inbox", Key="docs/b.txt")["ContentLength"] == 5  # the copy made a part, no object
    parts = {"Parts": [{"ETag": one, "PartNumber": 1}, {"ETag": two, "PartNumber": 2}]}
    done = b.complete_multipart_upload(Bucket="inbox", Key="docs/big.bin", UploadId=up, MultipartUpload=parts)
    again = b.complete_multipart_upload(Bucket="inbox", Key="docs/big.bin", UploadId=up, MultipartUpload=parts)
    assert again["ETag"] == done["ETag"] and done["ETag"].endswith('-2"')
    got = b.get_object(Bucket="inbox", Key="docs/big.bin", PartNumber=2)
    assert got["Body"].read() == b"ell" and got["PartsCount"] == 2 and got["ContentType"] == "audio/ogg"
    assert got["Metadata"] == {"take": "7"}
    with pytest.raises(ClientError) as e:
        b.get_object(Bucket="inbox", Key="docs/b.txt", PartNumber=2)
    assert e.value.response["Error"]["Code"] == "InvalidPart"
    assert b.get_object(Bucket="inbox", Key="docs/b.txt", PartNumber=1)["Body"].read() == b"hello"

    # a checksummed multipart upload: each part checked as it arrives, the list checked at the end
    up = b.create_multipart_upload(Bucket="inbox", Key="docs/sha.bin", ChecksumAlgorithm="SHA256")
    assert up["ChecksumAlgorithm"] == "SHA256"
    sent = [b.upload_part(Bucket="inbox", Key="docs/sha.bin", UploadId=up["UploadId"], PartNumber=n, Body=body,
                          ChecksumAlgorithm="SHA256") for n, body in ((1, part), (2, b"tail"))]
    listed = [{"ETag": r["ETag"], "ChecksumSHA256": r["ChecksumSHA256"], "PartNumber": n}
              for n, r in enumerate(sent, 1)]
    assert [p["ChecksumSHA256"] for p in b.list_parts(Bucket="inbox", Key="docs/sha.bin",
                                                      UploadId=up["UploadId"])["Parts"]] == \
        [r["ChecksumSHA256"] for r in sent]  # a client resuming an upload gets each part's checksum back
    with pytest.raises(ClientError) as e:
        b.complete_multipart_upload(Bucket="inbox", Key="docs/sha.bin", UploadId=up["UploadId"],
                                    MultipartUpload={"Parts": [{**listed[0], "ChecksumSHA256": listed[1][
                                        "ChecksumSHA256"]}, listed[1]]})
    assert e.value.response["Error"]["Code"] == "BadDigest"
    done = b.complete_multipart_upload(Bucket="inbox", Key="docs/sha.bin", UploadId=up["UploadId"],
                                       MultipartUpload={"Parts": listed})
    assert done["ChecksumSHA256"].endswith("-2") and done["ChecksumType"] == "COMPOSITE"
    head = b.head_object(Bucket="inbox", Key="docs/sha.bin", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == done["ChecksumSHA256"]
    second = b.get_object(Bucket="inbox", Key="docs/sha.bin", PartNumber=2, ChecksumMode="ENABLED")
    assert second["Body"].read() == b"tail" and second["ChecksumSHA256"] == sent[1]["ChecksumSHA256"]
    attrs = b.get_object_attributes(Bucket="inbox", Key="docs/sha.bin",
                                    ObjectAttributes=["ETag", "Checksum", "ObjectParts", "ObjectSize"])
    assert attrs["ObjectSize"] == len(part) + 4 and attrs["Checksum"]["ChecksumSHA256"] == done["ChecksumSHA256"]
    assert attrs["ObjectParts"]["TotalPartsCount"] == 2 and f'"{attrs["ETag"]}"' == done["ETag"]
    assert [p["ChecksumSHA256"] for p in attrs["ObjectParts"]["Parts"]] == [r["ChecksumSHA256"] for r in sent]

    # boto3's own large upload (parts with its default CRC32) and download (checked against it)
    big = os.urandom(12 << 20)
    (server.home / "big.bin").write_bytes(big)
    from boto3.s3.transfer import TransferConfig
    b.upload_file(str(server.home / "big.bin"), "inbox", "docs/upload.bin",
                  Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    got = b.get_object(Bucket="inbox", Key="docs/upload.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == big and got["ETag"].endswith('-3"')

    # CRC32C and CRC64NVME (boto3 computes them with awscrt): kept, given back, checked by the
    # client on every whole-object GET; CRC64NVME uploads in parts are the whole object's CRC
    for algorithm in ("CRC32C", "CRC64NVME"):
        field = f"Checksum{algorithm}"
        put = b.put_object(Bucket="inbox", Key=f"docs/{algorithm}.bin", Body=part, ChecksumAlgorithm=algorithm)
        got = b.get_object(Bucket="inbox", Key=f"docs/{algorithm}.bin", ChecksumMode="ENABLED")
        assert got["Body"].read() == part and got[field] == put[field]
        with pytest.raises(ClientError) as e:  # a body that is not what its checksum says
            b.put_object(Bucket="inbox", Key=f"docs/{algorithm}-bad.bin", Body=b"abc", **{field: put[field]})
        assert e.value.response["Error"]["Code"] == "BadDigest"
    b.upload_file(str(server.home / "big.bin"), "inbox", "docs/crc64.bin", ExtraArgs={"ChecksumAlgorithm": "CRC64NVME"},
                  Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    got = b.get_object(Bucket="inbox", Key="docs/crc64.bin", ChecksumMode="ENABLED")
    assert got["Body"].read() == big and got["ChecksumType"] == "FULL_OBJECT" and "-" not in got["ChecksumCRC64NVME"]
    with pytest.raises(ClientError) as e:
        b.create_multipart_upload(Bucket="inbox", Key="docs/x.bin", ChecksumAlgorithm="CRC64NVME",
                                  ChecksumType="COMPOSITE")
    assert e.value.response["Error"]["Code"] == "InvalidRequest"


def test_virtual_host_style_where_the_server_has_a_domain(tmp_path, monkeypatch):
    """With DEEPPOD_S3_DOMAIN, BUCKET.<domain> names the bucket in the host (what boto3 does with
    addressing_style virtual, and AWS by default); the domain's own name stays path-style. The
    wildcard DNS name is the administrator's: here getaddrinfo answers it."""
    import socket as sockets

    real = sockets.getaddrinfo
    monkeypatch.setattr(sockets, "getaddrinfo", lambda host, *a, **kw: real(
        "127.0.0.1" if str(host).endswith("s3.deeppod.test") else host, *a, **kw))
    s = LiveServer(tmp_path / "home", extra_env={"DEEPPOD_S3_DOMAIN": "s3.deeppod.test"}).start()
    try:
        key = Client(s.url, s.admin_token).create_access_key()
        endpoint = f"http://s3.deeppod.test:{s.port}/s3"
        virtual = s3({**key, "endpoint": endpoint}, s3={"addressing_style": "virtual"})
        virtual.put_object(Bucket="inbox", Key="cats/c0/v.png", Body=b"virtual")
        sent = virtual.get_object(Bucket="inbox", Key="cats/c0/v.png")
        assert sent["Body"].read() == b"virtual"
        assert [o["Key"] for o in virtual.list_objects_v2(Bucket="inbox", Prefix="cats/")["Contents"]] == \
            ["cats/c0/v.png"]
        path = s3({**key, "endpoint": endpoint}, s3={"addressing_style": "path"})
        assert path.get_object(Bucket="inbox", Key="cats/c0/v.png")["Body"].read() == b"virtual"
        with pytest.raises(ClientError) as e:  # a name under the domain that is no bucket's
            s3({**key, "endpoint": endpoint}, s3={"addressing_style": "virtual"}).list_objects_v2(Bucket="pets")
        assert e.value.response["Error"]["Code"] == "NoSuchBucket"
        # Signature Version 2 in the Authorization header (older clients and devices), both styles:
        # a virtual-host request signs /BUCKET/KEY, whose bucket the server takes from the host
        for style in ("virtual", "path"):
            v2 = s3({**key, "endpoint": endpoint}, signature_version="s3", s3={"addressing_style": style})
            sent = []
            v2.meta.events.register("before-send.s3", lambda request, **_: sent.append(
                (request.url, request.headers["Authorization"])))
            v2.put_object(Bucket="inbox", Key=f"cats/c0/{style} v2.png", Body=b"v2", ContentType="image/png")
            got = v2.get_object(Bucket="inbox", Key=f"cats/c0/{style} v2.png")
            assert got["Body"].read() == b"v2" and got["ContentType"] == "image/png"
            assert all(a.decode().startswith(f"AWS {key['key_id']}:") for _, a in sent) and len(sent) == 2
            assert all(u.startswith("http://inbox.s3.deeppod.test") == (style == "virtual") for u, _ in sent)
            wrong = s3({**key, "secret": "x" * 40, "endpoint": endpoint}, signature_version="s3",
                       s3={"addressing_style": style})
            with pytest.raises(ClientError) as e:
                wrong.put_object(Bucket="inbox", Key=f"cats/c0/{style} wrong.png", Body=b"no")
            assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
            with pytest.raises(ClientError) as e:
                path.head_object(Bucket="inbox", Key=f"cats/c0/{style} wrong.png")
            assert e.value.response["Error"]["Code"] == "404"  # nothing was written
        for write in (False, True):  # a key is a file's name: no control characters (s3-tests' read_unreadable)
            with pytest.raises(ClientError) as e:
                (path.put_object(Bucket="inbox", Key="cats/c0/a\nb.png", Body=b"x") if write else
                 path.get_object(Bucket="inbox", Key="cats/c0/\xae\x8a-"))
            assert (e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]) == \
                ("InvalidURI", 400) and "control character" in e.value.response["Error"]["Message"]
    finally:
        s.stop()


def test_a_key_made_and_revoked_in_the_console_signs_for_boto3(server, browser):  # noqa: F811 - the fixture
    """The admin page makes a key and shows it once with the commands to use it; the key works
    in boto3 with the scope chosen; a bad name is refused by its field; revoked there, it stops."""
    page = sign_in(browser, server.url, server.admin_token)
    page.goto(server.url + "/admin")
    page.fill("#f-key_name", "x" * 200)
    page.click("#key-form button[type=submit]")
    assert "at most 128" in page.inner_text("#e-key_name")
    page.fill("#f-key_name", "browser")
    page.select_option("#f-key_scope", "read")
    page.select_option("#f-key_expires_days", "7")
    page.click("#key-form button[type=submit]")
    usage = page.inner_text("#s3-usage")
    key_id = usage.split("AWS_ACCESS_KEY_ID=")[1].split()[0]
    secret = usage.split("AWS_SECRET_ACCESS_KEY=")[1].split()[0]
    assert f"--endpoint-url {server.url}/s3 " in usage and key_id.startswith("DPK")
    row = page.locator(f'#access-keys tr[data-key="{key_id}"]')
    assert "read" in row.inner_text() and "browser" in row.inner_text()
    shot(page, "admin-access-keys")
    b = s3({"endpoint": server.url + "/s3", "key_id": key_id, "secret": secret})
    assert {x["Name"] for x in b.list_buckets()["Buckets"]} >= {"datasets", "inbox"}
    with pytest.raises(ClientError) as refused:  # read-only: no uploads
        b.put_object(Bucket="inbox", Key="cats/a.png", Body=b"x")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    page.reload()  # no secret on the page once it has been shown
    assert secret not in page.content()
    page.once("dialog", lambda d: d.accept())
    row.locator("button").click()
    page.wait_for_selector("#message")
    assert f"{key_id} revoked" in page.inner_text("#message")
    assert "revoked" in page.locator(f'#access-keys tr[data-key="{key_id}"]').inner_text()
    wait_until(lambda: _refused(b), 10, what="the revoked key to be refused")
    page.context.close()


def _refused(client) -> bool:
    try:
        client.list_objects_v2(Bucket="inbox")
        return False
    except ClientError as e:
        return e.response["Error"]["Code"] == "InvalidAccessKeyId"


@pytest.mark.timeout(300)
def test_either_server_of_a_failover_pair_answers(tmp_path, pg_url):
    """A key made on the leader signs for the standby too (the secret comes from the pair's
    shared key); what one server took in, the other lists, commits and serves."""
    home, env = tmp_path / "home", {"DEEPPOD_DATABASE_URL": pg_url}
    a = LiveServer(home, extra_env=env).start()
    b = LiveServer(home, extra_env=env)
    try:
        b.start()
        key = Client(a.url, a.admin_token).create_access_key()
        on_a, on_b = s3(key), s3({**key, "endpoint": b.url + "/s3"})
        folder = images(tmp_path / "shapes", per_class=4)
        for path in sorted(folder.rglob("*.png")):
            on_b.put_object(Bucket="inbox", Key=f"shapes/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())
        assert on_a.list_objects_v2(Bucket="inbox", Prefix="shapes/")["KeyCount"] == 12
        on_b.put_object(Bucket="inbox", Key="shapes/.commit", Body=b"")  # the device's "that is all", to the standby
        c = Client(a.url, a.admin_token)
        wait_until(lambda: any(d["name"] == "shapes" and d["versions"] for d in c.datasets()), 60, what="the commit")
        assert c.dataset("shapes")["versions"][-1]["lineage"]["via"] == f"s3 by {key['key_id']}"
        local = (folder / "c1" / "2.png").read_bytes()
        assert on_a.get_object(Bucket="datasets", Key="shapes/v1/c1/2.png")["Body"].read() == local
        assert on_b.get_object(Bucket="datasets", Key="shapes/v1/c1/2.png")["Body"].read() == local
    finally:
        b.stop()
        a.stop()


@pytest.mark.timeout(300)
def test_s3_on_a_port_of_its_own_serves_minio_aws_and_boto3_and_the_path_form_stays(tmp_path):
    """--s3-port: the same endpoint at the root of a port of its own, for clients that take a host,
    not a URL (MinIO's SDK); the same keys and objects through it and through /s3."""
    import io

    from minio import Minio

    from tests.helpers import free_port

    port = free_port()
    s = LiveServer(tmp_path / "home", isolation=None, extra_env={"DEEPPOD_S3_PORT": str(port)}).start()
    try:
        c = Client(s.url, s.admin_token)
        key = c.create_access_key("minio")
        assert key["endpoint"] == f"http://127.0.0.1:{port}"  # the one every client takes
        m = Minio(f"127.0.0.1:{port}", access_key=key["key_id"], secret_key=key["secret"], secure=False,
                  region="us-east-1")
        body = b"x" * 70_000
        m.put_object("inbox", "notes/a.bin", io.BytesIO(body), len(body))
        got = m.get_object("inbox", "notes/a.bin")
        try:
            assert got.read() == body
        finally:
            got.close()
            got.release_conn()
        assert [o.object_name for o in m.list_objects("inbox", prefix="notes/")] == ["notes/a.bin"]
        assert {b.name for b in m.list_buckets()} >= {"inbox", "datasets", "models", "jobs"}
        assert "notes/a.bin" in aws(key, "s3", "ls", "--recursive", "s3://inbox/")
        assert s3(key).head_object(Bucket="inbox", Key="notes/a.bin")["ContentLength"] == len(body)
        path_form = {**key, "endpoint": s.url + "/s3"}  # the path form keeps working beside it
        assert s3(path_form).get_object(Bucket="inbox", Key="notes/a.bin")["Body"].read() == body
        m.remove_object("inbox", "notes/a.bin")
        assert aws(path_form, "s3", "ls", "--recursive", "s3://inbox/") == ""
        bad = Minio(f"127.0.0.1:{port}", access_key=key["key_id"], secret_key="wrong" * 8, secure=False,
                    region="us-east-1")
        with pytest.raises(Exception, match="SignatureDoesNotMatch"):
            list(bad.list_objects("inbox"))
    finally:
        s.stop()
        s.cleanup_jobs()

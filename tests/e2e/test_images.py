"""Jobs in container images (--image), for real, as root with sandboxing (the default a user
gets): an archive the administrator offers is unpacked once, and the job runs on the image's
root file system as its tenant's identity, with the image's ENV, the host's files out of
sight, the image read-only and its own folders writable; the console offers the images."""

import pwd
import re

import pytest

from deeppod import Client
from deeppod.executor import sandbox
from tests.e2e.browser import shot, sign_in
from tests.helpers import LiveServer, image_archive

pytestmark = pytest.mark.skipif(sandbox.supported() is not None, reason=str(sandbox.supported()))

SCRIPT = ("cat /etc/image-release; echo greeting=$IMAGE_GREETING; echo uid=$(id -u); "
          "ls /etc/old-file || echo no-old-file; ls /usr/lib/python3* || echo no-host-python; "
          "touch /etc/mine || echo image-read-only; touch $DEEPPOD_CHECKPOINT_DIR/ok && echo checkpoints-writable; "
          "echo rank=$RANK world=$WORLD_SIZE")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    offered = root / "images"
    offered.mkdir()
    image_archive(offered, "tiny")
    image_archive(offered, "tiny-docker", "docker")
    s = LiveServer(root / "home", isolation=None, extra_env={"DEEPPOD_IMAGE_DIR": str(offered)}).start()
    yield s
    s.stop()
    s.cleanup_jobs()


def _log(server, job_id, rank=0) -> str:
    return (server.home / "jobs" / str(job_id) / "logs" / f"rank-{rank}.log").read_text()


def test_a_job_runs_in_its_image_as_its_tenant(server):
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    assert [(i["name"], i["unpacked"]) for i in c.images()] == [("tiny", False), ("tiny-docker", False)]
    jobs = [c.submit(["sh", "-c", SCRIPT], own_folder=True, gpus_per_worker=0, workers=2, image="tiny")
            for _ in range(2)]
    done = [c.wait(j["id"], timeout=300) for j in jobs]
    logs = [_log(server, j["id"], rank) for j in jobs for rank in (0, 1)]
    assert all(d["state"] == "succeeded" for d in done), (
        [(d["id"], d["state"], d["reason"], c.events(d["id"])) for d in done], logs)
    for out in logs:
        assert "v2\n" in out and "greeting=hello" in out and "no-old-file" in out, out
        assert "no-host-python" in out and "image-read-only" in out and "checkpoints-writable" in out, out
        uid = int(re.search(r"uid=(\d+)", out).group(1))
        assert pwd.getpwuid(uid).pw_name.startswith("deeppod-"), out  # the tenant's identity, never root's
    assert "rank=1 world=2" in _log(server, done[0]["id"], 1)
    assert sum(out.count("unpacking image tiny") for out in logs) == 1, logs  # once for both jobs
    assert done[0]["image"] == "tiny" and done[0]["env_key"] == done[1]["env_key"]
    assert [i["unpacked"] for i in c.images()] == [True, False]
    cached = [e for e in c.envs() if e.get("image")]
    assert [(e["image"], e["tenant"], e["key"]) for e in cached] == [("tiny", "(shared)", done[0]["env_key"])]

    # an evicted image is unpacked again by the next job that wants it
    c.remove_env(done[0]["env_key"])
    again = c.wait(c.submit(["sh", "-c", "cat /etc/image-release"], own_folder=True, gpus_per_worker=0,
                            image="tiny")["id"], timeout=300)
    assert again["state"] == "succeeded" and "unpacking image tiny" in _log(server, again["id"])


def test_a_docker_archive_runs_too_and_bad_names_are_refused(server):
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    done = c.wait(c.submit(["sh", "-c", "cat /etc/image-release; echo $IMAGE_GREETING"], own_folder=True,
                           gpus_per_worker=0, image="tiny-docker")["id"], timeout=300)
    assert done["state"] == "succeeded" and "v2\nhello" in _log(server, done["id"])
    for bad, words in (("/etc/passwd", "give one of the names it offers"), ("nope", "tiny, tiny-docker")):
        with pytest.raises(Exception, match=words):
            c.submit(["sh"], own_folder=True, gpus_per_worker=0, image=bad)
    with pytest.raises(Exception, match="leave out --requirements"):
        c.submit(["sh"], own_folder=True, gpus_per_worker=0, image="tiny", requirements=["numpy"])
    missing = c.wait(c.submit(["no-such-program"], own_folder=True, gpus_per_worker=0, image="tiny")["id"],
                     timeout=300)
    assert missing["state"] == "failed" and "no-such-program" in _log(server, missing["id"])


def test_the_console_offers_the_images(server, browser):
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    page = sign_in(browser, server.url, server.admin_token)
    page.goto(server.url + "/jobs/new")
    assert page.locator("#f-image option").all_inner_texts() == ["(none: the platform's software)", "tiny",
                                                                 "tiny-docker"]
    assert page.locator("#f-network option").all_inner_texts() == ["(the server's: host)", "host", "isolated", "none"]
    page.fill("#f-command", "sh -c 'cat /etc/image-release'")
    page.fill("#f-gpus_per_worker", "0")
    page.select_option("#f-image", "tiny")
    page.fill("#f-requirements", "numpy")
    page.click("#submit-form button[type=submit]")
    assert "leave out --requirements" in page.inner_text("#e-image")
    shot(page, "submit-image-refused")
    page.fill("#f-requirements", "")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    assert c.wait(job_id, timeout=300)["state"] == "succeeded"
    page.reload()
    page.wait_for_selector("#job-image")
    assert "tiny" in page.inner_text("#job-image")
    shot(page, "job-in-image")
    page.context.close()

"""The job folder protocol (job_folder.py) and atomic replacement (atomic.py): each file's
round trip, who may read it, and what a half-done write leaves behind."""

import json
import os
import stat

import pytest

from deeppod.atomic import atomic_file, atomic_write
from deeppod.contract import JOINER_READY, RESIZABLE_MARK, WORLD_ACK
from deeppod.job_folder import JobFolder


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_write_has_its_mode_from_the_start_and_replaces_whole(tmp_path):
    path = tmp_path / "sub" / "token"
    atomic_write(path, "one")
    assert path.read_text() == "one" and mode(path) == 0o600
    atomic_write(path, b"two", mode=0o644)
    assert path.read_bytes() == b"two" and mode(path) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temporary file left


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "result.json"
    atomic_write(path, "old")
    with pytest.raises(ValueError), atomic_file(path) as f:
        f.write(b"half")
        raise ValueError("refused")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_a_new_run_starts_from_a_clean_folder(tmp_path):
    folder = JobFolder.of(tmp_path, 7)
    folder.clear_run()
    folder.write_spec({"workers": [{"rank": 0, "env": {"DEEPPOD_TOKEN": "secret"}}]})
    assert mode(folder.root / "spec.json") == 0o600  # it holds the job's token
    assert folder.read_spec()["workers"][0]["env"]["DEEPPOD_TOKEN"] == "secret"
    folder.write_result({"exit_codes": {"0": 0}})
    folder.write_result({"exit_codes": {"1": 0}}, part=1)
    folder.write_pids({"0": 123})
    folder.record_exit(0, 3)
    folder.write_grow(1, [{"rank": 1}])
    folder.ask_stop("stop")
    assert folder.exit_codes() == {0: 3} and folder.read_result(1) == {"exit_codes": {"1": 0}}
    folder.clear_run()
    assert folder.read_result() is None and folder.read_result(1) is None and folder.exit_codes() == {}
    assert folder.grows() == [] and folder.read_stop() is None and folder.logs.is_dir()
    assert folder.read_spec()["workers"]  # the spec is the next run's to write over


def test_the_first_stop_word_stays(tmp_path):
    folder = JobFolder(tmp_path)
    folder.ask_stop("rank 2 failed on another node")
    folder.ask_stop("stop")
    assert folder.read_stop() == "rank 2 failed on another node"


def test_spares_and_grows_round_trip_and_a_bad_spare_count_is_none(tmp_path):
    folder = JobFolder(tmp_path)
    assert folder.spares_changed_at() is None and folder.read_spares() == 0
    folder.write_spares(2)
    assert folder.read_spares() == 2 and folder.spares_changed_at() is not None
    (tmp_path / "spares.json").write_text("{not json")
    assert folder.read_spares() == 0
    folder.write_grow(3, [{"rank": 4, "env": {}}])
    [grow] = folder.grows()
    assert folder.read_grow(grow) == [{"rank": 4, "env": {}}] and mode(grow) == 0o600


def test_the_world_is_readable_by_the_job_and_a_new_run_forgets_the_last_ones_marks(tmp_path):
    folder = JobFolder(tmp_path)
    folder.checkpoints.mkdir()
    folder.reset_world()
    folder.write_world({"generation": 1, "world_size": 2})
    assert mode(folder.world_file) == 0o644 and json.loads(folder.world_file.read_text())["generation"] == 1
    for name in (RESIZABLE_MARK, WORLD_ACK, JOINER_READY.format(rank=3)):
        (folder.checkpoints / name).write_text("{}")
    assert folder.resizable() and folder.joiners_ready([3]) and not folder.joiners_ready([3, 4])
    folder.reset_world()
    assert not folder.world_file.exists() and not folder.resizable() and not folder.joiners_ready([3])


def test_the_jobs_answer_is_read_without_following_a_link_and_only_when_small(tmp_path):
    folder = JobFolder(tmp_path)
    folder.checkpoints.mkdir()
    secret = tmp_path / "server-secret.json"
    secret.write_text(json.dumps({"generation": 9}))
    (folder.checkpoints / WORLD_ACK).symlink_to(secret)
    assert folder.read_ack() is None  # a link the job planted is not followed
    (folder.checkpoints / WORLD_ACK).unlink()
    (folder.checkpoints / WORLD_ACK).write_text(json.dumps({"generation": 2, "pad": "x" * 5000}))
    assert folder.read_ack() is None
    (folder.checkpoints / WORLD_ACK).write_text(json.dumps({"generation": 2, "at": 1.5}))
    assert folder.read_ack() == {"generation": 2, "at": 1.5}
    (folder.checkpoints / WORLD_ACK).write_text(json.dumps({"generation": "2"}))
    assert folder.read_ack() is None


def test_rank_logs_are_found_by_rank(tmp_path):
    folder = JobFolder(tmp_path)
    folder.clear_run()
    for name in ("rank-0.log", "rank-12.log", "rank-x.log", "spare-0.log"):
        (folder.logs / name).write_text("")
    assert sorted(folder.rank_logs()) == [0, 12] and folder.log(12) == folder.rank_logs()[12]

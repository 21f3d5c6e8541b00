"""Reading several ranks' logs: interleaved by when each line was written (the supervisor's
stamps of each log's size), not rank by rank."""

import pytest

from deeppod.jobs.logs import stream_logs
from tests.executor.test_local import finished, launch

PING_PONG = """
import os, pathlib, time
r = int(os.environ["RANK"])
logs = pathlib.Path("job/logs")

def stamped():  # the supervisor has stamped everything this rank wrote so far
    log, marks = logs / f"rank-{r}.log", logs / f"rank-{r}.marks"
    while True:
        try:
            if int(marks.read_text().split()[-2]) >= log.stat().st_size:
                return
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)

for n in range(4):
    if n % 2 != r:
        continue
    while n and not pathlib.Path(f"turn-{n}").exists():
        time.sleep(0.02)
    print(f"line {n}", flush=True)
    stamped()
    pathlib.Path(f"turn-{n + 1}").touch()
"""


def read(job_dir, ranks, follow=False):
    return b"".join(stream_logs(job_dir, ranks, follow=follow, finished=lambda: True)).decode()


@pytest.mark.slow  # it starts processes
def test_two_ranks_lines_come_in_the_order_they_were_written(tmp_path):
    ex, h = launch(tmp_path, PING_PONG, workers=2)
    assert finished(ex, h, 60).exit_codes == {0: 0, 1: 0}
    want = "[rank 0] line 0\n[rank 1] line 1\n[rank 0] line 2\n[rank 1] line 3\n"
    assert read(tmp_path / "job", [0, 1]) == want
    assert read(tmp_path / "job", [0, 1], follow=True) == want
    assert read(tmp_path / "job", [1]) == "line 1\nline 3\n"  # one rank: its output as it is


def test_lines_not_yet_stamped_come_last_and_a_partial_line_is_kept(tmp_path):
    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_bytes(b"a1\na2\nnot stamped\n")
    (logs / "rank-0.marks").write_text("3 100.0\n6 102.0\n")
    (logs / "rank-1.log").write_bytes(b"b1\nhalf a line")
    (logs / "rank-1.marks").write_text("3 101.0\n")
    assert read(tmp_path / "job", [0, 1]) == ("[rank 0] a1\n[rank 1] b1\n[rank 0] a2\n[rank 0] not stamped\n"
                                              "[rank 1] half a line\n")
    assert read(tmp_path / "job", [0, 1, 2]).count("\n") == 5  # a rank with no log yet

"""units.py: one way to write a number of bytes, in the CLI and the console (issue 71: a 9.1 kB
dataset was "0.0 MiB" on its page), and one way to read and write a time limit (issue 73)."""

import pytest

from deeppod.errors import InvalidRequest
from deeppod.units import duration_text, size_text, time_limit_seconds


def test_sizes_read_the_same_everywhere_at_three_digits():
    assert [size_text(n) for n in (0, 812, 9_100, 48_260_000, 1_270_000_000, 123_400_000_000, None)] == [
        "0 B", "812 B", "9.1 kB", "48.3 MB", "1.27 GB", "123 GB", "-"]


def test_the_console_pages_use_it():
    from deeppod.ui.render import env

    assert env.filters["size"](9_100) == "9.1 kB"
    for page in ("dataset.html", "datasets.html", "compare.html"):
        source = env.loader.get_source(env, page)[0]
        assert "1048576" not in source and "|size" in source, page


@pytest.mark.parametrize("text,seconds", [("90m", 5400), ("12h", 43200), ("2d", 172800), ("45s", 45), ("1.5h", 5400),
                                          ("30:00", 1800), ("1:30:00", 5400), ("1-12", 129600),
                                          ("1-12:30", 131400), ("1-12:00:00", 129600), (" 36h ", 129600)])
def test_a_time_limit_reads_as_users_and_slurm_write_it_and_writes_back_short(text, seconds):
    assert time_limit_seconds(text) == seconds
    assert time_limit_seconds(duration_text(seconds)) == seconds


@pytest.mark.parametrize("text", ["90", "", "h", "-1h", "1:2:3:4", "x-1", "1:-5", "0m", "infh", "twelve hours"])
def test_a_time_limit_that_is_none_is_refused_with_what_to_write(text):
    with pytest.raises(InvalidRequest, match="is not a time limit: use e.g. 90m, 12h, 2d or as Slurm writes it"):
        time_limit_seconds(text, "--time")

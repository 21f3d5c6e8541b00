"""units.py: one way to write a number of bytes, in the CLI and the console (issue 71: a 9.1 kB
dataset was "0.0 MiB" on its page)."""

from deeppod.units import size_text


def test_sizes_read_the_same_everywhere_at_three_digits():
    assert [size_text(n) for n in (0, 812, 9_100, 48_260_000, 1_270_000_000, 123_400_000_000, None)] == [
        "0 B", "812 B", "9.1 kB", "48.3 MB", "1.27 GB", "123 GB", "-"]


def test_the_console_pages_use_it():
    from deeppod.ui.render import env

    assert env.filters["size"](9_100) == "9.1 kB"
    for page in ("dataset.html", "datasets.html", "compare.html"):
        source = env.loader.get_source(env, page)[0]
        assert "1048576" not in source and "|size" in source, page

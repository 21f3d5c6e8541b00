"""A job's requirements checked and keyed (envs/spec.py)."""

import pytest

from deeppod.envs.spec import parse
from deeppod.errors import InvalidRequest


def test_requirements_are_normalized_and_keyed_by_what_changes_the_environment():
    a = parse("numpy==2.1.0\n# a comment\n\ntorch >= 2.4  # the platform's is fine\n", None)
    b = parse("torch>=2.4\nnumpy==2.1.0\nnumpy==2.1.0\n", None)
    assert a.requirements == ("numpy==2.1.0", "torch>=2.4") and a == b
    assert a.key(1, {}) == b.key(1, {})
    assert a.key(1, {}) != a.key(2, {})  # tenants never share one
    assert a.key(1, {}) != a.key(1, {"index_url": "https://mirror/simple"})
    assert a.key(1, {}) != parse("numpy==2.1.1\ntorch>=2.4", None).key(1, {})
    assert parse("", None) is None and parse(None, None) is None and parse("# nothing\n", None) is None
    assert parse("", "3.12").python == "3.12"
    assert parse('pandas[performance]>=2; python_version >= "3.10"', None).requirements


@pytest.mark.parametrize("line", ["--index-url ftp://evil/simple", "-e .", "git+https://x/y.git", "./pkg",
                                  "/opt/wheel.whl", "pkg @ https://x/pkg.whl", "https://x/pkg.whl", "-r other.txt",
                                  "--trusted-host evil", "--find-links https://evil/wheels", "--index-url"])
def test_anything_that_points_the_builder_elsewhere_is_refused(line):
    with pytest.raises(InvalidRequest, match="not a package requirement"):
        parse(f"numpy\n{line}\n", None)


def test_bad_python_and_size():
    for bad in ("python3", "3", "latest", "3.12; rm -rf /"):
        with pytest.raises(InvalidRequest, match="is not a version"):
            parse("numpy", bad)
    with pytest.raises(InvalidRequest, match="KiB"):
        parse("numpy\n" * 20000, None)


def test_a_requirements_file_may_name_package_indexes():
    """Each must be one the tenant's plan allows (jobs/quotas.check_indexes); they take the
    place of the server's no-index, and change the key."""
    spec = parse("numpy==2.1.0\n--index-url https://mirror.example.com/simple/\n"
                 "--extra-index-url=http://10.0.0.5:8080/simple\n", None)
    assert spec.requirements == ("numpy==2.1.0",) and spec.indexes == [
        "https://mirror.example.com/simple", "http://10.0.0.5:8080/simple"]
    assert spec.lines() == ["--index-url https://mirror.example.com/simple",
                            "--extra-index-url http://10.0.0.5:8080/simple", "numpy==2.1.0"]
    assert parse("\n".join(spec.lines()), None) == spec  # as stored with the job, parsed again at start
    server = {"index_url": "https://pypi.internal/simple", "extra_index_url": "https://extra/simple", "no_index": True}
    assert spec.index(server) == {"index_url": "https://mirror.example.com/simple",
                                  "extra_index_url": "https://extra/simple http://10.0.0.5:8080/simple"}
    plain = parse("numpy==2.1.0", None)
    assert plain.index(server) == server and plain.key(1, plain.index(server)) != spec.key(1, spec.index(server))
    with pytest.raises(InvalidRequest, match="a second --index-url"):
        parse("-i https://a/simple\n--index-url https://b/simple\nnumpy", None)


def test_a_marker_is_parsed_and_written_back_never_passed_on_as_it_came():
    """Issue 70: a line's part after ';' was kept verbatim: uv refuses '-r /etc/shadow' there
    today, but pip (the fallback) takes per-line options. Only a marker's own tokens pass."""
    spec = parse('numpy==2.1.0 ;python_version>="3.10"  and sys_platform == "linux"', None)
    assert spec.requirements == ('numpy==2.1.0; python_version >= "3.10" and sys_platform == "linux"',)
    grouped = parse("pandas; (os_name == 'nt' or 'linux' in sys_platform) and extra not in 'x'", None)
    assert grouped.requirements == ("pandas; ( os_name == 'nt' or 'linux' in sys_platform ) and extra not in 'x'",)
    for bad in ('numpy; python_version > "3" -r /etc/shadow', 'numpy; python_version > "3" --global-option=x',
                'numpy; __import__("os")', "numpy; python_version > '3' \\",
                'numpy; os_name == "posix" and', 'numpy; (python_version > "3"', 'numpy; python_version "3"',
                'numpy; and os_name == "nt"', 'numpy; os_name not "nt"'):
        with pytest.raises(InvalidRequest, match="not an environment marker|not a package requirement"):
            parse(bad, None)

"""A misspelt package is refused at submit with the nearest names (envs/names.py), and a build
that fails says the installer's whole message (envs/build.py)."""

import http.server
import threading

import pytest

from deeppod.envs import build, names
from deeppod.envs.spec import parse
from deeppod.errors import InvalidRequest
from tests.helpers import wheel


@pytest.fixture
def wheels(tmp_path):
    wheel(tmp_path, "deeppod-probe", "1.2.3", "x")
    wheel(tmp_path, "tiny_tool", "0.1", "y")
    return str(tmp_path)


def test_a_name_missing_from_the_servers_folder_of_packages_is_refused_with_the_nearest(wheels):
    index = {"find_links": wheels, "no_index": True}
    names.check(parse("deeppod-probe==1.2.3\nTiny.Tool>=0.1; python_version >= '3.8'\n", None), index)
    with pytest.raises(InvalidRequest, match="no package named 'deeppod-prob' in this server's folder of packages "
                                             r"\(no index\); did you mean 'deeppod-probe'\?") as refused:
        names.check(parse("deeppod-prob==1.2.3\n", None), index)
    assert "nothing was submitted" in str(refused.value)
    # a name installed beside the server is offered too (pytest is, here)
    with pytest.raises(InvalidRequest, match="did you mean 'pytest'"):
        names.check(parse("pytets\n", None), index)


def test_an_index_is_asked_and_only_its_404_refuses(wheels):
    asked = []

    def ask(url):
        asked.append(url)
        return {"https://pypi.org/simple/numpy/": True, "https://pypi.org/simple/numpyy/": False}.get(url)

    index = {"find_links": wheels}  # the folder first, then the index (PyPI: the server names none)
    names.check(parse("numpy\ndeeppod-probe\n", None), index, ask=ask)
    assert asked == ["https://pypi.org/simple/numpy/"]
    with pytest.raises(InvalidRequest, match="no package named 'numpyy' in https://pypi.org/simple"):
        names.check(parse("numpyy==2.1\n", None), index, ask=ask)
    names.check(parse("unreachable-pkg\n", None), index, ask=ask)  # no answer: the build decides
    both = {"index_url": "http://a/simple", "extra_index_url": "http://b/simple"}
    names.check(parse("only-on-b\n", None), both, ask=lambda url: url.startswith("http://b/"))
    with pytest.raises(InvalidRequest, match="in http://a/simple, http://b/simple"):
        names.check(parse("nowhere\n", None), both, ask=lambda url: False)
    names.check(parse("anything\n", None), {"find_links": "https://example.org/wheels", "no_index": True},
                ask=lambda url: pytest.fail("a folder of packages behind a URL is not listed"))


def test_a_real_simple_index_answers_for_a_name(tmp_path):
    (tmp_path / "simple" / "deeppod-probe").mkdir(parents=True)
    (tmp_path / "simple" / "deeppod-probe" / "index.html").write_text("<a href='x.whl'>x</a>")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a):
            super().__init__(*a, directory=str(tmp_path))

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = {"index_url": f"http://127.0.0.1:{server.server_port}/simple"}
        names.check(parse("deeppod-probe==1\n", None), index)
        with pytest.raises(InvalidRequest, match="did you mean"):
            names.check(parse("deeppod_prob\n", None), {**index, "find_links": str(_folder(tmp_path))})
    finally:
        server.shutdown()
        server.server_close()


def _folder(tmp_path):
    (tmp_path / "w").mkdir()
    wheel(tmp_path / "w", "deeppod-probe", "1", "z")
    return tmp_path / "w"


UV_FAILED = ["Using CPython 3.11.2 interpreter at: /usr/bin/python3",
             "  × No solution found when resolving dependencies:",
             "  ╰─▶ Because numpyy was not found in the package registry and you require",
             "      numpyy, we can conclude that your requirements are unsatisfiable."]


def test_a_failed_build_gives_the_installers_whole_message_and_a_near_name(wheels):
    wheel(__import__("pathlib").Path(wheels), "numpy", "2.1.0", "n")
    why = build._why(UV_FAILED, {"index": {"find_links": wheels}})
    assert ("× No solution found when resolving dependencies: ╰─▶ Because numpyy was not found in the package "
            "registry and you require numpyy, we can conclude that your requirements are unsatisfiable; did you mean "
            "'numpy'?") in why
    assert why.endswith("the full output is in the job's log)")
    pip = build._why(["ERROR: Could not find a version that satisfies the requirement tiny-tol (from versions: none)",
                      "ERROR: No matching distribution found for tiny-tol"], {"index": {"find_links": wheels}})
    assert "did you mean 'tiny-tool'?" in pip
    assert "did you mean" not in build._why(["error: something else broke"], None)

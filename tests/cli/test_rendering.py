"""What the CLI prints, without a server: dataset diffs, dict rendering, the jobs table."""

from rich.console import Console

from deeppod.cli import output
from deeppod.cli.datadiff import diff_manifests
from deeppod.cli.datasets import pairs


def row(path, label, sha):
    return {"path": path, "label": label, "sha256": sha}


def test_diff_names_added_removed_relabelled_and_changed_files():
    a = [row("cat/1.jpg", "cat", "s1"), row("cat/2.jpg", "cat", "s2"), row("dog/3.jpg", "dog", "s3"),
         row("x.jpg", "cat", "s4")]
    b = [row("cat/1.jpg", "cat", "s1"), row("dog/3.jpg", "dog", "s3b"), row("x.jpg", "dog", "s4"),
         row("bird/5.jpg", "bird", "s5")]
    d = diff_manifests(a, b)
    assert d["added"] == ["bird/5.jpg"] and d["removed"] == ["cat/2.jpg"]
    assert d["relabelled"] == ["x.jpg: cat -> dog"] and d["changed"] == ["dog/3.jpg"] and d["same"] == 1
    assert d["per_class"] == {"bird": (0, 1), "cat": (3, 1), "dog": (1, 2)}
    assert diff_manifests(a, a)["per_class"] == {} and diff_manifests(a, a)["same"] == 4


def test_dicts_print_as_key_value_pairs_not_python():
    assert pairs({"resize": "short:256", "val": 0.1}) == "resize=short:256, val=0.1"
    assert pairs({"xray": "", "site": "lyon"}) == "xray, site=lyon"
    assert pairs({}) == "-" and pairs(None) == "-" and pairs(["a@1", "b@2"]) == "a@1, b@2"
    assert "{" not in pairs({"width": {"min": 1, "max": 3}})


def test_the_jobs_table_keeps_every_id_whole_at_80_columns(monkeypatch):
    jobs = [{"id": i, "name": "serve-a-very-long-deployment-name-v12", "tenant": "vision", "user": "ana",
             "state": "preempted", "workers": 2, "max_workers": 8, "gpus_per_worker": 1, "allocation": None,
             "submitted_at": "2026-11-22T10:11:12", "started_at": None, "ended_at": None,
             "reason": "waiting for 2 GPUs (0 free) " * 3} for i in (7, 123456)]
    console = Console(width=80, record=True)
    monkeypatch.setattr(output, "console", console)
    console.print(output.jobs_table(jobs))
    lines = console.export_text().splitlines()
    assert lines[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert [line.split()[0] for line in lines[1:] if line[:8].strip()] == ["7", "123456"]
    assert all("preempted" in line for line in lines if line[:8].strip() and not line.startswith("ID"))


def test_the_upload_bar_of_an_archive_counts_bytes_not_files():
    from deeppod.cli.datasets import upload_bar

    console = Console(width=120, record=True, force_terminal=False)
    bar, progress = upload_bar("pets.zip", out=console)
    with bar:
        progress(0, 0, 3 * 1024 * 1024, 10 * 1024 * 1024)  # an archive: files unknown
        bar.refresh()
    shown = console.export_text()
    assert "files" not in shown and "3.1/10.5 MB" in shown and "uploading pets.zip" in shown
    console = Console(width=120, record=True, force_terminal=False)
    bar, progress = upload_bar("./pets", out=console)
    with bar:
        progress(12, 40, 1000, 5000)  # a folder: files known
        bar.refresh()
    assert "uploading 12/40 files" in console.export_text()


def test_an_elastic_job_shows_its_warm_spares_while_it_runs():
    job = {"state": "running", "workers": 1, "max_workers": 4, "allocation": {"workers": [{"node": "n1"}] * 2,
                                                                            "spares": 2}}
    assert output.workers(job) == "2 (1:4) +2 warm"
    assert output.workers({**job, "allocation": {**job["allocation"], "spares": 0}}) == "2 (1:4)"
    assert output.workers({**job, "state": "succeeded"}) == "1 (1:4)"


def _render(table, width=80):
    console = Console(width=width, record=True)
    console.print(table)
    return console.export_text().splitlines()


def test_at_80_columns_each_job_is_one_line_and_its_reason_ends_with_an_ellipsis(monkeypatch):
    job = {"id": 123456, "name": "train", "tenant": "vision", "user": "ana", "state": "queued", "workers": 2,
           "max_workers": None, "gpus_per_worker": 1, "allocation": None, "submitted_at": "2026-11-22T10:11:12",
           "started_at": None, "ended_at": None, "reason": "waiting for 2 GPUs: 4 in use by other tenants " * 2}
    lines = _render(output.jobs_table([job, {**job, "id": 7}], width=80))
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines)
    assert lines[1].startswith("123456") and lines[1].rstrip().endswith("…")
    monkeypatch.setattr(output, "WIDE", True)  # deeppod -o wide: every column, whole reasons
    wide = _render(output.jobs_table([job], width=200), width=200)
    assert "TENANT" in wide[0] and "vision" in wide[1] and wide[1].rstrip().endswith("other tenants")


def test_a_running_job_says_what_it_does_before_its_command_runs():
    """Issue 71: 'running' with no reason while its environment was built."""
    job = {"id": 8, "name": "train", "tenant": "vision", "user": "ana", "state": "running", "workers": 1,
           "max_workers": None, "gpus_per_worker": 0, "allocation": None, "submitted_at": "2026-11-22T10:11:12",
           "started_at": "2026-11-22T10:11:13", "ended_at": None, "reason": "started", "phase": "preparing environment"}
    lines = _render(output.jobs_table([job, {**job, "id": 9, "phase": None}], width=120), width=120)
    assert lines[1].rstrip().endswith("preparing environment")
    assert "preparing" not in lines[2] and "started" not in lines[2]  # nothing to say once its command runs


NODE = {"name": "node-017", "healthy": True, "up": True, "gpus": [{"index": i, "logical": True}
        for i in range(8)], "gpus_used": 6, "gpus_free": 2, "cpus_used": 12.5, "cpus": 64,
        "memory_mb_used": 200_000, "memory_mb": 512_000, "workers": 6, "address": "127.0.0.1:40123"}


def test_at_80_columns_no_header_or_cell_is_cut_and_the_rest_is_named(monkeypatch):
    lines = _render(output.nodes_table([NODE]))
    text = "\n".join(lines)
    assert all(len(line) <= 80 for line in lines)
    assert "MEMORY USED" in text and "195.3G/500.0G" in text and "node-017" in text
    assert "…" not in text and "127.0.0" not in text  # the address is left out whole, not cut
    assert "hidden at this width: GPU MEMORY, ADDRESS (deeppod -o wide)" in text
    monkeypatch.setattr(output, "WIDE", True)
    wide = "\n".join(_render(output.nodes_table([NODE, {**NODE, "name": "h100-1", "gpu_memory_mb": 81_559}]),
                             width=200))
    assert "127.0.0.1:40123" in wide and "GPU MEMORY" in wide and "79.6G" in wide  # logical slots: "-"


def test_a_down_node_says_why_as_its_cluster_does_and_a_reasons_brackets_are_text():
    down = {**NODE, "up": False, "down_reason": "drained in Slurm: [fan] failure"}
    text = "\n".join(_render(output.nodes_table([down]), width=160))
    assert "down (drained in Slurm: [fan] failure)" in text
    plain = _render(output.nodes_table([{**NODE, "up": False}]), width=160)[1]
    assert "down" in plain and "(" not in plain  # a lost node with nothing said: no empty reason


def test_a_size_never_wraps_and_free_text_is_cut_in_its_cell():
    rows = [{"name": "pets", "size": "76.0 KB", "message": "x" * 200}]
    lines = _render(output.rows_table(rows, ["name", "size", "message"], width=40), width=40)
    assert len(lines) == 2 and "76.0 KB" in lines[1] and lines[1].rstrip().endswith("…") and len(lines[1]) <= 40


def test_every_command_is_listed_on_unbroken_lines():
    """`deeppod --help` showed docstrings' own line breaks: 'server' and 'servers' stopped
    mid-sentence at 80 columns. A listing is one paragraph with no hard break."""
    from typer.main import get_command

    from deeppod.cli.main import app

    def walk(group, prefix=""):
        for name, cmd in group.commands.items():
            yield prefix + name, cmd
            if hasattr(cmd, "commands"):
                yield from walk(cmd, prefix + name + " ")

    listed = dict(walk(get_command(app)))
    assert {"server", "servers", "submit", "data ingest"} <= set(listed)
    for name, cmd in listed.items():
        line = cmd.short_help or (cmd.help or "").split("\n\n")[0]
        assert "\n" not in line.strip(), (name, line)
    assert listed["servers"].short_help.endswith("and which one leads.")


def test_the_metrics_table_fits_80_columns_with_a_shorter_sparkline():
    from deeppod.cli.jobs import metrics_table

    series = [[s, 1.0 / (s + 1)] for s in range(100)]
    data = {"metrics": {"images_per_second": {"last": [99, 2223.9], "points": 100, "series": series},
                        "lr": {"last": [99, 5.9206e-06], "points": 100, "series": series}}}
    lines = _render(metrics_table(data, width=80))
    assert all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
    assert lines[0].split() == ["METRIC", "STEP", "LAST", "MIN", "MAX", "POINTS", "TREND"]
    assert "images_per_second" in lines[1] and "2223.9" in lines[1]
    assert len(_render(metrics_table(data, width=200), width=200)[1].rstrip().split()[-1]) == 40


def test_the_metrics_table_never_shows_a_minimum_above_the_last_value():
    """Issue 71: LAST 0.56245 beside MIN 0.5625 (printed at 4 digits, and from a thinned series)."""
    from deeppod.cli.jobs import metrics_table

    data = {"metrics": {"loss": {"last": [40, 0.56245], "points": 41, "series": [[0, 2.3], [20, 0.9], [39, 0.5625]]}}}
    row = _render(metrics_table(data, width=80))[1].split()
    assert row[:5] == ["loss", "40", "0.56245", "0.56245", "2.3"]


def test_tune_show_gives_each_trials_last_reported_step(monkeypatch):
    """Issue 71: STEPS was the last step + 1 (the built-in trainer reports epochs from 1)."""
    from deeppod.cli import experiments

    trial = {"number": 0, "job_id": 4, "state": "pruned", "value": 0.5, "best": 0.6, "params": {"lr": 0.1}}
    e = {"name": "lr", "tenant": "t", "user": "u", "state": "finished", "reason": "", "metric": "val_acc",
         "mode": "max", "sampler": "tpe", "pruner": "asha", "prune_after": 1, "counts": {"pruned": 2}, "trials": 2,
         "parallel": 1, "space": {"lr": {}}, "best_trial": None, "best_value": None,
         "trial_table": [{**trial, "step": 3}, {**trial, "number": 1, "step": -1}]}
    console = Console(width=120, record=True)
    monkeypatch.setattr(experiments, "console", console)
    experiments.render_show(e)
    lines = [line.split() for line in console.export_text().splitlines()]
    header = next(line for line in lines if line and line[0].lower() == "trial")
    rows = [line for line in lines if line and line[0] in ("0", "1")]
    assert header[-1].lower() == "step" and [r[-1] for r in rows] == ["3", "-"]


def test_tables_show_nothing_as_a_dash_and_times_to_the_second():
    """Issue 71: keys ls printed raw ISO times with microseconds, None and an empty name."""
    rows = [{"key_id": "AKX", "name": "", "created_at": "2026-12-04T22:40:54.123456+00:00", "revoked_at": None}]
    lines = _render(output.rows_table(rows, ["key_id", "name", "created_at", "revoked_at"]), width=100)
    assert lines[1].split() == ["AKX", "-", "2026-12-04", "22:40:54", "-"]


def test_envs_ls_at_80_columns_keeps_the_packages_and_names_the_default_python(monkeypatch):
    """Issue 71: PACKAGES was left out at 80 columns while PYTHON showed '-'."""
    from deeppod.cli import envs

    env = {"key": "a1b2c3d4e5f6", "tenant": "vision", "python": None, "bytes": 48_300_000, "last_used": 0,
           "active_jobs": [12, 13], "image": None, "requirements": ["numpy==2.1.0", "pillow==11.0", "scipy"] * 3}

    class _Client:
        def envs(self):
            return [env]

    console = Console(width=80, record=True)
    monkeypatch.setattr(envs, "client", lambda url, token: _Client())
    monkeypatch.setattr(envs, "console", console)
    envs.ls(as_json=False, url=None, token=None)
    lines = console.export_text().splitlines()
    assert "PACKAGES" in lines[0] and "numpy==2.1.0" in lines[1] and all(len(line) <= 80 for line in lines)
    assert " - " not in lines[1]

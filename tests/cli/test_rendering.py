"""What the CLI prints, without a server: dataset diffs, dict rendering, the jobs table."""

from rich.console import Console

from deeppod.cli import output
from deeppod.cli.datasets import pairs
from deeppod.cli.datadiff import diff_manifests


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
    assert all("preempted" in line for line in lines if line[:8].strip() and not line.startswith(" ID"))


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

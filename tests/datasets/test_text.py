"""Text datasets: JSON Lines checked line by line, quarantined with line numbers, deduplicated,
split exactly, versioned, served through S3 and read by a job (runtime.text)."""

import hashlib
import json

import pytest

from deeppod.datasets.text import check
from deeppod.errors import InvalidRequest
from deeppod.runtime.text import read_examples
from tests.datasets.images import class_folders
from tests.datasets.test_datasets import upload, version_dir


def chat(i: int) -> dict:
    return {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"what is {i}+1?"},
                         {"role": "assistant", "content": str(i + 1)}], "id": i}


@pytest.mark.parametrize("line, reason", [
    (b"\xff\xfe", "not UTF-8"),
    (b'{"messages": [', "not JSON"),
    (b"[1, 2]", "a JSON list, not an object"),
    (b'{"input": "x"}', "has none of"),
    (b'{"prompt": "a", "completion": "b", "text": "c"}', "mixes"),
    (b'{"messages": []}', "non-empty list"),
    (b'{"messages": [{"role": "bot", "content": "hi"}]}', "messages[0].role is 'bot'"),
    (b'{"messages": [{"role": "user", "content": 3}]}', "messages[0].content is not a string"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
    (b'{"prompt": "a"}', "'completion' is missing"),
    (b'{"prompt": "a", "completion": " "}', "'completion' is empty"),
    (b'{"text": ""}', "'text' is empty"),
])
def test_a_bad_line_says_what_is_wrong(line, reason):
    with pytest.raises(InvalidRequest, match=reason.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
        check(line)


def test_the_three_forms_keep_their_own_fields():
    assert check(json.dumps(chat(1)).encode())[0] == "chat"
    assert check(json.dumps(chat(1)).encode())[1] == {"messages": chat(1)["messages"]}  # 'id' is not content
    pair = {"prompt": "2+2=", "completion": "4"}
    assert check(json.dumps(pair).encode()) == ("prompt-completion", pair)
    assert check(b'{"text": "once upon a time"}') == ("text", {"text": "once upon a time"})


def test_a_jsonl_file_is_a_text_version_bad_lines_quarantined_by_line(api, tmp_path, monkeypatch):
    lines = [json.dumps(chat(i)) for i in range(40)]
    lines[5] = '{"messages": [{"role": "user", "content": "no answer"}]}'
    lines[9] = "not json"
    lines.insert(12, json.dumps(chat(3)))  # a duplicate: the same example, kept once
    lines.insert(20, '{"prompt": "p", "completion": "c"}')  # another form than the version's
    lines.insert(21, "")  # blank lines are not examples
    src = tmp_path / "chats.jsonl"
    src.write_text("\n".join(lines) + "\n")
    r = upload(api, "chats", src, policy={"val": 0.25})
    assert r.status_code == 201, r.text
    v = r.json()["versions"][0]
    st = v["stats"]
    assert v["samples"] == 38 and st["kind"] == "text" and st["format"] == "chat" and st["duplicates"] == 1
    assert v["lineage"]["duplicates_dropped"] == 1 and "deduplicated" not in v["lineage"]
    assert st["per_split"] == {"train": 28, "val": 10}  # round(38 x 0.25) = 10 (9.5 rounds half up), exactly
    assert st["turns"]["max"] == 3 and st["roles"] == {"system": 38, "user": 38, "assistant": 38}
    reasons = {q["path"]: q["reason"] for q in v["quarantined"]}
    assert set(reasons) == {"chats.jsonl:6", "chats.jsonl:10", "chats.jsonl:21"}
    assert "no assistant message" in reasons["chats.jsonl:6"] and "not JSON" in reasons["chats.jsonl:10"]
    assert "prompt-completion example" in reasons["chats.jsonl:21"] and "chats.jsonl:1" in reasons["chats.jsonl:21"]
    d = version_dir(api, "chats")
    assert (d / "quarantine" / "chats.jsonl").read_text().splitlines() == [lines[5], lines[9], lines[20]]
    train = list(read_examples(d, "train"))
    val = list(read_examples(d, "val"))
    assert len(train) == 28 and len(val) == 10 and not {json.dumps(x) for x in train} & {json.dumps(x) for x in val}
    assert sorted(int(x["messages"][1]["content"].split()[2][:-3]) for x in train + val) == \
        [i for i in range(40) if i not in (5, 9)]
    # a job names it with --dataset: runtime.text finds it by name
    monkeypatch.setenv("DEEPPOD_DATA_CHATS", str(d))
    assert list(read_examples("chats", "val")) == val

    # the next version: an example's side follows its content, not where its line is
    src.write_text("\n".join(reversed(lines)) + "\n")
    v2 = upload(api, "chats", src, policy={"val": 0.25}).json()["versions"][-1]
    assert v2["ref"] == "chats@2" and v2["stats"]["per_split"] == {"train": 28, "val": 10}
    assert list(read_examples(version_dir(api, "chats", 2), "val")) != val  # another order...
    assert sorted(map(json.dumps, read_examples(version_dir(api, "chats", 2), "val"))) == \
        sorted(map(json.dumps, val))  # ...the same examples

    # the store's objects hold each split file: S3 names them NAME/vN/train.jsonl
    manifest = [json.loads(line) for line in (d / "manifest.jsonl").open()]
    assert [(m["path"], m["examples"]) for m in manifest] == [("train.jsonl", 28), ("val.jsonl", 10)]
    for m in manifest:
        data = (d / "text" / m["path"]).read_bytes()
        assert api.ctx.data.objects.path(m["sha256"]).read_bytes() == data
        assert (hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()) == (m["sha256"], m["md5"])


def test_prompt_completion_and_text_forms_and_what_is_refused(api, tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": f"{i}*2=", "completion": str(2 * i)}) for i in range(10)))
    v = upload(api, "qa", src).json()["versions"][0]
    assert v["stats"]["format"] == "prompt-completion" and v["stats"]["per_split"] == {"train": 10, "val": 0}
    # every line bad: nothing is made, and the answer names the first lines and why
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": ""}\nnope\n')
    r = upload(api, "bad", bad)
    assert r.status_code == 422 and "no example could be ingested: bad.jsonl:1: 'text' is empty" in r.text
    assert api.http.get("/v1/datasets/bad", headers=api.as_(api.admin)).status_code == 404
    # a dataset keeps its kind: images after text (and text after images) are refused
    r = upload(api, "qa", class_folders(tmp_path / "imgs", per_class=2))
    assert r.status_code == 422 and "holds text data and this upload is image" in r.text
    upload(api, "pics", class_folders(tmp_path / "imgs2", per_class=2))
    r = upload(api, "pics", src)
    assert r.status_code == 422 and "holds image data and this upload is text" in r.text
    assert [x["ref"] for x in api.http.get("/v1/datasets/qa", headers=api.as_(api.admin)).json()["versions"]] == \
        ["qa@1"]


def test_a_json_lines_body_is_a_text_upload_too(api):
    body = "\ufeff" + "\n".join(json.dumps({"text": f"story {i}"}) for i in range(5)) + "\nnot json\n"
    r = api.http.post("/v1/datasets/stories/versions", content=body.encode(),
                      headers={**api.as_(api.admin), "content-type": "application/x-ndjson"})
    assert r.status_code == 201, r.text
    v = r.json()["versions"][0]
    assert v["samples"] == 5 and v["stats"]["format"] == "text"
    assert [(q["path"], q["reason"][:8]) for q in v["quarantined"]] == [("upload.jsonl:6", "not JSON")]


@pytest.mark.slow  # the count runs in a child process
def test_token_counts_for_a_registered_models_tokenizer(api, tmp_path):
    from tokenizers import Tokenizer

    from tests.models.hf_folder import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "tiny")
    assert api.http.post("/v1/models/tiny/versions", json={"path": str(folder)},
                         headers=api.as_(api.admin)).status_code == 201
    long = " ".join(["plus"] * 200)  # 200 tokens: over the tiny model's 128-token context
    def ask(question: str, answer: str) -> dict:
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
    rows = [ask(f"what is {i} plus 1?", str(i)) for i in range(9)] + [ask(long, "no")]
    src = tmp_path / "chats.jsonl"
    src.write_text("\n".join(map(json.dumps, rows)))
    assert upload(api, "chats", src, policy={"val": 0.2}).status_code == 201
    r = api.http.get("/v1/datasets/chats@1/tokens", params={"model": "tiny@1"}, headers=api.as_(api.admin))
    assert r.status_code == 200, r.text
    t = r.json()
    # the same count by hand: the model's template renders each example's contents one after another
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    expected = sorted(len(tok.encode("".join(m["content"] for m in row["messages"])).ids) for row in rows)
    assert t["examples"] == 10 and t["tokens"] == sum(expected) and t["chat_template"] is True
    assert t["per_example"]["max"] == expected[-1] >= 200 and t["over_context"] == 1
    assert t["per_split"]["train"]["examples"] == 8 and t["cut_at"] is None and sum(t["histogram"].values()) == 10
    assert api.http.get("/v1/datasets/chats@1/tokens", params={"model": "tiny@1"},
                        headers=api.as_(api.admin)).json() == t  # cached: the same answer
    # what cannot be counted says why
    r = api.http.get("/v1/datasets/chats@1/tokens", params={"model": "nosuch@1"}, headers=api.as_(api.admin))
    assert r.status_code == 404
    src2 = class_folders(tmp_path / "imgs", per_class=2)
    upload(api, "pics", src2)
    r = api.http.get("/v1/datasets/pics@1/tokens", params={"model": "tiny@1"}, headers=api.as_(api.admin))
    assert r.status_code == 422 and "token counts are for text datasets" in r.text


def test_long_lines_are_read_past_and_a_flood_of_bad_lines_is_reported_in_part(tmp_path, monkeypatch):
    import io

    from deeppod.datasets import text
    from deeppod.datasets.archive import Member
    from deeppod.datasets.ingest import Built
    from deeppod.datasets.objects import ObjectStore
    from deeppod.datasets.policy import Policy

    body = b"\n".join([json.dumps({"text": "ok"}).encode(), b'{"text": "' + b"x" * 5000 + b'"}',
                       json.dumps({"text": "fine"}).encode(), *[b"bad"] * 30]) + b"\n"
    opened = []

    def stream():
        opened.append(1)
        return io.BytesIO(body)

    member = Member("big.jsonl", len(body), read=lambda: pytest.fail("read whole"), open=stream)
    monkeypatch.setattr(text.Refused, "MAX_REPORTED", 5)
    built = Built()
    (tmp_path / "staging" / "version").mkdir(parents=True)
    text.build([("big.jsonl", member)], tmp_path / "staging" / "version", ObjectStore(tmp_path / "objects"),
               Policy(), max_line=1000, built=built)
    assert built.samples == 2 and opened == [1]
    assert built.stats["quarantined"] == 31 and built.report["quarantined_total"] == 31
    rows = built.report["quarantined"]
    assert len(rows) == 5 and rows[0] == {"path": "big.jsonl:2", "reason": "the line is over the per-line limit of "
                                          "1000 bytes (DEEPPOD_DATA_MAX_FILE_BYTES)"}
    kept = (tmp_path / "staging" / "version" / "quarantine" / "big.jsonl").read_bytes().splitlines()
    assert kept == [b"bad"] * 30  # the over-long line is not kept: it was never held


@pytest.mark.slow  # the count runs in a child process
def test_a_chat_template_that_never_ends_is_stopped_by_its_cpu_limit(api, tmp_path, monkeypatch):
    from deeppod.datasets import tokens
    from tests.models.hf_folder import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "slow")
    (folder / "chat_template.jinja").write_text(  # 10^10 steps inside Jinja's sandbox: hours, were it let run
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    assert api.http.post("/v1/models/slow/versions", json={"path": str(folder)},
                         headers=api.as_(api.admin)).status_code == 201
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps(chat(1)))
    assert upload(api, "chats", src).status_code == 201
    monkeypatch.setattr(tokens, "CPU_SECONDS", 2)
    r = api.http.get("/v1/datasets/chats@1/tokens", params={"model": "slow@1"}, headers=api.as_(api.admin))
    assert r.status_code == 422 and "took more CPU time or memory than a count may (2 s of CPU" in r.text, r.text

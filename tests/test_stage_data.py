"""Stage datasets (SFT, RM, PRM, DPO, KTO): every file format gives the same rows, rows tokenise exactly
as rollouts do, mixing / max_samples / eval hold-out counts follow the documented rule, and every bad
row is a DataError naming its file, line and key. The tokenizer is the embedded default's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config.stages import PRMConfig, StageDataConfig
from agentrl.data import DataError
from agentrl.data.examples import (LabeledSample, PairSample, Sample, build_kto, build_pairs, build_prm, build_sft,
                                   prm_sample, reward_token_ids)
from agentrl.data.rows import Row, field, read_rows


@pytest.fixture(scope="module")
def fmt(tiny_tokenizer) -> ChatFormat:
    return ChatFormat(tiny_tokenizer)


def write(folder: Path, name: str, rows: list) -> Path:
    """`rows` in the format `name`'s extension says (a name without one: a datasets save_to_disk folder)."""
    path = folder / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name.endswith(".json"):
        path.write_text(json.dumps(rows))
    elif name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif name.endswith("-dict"):
        import datasets
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                              "test": datasets.Dataset.from_list(rows[:1])}).save_to_disk(str(path))
    else:
        import datasets
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def data(**kw) -> StageDataConfig:
    return StageDataConfig(**{"eval_fraction": 0.0, **kw})


def rows_of(n: int, src: str = "a") -> list[dict]:
    return [{"input": f"{src}{i}", "output": "ok", "src": src, "i": i} for i in range(n)]


CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "and?"}, {"role": "assistant", "content": "done"}]

# ---- reading rows ----

FORMATS = ["d.jsonl", "d.json", "d.parquet", "d-saved", "d-dict"]


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_gives_the_same_rows(tmp_path, name):
    written = [{"input": "2+2?", "output": "4", "n": 1}, {"input": "3+3?", "output": "6", "n": 2}]
    path = write(tmp_path, name, written)
    rows = read_rows(path)
    assert [r.data for r in rows] == written
    unit = ["line 1", "line 2"] if name.endswith(".jsonl") else ["row 0", "row 1"]
    assert [r.where for r in rows] == [f"{path} {u}" for u in unit]
    assert rows[0].key == "data.paths"


@pytest.mark.parametrize("name", FORMATS[1:])
def test_conversations_tokenise_alike_in_every_format(tmp_path, fmt, name):
    # Arrow stores messages as structs with the union of their keys: the null "name"s are dropped again.
    written = [{"messages": CHAT[:2]}, {"messages": [{"role": "system", "content": "s", "name": "x"}] + CHAT}]
    reference = build_sft(data(paths=[str(write(tmp_path, "r.jsonl", written))], messages_key="messages"), fmt, 0)
    built = build_sft(data(paths=[str(write(tmp_path, name, written))], messages_key="messages"), fmt, 0)
    assert [s.tokens for s in built.train] == [s.tokens for s in reference.train]
    assert [s.mask for s in built.train] == [s.mask for s in reference.train]


def test_jsonl_skips_blank_lines_and_counts_them(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    assert [(r.data, r.where) for r in read_rows(path)] == [({"a": 1}, f"{path} line 1"), ({"a": 2}, f"{path} line 4")]


def test_unreadable_datasets_name_key_file_and_place(tmp_path):
    def error(path, key="data.paths") -> str:
        with pytest.raises(DataError) as info:
            read_rows(path, key)
        return str(info.value)

    assert error(tmp_path / "nope.jsonl", "data.eval_path") == f"data.eval_path: {tmp_path / 'nope.jsonl'} does not exist"
    (tmp_path / "d.csv").write_text("a,b\n")
    assert error(tmp_path / "d.csv") == (f"data.paths: {tmp_path / 'd.csv'}: unknown dataset format '.csv'; supported: "
                                         ".jsonl, .json, .parquet, or a folder saved with datasets' save_to_disk")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": \n')
    assert error(tmp_path / "bad.jsonl") == (f"data.paths: {tmp_path / 'bad.jsonl'} line 2: not valid JSON "
                                             "(Expecting value at column 7)")
    (tmp_path / "bad.json").write_text('[{"a": 1},\n {"a": }]')
    assert error(tmp_path / "bad.json").startswith(f"data.paths: {tmp_path / 'bad.json'} line 2: not valid JSON")
    (tmp_path / "list.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    assert error(tmp_path / "list.jsonl") == (f"data.paths: {tmp_path / 'list.jsonl'} line 2: expected a JSON object "
                                              "(one row), got list")
    (tmp_path / "str.json").write_text('[{"a": 1}, "x"]')
    assert error(tmp_path / "str.json") == f"data.paths: {tmp_path / 'str.json'} row 1: expected a JSON object (one row), got str"
    (tmp_path / "obj.json").write_text('{"a": 1}')
    assert error(tmp_path / "obj.json") == f"data.paths: {tmp_path / 'obj.json'}: expected a JSON list of rows, got dict"
    (tmp_path / "empty.jsonl").write_text("\n")
    assert error(tmp_path / "empty.jsonl") == f"data.paths: {tmp_path / 'empty.jsonl'} holds no rows"
    (tmp_path / "folder").mkdir()
    assert "is a folder but not one saved by datasets' save_to_disk" in error(tmp_path / "folder")
    (tmp_path / "junk.parquet").write_text("not parquet")
    assert error(tmp_path / "junk.parquet").startswith(f"data.paths: {tmp_path / 'junk.parquet'}: not a readable parquet")


def test_a_dataset_dict_without_train_lists_its_splits(tmp_path):
    import datasets
    datasets.DatasetDict({"validation": datasets.Dataset.from_list([{"a": 1}]),
                          "test": datasets.Dataset.from_list([{"a": 2}])}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"^data.paths: .*dd is a DatasetDict without a 'train' split "
                                        r"\(splits: \['test', 'validation'\]\)$"):
        read_rows(tmp_path / "dd")


def test_field_names_row_and_key():
    row = Row({"prompt": "p", "rejected": "r", "n": 3, "flag": True}, "/x/a.jsonl line 3")
    assert field(row, "prompt", (str,), "a string") == "p"
    with pytest.raises(DataError) as info:
        field(row, "chosen", (str, list), "a string or a list of messages")
    assert str(info.value) == ("data.paths: /x/a.jsonl line 3: key 'chosen' is missing "
                               "(row keys: ['prompt', 'rejected', 'n', 'flag'])")
    with pytest.raises(DataError) as info:
        field(row, "n", (str, list), "a string or a list of messages")
    assert str(info.value) == "data.paths: /x/a.jsonl line 3: key 'n' must be a string or a list of messages, got int"
    with pytest.raises(DataError, match="key 'flag' must be a count, got bool"):
        field(row, "flag", (int,), "a count")  # a bool is no int here


# ---- tokenisation ----

def one(built) -> object:
    assert len(built.train) == 1
    return built.train[0]


def test_sft_raw_template_and_chat_template(tmp_path, fmt):
    path = str(write(tmp_path, "d.jsonl", [{"input": "hi", "output": "yo"}]))
    eos = fmt.eos_id
    raw = one(build_sft(data(paths=[path]), fmt, 0))
    assert raw == Sample(fmt.encode("hi") + fmt.encode("yo") + [eos], [0, 0] + [1, 1, 1], f"{path} line 1")
    assert fmt.encode("hi") == [74, 75] and fmt.encode("yo") == [91, 81] and eos == 2

    templated = one(build_sft(data(paths=[path], input_template="User: {}\nAssistant: "), fmt, 0))
    prompt = fmt.encode("User: hi\nAssistant: ")
    assert prompt == [55, 274, 28, 223, 74, 75, 201, 35, 269, 272, 273, 28, 223]
    assert templated.tokens == prompt + [91, 81, eos]
    assert templated.mask == [0] * 13 + [1, 1, 1]

    chat = one(build_sft(data(paths=[path], apply_chat_template=True), fmt, 0))
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert (chat.tokens, chat.mask) == ledger_from_messages(fmt, conv)
    head = fmt.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert chat.tokens == head + [91, 81, eos]
    assert chat.mask == [0] * len(head) + [1, 1, 1]


def test_sft_output_and_input_keys_and_messages(tmp_path, fmt):
    path = str(write(tmp_path, "d.jsonl", [{"q": "hi", "a": "yo", "chat": CHAT}]))
    keyed = one(build_sft(data(paths=[path], input_key="q", output_key="a"), fmt, 0))
    assert keyed.tokens == [74, 75, 91, 81, 2]
    multi = one(build_sft(data(paths=[path], messages_key="chat"), fmt, 0))
    assert (multi.tokens, multi.mask) == ledger_from_messages(fmt, CHAT)
    # Both assistant turns are trained, with their EOS: "yo" + EOS and "done" + EOS.
    assert [t for t, m in zip(multi.tokens, multi.mask) if m] == fmt.assistant_tokens("yo") + fmt.assistant_tokens("done")


def test_tools_go_into_the_first_prompt(tmp_path, fmt):
    tools = [{"type": "function", "function": {"name": "calc", "description": "add", "parameters": {}}}]
    rows = [{"chat": CHAT[:2], "tools": tools}, {"chat": CHAT[:2], "tools": json.dumps(tools)}]
    path = str(write(tmp_path, "d.jsonl", rows))
    built = build_sft(data(paths=[path], messages_key="chat", tools_key="tools"), fmt, 0)
    assert [(s.tokens, s.mask) for s in built.train] == [ledger_from_messages(fmt, CHAT[:2], tools)] * 2
    raw = str(write(tmp_path, "raw.jsonl", [{"input": "hi", "output": "yo", "tools": tools}]))
    with pytest.raises(DataError, match=r"raw.jsonl line 1: key 'tools' holds tools, .*set data.apply_chat_template"):
        build_sft(data(paths=[raw], tools_key="tools"), fmt, 0)


def test_pairs_of_strings_conversations_and_both(tmp_path, fmt):
    rows = [{"input": "hi", "chosen": "yo", "rejected": "no"},
            {"chosen": CHAT[:2], "rejected": [CHAT[0], {"role": "assistant", "content": "no"}]},
            {"input": "hi", "chosen": CHAT[:2], "rejected": "no"}]
    path = str(write(tmp_path, "d.jsonl", rows))
    built = build_pairs(data(paths=[path], input_template="User: {}\nAssistant: "), fmt, 0)
    by_line = {p.chosen.where: p for p in built.train}
    prompt = fmt.encode("User: hi\nAssistant: ")
    assert by_line[f"{path} line 1"] == PairSample(
        Sample(prompt + [91, 81, 2], [0] * 13 + [1] * 3, f"{path} line 1"),
        Sample(prompt + fmt.assistant_tokens("no"), [0] * 13 + [1] * 3, f"{path} line 1"))
    second = by_line[f"{path} line 2"]
    assert (second.chosen.tokens, second.chosen.mask) == ledger_from_messages(fmt, CHAT[:2])
    assert second.rejected.tokens == fmt.initial(CHAT[:1]) + fmt.assistant_tokens("no")
    third = by_line[f"{path} line 3"]
    assert third.chosen.tokens == second.chosen.tokens and third.rejected.tokens == prompt + fmt.assistant_tokens("no")


def test_kto_labels(tmp_path, fmt):
    rows = [{"input": "a", "output": "b", "label": v} for v in (True, False, 1, 0)]
    path = str(write(tmp_path, "d.jsonl", rows))
    built = build_kto(data(paths=[path]), fmt, 0)
    by_line = {s.sample.where: s.desirable for s in built.train}
    assert by_line == {f"{path} line {i}": d for i, d in zip((1, 2, 3, 4), (True, False, True, False))}
    assert isinstance(built.train[0], LabeledSample) and built.train[0].sample.tokens == fmt.encode("a") + fmt.assistant_tokens("b")
    for value, why in ((2, "got 2"), ("yes", "got str")):
        bad = str(write(tmp_path, "bad.jsonl", [{"input": "a", "output": "b", "label": value}]))
        with pytest.raises(DataError, match=rf"^data.paths: .*bad.jsonl line 1: key 'label' must be true/false or "
                                            rf"1/0 \(desirable or not\), {why}$"):
            build_kto(data(paths=[bad]), fmt, 0)


def test_bad_rows_name_file_line_and_key(tmp_path, fmt):
    def error(rows, build=build_sft, **kw) -> str:
        path = write(tmp_path, "bad.jsonl", rows)
        with pytest.raises(DataError) as info:
            build(data(paths=[str(path)], **kw), fmt, 0)
        return str(info.value)

    good = {"input": "a", "output": "b"}
    at = f"data.paths: {tmp_path / 'bad.jsonl'} line 2"
    assert error([good, {"input": "a"}]) == f"{at}: key 'output' is missing (row keys: ['input'])"
    assert error([good, {"input": "a", "output": 7}]) == f"{at}: key 'output' must be a string, got int"
    pair = {"input": "a", "chosen": "c", "rejected": "r"}
    assert error([pair, {"prompt": "p", "rejected": "r"}], build_pairs) == (
        f"{at}: key 'chosen' is missing (row keys: ['prompt', 'rejected'])")
    assert error([pair, {"chosen": 5, "rejected": "r"}], build_pairs) == (
        f"{at}: key 'chosen' must be a string or a list of messages, got int")
    assert error([pair, {"chosen": "c", "rejected": "r"}], build_pairs) == (
        f"{at}: key 'input' is missing (row keys: ['chosen', 'rejected'])")
    assert error([{"m": CHAT}, {"m": [CHAT[0]]}], messages_key="m") == (
        f"{at}: key 'm' has no assistant message to train on (roles: ['user'])")
    assert error([{"m": CHAT}, {"m": [{"role": "user"}]}], messages_key="m").startswith(
        f"{at}: key 'm' item 0 must be a message, an object with string 'role' and 'content'")


# ---- lengths, mixing and the eval split ----

def test_too_long_samples_are_dropped_and_counted(tmp_path, fmt):
    rows = [{"input": "hi", "output": "x" * n, "chosen": "yo", "rejected": "x" * n} for n in (1, 5, 20, 30)]
    path = str(write(tmp_path, "d.jsonl", rows))
    built = build_sft(data(paths=[path], max_len=10), fmt, 0)  # "hi" + n x's + EOS: 4, 8, 23, 33 tokens
    assert sorted(len(s.tokens) for s in built.train) == [4, 8]
    assert (built.dropped, built.rows, built.eval_dropped) == ({"too_long": 2}, 4, {})
    held = build_sft(data(paths=[path], eval_path=path, max_len=10), fmt, 0)
    assert (len(held.eval), held.eval_dropped) == (2, {"too_long": 2})
    pairs = build_pairs(data(paths=[path], max_len=10), fmt, 0)  # the rejected side is the long one
    assert (len(pairs.train), pairs.dropped) == (2, {"too_long": 2})
    with pytest.raises(DataError, match="^data.max_len: all 4 training rows are longer than 8 tokens$"):
        build_sft(data(paths=[path], max_len=8, max_samples=4, input_template="User: {}\nAssistant: "), fmt, 0)


def test_max_samples_caps_training_rows(tmp_path, fmt):
    path = str(write(tmp_path, "a.jsonl", rows_of(10)))
    built = build_sft(data(paths=[path], max_samples=4), fmt, 0)
    assert (len(built.train), built.rows, len(set(s.where for s in built.train)), built.dropped) == (4, 4, 4, {})


def sources(built) -> Counter:
    return Counter(s.where.split(" line ")[0].rsplit("/", 1)[1] for s in built.train)


def test_mixing_counts_follow_the_weights(tmp_path, fmt):
    a = str(write(tmp_path, "a.jsonl", rows_of(4, "a")))
    b = str(write(tmp_path, "b.jsonl", rows_of(10, "b")))
    c = str(write(tmp_path, "c.jsonl", rows_of(6, "c")))
    # No probs: every dataset in full.
    assert sources(build_sft(data(paths=[a, b]), fmt, 0)) == {"a.jsonl": 4, "b.jsonl": 10}
    # N = 14 rows, half each: a (4 rows) is oversampled to 7, every row at least once, none three times.
    built = build_sft(data(paths=[a, b], probs=[1, 1]), fmt, 0)
    assert sources(built) == {"a.jsonl": 7, "b.jsonl": 7} and built.rows == 14
    assert sorted(Counter(s.where for s in built.train if "a.jsonl" in s.where).values()) == [1, 2, 2, 2]
    assert len({s.where for s in built.train if "b.jsonl" in s.where}) == 7  # drawn without replacement
    # N = max_samples: round(10 * 0.3) = 3 and round(10 * 0.7) = 7.
    assert sources(build_sft(data(paths=[a, b], probs=[0.3, 0.7], max_samples=10), fmt, 0)) == {"a.jsonl": 3, "b.jsonl": 7}
    # round(10 / 3) = 3 each: 9 rows; round(2.5) = 2 (Python rounds halves to even).
    assert sources(build_sft(data(paths=[a, b, c], probs=[1, 1, 1], max_samples=10), fmt, 0)) == {
        "a.jsonl": 3, "b.jsonl": 3, "c.jsonl": 3}
    assert sources(build_sft(data(paths=[a, b], probs=[1, 1], max_samples=5), fmt, 0)) == {"a.jsonl": 2, "b.jsonl": 2}
    assert sources(build_sft(data(paths=[a, b], probs=[0, 1]), fmt, 0)) == {"b.jsonl": 14}


def test_mixing_is_a_function_of_the_seed(tmp_path, fmt):
    a = str(write(tmp_path, "a.jsonl", rows_of(4, "a")))
    b = str(write(tmp_path, "b.jsonl", rows_of(10, "b")))
    cfg = data(paths=[a, b], probs=[1, 1], eval_fraction=0.2)

    def order(seed: int) -> list[str]:
        built = build_sft(cfg, fmt, seed)
        return [s.where for s in built.eval] + [s.where for s in built.train]

    assert order(3) == order(3)
    assert order(3) != order(4)
    files = [Counter(w.split(" line ")[0] for w in order(seed)) for seed in (3, 4)]
    assert files[0] == files[1] == {a: 7, b: 7}  # the counts per dataset are the same: only the draw differs


def test_eval_split_sizes(tmp_path, fmt):
    path = str(write(tmp_path, "a.jsonl", rows_of(30)))
    for fraction, held in ((0.1, 3), (0.05, 2), (0.25, 8), (0.0, 0)):
        built = build_sft(data(paths=[path], eval_fraction=fraction), fmt, 0)
        assert (len(built.eval), len(built.train), built.rows) == (held, 30 - held, 30 - held)
        assert not {s.where for s in built.eval} & {s.where for s in built.train}
    capped = build_sft(data(paths=[path], eval_fraction=0.25, max_samples=10), fmt, 0)
    assert (len(capped.eval), len(capped.train)) == (3, 7)  # ceil(2.5) of the 10 capped rows
    held_out = str(write(tmp_path, "eval.json", rows_of(5, "e")))
    built = build_sft(data(paths=[path], eval_path=held_out, eval_fraction=0.5, max_samples=10), fmt, 0)
    assert (len(built.train), [s.where for s in built.eval]) == (10, [f"{held_out} row {i}" for i in range(5)])
    one_row = str(write(tmp_path, "one.jsonl", rows_of(1)))
    with pytest.raises(DataError, match="^data.eval_fraction: holding out 1 of 1 rows leaves none to train on$"):
        build_sft(data(paths=[one_row], eval_fraction=0.5), fmt, 0)
    with pytest.raises(DataError, match="^data.eval_path: .*missing.jsonl does not exist$"):
        build_sft(data(paths=[path], eval_path=str(tmp_path / "missing.jsonl")), fmt, 0)


# ---- PRM ----

def test_reward_tokens_must_be_single_tokens(fmt):
    assert reward_token_ids(PRMConfig(), fmt) == [13, 15]  # "+" and "-"
    with pytest.raises(DataError, match=r"^prm.reward_tokens: 'ки' is 4 tokens for this tokenizer \(\[143, 121, 143, "
                                        r"119\]\); each reward token must encode to exactly one token$"):
        reward_token_ids(PRMConfig(reward_tokens=["+", "ки"]), fmt)


def test_prm_placeholder_rows(tmp_path, fmt):
    mark = fmt.encode("ки")
    assert mark == [143, 121, 143, 119]
    rows = [{"input": "1+1=2 ки 2+2=5 ки", "label": ["+", "-"]},
            {"input": "a ки b ки c ки", "label": [True, False, 1]},
            {"input": "x ки", "label": [0]}]
    path = str(write(tmp_path, "d.jsonl", rows))
    built = build_prm(data(paths=[path]), PRMConfig(), fmt, 0)
    by_line = {s.where: s for s in built.train}
    first = by_line[f"{path} line 1"]
    assert first.tokens == fmt.encode("1+1=2 ") + mark + fmt.encode(" 2+2=5 ") + mark
    n = len(fmt.encode("1+1=2 "))
    assert first.positions == [n + 3, n + 3 + len(fmt.encode(" 2+2=5 ")) + 4]
    assert [first.tokens[p] for p in first.positions] == [119, 119] and first.labels == [0, 1]
    assert by_line[f"{path} line 2"].labels == [0, 1, 0] and len(by_line[f"{path} line 2"].positions) == 3
    assert by_line[f"{path} line 3"].labels == [1]

    templated = build_prm(data(paths=[path], input_template="Q: {}"), PRMConfig(), fmt, 0)
    third = {s.where: s for s in templated.train}[f"{path} line 3"]
    assert third.tokens == fmt.encode("Q: x ") + mark and third.positions == [len(fmt.encode("Q: x ")) + 3]


def test_prm_conversation_rows_and_scoring(tmp_path, fmt):
    path = str(write(tmp_path, "d.jsonl", [{"chat": CHAT, "label": [True, "-"]}]))
    sample = one(build_prm(data(paths=[path], messages_key="chat"), PRMConfig(), fmt, 0))
    tokens, mask = ledger_from_messages(fmt, CHAT)
    assert sample.tokens == tokens and sample.labels == [0, 1]
    yo_end = len(fmt.initial(CHAT[:1])) + 2  # "yo" is 2 tokens, then its EOS
    assert sample.positions == [yo_end, len(tokens) - 1]
    assert [tokens[p] for p in sample.positions] == [fmt.eos_id] * 2
    scored = prm_sample(fmt, CHAT, None, "episode 7")
    assert (scored.tokens, scored.positions, scored.labels, scored.where) == (tokens, sample.positions, [], "episode 7")
    with pytest.raises(DataError, match="^episode 7: 1 step labels for 2 assistant messages$"):
        prm_sample(fmt, CHAT, [0], "episode 7")


def test_prm_bad_rows(tmp_path, fmt):
    def error(rows, **kw) -> str:
        path = write(tmp_path, "bad.jsonl", rows)
        with pytest.raises(DataError) as info:
            build_prm(data(paths=[str(path)], **kw), PRMConfig(), fmt, 0)
        return str(info.value)

    at = f"data.paths: {tmp_path / 'bad.jsonl'} line 1"
    assert error([{"input": "a ки b ки", "label": ["+"]}]) == (
        f"{at}: key 'label' has 1 step labels for 2 steps in 'input' (each ends with the placeholder 'ки')")
    assert error([{"input": "a ки", "label": ["?"]}]) == (
        f"{at}: key 'label' item 0: '?' is not a step label (one of ['+', '-'], true/false or 1/0)")
    assert error([{"input": "a ки", "label": "+"}]) == f"{at}: key 'label' must be a list of step labels, got str"
    assert error([{"chat": CHAT, "label": [1]}], messages_key="chat") == (
        f"{at}: key 'label' has 1 step labels for 2 assistant messages in 'chat'")
    assert error([{"input": "a ки", "label": [1]}], apply_chat_template=True).startswith("data.apply_chat_template: ")

"""Lineage on a real Store: who each version learned from, and which versions an exclusion marks."""
from __future__ import annotations

import json

from rlhf.retrain.lineage import lineage, tainted_versions


def feedback(store, annotator, i):
    conv = store.create_conversation("assistant", annotator, messages=[{"role": "user", "content": f"{annotator} {i}"}])
    user = store.leaf(conv.id)
    a, b = store.record_reply(user.id, f"a {i}", 1), store.record_reply(user.id, f"b {i}", 1)
    rating = store.record_rating(a.id, annotator, thumb=1)
    return store.record_comparison(a.id, b.id, "a", annotator), rating


def trained(store, tmp_path, n, parent, excluded_then=()):
    rm_dir = tmp_path / f"rm{n}"
    rm_dir.mkdir()
    (rm_dir / "meta.json").write_text(json.dumps({"excluded_annotators": list(excluded_then)}))
    snap = store.feedback_watermark("assistant")
    rm = store.register_reward_model("assistant", str(rm_dir), "pairwise", snap, {}, {})
    adapter = tmp_path / f"adapter{n}"
    adapter.mkdir()
    return store.register_policy_version("assistant", str(adapter), parent, False, reward_model_id=rm.id,
                                         data_snapshot=snap)


def test_lineage_lists_each_annotators_counts_and_id_ranges(store, tmp_path):
    first = [feedback(store, "alice", i) for i in range(3)] + [feedback(store, "carol", 9)]
    v1 = trained(store, tmp_path, 1, 1, excluded_then=["carol"])  # carol was excluded when v1 trained
    later = [feedback(store, "dave", i) for i in range(2)]
    v2 = trained(store, tmp_path, 2, v1.id)
    lin = lineage(store, v2.id)
    by = {a["annotator"]: a for a in lin["annotators"]}
    assert set(by) == {"alice", "carol", "dave"}  # v2's own reward model left nobody out
    assert by["alice"]["comparisons"] == {"count": 3, "first_id": first[0][0].id, "last_id": first[2][0].id}
    assert by["dave"]["ratings"] == {"count": 2, "first_id": later[0][1].id, "last_id": later[1][1].id}
    assert lin["inherited"] == [{"policy_id": v1.id, "version": 1, "annotators": ["alice"]},
                                {"policy_id": 1, "version": 0, "annotators": []}]
    assert lin["tainted_by"] == [] and lin["retrain_from"] is None
    assert [a["annotator"] for a in lineage(store, v1.id)["annotators"]] == ["alice"]


def test_excluding_an_annotator_marks_the_versions_that_learned_from_them(store, tmp_path):
    for i in range(2):
        feedback(store, "alice", i)
    v1 = trained(store, tmp_path, 1, 1)
    feedback(store, "dave", 0)
    v2 = trained(store, tmp_path, 2, v1.id)
    assert tainted_versions(store, "assistant") == []
    store.set_annotator_excluded("dave", True)
    marked = tainted_versions(store, "assistant")
    assert [(m["policy_id"], m["tainted_by"], m["retrain_from"]) for m in marked] == [(v2.id, ["dave"], v1.id)]
    store.set_annotator_excluded("alice", True)
    marked = {m["policy_id"]: m for m in tainted_versions(store, "assistant")}
    assert marked[v2.id]["tainted_by"] == ["alice", "dave"] and marked[v2.id]["retrain_from"] == 1  # the base
    assert marked[v1.id]["tainted_by"] == ["alice"]
    assert lineage(store, v2.id)["annotators"][0]["excluded"] is True

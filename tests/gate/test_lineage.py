"""Lineage names: the label wins, else the top owner's name without what Kubernetes generated."""

from __future__ import annotations

import pytest

from auditor.core.lineage import LINEAGE_LABEL, LineageKey, lineage_of, lineage_of_object, strip_generated
from auditor.errors import BadInput


@pytest.mark.parametrize(
    ("name", "lineage"),
    [
        # generateName: 5 characters of Kubernetes' random alphabet
        ("train-7f9c2", "train"),
        ("train-bxkzq", "train"),
        ("llama-finetune-x2kq9", "llama-finetune"),
        # a CronJob's Job: the scheduled time in minutes since the epoch
        ("train-29012345", "train"),
        ("nightly-eval-29412780", "nightly-eval"),
        # a Deployment's pod: ReplicaSet pod-template-hash, then the pod's random suffix
        ("serve-7d9f8c6b5-x2kq9", "serve"),
        ("serve-5d4b8f9c7", "serve"),
        # a date stamp added by a submit script
        ("bert-20261201", "bert"),
        # names people chose keep their numbers and words
        ("resnet-50", "resnet-50"),
        ("train-v2", "train-v2"),
        ("llama-70b", "llama-70b"),
        ("train-final", "train-final"),
        ("bert-large", "bert-large"),
        ("run-12345", "run-12345"),  # five digits: could be a person's ticket number, kept
        ("sweep-lr-0003", "sweep-lr-0003"),
        ("train", "train"),
        ("gpt2-xl", "gpt2-xl"),
        ("job-abcde", "job-abcde"),  # vowels: not Kubernetes' alphabet
        # only ever two generated segments, and never the whole name
        ("a-29012345-7f9c2-x2kq9", "a-29012345"),
        ("7f9c2", "7f9c2"),
        ("29012345", "29012345"),
        ("-7f9c2", "-7f9c2"),
    ],
)
def test_generated_suffixes_are_stripped_and_chosen_names_kept(name: str, lineage: str) -> None:
    assert strip_generated(name) == lineage
    assert lineage_of("ml", name) == LineageKey("default", "ml", lineage)


def test_the_label_wins_and_an_invalid_label_is_ignored() -> None:
    assert lineage_of("ml", "train-7f9c2", labels={LINEAGE_LABEL: "bert-pretrain"}).lineage == "bert-pretrain"
    assert lineage_of("ml", "train-7f9c2", labels={LINEAGE_LABEL: "  "}).lineage == "train"
    assert lineage_of("ml", "train-7f9c2", labels={LINEAGE_LABEL: "-bad-"}).lineage == "train"


def test_generate_name_is_the_exact_prefix() -> None:
    # a person's name that looks generated is kept when generateName says where the suffix began
    assert lineage_of("ml", "exp-29012345-b4x2z", generate_name="exp-29012345-").lineage == "exp-29012345"


def test_lineage_is_per_cluster_and_namespace() -> None:
    a = lineage_of("team-a", "train-7f9c2", cluster="east")
    b = lineage_of("team-b", "train-7f9c2", cluster="east")
    assert a != b and a.lineage == b.lineage == "train"
    assert str(a) == "team-a/train"


def test_object_at_admission_takes_label_then_owner_then_generate_name() -> None:
    cron_job = {
        "metadata": {
            "name": "train-29012345",
            "namespace": "ml",
            "ownerReferences": [{"kind": "CronJob", "name": "train", "controller": True, "uid": "u1"}],
        }
    }
    assert lineage_of_object(cron_job, cluster="c1") == LineageKey("c1", "ml", "train")
    labelled = {"metadata": {**cron_job["metadata"], "labels": {LINEAGE_LABEL: "nightly"}}}
    assert lineage_of_object(labelled).lineage == "nightly"
    generated = {"metadata": {"name": "exp-2-abc12", "generateName": "exp-2-", "namespace": "ml"}}
    assert lineage_of_object(generated).lineage == "exp-2"
    plain = {"metadata": {"name": "train-7f9c2", "namespace": "ml"}}
    assert lineage_of_object(plain).lineage == "train"
    jobset = {
        "metadata": {
            "name": "sweep-x2kq9-workers-0",
            "namespace": "ml",
            "ownerReferences": [{"kind": "JobSet", "name": "sweep-x2kq9", "controller": True}],
        }
    }
    assert lineage_of_object(jobset).lineage == "sweep"


@pytest.mark.parametrize("text", ["train", "ml/", "/train", "ml/a/b", ""])
def test_parse_refuses_what_is_not_namespace_slash_lineage(text: str) -> None:
    with pytest.raises(BadInput, match="NAMESPACE/LINEAGE"):
        LineageKey.parse(text)


def test_parse() -> None:
    assert LineageKey.parse(" ml/train ", cluster="c") == LineageKey("c", "ml", "train")

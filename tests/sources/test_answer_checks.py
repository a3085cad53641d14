"""The pure parts of issue 35's answer checks: series counted in a body that arrives in pieces,
what makes an answer malformed, and a series with a sample that is not a number left out.

(The same on the bed's Prometheus, behind proxies that flood, garble and hold its answers:
tests/reliability/test_series_bounds.py, test_malformed_answers.py, test_answer_deadline.py.)
"""

from __future__ import annotations

import json

import pytest

from auditor.errors import MalformedAnswer
from auditor.sources.prometheus_client import SeriesCounter
from auditor.sources.samples import matrix_of, matrix_result, parse_matrix

SERIES = [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": "a", "metric": "metric"}, "values": [[1.0, "1"]]},
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": 'b"metric":{', "job": "metric"}, "values": [[1.0, "2"]]},
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": "c"}, "values": [[1.0, "3"], [2.0, "4"]]},
]


def _body(series: list[dict], **dumps: object) -> bytes:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": series}}
    return json.dumps(doc, **dumps).encode()  # type: ignore[arg-type]


@pytest.mark.parametrize("style", [{"separators": (",", ":")}, {}, {"indent": 2}], ids=["go", "spaced", "indented"])
def test_series_are_counted_wherever_the_body_is_cut(style: dict) -> None:
    """A label named or valued "metric", or a value holding ``"metric":{``, is not a series."""
    body = _body(SERIES, **style)
    for cut in range(len(body) + 1):
        counter = SeriesCounter()
        counter.feed(body[:cut])
        assert counter.feed(body[cut:]) == 3, cut


def test_series_are_counted_a_byte_at_a_time() -> None:
    counter, total = SeriesCounter(), 0
    for byte in _body(SERIES * 4):
        total = counter.feed(bytes([byte]))
    assert total == 12


@pytest.mark.parametrize(
    "data, says",
    [
        (None, "data is null, not an object"),
        ([], "data is [], not an object"),
        ({"resultType": "string", "result": [1, "abc"]}, "resultType is 'string', not 'matrix'"),
        ({"resultType": "vector", "result": []}, "resultType is 'vector', not 'matrix'"),
        ({"resultType": "matrix", "result": None}, "result is null, not a list of series"),
        ({"resultType": "matrix", "result": {"a": 1}}, 'result is {"a": 1}, not a list of series'),
        ({"resultType": "matrix", "result": [1]}, "result[0] is int, not a series (metric and values)"),
        ({"resultType": "matrix", "result": [{"metric": [], "values": []}]}, "result[0] is"),
        ({"resultType": "matrix", "result": [{"metric": {}, "values": None}]}, "result[0] is"),
    ],
)
def test_an_answer_that_is_not_a_matrix_is_malformed(data: object, says: str) -> None:
    with pytest.raises(MalformedAnswer, match=f"^{says}".replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        matrix_result(data)


def test_a_matrix_is_its_result() -> None:
    assert matrix_result({"resultType": "matrix", "result": []}) == []


@pytest.mark.parametrize(
    "values, why",
    [
        ([[1.0, "1"], [2.0, "abc"]], "a sample value that is not a number ('abc')"),
        ([[1.0, None]], "a sample value that is not a number (null)"),
        ([[1.0]], "a sample that is not a [time, value] pair ([1.0])"),
        ([["x", "1"]], "a sample time that is not a number ('x')"),
        (["1"], "a sample that is not a [time, value] pair ('1')"),
    ],
)
def test_a_series_with_a_sample_that_is_not_a_number_is_left_out_and_named(values: list, why: str) -> None:
    result = [
        {"metric": {"__name__": "n", "pod": "good"}, "values": [[1.0, "5"], [2.0, "NaN"]]},
        {"metric": {"__name__": "n", "pod": "bad"}, "values": values},
    ]
    rejected: list[tuple[dict, str]] = []
    labels, lens, ts, vals = matrix_of(result, rejected=rejected)
    assert labels == [{"pod": "good"}] and lens == [2]
    assert ts.tolist() == [1.0, 2.0] and vals[0] == 5.0 and vals[1] != vals[1]
    assert rejected == [({"pod": "bad"}, why)]


def test_the_plain_reader_leaves_a_body_with_such_a_sample_to_the_decoder() -> None:
    series = [{"metric": {"__name__": "n", "pod": "a"}, "values": [[1.0, "abc"]]}]
    assert parse_matrix(_body(series, separators=(",", ":")), "n") is None


@pytest.mark.parametrize(
    "series",
    [
        [{"metric": ["a"], "values": [[1.0, "1"]]}],
        [{"metric": {"a": "b"}, "values": "abc"}, {"metric": {"a": "c"}, "values": [[1.0, "1"]]}],
        [{"metric": {"a": "b"}, "values": [[1.0, "1"]]}, {"metric": {"a": "c"}, "values": "x"}],
        [{"metric": {"a": "b"}, "values": [[1.0, "1"]]}, {"metric": {"a": "c"}, "values": {"x": 1}}],
    ],
    ids=["metric-list", "values-string-first", "values-string-last", "values-object"],
)
def test_a_series_of_another_shape_is_left_to_the_decoder_which_names_it(series: list) -> None:
    """Found by the hostile-identities property tests: the plain reader took a list for a label
    set, and ran a series without a values list into the next one."""
    assert parse_matrix(_body(series, separators=(",", ":")), "n") is None
    with pytest.raises(MalformedAnswer, match=r"^result\[\d\] is .*, not a series \(metric and values\)"):
        matrix_result(json.loads(_body(series))["data"])


def test_a_label_named_values_or_metric_is_read_as_any_other() -> None:
    series = [{"metric": {"__name__": "n", "metric": "x", "values": "y"}, "values": [[1.0, "1"]]}]
    got = parse_matrix(_body(series, separators=(",", ":")), "n")
    assert got is not None and got[0] == [b'{"metric":"x","values":"y"}']

"""A raw read's answer body read without JSON objects per sample gives what the decoded JSON gives.

The raw read of a cycle (auditor/sources/samples.py ``parse_matrix``) splits Prometheus's answer
at the byte sequences that separate one series from the next and reads all samples at once; the
statistics must be bit for bit those of the decoded answer (``bucket_stats``), whatever the labels
hold (quotes, backslashes, the separators themselves inside a value, non-ASCII) and whatever the
values are (NaN, infinities, -0, integers past 2**53 and 2**64, long decimals). Bodies in any
other form are left to the JSON decoder (None).
"""

from __future__ import annotations

import json
import math
import random
from decimal import Decimal

import pytest

from auditor.sources.samples import bucket_stats, label_key, labels_of, parse_matrix, stats_of

NAME = "DCGM_FI_DEV_GPU_UTIL"
WIDTH, N, FIRST = 300_000, 3, 1_767_225_600_000


def _go(v: float) -> str:
    """A value as Prometheus writes it (Go's strconv.FormatFloat(v, 'f', -1, 64))."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return format(Decimal(repr(v)).normalize(), "f")  # the shortest digits, no exponent


def _body(result: list[dict]) -> bytes:
    data = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _labels(j: int, rng: random.Random) -> dict[str, str]:
    odd = ['say "hi"', "back\\slash", ']]},{"metric":', ',"values":[', "ümlaut", "", "{}"]
    labels = {"Hostname": f"node-{j}", "UUID": f"GPU-{j}", "gpu": str(j % 8), "pod": rng.choice(odd) + str(j)}
    where = j % 4  # __name__ first, inside, last or (one series) the only label
    items = list(labels.items())
    if where == 3 and j == 3:
        return {"__name__": NAME}
    items.insert([0, 2, len(items), 0][where], ("__name__", NAME))
    return dict(items)


def _result(rng: random.Random, specials: list[float]) -> list[dict]:
    result = []
    for j in range(60):
        points = []
        for i in range(N):
            ts = sorted(rng.sample(range(0, WIDTH, 1000), rng.randint(0 if j else 1, 12)))
            for t in ts:
                v = rng.choice(specials) if rng.random() < 0.3 else rng.uniform(-3, 1e4)
                points.append([(FIRST + i * WIDTH + t) / 1000, _go(v)])
        if points:
            result.append({"metric": _labels(j, rng), "values": points})
    return result


def _same_stats(body: bytes) -> list[dict]:
    got = parse_matrix(body, NAME)
    assert got is not None, "a plain answer is read without the decoder"
    keys, lens, ts, values = got
    decoded = json.loads(body)["data"]["result"]
    labels, want = bucket_stats(decoded, FIRST, WIDTH, N)
    assert labels_of(keys) == labels  # __name__ removed wherever it stood
    assert lens == [len(item["values"]) for item in decoded]
    block = stats_of(lens, ts, values, FIRST, WIDTH, N)
    assert block.shape == want.shape
    assert block.tobytes() == want.tobytes()  # bit for bit: NaN payloads, -0 and all
    # one bucket (a cycle's usual read): every sample is in it, no timestamps needed
    alone = parse_matrix(body, NAME, times=False)
    assert alone is not None and alone[2] is None
    one = stats_of(alone[1], None, alone[3], FIRST, WIDTH, 1)
    assert one.tobytes() == bucket_stats(json.loads(body)["data"]["result"], FIRST, WIDTH, 1)[1].tobytes()
    return labels


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_plain_body_gives_the_decoded_statistics(seed: int) -> None:
    rng = random.Random(seed)
    big = [2.0**53 + 1, 2.0**64 + 2048, 1e20, 123456789012345678.0, 0.1 + 0.2, 1e-7, 4294967295.0]
    specials = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, *big]
    labels = _same_stats(_body(_result(rng, specials)))
    assert {} in labels  # the series whose only label was __name__


def test_numbers_only_and_the_sign_of_zero() -> None:
    rng = random.Random(7)
    _same_stats(_body(_result(rng, [0.5, 1.0, 2.0**63 + 2.0**11])))  # every value a JSON number
    body = _body([{"metric": {"a": "1"}, "values": [[1.0, "-0"], [2.0, "-0"]]}])
    got = parse_matrix(body, NAME)
    assert got is not None and [str(v) for v in got[3]] == ["-0.0", "-0.0"] and got[2] is not None
    assert list(got[2]) == [1.0, 2.0]
    one = parse_matrix(body, NAME, times=False)
    assert one is not None and one[2] is None and [str(v) for v in one[3]] == ["-0.0", "-0.0"]


def test_an_empty_answer_and_bodies_left_to_the_decoder() -> None:
    empty = parse_matrix(_body([]), NAME)
    assert empty is not None and empty[0] == [] and empty[1] == [] and not len(empty[3])
    item = {"metric": {"a": "1"}, "values": [[1.0, "2"]]}
    plain = _body([item])
    assert parse_matrix(plain, NAME) is not None
    warned = json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": [item]}, "warnings": ["partial"]},
        separators=(",", ":"),
    ).encode()
    histogram = _body([{"metric": {"a": "1"}, "histograms": [[1.0, {"count": "1"}]]}])
    reordered = _body([{"values": [[1.0, "2"]], "metric": {"a": "1"}}])
    spaced = json.dumps(json.loads(plain)).encode()
    failed = b'{"status":"error","errorType":"bad_data","error":"x"}'
    for body in (warned, histogram, reordered, spaced, failed):
        assert parse_matrix(body, NAME) is None, body[:80]


def test_a_decoded_label_set_keys_as_the_body_does() -> None:
    labels = {"Hostname": "n", "UUID": "GPU-1", "pod": 'a "b"'}
    body = _body([{"metric": {"__name__": NAME, **labels}, "values": [[1.0, "1"]]}])
    got = parse_matrix(body, NAME)
    assert got is not None and got[0] == [label_key(labels)]

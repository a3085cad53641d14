"""Raw samples of a range-vector answer → per-bucket count, sum, min and max, as Prometheus's
``*_over_time`` functions compute them.

A short window (an operator cycle's one or two buckets) is cheaper to read as one raw-sample
query per exporter name than as four aggregate queries: Prometheus selects the samples once
instead of evaluating four functions, and the auditor decodes each series' labels once instead
of four times. The statistics must then be exactly those the aggregate queries would have
answered, so the garbage checks and every figure built on them stay the same:

- ``count``: the number of samples (NaN samples included, as ``count_over_time``);
- ``sum``: Kahan-Neumaier summation in sample order, as ``sum_over_time`` (Prometheus
  ``kahanSumInc``; an infinite sum is returned without the compensation term);
- ``min``/``max``: the first sample, replaced by a later one that is smaller/larger or when the
  value so far is NaN, as ``min_over_time``/``max_over_time`` (NaN only when every sample is).

All of it runs in numpy over every (series, bucket) of an answer at once: the Python cost is
per series (collecting its values), not per sample or per bucket. Pure: no I/O.

Malformed answers (issue 35): an answer that is not a matrix at all (``result`` null, a
``string`` result, items that are not series) is :class:`~auditor.errors.MalformedAnswer`
(:func:`matrix_result`); one series with a sample that is not a number (``"abc"``) or not a
``[time, "value"]`` pair is left out and named (``rejected``), and the others are read.
"""

from __future__ import annotations

import json
from itertools import chain
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from auditor.errors import MalformedAnswer

_loads: Callable[[bytes], Any]
try:
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; json reads the same, slower
    _loads = json.loads

#: the four statistics, in the order :func:`bucket_stats` returns them
STATS = ("count", "sum", "min", "max")


def matrix_result(data: Any) -> list[dict]:
    """``data.result`` of a range-vector answer, checked to be a list of series (each a
    ``metric`` object and a ``values`` list); raise :class:`~auditor.errors.MalformedAnswer`
    saying what it is instead. A sample inside a series is checked where it is read."""
    if not isinstance(data, dict):
        raise MalformedAnswer(f"data is {_kind(data)}, not an object")
    kind = data.get("resultType")
    if kind != "matrix":
        raise MalformedAnswer(f"resultType is {_kind(kind)}, not 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise MalformedAnswer(f"result is {_kind(result)}, not a list of series")
    for i, item in enumerate(result):
        if not (
            isinstance(item, dict)
            and isinstance(item.get("metric", {}), dict)
            and isinstance(item.get("values", []), list)
        ):
            raise MalformedAnswer(f"result[{i}] is {_kind(item)[:80]}, not a series (metric and values)")
    return result


def _kind(value: Any) -> str:
    """A value as an answer's message names it (JSON's words: null, a string's text)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value[:40])
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=True)[:80]
    return type(value).__name__


def bucket_stats(
    result: list[dict], first_start_ms: int, width_ms: int, n: int, rejected: list[tuple[dict, str]] | None = None
) -> tuple[list[dict], Any]:
    """The label sets of a range-vector answer's series and their per-bucket statistics.

    ``result`` is the decoded ``data.result`` of an instant query ``sel[range]`` (each item a
    ``metric`` label dict and ``values`` ``[ts, "value"]`` pairs in time order); buckets are
    ``[first_start + i*width, first_start + (i+1)*width)`` for ``i < n``. Returns the label
    dicts (as decoded, ``__name__`` removed) and a float64 array of shape ``(4, series, n)``:
    :data:`STATS` per series and bucket, NaN where a bucket has no sample. A series with a
    sample that is not a number is left out, and appended to ``rejected`` (:func:`matrix_of`).
    """
    labels, lens, ts, values = matrix_of(result, times=n > 1, rejected=rejected)
    if not len(values):
        return labels, np.full((4, len(labels), n), np.nan)
    return labels, stats_of(lens, ts, values, first_start_ms, width_ms, n)


def matrix_of(
    result: list[dict], times: bool = True, rejected: list[tuple[dict, str]] | None = None
) -> tuple[list[dict], list[int], Any, Any]:
    """A decoded matrix answer as :func:`parse_matrix` reads a body: per series its label dict
    (``__name__`` removed) and number of samples, and all timestamps (None unless ``times``)
    and values as float64 arrays in answer order.

    A series with a sample that is not a ``[time, "number"]`` pair is left out (one series
    must not fail the read), with its labels and why appended to ``rejected``."""
    try:
        return _matrix_of(result, times)
    except (ValueError, TypeError, IndexError):
        pass
    good: list[dict] = []
    for item in result:
        why = _bad_sample(item.get("values") or ())
        if why is None:
            good.append(item)
        else:
            lab = dict(item.get("metric", {}))
            lab.pop("__name__", None)
            if rejected is not None:
                rejected.append((lab, why))
    return _matrix_of(good, times)


def _bad_sample(values: Any) -> str | None:
    """Why one series' ``values`` cannot be read (its first bad sample), or None."""
    for point in values:
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            return f"a sample that is not a [time, value] pair ({_kind(point)})"
        t, v = point
        try:
            float(t)
        except (ValueError, TypeError):
            return f"a sample time that is not a number ({_kind(t)})"
        try:
            float(v)
        except (ValueError, TypeError):
            return f"a sample value that is not a number ({_kind(v)})"
    return None


def _matrix_of(result: list[dict], times: bool) -> tuple[list[dict], list[int], Any, Any]:
    labels: list[dict] = []
    lens: list[int] = []
    for item in result:
        lab = item.get("metric", {})
        lab.pop("__name__", None)
        labels.append(lab)
        lens.append(len(item.get("values") or ()))
    total = sum(lens)
    points = list(chain.from_iterable(item.get("values") or () for item in result))
    values = np.fromiter(map(float, map(itemgetter(1), points)), dtype=np.float64, count=total)
    ts = np.fromiter(map(itemgetter(0), points), dtype=np.float64, count=total) if times else None
    return labels, lens, ts, values


#: how a plain Prometheus answer of a range-vector query begins and ends (Go's encoding of
#: ``{"status":"success","data":{"resultType":"matrix","result":[...]}}``, no warnings)
_HEAD = b'{"status":"success","data":{"resultType":"matrix","result":['
_TAIL = b"]}}"
_ITEM = b'{"metric":'
#: between one series' last sample and the next series' labels; and between labels and samples.
#: Neither can occur inside a JSON string (a quote there is escaped), nor in the samples
_NEXT = b']]},{"metric":'
_VALUES = b',"values":['


def parse_matrix(body: bytes, name: str, times: bool = True) -> tuple[list[bytes], list[int], Any, Any] | None:
    """A range-vector answer's body read without making an object per sample: per series its
    label set as the JSON bytes of its ``metric`` object (``__name__`` removed, so the series
    of every exporter name of one device have equal keys) and its number of samples; and all
    samples' timestamps (None unless ``times``) and values as float64 arrays in answer order.

    Only the plain form Prometheus writes is read so; for anything else (warnings or infos,
    histograms, another engine's layout) this returns None and the caller decodes the body as
    JSON. Values are parsed as JSON numbers (correctly rounded, as ``float`` parses the quoted
    strings), or where one is not (NaN, an infinity, -0) all by numpy's parser, which is too.
    """
    if not (body.startswith(_HEAD) and body.endswith(_TAIL)) or b'"warnings"' in body or b'"infos"' in body:
        return None
    if len(body) == len(_HEAD) + len(_TAIL):
        return [], [], np.empty(0), np.empty(0)
    if not (body.startswith(_ITEM, len(_HEAD)) and body.endswith(b"]]}" + _TAIL)) or b'"histogram' in body:
        return None
    quoted = name.encode()
    inner = body[len(_HEAD) + len(_ITEM) : -len(_TAIL) - 3].replace(b'"__name__":"' + quoted + b'",', b"")
    if b'"__name__":' in inner:  # the name last in a label set, or its only label
        inner = inner.replace(b',"__name__":"' + quoted + b'"}', b"}").replace(b'{"__name__":"' + quoted + b'"}', b"{}")
    # labels, samples, labels, samples, ...: neither separator can occur inside them
    parts = inner.replace(_NEXT, _VALUES).split(_VALUES)
    del inner
    if len(parts) % 2:
        return None
    keys, segments = parts[0::2], parts[1::2]
    del parts
    if not all(_one_object(k) for k in keys):  # a series of another shape: the decoder says which
        return None
    # each segment is "[t,"v"],[t,"v"]...[t,"v"" : 2k - 1 commas for k samples
    lens = [(seg.count(b",") + 1) >> 1 for seg in segments]
    joined = b",".join(segments)
    del segments
    flat = joined.translate(None, b'[]"')
    pairs = None
    if b'"-0"' not in joined:  # (JSON reads -0 as the integer 0: the sign would be lost)
        try:
            numbers = _loads(b"[" + flat + b"]")
        except ValueError:  # NaN or an infinity: not JSON numbers
            pass
        else:
            if len(numbers) != 2 * sum(lens):
                return None
            values = np.array(numbers[1::2], dtype=np.float64)
            return keys, lens, np.array(numbers[0::2], dtype=np.float64) if times else None, values
    del joined
    try:
        pairs = np.array(flat.split(b","), dtype=np.bytes_).astype(np.float64)
    except ValueError:  # a sample that is no number at all ("abc"): the decoder names its series
        return None
    if len(pairs) != 2 * sum(lens):
        return None
    return keys, lens, pairs[0::2] if times else None, pairs[1::2]


def _one_object(key: bytes) -> bool:
    """Whether a label-set key the plain reader split off is one JSON object: not a list, and not
    two series run together because one of them had no ``values`` list (``"values":"abc"``).
    (Neither ``},"values":`` nor ``{"metric":{`` can occur inside a JSON string: its quotes are
    escaped; a label named ``values`` follows a ``{`` or a ``,``, never a ``}``, and a label's
    value is a string, never an object.)"""
    return key[:1] == b"{" and key[-1:] == b"}" and b'},"values":' not in key and b'{"metric":{' not in key


def label_key(labels: dict[str, str]) -> bytes:
    """A decoded label set's key, as :func:`parse_matrix` gives one (compact JSON: a series the
    plain reader and the decoder both saw gets equal keys wherever the engine writes its labels
    as Go does)."""
    return json.dumps(labels, separators=(",", ":"), ensure_ascii=False).encode()


def labels_of(keys: list[bytes]) -> list[dict[str, str]]:
    """The label dicts of label-set keys (:func:`parse_matrix`, :func:`label_key`), decoded at once."""
    return list(_loads(b"[" + b",".join(keys) + b"]")) if keys else []


def stats_of(lens: list[int], ts: Any, values: Any, first_start_ms: int, width_ms: int, n: int) -> Any:
    """:func:`bucket_stats` of samples given as arrays: ``lens[i]`` samples of series ``i`` in
    time order, their timestamps ``ts`` (Unix seconds; unused when ``n == 1``) and ``values``
    concatenated; a ``(4, series, n)`` block."""
    out = np.full((4, len(lens), n), np.nan)
    total = len(values)
    if not total:
        return out
    row = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    if n == 1:  # the query's range is the one bucket: every sample is in it
        col = np.zeros(total, dtype=np.int64)
    else:
        # whole milliseconds, rounded as auditor.sources.promql.parse_ts_ms does (half to even)
        col = (np.rint(ts * 1000).astype(np.int64) - first_start_ms) // width_ms
        inside = (col >= 0) & (col < n)
        if not inside.all():
            row, col, values = row[inside], col[inside], values[inside]
            if not len(values):
                return out
    cell = row * n + col
    # samples of one series are in time order, so each (series, bucket) cell is one run
    starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    runs = np.diff(np.append(starts, len(cell)))
    cnt = runs.astype(np.float64)
    s = np.zeros(len(starts))
    c = np.zeros(len(starts))
    lo = values[starts].copy()
    hi = lo.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        shortest = int(runs.min())
        for k in range(int(runs.max())):
            has = None if k < shortest else np.flatnonzero(runs > k)
            v = values[starts + k] if has is None else values[starts[has] + k]
            s_k = s if has is None else s[has]
            t = s_k + v
            comp = np.where(np.abs(s_k) >= np.abs(v), (s_k - t) + v, (v - t) + s_k)
            m_lo = lo if has is None else lo[has]
            m_hi = hi if has is None else hi[has]
            new_lo = np.where((v < m_lo) | np.isnan(m_lo), v, m_lo)
            new_hi = np.where((v > m_hi) | np.isnan(m_hi), v, m_hi)
            if has is None:
                s, c, lo, hi = t, c + comp, new_lo, new_hi
            else:
                s[has], c[has], lo[has], hi[has] = t, c[has] + comp, new_lo, new_hi
        tot = np.where(np.isinf(s), s, s + c)
    flat = out.reshape(4, -1)
    at = cell[starts]
    flat[0, at], flat[1, at], flat[2, at], flat[3, at] = cnt, tot, lo, hi
    return out

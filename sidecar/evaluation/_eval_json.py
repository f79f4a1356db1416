"""Reading a ``sidecar eval`` JSON back: :func:`read_eval_json` loads it and checks the
shapes the evaluation report relies on, naming the field that is wrong."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar._input_files import input_file
from sidecar.errors import DataError
from sidecar.training import METRIC_KEYS

# The figures of the seed-spread table, each as {"median", "min", "max"}.
SPREAD_SHOWN = ("auroc", "balanced_accuracy", "false_reject_rate", "ood_accept_rate")


def read_eval_json(path: str | Path) -> dict[str, Any]:
    """Load a ``sidecar eval`` JSON; :class:`DataError` if it is not one."""
    p = input_file(path, "a `sidecar eval` JSON file", missing=f"cannot read {path}: not found")
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise DataError(f"cannot read {p}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise DataError(f"{p} is not JSON: {exc}") from exc
    if isinstance(doc, dict) and doc.get("ood_protocol", "standard") != "standard":
        raise DataError(
            f"{p} is a report of the {doc['ood_protocol']} OOD protocol; the eval report "
            "draws the standard protocol's (its figures per held-out family are in the JSON)"
        )
    missing = [k for k in ("benchmark", "kbs", "mean") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise DataError(f"{p} is not a sidecar eval report (no {', '.join(missing)})")
    _check_types(p, doc)
    return dict(doc)


def _check_types(p: Path, doc: Mapping[str, Any]) -> None:
    """The shapes :func:`write_eval_report` relies on; :class:`DataError` naming the field."""
    kbs = _obj(p, "kbs", doc["kbs"], holds="KB")
    for kb, rows in kbs.items():
        for det, row in _obj(p, f"kbs.{kb}", rows).items():
            _numbers(p, f"kbs.{kb}.{det}", _obj(p, f"kbs.{kb}.{det}", row), ("auroc",))
    for det, row in _obj(p, "mean", doc["mean"], holds="detector").items():
        _numbers(p, f"mean.{det}", _obj(p, f"mean.{det}", row), METRIC_KEYS)
    targets = doc.get("targets") or []
    if not isinstance(targets, list):
        raise DataError(f"{p}: targets must be a list, not {_kind(targets)}")
    for i, t in enumerate(targets):
        _has(p, f"targets[{i}]", _obj(p, f"targets[{i}]", t), ("target", "measured", "met"))
    spread = _obj(p, "seed_spread", doc.get("seed_spread") or {})
    for det, row in _obj(p, "seed_spread.mean", spread.get("mean") or {}).items():
        row = _obj(p, f"seed_spread.mean.{det}", row)
        for key in (k for k in SPREAD_SHOWN if k in row):
            where = f"seed_spread.mean.{det}.{key}"
            _numbers(p, where, _obj(p, where, row[key]), ("median", "min", "max"), all_=True)
    table = _obj(p, "pvalue_vs_evr", doc.get("pvalue_vs_evr") or {})
    for det, row in _obj(p, "pvalue_vs_evr.detectors", table.get("detectors") or {}).items():
        _protocol_row(p, f"pvalue_vs_evr.detectors.{det}", row, ("kbs_pvalue_better", "kbs"))
    avg = table.get("paper_detectors_mean")
    if avg:
        where = "pvalue_vs_evr.paper_detectors_mean"
        _protocol_row(p, where, avg, ("detectors_pvalue_better",))
        if not isinstance(avg.get("detectors"), list):
            raise DataError(f"{p}: {where}.detectors must be a list")


def _protocol_row(p: Path, where: str, row: Any, counts: Sequence[str]) -> None:
    row = _obj(p, where, row)
    _has(p, where, row, ("paper_accuracy", "auroc"))
    pa = _obj(p, f"{where}.paper_accuracy", row["paper_accuracy"])
    _numbers(p, f"{where}.paper_accuracy", pa, ("evr", "pvalue", "mean_diff"), all_=True)
    _has(p, f"{where}.paper_accuracy", pa, counts)
    au = _obj(p, f"{where}.auroc", row["auroc"])
    _numbers(p, f"{where}.auroc", au, ("mean_diff",), all_=True)


def _kind(value: Any) -> str:
    """The JSON type of ``value``, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({value[:20]!r})"
    return "a list" if isinstance(value, list) else "an object"


def _obj(p: Path, where: str, value: Any, *, holds: str = "") -> dict[str, Any]:
    """``value`` if it is a JSON object (holding at least one entry when ``holds`` names it)."""
    if not isinstance(value, dict):
        raise DataError(f"{p}: {where} must be an object, not {_kind(value)}")
    if holds and not value:
        raise DataError(f"{p}: {where} holds no {holds}")
    return value


def _has(p: Path, where: str, row: Mapping[str, Any], keys: Iterable[str]) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise DataError(f"{p}: {where} has no {', '.join(missing)}")


def _numbers(
    p: Path, where: str, row: Mapping[str, Any], keys: Iterable[str], *, all_: bool = False
) -> None:
    """Each of ``keys`` in ``row`` is a number (and present, with ``all_``)."""
    keys = tuple(keys)
    if all_:
        _has(p, where, row, keys)
    for k in keys:
        v = row.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise DataError(f"{p}: {where}.{k} must be a number, not {_kind(v)}")

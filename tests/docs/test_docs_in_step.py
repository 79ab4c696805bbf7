"""Generated or mirrored documentation matches the code it describes: the configuration table, the metrics table
and the Grafana dashboard's queries."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import Counter, Gauge, Histogram

from server.ops.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _config_table_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "scripts" / "config_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_table_is_the_generated_one() -> None:
    document = DOCS / "configuration.md"
    committed = document.read_text()
    assert committed == _config_table_script().replace_table(committed), (
        f"{document.name} is out of date: run .venv/bin/python scripts/config_table.py --write {document}")


def test_configuration_table_has_a_row_per_setting() -> None:
    from server.settings import ServerSettings

    rows = _config_table_script().table().splitlines()[2:]
    assert [re.match(r"\| `--([a-z-]+)`", row)[1] for row in rows] == [  # type: ignore[index]
        name.replace("_", "-") for name in ServerSettings.model_fields]


def _families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposition name -> (type, label names) of every metric the server registers."""
    suffix = {Counter: "_total", Gauge: "", Histogram: ""}
    found = {}
    for collector in vars(Metrics()).values():
        for kind, end in suffix.items():
            if isinstance(collector, kind):
                (family,) = collector.describe()
                found[family.name + end] = (family.type, tuple(collector._labelnames))
    return found


def test_metrics_table_lists_every_metric_with_its_type_and_labels() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text.split("<!-- metrics-table -->")[1].split("<!-- metrics-table: end -->")[0]
    documented = {}
    for row in table.strip().splitlines()[2:]:
        name, kind, labels, _ = (cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|")))
        documented[name.strip("`")] = (kind, tuple(re.findall(r"`([a-z_]+)`:", labels)))
    assert documented == _families()


def test_grafana_dashboard_queries_only_real_metrics_and_shows_them_all() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    used = set(re.findall(r"\b(contextspan_[a-z_]+)", exprs))
    families = _families()
    series = {name + end for name, (kind, _) in families.items()
              for end in (("_bucket", "_count", "_sum") if kind == "histogram" else ("",))}
    assert used <= series
    assert {name for name in families if any(s.startswith(name) for s in used)} == set(families)


@pytest.mark.parametrize("name", ["client-walkthrough.md", "client.md", "mobile.md"])
def test_python_in_the_client_docs_compiles(name: str) -> None:
    text = (DOCS / name).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        compile(block, name, "exec")

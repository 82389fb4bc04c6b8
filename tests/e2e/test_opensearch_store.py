"""The cluster trace store for real: 3 OpenSearch 2.19.1 nodes (one JVM each, from the jars of `make stack-build`)
behind the real Jaeger, the gateway and an agent Collector, on free ports on 127.0.0.1.

Without the jars the module skips with the reason, except under ``CI=true``, where it fails (CI fetches them in
its stack-build stage)."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stack as stack_mod
import stack_store

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_store.OpenSearchCluster]:
    if stack_store.missing():
        reason = f"OpenSearch's jars are not fetched ({stack_store.LIB}): run `make stack-build`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must run the cluster store test)", pytrace=False)
        pytest.skip(reason)
    try:
        running = stack_store.start_opensearch(tmp_path_factory.mktemp("opensearch"), nodes=3, heap="512m")
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot start the 3-node OpenSearch: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


def _put(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_retention_deletes_only_day_indices_older_than_the_retention(
    cluster: stack_store.OpenSearchCluster,
) -> None:
    """`up`'s retention job on the real cluster: with 7 days kept on 2026-03-10, the day indices of 2026-03-03
    and before go, those of 2026-03-04 on, another prefix's and non-day indices stay."""
    prefix = "ret-test"
    old = [f"{prefix}-jaeger-span-2026-03-03", f"{prefix}-jaeger-service-2026-02-01"]
    kept = [f"{prefix}-jaeger-span-2026-03-04", f"{prefix}-jaeger-span-2026-03-10", f"{prefix}-jaeger-span-archive",
            "other-jaeger-span-2020-01-01"]  # fmt: skip
    for name in old + kept:
        _put(f"{cluster.url()}/{name}")
    deleted = stack_store.clean_indices(cluster.url(), prefix, days=7, today=date(2026, 3, 10))
    assert deleted == sorted(old)
    remaining = set(cluster.indices("*jaeger-*"))
    assert not remaining & set(old)
    assert set(kept) <= remaining


def test_a_killed_node_rejoins_with_its_data(cluster: stack_store.OpenSearchCluster) -> None:
    """SIGKILL one node: the other two keep answering (yellow: its replicas are missing), every document is
    still counted; restarted on its data, it rejoins and the cluster is green again."""
    index = "smoke-jaeger-span-2026-01-01"
    req = urllib.request.Request(
        f"{cluster.url()}/{index}",
        data=b'{"settings": {"number_of_shards": 3, "number_of_replicas": 1}}',
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()
    body = b"".join(b'{"index": {}}\n{"n": %d}\n' % i for i in range(500))
    req = urllib.request.Request(
        f"{cluster.url()}/{index}/_bulk?refresh=true", data=body, method="POST",
        headers={"Content-Type": "application/x-ndjson"},
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=60).close()
    cluster.wait_health("green", nodes=3, timeout=120)
    pids = cluster.pids()
    assert len(pids) == 3
    cluster.kill(1)
    assert cluster.names[1] not in cluster.pids()
    cluster.wait_health("yellow", nodes=2, timeout=120)
    assert cluster.doc_count(index) == 500
    cluster.restart(1)
    assert cluster.health()["status"] == "green"
    assert cluster.health()["number_of_nodes"] == 3
    assert cluster.pids()[cluster.names[1]] != pids[cluster.names[1]]
    assert cluster.doc_count(index) == 500
    assert cluster.disk_bytes() > 0

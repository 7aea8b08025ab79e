"""The training pods' network: RDMA resources the nodes must offer, IPC_LOCK the namespace must allow, NCCL
variables, and the plan's transport (components/validate/rules/cluster.py, components/validate/preflight.py,
components/estimate/network.py)."""

from __future__ import annotations

import pytest

from components import kube
from components.settings import defaults
from components.validate.preflight import preflight
from components.validate.rules import check, warnings
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import GPU_TAINT, H100, NS, PARAMS, ready_cluster

IB = "rdma/ib"


def reference_values(**overrides) -> dict:
    """The pipeline's defaults (the reference job: 2 x 8 H100) with ``overrides``."""
    return {**defaults(), **overrides}


@pytest.fixture(autouse=True)
def short_api_outages(monkeypatch):
    monkeypatch.setattr(kube, "API_RETRY_WINDOW_SECONDS", 3.0)


def _preflight(api: FakeKubeAPI, **overrides) -> list[str]:
    return preflight({**PARAMS, **overrides}, api_client=api.client, namespace=NS)


def _ib_cluster(api: FakeKubeAPI, per_node: tuple[int, int] = (8, 8)) -> FakeKubeAPI:
    ready_cluster(api)
    for i, count in enumerate(per_node):  # the same two H100 nodes, now with the RDMA device plugin's resource
        api.add_node(
            f"gpu-{i}", {**H100, "kubernetes.io/hostname": f"gpu-{i}"}, gpus=8, taints=[GPU_TAINT], devices={IB: count}
        )
    return api


def test_nodes_offering_the_rdma_resource_pass():
    with FakeKubeAPI() as api:
        assert _preflight(_ib_cluster(api), rdma_resource=IB, rdma_per_pod=8) == []


@pytest.mark.parametrize("per_node,per_pod", [((0, 0), 1), ((8, 4), 8)])
def test_an_rdma_resource_the_nodes_lack_is_one_error_naming_it(per_node, per_pod):
    with FakeKubeAPI() as api:
        problems = _preflight(_ib_cluster(api, per_node), rdma_resource=IB, rdma_per_pod=per_pod)
    (problem,) = problems
    assert problem.startswith(f"rdma_resource={IB} x rdma_per_pod={per_pod}: only ")
    assert "of the 2 GPU nodes" in problem and "leave rdma_resource empty" in problem


def test_a_misspelt_rdma_resource_is_caught_by_preflight_too():
    with FakeKubeAPI() as api:
        (problem,) = _preflight(_ib_cluster(api), rdma_resource="rdma/infiniband")
    assert problem.startswith("rdma_resource=rdma/infiniband x rdma_per_pod=1: only 0 of the 2 GPU nodes")


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_ipc_lock_under_a_pod_security_level_that_forbids_it_is_refused(level):
    with FakeKubeAPI() as api:
        _ib_cluster(api).add_namespace(NS, {"pod-security.kubernetes.io/enforce": level})
        (problem,) = _preflight(api, rdma_resource=IB, ipc_lock=True)
    assert problem.startswith(f"ipc_lock=true: namespace {NS} enforces the {level} Pod Security Standard")
    assert "pod-security.kubernetes.io/enforce=privileged" in problem and "ipc_lock=false" in problem


def test_ipc_lock_in_a_privileged_or_unlabelled_namespace_passes():
    with FakeKubeAPI() as api:
        _ib_cluster(api).add_namespace(NS, {"pod-security.kubernetes.io/enforce": "privileged"})
        assert _preflight(api, rdma_resource=IB, ipc_lock=True) == []
    with FakeKubeAPI() as api:
        _ib_cluster(api).add_namespace(NS)
        assert _preflight(api, rdma_resource=IB, ipc_lock=True) == []


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"rdma_resource": "infiniband"}, "rdma_resource='infiniband' is not an extended resource name"),
        ({"rdma_resource": "rdma/ib dev"}, "rdma_resource='rdma/ib dev' is not an extended resource name"),
        ({"rdma_resource": "nvidia.com/gpu"}, "rdma_resource='nvidia.com/gpu' is not a network device"),
        ({"nccl_env": {"IB_HCA": "mlx5"}}, "nccl_env key 'IB_HCA' is not an NCCL variable"),
        ({"nccl_env": {"NCCL_IB_HCA": ["mlx5"]}}, "nccl_env NCCL_IB_HCA=['mlx5']: give a string or a number"),
        ({"rdma_per_pod": 0}, "rdma_per_pod"),
    ],
)
def test_bad_network_settings_are_one_error_each_before_any_gpu(overrides, needle):
    errors = check(reference_values(**overrides))
    assert len(errors) == 1 and needle in errors[0], errors


def test_good_network_settings_pass_and_ib_without_ipc_lock_warns():
    good = reference_values(rdma_resource=IB, rdma_per_pod=8, ipc_lock=True, nccl_env={"NCCL_IB_HCA": "mlx5"})
    assert check(good) == [] and not [w for w in warnings(good) if "ipc_lock" in w]
    (warning,) = [w for w in warnings(reference_values(rdma_resource=IB)) if "ipc_lock" in w]
    assert warning.startswith("rdma_resource=rdma/ib without ipc_lock") and "set ipc_lock=true" in warning
    assert not [w for w in warnings(reference_values(rdma_resource="vpc.amazonaws.com/efa")) if "ipc_lock" in w]


def test_the_plan_counts_tcp_between_nodes_unless_rdma_is_requested():
    from components.estimate.training_plan import format_plan, plan
    from components.models.shape import load_architecture

    values = reference_values()
    config = load_architecture(values["model_name_or_path"])
    tcp = plan(values, config)
    rdma = plan({**values, "rdma_resource": IB, "rdma_per_pod": 8}, config)
    # Without an RDMA device in the pod NCCL uses sockets: the node's 12.5 GB/s shared by its 8 GPUs.
    assert tcp.inter_gb_per_s == pytest.approx(12.5 / 8) and rdma.inter_gb_per_s == 50.0
    assert tcp.transport.startswith("TCP on the pod network") and rdma.transport.startswith("RDMA (rdma/ib x 8")
    assert tcp.bottleneck == "inter-node link" and rdma.bottleneck == "compute"
    # 2.6x at the reference job's 4-row micro-step (ZeRO-3 gathers once per 4 rows); 10x at 1 row x 4.
    assert rdma.tokens_per_s_per_gpu > 2.5 * tcp.tokens_per_s_per_gpu
    assert "over TCP on the pod network (no rdma_resource requested" in format_plan(tcp)
    one_node = plan({**values, "num_nodes": 1}, config)
    assert one_node.transport == "no inter-node traffic (one node)"
